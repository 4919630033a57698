"""Ansible filters over ktdeploy.core.host_settings: one set of host settings for preflight, train, serve (and the
testinfra suite), so the doctor that checks a host and the `ktdeploy up` that launches on it get the same
--set/--waive values. Runs on the controller, where ktdeploy is installed with ansible (pip install '.[fleet]').

    preflight_settings: "{{ hostvars[inventory_hostname] | ktdeploy_settings }}"
    argv: "{{ [venv ~ '/bin/ktdeploy'] + (preflight_settings | ktdeploy_doctor_argv(recipe_dest)) }}"
"""

from __future__ import annotations

import functools
import json

from ansible.errors import AnsibleFilterError

KEYS = ("ktdeploy_gpus", "ktdeploy_volumes", "ktsft_isa", "ktdeploy_waive_checks", "ktdeploy_recipe_set")


@functools.cache
def _host_settings():
    """ktdeploy.core.host_settings, imported when a filter is first called, not when this file is loaded: ansible
    loads every filter plugin in each forked worker of each task that templates anything, and importing ktdeploy's
    pydantic models there was half of the controller's CPU per host (py-spy over a 16-host preflight)."""
    try:
        from ktdeploy.core import host_settings
    except ImportError as e:  # pragma: no cover - controller without ktdeploy
        raise AnsibleFilterError(f"ktdeploy is not importable on the controller ({e}): run ansible from the venv "
                                 "where ktdeploy is installed (pip install '.[fleet]')") from None
    return host_settings


def _plain(value):
    """Ansible's tagged/lazy containers -> plain JSON types."""
    return json.loads(json.dumps(value, default=str))


def _settings(value):
    HostSettings = _host_settings().HostSettings
    try:
        if isinstance(value, HostSettings):
            return value
        data = _plain(dict(value))
        if any(k in data for k in ("gpus", "volumes", "isa", "waive", "recipe_set")):
            return HostSettings(**data)
        return HostSettings.from_vars(data)
    except Exception as e:  # pydantic ValidationError: name the variable and the reason
        raise AnsibleFilterError(f"ktdeploy host settings: {e}") from None


def ktdeploy_settings(hostvars) -> dict:
    """Host vars (ktdeploy_gpus, ktdeploy_volumes, ktsft_isa, ktdeploy_waive_checks, ktdeploy_recipe_set) ->
    the validated settings {gpus, volumes, isa, waive, recipe_set}."""
    picked = {}
    for k in KEYS:
        try:
            if k in hostvars:
                picked[k] = hostvars[k]
        except Exception as e:
            raise AnsibleFilterError(f"ktdeploy host settings: {k}: {e}") from None
    return _settings(picked).model_dump(mode="json")


def ktdeploy_doctor_argv(settings, recipe=None) -> list[str]:
    return _settings(settings).doctor_argv(recipe or None)


def ktdeploy_image_check_argv(settings, image) -> list[str]:
    return _settings(settings).image_check_argv(str(image))


def ktdeploy_doctor_in_image_argv(settings, image, recipe=None) -> list[str]:
    """The whole `docker run … IMAGE doctor --json …` (preflight in image mode): the training container's flags
    from ktdeploy.core.plan.docker_argv; ``recipe`` = [host path, container path] or none."""
    pair = (str(recipe[0]), str(recipe[1])) if recipe else None
    return _settings(settings).doctor_in_image_argv(str(image), pair)


def ktdeploy_variants(_=None) -> list[str]:
    """The kt-kernel builds (= ktsft image tags) and the old names ktsft_isa still accepts (ktdeploy.core.variants)."""
    from ktdeploy.core import variants

    return [*variants.NAMES, *variants.ALIASES]


def ktdeploy_variant_floor(_=None) -> str:
    """The build every x86_64 CPU with AVX2 runs (image-mode preflight before a variant is known)."""
    from ktdeploy.core import variants

    return variants.AVX2


def ktdeploy_up_argv(settings, recipe, detach=False, extra=()) -> list[str]:
    return _settings(settings).up_argv(recipe, detach=bool(detach), extra=list(extra or ()))


def ktdeploy_launch_record(settings, recipe) -> str:
    """train-<stem>-<key>.json for the controller's recipe file and these settings."""
    return _host_settings().launch_record_name(recipe, _settings(settings))


class FilterModule:
    def filters(self):
        return {"ktdeploy_settings": ktdeploy_settings, "ktdeploy_doctor_argv": ktdeploy_doctor_argv,
                "ktdeploy_image_check_argv": ktdeploy_image_check_argv,
                "ktdeploy_doctor_in_image_argv": ktdeploy_doctor_in_image_argv,
                "ktdeploy_up_argv": ktdeploy_up_argv, "ktdeploy_launch_record": ktdeploy_launch_record,
                "ktdeploy_variants": ktdeploy_variants, "ktdeploy_variant_floor": ktdeploy_variant_floor}

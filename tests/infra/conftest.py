"""Readiness suite for any host, through pytest-testinfra and ktdeploy's own checks (one implementation).

    pytest --hosts=ssh://kt@gpu01 tests/infra
    pytest --hosts=docker://NAME tests/infra --kt-recipe recipes/qwen35-397b-bf16-lora.yaml
    pytest --hosts=ssh://root@10.0.0.5 --ssh-config=./ssh_config tests/infra --kt-waive gpu.present
    pytest --hosts=ansible://ktdeploy_fleet --ansible-inventory=inv.yml tests/infra --kt-image ktsft:avx512_bf16

Options: --kt-recipe R (check against a recipe: memory, GPUs, disk, paths), --kt-waive NAME (repeatable: a
failing check reported as xfail instead), --kt-image IMAGE (run doctor inside IMAGE on the host, started with
the training container's flags: the container checks), --kt-timeout S (seconds any one command may take).
The check list is doctor's own: each check `ktdeploy doctor --json` reports on a host is one test of that
host. Through an ansible inventory, each host's vars (ktdeploy_gpus, ktdeploy_volumes, ktsft_isa,
ktdeploy_waive_checks, ktdeploy_recipe_set) are applied exactly as the fleet's preflight applies them
(ktdeploy.core.host_settings).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

_REPORTS: dict[str, dict] = {}


def pytest_addoption(parser):
    g = parser.getgroup("ktdeploy")
    g.addoption("--kt-recipe", default=None, help="Recipe to check the host against.")
    g.addoption("--kt-waive", action="append", default=[], help="Check name whose failure is tolerated (xfail).")
    g.addoption("--kt-image", default=None, help="Run doctor inside this image on the host (container checks).")
    g.addoption("--kt-timeout", type=float, default=600.0, help="Seconds one command on the host may run.")


def _host_vars(host) -> dict:
    try:
        if host.backend.NAME == "ansible":
            return dict(host.ansible.get_variables())
    except Exception:  # not an ansible host (ssh://, docker://, ...): no inventory vars
        pass
    return {}


def settings_for(host, config):
    from ktdeploy.core.host_settings import HostSettings

    s = HostSettings.from_vars(_host_vars(host))
    extra = tuple(config.getoption("--kt-waive"))
    return s.model_copy(update={"waive": tuple(dict.fromkeys(s.waive + extra))})


def run_doctor(host, config) -> dict:
    """doctor's JSON report for this host (or for the image on it), with the host's settings applied."""
    from ktdeploy.controller.connectors.testinfra import TestinfraConnector

    key = host.backend.get_pytest_id()
    if key in _REPORTS:
        return _REPORTS[key]
    settings = settings_for(host, config)
    timeout = config.getoption("--kt-timeout")
    conn = TestinfraConnector(host)
    recipe = config.getoption("--kt-recipe")
    image = config.getoption("--kt-image")
    from ktdeploy.core.recipe import load_recipe

    rec = load_recipe(recipe, settings.overrides()) if recipe else None
    conn.default_timeout = timeout
    if image:
        # the one container readiness check (`ktdeploy doctor --image`, up's image.check, ansible's ktsft_image):
        # the image started with the training container's flags (core/plan/docker_argv.image_check)
        from ktdeploy.controller.image_check import image_doctor
        from ktdeploy.core.plan.host_plan import MEMLOCK_WAIVER

        rep = image_doctor(conn, image, recipe=rec, gpus=list(settings.gpus) or None,
                           memlock=MEMLOCK_WAIVER not in settings.waive)
    else:
        from ktdeploy.controller.doctor import doctor

        rep = doctor(conn, rec)
    rep.waived = settings.waive
    report = rep.to_json()
    _REPORTS[key] = report
    return report


def pytest_generate_tests(metafunc):
    """One test per (host, check doctor reported): the check list comes from doctor itself."""
    if "check_name" not in metafunc.fixturenames:
        return
    import testinfra

    cfg = metafunc.config
    o = cfg.option
    specs = o.hosts.split(",") if o.hosts is not None else getattr(metafunc.module, "testinfra_hosts", [None])
    # the same hosts testinfra's own plugin parametrizes `host` with
    hosts = testinfra.get_hosts(specs, connection=o.connection, ssh_config=o.ssh_config,
                                ssh_identity_file=o.ssh_identity_file, sudo=o.sudo, sudo_user=o.sudo_user,
                                ansible_inventory=o.ansible_inventory, force_ansible=o.force_ansible)
    names = sorted({c["name"] for h in hosts for c in run_doctor(h, cfg)["checks"]})
    metafunc.parametrize("check_name", names)


@pytest.fixture(scope="module")
def report(host, request) -> dict:
    return run_doctor(host, request.config)


@pytest.fixture
def waived(host, request) -> set[str]:
    return set(settings_for(host, request.config).waive)

"""One set of per-host settings (GPUs, volumes, ISA, waivers, recipe overrides) and the argv built from it.

The fleet's preflight (`ktdeploy doctor`), train and serve (`ktdeploy up`) and the testinfra suite all take a
host's settings from here, so the host is checked with exactly the values it is launched with: the ansible
roles call these functions through ansible/filter_plugins/ktdeploy_settings.py, tests/infra through
``HostSettings.from_vars`` on the inventory's host vars.

Inventory variables (ansible names):
  ktdeploy_gpus          CUDA devices of the recipe on this host      -> --set deploy.gpus=[...]
  ktdeploy_volumes       {model|data|output: host path}               -> --set deploy.volumes.NAME=PATH
  ktsft_isa              image variant (auto = doctor's verdict)      -> --set deploy.image=VARIANT
  ktdeploy_waive_checks  failing checks this host accepts             -> --waive NAME
  ktdeploy_recipe_set    any other SECTION.KEY=VALUE override         -> --set (first, so the above win)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ktdeploy.core import variants as V
from ktdeploy.core.plan.docker_argv import doctor_in_image
from ktdeploy.core.plan.host_plan import MEMLOCK_WAIVER

VOLUMES = ("model", "data", "output")


class HostSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: tuple[int, ...] = ()
    volumes: dict[str, str] = Field(default_factory=dict)
    isa: str = V.AUTO
    waive: tuple[str, ...] = ()
    recipe_set: tuple[str, ...] = ()

    @field_validator("volumes")
    @classmethod
    def _known_volumes(cls, v: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(v) - set(VOLUMES))
        if unknown:
            raise ValueError(f"unknown volume(s) {unknown}: ktdeploy_volumes takes {', '.join(VOLUMES)}")
        for name, path in v.items():
            if not str(path).startswith("/"):
                raise ValueError(f"volume {name}: {path!r} is not an absolute host path")
        return v

    @field_validator("isa")
    @classmethod
    def _known_isa(cls, v: str) -> str:
        if v != V.AUTO and not V.known(v):
            raise ValueError(f"ktsft_isa {v!r} is not a kt-kernel build: use {V.AUTO} or one of {', '.join(V.NAMES)}")
        return v if v == V.AUTO else V.canonical(v)   # an old alias names its build's tag

    @field_validator("recipe_set")
    @classmethod
    def _overrides(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for s in v:
            if "=" not in s or "." not in s.split("=", 1)[0]:
                raise ValueError(f"recipe override {s!r} is not SECTION.KEY=VALUE")
        return v

    @classmethod
    def from_vars(cls, hostvars: dict[str, Any]) -> HostSettings:
        """From ansible host vars (the names in the module docstring); absent ones take their defaults."""
        return cls(gpus=tuple(hostvars.get("ktdeploy_gpus") or ()),
                   volumes=dict(hostvars.get("ktdeploy_volumes") or {}),
                   isa=hostvars.get("ktsft_isa") or V.AUTO,
                   waive=tuple(hostvars.get("ktdeploy_waive_checks") or ()),
                   recipe_set=tuple(hostvars.get("ktdeploy_recipe_set") or ()))

    # ---- what doctor and up receive -------------------------------------------------------------------
    def overrides(self) -> list[str]:
        """SECTION.KEY=VALUE overrides: explicit ones, then GPUs, volumes (sorted) and the ISA override."""
        out = list(self.recipe_set)
        if self.gpus:
            out.append("deploy.gpus=" + json.dumps(list(self.gpus)))
        out += [f"deploy.volumes.{k}={self.volumes[k]}" for k in sorted(self.volumes)]
        if self.isa != V.AUTO:
            out.append(f"deploy.image={self.isa}")
        return out

    def set_args(self) -> list[str]:
        return [f"--set={s}" for s in self.overrides()]

    def waive_args(self) -> list[str]:
        return [f"--waive={w}" for w in dict.fromkeys(self.waive)]

    def doctor_argv(self, recipe: str | None) -> list[str]:
        """`ktdeploy doctor` arguments (after the program): JSON report, the recipe with this host's overrides
        (or, without a recipe, the ISA override as --variant) and this host's waivers."""
        argv = ["doctor", "--json"]
        if recipe:
            argv += ["--recipe", str(recipe), *self.set_args()]
        elif self.isa != V.AUTO:
            argv += ["--variant", self.isa]
        return argv + self.waive_args()

    def image_check_argv(self, image: str) -> list[str]:
        """`ktdeploy doctor --image IMAGE` arguments (the container readiness check, ansible's ktsft_image role):
        JSON report, this host's GPUs (the training container's) and waivers."""
        gpus = ["--gpus", ",".join(str(g) for g in self.gpus)] if self.gpus else []
        return ["doctor", "--json", "--image", image, *gpus, *self.waive_args()]

    def doctor_in_image_argv(self, image: str, recipe: tuple[str, str] | None = None) -> list[str]:
        """The whole `docker run … IMAGE doctor --json …` command for a host without a ktdeploy of its own (preflight
        in image mode): the training container's flags with this host's GPUs (memlock unless docker.memlock is
        waived, as `up` does), ``recipe`` = (host path, container path) mounted read-only, doctor_argv + --stack after."""
        # --stack: the image's own doctor also runs the stack probe (Python.h, torch, CUDA, one Triton kernel), so
        # image mode checks what `ktdeploy doctor --image` checks
        return doctor_in_image(image, [*self.doctor_argv(recipe[1] if recipe else None), "--stack"],
                               gpus=list(self.gpus) or None,
                               memlock=MEMLOCK_WAIVER not in self.waive, recipe=recipe)

    def up_argv(self, recipe: str, *, detach: bool = False, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
        """`ktdeploy up` arguments on the host itself: the same overrides and waivers doctor was given."""
        return ["up", "--host", "localhost", "--no-progress", *(["--detach"] if detach else []), str(recipe),
                *self.set_args(), *self.waive_args(), *[str(a) for a in extra]]

    def launch_key(self, recipe_text: str | bytes) -> str:
        """Identity of a launch: the recipe's content and every setting that changes what runs (12 hex)."""
        data = recipe_text.encode() if isinstance(recipe_text, str) else recipe_text
        h = hashlib.sha256(data)
        h.update(json.dumps(self.overrides()).encode())
        return h.hexdigest()[:12]


def launch_record_name(recipe: str | Path, settings: HostSettings, recipe_text: str | bytes | None = None) -> str:
    """train-<recipe stem>-<launch key>.json: a changed recipe or setting is a new launch, not 'already launched'."""
    p = Path(recipe)
    text = recipe_text if recipe_text is not None else p.read_bytes()
    return f"train-{p.stem}-{settings.launch_key(text)}.json"

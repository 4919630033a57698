"""Recipe: the parsed document plus the typed deploy section; load_recipe() builds it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from ktdeploy.core.errors import RecipeError
from ktdeploy.core.recipe.expert_format import expert_setup
from ktdeploy.core.recipe.loader import RawRecipe, apply_overrides, read_native, read_recipe
from ktdeploy.core.recipe.schema import Deploy
from ktdeploy.core.recipe.train_keys import TrainKeys


@dataclass
class Recipe:
    raw: RawRecipe
    deploy: Deploy | None                      # None when the section is absent or invalid
    deploy_errors: list[dict[str, Any]] = field(default_factory=list)  # pydantic errors, turned into findings by validate()

    @property
    def train(self) -> dict[str, Any]:
        t = self.raw.doc.get("train")
        return t if isinstance(t, dict) else {}

    @property
    def accelerate(self) -> dict[str, Any]:
        a = self.raw.doc.get("accelerate")
        return a if isinstance(a, dict) else {}

    @property
    def keys(self) -> TrainKeys:
        """The train keys ktdeploy reads, by attribute (``train`` stays the mapping as written)."""
        return TrainKeys(self.train)

    @property
    def kt_config(self) -> dict[str, Any]:
        return self.keys.kt_config

    @property
    def path(self) -> Path | None:
        return self.raw.path

    @property
    def name(self) -> str:
        return self.raw.path.stem if self.raw.path else "recipe"

    def require_deploy(self) -> Deploy:
        """The deploy section of a recipe that must have one (loaded for up/render/sbatch)."""
        if self.deploy is None:
            raise RecipeError("the recipe has no valid deploy: section", key="deploy",
                              fix="Add deploy.volumes.model/data/output (see recipes/tiny-moe-lora.yaml).")
        return self.deploy

    def weight_setup(self) -> str:
        """The expert-weight setup of the cookbook: bf16, fp8, int8 or int4 (AMXINT4)."""
        return expert_setup(self.kt_config)

    def to_document(self) -> dict[str, Any]:
        return dict(self.raw.doc.items())


class RecipeSections(Protocol):
    """What doctor's resource checks and the planner read of a recipe: its sections. A Recipe, or a stand-in that
    holds the sections a caller needs (the planner also takes plain dicts: core/sizing/estimate.py)."""

    @property
    def train(self) -> Mapping[str, Any]: ...

    @property
    def accelerate(self) -> Mapping[str, Any]: ...

    @property
    def deploy(self) -> Deploy | None: ...


def build(raw: RawRecipe) -> Recipe:
    from ktdeploy.core.recipe.root import resolve_root

    raw = resolve_root(raw)   # deploy.root: the relative host paths made absolute under it, before anything reads them
    d = raw.doc.get("deploy")
    if not isinstance(d, dict):
        return Recipe(raw=raw, deploy=None)
    try:
        return Recipe(raw=raw, deploy=Deploy.model_validate(d))
    except ValidationError as err:
        return Recipe(raw=raw, deploy=None, deploy_errors=[dict(e) for e in err.errors(include_url=False)])


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    return build(apply_overrides(read_recipe(path), overrides))


def load_native(train: str | Path, accelerate: str | Path, deploy: str | Path | None = None,
                overrides: list[str] | tuple[str, ...] = (), *, derive: bool = False) -> Recipe:
    """The native pair (+ an optional deploy YAML). ``derive``: with no deploy YAML, the deploy section that
    core/recipe/from_lf.py derives from the pair (what `up` and `train` run with)."""
    raw = read_native(train, accelerate, deploy)
    if derive and deploy is None:
        from ktdeploy.core.recipe.from_lf import derive_deploy

        raw.doc["deploy"] = derive_deploy(raw.doc.get("train") or {}, raw.doc.get("accelerate") or {})
        raw.source.locations.setdefault("deploy", ("(derived from the training YAML)", 0))
    return build(apply_overrides(raw, overrides))

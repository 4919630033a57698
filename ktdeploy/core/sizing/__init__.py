"""Resource planner: peak host RSS, GPU memory per GPU and disk from config.json + the recipe, before any download."""

from pathlib import Path

from ktdeploy.core.recipe.document import RecipeSections
from ktdeploy.core.sizing.advice import Advice, advise, plan_checks
from ktdeploy.core.sizing.estimate import MEASURED, ResourcePlan, Term, estimate
from ktdeploy.core.sizing.model_config import (
    MoEArchitecture,
    load_model_config,
    parse_model_config,
    resolve_model_config,
)


def plan_recipe(recipe: RecipeSections, model_config: str | Path | None = None,
                gpus: int | None = None) -> tuple[ResourcePlan, MoEArchitecture, str]:
    """(ResourcePlan, MoEArchitecture, where the config came from) for a loaded Recipe."""
    arch, where = resolve_model_config(recipe.train, model_config)
    return estimate(recipe, arch, gpus), arch, where


__all__ = ["Advice", "MEASURED", "MoEArchitecture", "ResourcePlan", "Term", "advise", "estimate",
           "load_model_config", "parse_model_config", "plan_checks", "plan_recipe", "resolve_model_config"]

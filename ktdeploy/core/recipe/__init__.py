"""Recipes: parse (with line numbers), validate against every cookbook / LlamaFactory / kt-kernel rule, render."""

from importlib.abc import Traversable
from importlib.resources import files

from ktdeploy.core.recipe.document import Recipe, load_native, load_recipe
from ktdeploy.core.recipe.finding import Finding, errors
from ktdeploy.core.recipe.render import Rendered, render
from ktdeploy.core.recipe.schema import Deploy
from ktdeploy.core.recipe.validate import require_valid, validate


def builtin_recipe(name: str = "tiny-moe-lora") -> Traversable:
    """Path of a recipe shipped with ktdeploy (recipes/<name>.yaml)."""
    return files("ktdeploy").joinpath("builtin_recipes", f"{name}.yaml")


__all__ = ["Deploy", "Finding", "Recipe", "Rendered", "builtin_recipe", "errors", "load_native", "load_recipe",
           "render", "require_valid", "validate"]

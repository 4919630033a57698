"""validate(): run every rule; require_valid(): raise RecipeError with all findings when any is an error."""

from __future__ import annotations

from ktdeploy.core.errors import RecipeError
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.recipe.finding import Finding, errors
from ktdeploy.core.recipe.rules import run_rules


def validate(recipe: Recipe) -> list[Finding]:
    findings = run_rules(recipe)
    # errors first, then by file order
    return sorted(findings, key=lambda f: (f.severity != "error", f.file or "", f.line or 0, f.path))


def require_valid(recipe: Recipe) -> list[Finding]:
    """Return the warnings; raise RecipeError listing every error."""
    findings = validate(recipe)
    errs = errors(findings)
    if errs:
        where = str(recipe.path) if recipe.path else "the recipe"
        raise RecipeError(f"{where} has {len(errs)} error(s)", findings=findings,
                          fix="fix the keys listed below, then run `ktdeploy check` again")
    return findings

"""Secrets in a recipe before it exists as a file (pure).

`recipe from-lf` writes the recipe it made even when `check` finds errors in it (the file is there to fix). A
secret is the exception: a password in a URL or a hub token copied from the training YAML would be on disk, and
then in every record and shipped copy, before the rule that refuses it ran. So that rule runs on the text first."""

from __future__ import annotations

from dataclasses import replace

from ktdeploy.core.recipe.document import build
from ktdeploy.core.recipe.finding import Finding
from ktdeploy.core.recipe.loader import parse_recipe_text
from ktdeploy.core.recipe.rules import url_passwords
from ktdeploy.core.recipe.rules_base import Ctx


def secret_findings(text: str) -> list[Finding]:
    """What the secrets rule (``rules.url_passwords``) finds in the recipe ``text``, by key (no file or line: the
    text is no file yet)."""
    ctx = Ctx(build(parse_recipe_text(text)))
    url_passwords(ctx)
    return [replace(f, file=None, line=None) for f in ctx.findings]

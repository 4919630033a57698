"""deploy.root: the recipe's relative host paths resolve against it when the recipe is built; one --set moves the
shipped tiny recipe's model, data and output (and what is rendered and mounted from them); an absolute path stays;
without a root a relative path is still refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktdeploy.core.recipe import load_recipe, render, validate
from ktdeploy.core.recipe.loader import parse_recipe_text
from ktdeploy.core.recipe.root import resolve_root

REPO = Path(__file__).resolve().parents[4]
TINY = REPO / "recipes/tiny-moe-lora.yaml"


def test_the_tiny_recipe_lives_under_its_root():
    r = load_recipe(TINY)
    assert r.deploy is not None and r.deploy.root == "/srv/ktdeploy"
    assert (r.keys.model_name_or_path, r.train["dataset_dir"], r.keys.output_dir) == (
        "/srv/ktdeploy/models/tiny-qwen3-moe", "/srv/ktdeploy/data", "/srv/ktdeploy/output/tiny-moe-lora")
    assert (r.deploy.volumes.model, r.deploy.volumes.data, r.deploy.volumes.output) == (
        "/srv/ktdeploy/models", "/srv/ktdeploy/data", "/srv/ktdeploy/output")


def test_one_setting_moves_every_path():
    r = load_recipe(TINY, ["deploy.root=/data/kt"])
    assert [f for f in validate(r) if f.severity == "error"] == []
    v = r.require_deploy().volumes
    assert (v.model, v.data, v.output) == ("/data/kt/models", "/data/kt/data", "/data/kt/output")
    train_yaml = render(r).train_yaml
    assert "model_name_or_path: /data/kt/models/tiny-qwen3-moe" in train_yaml
    assert "dataset_dir: /data/kt/data" in train_yaml and "output_dir: /data/kt/output/tiny-moe-lora" in train_yaml
    assert "/srv/ktdeploy" not in train_yaml


def test_an_absolute_path_stays_and_a_single_set_still_wins():
    r = load_recipe(TINY, ["deploy.root=/data/kt", "train.output_dir=/scratch/out/tiny", "deploy.volumes.output=/scratch/out"])
    assert r.keys.output_dir == "/scratch/out/tiny" and r.require_deploy().volumes.output == "/scratch/out"
    assert r.keys.model_name_or_path == "/data/kt/models/tiny-qwen3-moe"


def test_without_a_root_a_relative_path_is_refused_naming_the_root():
    text = TINY.read_text().replace("  root: /srv/ktdeploy", "  # no root")
    r = load_recipe_text(text)
    errors = {f.path: f.message for f in validate(r) if f.severity == "error"}
    assert "deploy.root" in " ".join(errors.values()), errors
    assert any(k.startswith("deploy.volumes") or k.startswith("deploy") for k in errors), errors


@pytest.mark.parametrize("root", ["relative/dir", "/srv/kt\nx", ""])
def test_a_root_that_is_not_an_absolute_path_resolves_nothing_and_is_an_error(root):
    raw = parse_recipe_text(TINY.read_text())
    raw.doc["deploy"]["root"] = root
    assert resolve_root(raw) is raw
    r = load_recipe_text_raw(raw)
    assert any(f.path.startswith("deploy") and f.severity == "error" for f in validate(r))


def test_dotdot_is_normalised_and_checked_like_any_path():
    r = load_recipe(TINY, ["train.output_dir=../elsewhere/out"])
    assert r.keys.output_dir == "/srv/elsewhere/out"
    assert any(f.path == "train.output_dir" and f.severity == "error" for f in validate(r))   # outside the volume


def load_recipe_text(text: str):
    from ktdeploy.core.recipe.document import build

    return build(parse_recipe_text(text, str(TINY)))


def load_recipe_text_raw(raw):
    from ktdeploy.core.recipe.document import build

    return build(raw)


def test_the_docs_sample_is_the_shipped_tiny_recipe():
    """docs/recipes.md's deploy-root sample: each of its lines is the tiny recipe's, in the recipe's order."""
    from tests.docs import samples

    lines = [ln for ln in samples("docs/recipes.md")["deploy-root"].splitlines() if ln.strip()]
    recipe = TINY.read_text().splitlines()
    at = 0
    for ln in lines:
        assert ln in recipe[at:], (ln, "not in recipes/tiny-moe-lora.yaml after line", at)
        at = recipe.index(ln, at) + 1

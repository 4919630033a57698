from __future__ import annotations

import copy
from pathlib import Path

import pytest

from ktdeploy.core.recipe import load_recipe, validate
from ktdeploy.core.recipe.render import dump_yaml

REPO = Path(__file__).resolve().parents[4]
RECIPES = REPO / "recipes"


def _read(name: str) -> dict:
    from ruamel.yaml import YAML

    return YAML(typ="safe").load((RECIPES / name).read_text())


@pytest.fixture
def base_doc():
    """A fresh copy of the cookbook's BF16 LoRA recipe as a plain dict (2 GPUs)."""
    return copy.deepcopy(_read("qwen35-397b-bf16-lora.yaml"))


@pytest.fixture
def check_doc(tmp_path):
    """Write a document to a file and validate it; returns (errors by path, warnings by path, findings)."""

    def run(doc: dict, name: str = "r.yaml"):
        p = tmp_path / name
        p.write_text(dump_yaml(doc))
        findings = validate(load_recipe(p))
        errs: dict = {}
        warns: dict = {}
        for f in findings:
            (errs if f.severity == "error" else warns).setdefault(f.path, []).append(f)
        return errs, warns, findings

    return run

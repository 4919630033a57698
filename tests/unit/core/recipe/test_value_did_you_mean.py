"""A misspelt enum value gets a did-you-mean, as a misspelt key does (`cosin` -> `cosine`), instead of the whole
list of values."""

from __future__ import annotations

import pytest

from ktdeploy.core.recipe import load_recipe, validate


def _fix(path: str, override: str) -> str:
    (f,) = [f for f in validate(load_recipe("recipes/tiny-moe-lora.yaml", [override])) if f.path == path]
    return f.fix


@pytest.mark.parametrize("given,want", [("cosin", "cosine"), ("Cosine", "cosine"), ("linaer", "linear")])
def test_a_scheduler_value_near_a_real_one_is_suggested(given, want):
    assert _fix("train.lr_scheduler_type", f"train.lr_scheduler_type={given}") == f"did you mean {want!r}?"


def test_a_value_near_nothing_lists_the_values():
    assert _fix("train.lr_scheduler_type", "train.lr_scheduler_type=zzzzzz").startswith("use one of linear, cosine")


def test_a_distributed_type_near_a_real_one_is_suggested():
    assert _fix("accelerate.distributed_type", "accelerate.distributed_type=FSPD") == "did you mean 'FSDP'?"

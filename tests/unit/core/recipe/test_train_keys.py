"""core/recipe/train_keys.py: the train keys ktdeploy reads, by attribute. Every accessor is total (doctor and the
planner run on recipes `check` refuses), the readings keep what their callers computed before, and no module of
ktdeploy/ reads the train mapping by a string key any more (the rules, which look at any key, read ``ctx.t``)."""

from __future__ import annotations

import ast
import datetime
from pathlib import Path

import pytest

from ktdeploy.controller.doctor import run_checks
from ktdeploy.core.recipe import builtin_recipe, load_recipe
from ktdeploy.core.recipe.train_keys import TrainKeys
from tests.unit.core.facts.golden import facts_of

ROOT = Path(__file__).resolve().parents[3]
WRONG = [None, "", "x", "/abs", 0, 7, -3, 3.7, True, False, [], ["a", " b "], {}, {"a": 1}, "Full", "yes", "abc",
         "3", datetime.date(2024, 1, 1)]
ACCESSORS = [n for n, v in vars(TrainKeys).items() if isinstance(v, property)]


class _Every(dict):
    """A train mapping that holds ``value`` under every key."""

    def __init__(self, value: object) -> None:
        super().__init__()
        self.value = value

    def get(self, key, default=None):
        return self.value


@pytest.mark.parametrize("value", WRONG, ids=repr)
def test_every_accessor_is_total(value):
    for keys in (TrainKeys({}), TrainKeys(_Every(value))):
        for name in ACCESSORS:
            getattr(keys, name)


def test_readings():
    k = TrainKeys({"finetuning_type": "Full", "dataset": "a, b,,c", "kt_config": [1], "cutoff_len": "4096",
                   "per_device_train_batch_size": "x", "packing": "yes", "max_steps": -1, "save_steps": 0,
                   "disable_gradient_checkpointing": "true", "kt_cpu_activation": None})
    assert k.is_full and k.dataset_names == ["a", "b", "c"] and k.kt_config == {}
    assert (k.cutoff_len, k.per_device_train_batch_size, k.packing) == (4096, 8, True)
    assert (k.max_steps, k.save_steps, k.gradient_checkpointing, k.cpu_activation) == (None, 0, False, "recompute")
    empty = TrainKeys({})
    assert not empty.is_full and empty.dataset_names == [] and empty.lora_rank == 8
    assert (empty.save_total_limit, empty.save_strategy, empty.preprocessing_workers) == (None, "steps", 0)
    assert TrainKeys({"dataset": ["x", " y "]}).dataset_names == ["x", "y"]
    assert TrainKeys({"finetuning_type": None}).is_full is False


def test_doctor_reports_a_kt_config_that_is_not_a_mapping():
    """kt_config: [1, 2] made doctor's resource and thread checks crash (exit 70); they now read it as unset, and
    `check` reports the key (train.kt_config.placement)."""
    recipe = load_recipe(builtin_recipe(), ["train.kt_config=[1, 2]"])
    assert recipe.train["kt_config"] == [1, 2]
    names = {c.name for c in run_checks(facts_of("numa-2socket-qemu"), recipe)}
    assert "numa.threads" in names


def string_key_reads(root: Path = ROOT / "ktdeploy") -> list[str]:
    """``train.get("KEY"...)`` / ``train["KEY"]`` (read) on a name or attribute called train, outside the view."""
    found = []
    for p in sorted(root.rglob("*.py")):
        if p.name == "train_keys.py":
            continue
        for n in ast.walk(ast.parse(p.read_text())):
            target = key = None
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and n.args:
                target, key = n.func.value, n.args[0]
            elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load):
                target, key = n.value, n.slice
            name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) \
                else None
            if name == "train" and isinstance(key, ast.Constant) and isinstance(key.value, str):
                found.append(f"{p.relative_to(root.parent).as_posix()}:{n.lineno}")
    return found


def test_no_train_key_is_read_by_string_outside_the_view():
    assert string_key_reads() == []


def test_the_scan_can_fail(tmp_path):
    (tmp_path / "m.py").write_text('def f(recipe, train):\n    return recipe.train.get("output_dir"), train["x"]\n'
                                   'def g(train):\n    train["kt_config"] = {}\n')
    assert string_key_reads(tmp_path) == [f"{tmp_path.name}/m.py:2", f"{tmp_path.name}/m.py:2"]

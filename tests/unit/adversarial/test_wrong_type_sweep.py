"""Every key of the shipped recipes, one at a time, set to each value of a fixed list of wrong types: `check`'s rules
report it (never "could not evaluate", a rule crashing), and doctor's checks on a golden host finish (never an
exception: the CLI would say "internal error", exit 70).

The property test (test_fuzz_recipes.py) draws random documents and found `accelerate.fsdp_config: true` only on
some seeds; this sweep is the same question asked of every key, deterministically, so CI sees a regression every run.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest

from ktdeploy.controller.doctor import run_checks
from ktdeploy.core.errors import KtdeployError
from ktdeploy.core.recipe.document import build
from ktdeploy.core.recipe.loader import parse_recipe_text
from ktdeploy.core.recipe.render import dump_yaml
from ktdeploy.core.recipe.validate import validate
from tests.unit.core.facts.golden import facts_of
from tests.unit.core.recipe.conftest import _read

RECIPES = ("tiny-moe-lora.yaml", "qwen35-397b-bf16-lora.yaml", "deepseek-v3-fp8-lora.yaml")
JUNK = (True, 0, -1, 2.5, "abc", "", "nan", [1], {"x": 1}, None, 10**30)
HOST = facts_of("numa-2socket-qemu")


def _paths(doc: object, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))


def _mutants(name: str) -> Iterator[tuple[str, dict]]:
    base = _read(name)
    for path in _paths(base):
        for value in JUNK:
            doc = copy.deepcopy(base)
            node = doc
            for p in path[:-1]:
                node = node[p]
            node[path[-1]] = value
            yield f"{'.'.join(path)}={value!r}", doc


def _recipe(doc: dict):
    try:
        return build(parse_recipe_text(dump_yaml(doc), "sweep.yaml"))
    except KtdeployError:
        return None     # refused while loading (a section that is not a mapping): a clean error already


@pytest.mark.parametrize("name", RECIPES)
def test_no_rule_and_no_doctor_check_crashes_on_a_wrong_type(name):
    rule_crashes, doctor_crashes, ran = [], [], 0
    for what, doc in _mutants(name):
        recipe = _recipe(doc)
        if recipe is None:
            continue
        bad = [f.message for f in validate(recipe) if "could not evaluate" in f.message]
        if bad:
            rule_crashes.append(f"{what}: {bad[0]}")
        try:
            run_checks(HOST, recipe)
        except KtdeployError:
            pass         # a clean error naming the key: what the CLI prints with its exit code
        except Exception as err:  # noqa: BLE001 - any other is what the CLI calls an internal error
            doctor_crashes.append(f"{what}: {type(err).__name__}: {err}")
        ran += 1
    assert ran > 300
    assert not rule_crashes, f"{len(rule_crashes)} rule crash(es) in {name}:\n" + "\n".join(rule_crashes[:20])
    assert not doctor_crashes, f"{len(doctor_crashes)} doctor crash(es) in {name}:\n" + "\n".join(doctor_crashes[:20])

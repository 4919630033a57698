"""One registry of stage names (core/plan/steps.StageName): a stage named by a string literal anywhere in
ktdeploy/ (a Stage(...) built from one, a ``stage=`` keyword, a stage returned as text) fails here, and a Stage
whose name is not registered cannot be built. Records and plans keep the plain strings."""

import ast
import json
from pathlib import Path

import pytest

from ktdeploy.core.plan.steps import Stage, StageName

PKG = Path(__file__).resolve().parents[4] / "ktdeploy"
NAMES = {s.value for s in StageName}


def stage_literals(source: str) -> list[int]:
    """Lines where a stage name is written as a string: Stage("X", ...), Stage(name="X"), f(stage="X"),
    ``return "X"``, ``x == "X"``."""
    out = []

    def lit(node) -> bool:
        return isinstance(node, ast.Constant) and node.value in NAMES

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            called = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if called == "Stage" and node.args and lit(node.args[0]):
                out.append(node.lineno)
            out += [node.lineno for k in node.keywords if k.arg in ("stage", "name") and lit(k.value)
                    and (k.arg == "stage" or called == "Stage")]
        elif isinstance(node, ast.Return) and lit(node.value) \
                or isinstance(node, ast.Compare) and any(lit(c) for c in (node.left, *node.comparators)):
            out.append(node.lineno)
    return sorted(out)


def test_no_stage_name_is_written_outside_the_registry():
    home = PKG / "core" / "plan" / "steps.py"
    found = [f"{p.relative_to(PKG.parent)}:{line}" for p in sorted(PKG.rglob("*.py")) if p != home
             for line in stage_literals(p.read_text())]
    assert not found, "name the stage by StageName.X:\n" + "\n".join(found)


def test_the_scan_catches_each_form():
    src = ('a = Stage("TRAIN", "t")\nb = Stage(name="SERVE", title="s")\nrecord.event("x", stage="SYNC")\n'
           'def f():\n    return "PREFLIGHT"\nok = s.name == "CONVERT"\nmetavar = "TRAIN"\n')
    assert stage_literals(src) == [1, 2, 3, 5, 6]


def test_a_stage_name_is_its_member_written_as_the_plain_string_and_an_unknown_one_is_refused():
    s = Stage(StageName.TRAIN, "training container")
    assert s.name is StageName.TRAIN and json.dumps(s.to_json()) == json.dumps({"name": "TRAIN",
                                                                                "title": "training container",
                                                                                "steps": []})
    assert Stage("TRAIN", "from a plan's JSON").name is StageName.TRAIN
    with pytest.raises(ValueError):
        Stage("TRIAN", "typo")

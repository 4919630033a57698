"""One registry of check names (core/check_names.py): a check name written as a string anywhere else in
ktdeploy/, a check reported under a name outside CHECKS, or a waiver list naming an unknown check fails here."""

import ast
import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from ktdeploy.core.check_names import CHECKS, CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.checks.gate import AGENT_DEFERRED, CPU_ONLY_WAIVERS, RUNTIME_FIXABLE
from ktdeploy.core.plan.host_plan import MEMLOCK_WAIVER
from tests.unit.literals import name_literals

PKG = Path(__file__).resolve().parents[3] / "ktdeploy"
HOME = PKG / "core" / "check_names.py"
DOTTED = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")


def check_name_literals(source: str) -> list[tuple[int, str]]:
    """(line, name) of every string literal that is a registered check name (an f-string's parts are checked by
    reported_names below)."""
    return name_literals(source, CHECKS)


def unregistered_names(source: str) -> list[tuple[int, str]]:
    """(line, what) of CheckResult(name=...) / x.name = ... given a literal outside CHECKS or an f-string."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "CheckResult":
            for v in (k.value for k in node.keywords if k.arg == "name"):
                if isinstance(v, ast.JoinedStr):
                    out.append((node.lineno, "an f-string"))
                elif isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value not in CHECKS:
                    out.append((node.lineno, v.value))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and any(isinstance(t, ast.Attribute) and t.attr == "name" for t in node.targets):
            # a check renamed after the fact (doctor's --variant): a dotted name outside the registry
            v = node.value.value
            if isinstance(v, str) and DOTTED.match(v) and v not in CHECKS:
                out.append((node.lineno, v))
    return out


def _sources():
    return [p for p in sorted(PKG.rglob("*.py")) if p != HOME]


def test_no_check_name_is_written_outside_the_registry():
    found = [f"{p.relative_to(PKG.parent)}:{line}: {name!r} (use CheckName)"
             for p in _sources() for line, name in check_name_literals(p.read_text())]
    assert not found, "\n".join(found)


def test_every_check_result_is_named_from_the_registry():
    found = [f"{p.relative_to(PKG.parent)}:{line}: {what}"
             for p in _sources() for line, what in unregistered_names(p.read_text())]
    assert not found, "add the name to core/check_names.py and use its constant:\n" + "\n".join(found)


def test_the_scans_catch_what_they_look_for():
    src = 'x = CheckResult(name="gpu.present", status="pass")\ny = CheckResult(name=f"gpu.{k}", status="pass")\n' \
          'r.name = "new.check"\n'
    assert check_name_literals(src) == [(1, "gpu.present")]
    assert sorted(unregistered_names(src)) == [(2, "an f-string"), (3, "new.check")]


def test_waiver_lists_and_profiles_name_registered_checks():
    assert set(CPU_ONLY_WAIVERS) <= CHECKS and set(RUNTIME_FIXABLE) <= CHECKS and MEMLOCK_WAIVER in CHECKS
    assert all(any(c.startswith(prefix) for c in CHECKS) for prefix in AGENT_DEFERRED)


def test_the_registry_holds_dotted_names_that_serialise_as_plain_strings():
    assert set(CheckName) == CHECKS and all(n.count(".") >= 1 and n == n.lower() for n in CheckName)
    assert json.dumps([CheckName.GPU_PRESENT]) == '["gpu.present"]' and f"{CheckName.GPU_PRESENT}" == "gpu.present"
    assert CheckResult(name="gpu.present", status="pass").name is CheckName.GPU_PRESENT   # read back from JSON


def test_a_check_outside_the_registry_cannot_be_made():
    with pytest.raises(ValidationError):
        CheckResult(name="gpu.presnet", status="fail")


@pytest.mark.parametrize("facts_file", sorted((PKG.parent / "tests" / "golden").glob("*/facts.json")),
                         ids=lambda p: p.parent.name)
def test_doctor_reports_only_registered_names(facts_file):
    from ktdeploy.controller.doctor import run_checks
    from ktdeploy.controller.up_inputs import load_facts_file
    from ktdeploy.core.recipe import load_recipe

    facts = load_facts_file(facts_file)
    recipes = [None, *(load_recipe(p, []) for p in sorted((PKG.parent / "recipes").glob("*.yaml")))]
    names = {c.name for r in recipes for c in run_checks(facts, r)}
    assert names and names <= CHECKS, sorted(names - CHECKS)

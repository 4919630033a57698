"""One registry of check names (core/check_names.py: CheckName, a StrEnum). A check is named by its member:
``CheckResult.name`` is a CheckName, so mypy refuses a string where a check name goes and pydantic refuses a name
outside the registry (the source scans that did the type checker's job went in issue 48). Here: the names are
dotted and serialise as the plain strings, a waiver list names registered checks, doctor reports only them."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from ktdeploy.core.check_names import CHECKS, CheckName
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.checks.gate import AGENT_DEFERRED, CPU_ONLY_WAIVERS, RUNTIME_FIXABLE
from ktdeploy.core.plan.host_plan import MEMLOCK_WAIVER

PKG = Path(__file__).resolve().parents[3] / "ktdeploy"


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

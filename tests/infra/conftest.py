"""Readiness suite for any host, through pytest-testinfra and ktdeploy's own checks (one implementation).

    pytest --hosts=ssh://kt@gpu01 tests/infra
    pytest --hosts=docker://NAME tests/infra --kt-recipe recipes/qwen35-397b-bf16-lora.yaml
    pytest --hosts=ssh://root@10.0.0.5 --ssh-config=./ssh_config tests/infra --kt-waive gpu.present

Options: --kt-recipe R (check against a recipe: memory, GPUs, disk, paths), --kt-waive NAME (repeatable: a
failing check reported as xfail instead). Each check of `ktdeploy doctor` is one test; a failing check fails
its test with the check's detail and fix.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def pytest_addoption(parser):
    g = parser.getgroup("ktdeploy")
    g.addoption("--kt-recipe", default=None, help="Recipe to check the host against.")
    g.addoption("--kt-waive", action="append", default=[], help="Check name whose failure is tolerated (xfail).")


@pytest.fixture(scope="module")
def report(host, request):
    from ktdeploy.controller.doctor import doctor
    from ktdeploy.controller.connectors.testinfra import TestinfraConnector

    recipe = None
    path = request.config.getoption("--kt-recipe")
    if path:
        from ktdeploy.core.recipe import load_recipe

        recipe = load_recipe(path)
    return doctor(TestinfraConnector(host), recipe)


@pytest.fixture
def waived(request) -> set[str]:
    return set(request.config.getoption("--kt-waive"))

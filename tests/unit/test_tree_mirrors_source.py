"""The unit tests mirror the source: a test module under tests/unit/{core,controller,agent,cli} sits in the folder
of the ktdeploy/ package it tests, so a folder there with no ktdeploy/ counterpart fails here; any other folder of
tests/unit is a named cross-cutting suite."""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parent
PKG = UNIT.parents[1] / "ktdeploy"
LAYERS = ("core", "controller", "agent", "cli")
# Not one module's tests: hostile inputs across the package, the independent stack oracle, and the image build's
# own scripts (docker/lock.py, docker/verify_stack.py, mirroring the repository's docker/).
OTHER_SUITES = {"adversarial", "oracle", "docker"}


def strays(unit: Path, pkg: Path) -> list[str]:
    """Test modules under unit/<layer>/ whose folder has no mirror under pkg/."""
    found = (p for layer in LAYERS if (unit / layer).is_dir() for p in (unit / layer).rglob("test_*.py"))
    return sorted(str(p.relative_to(unit)) for p in found if not (pkg / p.parent.relative_to(unit)).is_dir())


def test_every_test_module_of_a_layer_sits_where_ktdeploy_has_that_folder():
    assert strays(UNIT, PKG) == [], "move each to the folder mirroring the module it tests"


def test_every_other_folder_of_tests_unit_is_a_named_suite():
    folders = {p.parent.relative_to(UNIT).parts[0] for p in UNIT.rglob("test_*.py") if p.parent != UNIT}
    assert folders - set(LAYERS) - OTHER_SUITES == set()


def test_a_folder_without_a_mirror_is_named(tmp_path):
    (tmp_path / "pkg" / "core" / "plan").mkdir(parents=True)
    for rel in ("core/plan/test_build.py", "core/planner/test_estimate.py", "cli/test_help.py", "x/test_y.py"):
        (tmp_path / "unit" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "unit" / rel).touch()
    assert strays(tmp_path / "unit", tmp_path / "pkg") == ["cli/test_help.py", "core/planner/test_estimate.py"]

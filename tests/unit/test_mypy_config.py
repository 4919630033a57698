"""mypy runs with disallow_untyped_defs on all of ktdeploy/ (pyproject.toml), with no module excepted: an
override that turns it off again, for any module, fails here."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _mypy_conf() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]


def test_every_function_of_the_package_must_be_annotated():
    conf = _mypy_conf()
    assert conf["disallow_untyped_defs"] is True
    assert conf["packages"] == ["ktdeploy"]


def test_no_module_is_excepted_from_the_annotation_rule():
    loosened = {k for o in _mypy_conf().get("overrides", []) for k in o
                if k in ("disallow_untyped_defs", "disallow_incomplete_defs", "ignore_errors", "check_untyped_defs")}
    assert loosened == set(), "pyproject.toml's [[tool.mypy.overrides]] loosens typing: annotate the module instead"


def test_mypy_finds_no_unannotated_function_in_the_package(tmp_path):
    ini = tmp_path / "mypy.ini"   # the project's settings (the annotation rule is what this test is about)
    ini.write_text("[mypy]\npython_version = 3.11\nplugins = pydantic.mypy\nignore_missing_imports = True\n"
                   "check_untyped_defs = True\ndisallow_untyped_defs = True\n")
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ini), "--cache-dir", str(tmp_path / "c"),
                        "-p", "ktdeploy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    untyped = re.findall(r"^(ktdeploy/\S+\.py:\d+): error: .*\[no-untyped-def\]$", r.stdout, re.M)
    assert "error" not in r.stderr, r.stderr[-2000:]
    assert r.stdout.strip(), "mypy printed nothing"   # it ran: "Success: ..." or the errors
    assert untyped == [], "annotate: " + ", ".join(untyped[:20])

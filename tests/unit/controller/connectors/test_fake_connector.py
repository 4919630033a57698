"""tests/fakes/connector.py:FakeConnector, the unit tests' connector double, is a Connector as mypy reads the
protocol (controller/connectors/base.py): a method of either drifting from the other fails here, not in whichever
test first calls it. The check itself is shown to bite on a double that is not one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ktdeploy.controller.connectors.base import Connector, Result
from tests.fakes.connector import FakeConnector, fail, ok

ROOT = Path(__file__).resolve().parents[4]
SETTINGS = ("[mypy]\npython_version = 3.11\nplugins = pydantic.mypy\nignore_missing_imports = True\n"
            "check_untyped_defs = True\ndisallow_untyped_defs = True\nfollow_imports = silent\n")
CHECK = """from ktdeploy.controller.connectors.base import Connector
from tests.fakes.connector import FakeConnector


class NameOnly:
    name = "short"


fake: Connector = FakeConnector()
short: Connector = NameOnly()
"""


def test_mypy_takes_the_fake_for_a_connector_and_refuses_a_double_that_is_not(tmp_path):
    (tmp_path / "mypy.ini").write_text(SETTINGS)
    (tmp_path / "check.py").write_text(CHECK)
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"), "--cache-dir",
                        str(tmp_path / "cache"), str(tmp_path / "check.py")], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "check.py:10:" in errors[0] and '"NameOnly"' in errors[0], r.stdout + r.stderr


def test_scripted_answers_recorded_calls_and_files(tmp_path):
    conn = FakeConnector().on(("docker", "inspect"), [fail(1, "No such container"), ok("{}")])
    assert isinstance(conn, Connector)
    assert [conn.run(["docker", "inspect", "x"]).rc for _ in range(3)] == [1, 0, 0]   # the last answer repeats
    conn.run(["docker", "inspect", "x"], input="secret", timeout=5)
    assert conn.calls[-1].input == "secret" and conn.calls[-1].timeout == 5
    (tmp_path / "a").write_bytes(b"payload")
    conn.put_file(str(tmp_path / "a"), "/host/a")
    conn.get_file("/host/a", str(tmp_path / "b"))
    assert (tmp_path / "b").read_bytes() == b"payload" and conn.ran("docker") == [["docker", "inspect", "x"]] * 4
    assert isinstance(conn.run(["realpath", "-m", "/x"]), Result)

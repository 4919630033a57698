"""The suite runs apart from the user's state (tests/user_state.py), and a session that writes there fails."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from ktdeploy.controller import runs
from tests.user_state import REAL_HOME_VAR, USER_RUN

REPO = Path(__file__).resolve().parents[2]


def test_this_session_keeps_the_users_state_out_of_reach():
    home = Path(os.environ["HOME"])
    assert home == Path(os.environ[REAL_HOME_VAR]) and (home / ".local/share/ktdeploy/runs" / USER_RUN).is_dir()
    assert not runs.home().is_relative_to(home)
    # a command without --run or KTDEPLOY_HOME of its own never reaches the user's latest run
    assert all(r.id != USER_RUN for r in runs.all_runs())
    for var in ("XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "TMPDIR", "ANSIBLE_HOME", "DOCKER_CONFIG"):
        assert not Path(os.environ[var]).is_relative_to(home), var


def _session(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """A pytest session of one test file with the guard loaded, as the tiers load it."""
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.user_state", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)


def test_a_session_that_writes_into_the_users_home_fails(tmp_path):
    """The issue's own case: an `up` that forgot KTDEPLOY_HOME records its run in the user's history."""
    r = _session(tmp_path, f"""
        import subprocess, sys
        def test_forgets_its_isolation(monkeypatch):
            monkeypatch.delenv("KTDEPLOY_HOME")
            monkeypatch.delenv("XDG_DATA_HOME")
            subprocess.run([sys.executable, "-m", "ktdeploy", "up", "--host", "gpu01", "--dry-run", "--facts",
                            "{REPO}/examples/facts/gpu-h200-1gpu.json"], capture_output=True, timeout=120)
        """)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "user state changed" in r.stdout and "added    ~/.local/share/ktdeploy/runs/2" in r.stdout, r.stdout


def test_a_session_that_changes_the_users_run_fails(tmp_path):
    r = _session(tmp_path, f"""
        import os, pathlib
        def test_touches_a_record():
            p = pathlib.Path(os.environ["HOME"], ".local/share/ktdeploy/runs/{USER_RUN}/status.json")
            p.write_text(p.read_text().replace("finished", "stopped"))
        """)
    assert r.returncode == 1 and f"modified ~/.local/share/ktdeploy/runs/{USER_RUN}/status.json" in r.stdout, r.stdout


def test_a_session_that_stays_in_its_folders_passes(tmp_path):
    r = _session(tmp_path, f"""
        import subprocess, sys
        def test_isolated(tmp_path):
            p = subprocess.run([sys.executable, "-m", "ktdeploy", "up", "--host", "gpu01", "--dry-run", "--facts",
                                "{REPO}/examples/facts/gpu-h200-1gpu.json"], capture_output=True, timeout=120)
            assert p.returncode in (0, 4), p.stderr
        """)
    assert r.returncode == 0 and "user state changed" not in r.stdout, r.stdout + r.stderr

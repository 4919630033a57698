"""The output-marker format has one home (core/markers.py): every script that frames its output prints the
markers from there, and every parser reads them back from there (issue 17: gather, plan state, follow, paths,
data probe). The scripts run under a real sh here, with a fake ``docker`` first on PATH."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from ktdeploy.controller.executor import FOLLOW_SCRIPT, parse_snapshot
from ktdeploy.core import markers
from ktdeploy.core.errors import ConnectError
from ktdeploy.core.facts.data_listing import DATA_SCRIPT, parse_data_output
from ktdeploy.core.facts.disk import PATHS_SCRIPT, parse_paths
from ktdeploy.core.plan.state import STATE_SCRIPT, parse_state

PKG = Path(__file__).resolve().parents[3] / "ktdeploy"

RUNNING = ('{"Status":"running","Running":true,"Paused":false,"Restarting":false,"OOMKilled":false,'
           '"Dead":false,"Pid":1,"ExitCode":0,"Error":"","StartedAt":"2026-01-01T00:00:00Z",'
           '"FinishedAt":"0001-01-01T00:00:00Z"}')


def _sh(script: str, *args: str, docker: str = "", tmp: Path) -> str:
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    fake = bindir / "docker"
    fake.write_text("#!/bin/sh\n" + docker + "\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    return subprocess.run(["sh", "-c", script, "ktdeploy-test", *args], capture_output=True, text=True,
                          env=env, timeout=30).stdout


def test_no_marker_literal_outside_markers_module():
    """Only core/markers.py spells a marker in code (comments and docstrings may name them)."""
    pat = re.compile(r"""["']@@|["']==ktd|@@KTD-(BEGIN|RC|END)""")
    offenders = []
    for p in PKG.rglob("*.py"):
        if p.name == "markers.py" and p.parent.name == "core":
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pat.search(code):
                offenders.append(f"{p.relative_to(PKG)}:{i}: {line.strip()}")
    assert offenders == []


def test_sh_fields_round_trip(tmp_path):
    out = _sh(markers.sh_fields("k", '"$1"', '"$2"') + "; " + markers.sh_fields("open", newline=False)
              + "; echo tail", "a b", "c:d", tmp=tmp_path)
    lines = out.splitlines()
    assert markers.field_values(lines[0], "k") == ["a b", "c:d"]
    assert markers.field_values(lines[1], "open") == ["tail"]
    assert markers.field_values(lines[0], "open") is None


def test_follow_frame_from_the_real_script(tmp_path):
    log = tmp_path / "trainer_log.jsonl"
    log.write_text('{"current_steps": 3, "total_steps": 10, "loss": 1.5}\n')
    out = _sh(FOLLOW_SCRIPT, "job", str(log), docker=f"echo '{RUNNING}'", tmp=tmp_path)
    frame = markers.parse_follow(out)
    assert frame is not None and frame.inspect_rc == "0" and frame.inspect == [RUNNING]
    snap = parse_snapshot(0, out)
    assert snap.state is not None and snap.state.running and snap.entry is not None
    assert snap.entry.current_steps == 3
    # every cut short answer (the connection dropped before '@@end') is not a frame, and never "gone"
    gone = _sh(FOLLOW_SCRIPT, "job", str(log), docker="echo 'Error: No such container: job' >&2; exit 1",
               tmp=tmp_path)
    assert parse_snapshot(0, gone).state is None
    for cut in range(len(gone) - len("@@end\n") + 1):
        assert markers.parse_follow(gone[:cut]) is None
        with pytest.raises(ConnectError):
            parse_snapshot(-1, gone[:cut])
        with pytest.raises(ConnectError):
            parse_snapshot(124, gone[:cut])


def test_state_paths_and_data_scripts_round_trip(tmp_path):
    out_dir = tmp_path / "out"
    (out_dir / "checkpoint-5").mkdir(parents=True)
    (out_dir / "checkpoint-5" / "trainer_state.json").write_text("{}")
    st = parse_state(_sh(STATE_SCRIPT, "job", "job-serve", "img", str(out_dir), str(tmp_path / "ad"),
                         docker=f"echo '{RUNNING}'", tmp=tmp_path))
    assert st.output_exists and st.listing == {"checkpoint-5": ["trainer_state.json"]} and st.top_level == ["checkpoint-5"]
    assert st.container is not None and st.container.running and not st.adapter_present
    assert re.fullmatch(r"\d+:\d+", st.user) and st.home
    (pf,) = parse_paths(_sh(PATHS_SCRIPT, str(out_dir), tmp=tmp_path))
    assert pf.exists and pf.is_dir and pf.writable
    f = tmp_path / "d:a\tta.json"
    f.write_text('[{"a": 1}]')
    facts = parse_data_output(_sh(DATA_SCRIPT, "read", str(f), "ls", str(out_dir), "read", "/nonexistent",
                                  tmp=tmp_path))
    assert facts.get("read", str(f)).content == '[{"a": 1}]' and facts.get("read", str(f)).size == 10
    assert facts.get("ls", str(out_dir)).content == "checkpoint-5"
    assert not facts.get("read", "/nonexistent").ok


def test_follow_frame_while_the_trainer_is_writing_a_line(tmp_path):
    """The trainer appends trainer_log.jsonl while FOLLOW reads it: a tail whose last line has no newline yet must
    still give a complete frame (an '@@end' glued to the torn line read as a lost connection: a flaky real up), and
    the entry is the last finished line."""
    log = tmp_path / "trainer_log.jsonl"
    log.write_text('{"current_steps": 3, "total_steps": 10, "loss": 1.5}\n{"current_steps": 4, "tot')
    out = _sh(FOLLOW_SCRIPT, "job", str(log), docker=f"echo '{RUNNING}'", tmp=tmp_path)
    assert markers.parse_follow(out) is not None
    snap = parse_snapshot(0, out)
    assert snap.entry is not None and snap.entry.current_steps == 3
    # a finished log is read as before (no line added, none lost)
    log.write_text('{"current_steps": 4, "total_steps": 10, "loss": 1.4}\n')
    frame = markers.parse_follow(_sh(FOLLOW_SCRIPT, "job", str(log), docker=f"echo '{RUNNING}'", tmp=tmp_path))
    assert frame is not None and frame.log == ['{"current_steps": 4, "total_steps": 10, "loss": 1.4}']

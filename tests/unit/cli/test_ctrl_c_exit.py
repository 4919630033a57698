"""Ctrl-C exits 130 (docs/security.md, README "Exit codes") wherever ktdeploy waits: `up` following (the run is
recorded "detached": training keeps running on the host), `logs -f` and `eval` (at once, though a request is still
in flight, and without leaving the folder it made); before, the first two exited 0 and eval waited for its last
request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from ktdeploy.cli import app
from ktdeploy.controller import run_queries, up_host, up_phases
from ktdeploy.controller.runs import RunRecord
from ktdeploy.controller.up_record import UpResult
from ktdeploy.core.errors import EXIT_INTERRUPTED


class _Plan:
    job = "ktd-tiny-moe-lora-12345678"


class _Executor:
    plan, jobs, submitted_at = _Plan(), {}, None


class _Events:
    def __init__(self):
        self.seen = []

    def emit(self, e):
        self.seen.append(e)


def test_ctrl_c_during_the_plan_detaches_and_marks_the_result_interrupted(tmp_path):
    rec = RunRecord.create("tiny-moe-lora", root=tmp_path)
    events = _Events()
    res = up_phases._stopped(KeyboardInterrupt(), None, events, _Executor(), UpResult(record=rec), host="gpu01")
    assert res.interrupted and res.state == "detached" and rec.status()["state"] == "detached"
    assert "keeps running" in rec.status()["note"] and events.seen


def test_up_exits_130_when_ctrl_c_detached_it(monkeypatch, tmp_path):
    rec = RunRecord.create("tiny-moe-lora", root=tmp_path)
    monkeypatch.setattr(up_host, "up", lambda request, on_event=None: UpResult(record=rec, state="detached",
                                                                                interrupted=True))
    r = CliRunner().invoke(app, ["up", "--host", "localhost", "--no-progress"])
    assert r.exit_code == EXIT_INTERRUPTED, r.output
    monkeypatch.setattr(up_host, "up", lambda request, on_event=None: UpResult(record=rec, state="finished"))
    assert CliRunner().invoke(app, ["up", "--host", "localhost", "--no-progress"]).exit_code == 0


def test_logs_follow_exits_130_on_ctrl_c(monkeypatch, tmp_path):
    rec = RunRecord.create("tiny-moe-lora", root=tmp_path)
    rec.set_status("detached")
    closed = []

    class Conn:
        def run(self, argv, timeout=None):   # the container exists
            return type("R", (), {"rc": 0, "stdout": "", "stderr": ""})()

        def close(self):
            closed.append(True)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_queries, "latest_run", lambda *a, **k: rec)
    monkeypatch.setattr(run_queries, "_container", lambda *a, **k: "ktd-x")
    monkeypatch.setattr(run_queries, "_connect_for", lambda *a, **k: Conn())
    monkeypatch.setattr(run_queries, "_container_log", interrupted)
    r = CliRunner().invoke(app, ["logs", "-f"])
    assert r.exit_code == EXIT_INTERRUPTED and closed == [True], r.output


REPO = Path(__file__).resolve().parents[3]
# A Ctrl-C at a terminal: SIGINT handled as Python does by default (a process started from a background job of a
# non-interactive shell inherits SIGINT ignored, and keeps it: tests/integration/test_up_hosts.py says more)
CTRL_C_ABLE = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
               "sys.argv[0] = 'ktdeploy'; runpy.run_module('ktdeploy', run_name='__main__', alter_sys=True)")


def test_eval_exits_130_at_once_on_ctrl_c_while_a_request_is_in_flight(tmp_path):
    from tests.fakes.openai_server import OpenAIDouble

    srv = OpenAIDouble(mode="slow", delay=90)     # an answer slower than any test: only Ctrl-C ends the wait
    held = tmp_path / "held.json"
    held.write_text(json.dumps([{"instruction": "", "input": f"q{i}", "output": "a"} for i in range(3)]))
    out = tmp_path / "ev"
    try:
        p = subprocess.Popen([sys.executable, "-c", CTRL_C_ABLE, "eval", "--endpoint", srv.url, "--dataset", str(held),
                              "--no-base", "--concurrency", "1", "-o", str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO,
                             env={**os.environ, "KTDEPLOY_HOME": str(tmp_path / "home"), "COLUMNS": "100"})
        deadline = time.monotonic() + 120
        while not srv.requests:                   # the first question is being answered (slowly)
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "eval sent no request in 120 s"
            time.sleep(0.05)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        srv.stop()
    assert p.returncode == EXIT_INTERRUPTED, (stdout, stderr)
    assert stderr.strip().splitlines()[-1] == "interrupted" and "Traceback" not in stderr, stderr
    assert took < 30, took                      # not the 90 s the request in flight would take
    assert not out.exists()                     # the folder it made, empty, is gone: the same -o works again


def test_a_bug_while_the_plan_runs_leaves_the_record_failed_not_training(monkeypatch, tmp_path):
    """An unexpected exception in FOLLOW (exit 70, a bug) used to leave status.json at "training" for good."""
    import pytest

    rec = RunRecord.create("tiny-moe-lora", root=tmp_path)
    rec.set_status("training")

    class Broken:
        def __init__(self, *a, **k):
            pass

        def apply(self):
            raise RuntimeError("boom")

    class Plan:
        notes = ()

    class Events(_Events):
        record = rec

    monkeypatch.setattr(up_phases, "Executor", Broken)
    with pytest.raises(RuntimeError):
        up_phases.apply_phase(None, Plan(), None, None, UpResult(record=rec), Events(), host="gpu01", detach=False)
    st = rec.status()
    assert st["state"] == "failed" and st["exit_code"] == 70 and "RuntimeError: boom" in st["error"]
    assert "ktdeploy status --host gpu01" in st["note"]


def test_a_detach_names_the_command_that_goes_on_not_a_placeholder(monkeypatch):
    """After Ctrl-C, `up` prints the very command to run again (its own command line, quoted), not "(same args)"."""
    import io

    from rich.console import Console

    from ktdeploy.cli.events_view import EventView
    from ktdeploy.cli.up_cmds import this_command
    from ktdeploy.core import events as ev

    monkeypatch.setattr(sys, "argv", ["/x/bin/ktdeploy", "up", "--host", "gpu01", "my recipe.yaml", "--resume", "auto"])
    out = io.StringIO()
    EventView(Console(file=out, width=300), again=this_command())(
        ev.Detached(reason="interrupted (Ctrl-C)", job="ktd-job", host="gpu01", terminated=False))
    text = out.getvalue()
    assert "ktdeploy up --host gpu01 'my recipe.yaml' --resume auto to go on" in text, text
    assert "same args" not in text

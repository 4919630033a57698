"""Ctrl-C while following exits 130 (docs/security.md, README "Exit codes"), the same in `up` (the run is recorded
"detached": training keeps running on the host) and `logs -f`; before, both exited 0."""

from __future__ import annotations

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

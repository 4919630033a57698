"""`ktdeploy logs --stage train|convert|serve`: a stage that never started says so truthfully (a failed run, a
skipped stage, a dry run) without reaching the host; a container that is gone is read from the copy the record
keeps (convert's output, `down`'s copy); the executor keeps that copy of the one-shot containers' output."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ktdeploy.controller import run_queries
from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.executor import Executor
from ktdeploy.controller.runs import RunRecord
from ktdeploy.core import run_record as rr
from ktdeploy.core.errors import StepError, UsageError
from ktdeploy.core.plan.steps import Plan, Stage, Step
from tests.fakes.connector import FakeConnector, ok

UNREACHABLE = "ssh://nobody@127.0.0.1:1"   # nothing listens: reaching for it would fail with exit 3


def _run(home, *, host=UNREACHABLE, state="failed", events=(), **status) -> RunRecord:
    rec = RunRecord.create("tiny-moe-lora", root=home / "runs")
    rec.set_status(state, host=host, recipe="tiny-moe-lora", container="ktd-nc2-absent-0f1e2d3c",
                   serve_container="ktd-nc2-absent-0f1e2d3c-serve", output_dir="/o/tiny", created=1.0, **status)
    for kind, data in events:
        rec.event(kind, **data)
    return rec


def _logs(rec, stage, home, monkeypatch):
    monkeypatch.setenv("KTDEPLOY_HOME", str(home))
    said, lines = [], []
    run_queries.logs(run_id=rec.id, stage=stage, write=lines.append, say=said.append, poll_s=0)
    return " ".join(" ".join(said).split()), lines


@pytest.mark.parametrize("stage,word", [("train", "training"), ("convert", "conversion"), ("serve", "serving")])
def test_a_stage_after_the_failure_never_started_and_the_host_is_not_asked(tmp_path, monkeypatch, stage, word):
    rec = _run(tmp_path, failed_stage="PREFLIGHT", error="doctor: 3 fail",
               events=[("stage_start", {"stage": "PREFLIGHT"}), ("failed", {"stage": "PREFLIGHT"})])
    said, lines = _logs(rec, stage, tmp_path, monkeypatch)
    assert lines == []
    assert said.startswith(f"{stage.upper()} never started in run {rec.id}: the run ended in PREFLIGHT (failed)")
    assert f"before any {word} container was created" in said and f"ktdeploy status --run {rec.id}" in said
    assert "removed" not in said and "ktdeploy down" not in said


def test_a_skipped_stage_says_why(tmp_path, monkeypatch):
    rec = _run(tmp_path, state="detached", events=[("stage_start", {"stage": "TRAIN"}),
                                                   ("stage_skipped", {"stage": "CONVERT", "reason": "--detach"})])
    said, _ = _logs(rec, "convert", tmp_path, monkeypatch)
    assert said.startswith(f"run {rec.id} skipped CONVERT (--detach)") and "without --detach" in said


def test_a_run_still_before_the_stage_says_so(tmp_path, monkeypatch):
    rec = _run(tmp_path, state="running", stage="IMAGE", events=[("stage_start", {"stage": "IMAGE"})])
    said, _ = _logs(rec, "train", tmp_path, monkeypatch)
    assert said.startswith(f"run {rec.id} is in IMAGE; TRAIN has not started yet")


def test_a_dry_run_has_no_log(tmp_path, monkeypatch):
    rec = _run(tmp_path, state="dry-run", dry_run=True)
    said, _ = _logs(rec, "serve", tmp_path, monkeypatch)
    assert said == f"run {rec.id} is a dry run: it started nothing on the host, so SERVE has no log."


def test_a_gone_container_is_read_from_the_records_copy(tmp_path, monkeypatch):
    rec = _run(tmp_path, host="localhost", state="finished",
               events=[("stage_start", {"stage": "TRAIN"}), ("stage_start", {"stage": "CONVERT"})])
    rec.write_text(f"{rr.ARTIFACTS}/{rr.STEP_LOGS['convert.adapter']}", "reading /o/tiny\nadapter written\n")
    said, lines = _logs(rec, "convert", tmp_path, monkeypatch)   # the real `docker inspect` finds no such container
    assert lines == ["reading /o/tiny", "adapter written"]
    assert "ktd-nc2-absent-0f1e2d3c-convert is no longer on localhost" in said
    assert str(rec.path / rr.ARTIFACTS / "convert.log") in said
    # the training log: `down`'s copy of the container it removed
    rec.write_text(f"{rr.ARTIFACTS}/ktd-nc2-absent-0f1e2d3c.log", "step 1\nstep 2\nstep 3\n")
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    got = []
    run_queries.logs(run_id=rec.id, stage="train", tail=2, write=got.append, say=lambda s: None)
    assert got == ["step 2", "step 3"]


def test_a_gone_container_without_a_copy_is_said_plainly(tmp_path, monkeypatch):
    rec = _run(tmp_path, host="localhost", state="finished", events=[("stage_start", {"stage": "SERVE"})])
    monkeypatch.setenv("KTDEPLOY_HOME", str(tmp_path))
    with pytest.raises(StepError) as e:
        run_queries.logs(run_id=rec.id, stage="serve", write=print, say=print)
    assert "ktd-nc2-absent-0f1e2d3c-serve is no longer on localhost" in e.value.message
    assert "keeps no copy" in e.value.message and "ktdeploy down" not in (e.value.fix or "")


def test_an_unknown_stage_is_a_usage_error(tmp_path, monkeypatch):
    rec = _run(tmp_path)
    with pytest.raises(UsageError) as e:
        _logs(rec, "converts", tmp_path, monkeypatch)
    assert "did you mean convert?" in e.value.message and e.value.key == "--stage"
    assert e.value.message.startswith('"converts" is not'), e.value.message   # quoted once, not '"converts"'


def test_the_executor_keeps_the_output_of_a_one_shot_container(tmp_path):
    conn = FakeConnector().on(("docker", "run"), ok("converted 24 tensors\n", "note: base recorded\n"))
    plan = Plan(host="fake-host", recipe="r", job="job1", image="img", variant=None, output_dir="/out",
                adapter_dir="/out/adapter", job_dir="/job",
                stages=(Stage("CONVERT", "convert", (Step("convert.adapter", "convert", argv=("docker", "run", "x")),)),))
    ex = Executor(conn, Emitter(RunRecord.create("r", root=tmp_path / "runs")), plan, poll_s=0)
    ex.apply()
    text = (ex.record.path / rr.ARTIFACTS / "convert.log").read_text()
    assert "converted 24 tensors" in text and "note: base recorded" in text


def test_the_cli_says_it_on_stderr_and_exits_0(tmp_path):
    rec = _run(tmp_path, failed_stage="IMAGE", events=[("stage_start", {"stage": "IMAGE"})])
    p = subprocess.run([sys.executable, "-m", "ktdeploy", "logs", "--stage", "convert"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "KTDEPLOY_HOME": str(tmp_path), "COLUMNS": "100"})
    assert p.returncode == 0 and p.stdout == "", (p.stdout, p.stderr)
    assert " ".join(p.stderr.split()).startswith(f"CONVERT never started in run {rec.id}: the run ended in IMAGE")

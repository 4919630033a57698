"""`ktdeploy status` of a run nobody followed (`up --detach`, or a controller killed while following): when its
training container stopped with an error, status says why as up's FOLLOW would have — the trainer's own last
exception, the whole log kept in the record and its path, the exit — records it (`status --all` shows it too), and
names the one restart, spelled out: the same `up` with --resume auto. A finished one names the `up` that converts
and serves it. The host is a FakeConnector answering what docker answers (the unit tier has no host)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ktdeploy.cli import app
from ktdeploy.controller import run_queries
from ktdeploy.controller.executor import FOLLOW_SCRIPT
from ktdeploy.controller.runs import RunRecord
from ktdeploy.core import run_record as rr
from tests.fakes.connector import FakeConnector, container_state, ok

JOB = "ktd-tiny-moe-lora-0123abcd"
TRACE = """[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/venv/lib/python3.11/site-packages/llamafactory/train/sft/workflow.py", line 96, in run_sft
[rank0]:     train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
[rank0]:   File "/opt/venv/lib/python3.11/site-packages/kt_kernel/sft.py", line 412, in forward
[rank0]:     raise RuntimeError("kt_max_cache_depth 2 is too small for 3 in-flight micro-batches")
[rank0]: RuntimeError: kt_max_cache_depth 2 is too small for 3 in-flight micro-batches
Traceback (most recent call last):
  File "/opt/venv/bin/accelerate", line 8, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED
"""


def _snap(status: str, exit_code: int | None = 0) -> object:
    return ok("@@inspect\t0\n" + container_state(status, exit_code) + "\n@@log\n@@end\n")


def _absent() -> object:
    return ok("@@inspect\t1\nError: No such container: x\n@@log\n@@end\n")


def _detached(home, monkeypatch, conn, **status) -> RunRecord:
    monkeypatch.setenv("KTDEPLOY_HOME", str(home))
    rec = RunRecord.create("tiny-moe-lora")
    rec.set_status("detached", host="ssh://kt@gpu01:22", recipe="tiny-moe-lora", container=JOB,
                   serve_container=f"{JOB}-serve", output_dir="/srv/ktdeploy/output/tiny-moe-lora", created=1.0,
                   stage="TRAIN", recipe_path="/repo/recipes/tiny-moe-lora.yaml", waived=["docker.memlock"],
                   note="--detach: training runs on the host", **status)
    monkeypatch.setattr(run_queries, "_connect_for", lambda *a, **k: conn)
    return rec


def _host(train_status: str, exit_code: int | None, log: str = TRACE) -> FakeConnector:
    return (FakeConnector().on(("sh", "-c", FOLLOW_SCRIPT, "ktdeploy-follow", JOB), _snap(train_status, exit_code))
            .on(("sh", "-c", FOLLOW_SCRIPT, "ktdeploy-follow", f"{JOB}-serve"), _absent())
            .on(("docker", "logs", "--", JOB), ok(log)))


def test_a_crash_nobody_followed_is_found_said_and_recorded(tmp_path, monkeypatch):
    rec = _detached(tmp_path, monkeypatch, _host("exited", 1))
    st = run_queries.status(run_id=rec.id)
    log = rec.path / rr.ARTIFACTS / "container.log"
    assert log.read_text() == TRACE                                   # the whole log, kept in the record
    assert st["state"] == "crashed" and st["failed_stage"] == "TRAIN"
    assert st["error"].startswith("the trainer crashed: RuntimeError: kt_max_cache_depth 2 is too small for 3 "
                                  "in-flight micro-batches (/opt/venv/lib/python3.11/site-packages/kt_kernel/sft.py:412)")
    assert f"full log: {log}" in st["error"] and "ChildFailedError" not in st["error"].splitlines()[0]
    want = "ktdeploy up --host ssh://kt@gpu01:22 /repo/recipes/tiny-moe-lora.yaml --waive docker.memlock --resume auto"
    assert f"`{want}`" in st["fix"], st["fix"]
    assert rec.status()["state"] == "crashed"                          # `status --all` reads it from the record


def test_status_prints_the_reason_the_log_and_the_restart(tmp_path, monkeypatch):
    rec = _detached(tmp_path, monkeypatch, _host("exited", 1))
    r = CliRunner().invoke(app, ["status"], env={"COLUMNS": "400"})
    out = " ".join(r.output.split())
    assert r.exit_code == 0, r.output
    assert "failed in TRAIN (exit 1): the trainer crashed: RuntimeError: kt_max_cache_depth 2" in out, out
    assert f"full log: {rec.path / rr.ARTIFACTS / 'container.log'}" in out
    assert "--resume auto" in out and "ktdeploy up --host ssh://kt@gpu01:22 /repo/recipes/tiny-moe-lora.yaml" in out
    r = CliRunner().invoke(app, ["status", "--all"], env={"COLUMNS": "400"})
    row = next(ln for ln in r.output.splitlines() if ln.startswith(rec.id))
    assert row.split()[2:4] == ["TRAIN", "crashed"] and "the trainer crashed: RuntimeError" in row


def test_a_crash_without_a_traceback_still_says_how_it_stopped(tmp_path, monkeypatch):
    rec = _detached(tmp_path, monkeypatch, _host("exited", 137, log="step 3\nKilled\n"))
    st = run_queries.status(run_id=rec.id)
    assert st["error"].startswith("the training container stopped (exited, exit code 137, killed (SIGKILL); no "
                                  "exception in its log)"), st["error"]
    assert "dmesg" in st["fix"] and "--resume auto" in st["fix"]


@pytest.mark.parametrize("state", ["finished", "crashed", "failed", "stopped"])
def test_a_run_whose_end_is_recorded_is_left_as_it_is(tmp_path, monkeypatch, state):
    rec = _detached(tmp_path, monkeypatch, _host("exited", 1))
    rec.set_status(state)
    st = run_queries.status(run_id=rec.id)
    assert st["state"] == state and not (rec.path / rr.ARTIFACTS / "container.log").exists()


def test_a_finished_detached_run_names_the_up_that_converts_and_serves(tmp_path, monkeypatch):
    rec = _detached(tmp_path, monkeypatch, _host("exited", 0))
    r = CliRunner().invoke(app, ["status"], env={"COLUMNS": "400"})
    out = " ".join(r.output.split())
    assert r.exit_code == 0 and rec.status()["state"] == "detached", r.output
    assert ("next: training finished; ktdeploy up --host ssh://kt@gpu01:22 /repo/recipes/tiny-moe-lora.yaml "
            "--waive docker.memlock converts and serves it") in out, out


def test_json_carries_the_recorded_crash(tmp_path, monkeypatch):
    rec = _detached(tmp_path, monkeypatch, _host("exited", 1))
    r = CliRunner().invoke(app, ["status", "--json"])
    d = json.loads(r.output)
    assert d["state"] == "crashed" and d["live"]["container"]["exit_code"] == 1 and rec.id == d["id"]

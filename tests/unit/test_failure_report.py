"""A failed run says why: `status` shows the failed stage, the error and its fix, and `down` keeps them; the crash
report is flat and readable at 80 columns, its advice fits the failure, and the restart is one story: the same
`up` with --resume auto, which replaces the stopped container (starting fresh when there is no checkpoint)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from ktdeploy.cli import output
from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.executor import Executor, exit_advice, flat_lines
from ktdeploy.controller.runs import RunRecord, all_runs
from ktdeploy.core.errors import StepError
from ktdeploy.core.markers import FILES_SH
from ktdeploy.core.plan.params import FollowParams
from ktdeploy.core.plan.state import ContainerState
from ktdeploy.core.plan.steps import Plan, Stage, Step, StepAction
from tests.fakes.connector import FakeConnector, container_state, ok

REPO = Path(__file__).resolve().parents[2]


def cli(*args, home: Path, columns: int = 80) -> subprocess.CompletedProcess:
    env = {**os.environ, "KTDEPLOY_HOME": str(home), "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "ktdeploy", *args], capture_output=True, text=True, env=env,
                          timeout=180, cwd=REPO)


def test_status_shows_why_a_run_failed_and_down_keeps_it(tmp_path):
    """A real `up` that stops at PREFLIGHT (a model volume that exists nowhere), then status, down, status."""
    r = cli("up", "--host", "localhost", "--set", "deploy.volumes.model=/nonexistent-ktd-model",
            "--set", "train.model_name_or_path=/nonexistent-ktd-model/m", home=tmp_path)
    assert r.returncode == 1, r.stderr
    st = cli("status", home=tmp_path)
    text = st.stdout
    assert st.returncode == 0, st.stderr
    assert "recorded state failed" in text and "failed in PREFLIGHT (exit 1): doctor on localhost:" in text, text
    assert "failed checks:" in text and "path.model_exists" in " ".join(text.split()), text
    assert "fix: Fix the failed checks" in text, text
    assert all(len(ln) <= 80 for ln in text.splitlines() if " " in ln.strip()), text
    assert cli("down", home=tmp_path).returncode == 0
    after = cli("status", home=tmp_path).stdout
    assert "recorded state failed" in after and "failed in PREFLIGHT (exit 1)" in after, after
    assert "path.model_exists" in " ".join(after.split()) and "containers stopped by `ktdeploy down`" in after, after
    (rec,) = all_runs(tmp_path / "runs")
    s = rec.status()
    assert s["state"] == "failed" and s["failed_stage"] == "PREFLIGHT" and s["fix"] and s["down"]


def test_errors_are_flat_and_whole_at_80_columns():
    buf = io.StringIO()
    old = output.err_console
    output.err_console = Console(file=buf, width=80, force_terminal=False, color_system=None)
    try:
        output.print_error(StepError("FOLLOW: container ktd-tiny-moe-lora-30480af1 exited, exit code 1\nexit code: 1"
                                     "   OOM-killed: no\nlast log lines:\n  Traceback (most recent call last):\n"
                                     "  ValueError: /srv/ktdeploy/output/tiny-moe-lora/checkpoint-20 is incomplete",
                                     fix="see the last log lines above; fix the cause, then run the same `ktdeploy "
                                         "up` again with --resume auto (it goes on from the newest checkpoint)."))
    finally:
        output.err_console = old
    out = buf.getvalue()
    assert not any(c in out for c in "│╭╮╰╯"), out
    assert all(len(ln) <= 80 for ln in out.splitlines()), out
    assert out.startswith("StepError: FOLLOW: container ktd-tiny-moe-lora-30480af1 exited")
    assert "/srv/ktdeploy/output/tiny-moe-lora/checkpoint-20" in out   # a path stays whole
    assert "\n  fix: see the last log lines above;" in out


PANEL_LOG = """\
╭──────────────────────────── CheckFailed ─────────────────────────────╮
│ this host cannot run the recipe: doctor found failing checks          │
│ fix: fix the failing checks listed below, or run `ktdeploy doctor`    │
╰───────────────────────────────────────────────────────────────────────╯
  fail  gpu.present  no GPU visible in this container
"""
FLAT_LOG = """\
CheckFailed: this host cannot run the recipe: doctor found failing checks
  fix: fix the failing checks listed below, or run `ktdeploy doctor` for the full report.
  fail  gpu.present  no GPU visible in this container
"""


def test_flat_lines_drop_an_old_images_panel_borders():
    lines = flat_lines(PANEL_LOG.splitlines())
    assert lines[:2] == ["CheckFailed:", "this host cannot run the recipe: doctor found failing checks"]
    assert not any(c in "".join(lines) for c in "│╭╮╰╯─")


def _follow_plan() -> Plan:
    return Plan(host="fake-host", recipe="r", job="job1", image="img", variant=None, output_dir="/out",
                adapter_dir="/out/adapter", job_dir="/job",
                stages=(Stage("FOLLOW", "follow", (Step("follow.train", "follow", action=StepAction.FOLLOW,
                                                        params=FollowParams(container="job1", log="/out/x.jsonl")),)),))


def _exited_at_once(log: str):
    snap = ok("@@inspect\t0\n" + container_state("exited", 1) + "\n@@log\n@@end\n")
    from ktdeploy.controller.executor import FOLLOW_SCRIPT

    return (FakeConnector().on(("sh", "-c", FOLLOW_SCRIPT), snap).on(("docker", "logs"), ok(log))
            .on(("sh", "-c", FILES_SH), ok("")))


def test_a_refusal_by_the_containers_doctor_names_the_refusal_and_the_one_restart(tmp_path):
    for log in (FLAT_LOG, PANEL_LOG):
        ex = Executor(_exited_at_once(log), Emitter(RunRecord.create("r", root=tmp_path / "runs")), _follow_plan(),
                      poll_s=0)
        try:
            ex.apply()
        except StepError as e:
            err = e
        assert "--resume auto" in err.fix and "starts fresh when there is none" in err.fix, err.fix
        assert "own doctor refused" in err.fix and "--cpu-only" in err.fix
        assert "│" not in err.message and "gpu.present" in err.message


def test_every_training_crash_gets_the_one_restart_story():
    """A rerun without --resume only reports the crash again (host_plan's train.crashed, whose fix is --resume
    auto), so no advice may say "no --resume needed": each names --resume auto and what it does."""
    st = ContainerState("exited", 1)
    for lines, progressed in ((["Traceback", "RuntimeError: CUDA error"], True), (["Traceback", "RuntimeError: x"], False),
                              (["RecipeError: train.x is unknown"], None)):
        advice = exit_advice(st, lines=lines, progressed=progressed)
        assert "--resume auto" in advice and "starts fresh when there is none" in advice, advice
        assert "no --resume" not in advice
    assert "the server stopped" in exit_advice(st, role="serve")


TORCHRUN_LOG = """[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/venv/lib/python3.11/site-packages/llamafactory/launcher.py", line 23, in <module>
[rank0]:     launch()
[rank0]:   File "/opt/venv/lib/python3.11/site-packages/transformers/training_args.py", line 1717, in __post_init__
[rank0]:     raise ValueError(error_message)
[rank0]: ValueError: Your setup doesn't support bf16/gpu.
E1207 00:00:01 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1)
Traceback (most recent call last):
  File "/opt/venv/bin/accelerate", line 8, in <module>
    sys.exit(main())
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
llamafactory/launcher.py FAILED
"""


def test_the_trainers_own_exception_is_found_under_the_launchers_boilerplate():
    from ktdeploy.core.trainer_exception import last_exception

    exc = last_exception(TORCHRUN_LOG)
    assert exc is not None and exc.type == "ValueError" and exc.message == "Your setup doesn't support bf16/gpu."
    assert exc.where == "/opt/venv/lib/python3.11/site-packages/transformers/training_args.py:1717"
    assert last_exception("step 1\nstep 2\n") is None
    only_launcher = TORCHRUN_LOG.split("E1207")[1]
    assert last_exception(only_launcher).type.endswith("ChildFailedError")   # nothing better: the launcher's own


def test_a_crash_leads_with_the_trainers_exception_and_the_logs_path(tmp_path):
    rec = RunRecord.create("r", root=tmp_path / "runs")
    ex = Executor(_exited_at_once(TORCHRUN_LOG), Emitter(rec), _follow_plan(), poll_s=0)
    with pytest.raises(StepError) as e:
        ex.apply()
    first = e.value.message.splitlines()[0]
    assert first.startswith("FOLLOW: the trainer crashed: ValueError: Your setup doesn't support bf16/gpu. "
                            "(/opt/venv/lib/python3.11/site-packages/transformers/training_args.py:1717)"), first
    assert f"full log: {rec.path}/artifacts/container.log" in first
    assert "--resume auto" in e.value.fix


def test_resume_auto_without_a_checkpoint_says_it_starts_fresh():
    from ktdeploy.controller.up_inputs import load_facts_file
    from ktdeploy.core.plan import UpOptions, build_plan
    from ktdeploy.core.plan.state import JobState
    from ktdeploy.core.recipe import load_recipe

    plan = build_plan(load_recipe(REPO / "recipes/tiny-moe-lora.yaml"),
                      load_facts_file(REPO / "examples/facts/gpu-h200-1gpu.json"), JobState(home="/h", user="0:0"),
                      UpOptions(host="gpu01", resume="auto", image_tar="/x.tar"))
    notes = [n for n in plan.notes if n.startswith("--resume")]
    assert notes == ["--resume auto: no complete checkpoint in /srv/ktdeploy/output/tiny-moe-lora: training starts "
                     "fresh, from step 0"]
    assert json.dumps(plan.to_json())   # recorded in plan.json too

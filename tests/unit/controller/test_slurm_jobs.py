"""up-slurm's WAIT_JOB / FOLLOW_JOB through the real executor: a job read cut short (an SSH hiccup, a slow
scontrol on a busy login node) is recorded and the follow goes on; READ_MISSES in a row end it with the
ConnectError that leaves the job running (detached). The login node's answers are JOB_SH run for real under sh,
with scontrol/sacct stand-ins on PATH, so the framing the follow parses is the script's own."""

from __future__ import annotations

import os
import subprocess

import pytest

from ktdeploy.controller import slurm_jobs
from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.executor import Executor
from ktdeploy.controller.runs import RunRecord
from ktdeploy.core import markers
from ktdeploy.core.errors import ConnectError
from ktdeploy.core.plan.params import WaitJobParams
from ktdeploy.core.plan.steps import Plan, Stage, StageName, Step, StepAction
from tests.fakes.connector import FakeConnector, fail, ok

SCONTROL = ("JobId=7 JobName=ktd-x UserId=root(0) JobState={state} Reason=None Dependency=(null) Requeue=1 "
            "Restarts=0 BatchFlag=1 ExitCode=0:0 NodeList=amx1 BatchHost=amx1 Features=amx\n")


def _job_sh_answer(tmp_path, state: str) -> str:
    """What JOB_SH prints on a login node where scontrol knows job 7 in ``state``."""
    bindir = tmp_path / f"bin-{state}"
    bindir.mkdir()
    (bindir / "scontrol").write_text(f"#!/bin/sh\nprintf '%s' '{SCONTROL.format(state=state)}'\n")
    (bindir / "sacct").write_text("#!/bin/sh\nexit 1\n")
    for f in bindir.iterdir():
        f.chmod(0o755)
    out = subprocess.run(["sh", "-c", markers.JOB_SH, "t", "7", "/dev/null"], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}, check=True).stdout
    assert markers.parse_job(out) is not None
    return out


CUT_SHORT = fail(255, "client_loop: send disconnect: Connection reset by peer")


def _run_wait(tmp_path, answers: list) -> tuple[FakeConnector, Executor]:
    conn = (FakeConnector(name="login01")
            .on(lambda argv: argv[:3] == ["sh", "-c", markers.JOB_SH], answers)
            .on(lambda argv: argv[:3] == ["sh", "-c", slurm_jobs.JOB_LOG_SH], ok("job log\n")))
    step = Step("convert.wait", "the convert job", action=StepAction.WAIT_JOB,
                params=WaitJobParams(role="convert", job_dir="/o/.ktdeploy-jobs/ktd-x", job_id="7"))
    plan = Plan(host="login01", recipe="tiny", job="ktd-x", image="ktsft:amx", variant="amx", output_dir="/o",
                adapter_dir="/o-sglang", job_dir="/o/.ktdeploy-jobs/ktd-x",
                stages=(Stage(StageName.CONVERT, "convert", steps=(step,)),))
    ex = Executor(conn, Emitter(RunRecord.create("r", root=tmp_path / "runs")), plan, poll_s=0)
    return conn, ex


def _misses(ex: Executor) -> list[dict]:
    return [e for e in ex.record.events() if e.get("kind", e.get("event")) == "slurm_read_missed"]


def test_reads_cut_short_fewer_than_the_limit_are_recorded_and_the_follow_goes_on(tmp_path):
    done = ok(_job_sh_answer(tmp_path, "COMPLETED"))
    answers = [CUT_SHORT] * (slurm_jobs.READ_MISSES - 1) + [done]
    conn, ex = _run_wait(tmp_path, answers)
    ex.apply()
    misses = _misses(ex)
    assert [m["attempt"] for m in misses] == list(range(1, slurm_jobs.READ_MISSES))
    assert all(m["job_id"] == "7" and m["role"] == "convert" for m in misses)
    assert len(conn.ran("sh", "-c", markers.JOB_SH)) == slurm_jobs.READ_MISSES


def test_a_good_read_resets_the_count(tmp_path):
    running, done = ok(_job_sh_answer(tmp_path, "RUNNING")), ok(_job_sh_answer(tmp_path, "COMPLETED"))
    n = slurm_jobs.READ_MISSES - 1
    conn, ex = _run_wait(tmp_path, [CUT_SHORT] * n + [running] + [CUT_SHORT] * n + [done])
    ex.apply()
    assert [m["attempt"] for m in _misses(ex)] == [*range(1, n + 1), *range(1, n + 1)]


def test_read_misses_in_a_row_end_the_follow_detached(tmp_path):
    conn, ex = _run_wait(tmp_path, [CUT_SHORT])         # every read cut short
    with pytest.raises(ConnectError) as err:
        ex.apply()
    assert "lost while reading Slurm job 7" in err.value.message and "keeps running" in (err.value.fix or "")
    assert len(conn.ran("sh", "-c", markers.JOB_SH)) == slurm_jobs.READ_MISSES
    assert [m["attempt"] for m in _misses(ex)] == list(range(1, slurm_jobs.READ_MISSES + 1))
    assert not conn.ran("scancel")      # the job itself is left alone

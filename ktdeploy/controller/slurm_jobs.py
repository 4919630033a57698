"""Slurm jobs through a connector to the login node: the cluster's nodes (sinfo), a job's state (scontrol, then
sacct), its log, and the executor's SUBMIT / FOLLOW_JOB / WAIT_JOB actions for ``up-slurm``. Parsing is
core/sched/slurm.py's."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Protocol

from ktdeploy.controller.connectors.base import Connector
from ktdeploy.controller.runs import RunRecord
from ktdeploy.core import events as ev
from ktdeploy.core import markers
from ktdeploy.core.errors import ConnectError, StepError
from ktdeploy.core.plan.params import FollowJobParams, SubmitAfterParams, SubmitParams, WaitJobParams
from ktdeploy.core.plan.steps import Plan, Stage, Step
from ktdeploy.core.safeio import write_file
from ktdeploy.core.sched import slurm as sl
from ktdeploy.core.sched.cluster import PROBE_SH, ClusterFacts, parse_probe
from ktdeploy.core.sched.slurm_plan import log_path
from ktdeploy.core.trainer_log import LogEntry, latest


class SlurmRun(Protocol):
    """What the slurm step handlers use of the executor that calls them (controller.executor.Executor)."""

    conn: Connector
    record: RunRecord
    plan: Plan
    emit: ev.Sink
    poll_s: float
    jobs: dict[str, str]
    submitted_at: dict[str, float]


def cluster_nodes(conn: Connector) -> list[sl.ClusterNode]:
    r = conn.run(sl.SINFO, timeout=60)
    if r.rc != 0:
        raise StepError(f"sinfo failed on {conn.name}: {(r.stderr or r.stdout).strip()[-300:] or f'exit {r.rc}'}",
                        step="preflight.cluster",
                        fix="Run ktdeploy up-slurm against a Slurm login node (sinfo, sbatch, scontrol on PATH).")
    return sl.parse_sinfo(r.stdout)


def cluster_facts(conn: Connector) -> ClusterFacts:
    """The login node's answer about the cluster's setup (core/sched/cluster.py): its config and runtimes."""
    r = conn.run(["sh", "-c", PROBE_SH], timeout=60)
    return parse_probe(r.stdout if r.rc == 0 else "")


def queued_jobs(conn: Connector, name: str) -> dict[str, str]:
    """role -> job id of the jobs of this name still queued or running (a second `up` follows them)."""
    out = {}
    for role, jname in (("train", name), ("convert", f"{name}-convert")):
        r = conn.run(sl.squeue_by_name(jname), timeout=60)
        if r.rc != 0:
            raise StepError(f"squeue failed on {conn.name}: {r.stderr.strip()[-300:]}", step="preflight.queue")
        live = [jid for jid, st in sl.parse_squeue(r.stdout) if st not in sl.TERMINAL]
        if live:
            out[role] = live[-1]
    return out


def job_state(conn: Connector, job_id: str, log: str = "/dev/null",
              timeout: float | None = None) -> tuple[sl.JobInfo | None, LogEntry | None]:
    """(JobInfo or None when no Slurm command knows the job, the trainer log's last entry)."""
    timeout = timeout or float(os.environ.get("KTDEPLOY_FOLLOW_TIMEOUT_S", 60))
    r = conn.run(["sh", "-c", markers.JOB_SH, "ktdeploy-job", job_id, log], timeout=timeout)
    blocks = markers.parse_job(r.stdout) if r.rc == 0 else None
    if blocks is None:
        raise ConnectError(f"connection to {conn.name} lost while reading Slurm job {job_id}",
                           fix="The job keeps running; re-run `ktdeploy up` (same arguments) to follow it.")
    return sl.job_from_blocks(blocks, job_id), latest(blocks["log"])


MAX_JOB_LOG = 8 << 20    # bytes of a job's log read from the login node (the end of it): logs, down's copy
# the job log on the shared output volume, which other users of the cluster may write to: read only when it is a
# regular file and not a link (a link to /dev/zero, or to a file of someone else's, is never followed), and only
# its last $2 bytes (then lines: $3, 0 for all of them)
JOB_LOG_SH = ('p=$1; if [ -f "$p" ] && [ ! -h "$p" ]; then '
              'if [ "$3" -gt 0 ]; then tail -c "$2" -- "$p" | tail -n "$3"; else tail -c "$2" -- "$p"; fi; '
              'else [ -e "$p" ] || [ -h "$p" ] || exit 0; echo "ktdeploy: $p is not a regular file (a link?): not read"; fi')


def job_log(conn: Connector, job_dir: str, role: str, job_id: str, tail: int | None = 200) -> str:
    """The end of a job's log (at most MAX_JOB_LOG bytes, ``tail`` lines when given); "" when there is none."""
    r = conn.run(["sh", "-c", JOB_LOG_SH, "ktdeploy-job-log", log_path(job_dir, role, job_id), str(MAX_JOB_LOG),
                  str(max(0, int(tail or 0)))], timeout=120)
    return r.stdout if r.rc == 0 else ""


# -- the executor's actions ---------------------------------------------------------------------------------
def do_submit(ex: SlurmRun, stage: Stage, s: Step) -> None:
    p = s.typed(SubmitParams)
    role = p.role
    argv = list(s.argv or ())
    after = p.after if isinstance(p, SubmitAfterParams) else None
    if after:
        dep = ex.jobs.get(after)
        if dep:
            argv = [*argv[:2], f"--dependency=afterok:{dep}", "--kill-on-invalid-dep=yes", *argv[2:]]
    ex.emit(ev.Said(ev.Mark.GO, s.title, stage.name))
    r = ex.conn.run(argv, timeout=s.timeout or 120)
    job_id = sl.parse_sbatch(r.stdout) if r.rc == 0 else None
    if job_id is None:
        tail = "\n".join((r.stderr.strip() or r.stdout.strip()).splitlines()[-10:])
        raise StepError(f"{stage.name}: sbatch refused the {role} job on {ex.plan.host} (exit {r.rc}):\n{tail}",
                        step=s.id, rc=r.rc, output=tail, fix=s.fix)
    ex.jobs[role] = job_id
    ex.submitted_at[role] = time.monotonic()
    ex.emit(ev.SlurmSubmitted(role=role, job_id=job_id, argv=tuple(argv)))
    ex.record.set_status("running", slurm_jobs=dict(ex.jobs))


def _known(ex: SlurmRun, p: FollowJobParams | WaitJobParams) -> str | None:
    role = p.role
    job_id = ex.jobs.get(role) or p.job_id
    if job_id:
        ex.jobs[role] = job_id
    return job_id


def _fetch_job_log(ex: SlurmRun, job_dir: str, role: str, job_id: str) -> str:
    text = job_log(ex.conn, job_dir, role, job_id, tail=None)
    write_file(ex.record.path / "artifacts", f"slurm-{role}-{job_id}.out", text, overwrite=True)
    return text


def _failed(ex: SlurmRun, stage: Stage, s: Step, info: sl.JobInfo, job_dir: str, role: str) -> StepError:
    lines = job_log(ex.conn, job_dir, role, info.job_id, tail=15).rstrip().splitlines()
    ex.emit(ev.SlurmJobFailed(role=role, job=info, last_lines=tuple(lines)))
    ex.record.set_status("crashed", exit_code=info.exit_code)
    what = f"Slurm {info.describe()}"
    if lines:
        what += "\n  last log lines:\n    " + "\n    ".join(lines)
    return StepError(f"{stage.name}: {what}", step=s.id, rc=info.exit_code,
                     fix=f"See the job's log ({log_path(job_dir, role, info.job_id)}); fix the cause, then "
                         "ktdeploy up-slurm (same arguments): the job resumes from its newest complete checkpoint.")


READ_MISSES = 3   # job reads in a row that may fail before a follow stops (detached: the job keeps running)


def _poll(ex: SlurmRun, stage: Stage, s: Step, p: FollowJobParams | WaitJobParams, log: str,
          on_entry: Callable[[LogEntry | None, sl.JobInfo], None] | None = None) -> sl.JobInfo:
    role = p.role
    job_id = _known(ex, p)
    if job_id is None:
        raise StepError(f"{stage.name}: no {role} job was submitted", step=s.id, fix="a plan bug; report it")
    started = None
    last_state = None
    misses = 0
    while True:
        try:
            info, entry = job_state(ex.conn, job_id, log)
        except ConnectError as e:
            # one read cut short (an SSH hiccup, a slow scontrol on a busy login node) is not a lost job: the
            # follow goes on at its next poll; only READ_MISSES in a row end it (the job keeps running then)
            misses += 1
            ex.emit(ev.SlurmReadMissed(role=role, job_id=job_id, attempt=misses, error=str(e)))
            if misses >= READ_MISSES:
                raise
            time.sleep(ex.poll_s)
            continue
        misses = 0
        if info is None:
            raise StepError(f"{stage.name}: Slurm no longer knows job {job_id} (neither scontrol nor sacct)",
                            step=s.id, fix="See the job's log in the job folder; re-run ktdeploy up-slurm.")
        if info.state != last_state:
            last_state = info.state
            ex.emit(ev.SlurmJobState(role=role, job=info))
            if info.state == "RUNNING" and started is None:
                started = time.monotonic()
                since = ex.submitted_at.get(role)
                ex.emit(ev.SlurmStarted(role=role, job_id=job_id, nodes=info.nodes,
                                        seconds_after_submit=round(started - since, 3) if since else None))
        if on_entry is not None:
            on_entry(entry, info)
        if info.finished:
            return info
        time.sleep(ex.poll_s)


def do_follow_job(ex: SlurmRun, stage: Stage, s: Step) -> None:
    p = s.typed(FollowJobParams)
    role, log, job_dir = p.role, p.log, p.job_dir
    ex.record.set_status("training", stage=stage.name)
    seen: dict[str, int | None] = {"step": None}

    def on_entry(entry: LogEntry | None, info: sl.JobInfo) -> None:
        if entry is not None and entry.current_steps != seen["step"]:
            seen["step"] = entry.current_steps
            ex.emit(ev.Progress(entry=entry))
            ex.record.set_status("training", progress=entry.to_json())

    info = _poll(ex, stage, s, p, log, on_entry)
    _fetch_job_log(ex, job_dir, role, info.job_id)
    ex.emit(ev.SlurmTrainExited(job=info))
    if not info.succeeded:
        raise _failed(ex, stage, s, info, job_dir, role)
    ex.emit(ev.Said(ev.Mark.OK, f"training job {info.job_id} finished on {info.nodes}"))


def do_wait_job(ex: SlurmRun, stage: Stage, s: Step) -> None:
    p = s.typed(WaitJobParams)
    role, job_dir = p.role, p.job_dir
    ex.emit(ev.Said(ev.Mark.GO, f"waiting for the {role} job", stage.name))
    info = _poll(ex, stage, s, p, "/dev/null")
    _fetch_job_log(ex, job_dir, role, info.job_id)
    if not info.succeeded:
        raise _failed(ex, stage, s, info, job_dir, role)
    ex.emit(ev.Said(ev.Mark.OK, f"{s.title} (job {info.job_id})", stage.name))

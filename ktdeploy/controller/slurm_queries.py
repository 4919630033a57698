"""status / logs / down of an ``up-slurm`` run, through Slurm on the login node: the run record holds the job
ids (status.json ``slurm_jobs``); state from scontrol/sacct, progress from the trainer log on the shared output
volume, the job's log file, ``scancel`` (the batch script's trap stops the job's container)."""

from __future__ import annotations

import time
from collections.abc import Callable

from ktdeploy.controller.connectors.base import Connector
from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.runs import RunRecord
from ktdeploy.controller.slurm_jobs import job_log, job_state
from ktdeploy.core import run_record as rr
from ktdeploy.core.errors import RunRecordError, StepError
from ktdeploy.core.events import SlurmJobStopped
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.safeio import redact, write_file
from ktdeploy.core.sched.slurm_plan import log_path

ROLES = ("train", "convert")
DOWN_WAIT_S = 90      # scancel -> the job ended (its trap stopped the container): bounded


def is_slurm(st: rr.RunStatus) -> bool:
    return st.get("scheduler") == "slurm"


def recorded_jobs(rec: RunRecord, st: rr.RunStatus) -> dict[str, str]:
    jobs = st.get("slurm_jobs") or {}
    if not isinstance(jobs, dict) or not all(isinstance(v, str) and v.isdigit() for v in jobs.values()):
        raise RunRecordError(f"run record {rec.id}: slurm_jobs is not a map of job ids",
                             fix=f"Inspect or remove {rec.path}.")
    return {k: v for k, v in jobs.items() if k in ROLES}


def status(conn: Connector, rec: RunRecord, st: rr.RunStatus) -> rr.LiveStatus:
    jobs = recorded_jobs(rec, st)
    log = JobLayout(rec.status_text('output_dir', st)).trainer_log
    live: rr.LiveStatus = {"jobs": {}}
    for role, job_id in jobs.items():
        info, entry = job_state(conn, job_id, log if role == "train" else "/dev/null")
        live["jobs"][role] = info.__dict__ | {"describe": info.describe()} if info else {"job_id": job_id,
                                                                                          "state": "unknown"}
        if role == "train":
            live["progress"] = entry.to_json() if entry else None
    return live


def logs(conn: Connector, rec: RunRecord, st: rr.RunStatus, *, follow: bool, tail: int, write: Callable[[str], None],
         poll_s: float, role: str = "train") -> None:
    """A job's log file (``role``: train or convert; appended by every run of a requeued job); -f until the job
    ends."""
    jobs = recorded_jobs(rec, st)
    job_id = jobs.get(role)
    if not job_id:
        if role != "train":
            raise StepError(f"run {rec.id} submitted no {role} job (yet), so it has no {role} log",
                            fix=f"Where it stands: ktdeploy status --run {rec.id}")
        raise StepError(f"run record {rec.id} holds no training job id", fix="ktdeploy up-slurm submits one.")
    job_dir = rec.status_text("job_dir", st)
    shown = 0
    first = True
    while True:
        info, _ = job_state(conn, job_id)
        text = job_log(conn, job_dir, role, job_id, tail=None)
        lines = text.splitlines()
        new = lines[max(shown, len(lines) - tail) if first else shown:]
        for line in new:
            write(line)
        shown, first = len(lines), False
        if not follow or info is None or info.finished:
            return
        time.sleep(poll_s)


def down(conn: Connector, rec: RunRecord, st: rr.RunStatus) -> dict[str, str]:
    """scancel every recorded job that has not ended, wait (bounded) until Slurm says it ended, keep its log."""
    jobs = recorded_jobs(rec, st)
    job_dir = rec.status_text("job_dir", st)
    done = {}
    for role in reversed(ROLES):
        job_id = jobs.get(role)
        if not job_id:
            continue
        info, _ = job_state(conn, job_id)
        if info is None or info.finished:
            done[f"{role} job {job_id}"] = info.state.lower() if info else "gone"
            continue
        r = conn.run(["scancel", "--", job_id], timeout=60)
        if r.rc != 0:
            raise StepError(f"scancel {job_id} failed on {conn.name}: {(r.stderr or r.stdout).strip()[-300:]}",
                            fix="Cancel it by hand (scancel JOBID) and check `squeue`.")
        deadline = time.monotonic() + DOWN_WAIT_S
        while info is not None and not info.finished:
            if time.monotonic() > deadline:
                raise StepError(f"job {job_id} did not end within {DOWN_WAIT_S} s of scancel ({info.describe()})",
                                fix="Check the node (`scontrol show job JOBID`); its container is named "
                                    f"{rec.status_text('container', st)}-j{job_id}.")
            time.sleep(1)
            info, _ = job_state(conn, job_id)
        write_file(rec.path / rr.ARTIFACTS, f"slurm-{role}-{job_id}.out",
                   redact(job_log(conn, job_dir, role, job_id, tail=None)), overwrite=True)
        done[f"{role} job {job_id}"] = "cancelled"
        Emitter(rec).emit(SlurmJobStopped(slurm_job=job_id, role=role, log=log_path(job_dir, role, job_id)))
    return done

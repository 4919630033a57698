"""`ktdeploy status`, `logs` and `down` of a recorded run: the record, then the host (or, for an `up-slurm` run,
the cluster: controller/slurm_queries.py) it names."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from ktdeploy.controller import slurm_queries
from ktdeploy.controller.connectors import Connector, connect
from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.executor import container_logs, snapshot
from ktdeploy.controller.runs import RunRecord, job_lock, latest_run, lock_key
from ktdeploy.core import events as ev
from ktdeploy.core import run_record as rr
from ktdeploy.core import run_summary
from ktdeploy.core.command_requests import SshOptions
from ktdeploy.core.errors import ConnectError, KtdeployError, RunRecordError, StepError, UsageError
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.host_target import parse_host
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.plan import docker_argv as dk
from ktdeploy.core.plan.state import ContainerState
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.safeio import NAME, printable, read_text, redact, write_file

NO_SSH = SshOptions()


def host_filter(host: str | None) -> str | None:
    """--host of status/logs/down: the runs recorded for it (as `up` recorded it: its password dropped); a value
    that is no host is a usage error."""
    if host is None:
        return None
    return parse_host(host).redacted


def _connect_for(rec: RunRecord, st: rr.RunStatus, ssh: SshOptions) -> Connector:
    host = rec.status_text("host", st, empty_ok=True)  # "" is this machine, as for `up`
    try:
        target = parse_host(host)
    except UsageError as e:
        raise RunRecordError(f"run record {rec.id}: {e.message}",
                             fix=f"Inspect or remove {rec.path}; `ktdeploy status --all` lists the others.") from None
    return connect(target, **ssh.connect_kwargs())


def _container(rec: RunRecord, st: rr.RunStatus, key: str = "container") -> str:
    name = rec.status_text(key, st)
    if not NAME.match(name):
        raise RunRecordError(f"run record {rec.id}: {key} {printable(name)} is not a container name",
                             fix=f"Inspect or remove {rec.path}.")
    return name


def status(host: str | None = None, run_id: str | None = None, *, ssh: SshOptions = NO_SSH,
           live: bool = True) -> rr.RunStatus:
    rec = latest_run(host_filter(host), run_id=run_id)
    st = rec.status().copy()
    st["record"] = str(rec.path)
    if not st.get("lock"):   # a record of an older ktdeploy: the key its job's lock has now
        with contextlib.suppress(KtdeployError):
            st["lock"] = lock_key(rec.status_text("host", st, empty_ok=True), _container(rec, st))
    if not live:
        return st
    seen: rr.LiveStatus
    try:
        seen = _slurm_live(rec, st, ssh) if slurm_queries.is_slurm(st) else _host_live(rec, st, ssh)
    except ConnectError as e:
        seen = {"error": e.message}
    st.update(rec.status())   # what the look at the host recorded (a crash nobody followed) shows at once
    st["live"] = seen
    return st


def _slurm_live(rec: RunRecord, st: rr.RunStatus, ssh: SshOptions) -> rr.LiveStatus:
    conn = _connect_for(rec, st, ssh)
    try:
        return slurm_queries.status(conn, rec, st)
    finally:
        conn.close()


def _host_live(rec: RunRecord, st: rr.RunStatus, ssh: SshOptions) -> rr.LiveStatus:
    job, serve_job, log = _container(rec, st), _container(rec, st, "serve_container"), rec.status_text("output_dir", st)
    conn = _connect_for(rec, st, ssh)
    try:
        snap = snapshot(conn, job, JobLayout(log).trainer_log)
        serve = snapshot(conn, serve_job, "/dev/null").state
        if snap.state is not None and snap.state.failed and st.get("state") in UNFOLLOWED:
            _record_crash(conn, rec, st, job, snap.state)
    finally:
        conn.close()
    return {"container": snap.state.__dict__ if snap.state else None,
            "progress": snap.entry.to_json() if snap.entry else None,
            "serve": serve.__dict__ if serve else None}


# the recorded states in which nobody followed the training to its end (a detached `up`, a controller that was
# killed while following): a crash found there is recorded by `status`, as FOLLOW would have
UNFOLLOWED = ("detached", "training", "running")


def _record_crash(conn: Connector, rec: RunRecord, st: rr.RunStatus, job: str, state: ContainerState) -> None:
    """The training container of an unfollowed run stopped with an error: its whole log kept in the record, and
    the record says what up's FOLLOW would have said — the trainer's own last exception, the log's path, the
    container's exit, and the one restart (the same `up` with --resume auto, spelled out)."""
    from ktdeploy.controller.executor import exit_advice, flat_lines
    from ktdeploy.core.trainer_exception import last_exception

    text = redact(container_logs(conn, job, tail=None))
    log = write_file(rec.path / rr.ARTIFACTS, rr.TRAIN_LOG, text, overwrite=True)
    exc = last_exception(text[-(4 << 20):])
    lines = flat_lines(text.rstrip().splitlines()[-15:])
    how = f"container {job} {state.describe()}"
    lead = f"the trainer crashed: {exc.line()}" if exc is not None else \
        f"the training container stopped ({state.describe()}; no exception in its log)"
    recipe, facts = _recorded_inputs(rec)
    fix = exit_advice(state, recipe, facts, lines, command=run_summary.rerun_command(st, resume=True),
                      trainer_error=exc.line() if exc is not None else None)
    rec.set_status("crashed", failed_stage=st.get("stage") or "TRAIN",
                   error=f"{lead}; full log: {log}\n{how}", error_type="StepError", fix=fix,
                   exit_code=state.exit_code, oom_killed=state.oom_killed, found_by="status")


def _recorded_inputs(rec: RunRecord) -> tuple[Recipe | None, HostFacts | None]:
    """The recipe and facts the run recorded (for an OOM's planner advice); None where the record lacks them."""
    recipe = facts = None
    with contextlib.suppress(KtdeployError, OSError, ValueError):
        from ktdeploy.core.recipe import load_recipe

        recipe = load_recipe(rec.path / rr.RECIPE)
    with contextlib.suppress(KtdeployError, OSError, ValueError):
        facts = HostFacts.model_validate(rec.read_json(rr.FACTS))
    return recipe, facts


LOG_STAGES = {"train": "TRAIN", "convert": "CONVERT", "serve": "SERVE"}   # `logs --stage`: its value -> the stage
_WHOSE = {"TRAIN": "training", "CONVERT": "conversion", "SERVE": "serving"}


def logs(host: str | None = None, run_id: str | None = None, *, stage: str = "train", follow: bool = False,
         tail: int = 100, ssh: SshOptions = NO_SSH, write: Callable[[str], None] = print,
         say: Callable[[str], None] = print, poll_s: float = 2.0) -> None:
    """The log of a run's stage: its container's (docker logs, -f until it exits), else the copy the run record
    keeps (a one-shot container, or one `down` removed). ``say``: what is said about the log, not the log itself
    (a stage that never started, a copy read from the record)."""
    if stage not in LOG_STAGES:
        from ktdeploy.core.recipe.catalog import did_you_mean

        near = did_you_mean(stage, LOG_STAGES)
        raise UsageError(f"{printable(stage)} is not a stage with a log"
                         + (f" (did you mean {near}?)" if near else ""), key="--stage",
                         fix=f"one of {', '.join(LOG_STAGES)}: ktdeploy logs --stage {near or 'convert'}")
    rec = latest_run(host_filter(host), run_id=run_id)
    st = rec.status()
    if slurm_queries.is_slurm(st):
        if stage not in slurm_queries.ROLES:
            raise UsageError(f"run {rec.id} is an up-slurm run: it has no {stage} container", key="--stage",
                             fix=f"its jobs' logs: ktdeploy logs --run {rec.id} --stage train (or convert)")
        conn = _connect_for(rec, st, ssh)
        try:
            slurm_queries.logs(conn, rec, st, role=stage, follow=follow, tail=tail, write=write, poll_s=poll_s)
        finally:
            conn.close()
        return
    untouched = _never_started(rec, st, LOG_STAGES[stage])
    if untouched:
        say(untouched)
        return
    names = _stage_containers(rec, st, stage)
    conn = _connect_for(rec, st, ssh)
    try:
        name = next((n for n in names if conn.run(dk.exists_probe(n), timeout=60).rc == 0), None)
        if name is not None:
            _container_log(conn, name, follow=follow, tail=tail, write=write, poll_s=poll_s)
            return
        where = conn.name
    finally:
        conn.close()
    kept = _kept_logs(rec, names, stage)
    if not kept:
        raise StepError(f"{names[0]} is no longer on {where} and run {rec.id}'s record keeps no copy of its log",
                        fix=f"Removed outside ktdeploy (docker rm)? What the record has: ktdeploy status --run {rec.id}")
    for path in kept:
        say(f"{names[0]} is no longer on {where}: its log as run {rec.id}'s record keeps it ({path})")
        for line in read_text(path, 64 << 20, path.name).splitlines()[-tail:] if tail else []:
            write(line)


def _stage_containers(rec: RunRecord, st: rr.RunStatus, stage: str) -> list[str]:
    job = _container(rec, st)
    if stage == "serve":
        return [_container(rec, st, "serve_container")]
    return [f"{job}-convert", f"{job}-merge"] if stage == "convert" else [job]


def _kept_logs(rec: RunRecord, names: list[str], stage: str) -> list[Path]:
    """The copies of a gone container's log the record keeps: the executor's of a one-shot container's output
    (convert, merge), else `down`'s of the container it removed, else FOLLOW's of the training log."""
    art = rec.path / rr.ARTIFACTS
    if stage == "convert":
        return [p for p in (art / rr.STEP_LOGS["convert.adapter"], art / rr.STEP_LOGS["convert.merge"]) if p.is_file()]
    found = [p for p in (art / f"{names[0]}.log", art / rr.TRAIN_LOG if stage == "train" else None)
             if p is not None and p.is_file()]
    return found[:1]


def _never_started(rec: RunRecord, st: rr.RunStatus, stage: str) -> str | None:
    """Why ``stage`` has no container in this run, when it never started (from the record's events): the run
    stopped or failed before it, skipped it, is a dry run, or has not reached it yet; None when it started (or the
    record is too old to say)."""
    if st.get("dry_run") or st.get("state") == "dry-run":
        return f"run {rec.id} is a dry run: it started nothing on the host, so {stage} has no log."
    events = rec.events()
    if not events:
        return None
    if any(e.get("event") == "stage_start" and e.get("stage") == stage for e in events):
        return None
    skipped = next((e for e in events if e.get("event") == "stage_skipped" and e.get("stage") == stage), None)
    if skipped is not None:
        return (f"run {rec.id} skipped {stage} ({skipped.get('reason')}), so it has no log in this run; the "
                f"`ktdeploy up` that goes on with it (the same command, without --detach) runs {stage}.")
    state, at = st.get("state") or "?", st.get("failed_stage") or st.get("stage") or "PREFLIGHT"
    if state in ("planned", "running", "training"):
        return f"run {rec.id} is in {at}; {stage} has not started yet, so it has no log. Its progress: ktdeploy status"
    return (f"{stage} never started in run {rec.id}: the run ended in {at} ({state}) before any {_WHOSE[stage]} "
            f"container was created, so there is no log to show. Why it stopped: ktdeploy status --run {rec.id}")


def _container_log(conn: Connector, name: str, *, follow: bool, tail: int, write: Callable[[str], None],
                   poll_s: float) -> None:
    r = conn.run(dk.logs(name, tail=tail, timestamps=True), timeout=120)
    if r.rc != 0:
        raise StepError(f"no logs for {name} on {conn.name}: {r.stderr.strip()[-300:]}",
                        fix=f"See whether it is there: ktdeploy status; docker ps -a --filter name={name} on the host.")
    last = _emit(r.stdout + r.stderr, None, write)
    while follow:
        snap = snapshot(conn, name, "/dev/null")
        r = conn.run(dk.logs(name, timestamps=True, since=last), timeout=120)
        last = _emit(r.stdout + r.stderr, last, write) or last
        if snap.state is None or not snap.state.running:
            break
        time.sleep(poll_s)


def _emit(text: str, after: str | None, write: Callable[[str], None]) -> str | None:
    """Write docker log lines (RFC3339Nano timestamp first) newer than ``after``; return the newest timestamp."""
    newest = after
    for line in sorted(text.splitlines()):
        ts, _, msg = line.partition(" ")
        if after and ts <= after:
            continue
        write(msg)
        newest = ts
    return newest


def down(host: str | None = None, run_id: str | None = None, *, ssh: SshOptions = NO_SSH) -> dict[str, str]:
    """Stop and remove the job's containers (training and serving); the output dir and checkpoints stay.
    Holds the job's lock: while an `up` of the job runs, `down` is refused (it would race the containers up
    creates); stop that `up` first (Ctrl-C detaches it), then run down."""
    rec = latest_run(host_filter(host), run_id=run_id)
    st = rec.status()
    if slurm_queries.is_slurm(st):
        conn = _connect_for(rec, st, ssh)
        try:
            done = slurm_queries.down(conn, rec, st)
        finally:
            conn.close()
        rec.set_status("stopped", down=done)
        return done
    names = [_container(rec, st, key) for key in ("serve_container", "container") if st.get(key)]
    with job_lock(rec.status_text("host", st, empty_ok=True), _container(rec, st)):
        return _down_locked(rec, st, names, ssh)


def _down_locked(rec: RunRecord, st: rr.RunStatus, names: list[str], ssh: SshOptions) -> dict[str, str]:
    conn = _connect_for(rec, st, ssh)
    done = {}
    try:
        for name in names:
            if conn.run(dk.exists_probe(name), timeout=60).rc != 0:
                done[name] = "absent"
                continue
            # the container's last words, kept in the record (never through a link, never outside artifacts/)
            write_file(rec.path / rr.ARTIFACTS, f"{name}.log", redact(container_logs(conn, name, tail=None)),
                       overwrite=True)
            conn.run(dk.stop(name), timeout=120)
            r = conn.run(dk.remove(name), timeout=120)
            if r.rc != 0:
                raise StepError(f"could not remove {name}: {r.stderr.strip()[-300:]}")
            done[name] = "removed"
            Emitter(rec).emit(ev.ContainerRemoved(container=name))
    finally:
        conn.close()
    # down stops a job; it never rewrites how a run ended (a failed or crashed run keeps its stage, error and fix)
    state = st.get("state")
    keep = isinstance(state, str) and state in ("failed", "crashed", "finished", "dry-run")
    rec.set_status(state if keep and isinstance(state, str) else "stopped", down=done, down_at=time.time())
    return done

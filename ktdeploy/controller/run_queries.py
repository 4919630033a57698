"""`ktdeploy status`, `logs` and `down` of a recorded run: the record, then the host (or, for an `up-slurm` run,
the cluster: controller/slurm_queries.py) it names."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from ktdeploy.controller import slurm_queries
from ktdeploy.controller.connectors import Connector, connect
from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.executor import container_logs, snapshot
from ktdeploy.controller.runs import RunRecord, job_lock, latest_run, lock_key
from ktdeploy.core import events as ev
from ktdeploy.core import run_record as rr
from ktdeploy.core.command_requests import SshOptions
from ktdeploy.core.errors import ConnectError, KtdeployError, RunRecordError, StepError, UsageError
from ktdeploy.core.host_target import parse_host
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.plan import docker_argv as dk
from ktdeploy.core.safeio import NAME, printable, redact, write_file

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
    try:
        st["live"] = _slurm_live(rec, st, ssh) if slurm_queries.is_slurm(st) else _host_live(rec, st, ssh)
    except ConnectError as e:
        st["live"] = {"error": e.message}
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
    finally:
        conn.close()
    return {"container": snap.state.__dict__ if snap.state else None,
            "progress": snap.entry.to_json() if snap.entry else None,
            "serve": serve.__dict__ if serve else None}


def logs(host: str | None = None, run_id: str | None = None, *, follow: bool = False, tail: int = 100,
         ssh: SshOptions = NO_SSH, write: Callable[[str], None] = print, poll_s: float = 2.0) -> None:
    rec = latest_run(host_filter(host), run_id=run_id)
    st = rec.status()
    if slurm_queries.is_slurm(st):
        conn = _connect_for(rec, st, ssh)
        try:
            slurm_queries.logs(conn, rec, st, follow=follow, tail=tail, write=write, poll_s=poll_s)
        finally:
            conn.close()
        return
    name = _container(rec, st)
    conn = _connect_for(rec, st, ssh)
    try:
        _container_log(conn, name, follow=follow, tail=tail, write=write, poll_s=poll_s)
    finally:
        conn.close()


def _container_log(conn: Connector, name: str, *, follow: bool, tail: int, write: Callable[[str], None],
                   poll_s: float) -> None:
    r = conn.run(dk.logs(name, tail=tail, timestamps=True), timeout=120)
    if r.rc != 0:
        raise StepError(f"no logs for {name} on {conn.name}: {r.stderr.strip()[-300:]}",
                        fix="The container was removed (ktdeploy down?) — its log is in the run record's artifacts/.")
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

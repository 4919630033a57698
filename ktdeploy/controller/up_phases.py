"""The phases `up` and `up-slurm` share: connect (or plan from recorded facts), read the job's state on the host,
apply the plan (controller/executor.py) and say how the run ended — Ctrl-C detaches (training keeps running), a
SIGTERM of `up-slurm` takes back the jobs it submitted, a lost connection is exit 3."""

from __future__ import annotations

from ktdeploy.controller.connectors import Connector, connect
from ktdeploy.controller.doctor import DoctorReport
from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.executor import Executor
from ktdeploy.controller.up_record import UpResult, fail
from ktdeploy.core import events as ev
from ktdeploy.core.command_requests import SshOptions
from ktdeploy.core.errors import CheckFailed, ConnectError, KtdeployError, RecipeError, StepError, Terminated
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.plan import job_name, output_dir_of, parse_state
from ktdeploy.core.plan.state import STATE_SCRIPT, JobState
from ktdeploy.core.plan.steps import Plan, StageName
from ktdeploy.core.recipe.document import Recipe


def connect_phase(host: str, events: Emitter, facts_file: str | None, connector: Connector | None,
                  ssh: SshOptions) -> tuple[Connector | None, str]:
    """(connector or None, where): None when planning from the facts recorded in ``facts_file`` (a plan before the
    host exists)."""
    events.emit(ev.ConnectStarted(host=host))
    if facts_file is not None:
        events.emit(ev.PlanningFromFacts(path=str(facts_file), host=host))
        return None, f"{host} (facts recorded in {facts_file})"
    try:
        conn = connector if connector is not None else connect(host, **ssh.connect_kwargs())
    except ConnectError as e:
        raise fail(events, "failed", e, stage=StageName.PREFLIGHT) from None
    events.emit(ev.Connected(connector=conn.name))
    return conn, conn.name


def gather_job_state(conn: Connector, recipe: Recipe, image: str) -> JobState:
    name = job_name(recipe)
    out = output_dir_of(recipe)
    r = conn.run(["sh", "-c", STATE_SCRIPT, "ktdeploy-state", name, f"{name}-serve", image, out,
                  JobLayout(out).adapter_dir], timeout=120)
    if r.rc != 0 and not r.stdout:
        raise StepError(f"could not read the job state on {conn.name}: {r.stderr.strip()[-300:]}", step="preflight.state")
    return parse_state(r.stdout)


def apply_phase(conn: Connector, plan: Plan, recipe: Recipe, report: DoctorReport | None, result: UpResult,
                events: Emitter, *, host: str, detach: bool) -> UpResult:
    """Run the plan on the host; Ctrl-C detaches (training keeps running), a lost connection is exit 3."""
    record = result.record
    for note in plan.notes:   # what --resume found: said before anything starts, and kept in the record
        if note.startswith("--resume"):
            events.emit(ev.ResumeNote(note=note))
    executor = Executor(conn, events, plan, recipe=recipe, facts=report.facts if report is not None else None)
    try:
        executor.apply()
    except KeyboardInterrupt as stop:
        return _stopped(stop, conn, events, executor, result, host=host)
    except ConnectError as e:
        if "keeps running" not in (e.fix or ""):
            e.fix = (e.fix or "") + " Training (if started) keeps running on the host; re-run `ktdeploy up` " \
                                    "(same arguments) to follow it."
        e.fix = (e.fix or "") + f" See it now: `ktdeploy status --host {host}`."
        raise fail(events, "detached", e) from None
    except (CheckFailed, RecipeError) as e:
        # IMAGE's image.check: doctor in the image failed (exit 1, like PREFLIGHT's), or the stack in the image
        # refuses the recipe (exit 2)
        raise fail(events, "failed", e) from None
    except StepError as e:
        cur = record.status().get("state")
        raise fail(events, "crashed" if cur == "crashed" else "failed", e) from None
    except KtdeployError as e:   # any other refusal: recorded with its own exit code
        raise fail(events, "failed", e) from None
    except Exception as e:
        # a bug in ktdeploy (exit 70): the record must not keep saying "training" for good
        record.set_status("failed", error=f"{type(e).__name__}: {e}"[:300], error_type=type(e).__name__,
                          exit_code=70, note=f"ktdeploy itself failed (a bug); training, if it started, keeps "
                                             f"running on the host: ktdeploy status --host {host}")
        raise
    if detach:
        record.set_status("detached", note="--detach: training runs on the host")
        result.state = "detached"
        events.emit(ev.Said(ev.Mark.STARTED, f"Follow it: ktdeploy status --host {host}; ktdeploy logs -f --host {host}",
                            lead=f"Training started in {plan.job} on {host}."))
    else:
        record.set_status("finished")
        result.state = "finished"
        events.emit(ev.Said(ev.Mark.DONE, f"adapter {plan.adapter_dir}; run record {record.path}; next: "
                                          f"{next_step(plan, record.id)}", lead="done:"))
    return result


def next_step(plan: Plan, run_id: str) -> str:
    """What to run after a finished `up`: talk to the served model and score it; without a server, its status."""
    if any(st.name == StageName.SERVE and not st.skipped for st in plan.stages):
        return f"ktdeploy chat {run_id} (talk to it), ktdeploy eval {run_id} (base vs tuned)"
    return f"ktdeploy status --run {run_id}"


def _stopped(stop: KeyboardInterrupt, conn: Connector, events: Emitter, executor: Executor, result: UpResult, *,
             host: str) -> UpResult:
    """Ctrl-C while the plan runs: detached, training keeps running; SIGTERM: the same, exit 143 (`up-slurm`: the
    jobs this run submitted are cancelled first)."""
    terminated = isinstance(stop, Terminated)
    how = "terminated (SIGTERM)" if terminated else "interrupted (Ctrl-C)"
    if terminated and executor.submitted_at:
        cancel_submitted(conn, events, executor)   # up-slurm: a terminated submitter takes its jobs back
        raise stop
    if executor.jobs:
        result.record.set_status("detached", slurm_jobs=dict(executor.jobs))
    events.emit(ev.Detached(reason=how, job=executor.plan.job, host=host, terminated=terminated))
    result.record.set_status("detached", note=f"controller {how}; training keeps running on the host")
    if terminated:
        raise stop   # exit 143: the record already says what happened
    result.state = "detached"
    result.interrupted = True
    return result


def cancel_submitted(conn: Connector, events: Emitter, executor: Executor) -> None:
    """SIGTERM during ``up-slurm``: scancel the jobs this run submitted (not ones an earlier run left queued) —
    their batch scripts' traps stop the containers — and say so in the record: "stopped"; exit 143."""
    import signal

    ids = {role: executor.jobs[role] for role in executor.submitted_at if role in executor.jobs}
    old = signal.signal(signal.SIGTERM, signal.SIG_IGN) if threading_main() else None
    try:
        done = {}
        for role, job_id in ids.items():
            try:
                r = conn.run(["scancel", "--", job_id], timeout=60)
                done[f"{role} job {job_id}"] = "cancelled" if r.rc == 0 else f"scancel exit {r.rc}"
            except ConnectError as e:
                done[f"{role} job {job_id}"] = f"not cancelled ({e.message})"
        events.emit(ev.Cancelled(reason="terminated (SIGTERM)", jobs=done))
        events.record.set_status("stopped", slurm_jobs=dict(executor.jobs), down=done,
                                 note="controller terminated (SIGTERM): the jobs it submitted were cancelled "
                                      "(scancel)")
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()

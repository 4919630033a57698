"""`ktdeploy up` on a host: ``up(UpRequest)`` runs the phases in order — arguments -> lock -> record -> connect
(or recorded facts) -> sync -> facts + doctor -> plan (pure) -> apply (executor). Every run keeps a record folder
on the controller (controller/runs.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ktdeploy.controller.connectors import Connector, LocalConnector
from ktdeploy.controller.doctor import DoctorReport, run_checks
from ktdeploy.controller.doctor import doctor as run_doctor
from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.runs import RunRecord, job_lock, output_lock
from ktdeploy.controller.up_inputs import (
    check_api_key,
    check_image_tar,
    check_run_name,
    check_up_arguments,
    load_facts_file,
    load_up_recipe,
)
from ktdeploy.controller.up_phases import apply_phase, connect_phase, gather_job_state
from ktdeploy.controller.up_record import UpResult, fail, interrupted, new_record
from ktdeploy.core import events as ev
from ktdeploy.core import run_record as rr
from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.checks.gate import RUNTIME_FIXABLE, gate, profile_hint, with_profile
from ktdeploy.core.checks.threads import derived_kt_threads
from ktdeploy.core.command_requests import UpRequest
from ktdeploy.core.errors import CheckFailed, KtdeployError, UsageError
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.host_target import parse_host
from ktdeploy.core.plan import UpOptions, build_plan, job_name, output_dir_of, plan_text, resolve_image
from ktdeploy.core.plan.host_plan import shipped_recipe
from ktdeploy.core.plan.state import JobState
from ktdeploy.core.plan.steps import Plan, StageName
from ktdeploy.core.recipe import render as render_recipe
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.recipe.render import dump_yaml
from ktdeploy.core.safeio import printable


@dataclass(frozen=True)
class _HostRun:
    """One `up`: its request, the recipe it loaded, the host as recorded (no password), the waivers (the
    --cpu-only profile's included) and the facts it plans from when --facts was given."""

    req: UpRequest
    recipe: Recipe
    host: str
    waive: tuple[str, ...]
    recorded_facts: HostFacts | None


def up(request: UpRequest, *, on_event: ev.Sink | None = None, connector: Connector | None = None) -> UpResult:
    """``on_event``: what the run tells (core/events.py; each is in the run record too), e.g. the CLI's renderer;
    none shown by default. ``connector``: an already open Connector to use instead of connecting to the request's
    host (tests: FakeConnector)."""
    target = parse_host(request.host)  # a --host that is none of the forms is a usage error, before anything is recorded
    host = target.redacted             # a password in ssh://user:PW@host is never used, shown or recorded
    check_up_arguments(host, request.resume, request.dry_run, request.facts_file)
    recorded_facts = load_facts_file(request.facts_file) if request.facts_file is not None else None
    recipe = load_up_recipe(request.recipe, request.overrides, request.native)
    check_api_key(recipe, detach=request.detach, dry_run=request.dry_run)
    if request.image_tar:
        check_image_tar(request.image_tar, recipe)
    if request.name is not None:
        check_run_name(request.name, host, job_name(recipe))
    run = _HostRun(request, recipe, host, with_profile(request.waive, request.cpu_only), recorded_facts)
    # one run, one lock (not for a dry run: it changes nothing): a second `up` of this job is refused here,
    # before it records or touches anything
    with contextlib.nullcontext() if request.dry_run else job_lock(host, job_name(recipe)):
        return _up_locked(run, on_event, connector)


def _up_locked(run: _HostRun, on_event: ev.Sink | None, connector: Connector | None) -> UpResult:
    events: Emitter | None = None
    conn = None
    held = contextlib.ExitStack()
    try:
        events = new_record(run.recipe, run.host, run.req, run.waive, on_event)
        conn, where = connect_phase(run.host, events, run.req.facts_file, connector, run.req.ssh)
        if conn is not None and not run.req.dry_run:
            held.enter_context(output_lock(conn, run.host, output_dir_of(run.recipe)))
        _sync_phase(conn, run, events)
        report, blocking, doc_line = _doctor_phase(conn, run, where, events)
        if run.req.cpu_only and report.facts.gpu.count:
            raise fail(events, "failed", UsageError(
                f"--cpu-only is for a host without a GPU; {where} has {report.facts.gpu.count} GPU(s)", key="--cpu-only",
                fix="Drop --cpu-only: on a GPU host the containers get their GPUs and every GPU check gates."),
                stage=StageName.PREFLIGHT)
        preflight = {"connect": f"connected ({where})" if conn is not None else
                     f"not connected: facts recorded in {run.req.facts_file}", "doctor": doc_line}
        result = UpResult(record=events.record, waived=list(run.waive))
        result.plan = plan = _plan_phase(conn, run, report, events.record, preflight)
        result.text = plan_text(plan, run_dir=str(events.record.path))
        if blocking:
            if run.req.dry_run:
                events.emit(ev.PlanText(text=result.text))
            raise fail(events, "failed", CheckFailed(
                f"doctor on {where}: {doc_line}; nothing was started",
                results=report.failed, key="doctor",
                fix="Fix the failed checks (listed with their fixes), then run the same command again."
                    + profile_hint(blocking, report.facts.gpu.count)), stage=StageName.PREFLIGHT)
        if run.req.dry_run:
            return _dry_run(plan, result, events)
        assert conn is not None   # recorded facts only plan (--dry-run: check_up_arguments)
        return apply_phase(conn, plan, run.recipe, report, result, events, host=run.host, detach=run.req.detach)
    except KeyboardInterrupt as stop:
        # Ctrl-C or SIGTERM before the executor took over (it handles its own): nothing was started; say so in
        # the record (a SIGTERM used to leave it "planned")
        if events is not None and (events.record.path / rr.STATUS_JSON).exists():
            interrupted(events, stop, before="started on the host", nothing="started")
        raise
    finally:
        held.close()
        if conn is not None:
            conn.close()


def _dry_run(plan: Plan, result: UpResult, events: Emitter) -> UpResult:
    """--dry-run: the plan, and the stage where the real run would stop (the record says why)."""
    stop = plan.stop()
    result.stops_at = stop[0].name if stop else None
    events.record.set_status("dry-run", **({"stops_at": stop[0].name, "stop_reason": stop[1].why} if stop else {}))
    events.emit(ev.DryRun(stops_at=result.stops_at))
    events.emit(ev.PlanText(text=result.text))
    result.state = "dry-run"
    return result


def _sync_phase(conn: Connector | None, run: _HostRun, events: Emitter) -> None:
    """--sync-model / --sync-data: the local folders onto the host (controller/sync.py), before doctor reads
    them; with recorded facts (no connection) only announced."""
    keys = run.recipe.keys
    jobs = [(role, local, target) for role, local, target in
            (("model", run.req.sync_model, keys.model_name_or_path), ("data", run.req.sync_data, keys.dataset_dir))
            if local]
    for role, local, target in jobs:
        if not isinstance(target, str) or not target.startswith("/"):
            key = "model_name_or_path" if role == "model" else "dataset_dir"
            raise fail(events, "failed", UsageError(
                f"--sync-{role} needs train.{key} to be an absolute host path, not {printable(target)}",
                key=f"--sync-{role}", fix=f"Set train.{key} to the folder the upload goes to."), stage=StageName.SYNC)
        if conn is None:
            events.emit(ev.Said(ev.Mark.NOT, f"{local} -> {target} happens at the real run (not connected)",
                                StageName.SYNC))
            continue
        from ktdeploy.controller.sync import sync_folder

        events.emit(ev.SyncStarted(role=role))
        try:
            sync_folder(conn, local, target, role=role, dry_run=run.req.dry_run, emit=events.emit)
        except KtdeployError as e:
            raise fail(events, "failed", e, stage=StageName.SYNC) from None


def doctor_phase(report: DoctorReport, where: str, waive: Sequence[str], emit: ev.Sink) -> tuple[list[CheckResult], str]:
    """up's PREFLIGHT verdict on a doctor report: (blocking failed checks, the one-line summary); emits it with
    the waived and deferred checks (core/checks/gate.py decides which is which)."""
    report.waived = tuple(waive)
    g = gate(report.checks, waive, defer=RUNTIME_FIXABLE)
    doc_line = report.summary_text(RUNTIME_FIXABLE)  # the same count as `ktdeploy doctor` and the panel below
    emit(ev.DoctorVerdict(where=where, summary=report.summary(RUNTIME_FIXABLE), summary_text=doc_line,
                          failed=tuple(c.name for c in report.failed), waived=tuple(g.waived),
                          deferred=tuple(g.deferred), blocking=bool(g.blocking)))
    return g.blocking, doc_line


def _doctor_phase(conn: Connector | None, run: _HostRun, where: str,
                  events: Emitter) -> tuple[DoctorReport, list[CheckResult], str]:
    """Facts + doctor (live, or on recorded facts): (report, blocking failed checks, summary line)."""
    if run.recorded_facts is not None:
        report = DoctorReport(run.recorded_facts, run_checks(run.recorded_facts, run.recipe))
    else:
        assert conn is not None   # connect_phase connects unless facts were recorded
        report = run_doctor(conn, run.recipe)
    events.record.write_json(rr.FACTS, report.facts.model_dump(mode="json"))
    events.record.write_json(rr.DOCTOR, report.to_json())
    blocking, doc_line = doctor_phase(report, where, run.waive, events.emit)
    return report, blocking, doc_line


def planned_user(host: str) -> str:
    """The --user of a plan made without reaching the host: root's ids, else a placeholder the real run fills."""
    t = parse_host(host)
    return "0:0" if t.user == "root" or (t.is_local and os.getuid() == 0) else "<uid>:<gid>"


def _options(conn: Connector | None, run: _HostRun, run_id: str, preflight: dict[str, str]) -> UpOptions:
    req = run.req
    return UpOptions(host=run.host, run_id=run_id, resume=req.resume, detach=req.detach, waive=run.waive,
                     tune=req.tune, tune_budget_minutes=req.tune_budget_minutes,
                     image_tar=str(Path(req.image_tar).resolve()) if req.image_tar else None,
                     local=isinstance(conn, LocalConnector), preflight=preflight)


def _plan_phase(conn: Connector | None, run: _HostRun, report: DoctorReport, record: RunRecord,
                preflight: dict[str, str]) -> Plan:
    """The job's state on the host, the plan (pure), and the files the run record keeps for reading (the
    container renders its own from the shipped recipe)."""
    recipe = run.recipe
    image, _variant, _how = resolve_image(recipe.require_deploy(), report.facts)
    # with recorded facts nothing is known about the host's containers, image and output dir: a first run, as the
    # SSH user the real run reads on the host (its uid:gid; root is 0:0), so the argv is the real run's
    state = JobState(home="<home>", user=planned_user(run.host)) if conn is None else \
        gather_job_state(conn, recipe, image)
    record.write_json(rr.JOB_STATE, state.to_json())
    plan = build_plan(recipe, report.facts, state, _options(conn, run, record.id, preflight))
    derived = derived_kt_threads(recipe.train, report.facts, recipe.require_deploy().reserve_cores)
    rendered = render_recipe(recipe, derived).write(record.path / rr.RENDERED)
    ship = record.write_text(f"{rr.RENDERED}/ship/recipe.yaml", dump_yaml(shipped_recipe(recipe, plan.resume_from)))
    files = {k: str(v) for k, v in rendered.items()}
    files["ship/recipe.yaml"] = str(ship)
    plan = dataclasses.replace(plan, rendered=files)
    record.write_json(rr.PLAN, plan.to_json())
    record.set_status("planned", job_dir=plan.job_dir, image=plan.image, adapter_dir=plan.adapter_dir,
                      resume_from=plan.resume_from)
    return plan

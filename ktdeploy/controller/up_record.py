"""The record of one run of `up` or `up-slurm` (controller/runs.py): how it starts, what the caller gets back, and
how a failure is written into it (the stage, the error, its fix, the failed checks, the exit code)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ktdeploy.controller.emitter import Emitter
from ktdeploy.controller.runs import RunRecord, lock_key
from ktdeploy.core import events as ev
from ktdeploy.core import run_record as rr
from ktdeploy.core.checks.gate import CPU_ONLY, with_profile
from ktdeploy.core.command_requests import SlurmUpRequest, UpRequest
from ktdeploy.core.errors import KtdeployError, RunRecordError, Terminated
from ktdeploy.core.plan import job_name, output_dir_of
from ktdeploy.core.plan.steps import Plan, StageName
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.recipe.render import dump_yaml


@dataclass
class UpResult:
    record: RunRecord
    plan: Plan | None = None
    state: str = "planned"
    text: str = ""
    waived: list[str] = field(default_factory=list)
    stops_at: str | None = None     # a dry run: the stage where the real run would stop (the CLI exits 4)
    interrupted: bool = False       # Ctrl-C detached the run (training keeps running): the CLI exits 130


def new_record(recipe: Recipe, host: str, request: UpRequest | SlurmUpRequest, waive: tuple[str, ...],
               on_event: ev.Sink | None) -> Emitter:
    """The run's record, and the emitter of its events."""
    up = request if isinstance(request, UpRequest) else None
    cpu_only, name = (up.cpu_only, up.name) if up else (False, None)
    facts_file = up.facts_file if up else None
    record = RunRecord.create(name or recipe.name)
    events = Emitter(record, on_event)
    record.write_text(rr.RECIPE, dump_yaml(recipe.to_document()))
    record.set_status("planned", host=host, recipe=recipe.name, recipe_path=str(recipe.path), created=time.time(),
                      container=job_name(recipe), serve_container=f"{job_name(recipe)}-serve",
                      lock=lock_key(host, job_name(recipe)),
                      output_dir=output_dir_of(recipe), waived=list(waive), dry_run=request.dry_run,
                      profile=CPU_ONLY if cpu_only else None, name=name,
                      **({"facts_file": str(facts_file)} if facts_file is not None else {}))
    if waive:   # --cpu-only is a waiver profile: it always waives
        also = tuple(w for w in waive if not cpu_only or w not in with_profile((), True))
        events.emit(ev.WaiversRecorded(checks=tuple(waive), profile=CPU_ONLY if cpu_only else None, also=also,
                                       status_file=f"{record.path}/{rr.STATUS_JSON}"))
    return events


def fail(events: Emitter, state: str, err: KtdeployError, stage: StageName | None = None) -> KtdeployError:
    """Record a failure — the stage it happened in, the error, its fix, the failed checks, the exit code — in the
    event log and status.json (what `ktdeploy status` shows, and `down` keeps), and hand the error back."""
    record = events.record
    stage = stage or current_stage(record)
    checks = [c.name for c in getattr(err, "results", None) or []]
    events.emit(ev.Failed(stage=stage, error=type(err).__name__, message=err.message, fix=err.fix,
                          failed_checks=tuple(checks)))
    record.set_status(state, failed_stage=stage, error=err.message, error_type=type(err).__name__, fix=err.fix,
                      failed_checks=checks, exit_code=err.exit_code)
    return err


def interrupted(events: Emitter, stop: KeyboardInterrupt, *, before: str, nothing: str) -> None:
    """Ctrl-C or SIGTERM before anything started on the host (or was submitted): said, and the record "stopped"."""
    how = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted (Ctrl-C)"
    events.emit(ev.Interrupted(reason=f"{how} before anything {before}"))
    events.record.set_status("stopped", note=f"{how} during preflight/planning; nothing was {nothing}")


def current_stage(record: RunRecord) -> StageName:
    """The stage the executor was in (status.json's "stage"), else PREFLIGHT (connect, doctor, planning)."""
    try:
        stage = record.status().get("stage")
    except RunRecordError:
        stage = None
    return StageName(stage) if isinstance(stage, str) and stage in _STAGES else StageName.PREFLIGHT


_STAGES = {s.value for s in StageName}

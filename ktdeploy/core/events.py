"""What a run of `up` tells (pure): a frozen dataclass per kind of event, emitted by the controller, rendered by the
CLI.

The controller emits each event through ``controller/emitter.Emitter``, which writes the run record's event
(``KIND`` and ``record()``: the names and fields `ktdeploy status`/`logs`, the tests and people read in
``events.jsonl``) and hands the event to the caller's sink. The CLI's sink (``cli/events_view.EventView``) turns
it into the terminal's lines and the progress bar; nothing here knows about a terminal. An event whose ``KIND``
is None is only shown; one that no sink shows is only recorded.

What is only shown comes in three kinds: ``Said`` (one line: a mark, the stage, plain text — a new message is
written once, where it is emitted), ``Following`` (the progress bar's start, status and end) and ``PlanText``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, ClassVar, Literal

from ktdeploy.core.check_result import CheckResult
from ktdeploy.core.plan.state import ContainerState
from ktdeploy.core.plan.steps import StageName
from ktdeploy.core.recipe.finding import Finding
from ktdeploy.core.sched.slurm import JobInfo
from ktdeploy.core.trainer_log import LogEntry


def shown_only(*default: Any) -> Any:
    """A field the sink shows but the run record does not keep (with a default when one is given)."""
    if default:
        return field(default=default[0], metadata={"shown_only": True})
    return field(metadata={"shown_only": True})


@dataclass(frozen=True)
class Event:
    KIND: ClassVar[str | None] = None   # the run record's event name; None: shown, not recorded

    def record(self) -> dict[str, Any]:
        """The run record event's fields, in the record's order: every field but the ``shown_only`` ones."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if not f.metadata.get("shown_only")}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


Sink = Callable[[Event], None]


def ignore(_event: Event) -> None:
    """The sink of a caller that shows nothing (the events are still recorded)."""


def size_text(n: int) -> str:
    """Bytes as the run's lines and errors show them: MiB below a GiB, else GiB."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def files_text(files: int, missing: int, missing_bytes: int) -> str:
    """An upload's size as its lines say it: what is missing of how many files, or that none is."""
    return f"{missing} of {files} file(s), {size_text(missing_bytes)}" if missing else \
        f"all {files} file(s) already there"


# -- what is only shown: a line, the followed container, the plan ---------------------------------------------------
class Mark(StrEnum):
    """What a shown line says happened (the renderer gives each its look)."""

    OK = "ok"              # done, or already satisfied
    GO = "go"              # starting, or waiting for it
    NOT = "not"            # not done here: deferred to the real run, or only planned
    DONE = "done"          # the run ended well: its lead stands out
    STARTED = "started"    # training started and `up` returns: its lead stands out


@dataclass(frozen=True)
class Said(Event):
    """One line of what the run is doing, shown and not recorded: its mark, the stage it belongs to, a lead (shown
    in the mark's colour) and the rest. Plain text: the renderer styles it and escapes it whole."""

    mark: Mark
    text: str
    stage: StageName | None = None
    lead: str = ""


@dataclass(frozen=True)
class Following(Event):
    """The followed training container: ``started`` (a progress bar may start), ``status`` (its docker status
    changed: running, exited, missing), ``ended`` (the follow stopped: the bar ends)."""

    phase: Literal["started", "status", "ended"]
    container: str = ""
    status: str = ""


@dataclass(frozen=True)
class Waiting(Event):
    """A step that takes a while with nothing to count (the image check's container): ``started`` (a spinner on a
    terminal, else its line), ``ended`` (the spinner goes; the step's own result lines follow)."""

    phase: Literal["started", "ended"]
    stage: str = ""
    what: str = ""


# -- the run's setup: waivers, connection, uploads, doctor (controller/up_host.py, up_phases.py, sync.py) ---------
@dataclass(frozen=True)
class WaiversRecorded(Event):
    """`up` runs with waived checks (``profile``: the --cpu-only profile's, ``also``: the ones named besides it)."""

    KIND: ClassVar[str] = "waived"
    checks: tuple[str, ...]
    profile: str | None
    also: tuple[str, ...] = shown_only()
    status_file: str = shown_only()


@dataclass(frozen=True)
class ConnectStarted(Event):
    KIND: ClassVar[str] = "stage_start"
    host: str

    def record(self) -> dict[str, Any]:
        return {"stage": StageName.PREFLIGHT.value, "step": "connect", "host": self.host}


@dataclass(frozen=True)
class PlanningFromFacts(Event):
    """Not connecting: the plan is made from recorded facts (``up --dry-run --facts``)."""

    KIND: ClassVar[str] = "facts_file"
    path: str
    host: str = shown_only()


@dataclass(frozen=True)
class Connected(Event):
    KIND: ClassVar[str] = "connected"
    connector: str



@dataclass(frozen=True)
class SyncStarted(Event):
    KIND: ClassVar[str] = "stage_start"
    role: str

    def record(self) -> dict[str, Any]:
        return {"stage": StageName.SYNC.value, "role": self.role}




@dataclass(frozen=True)
class Synced(Event):
    """An upload checked (or, ``dry_run``, only planned); the record keeps controller/sync.SyncResult's fields."""

    KIND: ClassVar[str] = "sync"
    role: str
    local: str
    remote: str
    files: int
    bytes: int
    copied: int
    seconds: float
    notes: tuple[str, ...]
    dry_run: bool


@dataclass(frozen=True)
class DoctorVerdict(Event):
    """up's PREFLIGHT verdict on doctor's report (core/checks/gate.py decided which check is which)."""

    KIND: ClassVar[str] = "doctor"
    where: str
    summary: Mapping[str, int]
    summary_text: str
    failed: tuple[str, ...]                 # failing and not waived
    waived: tuple[CheckResult, ...]
    deferred: tuple[CheckResult, ...]       # left to the RUNTIME stage
    blocking: bool

    def record(self) -> dict[str, Any]:
        return {"summary": self.summary, "failed": list(self.failed), "waived": [c.name for c in self.waived]}


@dataclass(frozen=True)
class SlurmFit(Event):
    """up-slurm's PREFLIGHT: can a node of the cluster ever run the job."""

    KIND: ClassVar[str] = "slurm_fit"
    check: CheckResult

    def record(self) -> dict[str, Any]:
        return {"status": self.check.status, "detail": self.check.detail, "data": self.check.data}


@dataclass(frozen=True)
class SlurmCheck(Event):
    """up-slurm's PREFLIGHT on the cluster's setup: the container runtime (slurm.runtime), the job's cgroup
    (slurm.cgroup)."""

    KIND: ClassVar[str] = "slurm_check"
    check: CheckResult

    def record(self) -> dict[str, Any]:
        return {"name": self.check.name, "status": self.check.status, "detail": self.check.detail,
                "data": self.check.data}


@dataclass(frozen=True)
class PlanText(Event):
    """A dry run's plan (or a blocked one's), as core/plan's plan_text wrote it."""

    text: str


@dataclass(frozen=True)
class DryRun(Event):
    KIND: ClassVar[str] = "dry_run"
    stops_at: str | None


@dataclass(frozen=True)
class SlurmDryRun(Event):
    KIND: ClassVar[str] = "dry_run"


@dataclass(frozen=True)
class Interrupted(Event):
    """Ctrl-C or SIGTERM before anything started (or was submitted) on the host."""

    KIND: ClassVar[str] = "interrupted"
    reason: str


@dataclass(frozen=True)
class Failed(Event):
    """How a run failed (the CLI prints the error itself)."""

    KIND: ClassVar[str] = "failed"
    stage: StageName
    error: str
    message: str
    fix: str | None
    failed_checks: tuple[str, ...]


# -- the plan applied (controller/executor.py) --------------------------------------------------------------------
@dataclass(frozen=True)
class ResumeNote(Event):
    KIND: ClassVar[str] = "resume_note"
    note: str


@dataclass(frozen=True)
class StageSkipped(Event):
    KIND: ClassVar[str] = "stage_skipped"
    stage: StageName
    reason: str


@dataclass(frozen=True)
class StageStarted(Event):
    KIND: ClassVar[str] = "stage_start"
    stage: StageName


@dataclass(frozen=True)
class StageDone(Event):
    KIND: ClassVar[str] = "stage_done"
    stage: StageName


@dataclass(frozen=True)
class StepSatisfied(Event):
    """Known satisfied when the plan was made (``why``)."""

    KIND: ClassVar[str] = "step_satisfied"
    stage: StageName
    step: str
    why: str
    title: str = shown_only()


@dataclass(frozen=True)
class StepProbed(Event):
    """Satisfied: its probe exited 0."""

    KIND: ClassVar[str] = "step_satisfied"
    stage: StageName
    step: str
    probe: tuple[str, ...]
    title: str = shown_only()

    def record(self) -> dict[str, Any]:
        return {"stage": self.stage, "step": self.step, "why": "probe", "probe": list(self.probe)}


@dataclass(frozen=True)
class StepStarted(Event):
    KIND: ClassVar[str] = "step_start"
    stage: StageName
    step: str
    command: str | None



@dataclass(frozen=True)
class StepDone(Event):
    KIND: ClassVar[str] = "step_done"
    stage: StageName
    step: str
    seconds: float


@dataclass(frozen=True)
class StepFailed(Event):
    KIND: ClassVar[str] = "step_failed"
    stage: StageName
    step: str
    message: str
    rc: int | None
    output: str


@dataclass(frozen=True)
class ImageChecked(Event):
    """IMAGE's image.check: doctor in the image with the training flags, the plan's waivers applied."""

    KIND: ClassVar[str] = "image_check"
    image: str
    summary: Mapping[str, int]
    summary_text: str
    failed: tuple[str, ...]
    waived: tuple[CheckResult, ...]
    checks: tuple[CheckResult, ...]

    def record(self) -> dict[str, Any]:
        return {"image": self.image, "summary": self.summary, "failed": list(self.failed),
                "waived": [c.name for c in self.waived], "checks": [c.model_dump(mode="json") for c in self.checks]}


@dataclass(frozen=True)
class StackRefused(Event):
    """image.check: the stack in the image refuses the recipe."""

    KIND: ClassVar[str] = "step_failed"
    stage: StageName
    step: str
    message: str
    findings: tuple[Finding, ...]

    def record(self) -> dict[str, Any]:
        return {"stage": self.stage, "step": self.step, "message": self.message,
                "findings": [f.to_json() for f in self.findings]}


@dataclass(frozen=True)
class ImageNotReady(Event):
    """image.check: checks failed in the image."""

    KIND: ClassVar[str] = "step_failed"
    stage: StageName
    step: str
    message: str


@dataclass(frozen=True)
class FetchMissing(Event):
    KIND: ClassVar[str] = "fetch_missing"
    step: str
    remote: str | None


@dataclass(frozen=True)
class FetchRefused(Event):
    """An optional artifact not fetched: a link, or too large."""

    KIND: ClassVar[str] = "fetch_refused"
    step: str
    remote: str | None
    why: str
    stage: StageName = shown_only()








@dataclass(frozen=True)
class Progress(Event):
    """A new step in the trainer log."""

    KIND: ClassVar[str] = "progress"
    entry: LogEntry

    def record(self) -> dict[str, Any]:
        return self.entry.to_json()



@dataclass(frozen=True)
class TrainExited(Event):
    KIND: ClassVar[str] = "train_exited"
    exit_code: int | None
    oom_killed: bool
    status: str


@dataclass(frozen=True)
class AgentRecordRead(Event):
    """The agent's own record of the run (state, rc, summary), copied into the run record."""

    KIND: ClassVar[str] = "agent_record"
    dir: str
    state: str | None
    rc: int | None
    steady_tokens_per_s: Any



@dataclass(frozen=True)
class Crashed(Event):
    """A container stopped (or vanished) where it should run: its state and last log lines."""

    KIND: ClassVar[str] = "crash"
    container: str
    state: ContainerState | None
    last_lines: tuple[str, ...]

    def record(self) -> dict[str, Any]:
        return {"container": self.container, "state": self.state.__dict__ if self.state else None,
                "last_lines": list(self.last_lines)}


# -- up-slurm's jobs (controller/slurm_jobs.py) ------------------------------------------------------------------
@dataclass(frozen=True)
class SlurmSubmitted(Event):
    KIND: ClassVar[str] = "slurm_submitted"
    role: str
    job_id: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class SlurmJobState(Event):
    """A followed job's state changed."""

    KIND: ClassVar[str] = "slurm_job"
    role: str
    job: JobInfo

    def record(self) -> dict[str, Any]:
        j = self.job
        return {"role": self.role, "job_id": j.job_id, "state": j.state, "nodes": j.nodes, "restarts": j.restarts,
                "reason": j.reason}


@dataclass(frozen=True)
class SlurmStarted(Event):
    KIND: ClassVar[str] = "slurm_started"
    role: str
    job_id: str
    nodes: str
    seconds_after_submit: float | None


@dataclass(frozen=True)
class SlurmReadMissed(Event):
    """One read of a job's state cut short (the follow goes on, up to slurm_jobs.READ_MISSES in a row)."""

    KIND: ClassVar[str] = "slurm_read_missed"
    role: str
    job_id: str
    attempt: int
    error: str


@dataclass(frozen=True)
class SlurmTrainExited(Event):
    KIND: ClassVar[str] = "train_exited"
    job: JobInfo

    def record(self) -> dict[str, Any]:
        return {"job": self.job.describe(), "exit_code": self.job.exit_code, "state": self.job.state}


@dataclass(frozen=True)
class SlurmJobFailed(Event):
    KIND: ClassVar[str] = "slurm_job_failed"
    role: str
    job: JobInfo
    last_lines: tuple[str, ...]

    def record(self) -> dict[str, Any]:
        return {"role": self.role, "job": self.job.describe(), "last_lines": list(self.last_lines)}





# -- EVAL: the served model scored (controller/eval_stage.py) ------------------------------------------------------
@dataclass(frozen=True)
class EvalStarted(Event):
    KIND: ClassVar[str] = "eval_start"
    samples: int
    url: str
    tuned: str
    base: str | None
    source: str
    base_why: str = ""


@dataclass(frozen=True)
class EvalProgressed(Event):
    """Shown only (a progress line with the ETA); the samples file keeps every answer."""

    done: int
    total: int
    eta_s: float | None
    failed: int


@dataclass(frozen=True)
class EvalFinished(Event):
    KIND: ClassVar[str] = "eval"
    summary_file: str
    samples_file: str
    tuned: Mapping[str, float]
    base: Mapping[str, float] | None
    failed: int
    below: str | None


@dataclass(frozen=True)
class EvalNotRun(Event):
    """The evaluation could not run or finish: the server keeps running."""

    KIND: ClassVar[str] = "eval_failed"
    why: str
    fix: str


# -- how the run ended (controller/up_phases.py) -------------------------------------------------------------------
@dataclass(frozen=True)
class Detached(Event):
    """The controller stopped following (Ctrl-C, or ``terminated`` by SIGTERM); training keeps running."""

    KIND: ClassVar[str] = "detached"
    reason: str
    job: str = shown_only()
    host: str = shown_only()
    terminated: bool = shown_only()
    again: str = shown_only("")   # the command that goes on (the CLI's own command line), when the view knows it




@dataclass(frozen=True)
class Cancelled(Event):
    """SIGTERM during up-slurm: the jobs this run submitted, scancelled (job -> what scancel did)."""

    KIND: ClassVar[str] = "cancelled"
    reason: str
    jobs: Mapping[str, str]


# -- `ktdeploy down` (controller/run_queries.py, controller/slurm_queries.py) ---------------------------------------
@dataclass(frozen=True)
class ContainerRemoved(Event):
    KIND: ClassVar[str] = "down"
    container: str


@dataclass(frozen=True)
class SlurmJobStopped(Event):
    KIND: ClassVar[str] = "down"
    slurm_job: str
    role: str
    log: str

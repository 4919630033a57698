"""Plan data: stages of steps. A step is an argv to run on the host plus a probe that says it is already
done; nothing here touches a host (the executor does)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from ktdeploy.core.errors import StepError
from ktdeploy.core.plan.params import StepParams

P = TypeVar("P", bound=StepParams)


class StageName(StrEnum):
    """Every stage of `up` (and of `up-slurm`), in the order they run. A StrEnum: plans, records and output
    carry the plain string, as before; code names a stage by its member (mypy refuses a string there)."""

    PREFLIGHT = "PREFLIGHT"   # connect, facts, doctor (up's phases record their failures here)
    SYNC = "SYNC"             # --sync-model / --sync-data (up_host, before doctor)
    RUNTIME = "RUNTIME"
    IMAGE = "IMAGE"
    VOLUMES = "VOLUMES"
    WEIGHTS = "WEIGHTS"       # INT8/AMXINT4: kt_weight_path converted by prepare-weights when it is not there yet
    TRAIN = "TRAIN"
    SUBMIT = "SUBMIT"         # up-slurm: sbatch the batch scripts
    FOLLOW = "FOLLOW"
    CONVERT = "CONVERT"
    SERVE = "SERVE"
    EVAL = "EVAL"             # deploy.eval: the served model scored on held-out prompts


class StepAction(StrEnum):
    """What the executor does with a step (one handler each in controller/executor.py). A StrEnum: plans written
    as JSON and code comparing with the plain names ("fail") keep working."""

    RUN = "run"                    # run argv on the host
    PUT = "put"                    # copy a controller file to the host
    PUT_SECRET = "put_secret"      # write an environment variable's value into a 0600 file on the host
    FETCH = "fetch"                # copy a host file (or a container's log) into the run record
    FOLLOW = "follow"              # follow the training container until it stops
    FAIL = "fail"                  # stop `up` with the step's why/fix
    WAIT_RUNNING = "wait_running"  # the container is still running a few seconds after start
    WAIT_HTTP = "wait_http"        # poll a readiness probe
    IMAGE_CHECK = "image_check"    # doctor inside the image started with the training flags (controller/image_check)
    SUBMIT = "submit"              # sbatch a batch script (`up-slurm`); the job id goes to the run record
    FOLLOW_JOB = "follow_job"      # follow a Slurm job (its state, the trainer log) until it ends
    WAIT_JOB = "wait_job"          # wait for a Slurm job to end
    EVAL = "eval"                  # score the served model through its API (controller/eval_stage.py)



@dataclass(frozen=True)
class Step:
    id: str                                   # "image.load"
    title: str                                # what a person reads
    action: StepAction = StepAction.RUN
    argv: tuple[str, ...] | None = None       # run: the command on the host (argv, never a shell string)
    probe: tuple[str, ...] | None = None      # exit 0 = already satisfied, the step is skipped
    satisfied: bool = False                   # known satisfied at plan time (from the gathered job state)
    why: str = ""                             # why it is satisfied / needed
    local: str | None = None                  # put/fetch: the controller-side path
    remote: str | None = None                 # put/fetch: the host-side path
    optional: bool = False                    # fetch: a missing file is not an error
    fix: str | None = None                    # fail: how to get past it
    timeout: float | None = None
    params: StepParams | None = None          # what the action needs besides the above (core/plan/params.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", StepAction(self.action))   # ValueError for an unknown action

    def typed(self, kind: type[P]) -> P:
        """The step's parameters, which its action needs as a ``kind``."""
        if not isinstance(self.params, kind):
            raise StepError(f"plan step {self.id} ({self.action}) has no {kind.__name__}", step=self.id,
                            fix="a plan builder bug; report it")
        return self.params

    def command(self) -> str | None:
        """The command as a person would type it (each argv item shell-quoted)."""
        if self.argv:
            return " ".join(shlex.quote(a) for a in self.argv)
        return None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["params"] = self.params.to_json() if self.params is not None else None
        d["command"] = self.command()
        return {k: v for k, v in d.items() if v not in (None, False, "", {}, ())}


@dataclass(frozen=True)
class Stage:
    name: StageName
    title: str
    steps: tuple[Step, ...] = ()
    skipped: str | None = None                # why the whole stage does not run

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", StageName(self.name))   # ValueError for a stage not in StageName

    def to_json(self) -> dict[str, Any]:
        d = {"name": self.name, "title": self.title, "steps": [s.to_json() for s in self.steps]}
        if self.skipped:
            d["skipped"] = self.skipped
        return d


@dataclass(frozen=True)
class Plan:
    host: str
    recipe: str
    job: str                                  # deterministic container name (recipe name + output dir hash)
    image: str
    variant: str | None
    output_dir: str
    adapter_dir: str
    job_dir: str                              # host folder holding the shipped recipe
    stages: tuple[Stage, ...]
    resume_from: str | None = None
    waived: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    rendered: dict[str, str] = field(default_factory=dict)   # name -> controller path (filled by the executor)

    def stage(self, name: StageName) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def steps(self) -> Iterator[tuple[Stage, Step]]:
        for st in self.stages:
            for s in st.steps:
                yield st, s

    def stop(self) -> tuple[Stage, Step] | None:
        """The step where this plan will stop, known before it runs (a FAIL step with no probe that could pass)."""
        return next(((st, s) for st, s in self.steps() if s.action == "fail" and not s.probe and not s.satisfied),
                    None)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "recipe": self.recipe, "job": self.job, "image": self.image,
                "variant": self.variant, "output_dir": self.output_dir, "adapter_dir": self.adapter_dir,
                "job_dir": self.job_dir, "resume_from": self.resume_from, "waived": list(self.waived),
                "notes": list(self.notes), "rendered": dict(self.rendered),
                "stages": [s.to_json() for s in self.stages]}

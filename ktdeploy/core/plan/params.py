"""What a plan step's action needs beyond its argv, probe and paths: one frozen dataclass per kind of step.

The executor (controller/executor.py, controller/slurm_jobs.py) reads them as attributes (``Step.typed``). In the
plan's JSON (`up --dry-run --json`, the run record's plan.json) a step's ``params`` is the mapping it always was:
``to_json`` writes the fields in their order, tuples as lists, and leaves out an optional field that is unset.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

_OPTIONAL = {"omit_when_none": True}   # a field written into the JSON only when it is set


@dataclass(frozen=True)
class StepParams:
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None and f.metadata.get("omit_when_none"):
                continue
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out


@dataclass(frozen=True)
class ImageCheckParams(StepParams):
    """IMAGE_CHECK: the training container's flags the image is started with (controller/image_check.py)."""

    image: str
    name: str                 # the check's container
    gpus: tuple[int, ...]
    memlock: bool
    user: str | None          # uid:gid; None: the connecting user's


@dataclass(frozen=True)
class RunParams(StepParams):
    """RUN: what a failed step leaves behind (the serving key file), removed before the step's error."""

    cleanup: tuple[str, ...]


@dataclass(frozen=True)
class CrashParams(StepParams):
    """FAIL: the training container stopped (the executor says why and how to resume)."""

    crash: bool = True


@dataclass(frozen=True)
class ContainerLogParams(StepParams):
    """FETCH: ``remote`` names a container whose log is fetched (not a host file)."""

    docker_logs: bool = True


@dataclass(frozen=True)
class SecretParams(StepParams):
    """PUT_SECRET: the controller's environment variable whose value goes into the 0600 file."""

    env: str


@dataclass(frozen=True)
class FollowParams(StepParams):
    """FOLLOW: the training container and its trainer log."""

    container: str
    log: str


@dataclass(frozen=True)
class WaitRunningParams(StepParams):
    """WAIT_RUNNING: the container that must still run ``seconds`` after its start."""

    container: str
    seconds: float


@dataclass(frozen=True)
class WaitHttpParams(StepParams):
    """WAIT_HTTP: the container whose readiness probe is polled (its death ends the wait)."""

    container: str


@dataclass(frozen=True)
class SubmitParams(StepParams):
    """SUBMIT (`up-slurm`): the job's role (train, convert); ``job_id``: its job already in the queue."""

    role: str
    job_id: str | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True)
class SubmitAfterParams(SubmitParams):
    """SUBMIT of the conversion job: ``after``, the role whose job must succeed first (sbatch
    --dependency=afterok); None when that job already finished."""

    after: str | None = None


@dataclass(frozen=True)
class FollowJobParams(StepParams):
    """FOLLOW_JOB: the training job (its trainer log, its job folder; ``job_id`` when already queued)."""

    role: str
    log: str
    job_dir: str
    job_id: str | None


@dataclass(frozen=True)
class WaitJobParams(StepParams):
    """WAIT_JOB: the job waited for (its job folder; ``job_id`` when already queued)."""

    role: str
    job_dir: str
    job_id: str | None


@dataclass(frozen=True)
class EvalParams(StepParams):
    """EVAL: the evaluation set on the host (a folder with a dataset_info.json and the datasets to read) and where the
    server answers (``url``: None when this machine cannot reach it, ``unreachable`` says why)."""

    data_dir: str
    datasets: tuple[str, ...]
    source: str
    url: str | None
    tuned: str
    base: str | None
    base_why: str = ""
    unreachable: str = ""

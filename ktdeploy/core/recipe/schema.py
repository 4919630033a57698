"""ktdeploy's own recipe section (``deploy:``), as pydantic models.

The ``train:`` and ``accelerate:`` sections are LlamaFactory's and Accelerate's own YAML and are
validated key by key by ``ktdeploy.core.recipe.rules`` (they stay plain dicts so rendering is lossless).
Every field carries a description: the docs and error messages come from here.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationInfo, field_validator

from ktdeploy.core import variants as V
from ktdeploy.core.safeio import norm_path

# every C0 control (newline and tab too), DEL, C1, the line/paragraph separators and bidi controls: no path or name
# ktdeploy writes into a script, a record or onto a terminal may hold one (issue 35; probe 3 F1)
LINE_BREAKING = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _absolute(value: str, what: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{what} must be an absolute path on the training host, got {value!r}")
    if LINE_BREAKING.search(value):
        raise ValueError(f"{what} must not contain control characters (newline, tab, ESC, NUL …): they end a line of "
                         "the batch script, the record or the terminal it is printed on")

    return norm_path(value)  # '//srv/m/./' -> '/srv/m': the spelling docker and the kernel resolve


class Volumes(_Strict):
    """Host paths mounted into the training container at the same path, so the training YAML's paths
    are valid on the host and in the container alike."""

    model: str = Field(description="Host directory holding the base model (and any converted KT weights). "
                                   "Mounted read-only; ktdeploy never writes into it.")
    data: str = Field(description="Host directory holding the dataset and its dataset_info.json.")
    output: str = Field(description="Host directory receiving the training output (checkpoints, adapter, logs).")

    @field_validator("model", "data", "output")
    @classmethod
    def _abs(cls, v: str, info: ValidationInfo) -> str:
        if not v.startswith("/"):
            raise ValueError(f"deploy.volumes.{info.field_name} must be an absolute path on the training host, got "
                             f"{v!r} (or set deploy.root, the folder relative paths resolve against)")
        return _absolute(v, f"deploy.volumes.{info.field_name}")


class Serve(_Strict):
    """How ``ktdeploy serve`` starts sglang-kt on the converted adapter."""

    enabled: bool = Field(True, description="Start sglang-kt after training and conversion.")
    host: str = Field("127.0.0.1", description="Address the OpenAI-compatible server listens on. "
                                               "Loopback by default; expose it deliberately.")
    port: int = Field(30000, ge=1, le=65535, description="Server port.")
    served_model_name: str | None = Field(None, description="Model name clients use (default: the model dir's name).")
    lora_name: str = Field("adapter", pattern=r"^[A-Za-z0-9._-]+$",
                           description="Name of the LoRA adapter; requests use model=<served>:<lora_name>.")
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                                    description="Name of an environment variable holding the API key "
                                                "(the key itself never goes into a recipe).")
    max_running_requests: int = Field(4, ge=2, description="sglang-kt --max-running-requests (KT LoRA serving needs >= 2).")
    mem_fraction_static: float | None = Field(None, gt=0, lt=1, description="sglang --mem-fraction-static.")
    ready_timeout_s: int = Field(1800, ge=10, le=86400, description="How long `ktdeploy up` waits for the server's "
                                                                     "/health to answer (loading a large model takes "
                                                                     "minutes).")
    merge: bool = Field(False, description="LoRA runs: CONVERT also folds the adapter into the base weights (`ktdeploy "
                                           "merge`, written to <output_dir>-merged, the base's size again on the output "
                                           "volume) and SERVE starts sglang-kt on that plain BF16 model (--kt-method "
                                           "BF16, no LoRA flags) instead of base + adapter.")
    extra_args: list[str] = Field(default_factory=list, description="Extra sglang.launch_server arguments, passed as-is "
                                                                      "(as separate argv items, never through a shell).")


class Evaluation(_Strict):
    """`up`'s EVAL stage after SERVE (`ktdeploy eval`, docs/eval.md): held-out prompts through the served model's
    OpenAI-compatible API, scored with LlamaFactory's own generation metrics, base and tuned side by side."""

    holdout: float | None = Field(None, gt=0, description="Carve this many rows (a fraction below 1, or a count) out "
                                                          "of each training dataset before training, deterministically "
                                                          "(seeded hash of each row); the trainer never sees them and "
                                                          "EVAL scores them. Written to <output_dir>-holdout.")
    dataset: str | None = Field(None, pattern=r"^[^,/\\]+$",
                                description="A dataset of train.dataset_dir's dataset_info.json to evaluate on instead "
                                            "(default: the holdout, else train.eval_dataset).")
    seed: int = Field(0, ge=0, description="Seed of the holdout's row hash.")
    max_samples: int = Field(200, ge=1, le=100000, description="Evaluate at most this many samples (the first ones).")
    max_tokens: int = Field(256, ge=1, le=32768, description="max_tokens of each answer.")
    temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature (0: greedy, comparable runs).")
    concurrency: int = Field(4, ge=1, le=64, description="Requests in flight at once.")
    timeout_s: float = Field(120, gt=0, le=3600, description="Seconds one request may take before it counts as failed.")
    compare_base: bool = Field(True, description="Also ask the base model (model=<served> without the LoRA) and report "
                                                 "the difference.")
    metric: Literal["bleu-4", "rouge-1", "rouge-2", "rouge-l", "exact_match"] = Field(
        "rouge-l", description="The metric fail_below judges.")
    fail_below: float | None = Field(None, ge=0, le=100, description="`up` exits 1 when the tuned model's metric is "
                                                                     "below this (or the evaluation failed); the server "
                                                                     "keeps running either way.")

    @field_validator("holdout")
    @classmethod
    def _count_or_fraction(cls, v: float | None) -> float | None:
        if v is not None and v >= 1 and v != int(v):
            raise ValueError("a holdout of 1 or more is a row count: a whole number")
        return v


SLURM_TIME = r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$"   # Slurm's --time forms: MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]
SCHED_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class Scheduler(_Strict):
    """What a batch scheduler needs that a host would tell (`up-slurm`, `render --slurm`, `render --k8s`)."""

    time: str = Field("1-00:00:00", pattern=SLURM_TIME,
                      description="Wall-clock limit of the training job (Slurm --time: D-HH:MM:SS, HH:MM:SS or MM).")
    cpus: int | None = Field(None, ge=1, le=4096,
                             description="Physical cores for kt-kernel's expert threads when "
                                         "train.kt_config.kt_num_threads is unset (the job asks for these + "
                                         "deploy.reserve_cores).")
    mem_gib: float | None = Field(None, gt=0, le=65536,
                                  description="Host memory of the job in GiB; default: the planner's upper edge.")
    partition: str | None = Field(None, pattern=SCHED_NAME, description="Slurm partition (--partition).")
    account: str | None = Field(None, pattern=SCHED_NAME, description="Slurm account (--account).")
    runtime: Literal["auto", "podman", "pyxis", "apptainer", "docker"] = Field(
        "auto", description="How a Slurm job starts the image on its node, inside the job's cgroup (docs/scaling.md): "
                            "'podman' (rootless, a child of the batch step), 'pyxis' (srun --container-image: enroot), "
                            "'apptainer' (srun apptainer exec --nv on a SIF), or 'docker' only when asked: its "
                            "container is dockerd's child, outside the job's cgroup, so Slurm's CPU, memory and GPU "
                            "limits, accounting and OOM handling miss it, it outlives a SIGKILLed job step, and every "
                            "user must be in the docker group. 'auto': what the cluster has (pyxis, then apptainer, "
                            "then podman).")
    image_file: str | None = Field(None, description="The image as the Slurm runtime reads it, on a folder every node "
                                                     "sees: an enroot squashfs for pyxis (`ktdeploy image save --format "
                                                     "squashfs`), a SIF for apptainer (`--format sif`), a docker-archive "
                                                     "tarball for podman (`ktdeploy image save`). Unset: the registry "
                                                     "reference (deploy.registry).")
    step_seconds: float | None = Field(None, gt=0, le=86400,
                                       description="Measured seconds per optimizer step (an earlier run's `ktdeploy "
                                                   "status` shows it); sets how early the job is warned before its "
                                                   "time limit. Unset: the planner's figure.")
    signal_seconds: int | None = Field(None, ge=60, le=65535,
                                       description="Seconds before the time limit at which Slurm sends USR1 (Kubernetes: "
                                                   "the termination grace period): the trainer saves a checkpoint at "
                                                   "the next step boundary and the job is requeued. Unset: from the "
                                                   "step time (step_seconds, else the planner's) and the checkpoint's "
                                                   "save time.")
    cpus_are_threads: bool = Field(False, description="Kubernetes: the nodes' `cpu` counts SMT threads (hyperthreads), "
                                                      "so a pod asks for 2 per physical core. Node Feature Discovery's "
                                                      "SMT label selects nodes that say so; set this where NFD runs "
                                                      "without it.")

    @field_validator("image_file")
    @classmethod
    def _image_file(cls, v: str | None) -> str | None:
        return None if v is None else _absolute(v, "deploy.scheduler.image_file")


class Deploy(_Strict):
    """ktdeploy's own settings: which image, which GPUs, which host paths."""

    image: str = Field(V.AUTO, description="Image variant: 'auto' (chosen from the host's CPU facts), a kt-kernel "
                                          "CPU build (" + ", ".join(V.NAMES) + "; docs/cpu-builds.md), or a full "
                                          "image reference.")
    image_repo: str = Field(V.IMAGE_REPO, description="Repository name of the ktdeploy images (ktsft:<variant>).")
    registry: str | None = Field(None, description="Registry to pull the image from; when unset the image tarball made "
                                                   "by `ktdeploy image save` is shipped to the host and loaded.")
    gpus: list[StrictInt] = Field(default_factory=lambda: [0], min_length=1,
                            description="GPU indices for CUDA_VISIBLE_DEVICES; their count must equal "
                                        "accelerate.num_processes.")
    root: str | None = Field(None, description="A host folder the recipe's relative host paths resolve against "
                                               "(train.model_name_or_path, dataset_dir, output_dir, kt_weight_path, "
                                               "deploy.volumes.*): one setting moves them all, e.g. --set "
                                               "deploy.root=/data/kt. Absolute paths stay as written.")
    volumes: Volumes
    reserve_cores: int = Field(2, ge=0, description="Physical cores kept free for the DataLoader and the system when "
                                                    "ktdeploy derives kt_num_threads.")
    serve: Serve = Field(default_factory=Serve)
    scheduler: Scheduler = Field(default_factory=Scheduler)
    eval: Evaluation | None = Field(None, description="Evaluate the served model after SERVE (the EVAL stage).")

    @field_validator("root")
    @classmethod
    def _root_abs(cls, v: str | None) -> str | None:
        return None if v is None else _absolute(v, "deploy.root")

    @field_validator("gpus")
    @classmethod
    def _unique(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("GPU indices must be unique")
        if any(i < 0 or i > 1023 for i in v):
            raise ValueError("GPU indices must be whole numbers from 0 to 1023")
        return v

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(i) for i in self.gpus)

    def variant(self) -> str | None:
        """The kt-kernel build named by ``image`` (an old alias names its build; None for auto or a reference)."""
        return V.canonical(self.image) if V.known(self.image) else None


Severity = Literal["error", "warning"]

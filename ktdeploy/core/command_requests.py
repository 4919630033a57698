"""What `ktdeploy up`, `up-slurm` and `doctor` are asked to do, as one frozen value each (pure): the CLI builds it
from argv, the controller takes it whole (controller/up_host.up, controller/up_slurm.up_slurm,
controller/doctor_host.doctor), the way SkyPilot's ``launch`` takes a Task. What a run is handed besides its
request — the sink of its events, an already open connector — stays a parameter of the call."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SshOptions:
    """--ssh-key, --known-hosts, --accept-new-host-key; None: the connector's default (the agent and ~/.ssh, the
    KTDEPLOY_SSH_* environment)."""

    key: str | None = None
    known_hosts: str | None = None
    accept_new_host_key: bool | None = None

    def connect_kwargs(self) -> dict[str, str | bool]:
        """The options ``controller.connectors.connect`` takes, only those given."""
        given = {"key": self.key, "known_hosts": self.known_hosts, "accept_new_host_key": self.accept_new_host_key}
        return {k: v for k, v in given.items() if v is not None}


@dataclass(frozen=True)
class NativePair:
    """--train/--accelerate[/--deploy]: LlamaFactory's own YAML files instead of a RECIPE (core/recipe/from_lf.py
    derives the deploy section when --deploy is not given)."""

    train: str
    accelerate: str
    deploy: str | None = None


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """What both `up` and `up-slurm` take: the recipe (a RECIPE file, None: the shipped tiny one; or the native
    pair), its --set overrides, and how the run goes."""

    recipe: str | Path | None = None
    overrides: tuple[str, ...] = ()
    dry_run: bool = False
    resume: str | None = None            # None | "auto" | checkpoint-N | an absolute checkpoint path
    detach: bool = False
    waive: tuple[str, ...] = ()          # check names as the user typed them (recorded, never silent)
    ssh: SshOptions = SshOptions()


@dataclass(frozen=True, kw_only=True)
class UpRequest(RunRequest):
    """`ktdeploy up`: provision ``host`` and run the recipe there, stage by stage."""

    host: str = "localhost"
    native: NativePair | None = None
    name: str | None = None              # --name, for --run of status/logs/down
    facts_file: str | None = None        # --facts: plan (--dry-run) from `doctor --json` output
    cpu_only: bool = False
    sync_model: str | None = None
    sync_data: str | None = None
    image_tar: str | None = None
    tune: bool = False
    tune_budget_minutes: float = 20.0


@dataclass(frozen=True, kw_only=True)
class SlurmUpRequest(RunRequest):
    """`ktdeploy up-slurm LOGIN`: the same recipe, record and stages, TRAIN and CONVERT submitted as batch jobs on
    the login node."""

    login: str


@dataclass(frozen=True, kw_only=True)
class DoctorRequest:
    """`ktdeploy doctor`: where to look, the recipe to check the host against, and which container or image."""

    host: str = "localhost"
    recipe: str | Path | None = None
    overrides: tuple[str, ...] = ()
    image: str | None = None
    variant: str | None = None
    gpus: str | None = None              # with --image: "0,1"
    stack: bool = False
    container: str | None = None
    waive: tuple[str, ...] = ()
    cpu_only: bool = False
    ssh: SshOptions = SshOptions()

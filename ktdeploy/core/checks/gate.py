"""Which failed checks block a run (pure): the one gate behind ``ktdeploy up``, ``ktdeploy doctor --waive``
and ``ktdeploy train`` (the in-image agent).

A failed check is *waived* when the user named it (``--waive NAME``), *deferred* when a later stage repairs
it or it does not concern the caller (``up``'s RUNTIME stage installs docker / the NVIDIA runtime; the agent
trains inside the container, so the docker-engine checks are ``up``'s business), and *blocking* otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult

# The one named profile: a host without a GPU that runs the whole path for a test (`--cpu-only` on `up`, `doctor`,
# `train`). It waives exactly the checks that ask for a GPU, on the controller and inside the containers (`up`
# hands the same list to the training container's own doctor); every other check still gates. Offered in a
# failure's fix only where the host has no GPU.
CPU_ONLY = "cpu-only"
CPU_ONLY_WAIVERS = (CheckName.GPU_PRESENT, CheckName.GPU_COUNT_VS_RECIPE, CheckName.GPU_MEMORY, CheckName.GPU_DRIVER, CheckName.DOCKER_NVIDIA_RUNTIME,
                    CheckName.LAYER_GPUS, CheckName.PLAN_GPU_MEMORY, CheckName.STACK_CUDA, CheckName.STACK_TRITON)

# `up` repairs these in its RUNTIME stage (installs docker / the NVIDIA container toolkit) and its WEIGHTS stage
# (converts an INT8/AMXINT4 recipe's experts that are not there yet: `ktdeploy prepare-weights` in the image).
RUNTIME_FIXABLE = (CheckName.DOCKER_PRESENT, CheckName.DOCKER_NVIDIA_RUNTIME, CheckName.WEIGHTS_MISSING)
# the stage of `up` that repairs each deferrable check (said beside it when doctor defers it)
REPAIRED_BY = {CheckName.DOCKER_PRESENT: "RUNTIME", CheckName.DOCKER_NVIDIA_RUNTIME: "RUNTIME",
               CheckName.WEIGHTS_MISSING: "WEIGHTS"}
# The agent runs the trainer in this process: no docker-engine check concerns it (a prefix ends in ".").
AGENT_DEFERRED = ("docker.",)


@dataclass(frozen=True)
class Gate:
    blocking: list[CheckResult] = field(default_factory=list)
    waived: list[CheckResult] = field(default_factory=list)
    deferred: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.blocking


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(name == p or (p.endswith(".") and name.startswith(p)) for p in patterns)


def gate(checks: Iterable[CheckResult], waive: Iterable[str] = (), defer: Iterable[str] = ()) -> Gate:
    """Sort the failed checks: waived (named in ``waive``) first, then deferred (a name or a ``prefix.`` in
    ``defer``), the rest block."""
    waive, defer = tuple(waive), tuple(defer)
    g = Gate()
    for c in checks:
        if c.status != "fail":
            continue
        if c.name in waive:
            g.waived.append(c)
        elif _matches(c.name, defer):
            g.deferred.append(c)
        else:
            g.blocking.append(c)
    return g


def with_profile(waive: Iterable[str], cpu_only: bool) -> tuple[str, ...]:
    """The waivers a command runs with: the names given, plus the profile's when ``cpu_only`` (order kept, once)."""
    return tuple(dict.fromkeys([*waive, *(CPU_ONLY_WAIVERS if cpu_only else ())]))


def profile_hint(blocking: Iterable[CheckResult], gpu_count: int | None) -> str:
    """The fix sentence that offers --cpu-only: only on a host without a GPU whose failures include a GPU check
    (a GPU host short of memory is never invited to waive a GPU check)."""
    gpu_fails = sorted({c.name for c in blocking if c.name in CPU_ONLY_WAIVERS})
    if gpu_count or not gpu_fails:
        return ""
    return (f" This host has no GPU: to try the path on it (a test; nothing trains on a GPU), add --cpu-only, which "
            f"waives exactly the GPU checks ({', '.join(gpu_fails)} fail here).")

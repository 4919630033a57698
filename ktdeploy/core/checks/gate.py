"""Which failed checks block a run (pure): the one gate behind ``ktdeploy up``, ``ktdeploy doctor --waive``
and ``ktdeploy train`` (the in-image agent).

A failed check is *waived* when the user named it (``--waive NAME``), *deferred* when a later stage repairs
it or it does not concern the caller (``up``'s RUNTIME stage installs docker / the NVIDIA runtime; the agent
trains inside the container, so the docker-engine checks are ``up``'s business), and *blocking* otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ktdeploy.core.check_result import CheckResult

# `up` repairs these in its RUNTIME stage (installs docker / the NVIDIA container toolkit).
RUNTIME_FIXABLE = ("docker.present", "docker.nvidia_runtime")
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

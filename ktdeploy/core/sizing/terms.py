"""The planner's terms (pure): one named contribution to a resource — its value, and the formula with its figures
and the source of each constant. The resource model (core/sizing/memory_terms.py, composed by
core/sizing/estimate.estimate) is a list of them; a time model adds terms of its own resources in the same shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 2**30
# the key a term's value is written under in `ktdeploy plan --json` (memory: GiB; time per step, wall: seconds)
UNITS = {"host": "gib", "gpu": "gib", "disk": "gib", "time": "s", "wall": "s"}


@dataclass(frozen=True)
class Measured:
    """A constant that is not a byte width: its value and the measurement it comes from."""

    value: float
    source: str


@dataclass(frozen=True)
class Term:
    resource: str          # host | gpu | disk: memory, in GiB (2^30 bytes); time (per step) | wall: seconds
    name: str
    value: float
    explanation: str       # the formula with its figures, and where each constant comes from

    @property
    def gib(self) -> float:
        """A memory term's GiB."""
        return self.value

    def to_json(self) -> dict[str, Any]:
        return {"resource": self.resource, "name": self.name, UNITS.get(self.resource, "value"): round(self.value, 3),
                "explanation": self.explanation}


def memory_term(resource: str, name: str, nbytes: float, explanation: str) -> Term:
    return Term(resource, name, nbytes / GIB, explanation)

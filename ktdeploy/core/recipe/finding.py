"""Finding: one violation (or warning) in a recipe, located by dotted key path, file and line."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Finding:
    severity: Severity
    path: str               # dotted key path, e.g. "train.kt_config.kt_weight_path"
    message: str            # what is wrong
    fix: str = ""           # how to fix it
    rule: str = ""          # id of the rule that produced it
    file: str | None = None
    line: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]

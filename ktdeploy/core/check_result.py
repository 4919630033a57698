"""CheckResult: the one shape every check returns (doctor, image agent, up, ansible, testinfra)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ktdeploy.core.check_names import CheckName

Status = Literal["pass", "warn", "fail", "skip"]


class CheckResult(BaseModel):
    name: CheckName = Field(description="Stable dotted id of the check, e.g. 'cpu.amx.tile_exec'.")
    status: Status
    detail: str = Field("", description="What was found, in one or two sentences.")
    fix: str = Field("", description="What to do about it (empty when passing).")
    layer: str | None = Field(None, description="Where it was observed: host, vm, container.")
    data: dict[str, Any] = Field(default_factory=dict, description="Machine-readable figures behind the verdict.")


def worst(results: list[CheckResult]) -> Status:
    order = {"fail": 3, "warn": 2, "pass": 1, "skip": 0}
    return max((r.status for r in results), key=order.__getitem__, default="pass")

"""The run's ETA (pure): from the plan's step time until steps are measured, then from the measured step time;
the plan-vs-measured ratio is what the run record keeps (status.json ``eta``, the record's ``eta.json``), with the
time model that planned it, so that `ktdeploy plan --from-run` can scale a later plan for that host by it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def hms(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}"


@dataclass
class Eta:
    planned_step_s: float | None
    planned_tokens_per_s: float | None = None
    first_step: int | None = None
    first_t: float | None = None
    measured_step_s: float | None = None
    said_tenth: int = -1
    time_model: str | None = None       # the time model that planned it (core/sizing/throughput.time_model_id)

    def update(self, step: int, now: float) -> None:
        """A new step seen at monotonic ``now``: the measured step time is the mean over the steps seen since the
        first one (the first step's warm-up stays out of it)."""
        if self.first_step is None or self.first_t is None or step < self.first_step:
            self.first_step, self.first_t = step, now
            return
        if step > self.first_step and now > self.first_t:
            self.measured_step_s = (now - self.first_t) / (step - self.first_step)

    def remaining_s(self, step: int, total: int) -> float | None:
        per = self.measured_step_s or self.planned_step_s
        return None if per is None or total <= 0 else max(0, total - step) * per

    def line(self, step: int, total: int) -> str | None:
        left = self.remaining_s(step, total)
        if left is None:
            return None
        if self.measured_step_s is None:
            return f"{hms(left)} left for {total - step} steps, from the plan ({self.planned_step_s:.2f} s per step)"
        text = f"{hms(left)} left for {total - step} steps, measured {self.measured_step_s:.2f} s per step"
        if self.planned_step_s:
            text += f" (plan {self.planned_step_s:.2f} s: measured/plan {self.ratio():.2f})"
        return text

    def due(self, step: int, total: int) -> bool:
        """Say the ETA once per tenth of the run (and at the first measured step): `up`'s output stays short."""
        tenth = (10 * step) // total if total > 0 else 0
        if tenth != self.said_tenth or (self.measured_step_s is not None and self.said_tenth < 0):
            self.said_tenth = tenth
            return True
        return False

    def ratio(self) -> float | None:
        if self.measured_step_s is None or not self.planned_step_s:
            return None
        return self.measured_step_s / self.planned_step_s

    def record(self) -> dict[str, Any]:
        r = self.ratio()
        return {"planned_step_s": _r(self.planned_step_s), "planned_tokens_per_s": _r(self.planned_tokens_per_s),
                "measured_step_s": _r(self.measured_step_s), "measured_over_planned": _r(r),
                "time_model": self.time_model}


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def status_eta(eta: object, progress: object) -> str | None:
    """`status`'s ETA line from status.json's ``eta`` and the live trainer-log entry (either may be absent or
    forged: then no line)."""
    if not isinstance(eta, Mapping) or not isinstance(progress, Mapping):
        return None
    step, total = progress.get("current_steps"), progress.get("total_steps")
    if not isinstance(step, int) or not isinstance(total, int) or total <= 0 or step > total:
        return None
    per = eta.get("measured_step_s") or eta.get("planned_step_s")
    if not isinstance(per, int | float) or per <= 0:
        return None
    src = "measured" if eta.get("measured_step_s") else "planned"
    text = f"ETA {hms((total - step) * per)} ({total - step} steps x {per:.2f} s, {src})"
    planned, ratio = eta.get("planned_step_s"), eta.get("measured_over_planned")
    if src == "measured" and isinstance(planned, int | float) and isinstance(ratio, int | float):
        text += f"; plan said {planned:.2f} s per step (measured/plan {ratio:.2f})"
    return text

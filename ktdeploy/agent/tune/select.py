"""Pick the best measured setting that fits the memory plan (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ktdeploy.agent.tune.candidates import Candidate


@dataclass
class Trial:
    candidate: Candidate
    tokens_per_s: float | None = None
    peak_host_rss_gib: float | None = None
    peak_gpu_gib: float | None = None
    seconds: float = 0.0
    status: str = "pending"        # ok | stopped-early | failed | skipped-budget
    note: str = ""
    steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"setting": self.candidate.to_json(), "label": self.candidate.label(), "tokens_per_s": self.tokens_per_s,
                "peak_host_rss_gib": self.peak_host_rss_gib, "peak_gpu_gib": self.peak_gpu_gib,
                "seconds": round(self.seconds, 1), "status": self.status, "note": self.note, "steps": self.steps}


def should_stop_early(rate_so_far: float | None, best_rate: float | None, ratio: float = 0.6) -> bool:
    """A candidate already below ``ratio`` × the best steady rate after its first measured steps is clearly worse."""
    return rate_so_far is not None and best_rate is not None and rate_so_far < ratio * best_rate


def choose(trials: list[Trial], host_memory_limit_gib: float | None, gpu_memory_limit_gib: float | None) -> Trial | None:
    """The fastest completed trial whose measured peaks fit the limits (None when none fits)."""
    ok = [t for t in trials if t.status == "ok" and t.tokens_per_s]
    fits = [t for t in ok
            if (host_memory_limit_gib is None or t.peak_host_rss_gib is None or t.peak_host_rss_gib <= host_memory_limit_gib)
            and (gpu_memory_limit_gib is None or t.peak_gpu_gib is None or t.peak_gpu_gib <= gpu_memory_limit_gib)]
    return max(fits, key=lambda t: t.tokens_per_s or 0.0, default=None)  # all set: ok filters on it

"""The side-by-side summary of one evaluation (pure): per model (``tuned``, ``base``) the counts, LlamaFactory's
metric means and the latency figures, and the tuned-minus-base difference on the samples both answered."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ktdeploy.core.eval.score import METRICS, mean_scores

SIDES = ("tuned", "base")


@dataclass
class Answer:
    """One model's answer to one sample (what the JSONL keeps)."""

    text: str | None = None                 # None: no answer (refused, timed out, malformed)
    error: str | None = None
    latency_s: float | None = None
    completion_tokens: int | None = None    # the server's usage count, when it gives one
    scores: dict[str, float] | None = None
    ref_logprob: float | None = None        # mean token log-likelihood of the reference, where the server gives it

    @property
    def tokens_per_s(self) -> float | None:
        if not self.completion_tokens or not self.latency_s or self.latency_s <= 0:
            return None
        return round(self.completion_tokens / self.latency_s, 2)

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if v is not None}
        if self.tokens_per_s is not None:
            d["tokens_per_s"] = self.tokens_per_s
        return d


@dataclass
class SampleResult:
    id: str
    prompt: str
    reference: str | None
    answers: dict[str, Answer] = field(default_factory=dict)   # side -> answer

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "prompt": self.prompt, "reference": self.reference}
        for side, a in self.answers.items():
            d[side] = a.to_json()
        if all(s in self.answers and self.answers[s].scores for s in SIDES):
            d["delta"] = {k: round(self.answers["tuned"].scores[k] - self.answers["base"].scores[k], 4)  # type: ignore[index]
                          for k in METRICS}
        return d


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def side_summary(results: Sequence[SampleResult], side: str) -> dict[str, Any]:
    answers = [r.answers[side] for r in results if side in r.answers]
    ok = [a for a in answers if a.text is not None]
    scored = [a.scores for a in ok if a.scores is not None]
    lat = [a.latency_s for a in ok if a.latency_s is not None]
    tps = [t for a in ok if (t := a.tokens_per_s) is not None]
    lp = [a.ref_logprob for a in ok if a.ref_logprob is not None]
    out: dict[str, Any] = {"samples": len(answers), "answered": len(ok), "failed": len(answers) - len(ok),
                           "scored": len(scored), "metrics": mean_scores(scored)}
    if lat:
        out["latency_s"] = {"mean": round(statistics.fmean(lat), 3), "p50": round(_percentile(lat, 0.5), 3),
                            "p95": round(_percentile(lat, 0.95), 3)}
    if tps:
        out["tokens_per_s"] = round(statistics.fmean(tps), 2)
    if lp:
        out["ref_logprob"] = round(statistics.fmean(lp), 4)
    errors: dict[str, int] = {}
    for a in answers:
        if a.error:
            kind = a.error.split(":", 1)[0]
            errors[kind] = errors.get(kind, 0) + 1
    if errors:
        out["errors"] = errors
    return out


def summarize(results: Sequence[SampleResult], *, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The evaluation's summary (summary.json): meta (endpoints, models, dataset), per side, and the difference."""
    sides = [s for s in SIDES if any(s in r.answers for r in results)]
    out: dict[str, Any] = {**(meta or {}), "samples": len(results),
                           "no_reference": sum(1 for r in results if r.reference is None)}
    for s in sides:
        out[s] = side_summary(results, s)
    if len(sides) == 2:
        paired = [r for r in results if all(r.answers.get(s) and r.answers[s].scores for s in SIDES)]
        tuned = mean_scores([r.answers["tuned"].scores for r in paired])   # type: ignore[misc]
        base = mean_scores([r.answers["base"].scores for r in paired])     # type: ignore[misc]
        out["delta"] = {"paired": len(paired), **{k: round(tuned[k] - base[k], 4) for k in tuned}}
    return out


def below(summary: Mapping[str, Any], metric: str, threshold: float) -> str | None:
    """Why the tuned model's ``metric`` fails ``threshold`` (None when it passes)."""
    tuned = summary.get("tuned") or {}
    value = (tuned.get("metrics") or {}).get(metric)
    if value is None:
        return f"no {metric} score for the tuned model (no sample was answered and scored)"
    if value < threshold:
        return f"tuned {metric} {value:.2f} < deploy.eval.fail_below {threshold:g}"
    return None

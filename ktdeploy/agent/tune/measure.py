"""Throughput and memory from what a trial leaves behind (pure).

LlamaFactory's LogCallback writes one JSON line per logging step to ``trainer_log.jsonl`` with
``current_steps``, ``total_tokens`` (with ``include_num_input_tokens_seen``) and ``throughput`` = total_tokens /
seconds since training started, and with ``RECORD_VRAM=1`` the peak ``vram_allocated``/``vram_reserved`` in GiB.
Seconds since start = total_tokens / throughput, so the steady rate between two lines is Δtokens / Δseconds —
this leaves the warm-up steps (kernel compilation, first allocation) out of the figure.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    step: int
    tokens: float
    seconds: float
    loss: float | None
    vram_gib: float | None


def parse_log(text: str) -> list[Sample]:
    out = []
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written right now
        if not isinstance(d, dict):
            continue
        tok, thr = d.get("total_tokens"), d.get("throughput")
        if not isinstance(tok, (int, float)) or not isinstance(thr, (int, float)) or thr <= 0:
            continue
        vram = d.get("vram_reserved", d.get("vram_allocated"))
        out.append(Sample(int(d.get("current_steps", 0)), float(tok), float(tok) / float(thr),
                          d.get("loss") if isinstance(d.get("loss"), (int, float)) else None,
                          float(vram) if isinstance(vram, (int, float)) else None))
    return out


def steady_tokens_per_s(samples: list[Sample], warmup_steps: int) -> float | None:
    """Tokens/s between the last sample at or before ``warmup_steps`` and the last sample."""
    before = [s for s in samples if s.step <= warmup_steps]
    after = [s for s in samples if s.step > warmup_steps]
    if not before or not after:
        return None
    a, b = before[-1], after[-1]
    if b.seconds <= a.seconds:
        return None
    return (b.tokens - a.tokens) / (b.seconds - a.seconds)


def peak_vram_gib(samples: list[Sample]) -> float | None:
    vals = [s.vram_gib for s in samples if s.vram_gib is not None]
    return max(vals) if vals else None


_BOX = "│╭╮╰╯─┃━ \t|"
_EXC = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): .*")


def failure_reason(log: str, limit: int = 300) -> str:
    """The line that says why a trial's `ktdeploy train` failed: the last exception line of its log, else the
    last lines that are not rich-panel borders."""
    lines = [ln.strip(_BOX) for ln in log.splitlines()]
    lines = [ln for ln in lines if ln]
    for ln in reversed(lines):
        if _EXC.match(ln):
            return ln[:limit]
    return " | ".join(lines[-3:])[-limit:]

"""LlamaFactory's ``trainer_log.jsonl`` (pure): one parser for everything that reads it — the controller's
follow, `up`'s progress lines and ``ktdeploy status`` (``describe``), the agent's tune trials (throughput, peak
VRAM) — and the one steady-state tokens/s formula (also used for ``ktdeploy train``'s summary from its own
metrics.jsonl).

LlamaFactory's LogCallback appends one JSON object per logging step to ``<output_dir>/trainer_log.jsonl``
with ``current_steps``, ``total_steps``, ``loss``, ``lr``, ``epoch``, ``percentage``, ``elapsed_time``,
``remaining_time`` (H:MM:SS strings) and, when the Trainer counts input tokens, ``throughput`` (tokens/s
since this launch) and ``total_tokens``; with ``RECORD_VRAM=1`` also the peak ``vram_allocated`` /
``vram_reserved`` in GiB. Keys whose value is None are left out. A resumed run appends to the same file, so
steps continue from the checkpoint. Seconds since the launch = total_tokens / throughput, so the steady rate
between two lines is Δtokens / Δseconds: that leaves the warm-up steps (kernel compilation, first allocation)
out of the figure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ktdeploy.core.safeio import parse_json


@dataclass(frozen=True)
class LogEntry:
    current_steps: int
    total_steps: int
    loss: float | None = None
    lr: float | None = None
    epoch: float | None = None
    percentage: float | None = None
    elapsed_time: str | None = None
    remaining_time: str | None = None
    throughput: float | None = None
    total_tokens: int | None = None
    vram_gib: float | None = None          # RECORD_VRAM=1: vram_reserved (else vram_allocated), GiB

    @property
    def seconds(self) -> float | None:
        """Seconds since this launch (total_tokens / throughput), when the Trainer counts tokens."""
        if self.total_tokens is None or not self.throughput or self.throughput <= 0:
            return None
        return self.total_tokens / self.throughput

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def describe(e: LogEntry | None) -> str:
    """One line: 'step 40/100 (40.0%)  loss 1.2345  1234 tok/s  eta 0:01:05' (a progress line of `up`, `status`)."""
    if e is None:
        return "waiting for the first log line"
    parts = [f"step {e.current_steps}/{e.total_steps}"]
    if e.percentage is not None:
        parts[0] += f" ({e.percentage:.1f}%)"
    if e.loss is not None:
        parts.append(f"loss {e.loss:.4f}")
    if e.throughput is not None:
        parts.append(f"{e.throughput:.0f} tok/s")
    if e.remaining_time:
        parts.append(f"eta {e.remaining_time}")
    return "  ".join(parts)


def parse_line(line: str) -> LogEntry | None:
    """One log line; None for a blank, torn (still being written) or non-training line (eval progress has no loss
    but still counts steps, so it is kept when it has step counters)."""
    line = line.strip()
    if not line:
        return None
    try:
        d = parse_json(line)
    except ValueError:
        return None
    if not isinstance(d, dict) or "current_steps" not in d or "total_steps" not in d:
        return None

    def num(key: str, cast: Callable[[Any], Any] = float) -> Any:
        v = d.get(key)
        try:
            return cast(v) if v is not None else None
        except (TypeError, ValueError):
            return None

    return LogEntry(current_steps=int(d["current_steps"]), total_steps=int(d["total_steps"]), loss=num("loss"),
                    lr=num("lr"), epoch=num("epoch"), percentage=num("percentage"),
                    elapsed_time=d.get("elapsed_time"), remaining_time=d.get("remaining_time"),
                    throughput=num("throughput"), total_tokens=num("total_tokens", int),
                    vram_gib=num("vram_reserved") if d.get("vram_reserved") is not None else num("vram_allocated"))


def parse_log(text: str) -> list[LogEntry]:
    return [e for e in (parse_line(line) for line in text.splitlines()) if e is not None]


def latest(text: str) -> LogEntry | None:
    """The last complete entry (a torn last line is ignored until it is finished)."""
    entries = parse_log(text)
    return entries[-1] if entries else None


def last_loss(text: str) -> float | None:
    for e in reversed(parse_log(text)):
        if e.loss is not None:
            return e.loss
    return None


def hms_seconds(text: str | None) -> int | None:
    """'1 day, 2:03:04' / '0:01:05' (str(timedelta)) -> seconds."""
    if not text:
        return None
    days = 0
    t = text.strip()
    if "day" in t:
        head, _, t = t.partition(",")
        try:
            days = int(head.split()[0])
        except (ValueError, IndexError):
            return None
    parts = t.strip().split(":")
    try:
        nums = [int(float(p)) for p in parts]
    except ValueError:
        return None
    s = 0
    for n in nums:
        s = s * 60 + n
    return days * 86400 + s


def steady_rate(first: tuple[float, float], last: tuple[float, float]) -> float | None:
    """Tokens/s between two (cumulative tokens, cumulative seconds) points; None when no time or no tokens passed."""
    dtok, dt = last[0] - first[0], last[1] - first[1]
    return dtok / dt if dt > 0 and dtok > 0 else None


def steady_tokens_per_s(entries: Sequence[LogEntry], warmup_steps: int) -> float | None:
    """Tokens/s between the last entry at or before ``warmup_steps`` and the last entry (entries that carry
    tokens and throughput only)."""
    timed = [e for e in entries if e.seconds is not None]
    before = [e for e in timed if e.current_steps <= warmup_steps]
    after = [e for e in timed if e.current_steps > warmup_steps]
    if not before or not after:
        return None
    a, b = before[-1], after[-1]
    return steady_rate((float(a.total_tokens or 0), a.seconds or 0.0), (float(b.total_tokens or 0), b.seconds or 0.0))


def peak_vram_gib(entries: Sequence[LogEntry]) -> float | None:
    vals = [e.vram_gib for e in entries if e.vram_gib is not None]
    return max(vals) if vals else None

"""Follow a training run: parse LlamaFactory's ``trainer_log.jsonl`` (pure) and draw a rich progress bar.

LlamaFactory's LogCallback appends one JSON object per logging step to ``<output_dir>/trainer_log.jsonl``
with ``current_steps``, ``total_steps``, ``loss``, ``lr``, ``epoch``, ``percentage``, ``elapsed_time``,
``remaining_time`` (H:MM:SS strings) and, when the Trainer counts input tokens, ``throughput`` (tokens/s
since this launch) and ``total_tokens``. Keys whose value is None are left out. A resumed run appends to
the same file, so steps continue from the checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ktdeploy.core.checkpoints import TRAINER_LOG  # noqa: F401  (re-exported: the log this module follows)


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

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def parse_line(line: str) -> LogEntry | None:
    """One log line; None for a blank, torn (still being written) or non-training line (eval progress has no loss
    but still counts steps, so it is kept when it has step counters)."""
    line = line.strip()
    if not line:
        return None
    try:
        d = json.loads(line)
    except ValueError:
        return None
    if not isinstance(d, dict) or "current_steps" not in d or "total_steps" not in d:
        return None

    def num(key, cast=float):
        v = d.get(key)
        try:
            return cast(v) if v is not None else None
        except (TypeError, ValueError):
            return None

    return LogEntry(current_steps=int(d["current_steps"]), total_steps=int(d["total_steps"]), loss=num("loss"),
                    lr=num("lr"), epoch=num("epoch"), percentage=num("percentage"),
                    elapsed_time=d.get("elapsed_time"), remaining_time=d.get("remaining_time"),
                    throughput=num("throughput"), total_tokens=num("total_tokens", int))


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


def describe(e: LogEntry | None) -> str:
    """One line: 'step 40/100 (40.0%) loss 1.2345 1234 tok/s eta 0:01:05'."""
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


# -- the progress bar (I/O) ---------------------------------------------------------------------
class ProgressView:
    """A rich progress bar fed with LogEntry snapshots (step/total, loss, tokens/s, ETA)."""

    def __init__(self, title: str, console=None):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss [cyan]{task.fields[loss]}"), TextColumn("[magenta]{task.fields[tps]}"),
            TextColumn("eta [green]{task.fields[eta]}"), TextColumn("[dim]{task.fields[state]}"),
            console=console, transient=False, refresh_per_second=4)
        self._task = self._progress.add_task(title, total=None, loss="-", tps="- tok/s", eta="-", state="starting")

    def __enter__(self):
        self._progress.start()
        return self

    def __exit__(self, *exc):
        self._progress.stop()
        return False

    def update(self, entry: LogEntry | None, state: str = "") -> None:
        fields = {"state": state}
        kw = {}
        if entry is not None:
            kw = {"completed": entry.current_steps, "total": entry.total_steps or None}
            fields.update(loss=f"{entry.loss:.4f}" if entry.loss is not None else "-",
                          tps=f"{entry.throughput:.0f} tok/s" if entry.throughput is not None else "- tok/s",
                          eta=entry.remaining_time or "-")
        self._progress.update(self._task, **kw, **fields)

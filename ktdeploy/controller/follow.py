"""Follow a training run: parse LlamaFactory's ``trainer_log.jsonl`` (pure) and draw a rich progress bar.

LlamaFactory's LogCallback appends one JSON object per logging step to ``<output_dir>/trainer_log.jsonl``
with ``current_steps``, ``total_steps``, ``loss``, ``lr``, ``epoch``, ``percentage``, ``elapsed_time``,
``remaining_time`` (H:MM:SS strings) and, when the Trainer counts input tokens, ``throughput`` (tokens/s
since this launch) and ``total_tokens``. Keys whose value is None are left out. A resumed run appends to
the same file, so steps continue from the checkpoint.
"""

from __future__ import annotations

from typing import Any, Literal

from ktdeploy.core.trainer_log import LogEntry


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

    def __init__(self, title: str, console: Any = None) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss [cyan]{task.fields[loss]}"), TextColumn("[magenta]{task.fields[tps]}"),
            TextColumn("eta [green]{task.fields[eta]}"), TextColumn("[dim]{task.fields[state]}"),
            console=console, transient=False, refresh_per_second=4)
        self._task = self._progress.add_task(title, total=None, loss="-", tps="- tok/s", eta="-", state="starting")

    def __enter__(self) -> ProgressView:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self._progress.stop()
        return False

    def update(self, entry: LogEntry | None, state: str = "") -> None:
        fields: dict[str, Any] = {"state": state}   # the task's own fields, shown by the columns
        kw: dict[str, Any] = {}
        if entry is not None:
            kw = {"completed": entry.current_steps, "total": entry.total_steps or None}
            fields.update(loss=f"{entry.loss:.4f}" if entry.loss is not None else "-",
                          tps=f"{entry.throughput:.0f} tok/s" if entry.throughput is not None else "- tok/s",
                          eta=entry.remaining_time or "-")
        self._progress.update(self._task, **kw, **fields)

"""Progress of a long step (image build, wheel download, prepare-weights, merge, the image check): on a terminal a
rich bar — done/total, elapsed, the ETA — with the step's own lines printed above it; elsewhere (a log, a pipe,
CI) plain lines only, one per tick that says something, never a bar's control sequences.

The code doing the work reports ``tick(done, total, what)`` and ``say(text)``; it never knows which it got."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.text import Text


def hms(seconds: float) -> str:
    s = int(max(0.0, seconds) + 0.5)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"


class Ticker:
    """One step's n/N progress. ``plain_ticks``: where there is no terminal, print a line per tick (off when the
    step's own ``say`` lines already tell each unit, as prepare-weights' and merge's do). ``eta``: a known
    estimate of the remaining seconds (the last build's timings) instead of rich's from the rate so far."""

    def __init__(self, title: str, console: Console, *, total: int | None = None, plain_ticks: bool = True,
                 quiet: bool = False, rate_eta: bool = True) -> None:
        self.title, self.console, self.total, self.plain_ticks = title, console, total, plain_ticks and not quiet
        self.rate_eta = rate_eta   # off where units differ too much in size for the rate so far to say (a build)
        self.live = console.is_terminal and not console.is_dumb_terminal and not quiet
        self._progress: Any = None
        self._task: Any = None
        self._t0 = time.monotonic()

    def __enter__(self) -> Ticker:
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TextColumn("{task.fields[eta]}"),
                                      TextColumn("[dim]{task.fields[what]}"), console=self.console,
                                      transient=True, refresh_per_second=4)
            self._task = self._progress.add_task(self.title, total=self.total, eta="", what="")
            self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def tick(self, done: int, total: int | None = None, what: str = "", eta_s: float | None = None) -> None:
        total = total if total is not None else self.total
        self.total = total
        if eta_s is None and total and done and self.rate_eta:
            eta_s = (time.monotonic() - self._t0) / done * (total - done)
        eta = f"eta {hms(eta_s)}" if eta_s is not None and total and done < total else ""
        if self._progress is not None:
            self._progress.update(self._task, completed=done, total=total, eta=eta, what=what[-60:])
        elif self.plain_ticks:
            of = f"/{total}" if total else ""
            line = f"{self.title} {done}{of}" + (f": {what}" if what else "") + (f" ({eta})" if eta else "")
            self.console.print(Text(line), highlight=False, soft_wrap=True)

    def say(self, text: str) -> None:
        """A line of the step's own (above the bar on a terminal)."""
        self.console.print(Text(text), highlight=False, soft_wrap=True)

    __call__ = say   # the work's ``say`` (core/ticks.py): its lines, and ``tick`` for the bar


@contextmanager
def waiting(console: Console, text: str, *, plain: bool = True) -> Iterator[None]:
    """A wait of unknown length (a container's check): a spinner with the time so far on a terminal; elsewhere
    (``plain``) the line that it started, and one with how long it took."""
    t0 = time.monotonic()
    if console.is_terminal and not console.is_dumb_terminal:
        with console.status(Text(text), spinner="dots"):
            yield
        return
    if not plain:
        yield
        return
    console.print(Text(f"{text} …"), highlight=False, soft_wrap=True)
    yield
    console.print(Text(f"{text}: {hms(time.monotonic() - t0)}"), highlight=False, soft_wrap=True)

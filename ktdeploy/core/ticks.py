"""How long work tells its progress without knowing who listens (pure): it calls ``say(text)`` for its lines and
``tick(say, done, total, what)`` per unit done (a layer, a shard, a wheel). A ``say`` that draws progress — the
CLI's ``cli/progress.Ticker``, a bar on a terminal — has a ``tick`` method and gets the count; a plain ``say``
(``print``, a log) gets only the lines, so the work's output stays line-based wherever no terminal is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def tick(say: Callable[[str], None] | Any, done: int, total: int | None, what: str = "") -> None:
    counter = getattr(say, "tick", None)
    if callable(counter):
        counter(done, total, what)

"""Throughput and memory from what a trial leaves behind (pure): trainer_log.jsonl is parsed and the steady
tokens/s computed by core/trainer_log.py (the same parser the controller's follow uses); the trial's failure
reason is read from its log here."""

from __future__ import annotations

import re

from ktdeploy.core.trainer_log import LogEntry
from ktdeploy.core.trainer_log import parse_log as parse_entries


def parse_log(text: str) -> list[LogEntry]:
    """The lines that carry tokens and throughput (the ones a rate can be measured from)."""
    return [e for e in parse_entries(text) if e.seconds is not None]


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

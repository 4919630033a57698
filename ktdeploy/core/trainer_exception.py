"""The trainer's own last exception, read from a container's log: what a crash report leads with, instead of the
launcher's boilerplate (torchrun's ChildFailedError, accelerate's `Command ... returned non-zero exit status`).

Pure: a log's text in, ``TrainerException`` (type, message, the innermost file:line) or None out. A traceback may
carry a rank prefix (``[rank0]: ``) on every line, as torchrun writes it."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PREFIX = re.compile(r"^(?:\[(?:rank|default)\d+\]:\s?|\d+: )")
_START = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
_EXC = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure|Warning|Stop\w*)|[A-Za-z_][\w.]*Error\w*)"
                  r"(?::\s?(.*))?$")
# what a launcher raises because its child failed: never the reason itself
LAUNCHER = ("ChildFailedError", "CalledProcessError", "SignalException")
MAX_MESSAGE = 300


@dataclass(frozen=True)
class TrainerException:
    type: str
    message: str
    where: str     # "path/to/file.py:123" of the innermost frame, or "" when the traceback named none

    def line(self) -> str:
        at = f" ({self.where})" if self.where else ""
        return f"{self.type}: {self.message}{at}" if self.message else f"{self.type}{at}"


def _tracebacks(lines: list[str]) -> list[tuple[list[tuple[str, str]], str, str]]:
    """(frames as (file, line), exception type, message) of every complete traceback in ``lines``."""
    out = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != _START:
            i += 1
            continue
        frames: list[tuple[str, str]] = []
        j = i + 1
        while j < len(lines):
            ln = lines[j]
            if (m := _FRAME.match(ln)):
                frames.append((m.group(1), m.group(2)))
            elif ln.strip() and not ln.startswith((" ", "\t")):
                if (e := _EXC.match(ln.strip())):
                    out.append((frames, e.group(1), (e.group(2) or "").strip()))
                break
            j += 1
        i = j + 1
    return out


def last_exception(log: str) -> TrainerException | None:
    """The last exception in ``log`` that is not a launcher's report of its child failing; else the last one."""
    lines = [_PREFIX.sub("", ln.rstrip("\r")) for ln in log.splitlines()]
    found = _tracebacks(lines)
    if not found:
        return None
    own = [t for t in found if t[1].rsplit(".", 1)[-1] not in LAUNCHER]
    frames, typ, msg = (own or found)[-1]
    where = f"{frames[-1][0]}:{frames[-1][1]}" if frames else ""
    if len(msg) > MAX_MESSAGE:
        msg = msg[:MAX_MESSAGE] + "…"
    return TrainerException(type=typ, message=msg, where=where)

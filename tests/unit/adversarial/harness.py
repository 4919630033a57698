"""Harness of the standing adversarial suite: run one CLI call in-process and check every invariant.

Invariants (docs/security.md): the exit code is a documented one (README "Exit codes") and never 70; no
traceback or "internal error" in the output; the call ends within DEADLINE_S; nothing is written outside the
intended target (the sandbox tree is compared before/after); no secret appears in any output or record; no
terminal control character (C0/C1, ESC, DEL, bidi overrides: core.terminal_text.CONTROL) appears in the output — the
calls run without a terminal, so rich adds no styling and any such character came from the input (issue 35).

Each class counts how many generated inputs ran and how many broke an invariant (TALLY); set
KTDEPLOY_ADV_REPORT=FILE to get the counts as JSON (the figures in the issue-16 report were made that way).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import resource
import signal
import stat
import time
from pathlib import Path

DOCUMENTED = {0, 1, 2, 3, 4, 5, 6, 7, 8, 130, 141, 143}
DEADLINE_S = 10       # CPU seconds one call may use (ITIMER_PROF: a loaded machine does not stretch it)
HANG_S = 120          # wall seconds: a call that waits on something forever
MAX_GROWTH_KIB = 512 << 10  # one call may raise the process's peak RSS by at most 512 MiB
SECRET = "S3cr3tPW"
TALLY: dict[str, list[int]] = {}
EXAMPLES: dict[str, list[str]] = {}


def _report() -> None:
    path = os.environ.get("KTDEPLOY_ADV_REPORT")
    if path and TALLY:
        with open(path, "w") as f:
            json.dump({k: {"ran": v[0], "failed": v[1], "examples": EXAMPLES.get(k, [])[:5]} for k, v in TALLY.items()},
                      f, indent=2)


atexit.register(_report)


class _Deadline(BaseException):
    pass


def _alarm(signum, frame):
    raise _Deadline()


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root (not following links): kind, size, mode, mtime, link target."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            link = os.readlink(p) if stat.S_ISLNK(st.st_mode) else None
            reg = stat.S_ISREG(st.st_mode)  # a folder's mtime changes when an allowed child appears: not compared
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), st.st_size if reg else 0,
                                             st.st_mode, st.st_mtime_ns if reg else 0, link)
    return out


def invoke(args: list[str], *, cwd: Path) -> tuple[int, str, float]:
    """``ktdeploy ARGS`` in-process (the console entry point, with its exception mapping). A call that uses more
    than DEADLINE_S of CPU, waits past HANG_S or raises the peak RSS by more than MAX_GROWTH_KIB gets a
    non-documented rc ("timeout"/"memory")."""
    from ktdeploy.cli import main

    out = io.StringIO()
    old_cwd = os.getcwd()
    old = signal.signal(signal.SIGALRM, _alarm)
    old_prof = signal.signal(signal.SIGPROF, _alarm)
    signal.setitimer(signal.ITIMER_PROF, DEADLINE_S)
    signal.alarm(HANG_S)
    t0 = time.monotonic()
    peak0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rc: object = 0
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                main([str(a) for a in args])
            except SystemExit as e:
                rc = e.code if e.code is not None else 0
    except _Deadline:
        rc = "timeout"
    except BaseException as e:  # noqa: BLE001 - anything escaping main() is a failure of the contract
        rc = f"escaped {type(e).__name__}: {e}"
    finally:
        signal.alarm(0)
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGALRM, old)
        signal.signal(signal.SIGPROF, old_prof)
        os.chdir(old_cwd)
    if isinstance(rc, str) and rc.isdigit():
        rc = int(rc)
    if resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak0 > MAX_GROWTH_KIB:
        rc = f"memory (peak RSS grew by more than {MAX_GROWTH_KIB >> 10} MiB; exit {rc!r})"
    return rc, out.getvalue(), time.monotonic() - t0


def problems(rc, output: str, *, secrets: tuple[str, ...] = (SECRET,), records: Path | None = None,
             before: dict | None = None, after: dict | None = None, allowed: tuple[str, ...] = ()) -> list[str]:
    bad = []
    if rc not in DOCUMENTED:
        bad.append(f"exit {rc!r} is not documented")
    if "Traceback (most recent call last)" in output:
        bad.append("traceback in output")
    if "internal error" in output:
        bad.append("internal error")
    from ktdeploy.core.terminal_text import CONTROL

    controls = sorted({repr(c) for c in CONTROL.findall(output)})
    if controls:
        bad.append(f"control character(s) {', '.join(controls[:5])} printed")
    for s in secrets:
        if s and s in output:
            bad.append("secret in output")
        if s and records is not None and records.exists():
            for dirpath, _, files in os.walk(records):
                for name in files:
                    p = os.path.join(dirpath, name)
                    try:
                        if os.path.isfile(p) and s.encode() in open(p, "rb").read(1 << 20):
                            bad.append(f"secret in record {os.path.relpath(p, records)}")
                    except OSError:
                        pass
    if before is not None and after is not None:
        changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
        changed = {k for k in changed if not any(k == a or k.startswith(a + os.sep) for a in allowed)}
        if changed:
            bad.append(f"wrote outside the target: {sorted(changed)[:3]}")
    return bad


def tally(cls: str, label: str, bad: list[str]) -> None:
    t = TALLY.setdefault(cls, [0, 0])
    t[0] += 1
    if bad:
        t[1] += 1
        EXAMPLES.setdefault(cls, []).append(f"{label[:160]!r}: {'; '.join(bad)[:200]}")


def failures(cls: str) -> list[str]:
    return EXAMPLES.get(cls, [])

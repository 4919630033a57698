"""Run a training command, stream its output, and sample the resources of its process tree.

Peak host RSS is summed over the launcher and every descendant (accelerate spawns the trainer,
kt-kernel's workers are threads of it), read from /proc every ``interval`` seconds - the same
measure as the cookbook's "peak CPU RSS for the training process tree" - and bounded from above by the
kernel's per-process high-water marks. The child writes its output to the log file itself; this
process only reads it back, so a slow or descheduled relay never holds the trainer up.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ktdeploy.core.safeio import appending

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _children(proc_root: Path) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in proc_root.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may contain spaces/parens: split after the last ')'
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d.name))
    return kids


def _task_children(pid: int, proc_root: Path) -> list[int] | None:
    """Children from /proc/PID/task/*/children (cheap); None where the kernel lacks that file."""
    kids: list[int] = []
    try:
        tasks = list((proc_root / str(pid) / "task").iterdir())
    except OSError:
        return []
    for t in tasks:
        try:
            kids += [int(x) for x in (t / "children").read_text().split()]
        except FileNotFoundError:
            if not (t / "children").exists() and t.exists():
                return None
        except (OSError, ValueError):
            continue
    return kids


def tree_pids(root_pid: int, proc_root: Path = Path("/proc")) -> list[int]:
    """The process and all its descendants (walks /proc/PID/task/*/children, else one scan of /proc)."""
    out, todo, fast = [], [root_pid], True
    while todo and fast:
        pid = todo.pop()
        kids = _task_children(pid, proc_root)
        if kids is None:
            fast = False
            break
        out.append(pid)
        todo.extend(kids)
    if fast:
        return out
    by_parent = _children(proc_root)
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(by_parent.get(pid, []))
    return out


def rss_bytes(pid: int, proc_root: Path = Path("/proc")) -> int:
    try:
        fields = (proc_root / str(pid) / "statm").read_text().split()
        return int(fields[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def hwm_bytes(pid: int, proc_root: Path = Path("/proc")) -> int:
    """The kernel's peak resident set of one process (VmHWM), 0 when unreadable."""
    try:
        for line in (proc_root / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


def tree_rss_bytes(root_pid: int, proc_root: Path = Path("/proc")) -> int:
    return sum(rss_bytes(p, proc_root) for p in tree_pids(root_pid, proc_root))


@dataclass
class RunOutcome:
    rc: int
    wall_s: float
    peak_rss_bytes: int
    hwm_rss_bytes: int = 0
    tail: list[str] = field(default_factory=list)

    @property
    def peak_rss_gib(self) -> float:
        return self.peak_rss_bytes / 2**30


class _Peak:
    """Peak of the process tree's summed RSS, sampled, plus the kernel's per-process high-water marks
    (VmHWM, summed over every process seen): the sample can miss a spike between two ticks, the
    high-water sum cannot (it is an upper bound where processes peak at different times)."""

    def __init__(self, root_pid: int, proc_root: Path = Path("/proc")):
        self.root, self.proc_root = root_pid, proc_root
        self.peak = 0
        self.hwm: dict[int, int] = {}

    def sample(self) -> None:
        try:
            pids = tree_pids(self.root, self.proc_root)
            self.peak = max(self.peak, sum(rss_bytes(p, self.proc_root) for p in pids))
            for p in pids:
                h = hwm_bytes(p, self.proc_root)
                if h > self.hwm.get(p, 0):
                    self.hwm[p] = h
        except Exception:  # a process vanished mid-scan; the next sample is fine
            pass

    @property
    def hwm_sum(self) -> int:
        return sum(self.hwm.values())


def _idle_priority() -> object | None:
    """Put this (relay) process at SCHED_IDLE: it then only runs on a CPU nothing else wants. kt-kernel's
    workers hold nearly every core, and a preempted worker stalls the whole MoE step (a nice +5 relay cost
    ~10 % of a hand launch's tokens/s on the GPU machine). Returns what to restore, or None."""
    try:
        before = (os.sched_getscheduler(0), os.sched_getparam(0))
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return before
    except (AttributeError, OSError):
        try:
            os.nice(5)
        except OSError:
            pass
        return None


def _restore_priority(before: Any) -> None:   # what _idle_priority returned
    if before is not None:
        try:
            os.sched_setscheduler(0, before[0], before[1])
        except OSError:
            pass


def _read_tail(path: Path, lines: int, max_bytes: int = 256 * 1024) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    return text.rstrip("\n").split("\n")[-lines:] if text.strip() else []


def _exit_waiter(proc: subprocess.Popen[Any]) -> Callable[[float], None]:
    """A wait(seconds) that returns early when the child exits: one blocking select on a pidfd (Linux >= 5.3),
    else a plain sleep. Popen.wait(timeout) would instead wake this process every 50 ms."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return time.sleep

    def wait(seconds: float) -> None:
        try:
            select.select([fd], [], [], seconds)
        except (OSError, ValueError):
            time.sleep(seconds)

    weakref.finalize(wait, os.close, fd)
    return wait


def _kill_group(proc: subprocess.Popen[Any], first: int, grace: float) -> int:
    for sig in (first, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def run_streaming(argv: Sequence[str], *, env: dict[str, str], cwd: str | None, log_path: Path,
                  echo: IO[str] | None = sys.stdout, interval: float = 1.0, tail_lines: int = 40,
                  timeout: float | None = None, yield_cpu: bool = False) -> RunOutcome:
    """Run ``argv`` (no shell) in its own process group with its output going straight to ``log_path``.

    The child writes the log itself (no pipe: it never waits on this process). Every ``interval`` s this
    process samples the tree's RSS and, when ``echo`` is given, copies what the log gained since the last tick,
    in one read. With ``yield_cpu`` it runs at SCHED_IDLE meanwhile. With ``timeout`` the whole group gets
    SIGTERM (then SIGKILL) when it runs longer; rc is then 124.
    """
    t0 = time.monotonic()
    timed_out = False
    with appending(log_path, binary=True) as log:  # never through a link planted at the log
        start = log.tell()
        proc = subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    before = _idle_priority() if yield_cpu else None
    peak = _Peak(proc.pid)
    pos = start
    reader = open(log_path, "rb") if echo is not None else None

    def relay() -> None:
        nonlocal pos
        if reader is None or echo is None:  # reader is open exactly when echo is given
            return
        reader.seek(pos)
        chunk = reader.read()
        if chunk:
            pos += len(chunk)
            echo.write(chunk.decode("utf-8", "replace"))
            echo.flush()

    exited = _exit_waiter(proc)
    try:
        while True:
            peak.sample()
            relay()
            exited(interval)
            if (rc := proc.poll()) is not None:
                break
            if timeout and time.monotonic() - t0 > timeout:
                timed_out = True
                rc = _kill_group(proc, signal.SIGTERM, 10)
                break
        relay()
    except KeyboardInterrupt:
        # Stop the whole tree (accelerate + trainer) so no orphan keeps the GPU; the checkpoints stay.
        _kill_group(proc, signal.SIGINT, 30)
        raise
    finally:
        if reader is not None:
            reader.close()
        _restore_priority(before)
    if timed_out:
        rc = 124
    return RunOutcome(rc=rc, wall_s=time.monotonic() - t0, peak_rss_bytes=peak.peak, hwm_rss_bytes=peak.hwm_sum,
                      tail=_read_tail(log_path, tail_lines))

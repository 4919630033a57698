"""Run a training command, stream its output, and sample the resources of its process tree.

Peak host RSS is summed over the launcher and every descendant (accelerate spawns the trainer,
kt-kernel's workers are threads of it), read from /proc every ``interval`` seconds - the same
measure as the cookbook's "peak CPU RSS for the training process tree".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Sequence

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
    kids = _children(proc_root)
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def rss_bytes(pid: int, proc_root: Path = Path("/proc")) -> int:
    try:
        fields = (proc_root / str(pid) / "statm").read_text().split()
        return int(fields[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss_bytes(root_pid: int, proc_root: Path = Path("/proc")) -> int:
    return sum(rss_bytes(p, proc_root) for p in tree_pids(root_pid, proc_root))


@dataclass
class RunOutcome:
    rc: int
    wall_s: float
    peak_rss_bytes: int
    tail: list[str] = field(default_factory=list)

    @property
    def peak_rss_gib(self) -> float:
        return self.peak_rss_bytes / 2**30


class _Sampler(threading.Thread):
    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak = pid, interval, 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.peak = max(self.peak, tree_rss_bytes(self.pid))
            except Exception:  # a process vanished mid-scan; the next sample is fine
                pass
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


def run_streaming(argv: Sequence[str], *, env: dict[str, str], cwd: str | None, log_path: Path,
                  echo: IO[str] | None = sys.stdout, interval: float = 0.2, tail_lines: int = 40,
                  timeout: float | None = None, yield_cpu: bool = False) -> RunOutcome:
    """Run ``argv`` (no shell) in its own process group, tee its output to ``log_path`` and ``echo``.

    With ``timeout`` the whole group gets SIGTERM (then SIGKILL) when it runs longer; rc is then 124.
    With ``yield_cpu`` this (parent) process lowers its own priority once the child runs: kt-kernel's
    workers occupy nearly every core and a preempted worker stalls the whole MoE step.
    """
    t0 = time.monotonic()
    timed_out = threading.Event()
    tail: list[str] = []
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(list(argv), env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        if yield_cpu:
            try:
                os.nice(5)
            except OSError:
                pass
        sampler = _Sampler(proc.pid, interval)
        sampler.start()
        watchdog = None
        if timeout:
            def _expire() -> None:
                timed_out.set()
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.killpg(proc.pid, sig)
                    except ProcessLookupError:
                        return
                    try:
                        proc.wait(timeout=10)
                        return
                    except subprocess.TimeoutExpired:
                        continue
            watchdog = threading.Timer(timeout, _expire)
            watchdog.daemon = True
            watchdog.start()
        try:
            assert proc.stdout is not None
            for raw in iter(proc.stdout.readline, b""):
                log.write(raw)
                log.flush()
                line = raw.decode("utf-8", "replace")
                if echo is not None:
                    echo.write(line)
                    echo.flush()
                tail.append(line.rstrip("\n"))
                del tail[:-tail_lines]
            rc = proc.wait()
        except KeyboardInterrupt:
            # Stop the whole tree (accelerate + trainer) so no orphan keeps the GPU; the checkpoints stay.
            os.killpg(proc.pid, signal.SIGINT)
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
            raise
        finally:
            sampler.stop()
            if watchdog is not None:
                watchdog.cancel()
    if timed_out.is_set():
        rc = 124
    return RunOutcome(rc=rc, wall_s=time.monotonic() - t0, peak_rss_bytes=sampler.peak, tail=tail)

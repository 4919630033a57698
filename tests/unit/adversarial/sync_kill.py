"""Stopping an `up --sync-*` mid-copy (issue 45, class 4), shared by the local (unit) and SSH (integration) tests:
rsync slowed by a wrapper first on PATH (the real rsync, exec'd: same pid), the signal sent once the copy is under
way, and the processes that still name the upload's source folder."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

EXIT_OF = {signal.SIGTERM: 143, signal.SIGINT: 130}


def slow_rsync_path(bindir: Path, kib_per_s: int = 6000) -> str:
    """A PATH whose rsync is the real one with --bwlimit."""
    bindir.mkdir(exist_ok=True)
    (bindir / "rsync").write_text(f'#!/bin/sh\nexec {shutil.which("rsync")} --bwlimit={kib_per_s} "$@"\n')
    (bindir / "rsync").chmod(0o755)
    return f"{bindir}{os.pathsep}{os.environ['PATH']}"


def stop_mid_copy(p: subprocess.Popen, target: Path, sig: signal.Signals, *, started_bytes: int = 2 << 20) -> str:
    """Send ``sig`` to `up` once ``started_bytes`` have arrived under ``target``; its stderr. `up` must end with
    the code of that signal and no traceback."""
    try:
        deadline = time.monotonic() + 120
        while not target.exists() or sum(f.stat().st_size for f in target.rglob("*") if f.is_file()) < started_bytes:
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()[1][-1500:]
            time.sleep(0.05)
        p.send_signal(sig)
        _out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert "Traceback" not in err, err[-2000:]
    assert sig not in EXIT_OF or p.returncode == EXIT_OF[sig], (p.returncode, err[-1500:])
    return err


def processes_with(marker: str) -> list[int]:
    """Pids of this machine's processes whose command line holds ``marker``."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if marker.encode() in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                pass
    return out

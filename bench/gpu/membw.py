"""This machine's memory copy bandwidth (bench/gpu/membw_probe.c, built here with cc): recorded by every GPU
campaign (format_scale.campaign) beside its CPU model, so that a host's measured bandwidth can be set against the
GPU machine's when the time model's optimizer-streaming rate (`cpu_bytes_s`, assumed so far) is calibrated.

    python3 bench/gpu/membw.py [MiB]     # prints the probe's JSON line
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("membw_probe.c")


def measure(cap_mib: int | None = None, timeout: float = 90) -> dict[str, Any]:
    """The probe's JSON object, or {"error": why} (no compiler, a build or run that failed): never raises."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return {"error": "no C compiler (cc/gcc/clang)"}
    with tempfile.TemporaryDirectory(prefix="membw-") as tmp:      # private (0700), removed after the run
        exe = Path(tmp) / "membw_probe"
        built = subprocess.run([cc, "-O1", "-o", str(exe), str(SOURCE)], capture_output=True, text=True, timeout=timeout)
        if built.returncode != 0:
            return {"error": f"build failed: {built.stderr[-300:]}"}
        try:
            ran = subprocess.run([str(exe), *([str(cap_mib)] if cap_mib else [])], capture_output=True, text=True,
                                 timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"no answer in {timeout:.0f} s"}
    lines = [x for x in ran.stdout.splitlines() if x.startswith("{")]
    if ran.returncode != 0 or not lines:
        return {"error": f"rc {ran.returncode}: {(ran.stdout + ran.stderr)[-300:]}"}
    return json.loads(lines[-1])


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if sys.argv[1:] else None)))

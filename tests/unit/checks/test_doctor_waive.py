"""`ktdeploy doctor --waive`: an explicitly accepted failing check is shown and recorded, and no longer fails the
exit code — the CPU-only path (image builders, CI boxes) without hiding anything else."""

from __future__ import annotations

import json
import subprocess
import sys


def _doctor(*args):
    return subprocess.run([sys.executable, "-m", "ktdeploy", "doctor", "--json", *args], capture_output=True, text=True,
                          timeout=300)


def test_waiving_exactly_the_failures_turns_exit_1_into_0():
    first = _doctor()
    data = json.loads(first.stdout)
    failing = sorted({c["name"] for c in data["checks"] if c["status"] == "fail"})
    assert (first.returncode == 1) == bool(failing) and data["ok"] is (not failing)
    if not failing:
        return  # a host where every check passes: nothing to waive
    partial = _doctor(*[a for n in failing[:-1] for a in ("--waive", n)])
    assert partial.returncode == 1 and json.loads(partial.stdout)["ok"] is False   # one failure left
    full = _doctor(*[a for n in failing for a in ("--waive", n)])
    out = json.loads(full.stdout)
    assert full.returncode == 0 and out["ok"] is True and out["waived"] == failing
    # the waived checks are still reported as failing: waiving never rewrites a verdict
    assert sorted({c["name"] for c in out["checks"] if c["status"] == "fail"}) == failing

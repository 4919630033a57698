#!/usr/bin/env python3
"""Triton needs Python's headers: compile and run one Triton kernel with Python.h present vs hidden.

Runs on the GPU machine, OUTSIDE the image, with torch+triton installed (the image's stack):

    python bench/gpu/triton_headers.py --out bench/results/gpu/triton_headers.json

Each case runs in a fresh child process with an empty TRITON_CACHE_DIR, so Triton must compile its
launcher (driver.c, which #includes Python.h) at the first kernel launch. "hidden" points
sysconfig's include path (where Triton looks for Python.h) at an empty folder, which is what the
image's interpreter saw before the base installed python3.11-dev. Expected: present -> ok, the
kernel's result checked; hidden -> fails with "Python.h: No such file or directory".
What this cannot show: the same inside the container on a GPU host with docker
(`ktdeploy doctor --image REF` runs the kernel there).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

CHILD = r'''
import json, sys, sysconfig
hide = sys.argv[1] == "hidden"
if hide:
    real = sysconfig.get_paths
    def get_paths(*a, **k):
        p = dict(real(*a, **k)); p["include"] = p["platinclude"] = sys.argv[2]; return p
    sysconfig.get_paths = get_paths
import torch, triton, triton.language as tl

@triton.jit
def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=m) + tl.load(y_ptr + i, mask=m), mask=m)

x = torch.arange(1000, device="cuda", dtype=torch.float32); y = torch.ones_like(x); out = torch.empty_like(x)
add[(4,)](x, y, out, 1000, BLOCK=256)
torch.cuda.synchronize()
print(json.dumps({"ok": bool(torch.equal(out, x + 1)), "triton": triton.__version__, "torch": torch.__version__,
                  "gpu": torch.cuda.get_device_name(0)}))
'''


def case(which: str) -> dict:
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as empty:
        env = {"TRITON_CACHE_DIR": cache, "PATH": "/usr/bin:/bin", **_keep()}
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", CHILD, which, empty], capture_output=True, text=True,
                              env=env, timeout=600)
        res = {"case": which, "rc": proc.returncode, "seconds": round(time.monotonic() - t0, 1)}
        lines = proc.stdout.strip().splitlines()
        if proc.returncode == 0 and lines:
            res.update(json.loads(lines[-1]))
        else:
            res["ok"] = False
            err = proc.stderr
            res["python_h_missing"] = "Python.h" in err
            res["stderr_tail"] = err.strip().splitlines()[-8:]
        return res


def _keep() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k.startswith(("CUDA", "LD_LIBRARY_PATH", "HOME", "NVIDIA"))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench/results/gpu/triton_headers.json"))
    args = ap.parse_args()
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    results = {"python_h": str(include), "python_h_exists": include.exists(),
               "cases": [case("present"), case("hidden")]}
    present, hidden = results["cases"]
    results["verdict"] = ("headers needed: present compiles+runs, hidden fails on Python.h"
                          if present["ok"] and not hidden["ok"] and hidden.get("python_h_missing")
                          else "unexpected: see cases")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0 if results["verdict"].startswith("headers needed") else 1


if __name__ == "__main__":
    sys.exit(main())

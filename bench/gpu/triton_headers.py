#!/usr/bin/env python3
"""Triton compiles its launcher (driver.c, which includes Python.h) at the first kernel launch: without the
Python headers (an image whose base lacks python3.X-dev) every Triton kernel - sglang-kt's
`--lora-backend triton`, torch.compile - fails there. Shown on the GPU machine outside any image: one small
Triton kernel in a fresh cache with the headers present, then with the include folder moved away (restored
after). Writes $OUT/triton_headers.json.

    device tool: run(command="python3 bench/gpu/triton_headers.py")
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ktdeploy.core.facts.stack_probe import TRITON_KERNEL  # noqa: E402  (the kernel the stack probe runs)

KERNEL = "import torch\n" + TRITON_KERNEL + """
x = torch.randn(4096, device="cuda"); y = torch.randn_like(x); o = torch.empty_like(x)
add[(4,)](x, y, o, 4096, BLOCK=1024)
torch.cuda.synchronize()
assert torch.allclose(o, x + y)
print("TRITON_OK", triton.__version__)
"""


def launch(label: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        script = Path(cache) / "kernel.py"  # @triton.jit needs its source in a file (not `python -c`)
        script.write_text(KERNEL)
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, str(script)], env=dict(os.environ, TRITON_CACHE_DIR=cache),
                           capture_output=True, text=True, timeout=300)
    out = (p.stdout + p.stderr).strip().splitlines()
    return {"case": label, "rc": p.returncode, "ok": "TRITON_OK" in p.stdout, "s": round(time.monotonic() - t0, 1),
            "mentions_python_h": any("Python.h" in line for line in out), "tail": out[-6:]}


def main() -> int:
    inc = Path(sysconfig.get_paths()["include"])
    res = {"how": "python3 bench/gpu/triton_headers.py (device tool)", "python": sys.version.split()[0],
           "include": str(inc), "python_h_present": (inc / "Python.h").exists(), "cases": []}
    res["cases"].append(launch("headers present"))
    hidden = inc.with_name(inc.name + ".hidden-by-bench")
    if inc.is_dir() and not hidden.exists():
        inc.rename(hidden)
        try:
            res["cases"].append(launch("headers hidden"))
        finally:
            hidden.rename(inc)
    else:
        res["cases"].append({"case": "headers hidden", "skipped": f"cannot move {inc}"})
    out = Path(os.environ.get("OUT", "/tmp"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "triton_headers.json").write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

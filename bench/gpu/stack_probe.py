#!/usr/bin/env python3
"""The image readiness check's stack probe (ktdeploy/core/facts/stack_probe.py:STACK_PROBE, exactly as `ktdeploy doctor
--image` runs it in the container) on the GPU machine outside any image: with Python's headers present, then with
the include folder moved away (restored after), as bench/gpu/triton_headers.py does. Stdlib only (the probe's
source is read from the module with ast, no pydantic needed). Writes $OUT/stack_probe.json and the two raw outputs
(the unit tests' recordings: tests/unit/core/checks/data/stack/gpu-ok.txt, gpu-no-headers.txt).

    device tool: run(command="python3 bench/gpu/stack_probe.py")
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def probe_source() -> str:
    tree = ast.parse((REPO / "ktdeploy" / "core" / "facts" / "stack.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "STACK_PROBE" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit("STACK_PROBE not found")


def run(label: str, src: str, out_dir: Path) -> dict:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", src, "1", "240"], capture_output=True, text=True, timeout=400)
    (out_dir / f"{label}.txt").write_text(p.stdout)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("KTDEPLOY_STACK ")), None)
    return {"case": label, "rc": p.returncode, "s": round(time.monotonic() - t0, 1),
            "report": json.loads(line.split(" ", 1)[1]) if line else None, "stderr_tail": p.stderr.splitlines()[-5:]}


def main() -> int:
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    src = probe_source()
    inc = Path(sysconfig.get_paths()["include"])
    res = {"how": "python3 bench/gpu/stack_probe.py (device tool)", "python": sys.version.split()[0],
           "include": str(inc), "cases": [run("gpu-ok", src, out_dir)]}
    hidden = inc.with_name(inc.name + ".hidden-by-bench")
    if inc.is_dir() and not hidden.exists():
        inc.rename(hidden)
        try:
            res["cases"].append(run("gpu-no-headers", src, out_dir))
        finally:
            hidden.rename(inc)
    (out_dir / "stack_probe.json").write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

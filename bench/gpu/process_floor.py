#!/usr/bin/env python3
"""Measure one training process's floor on the GPU machine: host RSS and GPU memory of a process that imports
the training stack, initialises CUDA and trains a negligible model for a few steps.

Used by the planner calibration (bench/planner_calibration.py) as the per-process runtime term when no tiny
KT run is available. Prints one JSON object: peak_host_rss_gib (ru_maxrss), gpu_reserved_gib (torch caching
allocator peak), gpu_process_gib (nvidia-smi's per-process figure: context + allocator), imports.
"""

from __future__ import annotations

import importlib
import json
import resource
import subprocess
import sys


def main() -> None:
    imported = []
    for mod in ("torch", "transformers", "accelerate", "peft", "datasets", "llamafactory", "kt_kernel"):
        try:
            importlib.import_module(mod)
            imported.append(mod)
        except Exception:  # noqa: BLE001 - an absent package just is not part of this floor
            pass
    import torch

    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(2048, 512, device=dev, dtype=torch.float32)
    for _ in range(20):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    import os

    mine = [int(line.split(",")[1]) for line in smi.strip().splitlines() if line.split(",")[0].strip() == str(os.getpid())]
    print(json.dumps({
        "peak_host_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30,
        "gpu_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "gpu_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "gpu_process_gib": (mine[0] / 1024) if mine else None,
        "imports": imported, "python": sys.version.split()[0], "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()

"""GPU facts: `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` and /dev/nvidia* nodes."""

from __future__ import annotations

import csv
import io

from ktdeploy.core.facts.host import Gpu, GpuFacts

QUERY = "index,name,memory.total,memory.used,driver_version,uuid"


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Rows of the CSV query above. Tolerates a header line and '[N/A]' values."""
    gpus = []
    for row in csv.reader(io.StringIO(text)):
        row = [c.strip() for c in row]
        if len(row) < 2 or not row[0].isdigit():
            continue
        row += [""] * (6 - len(row))
        gpus.append(Gpu(index=int(row[0]), name=row[1], memory_total_mib=_mib(row[2]),
                        memory_used_mib=_mib(row[3]), driver_version=row[4] or None, uuid=row[5] or None))
    return gpus


def build_gpu(out: str | None, rc: int | None, err: str = "", devices: str | None = None) -> GpuFacts:
    nodes = [line.strip() for line in (devices or "").splitlines() if line.strip().startswith("/dev/nvidia")]
    if rc is None:
        return GpuFacts(nvidia_smi="unknown", device_nodes=nodes)
    if rc == 127:
        return GpuFacts(nvidia_smi="missing", error="nvidia-smi: command not found", device_nodes=nodes)
    if rc != 0:
        msg = (out or "").strip() or (err or "").strip()
        return GpuFacts(nvidia_smi="failed", error=msg.splitlines()[0][:300] if msg else f"exit {rc}",
                        device_nodes=nodes)
    return GpuFacts(nvidia_smi="ok", gpus=parse_nvidia_smi(out or ""), device_nodes=nodes)


def _mib(v: str) -> int | None:
    v = v.replace("MiB", "").strip()
    try:
        return int(float(v))
    except ValueError:
        return None

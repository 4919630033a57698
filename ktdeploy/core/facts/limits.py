"""Resource limits: RLIMIT_MEMLOCK (/proc/self/limits), the cgroup memory limit and CPU quota, /dev/shm size."""

from __future__ import annotations

import re
from typing import Any

from ktdeploy.core.facts.host import LimitsFacts

# cgroup v1 reports "no limit" as a huge page-aligned number (PAGE_COUNTER_MAX * page size).
_V1_UNLIMITED = 1 << 60


def parse_proc_limits(text: str) -> dict[str, tuple[Any, ...]]:
    """/proc/self/limits -> {'Max locked memory': (soft, hard)} with ints or 'unlimited'."""
    out = {}
    for line in text.splitlines()[1:]:
        # Columns are fixed-width: name (26 chars), soft (21), hard (21), units.
        name = line[:26].strip()
        rest = line[26:].split()
        if not name or len(rest) < 2:
            continue
        out[name] = (_limit(rest[0]), _limit(rest[1]))
    return out


def parse_cgroup(text: str) -> dict[str, Any]:
    kv = {}
    for line in (text or "").splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            kv[k.strip()] = v.strip()
    version = kv.get("version") if kv.get("version") in ("v1", "v2") else None
    mem = kv.get("memory", "")
    limit: int | str | None
    if mem in ("", None):
        limit = None
    elif mem == "max":
        limit = "unlimited"
    else:
        try:
            limit = int(mem)
            if limit >= _V1_UNLIMITED:
                limit = "unlimited"
        except ValueError:
            limit = None
    quota = None
    cpu = kv.get("cpu", "").split()
    if len(cpu) == 2 and cpu[0] not in ("max", "-1"):
        try:
            quota = round(int(cpu[0]) / int(cpu[1]), 2)
        except (ValueError, ZeroDivisionError):
            quota = None
    return {"version": version, "memory_limit": limit, "cpu_quota": quota}


def parse_df_line(text: str) -> dict[str, Any] | None:
    """Last data line of `df -Pk PATH` -> total/free bytes and mount point."""
    lines = [ln for ln in (text or "").splitlines() if ln.strip() and not ln.startswith("Filesystem")]
    if not lines:
        return None
    m = re.match(r"^(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+|-)%?\s+(.*)$", lines[-1])
    if not m:
        return None
    return {"filesystem": m.group(1), "total_bytes": int(m.group(2)) * 1024,
            "free_bytes": int(m.group(4)) * 1024, "mount": m.group(6)}


def build_limits(proc_limits: str | None, cgroup: str | None, shm: str | None) -> LimitsFacts:
    lim = parse_proc_limits(proc_limits) if proc_limits else {}
    soft, hard = lim.get("Max locked memory", (None, None))
    cg = parse_cgroup(cgroup or "")
    df = parse_df_line(shm or "")
    return LimitsFacts(memlock_soft=soft, memlock_hard=hard, cgroup_version=cg["version"],
                       cgroup_memory_limit=cg["memory_limit"],
                       shm_total_bytes=df["total_bytes"] if df else None,
                       shm_free_bytes=df["free_bytes"] if df else None)


def _limit(v: str) -> int | str | None:
    if v == "unlimited":
        return "unlimited"
    try:
        return int(v)
    except ValueError:
        return None

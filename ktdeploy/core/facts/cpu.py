"""CPU facts: /proc/cpuinfo, `lscpu -J`, `lscpu -p=CPU,CORE,SOCKET,NODE`, Cpus_allowed_list.

/proc/cpuinfo is the ground truth kt-kernel's own variant picker reads; lscpu adds the topology.
"""

from __future__ import annotations

import re
from typing import Any

from ktdeploy.core.facts.host import CpuFacts, NumaNode
from ktdeploy.core.facts.total import PARSE_ERRORS
from ktdeploy.core.safeio import parse_json
from ktdeploy.core.sched.cpuset import MAX_CPUS, parse_cpu_list  # noqa: F401 (one definition, re-exported)


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """Parse /proc/cpuinfo: vendor, model, flags of the first processor, processor count and topology ids."""
    blocks = [b for b in re.split(r"\n\s*\n", text.strip()) if b.strip()]
    procs = []
    for block in blocks:
        entry: dict[str, str] = {}
        for line in block.splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                entry[k.strip()] = v.strip()
        if "processor" in entry:
            procs.append(entry)
    if not procs:
        return {"logical_cpus": 0, "flags": []}
    first = procs[0]
    out: dict[str, Any] = {
        "vendor": first.get("vendor_id"),
        "model_name": first.get("model name"),
        "family": _int(first.get("cpu family")),
        "model": _int(first.get("model")),
        "flags": sorted(set(first.get("flags", "").split())),
        "logical_cpus": len(procs),
    }
    pairs = {(p.get("physical id"), p.get("core id")) for p in procs}
    if all(a is not None and b is not None for a, b in pairs):
        out["sockets"] = len({a for a, _ in pairs})
        out["_core_map"] = {int(p["processor"]): (int(p["physical id"]), int(p["core id"])) for p in procs}
    return out


def parse_lscpu_json(text: str) -> dict[str, Any]:
    """Parse `lscpu -J` (util-linux >= 2.30; newer versions nest entries under 'children'). Entries of another
    shape (a number for 'children', a list for 'data') are skipped; text that is not such JSON is a ValueError."""
    data = parse_json(text)
    if not isinstance(data, dict) or not isinstance(data.get("lscpu"), list):
        raise ValueError("not lscpu -J output (no 'lscpu' list)")
    fields: dict[str, str | None] = {}
    todo = list(reversed(data["lscpu"]))   # depth-first in document order, without recursion
    while todo:
        item = todo.pop()
        if not isinstance(item, dict):
            continue
        key = str(item.get("field", "")).rstrip(":").strip()
        value = item.get("data")
        if key and key not in fields:
            fields[key] = value if isinstance(value, str) else None
        children = item.get("children")
        if isinstance(children, list):
            todo.extend(reversed(children))

    out: dict[str, Any] = {
        "vendor": fields.get("Vendor ID"),
        "model_name": fields.get("Model name"),
        "sockets": _int(fields.get("Socket(s)")),
        "cores_per_socket": _int(fields.get("Core(s) per socket")),
        "threads_per_core": _int(fields.get("Thread(s) per core")),
        "logical_cpus": _int(fields.get("CPU(s)")),
        "hypervisor_vendor": fields.get("Hypervisor vendor"),
    }
    flags = fields.get("Flags")
    if flags:
        out["flags"] = sorted(set(flags.split()))
    nodes = []
    for key, value in fields.items():
        m = re.fullmatch(r"NUMA node(\d+) CPU\(s\)", key)
        if m:
            nodes.append(NumaNode(id=int(m.group(1)), cpus=parse_cpu_list(value or "")))
    out["numa_nodes"] = sorted(nodes, key=lambda n: n.id)
    return {k: v for k, v in out.items() if v is not None}


def parse_lscpu_parse(text: str) -> dict[int, tuple[int, int, int | None]]:
    """`lscpu -p=CPU,CORE,SOCKET,NODE` -> {cpu: (socket, core, node)} (node None when empty)."""
    table = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        cols = line.split(",")
        if len(cols) < 3 or not cols[0].isdigit():
            continue
        node = _int(cols[3]) if len(cols) > 3 else None
        table[int(cols[0])] = (int(cols[2] or 0), int(cols[1] or 0), node)
    return table


def parse_cpus_allowed(text: str) -> list[int]:
    for line in text.splitlines():
        if line.startswith("Cpus_allowed_list"):
            return parse_cpu_list(line.split(":", 1)[1])
    return []


def parse_numa_sysfs(text: str) -> list[NumaNode]:
    nodes = []
    for line in text.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0].isdigit():
            nodes.append(NumaNode(id=int(parts[0]), cpus=parse_cpu_list(parts[1])))
        elif len(parts) == 1 and parts[0].isdigit():  # memory-only node
            nodes.append(NumaNode(id=int(parts[0]), cpus=[]))
    return sorted(nodes, key=lambda n: n.id)


def build_cpu(cpuinfo: str | None, lscpu_json: str | None = None, lscpu_parse: str | None = None,
              cpus_allowed: str | None = None, numa_sysfs: str | None = None,
              cpu_quota: float | None = None) -> CpuFacts:
    """Combine the CPU sources. /proc/cpuinfo wins for flags (it is what kt-kernel reads)."""
    info = parse_cpuinfo(cpuinfo) if cpuinfo else {}
    ls = {}
    if lscpu_json:
        try:  # lscpu only adds topology: an unreadable one leaves /proc/cpuinfo's facts standing
            ls = parse_lscpu_json(lscpu_json)
        except PARSE_ERRORS:
            ls = {}
    topo = parse_lscpu_parse(lscpu_parse) if lscpu_parse else {}
    core_map = {cpu: (s, c) for cpu, (s, c, _n) in topo.items()} or info.get("_core_map", {})
    allowed = parse_cpus_allowed(cpus_allowed) if cpus_allowed else []
    if not allowed:
        allowed = sorted(core_map) or list(range(info.get("logical_cpus") or ls.get("logical_cpus") or 0))

    nodes = ls.get("numa_nodes") or (parse_numa_sysfs(numa_sysfs) if numa_sysfs else [])
    if not nodes and topo and all(n is not None for _s, _c, n in topo.values()):
        by_node: dict[int, list[int]] = {}
        for cpu, (_s, _c, n) in sorted(topo.items()):
            if n is not None:  # always, by the all() above; says so to the type checker
                by_node.setdefault(n, []).append(cpu)
        nodes = [NumaNode(id=n, cpus=c) for n, c in sorted(by_node.items())]

    physical = None
    if core_map:
        physical = len({core_map[c] for c in allowed if c in core_map})
    elif ls.get("sockets") and ls.get("cores_per_socket") and len(allowed) == ls.get("logical_cpus"):
        physical = ls["sockets"] * ls["cores_per_socket"]
    elif ls.get("threads_per_core") and allowed:
        physical = max(1, len(allowed) // ls["threads_per_core"])

    return CpuFacts(
        vendor=info.get("vendor") or ls.get("vendor"),
        model_name=info.get("model_name") or ls.get("model_name"),
        family=info.get("family"),
        model=info.get("model"),
        flags=info.get("flags") or ls.get("flags", []),
        logical_cpus=info.get("logical_cpus") or ls.get("logical_cpus") or len(allowed),
        sockets=ls.get("sockets") or info.get("sockets"),
        cores_per_socket=ls.get("cores_per_socket"),
        threads_per_core=ls.get("threads_per_core"),
        allowed_cpus=allowed,
        physical_cores=physical,
        numa_nodes=nodes,
        cpu_quota=cpu_quota,
    )


def _int(v: object) -> int | None:
    try:
        return int(str(v).strip())
    except (TypeError, ValueError):
        return None

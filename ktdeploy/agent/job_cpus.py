"""The trainer on the cores its scheduler job was given (stdlib only: the test double's image imports it too).

``pin_to_job`` narrows this process's CPU mask to the job's CPUs (``core/sched/cpuset.allotted``: the cgroup's
cpuset the batch script read on the node, ``KTDEPLOY_CPUSET``; else SLURM_CPU_BIND; else the mask as it is) before
doctor reads the topology, so the derived kt_num_threads is the physical cores of that set and
kt_threadpool_count the NUMA nodes it spans; everything started afterwards (accelerate, the ranks, kt-kernel's
workers) inherits the mask.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ktdeploy.core.sched.cpuset import Allotment, allotted, job_threads, parse_cpu_list

CPUSET_ENV = "KTDEPLOY_CPUSET"
SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")


def in_a_job(env: Mapping[str, str]) -> bool:
    return bool(env.get("SLURM_JOB_ID") or env.get(CPUSET_ENV))


def pin_to_job(env: Mapping[str, str] | None = None) -> Allotment | None:
    """Narrow the mask to the job's CPUs; None outside a scheduler job (nothing changed)."""
    env = os.environ if env is None else env
    if not in_a_job(env):
        return None
    mask = os.sched_getaffinity(0)
    a = allotted(env.get(CPUSET_ENV), env.get("SLURM_CPU_BIND"), mask)
    if a.cpus and set(a.cpus) != mask:
        os.sched_setaffinity(0, a.cpus)
    return a


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def topology(cpus: list[int]) -> tuple[dict[int, tuple[int, int]], dict[int, int]]:
    """(cpu -> (package, core), cpu -> NUMA node) from sysfs, for the CPUs given."""
    core_of: dict[int, tuple[int, int]] = {}
    for c in cpus:
        pkg, core = _read(SYS_CPU / f"cpu{c}/topology/physical_package_id"), _read(SYS_CPU / f"cpu{c}/topology/core_id")
        if pkg is not None and core is not None and pkg.strip().lstrip("-").isdigit() and core.strip().isdigit():
            core_of[c] = (int(pkg), int(core))
    node_of: dict[int, int] = {}
    for node in sorted(SYS_NODE.glob("node[0-9]*")):
        text = _read(node / "cpulist")
        try:
            for c in parse_cpu_list(text or ""):
                node_of[c] = int(node.name[4:])
        except ValueError:
            continue
    return core_of, node_of


def threads_here(reserve_cores: int) -> tuple[int, int]:
    """(kt_num_threads, kt_threadpool_count) on this process's CPUs (after ``pin_to_job``)."""
    cpus = sorted(os.sched_getaffinity(0))
    core_of, node_of = topology(cpus)
    return job_threads(cpus, core_of, node_of, reserve_cores)

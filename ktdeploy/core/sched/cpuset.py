"""The CPUs a scheduler gave a job, and kt-kernel's thread plan on them (pure; stdlib only: the test double's
image imports it too).

Slurm hands a job its cores three ways, strongest first:

    cgroup     the job's cpuset (task/cgroup with ConstrainCores=yes): nothing in the job can run elsewhere, and
               hwloc, which kt-kernel pins its worker threads with, sees only these cores
    cpu_bind   SLURM_CPU_BIND (task/affinity): the binding srun applied; a process may widen it again
    affinity   the process's own CPU mask (sched_getaffinity), whatever set it

``allotted`` takes the first that says something, within the process's mask. ``threads_for`` is the one rule for
kt_num_threads / kt_threadpool_count (ktransformers #685, #1073): physical cores (SMT siblings never count) less
the reserve, thread pools = the NUMA nodes those cores sit on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_CPUS = 1 << 16   # Linux's NR_CPUS is at most 8192; a list naming more is not a CPU list


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]. ValueError for anything else, or past MAX_CPUS ('0-99999999999'
    would otherwise build a list of 10^11 numbers)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        a, b = _cpu(lo), _cpu(hi) if hi else _cpu(lo)
        if b < a or len(cpus) + (b - a) >= MAX_CPUS:
            raise ValueError(f"not a CPU list: {part[:40]!r}")
        cpus.extend(range(a, b + 1))
    return cpus


def _cpu(text: str) -> int:
    text = text.strip()
    if not text.isdigit() or len(text) > 6:
        raise ValueError(f"not a CPU number: {text[:40]!r}")
    return int(text)


def cpu_list_text(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8' (the kernel's own spelling, as in Cpus_allowed_list)."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cpus)):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


MASK = re.compile(r"^(?:0x)?([0-9a-fA-F]{1,4096})$")


def parse_cpu_bind(value: str | None) -> list[int] | None:
    """SLURM_CPU_BIND (``[quiet|verbose,]mask_cpu:0x3,0xC`` or ``map_cpu:0,2``) -> the first task's CPUs (a batch
    step and a one-task step have one), or None when it names no CPUs (``cores``, ``none``, unset, garbage)."""
    if not value:
        return None
    for part in value.split(","):
        kind, sep, rest = part.partition(":")
        if not sep:
            continue
        first = rest.split(",")[0]
        if kind == "mask_cpu":
            m = MASK.match(first)
            if not m:
                return None
            bits = int(m.group(1), 16)
            return [i for i in range(min(bits.bit_length(), MAX_CPUS)) if bits >> i & 1] or None
        if kind == "map_cpu":
            try:
                return [_cpu(first)]
            except ValueError:
                return None
    return None


@dataclass(frozen=True)
class Allotment:
    cpus: tuple[int, ...]
    source: str          # job_cgroup | slurm_cpu_bind | affinity

    @property
    def text(self) -> str:
        return cpu_list_text(self.cpus)


def allotted(cgroup_cpus: str | None, cpu_bind: str | None, affinity: Iterable[int]) -> Allotment:
    """The job's CPUs: its cgroup's cpuset, else SLURM_CPU_BIND's, else the process's mask; a set is taken
    within the mask (a CPU outside it cannot be used) and only when that leaves some CPU."""
    mask = set(affinity)
    try:
        cg = parse_cpu_list(cgroup_cpus) if cgroup_cpus else []
    except ValueError:
        cg = []
    for source, cpus in (("job_cgroup", cg), ("slurm_cpu_bind", parse_cpu_bind(cpu_bind) or [])):
        inside = sorted(set(cpus) & mask) if mask else sorted(set(cpus))
        if inside:
            return Allotment(tuple(inside), source)
    return Allotment(tuple(sorted(mask)), "affinity")


def threads_for(physical_cores: int, numa_nodes: int, reserve_cores: int) -> tuple[int, int]:
    """(kt_num_threads, kt_threadpool_count): physical cores less the reserve (at least 1), one pool per NUMA node
    those cores span (at least 1, at most one per thread). The one rule: doctor's derivation
    (core/checks/threads.py) and a job's own cores (``job_threads``) both come here."""
    threads = max(1, physical_cores - max(0, reserve_cores))
    return threads, min(max(1, numa_nodes), threads)


def job_threads(cpus: Iterable[int], core_of: Mapping[int, tuple[int, int]], node_of: Mapping[int, int],
                reserve_cores: int) -> tuple[int, int]:
    """``threads_for`` on a CPU set: ``core_of`` maps a CPU to its (package, core) — SMT siblings share one —,
    ``node_of`` to its NUMA node; a CPU missing from a map counts as its own core / node 0."""
    cpus = list(cpus)
    cores = {core_of.get(c, (-1, c)) for c in cpus}
    nodes = {node_of.get(c, 0) for c in cpus}
    return threads_for(len(cores), len(nodes), reserve_cores)

"""kt_num_threads / kt_threadpool_count from the topology (cookbook §3(5); ktransformers #685, #1073).

Threads = physical cores this process may use (SMT siblings never count) minus a reserve for the
DataLoader and the training process's own threads; threadpools = NUMA nodes holding those cores.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ktdeploy.core.check_names import CheckName
from ktdeploy.core.check_result import CheckResult, Status
from ktdeploy.core.facts.host import HostFacts
from ktdeploy.core.recipe.train_keys import TrainKeys
from ktdeploy.core.sched.cpuset import threads_for


def derive_threads(facts: HostFacts, reserve_cores: int = 2) -> tuple[int, int]:
    """``threads_for`` on the CPUs this process may use (its affinity: a Slurm job's cores, docker's --cpuset-cpus),
    capped by a CPU quota (docker --cpus)."""
    cpu = facts.cpu
    physical = cpu.physical_cores or cpu.logical_cpus or 1
    if cpu.cpu_quota:  # docker --cpus: never plan more threads than the quota
        physical = min(physical, max(1, math.floor(cpu.cpu_quota)))
    allowed = set(cpu.allowed_cpus)
    nodes = [n for n in cpu.numa_nodes if not allowed or allowed.intersection(n.cpus)]
    return threads_for(physical, len(nodes), reserve_cores)


def derived_kt_threads(train: Mapping[str, Any], facts: HostFacts, reserve_cores: int = 2) -> dict[str, int]:
    """The ``kt_config.*`` values ktdeploy derives for a training section: kt_num_threads / kt_threadpool_count
    from the topology, only for the keys the recipe leaves unset, and only with ``use_kt``. The one derivation
    behind ``ktdeploy train`` (what it renders), ``up``'s preview of the rendered files and ``ktdeploy serve``
    (``--kt-cpuinfer`` / ``--kt-threadpool-count`` default to what training used)."""
    keys = TrainKeys(train)
    if not keys.use_kt:
        return {}
    kt = keys.kt_config
    want = [k for k in ("kt_num_threads", "kt_threadpool_count") if k not in kt]
    if not want:
        return {}
    threads, pools = derive_threads(facts, reserve_cores)
    values = {"kt_num_threads": threads, "kt_threadpool_count": pools}
    return {f"kt_config.{k}": values[k] for k in want}


def serve_threads(kt_config: Mapping[str, Any], derived: Callable[[], tuple[int, int]], *,
                  cpuinfer: int | None = None, threadpools: int | None = None) -> tuple[int, int]:
    """sglang-kt's (--kt-cpuinfer, --kt-threadpool-count): the flag, else the recipe's kt_config value, else
    ``derived()`` (``derive_threads`` on the serving host: what training used there). ``derived`` is called only
    when a count is missing, since it costs a fact gathering. The one decision; ``ktdeploy serve`` asks it."""
    threads = cpuinfer or kt_config.get("kt_num_threads")
    pools = threadpools or kt_config.get("kt_threadpool_count")
    if threads is None or pools is None:
        t, p = derived()
        threads, pools = threads or t, pools or p
    return int(threads), int(pools)


def threads_check(facts: HostFacts, reserve_cores: int = 2, train: Mapping[str, Any] | None = None) -> CheckResult:
    threads, pools = derive_threads(facts, reserve_cores)
    cpu = facts.cpu
    data = {"kt_num_threads": threads, "kt_threadpool_count": pools, "physical_cores": cpu.physical_cores,
            "logical_cpus": cpu.logical_cpus, "reserve_cores": reserve_cores,
            "numa_nodes": len(cpu.numa_nodes)}
    base = (f"kt_num_threads={threads}, kt_threadpool_count={pools} ({cpu.physical_cores} physical cores of "
            f"{len(cpu.allowed_cpus) or cpu.logical_cpus} CPUs, {len(cpu.numa_nodes) or 1} NUMA node(s), "
            f"{reserve_cores} reserved)")
    kt = TrainKeys(train or {}).kt_config
    set_threads, set_pools = kt.get("kt_num_threads"), kt.get("kt_threadpool_count")
    phys = cpu.physical_cores or cpu.logical_cpus
    if isinstance(set_threads, int) and phys and set_threads > phys:
        return CheckResult(name=CheckName.NUMA_THREADS, status="fail", layer=facts.layer, data=data,
                           detail=f"recipe sets kt_num_threads={set_threads} > {phys} physical cores: "
                                  "SMT/oversubscription collapses throughput",
                           fix=f"Set kt_config.kt_num_threads: {threads} (or leave it unset: ktdeploy derives it).")
    if isinstance(set_pools, int) and set_pools != pools:
        return CheckResult(name=CheckName.NUMA_THREADS, status="warn", layer=facts.layer, data=data,
                           detail=f"recipe sets kt_threadpool_count={set_pools}, this host has {pools} NUMA node(s)",
                           fix=f"Set kt_config.kt_threadpool_count: {pools}.")
    if cpu.physical_cores is not None and cpu.physical_cores <= reserve_cores:
        return CheckResult(name=CheckName.NUMA_THREADS, status="warn", layer=facts.layer, data=data,
                           detail=base + ": no core left after the reserve",
                           fix="Use a host with more cores or lower deploy.reserve_cores.")
    return CheckResult(name=CheckName.NUMA_THREADS, status="pass", layer=facts.layer, detail=base, data=data)


def mempolicy_check(facts: HostFacts) -> CheckResult:
    p = facts.probes.mempolicy
    nodes = len(facts.cpu.numa_nodes) or 1
    if not p.ran:
        return CheckResult(name=CheckName.NUMA_MEMPOLICY, status="skip", layer=facts.layer,
                           detail=f"set_mempolicy not probed: {p.skipped or 'probe not run'}",
                           fix="Install a C compiler on the host (apt install gcc) or run doctor inside the image.")
    if p.ok:
        return CheckResult(name=CheckName.NUMA_MEMPOLICY, status="pass", layer=facts.layer,
                           detail=f"set_mempolicy(MPOL_BIND) works ({nodes} NUMA node(s))")
    status: Status = "fail" if nodes > 1 else "warn"
    return CheckResult(name=CheckName.NUMA_MEMPOLICY, status=status, layer=facts.layer,
                       detail=f"{p.error or 'set_mempolicy failed'}: kt-kernel cannot bind expert memory to NUMA "
                              f"nodes and runs slower ({nodes} node(s); ktransformers #350)",
                       fix="Start the container with --cap-add SYS_NICE (docker's seccomp profile blocks "
                           "set_mempolicy/mbind without it).", data={"errno": p.errno})

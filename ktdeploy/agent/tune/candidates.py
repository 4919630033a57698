"""Candidate CPU-expert settings derived from host facts (pure).

Why a ladder and not one value: on the GPU machine (16-core VM, kt-facts.md) a medium MoE ran 832 tokens/s with
all 16 cores, 1407 with 8 and 1142 with 4 — the trainer's own threads compete with the expert workers, so the best
thread count sits well below "all physical cores" and depends on the host and the model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class Candidate:
    kt_num_threads: int
    kt_threadpool_count: int
    kt_max_cache_depth: int | None = None
    kt_cpu_activation: str | None = None

    def overrides(self) -> dict[str, object]:
        """Dotted training-YAML keys to set for this trial."""
        out: dict[str, object] = {"kt_config.kt_num_threads": self.kt_num_threads,
                                  "kt_config.kt_threadpool_count": self.kt_threadpool_count}
        if self.kt_max_cache_depth is not None:
            out["kt_config.kt_max_cache_depth"] = self.kt_max_cache_depth
        if self.kt_cpu_activation is not None:
            out["kt_cpu_activation"] = self.kt_cpu_activation
        return out

    def label(self) -> str:
        parts = [f"threads={self.kt_num_threads}", f"pools={self.kt_threadpool_count}"]
        if self.kt_max_cache_depth is not None:
            parts.append(f"cache={self.kt_max_cache_depth}")
        if self.kt_cpu_activation is not None:
            parts.append(f"act={self.kt_cpu_activation}")
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def thread_ladder(physical_cores: int, numa_nodes: int = 1) -> list[int]:
    """A quarter, half, three quarters and all of the physical cores, each a multiple of the NUMA node count
    (one thread pool per node gets an equal share), deduplicated, ascending."""
    nodes = max(1, numa_nodes)
    cores = max(nodes, physical_cores)
    out = set()
    for frac in (0.25, 0.5, 0.75, 1.0):
        n = max(nodes, round(cores * frac / nodes) * nodes)
        out.add(min(cores, n))
    return sorted(out)


def stage_one(physical_cores: int, numa_nodes: int = 1) -> list[Candidate]:
    """Thread count first: it moves throughput the most. Descending, so the cookbook's all-cores setting is the
    first trial and the baseline every other trial is compared with."""
    pools = max(1, numa_nodes)
    return [Candidate(t, pools) for t in sorted(thread_ladder(physical_cores, numa_nodes), reverse=True)]


def stage_two(best: Candidate, physical_cores: int, numa_nodes: int, *, cache_depth: int | None,
              retain_fits: bool, gradient_checkpointing: bool) -> list[Candidate]:
    """Around the best thread count: its neighbours half-way to the next rung, a single pool on multi-node hosts,
    cache depth one lower/higher, and retaining CPU activations when the memory plan allows it."""
    ladder = thread_ladder(physical_cores, numa_nodes)
    i = ladder.index(best.kt_num_threads) if best.kt_num_threads in ladder else None
    out: list[Candidate] = []
    if i is not None:
        for j in (i - 1, i + 1):
            if 0 <= j < len(ladder):
                mid = (ladder[i] + ladder[j]) // 2
                step = max(1, numa_nodes)
                mid = max(step, mid // step * step)
                if mid not in (ladder[i], ladder[j]):
                    out.append(Candidate(mid, best.kt_threadpool_count))
    if numa_nodes > 1:
        out.append(Candidate(best.kt_num_threads, 1))
    depth = cache_depth or 2
    for d in (depth - 1, depth + 1):
        if 1 <= d <= 8:
            out.append(Candidate(best.kt_num_threads, best.kt_threadpool_count, kt_max_cache_depth=d))
    if retain_fits and gradient_checkpointing:
        out.append(Candidate(best.kt_num_threads, best.kt_threadpool_count, kt_cpu_activation="retain"))
    seen, uniq = set(), []
    for c in out:
        if c not in seen and c != best:
            seen.add(c)
            uniq.append(c)
    return uniq

"""CPU features a scheduler places on, proven by doctor (never flags alone), and the one mapping from an image
variant to the CPU features it needs.

A node offers every image variant at or below the best one its CPU runs: an AMX node carries ``amx``, ``avx512``
and ``avx2``; a job asks for its variant's feature. AMX counts only when doctor's probe executed a tile multiply
(``amx_usable`` is True, not merely "listed"); AVX512 only when the probe's AVX512 instruction did not fault.
Slurm gives a job the lowest-``Weight`` node that fits, so an AMX node weighs more: an AVX512 job lands there only
when no plain AVX512 node is free.
"""

from __future__ import annotations

from ktdeploy.core.checks.isa import AMX_FLAGS, AVX2_FLAGS, AVX512_FLAGS, amx_usable, isa_level
from ktdeploy.core.facts.host import HostFacts

# Today's image variants, lowest first (controller/images/variants.py builds one image per name). The Variant
# registry with kt-kernel's six-build ladder replaces this tuple and ``variant_features``; nothing else changes.
LADDER = ("avx2", "avx512", "amx")
WEIGHTS = {"avx2": 1, "avx512": 10, "amx": 100}


def variant_flags(variant: str) -> tuple[str, ...]:
    """The /proc/cpuinfo flags an image variant needs (the one mapping, with ``variant_features``: Slurm's
    ``--constraint``, Kubernetes' NFD labels, the fit check). Raises ValueError for an unknown variant."""
    flags = {"avx2": AVX2_FLAGS, "avx512": AVX2_FLAGS + AVX512_FLAGS,
             "amx": AVX2_FLAGS + AVX512_FLAGS + AMX_FLAGS}.get(variant)
    if flags is None:
        raise ValueError(f"unknown image variant {variant!r} (known: {', '.join(LADDER)})")
    return flags


def variant_features(variant: str) -> tuple[str, ...]:
    """The Slurm node features an image variant needs: its own name (a node carries every variant it proved)."""
    variant_flags(variant)
    return (variant,)


def constraint(variant: str | None) -> str | None:
    """Slurm's ``--constraint`` for an image variant (None: a full image reference, no known CPU needs)."""
    return "&".join(variant_features(variant)) if variant else None


def proven_variants(facts: HostFacts) -> list[str]:
    """The image variants this host runs, by doctor's proof: the ladder up to its best, lowest first."""
    level = isa_level(facts)
    out: list[str] = []
    if level is None:
        return out
    out.append("avx2")
    probe = facts.probes.amx
    if level == "avx512" and not (probe.ran and probe.avx512f_exec is False):
        out.append("avx512")
        if amx_usable(facts) is True:
            out.append("amx")
    return out


def node_features(facts: HostFacts) -> list[str]:
    """Slurm node features (and NFD-style labels) for a host: its proven image variants."""
    return proven_variants(facts)


def node_weight(features) -> int:
    """Slurm ``Weight``: the higher the best variant, the later the node is chosen (AMX nodes last)."""
    best = [f for f in LADDER if f in set(features)]
    return WEIGHTS[best[-1]] if best else 1


def best_offered(features_by_node: dict[str, list[str]]) -> str | None:
    """The best image variant some node offers (deploy.image: auto on a cluster)."""
    offered = {f for fs in features_by_node.values() for f in fs}
    top = [v for v in LADDER if v in offered]
    return top[-1] if top else None

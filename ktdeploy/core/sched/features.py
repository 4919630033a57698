"""CPU features a scheduler places on, proven by doctor (never flags alone), and the one mapping from an image
variant (a kt-kernel CPU build, core/variants.py) to the CPU features it needs.

A node offers every build at or below the best one its CPU proves: an AMX node carries amx, avx512_bf16, …,
avx2; a job asks for its build's feature. AMX counts only when doctor's probe executed a tile multiply
(``amx_usable`` is True, not merely "listed"); an AVX512 build only when the probe's instructions for it did not
fault. Slurm gives a job the lowest-``Weight`` node that fits, so a higher build weighs more: a job lands on an AMX
node only when no node with a lower fitting build is free.
"""

from __future__ import annotations

from collections.abc import Iterable

from ktdeploy.core import variants as V
from ktdeploy.core.checks.isa import AVX2_FLAGS, amx_usable
from ktdeploy.core.facts.host import HostFacts

# The builds, lowest first (controller/images/tags.py builds one image per name).
LADDER = tuple(reversed(V.NAMES))
WEIGHTS = {v.name: (100 if v.name == V.AMX else 1 + 10 * v.level) for v in V.LADDER}


def variant_flags(variant: str) -> tuple[str, ...]:
    """The /proc/cpuinfo flags an image variant needs (the one mapping, with ``variant_features``: Slurm's
    ``--constraint``, Kubernetes' NFD labels, the fit check). Raises ValueError for an unknown variant."""
    if not V.known(variant):
        raise ValueError(f"unknown image variant {variant!r} (known: {', '.join(LADDER)})")
    return tuple(dict.fromkeys(AVX2_FLAGS + V.get(variant).requires))


def variant_features(variant: str) -> tuple[str, ...]:
    """The Slurm node features an image variant needs: its build's name (a node carries every build it proved)."""
    variant_flags(variant)
    return (V.canonical(variant),)


def constraint(variant: str | None) -> str | None:
    """Slurm's ``--constraint`` for an image variant (None: a full image reference, no known CPU needs)."""
    return "&".join(variant_features(variant)) if variant else None


def proven_variants(facts: HostFacts) -> list[str]:
    """The builds this host runs, by doctor's proof: the ladder up to its best, lowest first. AMX needs a tile
    multiply that ran and was right (an unproven AMX stays off a scheduler's node)."""
    best = V.proven(facts.cpu.flags, facts.probes.amx)
    if best is None:
        return []
    if best.name == V.AMX and amx_usable(facts) is not True:
        best = V.proven([f for f in facts.cpu.flags if f not in V.AMX_FLAGS], facts.probes.amx)
        if best is None:
            return []
    return [n for n in LADDER if V.get(n).level <= best.level]


def node_features(facts: HostFacts) -> list[str]:
    """Slurm node features (and NFD-style labels) for a host: its proven builds."""
    return proven_variants(facts)


def node_weight(features: Iterable[str]) -> int:
    """Slurm ``Weight``: the higher the best build, the later the node is chosen (AMX nodes last)."""
    best = [f for f in LADDER if f in set(features)]
    return WEIGHTS[best[-1]] if best else 1

"""Whether this machine's CPU can train with kt-kernel at all: the integration tests' `up` runs against test hosts
that are containers on this machine, so their CPU is this one. On a CPU whose best kt-kernel build has no SFT
kernels (AVX2 only: AMD Zen 2/3, Intel Haswell/Broadwell), doctor rightly stops every training `up` at
`recipe.weight_format_vs_isa` — so the tests of what happens after doctor skip there, saying why, and run on
every AVX512-BF16 or AMX machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktdeploy.core import variants as V
from ktdeploy.core.facts.cpu import parse_cpuinfo


def this_cpu_flags() -> list[str]:
    """/proc/cpuinfo's flags of this machine (the test hosts' CPU too); [] where it cannot be read."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())["flags"]
    except OSError:
        return []


def why_this_cpu_cannot_train() -> str | None:
    flags = this_cpu_flags()
    if not flags:
        return "/proc/cpuinfo names no CPU flags here"
    best = V.detect(flags)
    if best.sft:
        return None
    return (f"this CPU's best kt-kernel build is {best.name}, which has no SFT kernels: doctor stops a training "
            "`up` at recipe.weight_format_vs_isa, as it must (the flow past it needs an AVX512-BF16 or AMX machine)")


_WHY = why_this_cpu_cannot_train()
needs_a_training_cpu = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

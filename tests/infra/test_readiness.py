"""One test per doctor check: the host is ready when none fails (warnings are printed, skips skip)."""

from __future__ import annotations

import pytest

# Stable check names (ktdeploy/core/checks/*). Recipe-only checks skip when --kt-recipe is not given.
CHECKS = [
    "kernel.version", "cpu.isa.avx2", "cpu.isa.avx512", "cpu.variant", "cpu.kt_kernel_variant",
    "cpu.amx.listed", "layer.vm_cpu_model", "cpu.amx.permission", "cpu.amx.palette", "cpu.amx.tile_exec",
    "numa.mempolicy", "numa.threads", "gpu.present", "memory.host", "memory.shm", "memory.memlock",
    "docker.present", "docker.nvidia_runtime",
    "recipe.weight_format_vs_isa", "recipe.image_variant", "gpu.count_vs_recipe", "gpu.memory",
    "path.model_exists", "path.data_exists", "path.kt_weight_path", "path.kt_non_expert_weight_path",
    "disk.output", "disk.model", "plan.host_memory", "plan.gpu_memory", "plan.disk",
]


@pytest.mark.parametrize("name", CHECKS)
def test_check(report, waived, name):
    results = [c for c in report.checks if c.name == name]
    if not results:
        pytest.skip(f"{name}: not applicable on this host / without --kt-recipe")
    for r in results:
        if r.status == "skip":
            pytest.skip(f"{name}: {r.detail}")
        if r.status == "fail":
            msg = f"{name} [{r.layer}]: {r.detail}" + (f" — fix: {r.fix}" if r.fix else "")
            if name in waived:
                pytest.xfail("waived: " + msg)
            pytest.fail(msg, pytrace=False)
        if r.status == "warn":
            print(f"warn {name}: {r.detail}" + (f" — fix: {r.fix}" if r.fix else ""))


def test_every_check_is_known(report):
    """A new check added to ktdeploy shows up here until CHECKS lists it."""
    unknown = sorted({c.name for c in report.checks} - set(CHECKS))
    assert not unknown, f"checks not covered by the suite: {unknown}"

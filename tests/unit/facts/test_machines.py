"""What each recorded machine's facts say, checked against what is known about that machine."""

import pytest

from ktdeploy.checks.isa import auto_backend, best_variant, kt_kernel_variant
from tests.unit.facts.golden import GOLDEN, facts_of


def test_dev_machine_avx512_vm_container_without_amx_or_gpu():
    f = facts_of("avx512-kvm-container")
    assert f.cpu.has("avx512f", "avx512_bf16", "avx512_vnni", "avx512vbmi")
    assert not f.cpu.has("amx_tile")
    assert f.virt.hypervisor_flag and f.virt.vm == "kvm"
    assert f.container.in_container and f.container.kind == "docker"
    assert f.layer == "container"
    assert f.gpu.nvidia_smi == "missing" and f.gpu.count == 0
    assert f.docker.reachable and not f.docker.nvidia_runtime
    assert f.probes.amx.ran and f.probes.amx.listed is False
    assert f.probes.amx.avx512_bf16_exec is True
    assert f.cpu.physical_cores == 2 and len(f.cpu.numa_nodes) == 1
    assert best_variant(f) == "avx512"
    assert kt_kernel_variant(f) == "avx512_bf16"
    assert auto_backend(f, "bf16") == "BF16"
    assert auto_backend(f, "fp8") == "FP8"
    assert auto_backend(f, "amxint4") is None
    out = f.path("/nonexistent/output")
    assert out is not None and not out.exists and out.checked == "/"

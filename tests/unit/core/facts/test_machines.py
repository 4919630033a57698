"""What each recorded machine's facts say, checked against what is known about that machine."""

import pytest

from ktdeploy.core.checks.isa import auto_backend, best_variant, kt_kernel_variant
from tests.unit.core.facts.golden import GOLDEN, facts_of


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
    assert best_variant(f) == "avx512_bf16" == kt_kernel_variant(f)
    assert auto_backend(f, "bf16") == "AMXBF16"   # kt-kernel's auto: the backend does not depend on the CPU
    assert auto_backend(f, "fp8") == "FP8" and auto_backend(f, "int8") == "INT8"
    assert auto_backend(f, "amxint4") is None     # cookbook §1.1: AMXINT4 needs AMX
    out = f.path("/nonexistent/output")
    assert out is not None and not out.exists and out.checked == "/"


def test_haswell_is_avx2_only_vm():
    f = facts_of("haswell-avx2-qemu")
    assert f.cpu.has("avx2", "fma") and not f.cpu.has("avx512f")
    assert f.layer == "vm" and f.virt.vm == "qemu" and f.virt.dmi_vendor == "QEMU"
    assert f.probes.amx.avx512f_exec is False
    assert best_variant(f) == "avx2" and kt_kernel_variant(f) == "avx2"
    # kt-kernel's avx2 build has no SFT classes: nothing trains there
    assert [auto_backend(f, s) for s in ("bf16", "fp8", "int8", "int4")] == [None] * 4
    assert f.docker.present is False and f.gpu.nvidia_smi == "missing"


def test_two_socket_numa_with_smt():
    f = facts_of("numa-2socket-qemu")
    assert f.cpu.sockets == 2 and f.cpu.threads_per_core == 2 and f.cpu.logical_cpus == 8
    assert f.cpu.physical_cores == 4
    assert [(n.id, n.cpus) for n in f.cpu.numa_nodes] == [(0, [0, 1, 2, 3]), (1, [4, 5, 6, 7])]
    from ktdeploy.core.checks.threads import derive_threads
    assert derive_threads(f, 0) == (4, 2)
    assert derive_threads(f, 1) == (3, 2)


GPU_VM = GOLDEN / "gpu-h200-vm"


@pytest.mark.skipif(not (GPU_VM / "cpuinfo.txt").exists(), reason="gpu-h200-vm outputs not recorded yet "
                    "(the GPU helper records them on the GPU machine; see tests/golden/gpu-h200-vm/SOURCE.md)")
def test_amx_xeon_vm_with_h200():
    f = facts_of("gpu-h200-vm")
    assert f.cpu.has("amx_tile", "amx_int8", "amx_bf16", "avx512_bf16") and f.cpu.hypervisor
    if (GPU_VM / "nvidia_smi.txt").exists():
        assert f.gpu.count >= 1 and "H200" in f.gpu.gpus[0].name and f.gpu.gpus[0].memory_total_mib > 100_000
    if (GPU_VM / "amx_probe.json").exists():
        p = f.probes.amx
        assert p.listed and p.permission and (p.palettes or 0) >= 1 and p.tile_exec and p.correct
        # the AMX-BF16 tile multiply (tdpbf16ps) and vpermb ran there too (bench/gpu/cpu_probe.sh, 2026-12-04)
        assert p.amx_bf16_exec and p.amx_bf16_correct and p.avx512_vbmi_exec and p.avx512bw_exec
        assert best_variant(f) == "amx" and auto_backend(f, "bf16") == "AMXBF16"
    if (GPU_VM / "lscpu_json.txt").exists():
        assert len(f.cpu.numa_nodes) >= 1


def test_container_with_hidden_flags_and_limits():
    f = facts_of("container-hidden-flags-limits")
    assert f.layer == "container" and f.container.kind == "docker"
    assert "/.dockerenv" in f.container.evidence
    assert f.limits.cgroup_version == "v1" and f.limits.cgroup_memory_limit == 2 * 1024**3
    assert f.cpu.cpu_quota == 1.5
    assert f.limits.shm_total_bytes == 256 * 1024**2
    assert not f.cpu.has("avx512f") and not f.cpu.has("avx512_bf16") and f.cpu.has("avx512bw")
    assert f.probes.amx.avx512f_exec is True  # CPUID still has it: only /proc/cpuinfo was overridden
    assert f.probes.mempolicy.ok is False and f.probes.mempolicy.errno == 1
    assert f.path("/srv/models").exists is False and f.path("/tmp").exists
    assert best_variant(f) == "avx2"  # what kt-kernel's picker would conclude from this cpuinfo


def test_the_bandwidth_probe_every_gpu_campaign_runs_measures_this_machine():
    """bench/gpu/membw.py builds and runs bench/gpu/membw_probe.c as the GPU campaigns do (format_scale.campaign)."""
    import importlib.util
    import shutil
    from pathlib import Path

    if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        pytest.skip("no C compiler here")
    spec = importlib.util.spec_from_file_location("membw", Path(__file__).resolve().parents[4] / "bench/gpu/membw.py")
    assert spec and spec.loader
    membw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(membw)
    got = membw.measure(64)
    assert got["error"] is None and got["workers"] >= 1
    assert 0 < got["bytes"] <= 64 << 20 and got["copy_gbs"] > 0.1     # any machine copies faster than 100 MB/s
    membw.SOURCE = Path(__file__)                                        # not C: a failed build is said, not raised
    assert membw.measure(64)["error"].startswith("build failed")

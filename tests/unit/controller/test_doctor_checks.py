"""run_checks on recorded facts, and on recorded facts with one thing changed (the faults doctor must catch)."""

from ktdeploy.controller.doctor import DoctorReport, run_checks
from ktdeploy.core.checks.isa import best_variant, variant_check
from ktdeploy.core.checks.threads import derive_threads
from ktdeploy.core.facts.host import AmxProbe, Gpu
from tests.unit.core.facts.golden import facts_of


def by_name(results, layer=None):
    return {r.name: r for r in results if layer is None or r.layer == layer}


def dev():
    return facts_of("avx512-kvm-container")


def test_dev_machine_reports_amx_absent_and_fails_gpu():
    r = by_name(run_checks(dev()))
    assert r["cpu.amx.listed"].status == "warn" and "AMX absent" in r["cpu.amx.listed"].detail
    assert r["cpu.amx.tile_exec"].status == "skip"
    assert r["cpu.isa.avx512"].status == "pass"
    assert r["cpu.variant"].data["best"] == "avx512_bf16" and r["cpu.variant"].data["sft"] is True
    assert r["gpu.present"].status == "fail" and "--gpus all" in r["gpu.present"].fix
    assert r["docker.nvidia_runtime"].status == "fail" and "nvidia-ctk" in r["docker.nvidia_runtime"].fix
    assert r["numa.mempolicy"].status == "pass"


def test_amx_listed_but_tile_faults_is_distinct_from_absent():
    f = dev()
    f.cpu.flags = sorted(f.cpu.flags + ["amx_tile", "amx_int8", "amx_bf16"])
    f.probes.amx = AmxProbe(ran=True, listed=True, amx_int8=True, amx_bf16=True, permission=True, palettes=0,
                            tile_exec=False, correct=None, error="tile instruction raised SIGILL")
    r = by_name(run_checks(f))
    assert r["cpu.amx.listed"].status == "pass"
    assert r["cpu.amx.palette"].status == "fail" and "listed but unusable" in r["cpu.amx.palette"].detail
    assert r["cpu.amx.tile_exec"].status == "fail"
    assert r["cpu.kt_kernel_variant"].status == "fail" and "KT_KERNEL_CPU_VARIANT" in r["cpu.kt_kernel_variant"].fix
    assert best_variant(f) == "avx512_bf16"          # stepped down from kt-kernel's own pick (amx)
    vc = variant_check(f, "amx")
    assert vc.status == "fail" and "ktsft:avx512_bf16" in vc.fix and "tile_exec" in vc.detail


def test_amx_proven_selects_amx():
    f = dev()
    f.cpu.flags = sorted(f.cpu.flags + ["amx_tile", "amx_int8", "amx_bf16"])
    f.probes.amx = AmxProbe(ran=True, listed=True, amx_int8=True, amx_bf16=True, permission=True, palettes=1,
                            max_names=8, max_rows=16, bytes_per_row=64, tile_exec=True, correct=True)
    r = by_name(run_checks(f))
    assert [r[n].status for n in ("cpu.amx.permission", "cpu.amx.palette", "cpu.amx.tile_exec")] == ["pass"] * 3
    assert r["cpu.amx.bf16_exec"].status == "skip"     # an older probe: tdpbf16ps not attempted, AMX not refused
    assert best_variant(f) == "amx"
    f.probes.amx.amx_bf16_exec, f.probes.amx.amx_bf16_correct = True, False   # int8 tiles work, bf16 tiles lie
    r = by_name(run_checks(f))
    assert r["cpu.amx.bf16_exec"].status == "fail" and best_variant(f) == "avx512_bf16"


def test_hidden_flags_in_container_fail_layer_check():
    host, ctr = dev(), dev()
    ctr.cpu.flags = [x for x in ctr.cpu.flags if x not in ("avx512_bf16", "avx512f")]
    r = by_name(run_checks(host, container_facts=ctr))
    lc = r["layer.cpu_flags"]
    assert lc.status == "fail" and "avx512_bf16" in lc.data["hidden"] and "/proc/cpuinfo" in lc.fix


def test_gpus_hidden_by_container():
    host, ctr = dev(), dev()
    host.gpu.gpus = [Gpu(index=0, name="NVIDIA H200", memory_total_mib=143771)]
    host.gpu.nvidia_smi = "ok"
    r = by_name(run_checks(host, container_facts=ctr))
    assert r["layer.gpus"].status == "fail" and "nvidia" in r["layer.gpus"].fix


def test_threads_never_count_smt_and_follow_numa():
    f = dev()
    assert derive_threads(f, 0) == (2, 1)
    assert derive_threads(f, 1) == (1, 1)
    assert derive_threads(f, 5) == (1, 1)


def test_report_json_schema():
    f = dev()
    rep = DoctorReport(f, run_checks(f))
    j = rep.to_json()
    assert set(j) >= {"schema_version", "facts", "checks", "ok", "summary"}
    assert j["ok"] is False and rep.failed
    assert all(set(c) >= {"name", "status", "detail", "fix"} for c in j["checks"])


def test_container_golden_checks():
    f = facts_of("container-hidden-flags-limits")
    r = by_name(run_checks(f))
    assert r["numa.mempolicy"].status == "warn" and "SYS_NICE" in r["numa.mempolicy"].fix
    assert r["memory.shm"].status == "fail" and "256 MiB" in r["memory.shm"].detail
    assert r["cpu.isa.avx512"].status == "fail" and "hides" in r["cpu.isa.avx512"].detail
    assert "cgroup limit 2.0 GiB" in r["memory.host"].detail
    assert derive_threads(f, 0) == (1, 1)  # --cpus 1.5 caps the 2 cores at 1 thread
    assert r["docker.present"].status == "skip"  # inside the training container no docker is needed


def test_compare_dev_host_with_hidden_flag_container():
    r = by_name(run_checks(dev(), container_facts=facts_of("container-hidden-flags-limits")))
    lc = r["layer.cpu_flags"]
    assert lc.status == "fail" and set(lc.data["hidden"]) == {"avx512f", "avx512_bf16", "avx512_vnni"}


def test_dev_vm_on_emerald_rapids_names_the_vm_layer_hiding_amx():
    # The dev machine is family 6 model 207 (Emerald Rapids, which has AMX) under KVM without amx flags.
    r = by_name(run_checks(dev()))
    assert r["layer.vm_cpu_model"].status == "warn" and "Emerald Rapids" in r["layer.vm_cpu_model"].detail
    assert "host-passthrough" in r["layer.vm_cpu_model"].fix
    haswell = by_name(run_checks(facts_of("haswell-avx2-qemu")))
    assert "layer.vm_cpu_model" not in haswell and haswell["cpu.amx.listed"].status == "warn"


def test_recipe_shortfall_fails_once_in_plan_checks_with_the_knob():
    from pathlib import Path

    from ktdeploy.core.recipe import load_recipe

    recipe = load_recipe(Path(__file__).resolve().parents[3] / "recipes" / "qwen35-397b-bf16-lora.yaml")
    r = by_name(run_checks(dev(), recipe))
    assert r["plan.host_memory"].status == "fail"
    assert "AMXINT4" in r["plan.host_memory"].fix            # the knob that saves the most
    assert r["memory.host"].status != "fail"                 # the same shortfall is not reported twice
    assert not (r.get("disk.output") and r["disk.output"].status == "fail" and r["plan.disk"].status == "fail")


def test_the_tiny_models_fix_names_the_image_this_cpu_takes(tmp_path):
    """The fix for a missing tiny model is a command to paste: the image tag doctor resolved from the CPU
    (deploy.image: auto), never a `ktsft:<variant>` placeholder."""
    from ktdeploy.controller.connectors import LocalConnector
    from ktdeploy.controller.doctor import gather_data
    from ktdeploy.core.recipe import load_recipe
    from ktdeploy.core.variants import image

    recipe = load_recipe("recipes/tiny-moe-lora.yaml", overrides=[
        f"train.model_name_or_path={tmp_path}/models/tiny-qwen3-moe", f"train.dataset_dir={tmp_path}/data"])
    data = gather_data(LocalConnector(), dict(recipe.train))
    for golden in ("avx512-kvm-container", "haswell-avx2-qemu"):
        facts = facts_of(golden)
        fix = by_name(run_checks(facts, recipe, data_facts=data))["model.config"].fix
        assert "<variant>" not in fix and f" {image(best_variant(facts))} tiny-model {tmp_path}/models/" in fix, fix
        assert "ktdeploy image build" in fix

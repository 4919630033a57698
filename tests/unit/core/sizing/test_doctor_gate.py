"""Doctor's plan.* checks: fail below the prediction, say by how much and which knob brings it under."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktdeploy.core.facts.host import Gpu, GpuFacts, HostFacts, MemoryFacts, PathFacts
from ktdeploy.core.recipe import load_recipe
from ktdeploy.core.sizing import plan_recipe
from ktdeploy.core.sizing.calibration import band, upper_edges
from ktdeploy.core.sizing.checks import plan_check_results

RECIPES = Path(__file__).resolve().parents[4] / "recipes"
GiB = 2**30


def _facts(recipe, host_gib, gpu_mib, disk_gib, used_mib=0):
    out = recipe.deploy.volumes.output
    return HostFacts(
        memory=MemoryFacts(total_bytes=int(host_gib * GiB) + GiB, available_bytes=int(host_gib * GiB)),
        gpu=GpuFacts(nvidia_smi="ok", gpus=[Gpu(index=i, name="GPU", memory_total_mib=gpu_mib, memory_used_mib=used_mib)
                                            for i in recipe.deploy.gpus]),
        paths=[PathFacts(path=out, exists=True, is_dir=True, writable=True, checked=out, free_bytes=int(disk_gib * GiB))])


def _by_name(results):
    return {r.name: r for r in results}


@pytest.fixture(scope="module")
def bf16():
    r = load_recipe(RECIPES / "qwen35-397b-bf16-lora.yaml")
    return r, plan_recipe(r)[0]


def test_passes_with_headroom(bf16):
    r, plan = bf16
    edge = upper_edges(plan)
    res = _by_name(plan_check_results(r, _facts(r, edge["host"] + 50, 80 * 1024, plan.disk_gib + 100)))
    assert {n: x.status for n, x in res.items()} == {"plan.host_memory": "pass", "plan.gpu_memory": "pass",
                                                      "plan.disk": "pass"}


def test_host_short_names_amount_and_converted_weights(bf16):
    r, plan = bf16
    host = upper_edges(plan)["host"] - 150
    res = _by_name(plan_check_results(r, _facts(r, host, 80 * 1024, 1000)))["plan.host_memory"]
    assert res.status == "fail"
    assert "short by 150.0 GiB" in res.detail
    assert "INT8" in res.fix or "AMXINT4" in res.fix
    assert res.data["advice"] and all(a["fits"] for a in res.data["advice"] if a["change"] in res.fix)


def test_host_slightly_short_suggests_cache_depth_or_cutoff():
    r = load_recipe(RECIPES / "qwen35-397b-bf16-lora.yaml", ["train.cutoff_len=8192"])
    plan = plan_recipe(r)[0]
    res = _by_name(plan_check_results(r, _facts(r, upper_edges(plan)["host"] - 1.0, 80 * 1024, 1000)))["plan.host_memory"]
    assert res.status == "fail"
    assert "kt_max_cache_depth 2 -> 1" in res.fix or "cutoff_len 8192 -> 4096" in res.fix


def test_gpu_short_suggests_more_gpus_or_cutoff(bf16):
    r, plan = bf16
    mib = int((upper_edges(plan)["gpu"] - 2) * 1024)
    res = _by_name(plan_check_results(r, _facts(r, 2000, mib, 1000)))["plan.gpu_memory"]
    assert res.status == "fail" and "short by" in res.detail
    assert "num_processes 2 -> 4" in res.fix or "cutoff_len" in res.fix


def test_busy_gpu_counts_against_capacity(bf16):
    r, plan = bf16
    mib = int((upper_edges(plan)["gpu"] + 1) * 1024)
    ok = _by_name(plan_check_results(r, _facts(r, 2000, mib, 1000)))["plan.gpu_memory"]
    busy = _by_name(plan_check_results(r, _facts(r, 2000, mib, 1000, used_mib=4096)))["plan.gpu_memory"]
    assert ok.status == "pass" and busy.status == "fail"


def test_disk_short_suggests_save_total_limit(bf16):
    r, plan = bf16
    res = _by_name(plan_check_results(r, _facts(r, 2000, 80 * 1024, plan.disk_gib / 2)))["plan.disk"]
    assert res.status == "fail" and "save_total_limit" in res.fix


def test_unknown_capacity_skips(bf16):
    r, _ = bf16
    res = _by_name(plan_check_results(r, HostFacts()))
    assert all(x.status == "skip" for x in res.values())


def test_doctor_run_checks_gates_on_the_plan(bf16):
    from ktdeploy.controller.doctor import run_checks

    r, plan = bf16
    facts = _facts(r, upper_edges(plan)["host"] - 40, 80 * 1024, plan.disk_gib + 10)
    checks = {c.name: c for c in run_checks(facts, r)}
    assert checks["plan.host_memory"].status == "fail"
    assert "short by 40.0 GiB" in checks["plan.host_memory"].detail
    assert checks["plan.host_memory"].fix          # names the knob and the new figure
    assert checks["plan.gpu_memory"].status == "pass" and checks["plan.disk"].status == "pass"


def test_gate_is_the_upper_edge_of_the_band(bf16):
    """Capacity above the central prediction but below the band's upper edge fails: an under-prediction within
    the calibration error must not let a run start that OOMs later. The fix names a knob."""
    r, plan = bf16
    n = plan.setup["num_processes"]
    assert band("host", n) and band("host", n) > 0.01
    edge = upper_edges(plan)["host"]
    assert edge > plan.host_memory_gib
    cap = (plan.host_memory_gib + edge) / 2
    res = _by_name(plan_check_results(r, _facts(r, cap, 80 * 1024, 1000)))["plan.host_memory"]
    assert res.status == "fail"
    assert res.data["upper_edge_gib"] == round(edge, 2) and res.data["predicted_gib"] == round(plan.host_memory_gib, 2)
    assert "upper edge" in res.detail
    assert any(k in res.fix for k in ("kt_max_cache_depth", "cutoff_len", "INT8", "AMXINT4", "num_processes"))


def test_merge_counts_the_merged_model_on_the_output_volume():
    """deploy.serve.merge: the disk plan (and so doctor's plan.disk gate, before training) adds the merged model,
    BF16 whatever the base's format: the FP8 DeepSeek base doubles, the BF16 Qwen3.5 one is its own size."""
    for name in ("qwen35-397b-bf16-lora.yaml", "deepseek-v3-fp8-lora.yaml"):
        off = load_recipe(RECIPES / name)
        on = load_recipe(RECIPES / name, ["deploy.serve.merge=true"])
        p_off, arch, _ = plan_recipe(off)
        p_on = plan_recipe(on)[0]
        (term,) = [t for t in p_on.terms("disk") if t.name == "merged model"]
        assert term.gib == pytest.approx(arch.total_params * 2 / GiB)
        assert p_on.disk_gib == pytest.approx(p_off.disk_gib + term.gib)
        assert not [t for t in p_off.terms("disk") if t.name == "merged model"]
        # a disk with room for the run but not for the merged model fails doctor's plan.disk
        between = p_off.disk_gib * 1.5 + 1
        assert between < upper_edges(p_on)["disk"], name
        bad = _by_name(plan_check_results(on, _facts(on, 4096, 200_000, between)))["plan.disk"]
        good = _by_name(plan_check_results(off, _facts(off, 4096, 200_000, between)))["plan.disk"]
        assert bad.status == "fail" and good.status == "pass", (bad.detail, good.detail)


def test_merge_adds_the_model_size_to_the_threshold_without_a_planner():
    """No config.json known (no planner): the LoRA threshold (20 GiB) grows by the weights on disk for
    deploy.serve.merge, twice that for an FP8 base (written as BF16)."""
    from ktdeploy.core.checks.resources import threshold_requirements

    for name, factor in (("qwen35-397b-bf16-lora.yaml", 1), ("deepseek-v3-fp8-lora.yaml", 2)):
        r = load_recipe(RECIPES / name, ["deploy.serve.merge=true"])
        model = r.train["model_name_or_path"]
        facts = HostFacts(paths=[PathFacts(path=model, exists=True, is_dir=True, checked=model, used_bytes=100 * GiB)])
        off = threshold_requirements(load_recipe(RECIPES / name), facts)
        on = threshold_requirements(r, facts)
        assert on.output_disk_bytes - off.output_disk_bytes == factor * 100 * GiB, name
        assert "merged model" in on.basis["output_disk"]

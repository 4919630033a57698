"""The resource model: monotonic in every knob, and within ±10 % of the cookbook's measured peaks."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from ktdeploy.core.sizing.anchors import COOKBOOK_QWEN3_235B
from ktdeploy.core.sizing.estimate import estimate
from ktdeploy.core.sizing.model_config import load_model_config

MODELS = Path(__file__).resolve().parents[4] / "recipes" / "models"


@pytest.fixture(scope="module")
def arch():
    return load_model_config(MODELS / "Qwen3-235B-A22B-Instruct-2507.json")


def _dicts(**train_kt):
    t = copy.deepcopy(COOKBOOK_QWEN3_235B.train)
    a = copy.deepcopy(COOKBOOK_QWEN3_235B.accelerate)
    for k, v in train_kt.items():
        if k.startswith("kt_") and k != "kt_cpu_activation":
            t["kt_config"][k] = v
        elif k == "num_processes":
            a[k] = v
        else:
            t[k] = v
    return t, a


def test_cookbook_row_within_ten_percent():
    a = COOKBOOK_QWEN3_235B
    plan = estimate((a.train, a.accelerate), a.arch())
    assert plan.host_memory_gib == pytest.approx(a.peak_host_rss_gib, rel=0.10)
    assert plan.gpu_memory_gib_per_gpu == pytest.approx(a.peak_gpu_mem_gib, rel=0.10)


def test_breakdown_sums_to_totals(arch):
    plan = estimate(_dicts(), arch)
    for res, total in (("host", plan.host_memory_gib), ("gpu", plan.gpu_memory_gib_per_gpu), ("disk", plan.disk_gib)):
        assert sum(t.gib for t in plan.terms(res)) == pytest.approx(total)
        assert all(t.explanation for t in plan.terms(res))


@pytest.mark.parametrize("resource", ["host_memory_gib", "gpu_memory_gib_per_gpu"])
def test_cutoff_len_up_means_more_memory(arch, resource):
    values = [getattr(estimate(_dicts(cutoff_len=c), arch), resource) for c in (1024, 2048, 4096, 8192)]
    assert values == sorted(values) and values[0] < values[-1]


def test_cache_depth_and_batch_raise_host(arch):
    assert estimate(_dicts(kt_max_cache_depth=4), arch).host_memory_gib > estimate(_dicts(kt_max_cache_depth=1), arch).host_memory_gib
    assert estimate(_dicts(per_device_train_batch_size=4), arch).host_memory_gib > estimate(_dicts(), arch).host_memory_gib


def test_expert_formats_order(arch):
    def experts(**kt):
        plan = estimate(_dicts(**kt), arch)
        return next(t.gib for t in plan.terms("host") if t.name.startswith("routed experts"))
    int4 = experts(kt_backend="AMXINT4")
    int8 = experts(kt_expert_weight_format="int8")
    fp8 = experts(kt_expert_weight_format="fp8")
    bf16 = experts(kt_expert_weight_format="bf16")
    params_gib = arch.routed_expert_params / 2**30
    assert int4 < fp8 < bf16 and int4 < int8 < bf16
    assert bf16 == pytest.approx(2 * params_gib)
    assert int4 == pytest.approx(0.5 * params_gib, rel=0.01)
    # INT8 and FP8 are both one byte per weight; their scales differ (kt-kernel BufferB sizes: INT8 one fp32
    # per output channel, FP8 one fp32 per 128x128 block), so they sit within 1 % of each other.
    assert int8 == pytest.approx(fp8, rel=0.01) and fp8 == pytest.approx(params_gib, rel=0.001)


def test_more_gpus_less_gpu_memory_per_gpu(arch):
    # From 2 GPUs on, FSDP shards fp32 masters: more GPUs, less each. One GPU is not on that line: its LoRA run
    # keeps the frozen weights bf16 with no FSDP upcast or all-gather (measured, bench/results/gpu/weight_scale).
    per_gpu = [estimate(_dicts(), arch, gpus=g).gpu_memory_gib_per_gpu for g in (2, 4, 8)]
    assert per_gpu == sorted(per_gpu, reverse=True) and per_gpu[0] > per_gpu[-1]
    one = estimate(_dicts(), arch, gpus=1)
    assert any(t.name == "non-expert weights (bf16)" for t in one.terms("gpu"))
    assert any(t.name == "non-expert weights (fp32)" for t in estimate(_dicts(), arch, gpus=2).terms("gpu"))


def test_unshared_backward_buffers_double_experts(arch):
    shared = estimate(_dicts(), arch).host_memory_gib
    unshared = estimate(_dicts(kt_share_backward_bb=False), arch).host_memory_gib
    assert unshared - shared > 0.9 * 2 * arch.routed_expert_params / 2**30


def test_retain_keeps_a_cache_per_layer(arch):
    base = estimate(_dicts(), arch)
    retain = estimate(_dicts(kt_cpu_activation="retain"), arch)
    cache = lambda p: next(t.gib for t in p.terms("host") if t.name == "KT forward cache")  # noqa: E731
    assert cache(retain) == pytest.approx(cache(base) * arch.moe_layers)


def test_full_finetuning_adds_optimizer_state_and_full_checkpoints(arch):
    lora = estimate(_dicts(), arch)
    t, a = _dicts()
    t["finetuning_type"] = "full"
    full = estimate((t, a), arch)
    assert full.host_memory_gib > lora.host_memory_gib + 8 * arch.routed_expert_params / 2**30
    assert full.disk_gib > 2 * arch.total_params / 2**30
    assert any("full FT" in term.name for term in full.terms("host"))


def test_disk_scales_with_kept_checkpoints(arch):
    one = estimate(_dicts(save_total_limit=1), arch).disk_gib
    five = estimate(_dicts(save_total_limit=5), arch).disk_gib
    assert five > one
    plan = estimate(_dicts(), arch)      # no save_total_limit and no max_steps: an assumption, said out loud
    assert any("save_total_limit" in n for n in plan.notes)


def test_save_strategy_no_and_epoch(arch):
    none = estimate(_dicts(save_strategy="no"), arch)
    assert next(t.gib for t in none.terms("disk") if t.name == "checkpoints") == 0
    epochs = estimate(_dicts(save_strategy="epoch", num_train_epochs=2), arch)
    limit1 = estimate(_dicts(save_total_limit=1), arch)
    ck = lambda p: next(t.gib for t in p.terms("disk") if t.name == "checkpoints")  # noqa: E731
    assert ck(epochs) == pytest.approx(2 * ck(limit1))


def test_every_calibrated_peak_within_ten_percent_and_constants_match_the_fit():
    """The committed measurements (cookbook row + the GPU machine's tiny runs) stay within ±10 %, and the constants
    in estimate.py are the ones `bench/planner_calibration.py --fit` derives from them (no hand-tuned drift)."""
    import importlib.util
    from pathlib import Path

    from ktdeploy.core.sizing.estimate import MEASURED

    path = Path(__file__).resolve().parents[4] / "bench" / "planner_calibration.py"
    spec = importlib.util.spec_from_file_location("planner_calibration", path)
    cal = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cal)
    _, errors = cal.table(cal._cases())
    assert len(errors) >= 8
    assert max(abs(e) for e in errors) <= 10.0
    for name, value in cal.fit().items():
        assert MEASURED[name].value == pytest.approx(value, rel=0.01, abs=1e-3), name


# ---- issue 32: real vocabularies, the loss, FSDP2's copies, the allocator's reserve ----------------------------

def _one_gpu_tiny(vocab: int, **train):
    """The vocab_scale body (hidden 2048, 8 layers, 32 experts x 768) on one GPU, LoRA, cutoff 512 x 4."""
    from ktdeploy.core.sizing.model_config import parse_model_config
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
           "num_hidden_layers": 8, "num_experts": 32, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
           "intermediate_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128,
           "vocab_size": vocab, "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False}
    t = {"finetuning_type": "lora", "lora_rank": 8, "cutoff_len": 512, "per_device_train_batch_size": 4,
         "preprocessing_num_workers": 2, "kt_config": {"kt_expert_weight_format": "bf16"}, **train}
    a = {"distributed_type": "FSDP", "mixed_precision": "bf16", "num_processes": 1,
         "fsdp_config": {"fsdp_cpu_ram_efficient_loading": True}}
    return (t, a), parse_model_config(cfg, source=f"v{vocab}")


def _term(plan, resource, name):
    return next((t.gib for t in plan.terms(resource) if t.name.startswith(name)), 0.0)


def test_the_loss_is_12_bytes_per_token_and_vocabulary_entry():
    big_d, big = _one_gpu_tiny(151_936)
    plan = estimate(big_d, big)
    assert _term(plan, "gpu", "logits and loss") == pytest.approx(2048 * 151_936 * 12 / 2**30)
    long_d = ({**big_d[0], "cutoff_len": 4096, "per_device_train_batch_size": 1}, big_d[1])
    assert _term(estimate(long_d, big), "gpu", "logits and loss") == pytest.approx(2 * 2048 * 151_936 * 12 / 2**30)


def test_loss_and_a_layers_recompute_are_not_counted_together():
    """At a 4,096-token vocabulary the recomputed layer sets the peak; at 151,936 the loss does; never both."""
    small_d, small = _one_gpu_tiny(4096)
    names = {t.name for t in estimate(small_d, small).terms("gpu")}
    assert "one layer's recompute working set" in names and "logits and loss" not in names
    big_d, big = _one_gpu_tiny(151_936)
    names = {t.name for t in estimate(big_d, big).terms("gpu")}
    assert "logits and loss" in names and "one layer's recompute working set" not in names


def test_fsdp2_keeps_an_unsharded_copy_of_the_embeddings_even_on_one_gpu():
    d, arch = _one_gpu_tiny(151_936)
    copies = _term(estimate(d, arch), "gpu", "FSDP unsharded compute copies")
    assert copies * 2**30 >= arch.embedding_params * 2
    no_fsdp = (d[0], {"mixed_precision": "bf16", "num_processes": 1})
    assert _term(estimate(no_fsdp, arch), "gpu", "FSDP unsharded compute copies") == 0


def test_reserve_holds_the_freed_logits_block_and_full_ft_reduction_stream():
    d, arch = _one_gpu_tiny(151_936)
    lora = _term(estimate(d, arch), "gpu", "caching-allocator reserve")
    assert lora * 2**30 >= 2048 * 151_936 * 2                     # the bf16 logits block
    full_d = ({k: v for k, v in d[0].items() if k != "lora_rank"} | {"finetuning_type": "full"}, d[1])
    full = _term(estimate(full_d, arch), "gpu", "caching-allocator reserve")
    assert (full - lora) * 2**30 == pytest.approx(arch.embedding_params * 6, rel=0.02)   # bf16 + fp32 reduce


def test_host_peak_does_not_follow_the_vocabulary_and_full_ft_pays_the_save():
    """Measured: 32,000 and 151,936 tokens peak at the same host RSS; the non-expert weights leave the CPU."""
    (d32, a32), (d152, a152) = _one_gpu_tiny(32_000), _one_gpu_tiny(151_936)
    assert estimate(d32, a32).host_memory_gib == pytest.approx(estimate(d152, a152).host_memory_gib, abs=0.01)
    full_d = ({k: v for k, v in d152[0].items() if k != "lora_rank"} | {"finetuning_type": "full"}, d152[1])
    save = _term(estimate(full_d, a152), "host", "full state dict at save")
    assert save * 2**30 == pytest.approx(a152.non_expert_params * 4)


def test_an_all_moe_model_has_no_dense_mlp_on_the_gpu():
    """config.json's intermediate_size of a Qwen3-MoE with every layer sparse describes no layer."""
    _, arch = _one_gpu_tiny(4096)
    assert arch.num_layers == arch.moe_layers and arch.widest_gpu_mlp == 0

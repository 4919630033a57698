"""The resource model as terms (core/sizing/memory_terms.py): each term a named function whose docstring says where
its shape comes from, composed by estimate() into one list in the order the plan shows; a term is written as it
always was in `ktdeploy plan --json`."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktdeploy.core.sizing import memory_terms as mt
from ktdeploy.core.sizing.estimate import MEASURED, estimate
from ktdeploy.core.sizing.model_config import load_model_config
from ktdeploy.core.sizing.setup import setup_from
from ktdeploy.core.sizing.terms import Term
from tests.unit.core.sizing.test_estimate import _dicts

MODELS = Path(__file__).resolve().parents[4] / "recipes" / "models"
TERM_FNS = [*mt.HOST_TERMS, mt.tokenization_workers, *mt.GPU_TERMS, mt.allocator_slack, mt.cuda_context,
            *mt.DISK_TERMS]


@pytest.fixture(scope="module")
def arch():
    return load_model_config(MODELS / "Qwen3-235B-A22B-Instruct-2507.json")


@pytest.mark.parametrize("fn", TERM_FNS, ids=lambda f: f.__name__)
def test_each_term_says_where_it_comes_from(fn):
    assert (fn.__doc__ or "").strip(), f"{fn.__name__}: say the source of the term's shape"


@pytest.mark.parametrize("knobs", [{}, {"num_processes": 1}, {"finetuning_type": "full"},
                                   {"disable_gradient_checkpointing": True}, {"kt_weight_lifecycle": "ephemeral"}])
def test_the_plan_is_its_terms_in_order(arch, knobs):
    train, acc = _dicts(**knobs)
    plan = estimate((train, acc), arch)
    m = mt.Model(setup_from(train, acc), arch, MEASURED)
    fns = [*mt.HOST_TERMS, *mt.GPU_TERMS, *mt.DISK_TERMS]
    singles = [t for t in (fn(m) for fn in fns) if t is not None]
    assert [t.name for t in plan.breakdown if t.name not in ("tokenization workers (before training)",
                                                             "allocator slack", "CUDA context and workspaces")] == \
        [t.name for t in singles]
    assert [t.resource for t in plan.breakdown] == sorted((t.resource for t in plan.breakdown),
                                                          key=["host", "gpu", "disk"].index)
    assert plan.host_memory_gib == sum(t.value for t in plan.breakdown if t.resource == "host")


def test_a_term_is_written_as_the_plan_always_wrote_it():
    t = Term("host", "KT work pools", 1.23456, "scratch")
    assert t.gib == t.value and t.to_json() == {"resource": "host", "name": "KT work pools", "gib": 1.235,
                                                "explanation": "scratch"}


def _one(train_acc, arch, name):
    plan = estimate(train_acc, arch)
    return next((t for t in plan.breakdown if t.name == name), None)


def test_an_fp8_release_counts_its_dequantized_float32_weights_once_and_only_where_they_are_float32():
    """transformers' Fp8Dequantize leaves an FP8 release's attention/shared/dense weights float32: +4 B/param on the
    host, +2 B/param on the GPU only where the plan would otherwise hold them bf16 (one-GPU LoRA)."""
    fp8 = load_model_config(MODELS / "DeepSeek-V3.json")
    assert fp8.native_format == "fp8"
    n = fp8.linear_non_expert_params
    assert 0 < n < fp8.non_expert_params - fp8.embedding_params   # the routers are not FP8
    one_gpu = _dicts(num_processes=1, kt_expert_weight_format="fp8")
    host = _one(one_gpu, fp8, "FP8 non-expert weights dequantized (float32)")
    gpu = [t for t in estimate(one_gpu, fp8).breakdown if t.name == "FP8 non-expert weights dequantized (float32)"
           and t.resource == "gpu"]
    assert host is not None and host.value == pytest.approx(n * 4 / 2**30)
    assert len(gpu) == 1 and gpu[0].value == pytest.approx(n * 2 / 2**30)
    two_gpus = [t for t in estimate(_dicts(num_processes=2, kt_expert_weight_format="fp8"), fp8).breakdown
                if t.name.startswith("FP8 non-expert")]
    assert [t.resource for t in two_gpus] == ["host"]   # FSDP's fp32 upcast already counts the GPU side
    bf16 = load_model_config(MODELS / "Qwen3-235B-A22B-Instruct-2507.json")
    assert not [t for t in estimate(_dicts(num_processes=1), bf16).breakdown if t.name.startswith("FP8 non-expert")]


def test_a_full_fine_tune_holds_the_measured_bytes_per_expert_parameter(arch):
    t = _one(_dicts(finetuning_type="full"), arch, "expert trainable copies, grads, AdamW (full FT)")
    assert t is not None and t.value == pytest.approx(arch.routed_expert_params * mt.FULL_FT_EXPERT_STATE_BYTES / 2**30)
    assert _one(_dicts(), arch, "expert trainable copies, grads, AdamW (full FT)") is None


def test_the_format_scale_table_is_fresh_and_within_five_percent_held_out():
    """bench/results/format-scale/README.md is today's planner on the committed GPU runs (issue 42 item 4)."""
    import importlib.util

    path = Path(__file__).resolve().parents[4] / "bench" / "format_scale_table.py"
    spec = importlib.util.spec_from_file_location("format_scale_table", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    rows = mod.rows()
    assert (mod.OUT).read_text() == mod.render(rows), "run: python bench/format_scale_table.py"
    held = [r for r in rows if r["set"] == "held out"]
    assert {r["run"].split("/")[1] for r in held} == {"bf16", "fp8", "int8", "amxint4", "full"}
    for r in held:
        assert abs(r["plan_host"] - r["host"]) / r["host"] <= mod.LIMIT, r
        assert abs(r["plan_gpu"] - r["gpu"]) / r["gpu"] <= mod.LIMIT, r
        assert r["host"] <= r["edge_host"] and r["gpu"] <= r["edge_gpu"], r

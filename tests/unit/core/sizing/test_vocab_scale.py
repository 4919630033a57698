"""The pure parts of bench/gpu/vocab_scale.py (issue 32's device call) and of weight_scale.py's pre-weights
parser: the cases and their order, the time plan, the recipe overrides, the environment, the record reader and
the gpu_peaks.json entry the planner reads back."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "bench/gpu"))
spec = importlib.util.spec_from_file_location("vocab_scale", ROOT / "bench/gpu/vocab_scale.py")
vs = importlib.util.module_from_spec(spec)
sys.modules["vocab_scale"] = vs
spec.loader.exec_module(vs)
ws = vs.ws


def test_cases_cover_the_issue():
    vocabs = {vs.BODIES[c.body].vocab_size for c in vs.CASES if c.cutoff == 512}
    assert {32_000, 129_280, 151_936} <= vocabs
    assert {(c.cutoff, c.batch) for c in vs.CASES if c.fill} >= {(512, 4), (2048, 1), (4096, 1)}
    assert {c.finetuning for c in vs.CASES} == {"lora", "full"}
    # both allocator settings on the same shapes, the held-out run of the issue first
    assert vs.CASES[0].name == "v152-var" and vs.CASES[1].name == "v152-var-es"
    pairs = {(c.body, c.cutoff, c.batch, c.fill) for c in vs.CASES if c.alloc == "default"}
    assert all(any((c.body, c.cutoff, c.batch, c.fill) == p and c.alloc == "expandable" for c in vs.CASES)
               for p in pairs)
    assert len({c.name for c in vs.CASES}) == len(vs.CASES)


def test_plan_keeps_priority_and_skips_what_does_not_fit():
    run, skip = vs.plan_cases(vs.CASES, budget_s=500, spent_s=70)
    order = [vs.CASES.index(c) for c in run]
    assert order == sorted(order) and order[:2] == [0, 1]        # priority kept, the first cases always run
    assert sum(vs.est_seconds(c) for c in run) <= 430 and skip
    assert vs.plan_cases(vs.CASES, budget_s=1e6) == (vs.CASES, [])
    assert vs.plan_cases(vs.CASES, budget_s=10) == ([], vs.CASES)


def test_overrides_full_finetune_has_no_lora_and_quotes_no(tmp_path):
    root = Path("/srv/ktdeploy")
    lora = vs.sets(vs.CASE_BY_NAME["v152-f512-es"], root / "models/vs-v152", root / "output")
    full = vs.sets(vs.CASE_BY_NAME["v152-full-es"], root / "models/vs-v152s", root / "output")
    assert "train.lora_rank=8" in lora and not any("lora" in v for v in full)
    assert "train.save_strategy='no'" in full            # unquoted, YAML 1.1 reads a boolean
    assert "train.dataset=ws_fill_512" in lora and not any(v.startswith("deploy.") for v in lora)
    moved = vs.sets(vs.CASE_BY_NAME["v152-var"], tmp_path / "models/x", tmp_path / "output")
    assert f"deploy.volumes.model={tmp_path / 'models'}" in moved and "train.dataset=tiny_sft_long" in moved
    recipe = vs.full_recipe(tmp_path)
    from ruamel.yaml import YAML
    doc = YAML(typ="safe", pure=True).load(recipe.read_text())
    assert doc["train"]["finetuning_type"] == "full" and "lora_rank" not in doc["train"]


def test_environment_sets_the_allocator_both_ways():
    base = {"PATH": "/bin", "PYTORCH_CUDA_ALLOC_CONF": "something"}
    assert vs.case_env(vs.CASE_BY_NAME["v152-var"], base)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    env = vs.case_env(vs.CASE_BY_NAME["v152-var-es"], base)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True" and env["RECORD_VRAM"] == "1"


def test_metrics_peaks_reads_torch_allocated_and_reserved():
    rows = [{"step": 0, "gc_frozen": False}, {"step": 1, "peak_gpu_mem_bytes": 2**30, "tokens_seen": 5},
            {"step": 2, "peak_gpu_mem_bytes": 3 * 2**30, "peak_gpu_reserved_bytes": 5 * 2**30, "tokens_seen": 9}]
    text = "\n".join(json.dumps(r) for r in rows) + "\n{torn"
    m = vs.metrics_peaks(text)
    assert m["torch_alloc_gib"] == 3.0 and m["torch_reserved_gib"] == 5.0
    assert m["per_step"] == [[1, 1.0, 0.0, 5], [2, 3.0, 5.0, 9]]
    assert vs.metrics_peaks("")["torch_alloc_gib"] is None


def test_entry_is_a_calibration_point():
    from ktdeploy.core.sizing.calibration import gpu_peak_points
    c = vs.CASE_BY_NAME["v152-full-es"]
    cfg = vs.BODIES[c.body].shape(c).config_dict()
    m = {"train": {"finetuning_type": "full", "cutoff_len": 512, "per_device_train_batch_size": 4},
         "accelerate": {"distributed_type": "FSDP", "mixed_precision": "bf16", "num_processes": 1},
         "peak_host_rss_gib": 8.5, "peak_gpu_used_gib_nvsmi": 20.8, "peak_gpu_alloc_gib": None,
         "torch_alloc_gib": 15.3, "torch_reserved_gib": 19.5}
    e = vs.entry(c, cfg, m, "test")
    assert e["peak_gpu_mem_gib"] == 15.3 and e["peak_gpu_reserved_gib"] == 19.5
    assert e["alloc_conf"] == "expandable_segments:True" and e["finetuning"] == "full"
    doc = ws.append_runs({"runs": []}, [e])
    (p,) = gpu_peak_points(doc)
    assert p.gpu_reserved_gib == 19.5 and p.arch.vocab_size == 151_936 and p.train["finetuning_type"] == "full"
    with pytest.raises(ValueError, match="not a calibration point"):
        ws.append_runs(doc, [{**e, "peak_gpu_used_gib_nvsmi": 0}])


LOG = """[INFO|modeling_utils.py:720] 2026-12-04 17:14:19,066 >> loading weights file /srv/m/model.safetensors
[INFO|trainer.py:1650] 2026-12-04 17:14:22,720 >> ***** Running training *****
{'loss': '8.9', 'train_runtime': '3.076', 'train_tokens_per_second': '665'}
"""


def test_pre_weights_peak_places_the_log_on_the_timeline():
    # first trainer-log line at 32.8 s = Running training + 3.076 s; the weights started 3.654 s before that
    timeline = [[20.0, 1.3], [25.1, 3.397], [26.0, 3.61], [27.0, 4.4], [31.9, 6.18]]
    assert ws.pre_weights_peak(timeline, 32.8, LOG) == 3.61
    assert ws.pre_weights_peak(timeline, 32.8, "no lines") is None
    assert ws.pre_weights_peak([[30.0, 6.0]], 32.8, LOG) is None
    doc = ws.annotate_pre_weights({"runs": [{"name": "a", "rss_timeline": timeline,
                                             "rss_phases": {"train_start_s": 32.8}}, {"name": "b"}]}, {"a": LOG})
    assert doc["runs"][0]["pre_weights_peak_gib"] == 3.61 and "pre_weights_peak_gib" not in doc["runs"][1]

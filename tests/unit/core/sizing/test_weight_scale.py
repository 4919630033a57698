"""The pure parts of bench/gpu/weight_scale.py: shapes, sizes, machine fit, call grouping, RSS timeline,
the gpu_peaks.json entry and the append."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
spec = importlib.util.spec_from_file_location("weight_scale", ROOT / "bench/gpu/weight_scale.py")
ws = importlib.util.module_from_spec(spec)
sys.modules["weight_scale"] = ws
spec.loader.exec_module(ws)

GB, GIB = 1e9, 2**30


def test_shapes_span_5_to_40_gb_and_vary_each_axis():
    sizes = [ws.expert_bytes(s) / GB for s in ws.SHAPES]
    assert min(sizes) >= 4.9 and max(sizes) <= 40.5 and max(sizes) >= 35
    assert len({s.name for s in ws.SHAPES}) == len(ws.SHAPES)
    for axis in ("num_experts", "moe_intermediate_size", "num_experts_per_tok", "num_hidden_layers",
                 "hidden_size", "lora_rank", "cutoff_len"):
        assert len({getattr(s, axis) for s in ws.SHAPES}) >= 2, axis


def test_expert_bytes_matches_the_planner():
    from ktdeploy.core.sizing.model_config import parse_model_config
    for s in ws.SHAPES:
        arch = parse_model_config(s.config_dict(), source=s.name)
        assert arch.routed_expert_params * 2 == ws.expert_bytes(s)
        assert arch.non_expert_params == pytest.approx(ws.non_expert_params(s), rel=0.02)


def test_every_shape_fits_the_gpu_machine_and_a_too_big_one_does_not():
    for s in ws.SHAPES:
        ok, why = ws.fits_machine(s)
        assert ok, (s.name, why)
    huge = ws.Shape("huge", 4096, 48, 256, 8, 1536)
    ok, why = ws.fits_machine(huge)
    assert not ok and "disk" in why
    ok, why = ws.fits_machine(ws.SHAPES[0], ram_gib=10)
    assert not ok and "RAM" in why


def test_group_calls_keeps_each_call_under_the_limit():
    calls = ws.group_calls(ws.SHAPES, steps=6, call_s=540)
    assert [n for c in calls for n in c] == [s.name for s in ws.SHAPES]
    for c in calls:
        t = sum(ws.run_seconds(ws.SHAPE_BY_NAME[n], 6) for n in c)
        assert len(c) == 1 or t <= 540
    assert ws.group_calls(ws.SHAPES[:1], steps=6, call_s=1) == [[ws.SHAPES[0].name]]


def test_timeline_splits_load_and_training_peaks():
    samples = [(0.0, 1 * GIB), (5.0, 10 * GIB), (9.0, 6 * GIB), (10.0, 7 * GIB), (20.0, 8 * GIB)]
    out = ws.summarize_timeline(samples, train_start_s=10.0)
    assert out["peak_gib"] == 10.0 and out["peak_at_s"] == 5.0
    assert out["load_peak_gib"] == 10.0 and out["train_peak_gib"] == 8.0 and out["train_peak_at_s"] == 20.0
    assert "load_peak_gib" not in ws.summarize_timeline(samples, None)
    assert ws.thin(samples, every_s=10.0) == [[5.0, 10.0], [10.0, 7.0], [20.0, 8.0]]


def _entry(name="w5-e64", host=9.0, gpu=2.0):
    s = ws.SHAPE_BY_NAME["w5-e64"]
    m = {"peak_host_rss_gib": host, "peak_gpu_used_gib_nvsmi": gpu, "peak_gpu_alloc_gib": 0.5}
    e = ws.peaks_entry(s, s.config_dict(), {"lora_rank": 8}, {"num_processes": 1}, m, "test provenance")
    return {**e, "name": name}


def test_entry_is_readable_by_the_calibration():
    from ktdeploy.core.sizing.calibration import gpu_peak_points
    e = _entry()
    assert e["source"] == "test provenance" and e["expert_gb"] == pytest.approx(5.03, abs=0.01)
    (p,) = gpu_peak_points({"runs": [e]})
    assert p.host_gib == 9.0 and p.gpu_gib == 2.0 and p.num_processes == 1 and not p.fitted


def test_append_replaces_same_name_and_refuses_failed_runs():
    doc = {"runs": [{"name": "small", "peak_host_rss_gib": 3.4}], "how": "x"}
    out = ws.append_runs(doc, [_entry()])
    assert [r["name"] for r in out["runs"]] == ["small", "w5-e64"] and out["how"] == "x"
    again = ws.append_runs(out, [_entry(host=9.5)])
    assert [r["name"] for r in again["runs"]] == ["small", "w5-e64"] and again["runs"][-1]["peak_host_rss_gib"] == 9.5
    with pytest.raises(ValueError, match="not a calibration point"):
        ws.append_runs(doc, [_entry(host=None)])
    assert doc["runs"] == [{"name": "small", "peak_host_rss_gib": 3.4}]


def test_fill_dataset_samples_exceed_the_cutoff_and_are_registered(tmp_path):
    """A point that measures the token terms must train on cutoff x batch tokens (the planner's worst case):
    every sample has more words than the cutoff (each word is at least one token), and dataset_info names it."""
    import json

    build_fill_dataset, SHAPE_BY_NAME = ws.build_fill_dataset, ws.SHAPE_BY_NAME
    (tmp_path / "dataset_info.json").write_text(json.dumps({"other": {"file_name": "other.json"}}))
    name = build_fill_dataset(tmp_path, 2048, rows=8)
    rows = json.loads((tmp_path / f"{name}.json").read_text())
    assert len(rows) == 8
    assert all(len(r["instruction"].split()) > 2048 for r in rows)
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    assert info[name] == {"file_name": f"{name}.json"} and "other" in info
    assert SHAPE_BY_NAME["w10-c2048"].dataset == name
    assert SHAPE_BY_NAME["w10-e80"].dataset == "tiny_sft_long"

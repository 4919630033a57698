"""The trainer TEST DOUBLE writes what kt-kernel 0.7.2 + LlamaFactory-KT wrote on the GPU machine
(bench/results/gpu/proof: the tiny "small" model, r=8, alpha=16), and the real converter turns it into what it
turned the real output into."""

from __future__ import annotations

import json
from pathlib import Path

from ktdeploy.agent.convert import convert
from tests.fakes import kt_layout

PROOF = Path(__file__).resolve().parents[3] / "bench/results/gpu/proof"
BASE = "/srv/ktdeploy/models/tiny-qwen3-moe"


def test_files_names_shapes_and_sizes_match_the_real_output(tmp_path):
    kt_layout.write_lora_adapter(str(tmp_path / "out"), base=BASE, rank=8, alpha=16)
    real = json.loads((PROOF / "output/kt_adapter_manifest.json").read_text())
    fake = json.loads((tmp_path / "out/kt_adapter_manifest.json").read_text())
    assert {k: v for k, v in fake.items() if k != "artifacts"} == {k: v for k, v in real.items() if k != "artifacts"}
    assert fake["artifacts"].keys() == real["artifacts"].keys()
    for name, rec in real["artifacts"].items():
        assert fake["artifacts"][name]["size"] == rec["size"], name  # same bytes: same header, dtypes, shapes
    f, r = fake["artifacts"]["fused_expert_lora.safetensors"], real["artifacts"]["fused_expert_lora.safetensors"]
    assert f["tensors"] == r["tensors"] and f["tensor_count"] == r["tensor_count"] == 24
    assert json.loads((tmp_path / "out/adapter_config.json").read_text()) == \
        json.loads((PROOF / "output/adapter_config.json").read_text())


def test_real_converter_gives_the_recorded_summary(tmp_path):
    kt_layout.write_lora_adapter(str(tmp_path / "out"), base=BASE)
    got = convert(tmp_path / "out", tmp_path / "out-sglang")
    want = json.loads((PROOF / "converted/ktdeploy_convert.json").read_text())["summary"]
    for k in ("rank", "lora_alpha", "num_layers", "num_experts", "expert_tensors", "nonexpert_tensors",
              "target_modules", "base_model_name_or_path", "checks"):
        assert getattr(got, k) == want[k], k
    assert got.bytes_written == want["bytes_written"]


def test_full_finetune_output_converts_to_a_servable_model(tmp_path):
    from ktdeploy.agent import safetensors_io as st
    from ktdeploy.agent.tiny import SIZES

    kt_layout.write_full_model(str(tmp_path / "full"))
    cfg = json.loads((tmp_path / "full/config.json").read_text())
    want = SIZES["small"].config_dict()
    assert {k: cfg[k] for k in want} == want
    index, _ = st.read_header(tmp_path / "full/model.safetensors")
    assert not any(".experts." in k for k in index)           # HF save: experts dropped, they live in KT Full
    s = convert(tmp_path / "full", tmp_path / "full-sglang")  # the same entry point `up` runs
    assert s.kind == "full" and s.num_layers == 4 and s.num_experts == 16 and s.expert_tensors == 4 * 16 * 3
    out = tmp_path / "full-sglang"
    wm = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    experts, _ = st.read_header(out / "model-kt-experts.safetensors")
    assert experts["model.layers.3.mlp.experts.15.down_proj.weight"].shape == (512, 256)
    assert experts["model.layers.0.mlp.experts.0.gate_proj.weight"].shape == (256, 512)
    assert set(wm) == set(index) | set(experts) and wm["model.layers.0.mlp.gate.weight"] == "model.safetensors"
    assert (out / "config.json").is_file() and not list(out.glob("kt_full_experts*"))
    # the bytes of expert e are the e-th slab of the KT shard
    shard = next((tmp_path / "full").glob("kt_full_experts-*-layer-00002.safetensors"))
    kt, _ = st.read_header(shard)
    info = kt["up_proj"]
    slab = info.nbytes // 16
    with open(shard, "rb") as f:
        f.seek(info.begin + 7 * slab)
        want_bytes = f.read(slab)
    got = experts["model.layers.2.mlp.experts.7.up_proj.weight"]
    with open(out / "model-kt-experts.safetensors", "rb") as f:
        f.seek(got.begin)
        assert f.read(got.nbytes) == want_bytes


def test_full_convert_refuses_damage_and_inside_destinations(tmp_path):
    import pytest

    from ktdeploy.agent.convert import ConvertError

    kt_layout.write_full_model(str(tmp_path / "full"))
    with pytest.raises(ConvertError, match="outside the training output"):
        convert(tmp_path / "full", tmp_path / "full" / "served")
    shard = next((tmp_path / "full").glob("kt_full_experts-*-layer-00001.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(ConvertError, match="size"):
        convert(tmp_path / "full", tmp_path / "full-sglang")
    assert not (tmp_path / "full-sglang").exists()

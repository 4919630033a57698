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


def test_full_finetune_output_is_the_tiny_model_shape(tmp_path):
    from ktdeploy.agent import safetensors_io as st
    from ktdeploy.agent.tiny import SIZES

    kt_layout.write_full_model(str(tmp_path / "full"))
    cfg = json.loads((tmp_path / "full/config.json").read_text())
    want = SIZES["small"].config_dict()
    assert {k: cfg[k] for k in want if k != "architectures"} == {k: v for k, v in want.items() if k != "architectures"}
    index, _ = st.read_header(tmp_path / "full/model.safetensors")
    assert index["model.layers.3.mlp.experts.15.down_proj.weight"].shape == (512, 256)  # experts included
    assert all(i.dtype == "BF16" for i in index.values())

"""config.json parsing: every shipped family, text_config nesting, and clear errors for the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ktdeploy.core.errors import RecipeError, UsageError
from ktdeploy.core.sizing.model_config import load_model_config, parse_model_config, resolve_model_config

MODELS = Path(__file__).resolve().parents[4] / "recipes" / "models"

# (file, family, published total params in billions, routed-expert format of the checkpoint)
PUBLISHED = [
    ("Qwen3-235B-A22B-Instruct-2507.json", "qwen3_moe", 235, "bf16"),
    ("Qwen3.5-397B-A17B.json", "qwen3_5_moe", 397, "bf16"),
    ("DeepSeek-V3.json", "deepseek_v3", 671, "fp8"),
    ("Kimi-K2-Instruct.json", "deepseek_v3", 1026, "fp8"),
    ("Kimi-K2.5.json", "deepseek_v3", 1027, "int4"),
    ("GLM-4.5.json", "glm4_moe", 355, "bf16"),
    ("GLM-4.5-Air.json", "glm4_moe", 106, "bf16"),
    ("GLM-5.json", "glm_moe_dsa", 744, "bf16"),
]


@pytest.mark.parametrize("name,family,total_b,fmt", PUBLISHED)
def test_shipped_configs_match_published_totals(name, family, total_b, fmt):
    arch = load_model_config(MODELS / name)
    assert arch.family == family
    assert arch.native_format == fmt
    # Counted from the dimensions alone; published totals include MTP layers (GLM-4.5: +1 layer), hence 2 %.
    assert arch.total_params / 1e9 == pytest.approx(total_b, rel=0.02)
    assert arch.routed_expert_params > 0.9 * arch.total_params


def test_every_shipped_config_parses():
    files = sorted(MODELS.glob("*.json"))
    assert len(files) >= 8
    for f in files:
        load_model_config(f)


def test_text_config_nesting_reads_the_language_model():
    inner = json.loads((MODELS / "Qwen3-235B-A22B-Instruct-2507.json").read_text())
    flat = parse_model_config(inner)
    nested = parse_model_config({"architectures": ["Qwen3VLMoeForConditionalGeneration"],
                                 "model_type": "qwen3_vl_moe", "text_config": inner})
    assert nested.routed_expert_params == flat.routed_expert_params
    assert nested.hidden_size == 4096 and nested.moe_layers == 94


def test_qwen35_hybrid_layers_and_vision_tower():
    arch = load_model_config(MODELS / "Qwen3.5-397B-A17B.json")
    assert arch.moe_layers == 60 and arch.num_experts == 512 and arch.experts_per_tok == 10
    assert arch.extra_non_expert_params > 0.2e9      # the vision tower is loaded with the model


def test_deepseek_dense_layers_are_not_moe():
    arch = load_model_config(MODELS / "DeepSeek-V3.json")
    assert arch.moe_layers == 58 and arch.quant_block == (128, 128)


def test_unknown_architecture_names_missing_fields():
    with pytest.raises(RecipeError) as e:
        parse_model_config({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                            "hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 32000})
    msg = e.value.message
    assert "LlamaForCausalLM" in msg and "moe_intermediate_size" in msg and "num_experts_per_tok" in msg


def test_known_family_with_missing_field_names_it():
    cfg = json.loads((MODELS / "DeepSeek-V3.json").read_text())
    del cfg["kv_lora_rank"], cfg["n_routed_experts"]
    with pytest.raises(RecipeError) as e:
        parse_model_config(cfg, source="x/config.json")
    assert "kv_lora_rank" in e.value.message and "n_routed_experts" in e.value.message
    assert "x/config.json" in e.value.message


def test_resolve_prefers_model_dir_then_shipped(tmp_path):
    d = tmp_path / "Qwen3.5-397B-A17B"
    d.mkdir()
    (d / "config.json").write_text((MODELS / "GLM-5.json").read_text())
    arch, where = resolve_model_config({"model_name_or_path": str(d)})
    assert arch.family == "glm_moe_dsa" and where.endswith("config.json")
    arch, where = resolve_model_config({"model_name_or_path": "/nonexistent/Qwen3.5-397B-A17B"})
    assert arch.family == "qwen3_5_moe" and where.endswith("Qwen3.5-397B-A17B.json")
    with pytest.raises(UsageError) as e:
        resolve_model_config({"model_name_or_path": "/nonexistent/Some-Model"})
    assert "--model-config" in (e.value.fix or "")


def test_bad_json_is_a_clear_error(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(RecipeError):
        load_model_config(p)

"""ktdeploy convert: raw KT LoRA output -> one sglang-kt adapter (layout, values, refusals)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ktdeploy.agent.convert import ConvertError, convert

E, R, H, I = 3, 2, 4, 5  # noqa: E741 -- experts, rank, hidden, expert width


def _vals(n: int, start: float) -> list[float]:
    return [start + i for i in range(n)]


def make_output(d: Path, st_writer, *, layers=(0, 1), alpha=16.0, rank=R, manifest=True, peft_rank=R) -> Path:
    d.mkdir(parents=True)
    fused = {}
    for L in layers:
        base = 1000.0 * (L + 1)
        fused[f"layers.{L}.experts.gate_lora_a"] = ("F32", [E, rank, H], _vals(E * rank * H, base))
        fused[f"layers.{L}.experts.gate_lora_b"] = ("F32", [E, I, rank], _vals(E * I * rank, base + 100))
        fused[f"layers.{L}.experts.up_lora_a"] = ("F32", [E, rank, H], _vals(E * rank * H, base + 200))
        fused[f"layers.{L}.experts.up_lora_b"] = ("F32", [E, I, rank], _vals(E * I * rank, base + 300))
        fused[f"layers.{L}.experts.down_lora_a"] = ("F32", [E, rank, I], _vals(E * rank * I, base + 400))
        fused[f"layers.{L}.experts.down_lora_b"] = ("F32", [E, H, rank], _vals(E * H * rank, base + 500))
    st_writer(d / "fused_expert_lora.safetensors", fused)
    peft = {}
    for L in layers:
        peft[f"base_model.model.model.layers.{L}.self_attn.q_proj.lora_A.weight"] = ("F32", [peft_rank, H],
                                                                                     _vals(peft_rank * H, -L))
        peft[f"base_model.model.model.layers.{L}.self_attn.q_proj.lora_B.weight"] = ("F32", [H, peft_rank],
                                                                                     _vals(H * peft_rank, -10 - L))
    st_writer(d / "adapter_model.safetensors", peft)
    (d / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": peft_rank, "lora_alpha": alpha, "target_modules": ["q_proj"],
        "base_model_name_or_path": "/models/tiny", "task_type": "CAUSAL_LM"}))
    if manifest:
        arts = {}
        for n in ("adapter_config.json", "adapter_model.safetensors", "fused_expert_lora.safetensors"):
            p = d / n
            arts[n] = {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        (d / "kt_adapter_manifest.json").write_text(json.dumps({
            "version": 1, "status": "ready", "expert_weight_format": "bf16",
            "base": {"model_name_or_path": "/models/tiny"}, "lora": {"rank": rank, "alpha": alpha},
            "artifacts": arts}))
    return d


def test_layout_and_values(tmp_path, st_writer, st_reader):
    src = make_output(tmp_path / "out", st_writer)
    s = convert(src, tmp_path / "adapter")
    got = st_reader(tmp_path / "adapter" / "adapter_model.safetensors")
    fused = st_reader(src / "fused_expert_lora.safetensors")
    assert s.rank == R and s.num_experts == E and s.num_layers == 2
    assert s.expert_tensors == 2 * 3 * 2 * E and s.nonexpert_tensors == 4
    # PEFT prefix stripped, values untouched
    assert got["model.layers.1.self_attn.q_proj.lora_A.weight"] == ([R, H], _vals(R * H, -1))
    # every expert slice equals the fused tensor's slice along the first axis
    for L in (0, 1):
        for proj in ("gate", "up", "down"):
            for ab, AB in (("a", "A"), ("b", "B")):
                shape, flat = fused[f"layers.{L}.experts.{proj}_lora_{ab}"]
                per = len(flat) // E
                for e in range(E):
                    key = f"model.layers.{L}.mlp.experts.{e}.{proj}_proj.lora_{AB}.weight"
                    assert got[key] == (shape[1:], flat[e * per:(e + 1) * per])
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert cfg["target_modules"] == ["q_proj", "gate_proj", "up_proj", "down_proj"]
    assert cfg["r"] == R and cfg["lora_alpha"] == 16.0 and cfg["base_model_name_or_path"] == "/models/tiny"
    prov = json.loads((tmp_path / "adapter" / "ktdeploy_convert.json").read_text())
    assert set(prov["inputs"]) == {"fused_expert_lora.safetensors", "adapter_config.json", "adapter_model.safetensors"}


def test_checkpoint_dir_is_found(tmp_path, st_writer):
    root = tmp_path / "out"
    root.mkdir()
    make_output(root / "checkpoint-5", st_writer)
    make_output(root / "checkpoint-20", st_writer, layers=(0,))
    s = convert(root, tmp_path / "adapter")
    assert s.input_dir.endswith("checkpoint-20") and s.num_layers == 1


def test_never_overwrites(tmp_path, st_writer):
    src = make_output(tmp_path / "out", st_writer)
    dst = tmp_path / "adapter"
    dst.mkdir()
    (dst / "keep.txt").write_text("x")
    from ktdeploy.core.errors import OverwriteRefused

    with pytest.raises(OverwriteRefused, match="never overwrites"):   # exit 6
        convert(src, dst)
    assert (dst / "keep.txt").read_text() == "x"
    with pytest.raises(ConvertError, match="outside the training output"):
        convert(src, src / "adapter")


def test_damaged_file_is_refused(tmp_path, st_writer):
    src = make_output(tmp_path / "out", st_writer)
    p = src / "fused_expert_lora.safetensors"
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(ConvertError, match="SHA-256"):
        convert(src, tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()


def test_rank_and_alpha_mismatch(tmp_path, st_writer):
    src = make_output(tmp_path / "a", st_writer, peft_rank=4, manifest=False)
    with pytest.raises(ConvertError, match="rank"):
        convert(src, tmp_path / "x")
    src = make_output(tmp_path / "b", st_writer)
    m = json.loads((src / "kt_adapter_manifest.json").read_text())
    m["lora"]["alpha"] = 32.0
    (src / "kt_adapter_manifest.json").write_text(json.dumps(m))
    with pytest.raises(ConvertError, match="alpha"):
        convert(src, tmp_path / "y")


def test_not_ready_manifest(tmp_path, st_writer):
    src = make_output(tmp_path / "out", st_writer)
    m = json.loads((src / "kt_adapter_manifest.json").read_text())
    m["status"] = "staging"
    (src / "kt_adapter_manifest.json").write_text(json.dumps(m))
    with pytest.raises(ConvertError, match="not 'ready'"):
        convert(src, tmp_path / "adapter")


def test_no_kt_output(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(ConvertError, match="no KT LoRA output"):
        convert(tmp_path / "plain", tmp_path / "adapter")


def test_cli_one_screen_error(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "ktdeploy", "convert", str(tmp_path), "-o", str(tmp_path / "a")],
                       capture_output=True, text=True, env={**__import__("os").environ, "COLUMNS": "300"})
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and "no KT LoRA output" in p.stderr

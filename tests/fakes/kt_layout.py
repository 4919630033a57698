"""TEST DOUBLE output writer: what kt-kernel 0.7.2 + LlamaFactory-KT save, byte-layout for byte-layout (stdlib only).

Derived from the real output of the GPU machine (bench/results/gpu/proof/output: tiny-qwen3-moe "small",
r=8, alpha=16, lora_target all), checked by tests/unit/agent/test_fake_kt_layout.py against that record:

* ``fused_expert_lora.safetensors``: kt-kernel's routed-expert LoRA, BF16, per layer L
  ``layers.L.experts.{gate,up}_lora_a [E, r, hidden]``, ``{gate,up}_lora_b [E, moe_inter, r]``,
  ``down_lora_a [E, r, moe_inter]``, ``down_lora_b [E, hidden, r]`` (24 tensors, 2,361,664 bytes for "small");
* ``adapter_model.safetensors``: PEFT's LoRA, F32, on ``self_attn.{q,k,v,o}_proj`` and the router ``mlp.gate``
  (``lora_target: all`` under KT: the experts are not PEFT modules), keys
  ``base_model.model.model.layers.L.<module>.lora_{A,B}.weight`` (40 tensors, 531,416 bytes for "small");
* ``adapter_config.json``: PEFT 0.18's LoraConfig (``target_modules`` ``gate``, ``k_proj``, ``v_proj``,
  ``o_proj``, ``q_proj``), ``kt_adapter_manifest.json``: ``version 1``, ``status ready``, LoRA rank/alpha, base
  model and each artifact's size + SHA-256 (written last, as kt-kernel does).

Values are deterministic pseudo-random numbers, not trained weights; every shape, dtype, name and file is real.
A full fine-tune (``finetuning_type: full``) writes the model without its routed experts plus kt-kernel's
"KT Full" expert checkpoint (see :func:`write_full_model`).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct

SMALL = {"hidden": 512, "layers": 4, "experts": 16, "moe_inter": 256, "heads": 8, "kv_heads": 4, "head_dim": 64,
         "vocab": 4096, "top_k": 4}  # ktdeploy.agent.tiny.SIZES["small"]
_DTYPE = {"BF16": 2, "F32": 4, "F16": 2, "F8_E4M3": 1, "I8": 1, "U8": 1, "I32": 4}


def _blob(n: int, dtype: str, seed: int) -> bytes:
    # A cheap deterministic pattern (no numpy here): small finite values in either dtype.
    if dtype == "F32":
        return struct.pack(f"<{n}f", *(((i * 2654435761 + seed) % 2001 - 1000) * 1e-5 for i in range(n)))
    one = struct.pack("<f", ((seed % 97) - 48) * 1e-4)[2:]  # bf16 = the top 2 bytes of an f32
    return one * n


def write_safetensors(path: str, tensors: dict, metadata: dict | None = None, values=None) -> None:
    """tensors: name -> (dtype, shape); written like safetensors does (sorted header, 8-byte aligned).
    ``values(name, dtype, shape) -> bytes`` replaces the cheap default pattern (numpy-made data)."""
    header, blobs, pos = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for i, name in enumerate(sorted(tensors)):
        dtype, shape = tensors[name]
        n = 1
        for d in shape:
            n *= d
        b = values(name, dtype, shape) if values is not None else _blob(n, dtype, i)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def fused_tensors(rank: int, m: dict = SMALL) -> dict:
    E, H, I = m["experts"], m["hidden"], m["moe_inter"]  # noqa: E741 (model notation)
    t = {}
    for L in range(m["layers"]):
        t[f"layers.{L}.experts.gate_lora_a"] = ("BF16", [E, rank, H])
        t[f"layers.{L}.experts.gate_lora_b"] = ("BF16", [E, I, rank])
        t[f"layers.{L}.experts.up_lora_a"] = ("BF16", [E, rank, H])
        t[f"layers.{L}.experts.up_lora_b"] = ("BF16", [E, I, rank])
        t[f"layers.{L}.experts.down_lora_a"] = ("BF16", [E, rank, I])
        t[f"layers.{L}.experts.down_lora_b"] = ("BF16", [E, H, rank])
    return t


def peft_tensors(rank: int, m: dict = SMALL) -> dict:
    H = m["hidden"]
    q, kv = m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"]
    mods = {"self_attn.q_proj": (H, q), "self_attn.k_proj": (H, kv), "self_attn.v_proj": (H, kv),
            "self_attn.o_proj": (q, H), "mlp.gate": (H, m["experts"])}
    t = {}
    for L in range(m["layers"]):
        for mod, (fin, fout) in mods.items():
            p = f"base_model.model.model.layers.{L}.{mod}"
            t[f"{p}.lora_A.weight"] = ("F32", [rank, fin])
            t[f"{p}.lora_B.weight"] = ("F32", [fout, rank])
    return t


def adapter_config(base: str, rank: int, alpha) -> dict:
    return {"alora_invocation_tokens": None, "alpha_pattern": {}, "arrow_config": None, "auto_mapping": None,
            "base_model_name_or_path": base, "bias": "none", "corda_config": None, "ensure_weight_tying": False,
            "eva_config": None, "exclude_modules": None, "fan_in_fan_out": False, "inference_mode": True,
            "init_lora_weights": True, "layer_replication": None, "layers_pattern": None,
            "layers_to_transform": None, "loftq_config": {}, "lora_alpha": alpha, "lora_bias": False,
            "lora_dropout": 0.0, "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None,
            "peft_type": "LORA", "peft_version": "0.18.1", "qalora_group_size": 16, "r": rank, "rank_pattern": {},
            "revision": None, "target_modules": ["gate", "k_proj", "v_proj", "o_proj", "q_proj"],
            "target_parameters": None, "task_type": "CAUSAL_LM", "trainable_token_indices": None,
            "use_dora": False, "use_qalora": False, "use_rslora": False}


def _sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_lora_adapter(d: str, *, base: str, rank: int = 8, alpha=16, m: dict = SMALL, seed: int | None = None) -> None:
    """The adapter files kt-kernel + PEFT save into ``d`` (output_dir or a checkpoint-N), manifest last.
    ``seed``: random normal values (numpy) instead of the cheap constant pattern, for arithmetic checks."""
    os.makedirs(d, exist_ok=True)
    values = random_values(seed, 0.02) if seed is not None else None
    write_safetensors(os.path.join(d, "adapter_model.safetensors"), peft_tensors(rank, m), {"format": "pt"}, values)
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(adapter_config(base, rank, alpha), f, indent=2, sort_keys=True)  # PEFT: no final newline
    fused = fused_tensors(rank, m)
    write_safetensors(os.path.join(d, "fused_expert_lora.safetensors"), fused, values=values)
    arts = {}
    for n in ("adapter_config.json", "adapter_model.safetensors", "fused_expert_lora.safetensors"):
        p = os.path.join(d, n)
        arts[n] = {"sha256": _sha(p), "size": os.path.getsize(p)}
    arts["fused_expert_lora.safetensors"].update(
        tensor_count=len(fused), tensors={k: {"dtype": v[0], "shape": v[1]} for k, v in sorted(fused.items())})
    manifest = {"artifacts": arts, "base": {"model_name_or_path": base}, "expert_weight_format": "bf16",
                "lora": {"alpha": float(alpha), "rank": rank}, "status": "ready", "version": 1}
    tmp = os.path.join(d, "kt_adapter_manifest.json.tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
    os.replace(tmp, os.path.join(d, "kt_adapter_manifest.json"))


def write_full_model(d: str, *, m: dict = SMALL, generation: str = "0" * 32) -> None:
    """What a KT full fine-tune saves (kt-kernel's kt_kernel/sft/checkpoint.py + HF save_pretrained):
    ``model.safetensors`` WITHOUT the routed experts (kt-kernel's state_dict hook drops their placeholders), and
    the experts as a "KT Full" checkpoint: ``kt_full_experts.index.json`` (format kt_full_experts, version 1,
    BF16, generation, per layer file/size_bytes/shapes) + one ``kt_full_experts-<gen>-layer-<L:05d>.safetensors``
    per layer holding ``gate_proj``/``up_proj`` [E, I, H] and ``down_proj`` [E, H, I] (metadata: format,
    version, generation, layer_idx); the index is written last."""
    os.makedirs(d, exist_ok=True)
    H, E, I, V = m["hidden"], m["experts"], m["moe_inter"], m["vocab"]  # noqa: E741 (model notation)
    q, kv = m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"]
    t = {"model.embed_tokens.weight": ("BF16", [V, H]), "model.norm.weight": ("BF16", [H]),
         "lm_head.weight": ("BF16", [V, H])}
    for L in range(m["layers"]):
        p = f"model.layers.{L}"
        t.update({f"{p}.self_attn.q_proj.weight": ("BF16", [q, H]), f"{p}.self_attn.k_proj.weight": ("BF16", [kv, H]),
                  f"{p}.self_attn.v_proj.weight": ("BF16", [kv, H]), f"{p}.self_attn.o_proj.weight": ("BF16", [H, q]),
                  f"{p}.mlp.gate.weight": ("BF16", [E, H]),
                  f"{p}.input_layernorm.weight": ("BF16", [H]), f"{p}.post_attention_layernorm.weight": ("BF16", [H]),
                  f"{p}.self_attn.q_norm.weight": ("BF16", [m["head_dim"]]),
                  f"{p}.self_attn.k_norm.weight": ("BF16", [m["head_dim"]])})
    write_safetensors(os.path.join(d, "model.safetensors"), t, {"format": "pt"})
    layers = {}
    for L in range(m["layers"]):
        shapes = {"gate_proj": [E, I, H], "up_proj": [E, I, H], "down_proj": [E, H, I]}
        fname = f"kt_full_experts-{generation}-layer-{L:05d}.safetensors"
        write_safetensors(os.path.join(d, fname), {k: ("BF16", v) for k, v in shapes.items()},
                          {"format": "kt_full_experts", "version": "1", "generation": generation, "layer_idx": str(L)})
        layers[str(L)] = {"file": fname, "size_bytes": os.path.getsize(os.path.join(d, fname)), "shapes": shapes}
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": H,
           "num_hidden_layers": m["layers"], "num_experts": E, "moe_intermediate_size": I,
           "num_attention_heads": m["heads"], "num_key_value_heads": m["kv_heads"], "head_dim": m["head_dim"],
           "num_experts_per_tok": m["top_k"], "intermediate_size": I * 4, "decoder_sparse_step": 1,
           "mlp_only_layers": [], "norm_topk_prob": True, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
           "hidden_act": "silu", "tie_word_embeddings": False, "vocab_size": V, "torch_dtype": "bfloat16"}
    for name, data in (("config.json", cfg), ("generation_config.json", {"do_sample": False}),
                       ("tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast"})):
        with open(os.path.join(d, name), "w") as f:
            json.dump(data, f, indent=2)
    index = {"dtype": "BF16", "format": "kt_full_experts", "generation": generation, "layers": layers, "version": 1}
    tmp = os.path.join(d, "kt_full_experts.index.json.tmp")
    with open(tmp, "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, os.path.join(d, "kt_full_experts.index.json"))


# ---- a base model WITH its routed experts (what the merge reads); numpy-made values -------------------------------

def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def random_values(seed: int, std: float = 0.02):
    """``values`` for write_safetensors: N(0, std) per tensor (BF16 by round to nearest even, F16/F32), FP8 E4M3
    codes (no NaN code) and positive block scales, deterministic per (seed, name)."""
    import zlib

    import numpy as np

    def make(name: str, dtype: str, shape) -> bytes:
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        n = 1
        for dim in shape:
            n *= dim
        if dtype in ("I8", "U8", "I32"):
            return bytes(n * _DTYPE[dtype])
        if dtype == "F8_E4M3":
            codes = rng.integers(0, 126, n, dtype=np.uint8)          # 0..125: finite magnitudes up to 288
            return (codes | (rng.integers(0, 2, n, dtype=np.uint8) << 7)).tobytes()
        if name.endswith("_scale_inv"):
            return rng.uniform(1e-4, 2e-4, n).astype(np.float32).tobytes()
        x = (rng.standard_normal(n) * std).astype(np.float32)
        if dtype == "F32":
            return x.tobytes()
        if dtype == "F16":
            return x.astype(np.float16).tobytes()
        u = x.view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()

    return make


def base_tensors(m: dict = SMALL, dtype: str = "BF16", layout: str = "per-expert", fp8: bool = False,
                 block: int = 128) -> dict:
    """A Qwen3-MoE checkpoint's tensors (HF names): per-expert 2-D experts (Qwen3-MoE on disk) or fused 3-D
    ``experts.gate_up_proj`` [E, 2I, H] / ``down_proj`` [E, H, I] (transformers 5, Qwen3.5). ``fp8``: every
    projection (attention and experts) is F8_E4M3 with a ``weight_scale_inv`` [ceil(out/block), ceil(in/block)]
    (DeepSeek-V3's format)."""
    H, E, I, V = m["hidden"], m["experts"], m["moe_inter"], m["vocab"]  # noqa: E741 (model notation)
    q, kv = m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"]
    t = {"model.embed_tokens.weight": (dtype, [V, H]), "model.norm.weight": (dtype, [H]),
         "lm_head.weight": (dtype, [V, H])}

    def proj(name: str, out: int, inp: int) -> None:
        if fp8:
            t[name] = ("F8_E4M3", [out, inp])
            t[name + "_scale_inv"] = ("F32", [-(-out // block), -(-inp // block)])
        else:
            t[name] = (dtype, [out, inp])

    for L in range(m["layers"]):
        p = f"model.layers.{L}"
        proj(f"{p}.self_attn.q_proj.weight", q, H)
        proj(f"{p}.self_attn.k_proj.weight", kv, H)
        proj(f"{p}.self_attn.v_proj.weight", kv, H)
        proj(f"{p}.self_attn.o_proj.weight", H, q)
        t.update({f"{p}.mlp.gate.weight": (dtype, [E, H]), f"{p}.input_layernorm.weight": (dtype, [H]),
                  f"{p}.post_attention_layernorm.weight": (dtype, [H]),
                  f"{p}.self_attn.q_norm.weight": (dtype, [m["head_dim"]]),
                  f"{p}.self_attn.k_norm.weight": (dtype, [m["head_dim"]])})
        if layout == "fused":
            t[f"{p}.mlp.experts.gate_up_proj"] = (dtype, [E, 2 * I, H])
            t[f"{p}.mlp.experts.down_proj"] = (dtype, [E, H, I])
        else:
            for e in range(E):
                proj(f"{p}.mlp.experts.{e}.gate_proj.weight", I, H)
                proj(f"{p}.mlp.experts.{e}.up_proj.weight", I, H)
                proj(f"{p}.mlp.experts.{e}.down_proj.weight", H, I)
    return t


def model_config(m: dict = SMALL, fp8_block: int | None = None) -> dict:
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": m["hidden"],
           "num_hidden_layers": m["layers"], "num_experts": m["experts"], "moe_intermediate_size": m["moe_inter"],
           "num_attention_heads": m["heads"], "num_key_value_heads": m["kv_heads"], "head_dim": m["head_dim"],
           "num_experts_per_tok": m["top_k"], "intermediate_size": m["moe_inter"] * 4, "decoder_sparse_step": 1,
           "mlp_only_layers": [], "norm_topk_prob": True, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
           "hidden_act": "silu", "tie_word_embeddings": False, "vocab_size": m["vocab"], "torch_dtype": "bfloat16"}
    if fp8_block:
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [fp8_block, fp8_block]}
    return cfg


def write_base_model(d: str, *, m: dict = SMALL, dtype: str = "BF16", layout: str = "per-expert", shards: int = 2,
                     seed: int = 1, fp8_block: int | None = None) -> dict:
    """A base model folder as `save_pretrained` leaves it: config.json, generation/tokenizer files, the tensors of
    ``base_tensors`` split over ``shards`` files (by layer) with ``model.safetensors.index.json``. Returns the
    tensor table."""
    os.makedirs(d, exist_ok=True)
    t = base_tensors(m, dtype, layout, fp8=fp8_block is not None, block=fp8_block or 128)
    values = random_values(seed)

    sizes = {k: _DTYPE.get(dt, 1) * _prod(shape) for k, (dt, shape) in t.items()}
    total, acc, where = sum(sizes.values()), 0, {}
    for k in sorted(t):                          # contiguous runs of the sorted names, about equal in bytes
        where[k] = min(shards - 1, acc * shards // max(total, 1))
        acc += sizes[k]

    files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)] if shards > 1 \
        else ["model.safetensors"]
    weight_map = {}
    for i, fname in enumerate(files):
        part = {k: v for k, v in t.items() if where[k] == i}
        write_safetensors(os.path.join(d, fname), part, {"format": "pt"}, values)
        weight_map.update(dict.fromkeys(part, fname))
    if shards > 1:
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    for name, data in (("config.json", model_config(m, fp8_block)),
                       ("generation_config.json", {"do_sample": False, "eos_token_id": 2}),
                       ("tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast"}),
                       ("tokenizer.json", {"version": "1.0", "model": {"type": "BPE"}})):
        with open(os.path.join(d, name), "w") as f:
            json.dump(data, f, indent=2)
    return t

"""The tiny model as a native block-FP8 checkpoint, laid out as real FP8 releases are (DeepSeek-V3, Qwen3-*-FP8).

Every linear weight of attention and of the routed experts is stored as ``float8_e4m3fn`` with one inverse scale
per 128x128 block (``<name>.weight_scale_inv``, float32); embeddings, norms, the router (``mlp.gate``) and
``lm_head`` stay BF16 and are named in ``quantization_config.modules_to_not_convert``. The quantization is
transformers' own (``transformers.integrations.finegrained_fp8.Fp8Quantize``, the op its FP8 quantizer applies
when it saves a model), so what transformers' FP8 loader and kt-kernel's native-FP8 SFT reader
(``kt_kernel.sft.weights.load_block_fp8_experts_from_checkpoint_files``) read is what the stack itself writes.

kt-kernel's FP8 SFT needs hidden and routed intermediate sizes divisible by 128, and every thread-pool slice of the
intermediate size too (``kt_kernel/sft/amx.py``): ``check_fp8_shape`` refuses a size that breaks this before
anything is built.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ktdeploy.core.errors import UsageError
from ktdeploy.core.safeio import MAX_JSON, load_json, write_file

BLOCK = 128
INDEX = "model.safetensors.index.json"
# 2-D linear weights stored as FP8: attention projections and routed (or shared) expert projections.
_QUANTIZED = re.compile(r"\.(self_attn\.(q|k|v|o)_proj|mlp\.(experts\.\d+|shared_expert)\.(gate|up|down)_proj)\.weight$")


def check_fp8_shape(hidden: int, intermediate: int, kv_width: int, threadpools: int = 2) -> None:
    """Refuse a tiny shape kt-kernel's FP8 SFT cannot run with up to ``threadpools`` pools (``kv_width``: key/value
    heads x head_dim, the narrowest attention projection)."""
    dims = {"hidden_size": hidden, "moe_intermediate_size": intermediate,
            f"moe_intermediate_size / {threadpools} thread pools": intermediate // threadpools,
            "key/value heads x head_dim": kv_width}
    bad = [f"{name} = {value}" for name, value in dims.items() if value % BLOCK]
    if bad:
        raise UsageError(f"this tiny size cannot be a block-FP8 checkpoint: {', '.join(bad)} not divisible by {BLOCK}",
                         key="--size", fix="use --size small, medium or large (every dimension a multiple of 128)")


def quantization_config(config: dict[str, Any]) -> dict[str, Any]:
    """The ``quantization_config`` of a block-FP8 release (transformers' FineGrainedFP8Config fields)."""
    layers = int(config["num_hidden_layers"])
    keep = ["lm_head", "model.embed_tokens", *(f"model.layers.{i}.mlp.gate" for i in range(layers))]
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [BLOCK, BLOCK], "modules_to_not_convert": keep}


def quantize_checkpoint(model_dir: Path, config: dict[str, Any], device: str = "cpu") -> dict[str, Any]:
    """Rewrite the BF16 safetensors in ``model_dir`` (a staging folder this process made) as block FP8 in place;
    returns the ``quantization_config`` for config.json. ``device``: where the blocks are scaled (a GPU bench
    quantizes gigabytes)."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    qcfg = quantization_config(config)
    op = Fp8Quantize(SimpleNamespace(quantization_config=qcfg))
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise UsageError(f"{model_dir} holds no safetensors to quantize", fix="rebuild the tiny model")
    weight_map: dict[str, str] = {}
    for shard in shards:
        tensors = load_file(str(shard))
        out: dict[str, Any] = {}
        for key, value in tensors.items():
            if _QUANTIZED.search(key) and value.dim() == 2:
                out.update({k: v.cpu() for k, v in op.convert({key: [value.to(device)]}).items()})
            else:
                out[key] = value
        shard.unlink()   # our own staging folder: the quantized shard takes the BF16 one's name
        save_file(out, str(shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(out, shard.name))
    index_path = model_dir / INDEX
    if index_path.exists():
        index = load_json(index_path, MAX_JSON, INDEX)
        index["weight_map"] = dict(sorted(weight_map.items()))
        write_file(model_dir, INDEX, json.dumps(index, indent=2), overwrite=True)
    return qcfg

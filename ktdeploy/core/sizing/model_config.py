"""Parse a Hugging Face ``config.json`` into a typed MoE architecture (no weights, no transformers import).

Families: Qwen3-MoE, Qwen3.5-MoE (multimodal, figures under ``text_config``), DeepSeek-V3/V4 and Kimi-K2.x
(DeepSeek-V3 layout, Kimi-K2.5 under ``text_config``), GLM-4.5/4.6/4.7 (Glm4Moe) and GLM-5 (GlmMoeDsa).
An unknown architecture is a RecipeError listing the fields the planner needs and which are missing.

Parameter counts are exact products of the config's dimensions; ``bench/results/planner-calibration.md``
cross-checks them against the published totals (Qwen3-235B: 235 B, DeepSeek-V3: 671 B, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ktdeploy.core.errors import RecipeError, UsageError
from ktdeploy.core.recipe.train_keys import TrainKeys
from ktdeploy.core.safeio import parse_json, read_text

# Fields every family needs: the routed-expert tensors, how often MoE layers occur, and the attention shape.
_COMMON = ("hidden_size", "num_hidden_layers", "moe_intermediate_size", "num_experts_per_tok", "vocab_size")


@dataclass(frozen=True)
class MoEArchitecture:
    """What the resource model needs to know about a model: counts and dimensions, all from config.json."""

    family: str                      # qwen3_moe | qwen3_5_moe | deepseek_v3 | glm4_moe | glm_moe_dsa
    model_type: str
    architectures: tuple[str, ...]
    hidden_size: int
    num_layers: int
    moe_layers: int                  # layers whose MLP is the routed MoE (the rest are dense MLPs)
    num_experts: int                 # routed experts per MoE layer
    experts_per_tok: int             # top-k
    moe_intermediate_size: int       # width of one routed expert
    vocab_size: int
    tie_word_embeddings: bool
    shared_expert_intermediate_size: int = 0   # total width of the shared expert(s), 0 when none
    dense_intermediate_size: int = 0           # width of the dense MLP of non-MoE layers
    attention_params_per_layer: float = 0.0    # all projections of one layer's token mixer (averaged for hybrids)
    attention_linear_io: float = 0.0           # sum of (in + out) over those projections: LoRA params = rank x this
    extra_non_expert_params: float = 0.0       # vision tower and other towers loaded with the model
    native_format: str = "bf16"                # bf16 | fp8 | int4: how the checkpoint stores routed experts
    quant_block: tuple[int, int] | None = None  # fp8 block (128, 128) or int4 group (1, 32)
    notes: tuple[str, ...] = field(default_factory=tuple)

    # ---- derived counts -------------------------------------------------------------------------
    @property
    def routed_expert_params(self) -> float:
        """gate, up and down projections of every routed expert of every MoE layer."""
        return float(self.moe_layers) * self.num_experts * 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def embedding_params(self) -> float:
        return float(self.vocab_size) * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def non_expert_params(self) -> float:
        """Everything that lives on the GPU: embeddings, attention, routers, shared experts, dense MLPs, towers."""
        router = float(self.hidden_size) * self.num_experts * self.moe_layers
        return self.embedding_params + self.linear_non_expert_params + router + self.extra_non_expert_params

    @property
    def linear_non_expert_params(self) -> float:
        """The non-expert weights a block-FP8 release stores as FP8: attention projections and the shared/dense MLPs
        (embeddings, lm_head and the routers stay BF16: the releases' modules_to_not_convert)."""
        dense_layers = self.num_layers - self.moe_layers
        mlp = 3.0 * self.hidden_size * (self.dense_intermediate_size * dense_layers
                                        + self.shared_expert_intermediate_size * self.moe_layers)
        return self.attention_params_per_layer * self.num_layers + mlp

    @property
    def total_params(self) -> float:
        return self.routed_expert_params + self.non_expert_params

    @property
    def widest_gpu_mlp(self) -> int:
        """Width of the widest MLP a decoder layer runs on the GPU: a shared expert, or the dense MLP of the
        non-MoE layers (only where there are such layers: config.json's intermediate_size of an all-MoE model
        such as Qwen3-MoE describes no layer)."""
        dense = self.dense_intermediate_size if self.num_layers > self.moe_layers else 0
        return max(dense, self.shared_expert_intermediate_size)

    @property
    def largest_layer_params(self) -> float:
        """One decoder layer without its routed experts (what FSDP gathers at once)."""
        return self.attention_params_per_layer + 3.0 * self.hidden_size * self.widest_gpu_mlp \
            + self.hidden_size * self.num_experts

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(routed_expert_params=self.routed_expert_params, non_expert_params=self.non_expert_params,
                 total_params=self.total_params)
        return d


# ---- attention shapes ---------------------------------------------------------------------------------

def _gqa_params(c: dict[str, Any], gated_q: bool = False) -> tuple[float, float]:
    h = c["hidden_size"]
    heads = c["num_attention_heads"]
    kv = c.get("num_key_value_heads") or heads
    hd = c.get("head_dim") or h // heads
    q_out = heads * hd * (2 if gated_q else 1)  # Qwen3.5 gated attention: q_proj also emits the output gate
    return (float(h * q_out + 2 * h * kv * hd + heads * hd * h),
            float((h + q_out) + 2 * (h + kv * hd) + (heads * hd + h)))


def _mla_params(c: dict[str, Any]) -> tuple[float, float]:
    """DeepSeek Multi-head Latent Attention (also Kimi-K2, GLM-5); GLM-5 adds the DSA indexer."""
    h = c["hidden_size"]
    heads = c["num_attention_heads"]
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    kv_rank = c["kv_lora_rank"]
    q_rank = c.get("q_lora_rank")
    q = (h * q_rank + q_rank * heads * (nope + rope)) if q_rank else h * heads * (nope + rope)
    kv = h * (kv_rank + rope) + kv_rank * heads * (nope + v)
    o = heads * v * h
    indexer = 0
    if "index_n_heads" in c and q_rank:
        ih, idim = c["index_n_heads"], c.get("index_head_dim", 128)
        indexer = q_rank * ih * idim + h * idim + h * ih
    io = ((h + q_rank) + (q_rank + heads * (nope + rope)) if q_rank else h + heads * (nope + rope))
    io += (h + kv_rank + rope) + (kv_rank + heads * (nope + v)) + (heads * v + h)
    return float(q + kv + o + indexer), float(io)


def _gated_deltanet_params(c: dict[str, Any]) -> tuple[float, float]:
    """Qwen3.5 / Qwen3-Next linear-attention layer: fused qkvz + ba projections, depthwise conv, output."""
    h = c["hidden_size"]
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    conv = (2 * nk * dk + nv * dv) * c.get("linear_conv_kernel_dim", 4)
    return (float(h * (2 * nk * dk + 2 * nv * dv) + h * 2 * nv + conv + nv * dv * h),
            float((h + 2 * nk * dk + 2 * nv * dv) + (h + 2 * nv) + (nv * dv + h)))


def _vision_params(v: dict[str, Any] | None) -> float:
    """A ViT tower: depth x (attention 4h^2 + MLP 2h*i) plus the patch merger into the text width."""
    if not isinstance(v, dict):
        return 0.0
    h = v.get("hidden_size") or v.get("embed_dim") or 0
    depth = v.get("depth") or v.get("num_hidden_layers") or 0
    inter = v.get("intermediate_size") or 4 * h
    out = v.get("out_hidden_size") or h
    merge = (v.get("spatial_merge_size") or 2) ** 2
    return float(depth * (4 * h * h + 2 * h * inter) + (h * merge) ** 2 + h * merge * out)


# ---- quantization --------------------------------------------------------------------------------------

def native_format(cfg: dict[str, Any]) -> str:
    """bf16 | fp8 | int4: how config.json (a dict) says the checkpoint stores its routed experts."""
    tc = cfg.get("text_config")
    return _native_format(cfg, tc if isinstance(tc, dict) else cfg)[0]


def _native_format(cfg: dict[str, Any], text: dict[str, Any]) -> tuple[str, tuple[int, int] | None]:
    q = text.get("quantization_config") or cfg.get("quantization_config")
    if not isinstance(q, dict):
        return "bf16", None
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8" or str(q.get("fmt", "")).startswith("e4m3"):
        block = q.get("weight_block_size") or [128, 128]
        return "fp8", (int(block[0]), int(block[1]))
    if method in ("compressed-tensors", "compressed_tensors"):
        groups = q.get("config_groups") or {}
        for g in groups.values():
            w = (g or {}).get("weights") or {}
            if int(w.get("num_bits", 16)) == 4:
                return "int4", (1, int(w.get("group_size") or 32))
            if int(w.get("num_bits", 16)) == 8 and str(w.get("type", "")).lower() == "float":
                return "fp8", (128, 128)
    return "bf16", None


# ---- families ------------------------------------------------------------------------------------------

def _need(c: dict[str, Any], names: tuple[str, ...], family: str, where: str) -> None:
    missing = [n for n in names if c.get(n) in (None, "")]
    if missing:
        raise RecipeError(
            f"config.json ({family}) lacks {', '.join(missing)}{where}",
            key="model_config",
            fix="use the model's own config.json (or one of recipes/models/*.json) with these fields set")


def _experts_alias(c: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 writes Qwen MoE configs with ``num_local_experts`` where 4.x wrote ``num_experts``."""
    if c.get("num_experts") in (None, "") and c.get("num_local_experts") not in (None, ""):
        return {**c, "num_experts": c["num_local_experts"]}
    return c


def _qwen3_moe(c: dict[str, Any], where: str) -> dict[str, Any]:
    c = _experts_alias(c)
    _need(c, _COMMON + ("num_experts", "num_attention_heads"), "qwen3_moe", where)
    mlp_only = set(c.get("mlp_only_layers") or [])
    step = int(c.get("decoder_sparse_step") or 1)
    n = c["num_hidden_layers"]
    moe = sum(1 for i in range(n) if i not in mlp_only and (i + 1) % step == 0)
    return dict(family="qwen3_moe", moe_layers=moe, num_experts=c["num_experts"],
                shared_expert_intermediate_size=int(c.get("shared_expert_intermediate_size") or 0),
                dense_intermediate_size=int(c.get("intermediate_size") or 0),
                **_attn(_gqa_params(c)))


def _attn(pair: tuple[float, float]) -> dict[str, Any]:
    return {"attention_params_per_layer": pair[0], "attention_linear_io": pair[1]}


def _qwen3_5_moe(c: dict[str, Any], where: str) -> dict[str, Any]:
    c = _experts_alias(c)
    _need(c, _COMMON + ("num_experts", "num_attention_heads", "linear_num_key_heads", "linear_num_value_heads",
                        "linear_key_head_dim", "linear_value_head_dim"), "qwen3_5_moe", where)
    n = c["num_hidden_layers"]
    types = c.get("layer_types")
    if not types:
        interval = int(c.get("full_attention_interval") or 4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    full = sum(1 for t in types if t == "full_attention")
    fa, la = _gqa_params(c, gated_q=True), _gated_deltanet_params(c)
    attn = tuple((full * fa[i] + (n - full) * la[i]) / n for i in (0, 1))
    return dict(family="qwen3_5_moe", moe_layers=n, num_experts=c["num_experts"],
                shared_expert_intermediate_size=int(c.get("shared_expert_intermediate_size") or 0),
                **_attn(attn))


def _deepseek(c: dict[str, Any], where: str) -> dict[str, Any]:
    _need(c, _COMMON + ("n_routed_experts", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
                        "qk_rope_head_dim", "v_head_dim", "intermediate_size"), "deepseek_v3", where)
    n = c["num_hidden_layers"]
    first_dense = int(c.get("first_k_dense_replace") or 0)
    freq = int(c.get("moe_layer_freq") or 1)
    moe = sum(1 for i in range(n) if i >= first_dense and i % freq == 0)
    return dict(family="deepseek_v3", moe_layers=moe, num_experts=c["n_routed_experts"],
                shared_expert_intermediate_size=int(c.get("n_shared_experts") or 0) * c["moe_intermediate_size"],
                dense_intermediate_size=c["intermediate_size"], **_attn(_mla_params(c)))


def _glm4_moe(c: dict[str, Any], where: str) -> dict[str, Any]:
    _need(c, _COMMON + ("n_routed_experts", "num_attention_heads", "intermediate_size"), "glm4_moe", where)
    n = c["num_hidden_layers"]
    first_dense = int(c.get("first_k_dense_replace") or 0)
    return dict(family="glm4_moe", moe_layers=n - first_dense, num_experts=c["n_routed_experts"],
                shared_expert_intermediate_size=int(c.get("n_shared_experts") or 0) * c["moe_intermediate_size"],
                dense_intermediate_size=c["intermediate_size"], **_attn(_gqa_params(c)))


def _glm_moe_dsa(c: dict[str, Any], where: str) -> dict[str, Any]:
    d = _deepseek(c, where)
    d["family"] = "glm_moe_dsa"
    types = c.get("mlp_layer_types")
    if types:
        d["moe_layers"] = sum(1 for t in types if t == "sparse")
    return d


# model_type (or an architectures[] substring) -> family parser
_FAMILIES: list[tuple[tuple[str, ...], Callable[[dict[str, Any], str], dict[str, Any]]]] = [
    (("qwen3_5_moe", "Qwen3_5Moe", "qwen3_next", "Qwen3Next"), _qwen3_5_moe),
    (("qwen3_moe", "Qwen3Moe", "qwen3_vl_moe", "Qwen3VLMoe", "qwen2_moe", "Qwen2Moe"), _qwen3_moe),
    (("glm_moe_dsa", "GlmMoeDsa"), _glm_moe_dsa),
    (("glm4_moe", "Glm4Moe"), _glm4_moe),
    (("deepseek_v3", "DeepseekV3", "deepseek_v32", "DeepseekV32", "deepseek_v4", "DeepseekV4",
      "kimi_k2", "kimi_k25", "KimiK2", "KimiK25"), _deepseek),
]

SUPPORTED = "Qwen3-MoE, Qwen3.5-MoE, DeepSeek-V3/V4, Kimi-K2.x, GLM-4.5 (Glm4Moe), GLM-5 (GlmMoeDsa)"


def _family_of(cfg: dict[str, Any], text: dict[str, Any]) -> Callable[[dict[str, Any], str], dict[str, Any]] | None:
    names = [str(text.get("model_type", "")), str(cfg.get("model_type", ""))]
    for archs in (cfg.get("architectures"), text.get("architectures")):   # a list, as published; anything else: text
        names += [str(a) for a in archs] if isinstance(archs, (list, tuple)) else ([str(archs)] if archs else [])
    for keys, parser in _FAMILIES:
        for name in names:
            if not name:
                continue
            if name in keys or any(k in name for k in keys if k[0].isupper()):
                return parser
    return None


# Physical plausibility: the largest published MoE models are far inside these bounds. Anything outside is a
# wrong or hostile file, and an unbounded value would make the planner loop (num_hidden_layers: 1e9) or overflow.
_BOUNDS = {"num_hidden_layers": 4096, "hidden_size": 1 << 17, "moe_intermediate_size": 1 << 18,
           "intermediate_size": 1 << 20, "shared_expert_intermediate_size": 1 << 20, "num_experts": 1 << 16,
           "n_routed_experts": 1 << 16, "num_local_experts": 1 << 16, "num_experts_per_tok": 1 << 12,
           "vocab_size": 1 << 24, "num_attention_heads": 1 << 12, "num_key_value_heads": 1 << 12, "head_dim": 1 << 14,
           "kv_lora_rank": 1 << 16, "q_lora_rank": 1 << 16, "qk_nope_head_dim": 1 << 14, "qk_rope_head_dim": 1 << 14,
           "v_head_dim": 1 << 14, "decoder_sparse_step": 4096, "first_k_dense_replace": 4096,
           "moe_layer_freq": 4096, "n_shared_experts": 1 << 12, "index_n_heads": 1 << 12, "index_head_dim": 1 << 14,
           "linear_num_key_heads": 1 << 12, "linear_num_value_heads": 1 << 12, "linear_key_head_dim": 1 << 14,
           "linear_value_head_dim": 1 << 14, "linear_conv_kernel_dim": 1 << 10, "full_attention_interval": 4096,
           "depth": 4096, "embed_dim": 1 << 17, "out_hidden_size": 1 << 17, "spatial_merge_size": 64}
_POSITIVE = ("num_hidden_layers", "hidden_size", "moe_intermediate_size", "num_experts_per_tok", "vocab_size",
             "num_attention_heads", "num_experts", "n_routed_experts", "num_local_experts", "decoder_sparse_step")


def _check_bounds(c: dict[str, Any], where: str, prefix: str = "") -> None:
    for key, limit in _BOUNDS.items():
        if key not in c or c[key] is None:
            continue
        v = c[key]
        ok = (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and math.isfinite(v)
                                                                 and v.is_integer())
        low = 1 if key in _POSITIVE else 0
        if not ok or not low <= v <= limit:
            raise RecipeError(f"config.json: {prefix}{key} = {str(v)[:40]} is not a whole number in [{low}, {limit}]"
                              f"{where}", key="model_config",
                              fix="use the model's own config.json (or one of recipes/models/*.json)")
        c[key] = int(v)
    for name in ("mlp_only_layers", "layer_types"):
        if name in c and (not isinstance(c[name], list) or len(c[name]) > 4096):
            raise RecipeError(f"config.json: {prefix}{name} must be a list of at most 4096 entries{where}",
                              key="model_config", fix="use the model's own config.json")


def parse_model_config(cfg: dict[str, Any], source: str = "") -> MoEArchitecture:
    """config.json (a dict) -> MoEArchitecture. Multimodal configs keep the language model under text_config."""
    if not isinstance(cfg, dict):
        raise RecipeError("config.json is not a JSON object", key="model_config", fix="point at the model's config.json")
    where = f" ({source})" if source else ""
    cfg = dict(cfg)
    if isinstance(cfg.get("text_config"), dict):
        cfg["text_config"] = dict(cfg["text_config"])
        _check_bounds(cfg["text_config"], where, "text_config.")
    if isinstance(cfg.get("vision_config"), dict):
        cfg["vision_config"] = dict(cfg["vision_config"])
        _check_bounds(cfg["vision_config"], where, "vision_config.")
    _check_bounds(cfg, where)
    tc = cfg.get("text_config")
    text: dict[str, Any] = tc if isinstance(tc, dict) else cfg
    parser = _family_of(cfg, text)
    if parser is None:
        # Say which fields a MoE model needs so a user can tell "wrong file" from "unsupported family".
        wanted = _COMMON + ("num_experts | n_routed_experts", "num_attention_heads")
        have = [w for w in wanted if any(text.get(x) is not None for x in w.split(" | "))]
        missing = [w for w in wanted if w not in have]
        raise RecipeError(
            f"unknown model architecture {cfg.get('architectures') or cfg.get('model_type') or '(none)'}{where}: "
            f"the planner knows {SUPPORTED}"
            + (f"; missing MoE fields: {', '.join(missing)}" if missing else ""),
            key="model_config",
            fix="pass --model-config with a supported model's config.json; dense (non-MoE) models do not need KT")
    try:
        fam = parser(text, where)
        fmt, block = _native_format(cfg, text)
        archs = cfg.get("architectures") or text.get("architectures") or ()
        return MoEArchitecture(
            model_type=str(text.get("model_type") or cfg.get("model_type") or ""),
            architectures=tuple(str(a) for a in archs) if isinstance(archs, (list, tuple)) else (str(archs),),
            hidden_size=int(text["hidden_size"]), num_layers=int(text["num_hidden_layers"]),
            experts_per_tok=int(text["num_experts_per_tok"]), moe_intermediate_size=int(text["moe_intermediate_size"]),
            vocab_size=int(text["vocab_size"]),
            tie_word_embeddings=bool(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
            extra_non_expert_params=_vision_params(cfg.get("vision_config")),
            native_format=fmt, quant_block=block, **fam)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError, OverflowError,
            RecursionError) as err:
        raise RecipeError(f"config.json: a field has the wrong type or value ({type(err).__name__}: "
                          f"{str(err)[:120]}){where}", key="model_config",
                          fix="use the model's own config.json (or one of recipes/models/*.json)") from None


def load_model_config(path: str | Path) -> MoEArchitecture:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"

    text = read_text(p, 16 << 20, "model config.json")  # bounded; a FIFO or device is refused
    try:
        cfg = parse_json(text)
    except ValueError as err:  # bad syntax, nested too deeply, an integer past Python's 4,300-digit limit
        raise RecipeError(f"{p} is not valid JSON: {err}", key="model_config",
                          fix="use the model's config.json as published") from None
    return parse_model_config(cfg, source=str(p))


def shipped_models_dir() -> Path:
    """recipes/models/ (reached through the package's builtin_recipes link, so it works when installed)."""
    return Path(__file__).resolve().parents[2] / "builtin_recipes" / "models"


def resolve_model_config(train: Mapping[str, Any], explicit: str | Path | None = None,
                         models_dir: Path | None = None) -> tuple[MoEArchitecture, str]:
    """Which config.json describes this recipe's model, in order: --model-config, the model dir's own
    config.json, then recipes/models/<basename of model_name_or_path>.json. Returns (arch, where)."""
    if explicit:
        return load_model_config(explicit), str(explicit)
    name = str(TrainKeys(train).model_name_or_path or "").rstrip("/")
    tried = []
    if name:
        own = Path(name) / "config.json"
        tried.append(str(own))
        if own.is_file():
            return load_model_config(own), str(own)
        shipped = (models_dir or shipped_models_dir()) / f"{Path(name).name}.json"
        tried.append(str(shipped))
        if shipped.is_file():
            return load_model_config(shipped), str(shipped)
    raise UsageError(
        "no config.json for the recipe's model" + (f" (tried {', '.join(tried)})" if tried else
                                                    ": train.model_name_or_path is not set"),
        key="train.model_name_or_path",
        fix="pass --model-config PATH/config.json (only the config is needed, no weights)")


def gib(nbytes: float) -> float:
    return nbytes / 2**30


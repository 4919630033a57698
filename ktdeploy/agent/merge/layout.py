"""Which LoRA term goes into which base tensor, from the safetensors headers and the configs alone (no tensor
data is read here): the KT adapter's two parts mapped onto the base model, every shape and rank checked.

* Routed experts (``fused_expert_lora.safetensors``, kt-kernel): ``layers.L.experts.{gate,up,down}_lora_a``
  ``[E, r, in]`` and ``..._lora_b`` ``[E, out, r]``. The base stores either one 2-D weight per expert,
  ``<stack>.L.mlp.experts.e.{gate,up,down}_proj.weight`` ``[out, in]`` (Qwen3-MoE, DeepSeek, GLM), or fused 3-D
  tensors ``<stack>.L.mlp.experts.gate_up_proj`` ``[E, 2I, H]`` (gate rows first, then up) and ``down_proj``
  ``[E, H, I]`` (Qwen3.5, transformers 5). ``<stack>`` is ``model.layers`` or ``model.language_model.layers``.
* Everything else (``adapter_model.safetensors``, PEFT): ``base_model.model.<module>.lora_A.weight`` ``[r, in]``
  and ``lora_B.weight`` ``[out, r]`` onto the base's ``<module>.weight`` ``[out, in]`` (attention, shared experts,
  the router ``mlp.gate`` ...).

Rows of a base tensor are addressed in its 2-D view ``[prod(shape[:-1]), shape[-1]]``; each term covers a row
range, so a fused ``[E, 2I, H]`` tensor takes 2E terms and a per-expert weight one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ktdeploy.agent import safetensors_io as st
from ktdeploy.core.errors import UsageError

_FUSED_KEY = re.compile(r"^layers\.(\d+)\.experts\.(gate|up|down)_lora_([ab])$")
_PER_EXPERT = re.compile(r"^(?P<stack>.+\.layers)\.(?P<layer>\d+)\.mlp\.experts\.(?P<e>\d+)\."
                         r"(?P<proj>gate|up|down)_proj\.weight$")
_FUSED_BASE = re.compile(r"^(?P<stack>.+\.layers)\.(?P<layer>\d+)\.mlp\.experts\.(?P<proj>gate_up|down)_proj"
                         r"(?:\.weight)?$")
_KT_CONVERTED = re.compile(r"^blk\.\d+\.ffn_(gate|up|down)_exps\.")
PEFT_PREFIX = "base_model.model."
LORA_DTYPES = ("BF16", "F16", "F32")
# Models whose fused expert tensors are stored transposed ([E, H, 2I]); shapes cannot tell when H == 2I.
TRANSPOSED_FUSED = ("qwen3_vl_moe", "qwen3_omni_moe")


class MergeError(UsageError):
    """The adapter cannot be merged into this base (exit code 2); nothing is published."""


@dataclass(frozen=True)
class Term:
    """``rows [row0, row1)`` of the target's 2-D view get ``s * (B @ A)``; A ``[r, cols]``, B ``[row1-row0, r]``."""

    row0: int
    row1: int
    a: st.Slice
    b: st.Slice


@dataclass
class Target:
    """What happens to one base tensor: LoRA terms, and/or FP8 dequantization (then ``out_dtype`` is BF16)."""

    name: str
    info: st.TensorInfo
    terms: list[Term] = field(default_factory=list)
    scale_inv: str | None = None          # FP8: the name of its block-scale tensor
    out_dtype: str = ""

    @property
    def rows(self) -> int:
        return math.prod(self.info.shape[:-1]) if len(self.info.shape) > 1 else 1

    @property
    def cols(self) -> int:
        return self.info.shape[-1] if self.info.shape else 1


@dataclass
class Mapping:
    targets: dict[str, Target]            # base tensor name -> what to do (only tensors that change)
    dropped: set[str]                     # FP8 block-scale tensors (folded into their BF16 weight)
    expert_layers: list[int]
    num_experts: int
    expert_tensors: int                   # base tensors that take expert LoRA
    nonexpert_tensors: int                # base tensors that take PEFT LoRA
    layout: str                           # per-expert | fused
    notes: list[str]


def refuse_base_format(tensors: dict[str, st.TensorInfo], config: dict, where: str) -> tuple[list[int], str] | None:
    """Refusals for bases the merge cannot read exactly; returns the FP8 block size and a note for an FP8 base."""
    for name in tensors:
        if _KT_CONVERTED.match(name) or name.endswith((".qweight", ".qzeros")):
            raise MergeError(f"{where} holds KT-converted or packed quantized expert weights ({name!r}): "
                             "INT8/INT4 weights cannot take a LoRA term exactly",
                             fix="merge into the BF16 (or FP8) source model the conversion was made from "
                                 "(train.model_name_or_path), then convert the merged model for CPU serving if you "
                                 "want INT8/INT4 experts")
    q = _text(config).get("quantization_config") or config.get("quantization_config")
    fp8 = any(i.dtype in ("F8_E4M3", "F8_E5M2") for i in tensors.values())
    if q is None and not fp8:
        return None
    q = q if isinstance(q, dict) else {}
    method = str(q.get("quant_method", "")).lower()
    if method != "fp8":
        raise MergeError(f"{where}: quantization_config.quant_method is {method or q!r}; ktdeploy merges BF16, F16, "
                         "F32 and block-scaled FP8 bases only",
                         fix="merge into the unquantized source model, then quantize the merged model")
    block = q.get("weight_block_size")
    if (not isinstance(block, list) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and 0 < b <= 1 << 16 for b in block)):
        raise MergeError(f"{where}: FP8 without block scales (weight_block_size {block!r})",
                         fix="only DeepSeek-style FP8 (E4M3, weight_block_size [128, 128], weight_scale_inv) is "
                             "dequantized; merge into a BF16 copy of the model")
    if any(i.dtype == "F8_E5M2" for i in tensors.values()):
        raise MergeError(f"{where}: F8_E5M2 weights; only E4M3 with block scales is dequantized",
                         fix="merge into a BF16 copy of the model")
    return block, ("FP8 base: every FP8 weight is dequantized (x its weight_scale_inv block scale) and written as "
                   "BF16, with or without a LoRA term; quantization_config is removed from config.json. The merged "
                   "model is BF16, about twice the size of the FP8 base.")


def _text(config: dict) -> dict:
    t = config.get("text_config")
    return t if isinstance(t, dict) else config


def fp8_targets(tensors: dict[str, st.TensorInfo], block: list[int]) -> tuple[dict[str, Target], set[str]]:
    """Every FP8 weight with its ``<name>_scale_inv`` (shape ``[ceil(out/bh), ceil(in/bw)]``, F32)."""
    targets: dict[str, Target] = {}
    dropped: set[str] = set()
    bh, bw = block
    for name, info in tensors.items():
        if info.dtype != "F8_E4M3":
            continue
        sname = f"{name}_scale_inv"
        s = tensors.get(sname)
        if len(info.shape) != 2 or s is None:
            raise MergeError(f"FP8 tensor {name} {list(info.shape)} has no 2-D block scale {sname}",
                             fix="only DeepSeek-style FP8 checkpoints (2-D weights + weight_scale_inv) are "
                                 "dequantized; merge into a BF16 copy of the model")
        want = [-(-info.shape[0] // bh), -(-info.shape[1] // bw)]
        if s.dtype not in ("F32", "BF16") or list(s.shape) != want:
            raise MergeError(f"{sname} is {s.dtype} {list(s.shape)}; the block size {block} needs F32 {want}",
                             fix="the checkpoint's quantization_config does not match its tensors")
        targets[name] = Target(name, info, scale_inv=sname, out_dtype="BF16")
        dropped.add(sname)
    return targets, dropped


def _fused_groups(index: dict[str, st.TensorInfo], where: str) -> dict[int, dict[str, st.TensorInfo]]:
    groups: dict[int, dict[str, st.TensorInfo]] = {}
    for name, info in index.items():
        m = _FUSED_KEY.match(name)
        if not m:
            raise MergeError(f"{where}: unexpected tensor {name!r}",
                             fix="this kt-kernel version writes a layout ktdeploy does not know; report it")
        if len(info.shape) != 3 or info.dtype not in LORA_DTYPES:
            raise MergeError(f"{where}: {name} is {info.dtype} {list(info.shape)}, expected a 3-D float tensor",
                             fix="the file is damaged or from an unknown kt-kernel version")
        groups.setdefault(int(m.group(1)), {})[f"{m.group(2)}_{m.group(3)}"] = info
    for layer, g in groups.items():
        missing = {f"{p}_{ab}" for p in ("gate", "up", "down") for ab in "ab"} - g.keys()
        if missing:
            raise MergeError(f"{where}: layer {layer} lacks {sorted(missing)}", fix="the file is incomplete; re-save it")
    return groups


def expert_targets(fused_path: str, fused: dict[str, st.TensorInfo], base: dict[str, st.TensorInfo], rank: int,
                   num_layers: int | None, model_type: str) -> tuple[dict[str, Target], list[int], int, str]:
    """Expert LoRA terms per base tensor; returns (targets, layers, experts per layer, layout)."""
    groups = _fused_groups(fused, fused_path)
    per: dict[int, dict[tuple[int, str], str]] = {}
    fusedb: dict[int, dict[str, str]] = {}
    stacks = set()
    for name in base:
        m = _PER_EXPERT.match(name)
        if m:
            per.setdefault(int(m["layer"]), {})[(int(m["e"]), m["proj"])] = name
            stacks.add(m["stack"])
            continue
        m = _FUSED_BASE.match(name)
        if m and len(base[name].shape) == 3:
            fusedb.setdefault(int(m["layer"]), {})[m["proj"]] = name
            stacks.add(m["stack"])
    if len(stacks) > 1:
        raise MergeError(f"the base holds experts under several stacks {sorted(stacks)}",
                         fix="merge a single-model checkpoint (one decoder stack)")
    if per and fusedb:
        raise MergeError("the base mixes per-expert and fused expert tensors", fix="the checkpoint is damaged")
    if fusedb and model_type in TRANSPOSED_FUSED:
        raise MergeError(f"{model_type} stores its fused experts transposed ([E, hidden, 2 x inter]); ktdeploy "
                         "merges the [E, 2 x inter, hidden] layout only", fix="report it with the model's name")
    base_layers = set(per) | set(fusedb)
    if num_layers is not None:   # DeepSeek's multi-token-prediction layer (index num_hidden_layers) is not trained
        base_layers = {x for x in base_layers if x < num_layers}
    extra = sorted(set(groups) - base_layers)
    if extra:
        raise MergeError(f"the adapter has expert LoRA for layer(s) {extra[:8]} but the base has no routed experts "
                         "there", fix="merge into the model the adapter was trained on (train.model_name_or_path)")
    uncovered = sorted(base_layers - set(groups))
    if uncovered:
        raise MergeError(f"the base has routed experts in layer(s) {uncovered[:8]} that the adapter's "
                         f"{len(groups)} expert-LoRA layers do not cover",
                         fix="merge into the model the adapter was trained on (train.model_name_or_path)")
    targets: dict[str, Target] = {}
    n_experts = 0
    for layer in sorted(groups):
        g = groups[layer]
        e_count = g["gate_a"].shape[0]
        for key, info in g.items():
            if info.shape[0] != e_count or 0 in info.shape:
                raise MergeError(f"{fused_path}: layer {layer} {key} is {list(info.shape)} (gate_a has {e_count} "
                                 "experts); every dimension must be the same count of experts and non-zero",
                                 fix="the file is damaged")
        n_experts = n_experts or e_count
        if e_count != n_experts:
            raise MergeError(f"{fused_path}: layer {layer} has {e_count} experts, layer {min(groups)} {n_experts}",
                             fix="the file is damaged")
        have_experts = ({e for e, _p in per[layer]} if layer in per else None)
        if have_experts is not None and len(have_experts) < e_count:
            missing = sorted(set(range(e_count)) - have_experts)
            raise MergeError(f"the base lacks expert {missing[0]} of layer {layer} ({len(missing)} of the adapter's "
                             f"{e_count} experts missing there)",
                             fix="merge into the complete model the adapter was trained on")
        slices = {k: st.split_first_axis(fused_path, info) for k, info in g.items()}
        for proj in ("gate", "up", "down"):
            a, b = g[f"{proj}_a"], g[f"{proj}_b"]
            if a.shape[1] != rank or b.shape[2] != rank:
                raise MergeError(f"{fused_path}: layer {layer} {proj}: lora_a {list(a.shape)} / lora_b "
                                 f"{list(b.shape)} do not have the adapter's rank r={rank}",
                                 fix="the expert and non-expert LoRA come from different runs; merge one checkpoint")
        if layer in per:
            have = per[layer]
            for e in range(e_count):
                for proj in ("gate", "up", "down"):
                    found = have.get((e, proj))
                    if found is None:
                        raise MergeError(f"the base lacks expert {e} {proj}_proj of layer {layer} (the adapter has "
                                         f"{e_count} experts there)",
                                         fix="merge into the complete model the adapter was trained on")
                    info = base[found]
                    a, b = g[f"{proj}_a"], g[f"{proj}_b"]
                    want = (b.shape[1], a.shape[2])
                    if tuple(info.shape) != want:
                        raise MergeError(f"{found} is {list(info.shape)} but the expert LoRA needs {list(want)} "
                                         f"(lora_a {list(a.shape)}, lora_b {list(b.shape)})",
                                         fix="merge into the model the adapter was trained on")
                    targets[found] = Target(found, info, [Term(0, want[0], slices[f"{proj}_a"][e],
                                                             slices[f"{proj}_b"][e])])
            more = sorted({e for e, _ in have} - set(range(e_count)))
            if more:
                raise MergeError(f"the base has {max(more) + 1}+ experts in layer {layer}, the adapter {e_count}",
                                 fix="merge into the model the adapter was trained on")
        else:
            fb = fusedb[layer]
            if set(fb) != {"gate_up", "down"}:
                raise MergeError(f"layer {layer} lacks a fused {'down' if 'gate_up' in fb else 'gate_up'}_proj",
                                 fix="merge into the complete model the adapter was trained on")
            gu, dn = base[fb["gate_up"]], base[fb["down"]]
            inter, hidden = g["gate_b"].shape[1], g["gate_a"].shape[2]
            checks = ((gu, [e_count, 2 * inter, hidden]), (dn, [e_count, g["down_b"].shape[1], g["down_a"].shape[2]]))
            for tensor, need in checks:
                if list(tensor.shape) != need:
                    raise MergeError(f"{tensor.name} is {list(tensor.shape)} but the expert LoRA needs {need}",
                                     fix="merge into the model the adapter was trained on")
            if [g["up_b"].shape[1], g["up_a"].shape[2]] != [inter, hidden]:
                raise MergeError(f"layer {layer}: up LoRA {list(g['up_b'].shape)} / {list(g['up_a'].shape)} does not "
                                 "match gate's", fix="the file is damaged")
            gu_terms, dn_terms = [], []
            rows_dn = dn.shape[1]
            for e in range(e_count):
                base_row = e * 2 * inter
                gu_terms.append(Term(base_row, base_row + inter, slices["gate_a"][e], slices["gate_b"][e]))
                gu_terms.append(Term(base_row + inter, base_row + 2 * inter, slices["up_a"][e], slices["up_b"][e]))
                dn_terms.append(Term(e * rows_dn, (e + 1) * rows_dn, slices["down_a"][e], slices["down_b"][e]))
            targets[gu.name] = Target(gu.name, gu, gu_terms)
            targets[dn.name] = Target(dn.name, dn, dn_terms)
    return targets, sorted(groups), n_experts, "fused" if fusedb else "per-expert"


def peft_targets(path: str, index: dict[str, st.TensorInfo], base: dict[str, st.TensorInfo], rank: int) -> dict[str, Target]:
    """PEFT LoRA terms: ``<module>.lora_A.weight`` / ``lora_B.weight`` onto ``<module>.weight``."""
    pairs: dict[str, dict[str, st.TensorInfo]] = {}
    for name, info in index.items():
        key = name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name
        m = re.match(r"^(.+)\.lora_([AB])\.weight$", key)
        if not m:
            raise MergeError(f"{path}: tensor {name!r} is not a LoRA A/B weight (DoRA magnitude, embedding LoRA or "
                             "modules_to_save?)", fix="train with plain LoRA (use_dora: false, no additional_target)")
        if ".mlp.experts." in key and re.search(r"\.mlp\.experts\.\d+\.", key) is None:
            raise MergeError(f"{path}: {name!r} targets a fused expert parameter through PEFT",
                             fix="KT trains the routed experts' LoRA in fused_expert_lora.safetensors; re-train")
        if len(info.shape) != 2 or info.dtype not in LORA_DTYPES:
            raise MergeError(f"{path}: {name} is {info.dtype} {list(info.shape)}, expected a 2-D float tensor",
                             fix="the file is damaged")
        pairs.setdefault(m.group(1), {})[m.group(2)] = info
    targets: dict[str, Target] = {}
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise MergeError(f"{path}: {module} has lora_{next(iter(ab))} without its pair", fix="the file is damaged")
        a, b = ab["A"], ab["B"]
        if a.shape[0] != rank or b.shape[1] != rank:
            raise MergeError(f"{module}: lora_A {list(a.shape)} / lora_B {list(b.shape)} do not have rank r={rank}",
                             fix="merge applies one alpha/r; train with one lora_rank (no rank_pattern)")
        wname = f"{module}.weight"
        found_info = base.get(wname)
        if found_info is None:
            raise MergeError(f"the adapter targets {module} but the base has no {wname}",
                             fix="merge into the model the adapter was trained on (train.model_name_or_path)")
        need = [b.shape[0], a.shape[1]]
        if list(found_info.shape) != need:
            raise MergeError(f"{wname} is {list(found_info.shape)} but its LoRA needs {need} "
                             f"(lora_A {list(a.shape)}, lora_B {list(b.shape)})",
                             fix="merge into the model the adapter was trained on")
        targets[wname] = Target(wname, found_info, [Term(0, need[0], st.whole(path, a), st.whole(path, b))])
    return targets


def combine(base: dict[str, st.TensorInfo], parts: list[dict[str, Target]], fp8: dict[str, Target]) -> dict[str, Target]:
    """One Target per base tensor; sets the output dtype and refuses a tensor two parts both change."""
    out: dict[str, Target] = {}
    for part in parts:
        for name, t in part.items():
            if name in out:
                raise MergeError(f"{name} takes LoRA from both the expert and the non-expert adapter",
                                 fix="this output mixes formats; merge the raw KT output of one run")
            out[name] = t
    for name, t in fp8.items():
        if name in out:
            out[name].scale_inv = t.scale_inv
        else:
            out[name] = t
    for name, t in out.items():
        dtype = base[name].dtype
        if t.scale_inv is not None:
            t.out_dtype = "BF16"
        elif dtype in ("BF16", "F16", "F32"):
            t.out_dtype = dtype
        else:
            raise MergeError(f"{name} is {dtype}; a LoRA term can be added to BF16, F16, F32 or block-scaled FP8 only",
                             fix="merge into the BF16 source model")
    return out

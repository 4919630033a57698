"""Turn a raw KT LoRA training output into the single adapter sglang-kt serves (``--lora-paths``).

What KT + LlamaFactory write (``output_dir`` or one of its ``checkpoint-*``):

* ``adapter_model.safetensors`` + ``adapter_config.json`` - PEFT's LoRA on the GPU modules
  (attention, shared experts, dense MLPs), keys ``base_model.model.<module>.lora_{A,B}.weight``;
* ``fused_expert_lora.safetensors`` - the routed experts' LoRA, trained by kt-kernel on the CPU, one
  3-D tensor per layer and projection: ``layers.<L>.experts.<proj>_lora_a`` ``[E, r, in]`` and
  ``..._lora_b`` ``[E, out, r]`` for proj in gate/up/down;
* ``kt_adapter_manifest.json`` - status, LoRA rank/alpha and a size + SHA-256 per artifact.

What sglang-kt loads: one PEFT-style directory whose ``adapter_model.safetensors`` holds the
non-expert tensors under ``<module>.lora_{A,B}.weight`` (PEFT's ``base_model.model.`` prefix
removed) and one 2-D pair per routed expert under
``<layers>.<L>.mlp.experts.<e>.<proj>_proj.lora_{A,B}.weight``, with ``adapter_config.json``
listing every target module (``q_proj`` ... ``gate_proj``/``up_proj``/``down_proj``). sglang applies
one scaling, ``lora_alpha / r``, to all of them - kt-kernel uses the same ``alpha / r`` for the
experts - so rank and alpha must agree across both parts.

The conversion is pure byte-range copying (see ``safetensors_io``): no torch, constant memory,
and the result is written to a fresh directory that is published by one rename.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ktdeploy.agent import safetensors_io as st
from ktdeploy.core.adapter_layout import destination_problem
from ktdeploy.core.errors import OverwriteRefused, UsageError
from ktdeploy.core.hashing import sha256_file
from ktdeploy.core.job_layout import JobLayout
from ktdeploy.core.safeio import inside, parse_json, redact, staging_dir, write_file

FUSED = "fused_expert_lora.safetensors"
MANIFEST = "kt_adapter_manifest.json"
ADAPTER = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
PROVENANCE = "ktdeploy_convert.json"

_FUSED_KEY = re.compile(r"^layers\.(\d+)\.experts\.(gate|up|down)_lora_([ab])$")
_PEFT_PREFIX = "base_model.model."
# Order sglang lists modules in; anything else follows alphabetically.
_MODULE_ORDER = ["q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
                 "kv_b_proj", "gate_proj", "up_proj", "down_proj", "gate_up_proj", "embed_tokens", "lm_head"]


class ConvertError(UsageError):
    """The training output cannot be turned into an sglang-kt adapter (exit code 2)."""


@dataclass
class ConvertSummary:
    input_dir: str
    output_dir: str
    rank: int
    lora_alpha: float
    num_layers: int
    num_experts: int
    expert_tensors: int
    nonexpert_tensors: int
    target_modules: list[str]
    base_model_name_or_path: str | None
    bytes_written: int
    checks: list[str] = field(default_factory=list)


def _checkpoints(path: Path, marker: str) -> list[Path]:
    """``path``'s checkpoint-* folders holding ``marker``, oldest first. A checkpoint that is a symbolic link (or
    resolves outside ``path``) is refused, never published from: docs/security.md promises no link in the output
    ktdeploy publishes from (issue 35: the newest checkpoint-N linked outside the output folder and was used)."""
    found = [p for p in path.glob("checkpoint-*") if (p / marker).exists()]
    for p in found:
        if p.is_symlink() or not inside(str(p.resolve()), str(path.resolve())):
            raise ConvertError(f"{p} is a symbolic link (to {os.path.realpath(p)}); ktdeploy never publishes from "
                               "a link", fix="replace the link with the checkpoint folder itself, or convert "
                                             "that folder directly")
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]) if p.name.split("-")[-1].isdigit() else -1)


def find_adapter_dir(path: Path) -> Path:
    """``path`` itself when it holds the KT output, else its newest ``checkpoint-*`` that does."""
    if not path.is_dir():
        raise ConvertError(f"{path} is not a directory", fix="pass the training output_dir (or one checkpoint-* in it)")
    if (path / FUSED).exists() or (path / MANIFEST).exists():
        return path
    ckpts = _checkpoints(path, FUSED)
    if ckpts:
        return ckpts[-1]
    raise ConvertError(f"{path} holds no KT LoRA output ({FUSED} not found here or in checkpoint-*)",
                       fix="point at the output_dir of a finished KT LoRA run (use_kt: true, finetuning_type: lora)")


def _load_json(path: Path, what: str) -> dict:
    from ktdeploy.core.safeio import read_bytes

    if not path.exists():
        raise ConvertError(f"{path} is missing ({what})",
                           fix="the training run did not finish writing its adapter; resume it or pick another checkpoint")
    try:
        data = parse_json(read_bytes(path, 16 << 20, what))  # bounded, regular files only
    except ValueError as err:
        raise ConvertError(f"{path} is not valid JSON: {err}", fix="the file is damaged; re-save the checkpoint") from None
    if not isinstance(data, dict):
        raise ConvertError(f"{path} is not a JSON object ({what})", fix="the file is damaged; re-save the checkpoint")
    return data


MAX_EXPERT_TENSORS = 1 << 20  # Qwen3.5-397B: 60 layers x 512 experts x 6 = 184k; a crafted header must not ask 16M


def _plain_file(p: Path) -> bool:
    """A regular file that is not a symbolic link (a link in a training output could publish a file from elsewhere)."""
    return p.is_file() and not p.is_symlink()


def _count_slices(items: list, more: int, path: Path) -> None:
    if len(items) + more > MAX_EXPERT_TENSORS:
        raise ConvertError(f"{path}: more than {MAX_EXPERT_TENSORS} per-expert tensors (layers x experts x 6)",
                           fix="the file is damaged or not a KT output; no MoE model has that many experts")


def check_manifest(src: Path, manifest: dict) -> list[str]:
    """The KT manifest says 'ready' and every artifact's size and SHA-256 still match."""
    notes = []
    if manifest.get("status") != "ready":
        raise ConvertError(f"{src / MANIFEST}: status is {manifest.get('status')!r}, not 'ready'",
                           fix="the save was interrupted; convert an earlier checkpoint-* or resume training")
    arts = manifest.get("artifacts") or {}
    if FUSED not in arts:
        raise ConvertError(f"{src / MANIFEST} does not list {FUSED}", fix="re-save the adapter with kt-kernel >= 0.7")
    for name, rec in arts.items():
        p = src / name
        if p.is_symlink():
            raise ConvertError(f"artifact {name!r} in {src} is a symbolic link; ktdeploy never publishes a file "
                               "through a link", fix="replace the link with the file itself and convert again")
        if name != os.path.basename(name) or not _plain_file(p):
            raise ConvertError(f"artifact {name!r} named by the manifest is missing from {src}",
                               fix="copy the whole output directory, not single files")
        if isinstance(rec, dict) and rec.get("size") is not None and rec["size"] != p.stat().st_size:
            raise ConvertError(f"{p}: size {p.stat().st_size} differs from the manifest's {rec['size']}",
                               fix="the file changed after training (partial copy?); copy it again")
        if isinstance(rec, dict) and rec.get("sha256") and sha256_file(p) != rec["sha256"]:
            raise ConvertError(f"{p}: SHA-256 differs from the manifest", fix="the file is damaged; copy it again")
        notes.append(f"{name}: size and sha256 match the manifest")
    return notes


def _fused_slices(path: Path) -> tuple[list[tuple[str, st.Slice]], int, int, int, str]:
    """Per-expert slices of the fused file; returns (items, rank, num_layers, num_experts, layers_key)."""
    index, _ = st.read_header(path)
    groups: dict[int, dict[str, st.TensorInfo]] = {}
    for name, info in index.items():
        m = _FUSED_KEY.match(name)
        if not m:
            raise ConvertError(f"{path}: unexpected tensor {name!r}",
                               fix="this kt-kernel version writes a layout ktdeploy does not know; report it")
        if len(info.shape) != 3:
            raise ConvertError(f"{path}: {name} has shape {list(info.shape)}, expected [experts, a, b]",
                               fix="the file is damaged or from an unknown kt-kernel version")
        groups.setdefault(int(m.group(1)), {})[f"{m.group(2)}_{m.group(3)}"] = info
    if not groups:
        raise ConvertError(f"{path} holds no tensors", fix="the run saved an empty expert LoRA; check kt_config")
    ranks, experts = set(), set()
    for layer in sorted(groups):   # every layer judged before a single slice is built
        g = groups[layer]
        missing = {f"{p}_{ab}" for p in ("gate", "up", "down") for ab in "ab"} - g.keys()
        if missing:
            raise ConvertError(f"{path}: layer {layer} lacks {sorted(missing)}", fix="the file is incomplete; re-save it")
        for proj in ("gate", "up", "down"):
            a, b = g[f"{proj}_a"], g[f"{proj}_b"]
            if a.shape[0] != b.shape[0] or a.shape[1] != b.shape[2]:
                raise ConvertError(f"{path}: layer {layer} {proj}: lora_a {list(a.shape)} and lora_b {list(b.shape)} "
                                   "do not fit together", fix="the file is damaged")
            if a.shape[1] < 1 or a.shape[0] < 1:
                raise ConvertError(f"{path}: layer {layer} {proj}: lora_a {list(a.shape)} has no rank or no experts",
                                   fix="the file is damaged")
            ranks.add(a.shape[1])
            experts.add(a.shape[0])
    _count_slices([], sum(info.shape[0] for g in groups.values() for info in g.values()), path)
    if len(ranks) != 1 or len(experts) != 1:
        raise ConvertError(f"{path}: inconsistent ranks {sorted(ranks)} or expert counts {sorted(experts)}",
                           fix="the file mixes runs; re-save it")
    for layer in sorted(groups):
        g = groups[layer]
        for info in g.values():
            servable(path, info)
        _consistent_projections(path, layer, g)
    items: list[tuple[str, st.Slice]] = []
    for layer in sorted(groups):
        g = groups[layer]
        for proj in ("gate", "up", "down"):
            for which, info in (("A", g[f"{proj}_a"]), ("B", g[f"{proj}_b"])):
                for e, s in enumerate(st.split_first_axis(path, info)):
                    items.append((f"{{layers}}.{layer}.mlp.experts.{e}.{proj}_proj.lora_{which}.weight", s))
    return items, ranks.pop(), len(groups), experts.pop(), "model.layers"


SERVABLE_DTYPES = ("BF16", "F16", "F32")   # what sglang's LoRA layers load; an int/bool/FP8 LoRA is not one
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TENSOR_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,512}$")


def servable(path: Path, info: st.TensorInfo) -> None:
    """A LoRA tensor sglang-kt can serve: a float dtype, and no NaN/Inf among its sampled values."""
    if info.dtype not in SERVABLE_DTYPES:
        raise ConvertError(f"{path}: {info.name} is {info.dtype}; a LoRA sglang-kt serves is BF16, F16 or F32",
                           fix="the file is damaged or not a LoRA adapter (an integer, bool or FP8 LoRA cannot be "
                               "served); re-save the checkpoint")
    bad = st.non_finite(path, info)
    if bad:
        raise ConvertError(f"{path}: {info.name} holds NaN/Inf values ({bad} of those sampled): the run diverged",
                           fix="convert an earlier checkpoint-* (before the loss became NaN), or retrain with a lower "
                               "learning rate")


def _consistent_projections(path: Path, layer: int, g: dict[str, st.TensorInfo]) -> None:
    """gate/up take the hidden state to the expert width, down takes it back: lora_a [E, r, in], lora_b [E, out, r]
    with gate == up, down's in == gate's out and down's out == gate's in. Anything else is not one MoE layer."""
    ga, gb, ua, ub, da, db = (g[k].shape for k in ("gate_a", "gate_b", "up_a", "up_b", "down_a", "down_b"))
    hidden, width = ga[2], gb[1]
    if ua != ga or ub != gb or da[2] != width or db[1] != hidden:
        raise ConvertError(f"{path}: layer {layer}: gate/up/down LoRA sizes do not form one MoE layer (gate "
                           f"{list(ga)}/{list(gb)}, up {list(ua)}/{list(ub)}, down {list(da)}/{list(db)})",
                           fix="the file is damaged or mixes models; re-save the checkpoint")


def _module_of(key: str) -> str | None:
    if ".lora_" not in key:
        return None
    return key.split(".lora_", 1)[0].rsplit(".", 1)[-1]


def _ordered(modules: set[str]) -> list[str]:
    head = [m for m in _MODULE_ORDER if m in modules]
    return head + sorted(modules - set(head))


def convert(input_dir: str | os.PathLike, output_dir: str | os.PathLike, *,
            base_model: str | None = None, verify_manifest: bool = True) -> ConvertSummary | FullConvertSummary:
    """Convert ``input_dir`` (KT LoRA output) into a new sglang-kt adapter directory ``output_dir``. Any value of
    the wrong type in the input (manifest, adapter_config.json, headers) is a ConvertError, never a crash."""
    try:
        return _convert(input_dir, output_dir, base_model=base_model, verify_manifest=verify_manifest)
    except st.SafetensorsFormatError as err:
        raise ConvertError(str(err), fix="the file is damaged or not a safetensors file; re-save the checkpoint") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError) as err:
        raise ConvertError(f"the adapter's files hold a value of the wrong type ({type(err).__name__}: {str(err)[:160]})",
                           fix="the files are damaged or not a KT LoRA output; re-save the checkpoint") from None


def _convert(input_dir: str | os.PathLike, output_dir: str | os.PathLike, *,
             base_model: str | None = None, verify_manifest: bool = True) -> ConvertSummary | FullConvertSummary:
    """Convert ``input_dir`` (KT LoRA output) into a new sglang-kt adapter directory ``output_dir``.

    A KT full fine-tune's output (``kt_full_experts.index.json``) goes to :func:`convert_full` instead."""
    if not str(output_dir).strip():
        raise ConvertError("the output folder is empty", fix="give -o DIR, e.g. <output_dir>-sglang")
    if Path(output_dir).is_symlink():
        raise ConvertError(f"{output_dir} is a symbolic link; ktdeploy never writes through a link",
                           fix="give the real folder")
    top = Path(input_dir).resolve()
    if top.is_dir() and not (top / FUSED).exists() and not (top / MANIFEST).exists() and find_full_dir(top):
        return convert_full(top, output_dir)
    src = find_adapter_dir(top)
    dst = Path(output_dir).resolve()
    problem = destination_problem(str(src), str(dst)) or destination_problem(str(Path(input_dir).resolve()), str(dst))
    if problem:
        raise ConvertError(problem, fix=f"choose a sibling directory, e.g. {JobLayout(str(Path(input_dir).resolve())).adapter_dir}")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise OverwriteRefused(f"{dst} already exists and is not empty; ktdeploy never overwrites an adapter",
                               key="-o", fix="remove it yourself or choose another -o directory")

    checks: list[str] = []
    manifest = {}
    if (src / MANIFEST).exists():
        manifest = _load_json(src / MANIFEST, "KT adapter manifest")
        if verify_manifest:
            checks += check_manifest(src, manifest)
    elif not (src / FUSED).exists():
        raise ConvertError(f"{src} has neither {MANIFEST} nor {FUSED}", fix="point at a finished KT LoRA output")
    config = _load_json(src / CONFIG, "PEFT adapter config")
    if config.get("use_rslora") or config.get("use_dora"):
        raise ConvertError("adapter uses rsLoRA/DoRA; sglang-kt applies plain alpha/r scaling",
                           fix="train with use_rslora: false and use_dora: false")

    expert_items, rank, n_layers, n_experts, layers_key = _fused_slices(src / FUSED)
    r_cfg = config.get("r")
    alpha = config.get("lora_alpha")
    kt_lora = manifest.get("lora") or {}
    if r_cfg is not None and int(r_cfg) != rank:
        raise ConvertError(f"PEFT rank r={r_cfg} differs from the expert LoRA rank {rank}",
                           fix="sglang-kt serves one rank per adapter; train with one lora_rank")
    if kt_lora.get("rank") is not None and int(kt_lora["rank"]) != rank:
        raise ConvertError(f"manifest rank {kt_lora['rank']} differs from the fused tensors' rank {rank}",
                           fix="the output mixes runs; convert a single checkpoint")
    if alpha is None:
        alpha = kt_lora.get("alpha")
    if alpha is None:
        raise ConvertError("no lora_alpha in adapter_config.json or the KT manifest",
                           fix="the output is incomplete; re-save the adapter")
    if kt_lora.get("alpha") is not None and float(kt_lora["alpha"]) != float(alpha):
        raise ConvertError(f"expert LoRA alpha {kt_lora['alpha']} differs from PEFT's lora_alpha {alpha}",
                           fix="sglang-kt applies one alpha/r to the whole adapter; retrain with matching values")

    nonexpert: list[tuple[str, st.Slice]] = []
    targets: set[str] = {"gate_proj", "up_proj", "down_proj"}
    if (src / ADAPTER).exists():
        index, _ = st.read_header(src / ADAPTER)
        for name, info in index.items():
            key = name[len(_PEFT_PREFIX):] if name.startswith(_PEFT_PREFIX) else name
            if ".mlp.experts." in key:
                raise ConvertError(f"{ADAPTER} already holds routed-expert tensor {name!r}",
                                   fix="this output was converted before or mixes formats; convert the raw KT output")
            mod = _module_of(key)
            if not _TENSOR_NAME.match(key):
                raise ConvertError(f"{ADAPTER}: tensor name {name!r} holds characters no module path has",
                                   fix="the file is damaged or not a PEFT LoRA; re-save the checkpoint")
            if mod is not None and not _MODULE_NAME.match(mod):
                raise ConvertError(f"{ADAPTER}: tensor {name!r} names no module (an empty or odd module name)",
                                   fix="the file is damaged or not a PEFT LoRA; re-save the checkpoint")
            if mod is None:
                raise ConvertError(f"{ADAPTER}: tensor {name!r} is not a LoRA A/B weight (modules_to_save?)",
                                   fix="sglang-kt serves LoRA A/B only; train without additional_target/modules_to_save")
            if len(info.shape) == 2 and info.shape[0 if ".lora_A." in key else 1] != rank:
                raise ConvertError(f"{name} has rank {info.shape} but the experts use r={rank}",
                                   fix="sglang-kt serves one rank per adapter")
            servable(src / ADAPTER, info)
            targets.add(mod)
            nonexpert.append((key, st.whole(src / ADAPTER, info)))
        # The decoder stack's name, as PEFT saw it (model.layers for Qwen/DeepSeek/GLM).
        m = next((re.match(r"^(.*)\.\d+\.", k) for k, _ in nonexpert if re.match(r"^(.*)\.\d+\.", k)), None)
        if m:
            layers_key = m.group(1)
    items = nonexpert + [(k.replace("{layers}", layers_key), s) for k, s in expert_items]

    base = base_model or config.get("base_model_name_or_path") or (manifest.get("base") or {}).get("model_name_or_path")
    base = redact(base) if isinstance(base, str) else base  # a URL's password never enters the published adapter
    out_config = dict(config)
    out_config.update(peft_type="LORA", r=rank, lora_alpha=alpha, target_modules=_ordered(targets),
                      base_model_name_or_path=base, bias=config.get("bias", "none"),
                      task_type=config.get("task_type", "CAUSAL_LM"))

    dst.parent.mkdir(parents=True, exist_ok=True)
    stage = staging_dir(dst.parent, f".{dst.name}.")
    try:
        written = st.write(stage / ADAPTER, items, metadata={"format": "pt", "converted_by": "ktdeploy"})
        write_file(stage, CONFIG, json.dumps(out_config, indent=2, sort_keys=True) + "\n")
        summary = ConvertSummary(
            input_dir=str(src), output_dir=str(dst), rank=rank, lora_alpha=float(alpha), num_layers=n_layers,
            num_experts=n_experts, expert_tensors=len(expert_items), nonexpert_tensors=len(nonexpert),
            target_modules=out_config["target_modules"], base_model_name_or_path=base, bytes_written=written,
            checks=checks)
        prov = {"summary": summary.__dict__, "inputs": {n: sha256_file(src / n) for n in (FUSED, CONFIG, ADAPTER)
                                                        if (src / n).exists()}}
        write_file(stage, PROVENANCE, json.dumps(prov, indent=2) + "\n")
        if dst.exists():
            dst.rmdir()  # empty (checked above)
        os.replace(stage, dst)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return summary


# --- full fine-tunes -------------------------------------------------------------------------------------------
# A KT full fine-tune (finetuning_type: full) trains the routed experts inside kt-kernel on the CPU. HF's
# save_pretrained writes the model WITHOUT them (kt-kernel's state_dict hook drops the expert placeholders);
# kt-kernel publishes them next to it as a "KT Full" checkpoint: ``kt_full_experts.index.json`` (format
# ``kt_full_experts``, version 1, dtype BF16, a generation id, per layer the shard file, its size and the shapes)
# and one ``kt_full_experts-<generation>-layer-<L:05d>.safetensors`` per MoE layer holding ``gate_proj``/``up_proj``
# ``[E, moe_inter, hidden]`` and ``down_proj`` ``[E, hidden, moe_inter]``. sglang-kt (like any HF loader) needs
# the experts as ``model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight``: this regroups them by byte ranges.

FULL_INDEX = "kt_full_experts.index.json"
FULL_EXPERTS_OUT = "model-kt-experts.safetensors"
_FULL_PROJ = ("gate_proj", "up_proj", "down_proj")


@dataclass
class FullConvertSummary:
    input_dir: str
    output_dir: str
    num_layers: int
    num_experts: int
    expert_tensors: int
    linked_files: list[str]
    bytes_written: int
    kind: str = "full"


def find_full_dir(path: Path) -> Path | None:
    """``path`` or its newest ``checkpoint-*`` holding a KT Full checkpoint index, else None."""
    if (path / FULL_INDEX).is_file():
        return path
    ckpts = _checkpoints(path, FULL_INDEX)
    return ckpts[-1] if ckpts else None


def convert_full(input_dir: str | os.PathLike, output_dir: str | os.PathLike) -> FullConvertSummary:
    """A servable model directory from a KT full fine-tune: the HF files (hard-linked, else copied) plus the
    experts regrouped per expert, with one ``model.safetensors.index.json`` over both."""
    top = Path(input_dir).resolve()
    src = find_full_dir(top)
    if src is None:
        raise ConvertError(f"{top} holds no KT full fine-tune output ({FULL_INDEX} not found here or in checkpoint-*)",
                           fix="point at the output_dir of a finished KT run with finetuning_type: full")
    dst = Path(output_dir).resolve()
    problem = destination_problem(str(src), str(dst)) or destination_problem(str(top), str(dst))
    if problem:
        raise ConvertError(problem, fix=f"choose a sibling directory, e.g. {JobLayout(str(top)).adapter_dir}")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise ConvertError(f"{dst} already exists and is not empty; ktdeploy never overwrites a converted model",
                           fix="remove it yourself or choose another -o directory")
    index = _load_json(src / FULL_INDEX, "KT Full checkpoint index")
    if index.get("format") != "kt_full_experts" or index.get("version") != 1 or index.get("dtype") != "BF16":
        raise ConvertError(f"{src / FULL_INDEX}: format {index.get('format')!r} v{index.get('version')!r} "
                           f"{index.get('dtype')!r} is not kt_full_experts v1 BF16",
                           fix="this kt-kernel version writes a layout ktdeploy does not know; report it")
    layers = index.get("layers")
    if not isinstance(layers, dict) or not layers:
        raise ConvertError(f"{src / FULL_INDEX} lists no layers", fix="the save was interrupted; use an earlier checkpoint")
    if not _plain_file(src / "config.json"):
        raise ConvertError(f"{src} has no config.json next to {FULL_INDEX}", fix="copy the whole output directory")
    items: list[tuple[str, st.Slice]] = []
    experts: set[int] = set()
    for key in sorted(layers, key=lambda k: int(k) if str(k).isdigit() else -1):
        ent = layers[key]
        if not str(key).isdigit() or not isinstance(ent, dict):
            raise ConvertError(f"{src / FULL_INDEX}: bad layer entry {key!r}", fix="the index is damaged")
        fname = ent.get("file")
        if not isinstance(fname, str) or os.path.basename(fname) != fname or not _plain_file(src / fname):
            raise ConvertError(f"layer {key}: shard {fname!r} is missing from {src}",
                               fix="copy the whole output directory, not single files")
        shard = src / fname
        if ent.get("size_bytes") != shard.stat().st_size:
            raise ConvertError(f"{shard}: size {shard.stat().st_size} differs from the index's {ent.get('size_bytes')}",
                               fix="the file changed after training (partial copy?); copy it again")
        tensors, meta = st.read_header(shard)
        if set(tensors) != set(_FULL_PROJ) or meta.get("generation") != index.get("generation"):
            raise ConvertError(f"{shard}: tensors {sorted(tensors)} / generation {meta.get('generation')!r} do not "
                               "match the index", fix="the output mixes saves; convert one checkpoint")
        for proj in _FULL_PROJ:
            info = tensors[proj]
            if info.dtype != "BF16" or len(info.shape) != 3 or list(info.shape) != (ent.get("shapes") or {}).get(proj):
                raise ConvertError(f"{shard}: {proj} is {info.dtype} {list(info.shape)}, the index says "
                                   f"{(ent.get('shapes') or {}).get(proj)}", fix="the file is damaged")
            experts.add(info.shape[0])
            _count_slices(items, info.shape[0], shard)
            for e, s in enumerate(st.split_first_axis(shard, info)):
                items.append((f"model.layers.{int(key)}.mlp.experts.{e}.{proj}.weight", s))
    if len(experts) != 1:
        raise ConvertError(f"{src}: layers disagree on the expert count {sorted(experts)}", fix="the output is damaged")

    dst.parent.mkdir(parents=True, exist_ok=True)
    stage = staging_dir(dst.parent, f".{dst.name}.")
    try:
        linked: list[str] = []
        weight_map: dict[str, str] = {}
        hf_index = src / "model.safetensors.index.json"
        if hf_index.is_file():
            weight_map.update(_load_json(hf_index, "HF weight index").get("weight_map") or {})
        for p in sorted(src.iterdir()):
            if p.is_symlink():
                raise ConvertError(f"{p} is a symbolic link; ktdeploy never publishes a file through a link",
                                   fix="replace the link with the file itself (or remove it) and convert again")
            if not p.is_file() or p.name.startswith("kt_full_experts") or p.name == "model.safetensors.index.json":
                continue
            if p.name.startswith(("optimizer", "scheduler", "rng_state", "training_args", "trainer_state")):
                continue
            try:  # into the staging folder this process just created (mkdtemp): nothing there to follow
                os.link(p, stage / p.name)
            except OSError:
                shutil.copy2(p, stage / p.name)
            linked.append(p.name)
            if p.suffix == ".safetensors" and not hf_index.is_file():
                for name in st.read_header(p)[0]:
                    weight_map[name] = p.name
        clash = [k for k, _ in items if k in weight_map]
        if clash:
            raise ConvertError(f"the HF weights already hold expert tensors (e.g. {clash[0]})",
                               fix="this output was converted before or is not a KT full fine-tune")
        written = st.write(stage / FULL_EXPERTS_OUT, items, metadata={"format": "pt", "converted_by": "ktdeploy"})
        weight_map.update({k: FULL_EXPERTS_OUT for k, _ in items})
        write_file(stage, "model.safetensors.index.json", json.dumps(
            {"metadata": {"converted_by": "ktdeploy"}, "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
        summary = FullConvertSummary(input_dir=str(src), output_dir=str(dst), num_layers=len(layers),
                                     num_experts=experts.pop(), expert_tensors=len(items), linked_files=linked,
                                     bytes_written=written)
        write_file(stage, PROVENANCE, json.dumps({"summary": summary.__dict__,
                                                  "inputs": {FULL_INDEX: sha256_file(src / FULL_INDEX)}}, indent=2) + "\n")
        if dst.exists():
            dst.rmdir()
        os.replace(stage, dst)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return summary

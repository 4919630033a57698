"""``ktdeploy prepare-weights MODEL_DIR --format int8|amxint4 -o OUT``: the routed experts converted for kt-kernel.

kt-kernel 0.7.2 trains INT8 and AMXINT4 LoRA only from pre-converted ``.kt`` trees (``kt_weight_path``); its wheel
ships no converter (``kt quant`` looks for a script the wheel lacks). This command makes the tree with kt-kernel's
own quantize-and-save path (``kt_kernel_ext.moe.AMXInt8_MOE`` / ``AMXInt4_MOE`` with ``MOEConfig.save = True``, as
``kt_kernel/utils/amx.py`` does for online quantization) and reads the experts with kt-kernel's own checkpoint
loaders (BF16, or block-FP8 dequantized by kt-kernel's ``_dequant_fp8_experts``). ktdeploy writes no quantizer.

- Streams one MoE layer at a time: peak memory is one layer's BF16 experts plus kt-kernel's buffers.
- Builds in a sibling staging folder it creates itself (mode 0700, exclusive); each finished layer is hashed and
  journaled; an interrupted run resumes, re-hashing the kept layers; one rename publishes the whole tree.
- Verifies before publishing: every file's size against the contract (``core/kt_weights``), kt-kernel's own
  ``validate_persistent_int8_weights`` (INT8), and one layer's forward pass through the converted weights against
  the BF16 experts, within the format's stated tolerance.
- ``--ephemeral RUN_ID`` (INT8): kt-kernel's ephemeral lifecycle (``kt_kernel/sft/ephemeral.py``): a staging root
  ``/dev/shm/kt-int8-RUN_ID.staging`` with its lease, published as ``/dev/shm/kt-int8-RUN_ID`` by kt-kernel's
  ``publish_ephemeral_int8_weights``; the training consumes (deletes) each layer once loaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ktdeploy import __version__
from ktdeploy.core import kt_weights as kw
from ktdeploy.core.errors import KtdeployError, OverwriteRefused, UsageError
from ktdeploy.core.hashing import sha256_file
from ktdeploy.core.safeio import MAX_JSON, load_json, parse_json, write_file
from ktdeploy.core.sizing.model_config import load_model_config, native_format
from ktdeploy.core.ticks import tick

JOURNAL = ".ktdeploy-weights-journal.json"
WORK = ".work"
STAGING_SUFFIX = ".ktdeploy-weights"
EPHEMERAL_BASE = Path("/dev/shm")
# Relative L2 error of one layer's MoE output through the converted weights vs the BF16 experts (random tokens and
# routing). kt-kernel 0.7.2 on random Gaussian experts (docs/weight-formats.md): INT8 2.1-2.2 %, AMXINT4 23-24 %
# (4 bits, one scale per output row), AMXBF16 itself 0.4 %. The tolerance is about twice that.
TOLERANCE = {"int8": 0.05, "amxint4": 0.45}
_MOE_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.mlp\.experts\.")


class PrepareError(KtdeployError):
    """The model, the output folder or kt-kernel refused the conversion (exit 2: nothing was published)."""

    exit_code = 2


@dataclass
class PrepareSummary:
    output_dir: str
    format: str
    source: str
    source_format: str
    layers: int
    experts: int
    pools: int
    files: int
    bytes: int
    kept_layers: int
    seconds: float
    verify: dict[str, Any] = field(default_factory=dict)
    ephemeral: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Source:
    model_dir: Path
    native: str                 # bf16 | fp8
    shape: kw.Shape
    layers: tuple[int, ...]     # MoE layer indices, from the checkpoint's tensor names
    fingerprint: str            # sha256 of config.json + the safetensors index (or shard names and sizes)
    experts_per_tok: int


# ---------------------------------------------------------------- source model

def moe_layers(keys: Iterable[str]) -> tuple[int, ...]:
    return tuple(sorted({int(m.group(1)) for k in keys if (m := _MOE_KEY.search(k))}))


def _checkpoint_keys(model_dir: Path) -> tuple[list[str], str]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        data = load_json(index, MAX_JSON, "model.safetensors.index.json")
        wm = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wm, dict) or not wm:
            raise PrepareError(f"{index}: no weight_map", fix="use the model's own safetensors index")
        return list(wm), sha256_file(index)
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise PrepareError(f"{model_dir} holds no safetensors weights", key="MODEL",
                           fix="point MODEL at a Hugging Face model folder (config.json + *.safetensors)")
    from safetensors import safe_open

    keys: list[str] = []
    for s in shards:
        with safe_open(str(s), framework="pt") as f:
            keys.extend(f.keys())
    listing = "\n".join(f"{s.name}:{s.stat().st_size}" for s in shards)
    import hashlib

    return keys, hashlib.sha256(listing.encode()).hexdigest()


def read_source(model_dir: Path, pools: int, fmt: kw.WeightFormat) -> Source:
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise PrepareError(f"{model_dir} has no config.json", key="MODEL",
                           fix="point MODEL at a Hugging Face model folder")
    arch = load_model_config(cfg_path)
    cfg = load_json(cfg_path, MAX_JSON, "config.json")
    native = native_format(cfg)
    if native not in ("bf16", "fp8"):
        raise PrepareError(f"{model_dir} stores its experts as {native}; prepare-weights converts BF16 or block-FP8 "
                           "checkpoints", key="MODEL", fix="use the model's BF16 or FP8 release")
    shape = kw.Shape(arch.hidden_size, arch.moe_intermediate_size, arch.num_experts, pools)
    why = kw.shape_error(fmt, shape)
    if why:
        raise PrepareError(f"{fmt.upper()} cannot hold this model's experts with {pools} thread pool(s): {why}",
                           key="--threadpools", fix="use the kt_threadpool_count the recipe trains with, one that "
                                                    "divides the expert width")
    keys, index_digest = _checkpoint_keys(model_dir)
    layers = moe_layers(keys)
    if not layers:
        raise PrepareError(f"{model_dir}: no routed-expert tensors (layers.N.mlp.experts.*) in the checkpoint",
                           key="MODEL", fix="prepare-weights converts MoE checkpoints with per-expert tensors")
    import hashlib

    fp = hashlib.sha256((sha256_file(cfg_path) + index_digest).encode()).hexdigest()
    return Source(model_dir, native, shape, layers, fp, arch.experts_per_tok)


# ---------------------------------------------------------------- the output folder and its staging

def _owned_private_dir(p: Path, what: str) -> None:
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PrepareError(f"{p} ({what}) is a link or not a folder; ktdeploy builds only in a folder it made",
                           fix=f"remove {p}")
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PrepareError(f"{p} ({what}) belongs to uid {st.st_uid} or is open to others (mode "
                           f"{stat.S_IMODE(st.st_mode):o}): another user may have made it, so nothing in it is "
                           "trusted", fix=f"remove {p} (or choose another -o)")


def _destination(out: Path, model_dir: Path) -> Path:
    out = Path(os.path.abspath(out))
    real_model = Path(os.path.realpath(model_dir))
    real_out = Path(os.path.realpath(out))
    for a, b in ((real_out, real_model), (real_model, real_out)):
        if a == b or b in a.parents:
            raise PrepareError(f"-o {out} and the model folder {model_dir} overlap; ktdeploy never writes into a "
                               "model folder", key="-o", fix="choose an output folder beside the model, e.g. "
                                                              f"{real_model}-{'INT8'}")
    if out.is_symlink():
        raise PrepareError(f"-o {out} is a link; ktdeploy never writes through a link", key="-o",
                           fix="name the real folder")
    if not out.parent.is_dir():
        raise PrepareError(f"-o {out}: its parent folder does not exist", key="-o", fix=f"mkdir -p {out.parent}")
    return out


def _staging(out: Path, plan_id: str) -> tuple[Path, dict[str, Any]]:
    """The staging folder beside ``out``: made now (exclusive, 0700), or an interrupted run's that this uid owns,
    private, with a journal of the same plan. Returns it and its journal."""
    stage = out.parent / f".{out.name}{STAGING_SUFFIX}"
    try:
        os.mkdir(stage, 0o700)
        return stage, {"plan": plan_id, "layers": {}}
    except FileExistsError:
        pass
    _owned_private_dir(stage, "an interrupted prepare-weights' staging folder")
    jp = stage / JOURNAL
    if not jp.exists():
        return stage, {"plan": plan_id, "layers": {}}
    jst = os.lstat(jp)
    if not stat.S_ISREG(jst.st_mode) or jst.st_uid != os.getuid() or jst.st_mode & 0o022:
        raise PrepareError(f"{jp} is not a regular file of this user", fix=f"remove {stage}")
    journal = parse_json(jp.read_bytes())
    if not isinstance(journal, dict) or journal.get("plan") != plan_id or not isinstance(journal.get("layers"), dict):
        raise PrepareError(f"{stage} holds an interrupted conversion of another model, format or pool count",
                           fix=f"remove {stage} to start over, or rerun that conversion")
    return stage, journal


def _save_journal(stage: Path, journal: dict[str, Any]) -> None:
    write_file(stage, JOURNAL, json.dumps(journal, sort_keys=True), mode=0o600, overwrite=True)


def _kept(stage: Path, journal: dict[str, Any], fmt: kw.WeightFormat, shape: kw.Shape) -> dict[int, dict[str, Any]]:
    """The journaled layers whose files are all there with the recorded size and SHA-256 (the others are redone)."""
    kept: dict[int, dict[str, Any]] = {}
    for key, entry in journal["layers"].items():
        layer = int(key)
        layer_dir = stage / f"_layer_{layer}"
        expected = kw.layer_files(fmt, shape, layer)
        files = {f["path"]: f for f in entry.get("files", [])} if isinstance(entry, dict) else {}
        ok = set(files) == set(expected) and all(_same_file(stage / p, f, expected[p]) for p, f in files.items())
        if ok and _listed_only(layer_dir, stage, set(files)):
            kept[layer] = entry
        elif layer_dir.exists():
            shutil.rmtree(layer_dir)
    return kept


def _same_file(path: Path, rec: dict[str, Any], size: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISREG(st.st_mode) and st.st_size == size == rec.get("size_bytes")
            and sha256_file(path) == rec.get("sha256"))


def _listed_only(layer_dir: Path, root: Path, listed: set[str]) -> bool:
    found = {str(p.relative_to(root)) for p in layer_dir.rglob("*") if not p.is_dir() or p.is_symlink()}
    return found == listed


# ---------------------------------------------------------------- kt-kernel

class _Kernel:
    """kt-kernel's CPU pool and MoE classes; imported here so the controller (no torch) can import this module."""

    def __init__(self, fmt: kw.WeightFormat, shape: kw.Shape, threads: int) -> None:
        try:
            import kt_kernel  # noqa: F401  (selects and loads the CPU build)
            import kt_kernel_ext
            from kt_kernel_ext.moe import MOEConfig
        except ImportError as err:
            raise UsageError(f"prepare-weights needs kt-kernel: {err}",
                             fix="run it inside the image: docker run ktsft:<build> prepare-weights ...") from None
        import kt_kernel_ext.moe as moe_mod

        moe_class = getattr(moe_mod, kw.QUANTIZER[fmt], None)
        if moe_class is None:
            from kt_kernel import _cpu_detect

            build = getattr(_cpu_detect, "detect_cpu_variant", lambda: "?")()
            raise PrepareError(f"this kt-kernel build ({build}) has no {kw.QUANTIZER[fmt]}: it cannot quantize "
                               f"{fmt.upper()} weights", fix="run prepare-weights on a CPU with AVX512F+AVX512BW "
                                                          "(AMX for AMXINT4), in the ktsft image of that build")
        self.moe_class: Any = moe_class
        self.MOEConfig = MOEConfig
        pools = shape.pools
        cfg = kt_kernel_ext.WorkerPoolConfig()
        cfg.subpool_count = pools
        # The layout depends on the pool count only; on a host with fewer NUMA nodes the pools share node 0.
        nodes = _numa_nodes()
        cfg.subpool_numa_map = [i if i < nodes else 0 for i in range(pools)]
        base, extra = divmod(max(threads, pools), pools)
        cfg.subpool_thread_count = [base + (1 if i < extra else 0) for i in range(pools)]
        self.cpu_infer = kt_kernel_ext.CPUInfer(cfg)

    def config(self, shape: kw.Shape, experts_per_tok: int, layer: int, mask: Any) -> Any:
        c = self.MOEConfig(shape.expert_num, experts_per_tok, shape.hidden_size, shape.intermediate_size,
                           mask.data_ptr())
        c.layer_idx = layer
        c.pool = self.cpu_infer.backend_
        c.max_len = 64
        return c

    def run(self, task: Any) -> None:
        self.cpu_infer.submit(task)
        self.cpu_infer.sync()


def _numa_nodes() -> int:
    try:
        return max(1, len([p for p in os.listdir("/sys/devices/system/node") if re.fullmatch(r"node\d+", p)]))
    except OSError:
        return 1


def _load_layer(source: Source, layer: int, loader: Any) -> tuple[Any, Any, Any]:
    """The layer's experts as stacked contiguous BF16 [E, I, H], [E, I, H], [E, H, I] (kt-kernel's loaders)."""
    import torch

    w = loader.load_experts(f"model.layers.{layer}")
    if source.native == "fp8":
        from kt_kernel.sft.weights import _dequant_fp8_experts

        gate, up, down = (_dequant_fp8_experts(w[p], w[f"{p}_scale"], (128, 128)) for p in kw.PROJECTIONS)
    else:
        gate, up, down = (torch.stack(w[p]) for p in kw.PROJECTIONS)
    return gate.to(torch.bfloat16).contiguous(), up.to(torch.bfloat16).contiguous(), down.to(torch.bfloat16).contiguous()


def _loader(source: Source) -> Any:
    from kt_kernel.utils.loader import BF16SafeTensorLoader, FP8SafeTensorLoader

    cls = FP8SafeTensorLoader if source.native == "fp8" else BF16SafeTensorLoader
    return cls(str(source.model_dir))


def _quantize_layer(kernel: _Kernel, source: Source, layer: int, tensors: tuple[Any, Any, Any], into: Path) -> None:
    import torch

    gate, up, down = tensors
    mask = torch.zeros(source.shape.expert_num, dtype=torch.bool)
    c = kernel.config(source.shape, source.experts_per_tok, layer, mask)
    c.save, c.load = True, False
    c.gate_proj, c.up_proj, c.down_proj = gate.data_ptr(), up.data_ptr(), down.data_ptr()
    c.path = str(into)
    moe = kernel.moe_class(c)
    order = torch.arange(source.shape.expert_num, dtype=torch.int64)
    kernel.run(moe.load_weights_task(order.data_ptr()))
    del moe


def _collect(root: Path, layer: int, fmt: kw.WeightFormat, shape: kw.Shape) -> dict[str, tuple[int, str]]:
    """The files kt-kernel wrote for ``layer`` under ``root``, checked against the contract, with their SHA-256."""
    expected = kw.layer_files(fmt, shape, layer)
    found = {str(p.relative_to(root)): p for p in (root / f"_layer_{layer}").rglob("*") if p.is_file()}
    if set(found) != set(expected):
        extra, missing = sorted(set(found) - set(expected))[:3], sorted(set(expected) - set(found))[:3]
        raise PrepareError(f"kt-kernel wrote an unexpected file set for layer {layer} (extra {extra}, missing "
                           f"{missing}): this kt-kernel build's layout differs from the one ktdeploy knows",
                           fix="report it with `ktdeploy doctor --image` output; use kt-kernel 0.7.2's image")
    out: dict[str, tuple[int, str]] = {}
    for rel, p in found.items():
        size = p.stat().st_size
        if size != expected[rel]:
            raise PrepareError(f"{rel}: kt-kernel wrote {size} bytes, the {fmt.upper()} contract says "
                               f"{expected[rel]}", fix="report it; use kt-kernel 0.7.2's image")
        out[rel] = (size, sha256_file(p))
    return out


# ---------------------------------------------------------------- verification

def cpu_runs_sft_kernels(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """kt-kernel's INT8_SFT and AMXINT4_SFT kernels are AMX code: on a CPU without AMX they die of SIGILL (the
    conversion itself, kt-kernel's online quantizer, runs on AVX512 too)."""
    from ktdeploy.core import variants as V
    from ktdeploy.core.facts.cpu import parse_cpuinfo

    try:
        flags = parse_cpuinfo(cpuinfo.read_text())["flags"]
    except OSError:
        return False
    return V.has_flags(flags, *V.AMX_FLAGS)


def forward_check_or_why_not(source: Source, fmt: kw.WeightFormat, root: Path, layer: int,
                             tensors: tuple[Any, Any, Any], threads: int) -> dict[str, Any]:
    if not cpu_runs_sft_kernels():
        return {"ok": None, "layer": layer, "skipped": "this CPU has no AMX (amx_tile, amx_int8, amx_bf16): kt-kernel's "
                f"{fmt.upper()} SFT kernel cannot run here; the tree is checked by kt-kernel's loader layout and "
                "hashes only. Run prepare-weights on the training host (it needs AMX to train) for the forward check"}
    return verify_forward(source, fmt, root, layer, tensors, threads)


def verify_forward(source: Source, fmt: kw.WeightFormat, root: Path, layer: int, tensors: tuple[Any, Any, Any],
                   threads: int, tokens: int = 32, seed: int = 0) -> dict[str, Any]:
    """One layer's MoE output through the converted tree against the BF16 experts, computed by the loader and
    kernel training uses: kt-kernel's SFT wrapper (``KTMoEWrapper(mode="sft", method=INT8_SFT|AMXINT4_SFT)``,
    weights read from ``root`` by its C++ ``.kt`` loader, zero LoRA)."""
    import torch
    from kt_kernel.experts import KTMoEWrapper

    gate, up, down = tensors
    shape = source.shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, shape.hidden_size, generator=gen).to(torch.bfloat16)
    k = min(source.experts_per_tok, shape.expert_num)
    ids = torch.stack([torch.randperm(shape.expert_num, generator=gen)[:k] for _ in range(tokens)]).to(torch.int64)
    weights = torch.softmax(torch.randn(tokens, k, generator=gen), dim=-1).to(torch.float32)
    ref = torch.zeros(tokens, shape.hidden_size, dtype=torch.float32)
    for t in range(tokens):
        xt = x[t].float()
        for j in range(k):
            e = int(ids[t, j])
            h = torch.nn.functional.silu(gate[e].float() @ xt) * (up[e].float() @ xt)
            ref[t] += weights[t, j] * (down[e].float() @ h)
    rank = 8
    wrapper = KTMoEWrapper(layer_idx=layer, num_experts=shape.expert_num, num_experts_per_tok=k,
                           hidden_size=shape.hidden_size, moe_intermediate_size=shape.intermediate_size,
                           gpu_experts_mask=None, num_gpu_experts=0, cpuinfer_threads=max(threads, shape.pools),
                           threadpool_count=shape.pools, weight_path=str(root), chunked_prefill_size=tokens,
                           method=kw.SFT_METHOD[fmt], mode="sft", lora_rank=rank, lora_alpha=float(2 * rank),
                           lora_dropout=0.0, max_cache_depth=2, group_size=128, zero_point=True)
    wrapper.share_backward_bb = True
    order = torch.arange(shape.expert_num, dtype=torch.int64)
    wrapper.load_weights(order)
    e, h, i = shape.expert_num, shape.hidden_size, shape.intermediate_size
    zeros = [torch.zeros(*dims, dtype=torch.bfloat16) for dims in
             ((e, rank, h), (e, i, rank), (e, rank, h), (e, i, rank), (e, rank, i), (e, h, rank))]
    grads = [torch.zeros_like(z) for z in zeros]
    wrapper.init_lora_weights(*zeros, *grads)
    out = wrapper.forward(x, ids, weights, save_for_backward=False)
    rel = float((out.float() - ref).norm() / ref.norm())
    return {"layer": layer, "tokens": tokens, "loader": f"kt_kernel KTMoEWrapper sft {kw.SFT_METHOD[fmt]}",
            "rel_l2": round(rel, 5), "tolerance": TOLERANCE[fmt], "ok": rel <= TOLERANCE[fmt]}


def validate_int8(root: Path, source: Source) -> dict[str, Any]:
    """kt-kernel's own validator of a persistent INT8 tree, hashes included."""
    from kt_kernel.sft.weight_manifest import validate_persistent_int8_weights

    s = source.shape
    try:
        v = validate_persistent_int8_weights(str(root), layer_indices=source.layers, numa_count=s.pools,
                                             expert_num=s.expert_num, hidden_size=s.hidden_size,
                                             intermediate_size=s.intermediate_size, verify_hashes=True)
    except (ValueError, OSError) as err:
        raise PrepareError(f"kt-kernel refuses the converted tree: {err}", fix=f"remove {root} and run again") from None
    return {"validator": "kt_kernel.sft.weight_manifest.validate_persistent_int8_weights", "files": v.file_count,
            "bytes": v.size_bytes, "schema": v.schema_version, "layout": v.layout}


# ---------------------------------------------------------------- the command

Say = Callable[[str], None]


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """kt-kernel's C++ and its Python loaders print progress on stdout, up to their destructors at exit
    ("CPUInfer[...]: Goodbye"); stdout is for the command's own output (``--json``: a summary alone). Within the
    block both file descriptor 1 and ``sys.stdout`` go to stderr; afterwards ``sys.stdout`` writes to the real
    stdout through a new descriptor, while fd 1 stays on stderr for the destructors."""
    import ctypes
    import io

    sys.stdout.flush()
    ctypes.CDLL(None).fflush(None)
    saved = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout = io.TextIOWrapper(io.FileIO(saved, "w"), write_through=True)   # our own stdout, dup()ed


def prepare(model_dir: str | os.PathLike, out: str | os.PathLike | None, fmt: str, *, pools: int, threads: int,
            verify: bool = True, ephemeral_run_id: str | None = None, say: Say = print) -> PrepareSummary:
    if fmt not in kw.FORMATS:
        raise UsageError(f"unknown format {fmt!r}", key="--format", fix=f"use one of: {', '.join(kw.FORMATS)}")
    wfmt: kw.WeightFormat = "int8" if fmt == "int8" else "amxint4"
    model = Path(os.path.abspath(model_dir))
    if not model.is_dir():
        raise PrepareError(f"{model} is not a folder", key="MODEL", fix="point MODEL at a Hugging Face model folder")
    source = read_source(model, pools, wfmt)
    if ephemeral_run_id is not None:
        if wfmt != "int8":
            raise UsageError("--ephemeral is kt-kernel's INT8 lifecycle only", key="--ephemeral",
                             fix="drop --ephemeral, or use --format int8")
        return _prepare_ephemeral(source, ephemeral_run_id, threads, verify, say)
    if out is None:
        raise UsageError("no output folder", key="-o", fix="prepare-weights MODEL_DIR --format ... -o NEW_FOLDER")
    dst = _destination(Path(out), model)
    plan_id = _plan_id(source, wfmt)
    if dst.exists():
        return _already(dst, source, wfmt, plan_id)
    t0 = time.monotonic()
    stage, journal = _staging(dst, plan_id)
    kept = _kept(stage, journal, wfmt, source.shape)
    journal["layers"] = {str(k): v for k, v in kept.items()}
    _save_journal(stage, journal)
    if kept:
        say(f"resuming: {len(kept)} of {len(source.layers)} layers kept from an interrupted run (re-hashed)")
    _check_disk(stage, wfmt, source, len(source.layers) - len(kept), say)
    kernel = _Kernel(wfmt, source.shape, threads)
    loader = _loader(source)
    work = stage / WORK
    if work.exists():
        shutil.rmtree(work)
    os.mkdir(work, 0o700)
    check: dict[str, Any] = {}
    todo = [layer for layer in source.layers if layer not in kept]
    per_layer = kw.layer_bytes(wfmt, source.shape)
    tick(say, 0, len(todo), "loading the first layer")
    for n, layer in enumerate(todo, 1):
        tl = time.monotonic()
        tensors = _load_layer(source, layer, loader)
        _quantize_layer(kernel, source, layer, tensors, work)
        files = _collect(work, layer, wfmt, source.shape)
        os.rename(work / f"_layer_{layer}", stage / f"_layer_{layer}")
        entry = kw.layer_entry(layer, source.shape.pools, files)
        journal["layers"][str(layer)] = entry
        _save_journal(stage, journal)
        if verify and not check:   # the first converted layer: its forward through kt-kernel vs BF16
            check = forward_check_or_why_not(source, wfmt, stage, layer, tensors, threads)
            if check.get("ok") is False:
                raise PrepareError(f"layer {layer}'s forward through the {fmt.upper()} weights is off by "
                                   f"{check['rel_l2']:.3f} (relative L2) against BF16, over the stated "
                                   f"{check['tolerance']}", fix="report it with the model's config.json; nothing "
                                                                "was published")
        del tensors
        eta = (time.monotonic() - tl) * (len(todo) - n)
        say(f"layer {layer}: {n}/{len(todo)} converted ({per_layer / 2**20:.1f} MiB), ~{eta:.0f} s left")
        tick(say, n, len(todo), f"layer {layer}")
    loader.close_all_handles()
    shutil.rmtree(work)
    summary = _publish(stage, dst, source, wfmt, journal, plan_id, verify)
    summary.kept_layers, summary.seconds = len(kept), round(time.monotonic() - t0, 2)
    if check:
        summary.verify["forward"] = check
    return summary


def _check_disk(where: Path, fmt: kw.WeightFormat, source: Source, layers: int, say: Say) -> None:
    """Say what the tree needs before the first byte; refuse when the filesystem cannot hold it."""
    need = kw.tree_bytes(fmt, source.shape, layers)
    free = shutil.disk_usage(where).free
    say(f"{fmt.upper()} tree: {len(source.layers)} layers x {source.shape.expert_num} experts, "
        f"{kw.tree_bytes(fmt, source.shape, len(source.layers)) / 2**30:.2f} GiB in all; {need / 2**30:.2f} GiB "
        f"still to write, {free / 2**30:.1f} GiB free at {where.parent}")
    if need > free:
        raise PrepareError(f"{where.parent} has {free / 2**30:.1f} GiB free; the {fmt.upper()} experts need "
                           f"{need / 2**30:.1f} GiB more", key="-o", fix="free space there or choose -o on a larger "
                                                                        "filesystem")


def _plan_id(source: Source, fmt: kw.WeightFormat) -> str:
    s = source.shape
    return f"{fmt}:{source.fingerprint}:{s.hidden_size}x{s.intermediate_size}x{s.expert_num}/{s.pools}"


def _provenance(source: Source, plan_id: str) -> dict[str, Any]:
    return {"version": __version__, "plan": plan_id, "source": str(source.model_dir),
            "source_fingerprint": source.fingerprint, "source_format": source.native,
            "quantizer": "kt-kernel (kt_kernel_ext.moe save mode)"}


def _publish(stage: Path, dst: Path, source: Source, fmt: kw.WeightFormat, journal: dict[str, Any], plan_id: str,
             verify: bool) -> PrepareSummary:
    layers = [journal["layers"][str(layer)] for layer in source.layers]
    man = kw.manifest(fmt, source.shape, layers, _provenance(source, plan_id))
    os.unlink(stage / JOURNAL)
    write_file(stage, kw.manifest_name(fmt), json.dumps(man, indent=1, sort_keys=True), mode=0o644)
    result: dict[str, Any] = {}
    if fmt == "int8" and verify:
        result["kt_kernel"] = validate_int8(stage, source)
    for d, _, _ in os.walk(stage):
        os.chmod(d, 0o755)
    os.rename(stage, dst)
    files = sum(len(layer["files"]) for layer in layers)
    return PrepareSummary(str(dst), fmt, str(source.model_dir), source.native, len(layers), source.shape.expert_num,
                          source.shape.pools, files, int(man["bytes"]), 0, 0.0, result)


def _already(dst: Path, source: Source, fmt: kw.WeightFormat, plan_id: str) -> PrepareSummary:
    """An existing -o: this same conversion done before (verified again, kept: exit 0), else refused: nothing is
    ever overwritten."""
    name = kw.manifest_name(fmt)
    mp = dst / name
    man = load_json(mp, MAX_JSON, name) if mp.is_file() and not mp.is_symlink() else None
    prod = man.get("producer") if isinstance(man, dict) else None
    if not isinstance(man, dict) or not isinstance(prod, dict) or prod.get("plan") != plan_id:
        raise OverwriteRefused(f"{dst} exists and is not this conversion's output; ktdeploy never overwrites an "
                               "output", key="-o", fix="choose a new -o folder (or remove the old one)")
    layers = man.get("layers")
    if not isinstance(layers, list):
        raise PrepareError(f"{mp}: no layer list", fix=f"remove {dst} and run again")
    result = validate_int8(dst, source) if fmt == "int8" else verify_tree(dst, fmt, source, layers)
    return PrepareSummary(str(dst), fmt, str(source.model_dir), source.native, len(layers),
                          source.shape.expert_num, source.shape.pools, sum(len(layer["files"]) for layer in layers),
                          int(man["bytes"]), len(layers), 0.0, {"already_prepared": True, **result})


def verify_tree(root: Path, fmt: kw.WeightFormat, source: Source, layers: list[dict[str, Any]]) -> dict[str, Any]:
    """A published tree against its manifest: the layer set, every file's name, size and SHA-256, nothing else
    (kt-kernel has no validator for AMXINT4; INT8 uses kt-kernel's own)."""
    listed = {int(layer.get("index", -1)): layer for layer in layers if isinstance(layer, dict)}
    if sorted(listed) != list(source.layers):
        raise PrepareError(f"{root}: its layers {sorted(listed)} are not the model's MoE layers",
                           fix=f"remove {root} and run again")
    files = 0
    for index, layer in listed.items():
        entry = {f["path"]: f for f in layer.get("files", []) if isinstance(f, dict)}
        expected = kw.layer_files(fmt, source.shape, index)
        if set(entry) != set(expected) or not _listed_only(root / f"_layer_{index}", root, set(entry)) or \
                not all(_same_file(root / rel, rec, expected[rel]) for rel, rec in entry.items()):
            raise PrepareError(f"{root}: layer {index} differs from its manifest (a file missing, changed or added)",
                               fix=f"remove {root} and run again")
        files += len(entry)
    return {"validator": "ktdeploy (size and SHA-256 of every file)", "files": files}


# ---------------------------------------------------------------- ephemeral INT8

def ephemeral_root(run_id: str) -> Path:
    return EPHEMERAL_BASE / f"kt-int8-{run_id}"


def _prepare_ephemeral(source: Source, run_id: str, threads: int, verify: bool, say: Say) -> PrepareSummary:
    from kt_kernel.sft import ephemeral as eph

    try:
        eph.validate_ephemeral_run_id(run_id)
    except ValueError as err:
        raise UsageError(str(err), key="--ephemeral", fix="use 6-128 letters, digits, '.', '_' or '-'") from None
    ready = ephemeral_root(run_id)
    if ready.exists() or ready.is_symlink():
        raise PrepareError(f"{ready} already exists: an earlier run's ephemeral weights (kt-kernel consumes them "
                           "as it loads; a finished or crashed run leaves nothing)", key="--ephemeral",
                           fix=f"use a new run id, or remove {ready} if no training is using it")
    stage = EPHEMERAL_BASE / f"kt-int8-{run_id}.staging"
    t0 = time.monotonic()
    if stage.exists() or stage.is_symlink():
        _owned_private_dir(stage, "an earlier ephemeral staging root")
        if not eph.reclaim_stale_ephemeral_int8_staging(str(stage), run_id=run_id):
            raise PrepareError(f"{stage} is being written by a live process", fix="wait for it, or use a new run id")
        say(f"reclaimed a stale staging root {stage} (its producer is gone)")
    _check_disk(EPHEMERAL_BASE, "int8", source, len(source.layers), say)
    os.mkdir(stage, 0o700)
    eph.write_ephemeral_staging_lease(str(stage), run_id=run_id, producer_pid=os.getpid())
    kernel = _Kernel("int8", source.shape, threads)
    loader = _loader(source)
    check: dict[str, Any] = {}
    try:
        for n, layer in enumerate(source.layers, 1):
            tensors = _load_layer(source, layer, loader)
            _quantize_layer(kernel, source, layer, tensors, stage)
            _collect(stage, layer, "int8", source.shape)
            if verify and not check:
                check = forward_check_or_why_not(source, "int8", stage, layer, tensors, threads)
                if check.get("ok") is False:
                    raise PrepareError(f"layer {layer}'s INT8 forward is off by {check['rel_l2']:.3f} against BF16",
                                       fix="report it with the model's config.json")
            say(f"layer {layer}: {n}/{len(source.layers)} staged in {stage}")
            tick(say, n, len(source.layers), f"layer {layer}")
        s = source.shape
        root = eph.publish_ephemeral_int8_weights(str(stage), run_id=run_id, layer_indices=source.layers,
                                                  numa_count=s.pools, expert_num=s.expert_num,
                                                  hidden_size=s.hidden_size, intermediate_size=s.intermediate_size)
    except BaseException:
        if stage.exists():
            eph.cleanup_ephemeral_int8_staging(str(stage), run_id=run_id)
        raise
    finally:
        loader.close_all_handles()
    man = load_json(Path(root) / eph.MANIFEST_NAME, MAX_JSON, eph.MANIFEST_NAME)
    files = sum(len(layer["files"]) for layer in man["layers"])
    return PrepareSummary(str(root), "int8", str(source.model_dir), source.native, len(source.layers),
                          source.shape.expert_num, source.shape.pools, files, int(man["bytes"]), 0,
                          round(time.monotonic() - t0, 2), {"forward": check} if check else {}, ephemeral=True)


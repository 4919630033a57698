"""Converted expert weights (INT8, AMXINT4): the on-disk contract kt-kernel 0.7.2 loads, as pure data.

A converted tree is ``ROOT/_layer_<L>/_numa_<N>/<PREFIX>_<proj>_<expert>_<bytes>Byte_<kind>_.kt``: per MoE layer, per
thread pool (kt-kernel calls them NUMA partitions: the routed intermediate size is split evenly across
``kt_threadpool_count`` pools), per expert, the quantized weight and its scales of gate, up and down. kt-kernel's C++
loaders read that tree directly (``config.load = True``, ``kt_kernel/sft/amx.py``); the file sizes below are what its
own quantizer writes (``AMXInt8_MOE`` / ``AMXInt4_MOE`` in save mode) and, for INT8, what its validator demands
(``kt_kernel.sft.weight_manifest.validate_persistent_int8_weights``: quant = hidden x intermediate/pools bytes, scale =
4 bytes per output row).

Persistent INT8 also needs ``kt-weight-manifest.json`` (schema 2: every file with its size and SHA-256, layout
``kt-int8-n32-k64-vnni-v1``, hardware-neutral backend ``INT8``); kt-kernel validates it at every start and refuses
any extra entry in the root. AMXINT4 has no manifest in kt-kernel (its loader globs the ``.kt`` files): ktdeploy
records the same facts in ``ktdeploy-weights.json`` so a resume, ``doctor`` and ``up`` can verify the tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

WeightFormat = Literal["int8", "amxint4"]
FORMATS: tuple[WeightFormat, ...] = ("int8", "amxint4")

INT8_MANIFEST = "kt-weight-manifest.json"      # kt_kernel.sft.weight_manifest.MANIFEST_NAME
INT8_LAYOUT = "kt-int8-n32-k64-vnni-v1"         # kt_kernel.sft.backend.INT8_WEIGHT_LAYOUT
INT8_SCHEMA = 2
AMXINT4_MANIFEST = "ktdeploy-weights.json"
PRODUCER = "ktdeploy prepare-weights"
PROJECTIONS = ("gate", "up", "down")
KINDS = ("quant", "scale")
# The C++ quantizer's file-name prefix and the method names of each format (kt_kernel/utils/amx.py; SFT methods from
# kt_kernel/sft/wrapper.py's kt_backend_map).
PREFIX: dict[WeightFormat, str] = {"int8": "INT8", "amxint4": "INT4"}
QUANTIZER: dict[WeightFormat, str] = {"int8": "AMXInt8_MOE", "amxint4": "AMXInt4_MOE"}
SFT_METHOD: dict[WeightFormat, str] = {"int8": "INT8_SFT", "amxint4": "AMXINT4_SFT"}
# The recipe keys that select each format (kt-kernel 0.7.2 KTConfig): INT8 is kt_expert_weight_format int8 with
# kt_backend auto/INT8; AMXINT4 is kt_backend AMXINT4 (no kt_expert_weight_format).
# kt-kernel's ephemeral INT8 root: a direct child of /dev/shm named after the run (kt_kernel/sft/ephemeral.py _RUN_ID_RE).
EPHEMERAL_ROOT = re.compile(r"/dev/shm/kt-int8-([A-Za-z0-9][A-Za-z0-9._-]{5,127})")
_FILE_RE = re.compile(r"^(INT8|INT4)_(gate|up|down)_(\d+)_(\d+)Byte_(quant|scale)_\.kt$")


@dataclass(frozen=True)
class Shape:
    """What fixes a converted tree's layout: the routed experts' shape and the thread-pool split."""

    hidden_size: int
    intermediate_size: int       # the routed experts' (moe_intermediate_size)
    expert_num: int
    pools: int                   # kt_threadpool_count the training will use

    @property
    def slice(self) -> int:
        return self.intermediate_size // self.pools


# The tile steps kt-kernel's C++ buffers need (kt-kernel 0.7.2, amx build, measured in ktsft:amx by quantizing and
# loading 13 shapes: tests/integration/test_prepare_weights_image.py). Anything else fails when the layer is
# constructed ("BufferAImpl: max_m and k must be multiple of M_STEP and K_STEP", "n or k is not aligned to N_STEP or
# B_K_STEP"), which in training is after the whole model has loaded.
STEP: dict[WeightFormat, int] = {"int8": 64, "amxint4": 128}


def shape_error(fmt: WeightFormat, s: Shape) -> str | None:
    """Why kt-kernel cannot convert or load this shape, or None."""
    if min(s.hidden_size, s.intermediate_size, s.expert_num, s.pools) <= 0:
        return "hidden, intermediate, expert and pool counts must be positive"
    if s.intermediate_size % s.pools:
        return (f"the routed intermediate size {s.intermediate_size} is not divisible by kt_threadpool_count "
                f"{s.pools} (kt-kernel splits it evenly across the pools)")
    step = STEP[fmt]
    if s.hidden_size % step or s.slice % step:
        return (f"{fmt.upper()} tiles need hidden {s.hidden_size} and the per-pool intermediate slice {s.slice} "
                f"(moe_intermediate_size / {s.pools}) to be multiples of {step}")
    return None


def file_sizes(fmt: WeightFormat, s: Shape) -> dict[tuple[str, str], int]:
    """Bytes of one expert's file per (projection, kind) in one pool."""
    inter, hidden = s.slice, s.hidden_size
    per_weight = hidden * inter if fmt == "int8" else hidden * inter // 2
    return {("gate", "quant"): per_weight, ("up", "quant"): per_weight, ("down", "quant"): per_weight,
            ("gate", "scale"): inter * 4, ("up", "scale"): inter * 4, ("down", "scale"): hidden * 4}


def file_name(fmt: WeightFormat, proj: str, expert: int, size: int, kind: str) -> str:
    return f"{PREFIX[fmt]}_{proj}_{expert}_{size}Byte_{kind}_.kt"


def layer_files(fmt: WeightFormat, s: Shape, layer: int) -> dict[str, int]:
    """Every file of one layer: root-relative path -> size in bytes."""
    sizes = file_sizes(fmt, s)
    out: dict[str, int] = {}
    for pool in range(s.pools):
        for proj in PROJECTIONS:
            for expert in range(s.expert_num):
                for kind in KINDS:
                    size = sizes[(proj, kind)]
                    out[f"_layer_{layer}/_numa_{pool}/{file_name(fmt, proj, expert, size, kind)}"] = size
    return out


def layer_bytes(fmt: WeightFormat, s: Shape) -> int:
    return s.pools * s.expert_num * sum(file_sizes(fmt, s).values())


def tree_bytes(fmt: WeightFormat, s: Shape, layers: int) -> int:
    return layers * layer_bytes(fmt, s)


def parse_file_name(name: str) -> tuple[str, str, int, int, str] | None:
    """(prefix, projection, expert, encoded bytes, kind) of a ``.kt`` file name, or None."""
    m = _FILE_RE.fullmatch(name)
    return (m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), m.group(5)) if m else None


def layer_entry(layer: int, pools: int, files: dict[str, tuple[int, str]]) -> dict[str, Any]:
    """One layer of the manifest from its files (path -> (size, sha256)), in the validator's shape."""
    listed = [{"path": p, "size_bytes": size, "sha256": digest} for p, (size, digest) in sorted(files.items())]
    return {"index": layer, "numa_count": pools, "state": "ready", "files": listed,
            "bytes": sum(size for size, _ in files.values())}


def manifest(fmt: WeightFormat, s: Shape, layers: list[dict[str, Any]], provenance: dict[str, Any]) -> dict[str, Any]:
    """The tree's manifest: for INT8 the schema-2 ``kt-weight-manifest.json`` kt-kernel validates (its extra
    ``producer`` key is ignored by the validator); for AMXINT4 ktdeploy's own record in the same shape."""
    body: dict[str, Any] = {
        "state": "ready", "threadpool_count": s.pools, "expert_num": s.expert_num,
        "hidden_size": s.hidden_size, "intermediate_size": s.intermediate_size,
        "layers": sorted(layers, key=lambda layer: int(layer["index"])),
        "bytes": sum(int(layer["bytes"]) for layer in layers),
        "producer": {"name": PRODUCER, **provenance},
    }
    if fmt == "int8":
        return {"schema_version": INT8_SCHEMA, "expert_weight_format": "int8", "layout": INT8_LAYOUT,
                "backend": "INT8", **body}
    return {"schema_version": 1, "expert_weight_format": "amxint4", "backend": "AMXINT4", **body}


def manifest_name(fmt: WeightFormat) -> str:
    return INT8_MANIFEST if fmt == "int8" else AMXINT4_MANIFEST


@dataclass(frozen=True)
class Needed:
    """What a recipe needs converted before it can train: ``prepare-weights`` arguments, read from the recipe."""

    model: str
    format: WeightFormat
    pools: int
    output: str | None            # the persistent tree (kt_weight_path); None for an ephemeral run
    ephemeral_run_id: str | None  # kt_weight_path's run id under /dev/shm


def needed_by(weight_setup: str, kt_config: dict[str, Any], model: object, kt_weight_path: object) -> Needed | None:
    """The conversion a recipe's INT8/AMXINT4 setup asks for (``Recipe.weight_setup()``: int8 or int4), or None
    (BF16/FP8 read the checkpoint itself). Pools: ``kt_threadpool_count`` when ``kt_tp_enabled`` (kt-kernel's
    effective pool count), else 1."""
    if weight_setup not in ("int8", "int4") or not isinstance(model, str) or not isinstance(kt_weight_path, str):
        return None
    fmt: WeightFormat = "int8" if weight_setup == "int8" else "amxint4"
    count = kt_config.get("kt_threadpool_count")
    tp_on = kt_config.get("kt_tp_enabled") is True    # KTConfig's default: off (one pool)
    pools = count if tp_on and isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1
    eph = EPHEMERAL_ROOT.fullmatch(kt_weight_path) if str(kt_config.get("kt_weight_lifecycle", "")).lower() \
        == "ephemeral" else None
    if eph:
        return Needed(model, fmt, pools, None, eph.group(1))
    return Needed(model, fmt, pools, kt_weight_path, None)

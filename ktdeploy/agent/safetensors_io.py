"""Streaming access to the safetensors file format without torch.

The format (https://huggingface.co/docs/safetensors) is an 8-byte little-endian header length, a
JSON header ``{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}`` and one
contiguous row-major data block. Adapter conversion only regroups tensors and slices along the
first axis, which are byte-range copies, so the controller and the agent can convert an adapter of
any size in constant memory and without torch (the ``safetensors`` package itself needs a
framework for bf16).
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO

from ktdeploy.core.safeio import parse_json, writing

ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
            "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
_CHUNK = 16 << 20
_MAX_HEADER = 16 << 20   # a 5,000-tensor shard's header is < 1 MB; 100 MB of '[[],[],...' took 2.6 GB to parse
MAX_SPLIT = 1 << 16   # experts per layer; no MoE has more. A zero-size tensor [2e6, 0, 64] must not explode.
MAX_DIM = 1 << 40


class SafetensorsFormatError(ValueError):
    """The file is not a well-formed safetensors file."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offset of the first byte
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Slice:
    """``nbytes`` bytes at ``offset`` of ``path``, to be stored as a tensor of ``dtype``/``shape``."""

    path: str
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Tensor index and ``__metadata__`` of a safetensors file; validates offsets against the file size."""
    path = Path(path)
    try:  # never through a link: a training output holds none, and one could publish a file from elsewhere
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW)
    except OSError as err:
        raise SafetensorsFormatError(f"{path}: cannot be read ({err.strerror}; a symbolic link?)") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise SafetensorsFormatError(f"{path}: not a regular file")
    size = st.st_size
    with os.fdopen(fd, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SafetensorsFormatError(f"{path}: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER or 8 + n > size:
            raise SafetensorsFormatError(f"{path}: header length {n} is impossible for a {size}-byte file")
        try:
            header = parse_json(f.read(n))
        except ValueError as err:
            raise SafetensorsFormatError(f"{path}: header is not JSON ({str(err)[:120]})") from None
    if not isinstance(header, dict):
        raise SafetensorsFormatError(f"{path}: header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise SafetensorsFormatError(f"{path}: __metadata__ is not a JSON object")
    base = 8 + n
    out: dict[str, TensorInfo] = {}
    for name, spec in header.items():
        try:
            dtype, shape, (b, e) = spec["dtype"], tuple(int(d) for d in spec["shape"]), spec["data_offsets"]
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in (b, e)):
                raise TypeError("offsets")
            if any(d < 0 or d > MAX_DIM for d in shape) or len(shape) > 8:
                raise ValueError("shape")
        except (KeyError, TypeError, ValueError, OverflowError):
            raise SafetensorsFormatError(f"{path}: tensor {name!r} has a malformed entry") from None
        if not isinstance(dtype, str) or dtype not in ITEMSIZE:
            raise SafetensorsFormatError(f"{path}: tensor {name!r} has unknown dtype {dtype!r}")
        if e - b != math.prod(shape) * ITEMSIZE[dtype] or b < 0 or e < b or base + e > size:
            raise SafetensorsFormatError(f"{path}: tensor {name!r} offsets do not match its shape or the file")
        out[name] = TensorInfo(name, dtype, shape, base + b, base + e)
    return out, {str(k): str(v) for k, v in meta.items()}


FLOAT_EXPONENT = {"BF16": (2, 0x7F80), "F16": (2, 0x7C00), "F32": (4, 0x7F800000)}
SAMPLE_VALUES = 1 << 16   # values read per tensor by ``non_finite``: spread over the whole tensor


def non_finite(path: str | os.PathLike[str], info: TensorInfo, sample: int = SAMPLE_VALUES) -> int:
    """How many of up to ``sample`` values of a BF16/F16/F32 tensor, read in 16 runs spread over it, are NaN or
    Inf (exponent bits all ones). A trained LoRA holds none; a diverged run often holds nothing else. Constant
    memory and time, whatever the tensor's size."""
    size, mask = FLOAT_EXPONENT[info.dtype]
    count = info.nbytes // size
    if count == 0:
        return 0
    runs = min(16, count)
    per_run = max(1, min(count // runs, sample // runs))
    bad = 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        for i in range(runs):
            start = (count - per_run) * i // max(1, runs - 1) if runs > 1 else 0
            f.seek(info.begin + start * size)
            buf = f.read(per_run * size)
            values = memoryview(buf[: len(buf) - len(buf) % size]).cast("H" if size == 2 else "I")
            bad += sum(1 for v in values if v & mask == mask)
    return bad


def whole(path: str | os.PathLike[str], info: TensorInfo) -> Slice:
    return Slice(str(path), info.begin, info.nbytes, info.dtype, info.shape)


def split_first_axis(path: str | os.PathLike[str], info: TensorInfo) -> list[Slice]:
    """One slice per index of the first axis (``[E, a, b]`` -> E tensors ``[a, b]``)."""
    if not info.shape:
        raise SafetensorsFormatError(f"{info.name}: cannot split a scalar")
    count, rest = info.shape[0], info.shape[1:]
    if count > MAX_SPLIT:
        raise SafetensorsFormatError(f"{info.name}: {count} experts along the first axis (at most {MAX_SPLIT})")
    step = math.prod(rest) * ITEMSIZE[info.dtype]
    return [Slice(str(path), info.begin + i * step, step, info.dtype, rest) for i in range(count)]


def _copy(dst: IO[bytes], src: BinaryIO, offset: int, nbytes: int) -> None:
    src.seek(offset)
    left = nbytes
    while left:
        buf = src.read(min(left, _CHUNK))
        if not buf:
            raise SafetensorsFormatError("source file ended early")
        dst.write(buf)
        left -= len(buf)


def write(path: str | os.PathLike[str], tensors: Iterable[tuple[str, Slice]], metadata: dict[str, str] | None = None) -> int:
    """Write ``(name, slice)`` pairs (in the given order) as one safetensors file; returns bytes written."""
    items = list(tensors)
    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise SafetensorsFormatError(f"duplicate tensor names: {dup[:5]}")
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    pos = 0
    for name, s in items:
        header[name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [pos, pos + s.nbytes]}
        pos += s.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    handles: dict[str, BinaryIO] = {}
    try:
        with writing(Path(path).parent, Path(path).name) as out:  # new, atomic, never through a link
            out.write(struct.pack("<Q", len(blob)))
            out.write(blob)
            for _, s in items:
                src = handles.get(s.path)
                if src is None:
                    src = handles[s.path] = open(s.path, "rb")
                _copy(out, src, s.offset, s.nbytes)
    finally:
        for h in handles.values():
            h.close()
    return 8 + len(blob) + pos

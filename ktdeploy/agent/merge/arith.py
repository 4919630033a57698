"""The merge arithmetic, in numpy alone (no torch): bit-exact dtype conversions and one rounding per weight.

For a base weight ``W`` (``[out, in]``, dtype BF16, F16 or F32, or FP8 E4M3 with 128x128 block scales) and its
LoRA pair ``A`` (``[r, in]``) and ``B`` (``[out, r]``) with scale ``s = float32(lora_alpha / r)``:

    W32   = float32(W)                          exact for BF16/F16/F32; FP8: float32(q) * scale_inv (one f32 product)
    D     = B32 @ A32                           float32 dot products of length r (BLAS; summation order unspecified)
    W'32  = W32 + s * D                         float32: s * D rounded, then the sum rounded (as PyTorch computes
                                                ``W.float() + s * (B.float() @ A.float())``)
    W'    = round_to_nearest_even(W'32 -> base dtype)    one rounding (FP8 bases are written as BF16)

PyTorch's ``Tensor.to(torch.bfloat16)`` rounds the same way (c10::round_to_nearest_even: add 0x7FFF plus the
lowest kept bit, keep the top 16 bits); a NaN keeps its sign and payload here where PyTorch writes 0x7FC0.
PEFT's ``merge_and_unload`` differs: it casts the delta to the weight dtype before adding (two roundings).

Each function works on a block of whole rows with small per-thread scratch buffers, so the temporaries stay in
cache and the GIL is released inside every numpy call (worker threads run in parallel).
"""

from __future__ import annotations

import itertools
import math
import threading
from dataclasses import dataclass

import numpy as np

SUB_ELEMS = 1 << 16          # elements per inner step: three f32 scratch rows of this size (768 KiB) stay in L2
FP8_DTYPE = "F8_E4M3"
NP_DTYPE = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F8_E4M3": np.uint8}


def _fp8_e4m3fn_table() -> np.ndarray:
    """float32 value of every FP8 E4M3FN bit pattern (OCP FP8: bias 7, no infinities, S.1111.111 is NaN)."""
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = (codes & 0x7).astype(np.float64)
    value = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1.0 + man / 8.0) * np.exp2(exp.astype(np.float64) - 7.0))
    value = sign * value
    value[(exp == 0xF) & ((codes & 0x7) == 0x7)] = np.nan
    return value.astype(np.float32)


FP8_TABLE = _fp8_e4m3fn_table()


def bf16_to_f32(bits: np.ndarray, out: np.ndarray) -> np.ndarray:
    """BF16 bit patterns (uint16) -> float32, exact: the 16 bits become the top half of the float."""
    np.left_shift(bits, 16, out=out.view(np.uint32), dtype=np.uint32)
    return out


def f32_to_bf16(x: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bit patterns, round to nearest, ties to even (PyTorch's rule for every non-NaN value)."""
    u = x.view(np.uint32)
    t = scratch.view(np.uint32)
    np.right_shift(u, 16, out=t)
    np.bitwise_and(t, 1, out=t)
    np.add(t, u, out=t)          # wraps only for a negative NaN with low bits >= 0x8000: never made from BF16/FP8
    np.add(t, 0x7FFF, out=t)
    np.right_shift(t, 16, out=out, casting="unsafe")
    return out


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 array -> BF16 bit patterns (allocating; for small arrays and tests)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return f32_to_bf16(x, np.empty(x.shape, np.uint16), np.empty(x.shape, np.uint32))


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """BF16 bit patterns -> float32 (allocating)."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    return bf16_to_f32(bits, np.empty(bits.shape, np.float32))


def to_f32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """A whole tensor's values as float32 (allocating; LoRA matrices are small)."""
    if dtype == "BF16":
        return bf16_values(raw.view(np.uint16))
    if dtype in ("F16", "F32"):
        return raw.view(NP_DTYPE[dtype]).astype(np.float32)
    raise ValueError(f"LoRA tensors are BF16, F16 or F32, not {dtype}")


@dataclass(frozen=True)
class Lora:
    """The LoRA term of rows ``[row0, row1)`` of a 2-D view of a base tensor: ``delta = s * (b @ a)``."""

    row0: int
    row1: int
    b: np.ndarray        # [row1 - row0, r] float32
    a: np.ndarray        # [r, cols] float32


@dataclass(frozen=True)
class BlockScale:
    """FP8 block scales of a 2-D weight: ``scale_inv[i // bh, j // bw]`` multiplies element (i, j)."""

    scale_inv: np.ndarray   # [ceil(rows / bh), ceil(cols / bw)] float32
    bh: int
    bw: int


_tls = threading.local()


def _scratch(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    have = getattr(_tls, "buf", None)
    if have is None or have[0].size < n:
        have = _tls.buf = (np.empty(n, np.float32), np.empty(n, np.float32), np.empty(n, np.uint32))
    return have


def power_of_two(x: float) -> bool:
    """``x`` is 2^k: multiplying by it is exact, so ``s * (B @ A)`` equals ``(s * B) @ A`` bit for bit (each
    product and partial sum is scaled exactly; only a result in the subnormal range could differ)."""
    return x > 0 and math.isfinite(x) and math.frexp(x)[0] == 0.5


def merge_rows(raw: bytes | bytearray | memoryview, out_buf: bytearray | memoryview | None, dtype: str, out_dtype: str, rows: int, cols: int,
               row0: int, loras: list[Lora], scale: float, fp8: BlockScale | None = None) -> np.ndarray:
    """Rows ``[row0, row0 + rows)`` of a 2-D base tensor (``raw``: their bytes) with every LoRA term that covers
    them added; returns the rows in ``out_dtype`` (uint16 bit patterns for BF16), written into ``out_buf`` when
    given (a buffer of at least the result's size), else into a new array. ``scale`` 1.0 skips the multiply (the
    caller folded a power-of-two scale into B).

    Rows no LoRA covers are converted only when the dtype changes (FP8 -> BF16), else copied bit for bit."""
    src = np.frombuffer(raw, dtype=NP_DTYPE[dtype], count=rows * cols).reshape(rows, cols)
    if out_buf is None:
        out = np.empty((rows, cols), dtype=NP_DTYPE[out_dtype])
    else:
        out = np.frombuffer(out_buf, dtype=NP_DTYPE[out_dtype], count=rows * cols).reshape(rows, cols)
    s32 = np.float32(scale)
    step = max(1, SUB_ELEMS // max(cols, 1))
    w32_all, d_all, t_all = _scratch(step * cols)
    for seg_start, seg_end in _runs(rows, row0, loras, fp8):
        lora = next((lo for lo in loras if lo.row0 <= row0 + seg_start < lo.row1), None)
        if lora is None and fp8 is None and dtype == out_dtype:
            out[seg_start:seg_end] = src[seg_start:seg_end]
            continue
        for s in range(seg_start, seg_end, step):
            e = min(s + step, seg_end)
            k = e - s
            w32 = w32_all[:k * cols].reshape(k, cols)
            _load_f32(src[s:e], dtype, w32, fp8, row0 + s)
            res = w32
            if lora is not None:
                d = d_all[:k * cols].reshape(k, cols)
                b0 = row0 + s - lora.row0
                np.matmul(lora.b[b0:b0 + k], lora.a, out=d)
                if s32 != 1:
                    np.multiply(d, s32, out=d)
                np.add(w32, d, out=d)
                res = d
            _store(res, out_dtype, out[s:e], t_all[:k * cols].reshape(k, cols))
    return out


def _runs(rows: int, row0: int, loras: list[Lora], fp8: BlockScale | None) -> list[tuple[int, int]]:
    """The block's rows cut where a LoRA term starts or ends and, for FP8, where a scale row starts: within one
    run every row has the same LoRA term (or none) and the same row of block scales."""
    cuts = {0, rows}
    for lo in loras:
        cuts.update(min(rows, max(0, x - row0)) for x in (lo.row0, lo.row1))
    if fp8 is not None:
        first = -(-row0 // fp8.bh) * fp8.bh
        cuts.update(range(first - row0, rows, fp8.bh))
    ordered = sorted(cuts)
    return [(a, b) for a, b in itertools.pairwise(ordered) if a < b]


def _load_f32(src: np.ndarray, dtype: str, out: np.ndarray, fp8: BlockScale | None, first_row: int) -> None:
    if dtype == "BF16":
        bf16_to_f32(src, out)
    elif dtype == FP8_DTYPE:
        assert fp8 is not None
        np.take(FP8_TABLE, src, out=out)
        srow = fp8.scale_inv[first_row // fp8.bh]
        expanded = np.repeat(srow, fp8.bw)[:out.shape[1]]
        np.multiply(out, expanded, out=out)
    else:
        np.copyto(out, src)       # F16 -> F32 and F32 -> F32 are exact


def _store(x: np.ndarray, out_dtype: str, out: np.ndarray, scratch: np.ndarray) -> None:
    if out_dtype == "BF16":
        f32_to_bf16(x, out, scratch)
    else:
        np.copyto(out, x, casting="same_kind")   # F16: numpy rounds to nearest even; F32: a copy


def nonfinite_count(raw: bytes | bytearray | memoryview, dtype: str, count: int) -> int:
    """How many values of a BF16/F16/F32 buffer are NaN or infinite (a streaming check of the adapter)."""
    if dtype == "BF16":
        bits = np.frombuffer(raw, dtype=np.uint16, count=count)
        return int(np.count_nonzero((bits & 0x7F80) == 0x7F80))   # exponent all ones: Inf or NaN
    if dtype in ("F16", "F32"):
        return int(count - np.count_nonzero(np.isfinite(np.frombuffer(raw, dtype=NP_DTYPE[dtype], count=count))))
    raise ValueError(dtype)

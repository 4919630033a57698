"""The merge arithmetic (ktdeploy.agent.merge.arith) against oracles written another way: exact rationals
(fractions.Fraction) for rounding, the OCP FP8 E4M3FN definition by hand, and block splits."""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest

from ktdeploy.agent.merge import arith


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _bf16_value(b: int) -> Fraction | float:
    x = _f32(b << 16)
    return x if not math.isfinite(x) else Fraction(x)


def oracle_bf16(x: float) -> int:
    """Round a float32 value to BF16 bits by exact comparison with its two neighbours, ties to even."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    if not math.isfinite(x):
        return bits >> 16
    lo = bits >> 16                       # truncation: same sign, magnitude <= |x|
    hi = lo + 1                           # next BF16 away from zero (may be infinity)
    fx, flo = Fraction(x), Fraction(_f32(lo << 16))
    hi_val = _f32(hi << 16)
    # past the largest finite BF16 the next value is infinity, which IEEE rounding treats as 2^128 (even)
    fhi = Fraction(hi_val) if math.isfinite(hi_val) else Fraction(2) ** 128 * (1 if x > 0 else -1)
    dlo, dhi = abs(fx - flo), abs(fhi - fx)
    if dlo < dhi:
        return lo
    if dhi < dlo:
        return hi
    return lo if lo % 2 == 0 else hi


def test_every_bf16_pattern_survives_the_round_trip():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    back = arith.bf16_round(arith.bf16_values(bits))
    finite = (bits & 0x7F80) != 0x7F80
    assert np.array_equal(back[finite], bits[finite])
    nan = ((bits & 0x7F80) == 0x7F80) & ((bits & 0x7F) != 0)
    assert np.all(np.isnan(arith.bf16_values(back[nan])))            # a NaN stays a NaN (sign, payload kept)
    inf = ((bits & 0x7FFF) == 0x7F80)
    assert np.array_equal(back[inf], bits[inf])


def test_f32_to_bf16_rounds_to_nearest_even_like_the_exact_oracle():
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 1 << 32, 4000, dtype=np.uint64).astype(np.uint32)
    raw = raw[(raw & 0x7F800000) != 0x7F800000]                      # finite values of every exponent
    ties = (rng.integers(0, 1 << 16, 300, dtype=np.uint32) << 16) | 0x8000   # exactly halfway
    ties = ties[(ties & 0x7F800000) != 0x7F800000]
    edges = np.array([0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001, 0x7F7E8000, 0x00000001, 0x80008000,
                      0x00018000, 0x00008000, 0x80000000, 0, 0x3F808000, 0x3F818000, 0x7F800000, 0xFF800000],
                     dtype=np.uint32)
    allbits = np.concatenate([raw, ties, edges])
    got = arith.bf16_round(allbits.view(np.float32))
    want = np.array([oracle_bf16(_f32(int(b))) for b in allbits], dtype=np.uint16)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(hex(int(allbits[i])), hex(int(got[i])), hex(int(want[i]))) for i in bad[:5]]


def test_fp8_e4m3fn_table_follows_the_ocp_definition():
    t = arith.FP8_TABLE
    known = {0x00: 0.0, 0x01: 2.0 ** -9, 0x07: 7 * 2.0 ** -9, 0x08: 2.0 ** -6, 0x38: 1.0, 0x3C: 1.5, 0x40: 2.0,
             0x7E: 448.0, 0x77: 240.0, 0x80: -0.0, 0xB8: -1.0, 0xFE: -448.0}
    for code, value in known.items():
        assert t[code] == value and math.copysign(1, t[code]) == math.copysign(1, value), hex(code)
    assert np.isnan(t[0x7F]) and np.isnan(t[0xFF]) and np.isfinite(t).sum() == 254
    pos = t[:0x7F]
    assert np.all(np.diff(pos) > 0)                                   # monotone over the positive codes
    assert np.array_equal(t[0x80:0xFF], -pos)


def _dyadic(rng, shape, scale_exp=-7):
    return rng.integers(-8, 9, shape).astype(np.float32) * np.float32(2.0 ** scale_exp)


def test_merge_rows_is_one_rounding_of_the_exact_sum():
    """Dyadic A, B and BF16 W: every f32 step is exact, so the one rounding to BF16 is all there is; the result
    must equal the exact rational sum rounded by the oracle, element for element (many exact ties included)."""
    rng = np.random.default_rng(3)
    rows, cols, r, scale = 24, 40, 8, 2.0
    w_bits = arith.bf16_round((rng.standard_normal((rows, cols)) * 0.02).astype(np.float32))
    a, b = _dyadic(rng, (r, cols)), _dyadic(rng, (rows, r), -9)
    out = arith.merge_rows(w_bits.tobytes(), None, "BF16", "BF16", rows, cols, 0, [arith.Lora(0, rows, b, a)], scale)
    w = arith.bf16_values(w_bits)
    exact = [[Fraction(float(w[i, j])) + Fraction(scale) * sum(Fraction(float(b[i, k])) * Fraction(float(a[k, j]))
                                                               for k in range(r)) for j in range(cols)]
             for i in range(rows)]
    want = np.array([[oracle_bf16(float(np.float32(float(x)))) for x in row] for row in exact], dtype=np.uint16)
    for row in exact:                       # the f32 sum is exact here, so float32(x) == x
        for x in row:
            assert Fraction(float(np.float32(float(x)))) == x
    assert np.array_equal(out, want)
    assert np.count_nonzero(out != w_bits) > rows * cols // 2       # the LoRA term did change the weights


def test_merge_rows_blocks_terms_and_uncovered_rows():
    """A fused-like tensor: two terms on rows [2, 6) and [6, 9), rows 0-1 and 9+ untouched (bit for bit); any
    split into blocks (row0) gives the same bytes as one call."""
    rng = np.random.default_rng(5)
    rows, cols, r = 12, 33, 4
    w_bits = arith.bf16_round((rng.standard_normal((rows, cols)) * 0.05).astype(np.float32))
    t1 = arith.Lora(2, 6, rng.standard_normal((4, r)).astype(np.float32), rng.standard_normal((r, cols)).astype(np.float32))
    t2 = arith.Lora(6, 9, rng.standard_normal((3, r)).astype(np.float32), rng.standard_normal((r, cols)).astype(np.float32))
    whole = arith.merge_rows(w_bits.tobytes(), None, "BF16", "BF16", rows, cols, 0, [t1, t2], 0.5)
    assert np.array_equal(whole[:2], w_bits[:2]) and np.array_equal(whole[9:], w_bits[9:])
    assert np.count_nonzero(whole[2:9] != w_bits[2:9]) > 0
    for cut in (1, 3, 5, 7, 10):
        top = arith.merge_rows(w_bits[:cut].tobytes(), None, "BF16", "BF16", cut, cols, 0, [t1, t2], 0.5)
        bottom = arith.merge_rows(w_bits[cut:].tobytes(), None, "BF16", "BF16", rows - cut, cols, cut, [t1, t2], 0.5)
        assert np.array_equal(np.concatenate([top, bottom]), whole), cut
    # the reference, computed in one piece with the documented float32 steps
    w = arith.bf16_values(w_bits)
    ref = w.copy()
    for t in (t1, t2):
        d = (t.b @ t.a) * np.float32(0.5)
        ref[t.row0:t.row1] = w[t.row0:t.row1] + d
    assert np.array_equal(whole, arith.bf16_round(ref))


@pytest.mark.parametrize("dtype", ["F16", "F32"])
def test_merge_rows_keeps_f16_and_f32(dtype):
    rng = np.random.default_rng(11)
    rows, cols, r = 9, 17, 3
    npdt = np.float16 if dtype == "F16" else np.float32
    w = (rng.standard_normal((rows, cols)) * 0.1).astype(npdt)
    a, b = rng.standard_normal((r, cols)).astype(np.float32), rng.standard_normal((rows, r)).astype(np.float32)
    out = arith.merge_rows(w.tobytes(), None, dtype, dtype, rows, cols, 0, [arith.Lora(0, rows, b, a)], 2.0)
    ref = (w.astype(np.float32) + (b @ a) * np.float32(2.0)).astype(npdt)
    assert out.dtype == npdt and np.array_equal(out, ref)


def test_fp8_block_scaled_rows_dequantize_exactly():
    """FP8 codes x their 4x4 block's scale (rows not aligned to the block, a partial last block), no LoRA on the
    first rows, a term on the rest: equal to the correctly rounded f32 product, then one rounding to BF16."""
    rng = np.random.default_rng(13)
    rows, cols, bh, bw, r = 10, 11, 4, 4, 2
    q = rng.integers(0, 126, (rows, cols), dtype=np.uint8) | (rng.integers(0, 2, (rows, cols), dtype=np.uint8) << 7)
    s = rng.uniform(0.5, 3.0, (3, 3)).astype(np.float32)
    a, b = rng.standard_normal((r, cols)).astype(np.float32), rng.standard_normal((rows - 5, r)).astype(np.float32)
    fp8 = arith.BlockScale(s, bh, bw)
    lo = arith.Lora(5, rows, b, a)
    first = arith.merge_rows(q[:3].tobytes(), None, "F8_E4M3", "BF16", 3, cols, 0, [lo], 1.0, fp8)
    rest = arith.merge_rows(q[3:].tobytes(), None, "F8_E4M3", "BF16", rows - 3, cols, 3, [lo], 1.0, fp8)
    got = np.concatenate([first, rest])
    deq = np.empty((rows, cols), np.float32)
    for i in range(rows):
        for j in range(cols):
            deq[i, j] = np.float32(np.float64(arith.FP8_TABLE[q[i, j]]) * np.float64(s[i // bh, j // bw]))
    ref = deq.copy()
    ref[5:] = deq[5:] + (b @ a) * np.float32(1.0)
    assert np.array_equal(got, arith.bf16_round(ref))


def test_nonfinite_count_finds_nan_and_inf_in_each_dtype():
    bf = np.array([0x3F80, 0x7F80, 0xFFC0, 0x0001], dtype=np.uint16)
    assert arith.nonfinite_count(bf.tobytes(), "BF16", 4) == 2
    f = np.array([1.0, np.inf, np.nan, -2.0], dtype=np.float32)
    assert arith.nonfinite_count(f.tobytes(), "F32", 4) == 2
    assert arith.nonfinite_count(f.astype(np.float16).tobytes(), "F16", 4) == 2

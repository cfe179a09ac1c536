"""bfloat16 on the host (gpud_client.dtypes): rounding float32, float16, float64 and integers to
bfloat16 against references written another way (float32 bits compared with the halfway point;
float64 by exact rational distances), bit for bit: NaN, infinities, subnormals, ties, overflow. No
daemon."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import gpud_client
from gpud_client.dtypes import (
    bfloat16,
    bits_to_float32,
    exact_bits,
    float32_to_bits,
    from_storage,
    host_dtype,
    is_bfloat16,
    name_of,
    to_bits,
)

EDGE_BITS = [
    0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # zeros, infinities
    0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FA50000, 0xFFFFFFFF,  # NaN of every kind
    0x00000001, 0x00007FFF, 0x00008000, 0x00008001, 0x00018000, 0x00010000, 0x007FFFFF, 0x00800000,  # subnormals
    0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0xBF808000, 0xBF818000,  # ties (to even) around 1.0
    0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0xFF7F8000, 0x7F7F0000,  # the largest finite bfloat16 and past it
]  # fmt: skip


def reference_bits(bits: np.ndarray) -> np.ndarray:
    """float32 bits to bfloat16 bits, nearest even, by comparing the dropped half with 0x8000."""
    hi, lo = bits >> 16, bits & 0xFFFF
    up = (lo > 0x8000) | ((lo == 0x8000) & ((hi & 1) == 1))
    rounded = hi + up.astype(np.uint32)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (hi & 0x8000) | 0x7FC0, rounded).astype(np.uint16)


def nearest_bits(value: float) -> int:
    """float64 `value` to bfloat16 bits by exact distances to the two candidates around it."""
    if math.isnan(value):
        raise ValueError("not for NaN")
    if math.isinf(value):
        return 0x7F80 if value > 0 else 0xFF80
    sign = 0x8000 if math.copysign(1.0, value) < 0 else 0
    magnitude = Fraction(abs(value))
    with np.errstate(over="ignore"):
        below = int(float32_to_bits(np.array([abs(value)], np.float32))[0]) & 0x7FFF
    candidates = [b for b in (below - 1, below, below + 1) if 0 <= b <= 0x7F80]

    def worth(b: int) -> Fraction:
        if b == 0x7F80:  # infinity: as if it were the next value past the largest finite one
            return Fraction(2) ** 128
        return Fraction(float(bits_to_float32(np.array([b], np.uint16))[0]))

    best = min(candidates, key=lambda b: (abs(worth(b) - magnitude), b & 1))
    return sign | best


def test_float32_to_bfloat16_on_the_bits_edges_and_every_pattern_of_the_low_half() -> None:
    rng = np.random.default_rng()
    bits = np.concatenate(
        [
            np.array(EDGE_BITS, np.uint32),
            rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32),  # every exponent, NaN included
            np.uint32(0x3F80_0000) + np.arange(0x10000, dtype=np.uint32),  # every low half, above 1.0
            np.uint32(0x0001_0000) + np.arange(0x10000, dtype=np.uint32),  # the same among subnormals
        ]
    )
    got = float32_to_bits(bits.view(np.float32))
    np.testing.assert_array_equal(got, reference_bits(bits))
    assert got[EDGE_BITS.index(0x3F808000)] == 0x3F80  # a tie rounds to even: down
    assert got[EDGE_BITS.index(0x3F818000)] == 0x3F82  # and up
    assert got[EDGE_BITS.index(0x7F7F8000)] == 0x7F80  # half an ulp past the largest finite: infinity
    assert got[EDGE_BITS.index(0x7F7F7FFF)] == 0x7F7F
    assert got[EDGE_BITS.index(0x7F800001)] == 0x7FC0  # a signalling NaN comes out quiet
    assert got[EDGE_BITS.index(0xFFFFFFFF)] == 0xFFC0  # the quiet NaN of its sign (ml_dtypes')


def test_bfloat16_to_float32_is_exact_for_every_pattern() -> None:
    every = np.arange(0x10000, dtype=np.uint32).astype(np.uint16)
    values = bits_to_float32(every)
    assert values.dtype == np.float32
    np.testing.assert_array_equal(values.view(np.uint32), every.astype(np.uint32) << 16)
    nan = ((every & 0x7F80) == 0x7F80) & ((every & 0x7F) != 0)
    np.testing.assert_array_equal(float32_to_bits(values)[~nan], every[~nan])
    np.testing.assert_array_equal(float32_to_bits(values)[nan], (every[nan] & 0x8000) | 0x7FC0)


def test_float64_rounds_once_not_through_float32() -> None:
    one_tie_and_more = 1.0 + 2.0**-8 + 2.0**-30  # float32 makes it the tie 1 + 2^-8, which goes to even: 1.0
    assert float32_to_bits(np.array([one_tie_and_more], np.float32))[0] == 0x3F80
    assert to_bits(np.array([one_tie_and_more]), "x")[0] == 0x3F81  # the nearest bfloat16 of the float64
    rng = np.random.default_rng()
    tricky = [one_tie_and_more, -one_tie_and_more, 1.0 + 2.0**-8, 1.0 + 2.0**-8 - 2.0**-40, 3.3961e38, 3.3962e38,
              3.4028234663852886e38, 3.5e38, 1e300, -1e300, 2.0**-134, 2.0**-134 + 2.0**-160, 2.0**-134 - 2.0**-170,
              1e-50, -0.0, 0.0, 2.0**-133 * 1.5, 5e-324]  # fmt: skip
    mantissas = rng.integers(0, 2**52, 4000, dtype=np.uint64)
    exponents = rng.integers(1023 - 140, 1023 + 130, 4000).astype(np.uint64)  # bfloat16's range and past it
    signs = rng.integers(0, 2, 4000).astype(np.uint64) << np.uint64(63)
    values = np.concatenate([np.array(tricky), (signs | (exponents << np.uint64(52)) | mantissas).view(np.float64)])
    got = to_bits(values, "x")
    want = np.array([nearest_bits(v) for v in values.tolist()], np.uint16)
    np.testing.assert_array_equal(got, want)
    special = to_bits(np.array([np.nan, -np.nan, np.inf, -np.inf]), "x")
    assert special.tolist() == [0x7FC0, 0xFFC0, 0x7F80, 0xFF80]


def test_float16_and_integers_round_to_nearest_even() -> None:
    halves = np.arange(0x10000, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = np.isfinite(halves)
    np.testing.assert_array_equal(to_bits(halves, "x")[finite], float32_to_bits(halves[finite].astype(np.float32)))
    ints = np.array([0, 1, -1, 255, 256, 257, 2**24 + 2**16 + 1, -(2**31), 2**31 - 1], np.int64)
    got = to_bits(ints, "x")
    np.testing.assert_array_equal(got, [nearest_bits(float(v)) for v in ints.tolist()])
    assert got[6] == 0x4B81  # 2^24 + 2^17: above the tie, where float32 would have made it the tie
    assert to_bits(np.array([True, False]), "x").tolist() == [0x3F80, 0]
    with pytest.raises(ValueError, match="real numbers only"):
        to_bits(np.array([1 + 2j]), "x")


def test_uploads_take_float32_or_bfloat16_values_only() -> None:
    np.testing.assert_array_equal(exact_bits(np.array([1.5], np.float32), "t"), [0x3FC0])
    for wrong in (np.array([1.5]), np.array([1], np.int32), np.array([1.5], np.float16), np.array([1], np.uint16)):
        with pytest.raises(ValueError, match="t is bfloat16, got"):
            exact_bits(wrong, "t")


def test_the_dtype_stands_in_for_numpys() -> None:
    assert gpud_client.bfloat16 is bfloat16
    assert bfloat16 == "bfloat16" and bfloat16.__eq__("bfloat16") and bfloat16 != "float16"
    assert "bfloat16" == bfloat16  # noqa: SIM300  (str's == defers to the dtype's)
    assert bfloat16 != np.dtype("float32") and np.dtype("float32") != bfloat16
    assert bfloat16.name == "bfloat16" and bfloat16.itemsize == 2 and str(bfloat16) == "bfloat16"
    assert hash(bfloat16) == hash("bfloat16") and len({bfloat16, "bfloat16"}) == 1
    assert host_dtype("bfloat16") is bfloat16 and host_dtype(bfloat16) is bfloat16
    assert host_dtype("float16") == np.dtype(np.float16)
    assert name_of(bfloat16) == "bfloat16" and name_of(np.float32) == "float32" and name_of("no such") == "no such"
    assert not is_bfloat16(np.uint16) and not is_bfloat16(np.dtype(np.uint16)) and not is_bfloat16(None)


def test_ml_dtypes_bfloat16_is_taken_as_it_is() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert is_bfloat16(ml_dtypes.bfloat16) and is_bfloat16(np.dtype(ml_dtypes.bfloat16))
    assert host_dtype(ml_dtypes.bfloat16) is bfloat16 and bfloat16 == np.dtype(ml_dtypes.bfloat16)
    values = np.random.default_rng().standard_normal(1000).astype(np.float32)
    theirs = values.astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(exact_bits(theirs, "t"), theirs.view(np.uint16))
    np.testing.assert_array_equal(float32_to_bits(values), theirs.view(np.uint16))  # the same rounding
    nan = np.array([0x7F800001, 0xFFA50000, 0x7FC00000], np.uint32).view(np.float32)  # NaN too
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(float32_to_bits(nan), nan.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_a_bool_reads_back_as_true_or_false_whatever_byte_it_holds() -> None:
    # A bool tensor another session published may hold any byte: numpy's bool must be 0 or 1.
    got = from_storage(np.array([0, 1, 2, 255], np.uint8), np.dtype(bool))
    assert got.dtype == np.dtype(bool) and got.view(np.uint8).tolist() == [0, 1, 1, 1]

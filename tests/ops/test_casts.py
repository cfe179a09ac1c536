"""gpu.ops.cast between every two dtypes of the elementwise table, on every backend, against numpy's
astype where numpy defines the result: floats rounded to nearest even (overflow to infinity, NaN and
subnormals kept), integers to integers wrapped, integers to floats (64-bit ones from both their words)
rounded to nearest even, floats to integers truncated toward zero. Where numpy leaves it undefined
(a float out of an integer's range, NaN), gpud saturates and gives 0 for NaN. Odd sizes, so a narrow
output's last word is partly the tensor's; outputs poisoned."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.dtypes import DTYPES

INTS = [d for d, entry in DTYPES.items() if entry.kind != "float" and d != "bool"]
# numpy has no bfloat16: its casts are test_bfloat16.py's; bool is a source only (its test below)
ALL = [d for d in DTYPES if d not in ("bfloat16", "bool")]


def poison(gpu: gpud_client.Client, shape: tuple[int, ...], dtype: str) -> gpud_client.Tensor:
    """An output whose every byte is 0xA5: an element left unwritten shows."""
    return gpu.tensor(
        np.full(int(np.prod(shape)) * np.dtype(dtype).itemsize, 0xA5, np.uint8).view(dtype).reshape(shape)
    )


def in_every_range(rng: np.random.Generator, src: str, n: int) -> np.ndarray:
    """Values every dtype holds exactly (floats with a fraction, truncated by integer targets)."""
    v = rng.integers(0 if DTYPES[src].kind == "uint" else -128, 128, n).astype(np.float64)
    if DTYPES[src].kind == "float":
        v += rng.choice([0.0, 0.25, 0.5, 0.75], n) * np.sign(v)
    return v.astype(src)


@pytest.mark.parametrize("src", ALL)
async def test_every_pair_in_range_is_numpy_astype(gpu: gpud_client.Client, src: str) -> None:
    rng = np.random.default_rng()
    a = in_every_range(rng, src, 1001)
    x = gpu.tensor(a)
    for dst in ALL:
        if DTYPES[dst].kind == "uint" and DTYPES[src].kind == "float":
            a_dst = np.abs(a)  # numpy's float to unsigned is undefined below zero
            x_dst = gpu.tensor(a_dst)
        else:
            a_dst, x_dst = a, x
        out = poison(gpu, a.shape, dst)
        gpu.ops.cast(x_dst, dst, out=out)
        got = await out.numpy()
        assert got.dtype == np.dtype(dst)
        np.testing.assert_array_equal(got, a_dst.astype(dst), err_msg=f"{src} -> {dst}")


async def test_float32_to_float16_rounds_on_the_bits(gpu: gpud_client.Client) -> None:
    tiny = 2.0**-24  # float16's smallest subnormal
    edge = [65504, 65519.99, 65520, 1e6, -1e6, np.inf, -np.inf, np.nan, -0.0, 0.0, tiny, tiny / 2, tiny * 1.5,
            tiny * 0.5001, 2**-14, 2**-14 - tiny / 2, 1 + 2**-11, 1 + 3 * 2**-11, 2049, 2051, 1e-30]  # fmt: skip
    rng = np.random.default_rng()
    a = np.concatenate([np.array(edge, np.float32), (rng.standard_normal(2000) * 10.0 ** rng.integers(-8, 5, 2000))])
    a = a.astype(np.float32)
    half = gpu.ops.cast(gpu.tensor(a), "float16")
    with np.errstate(over="ignore"):
        want = a.astype(np.float16)
    np.testing.assert_array_equal((await half.numpy()).view(np.uint16), want.view(np.uint16))
    back = gpu.ops.cast(half, "float32")  # exact: subnormals, infinities and NaN included
    np.testing.assert_array_equal((await back.numpy()).view(np.uint32), want.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("src", ["int64", "uint64"])
async def test_64_bit_integers_to_floats_use_both_words(gpu: gpud_client.Client, src: str) -> None:
    info = np.iinfo(src)
    rng = np.random.default_rng()
    edge = [info.min, info.max, 0, 1, 2**24 + 1, 2**24 + 3, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 2**16 + 1,
            2**53 + 2**29, 2**53 + 2**29 + 1, 2**63 - 2**39, 2**63 - 2**39 - 1]  # fmt: skip
    if src == "int64":
        edge += [-(2**31) - 1, -(2**32), -(2**40) - 2**16 - 1, -(2**63) + 2**39 + 1, -1]
    bits = rng.integers(0, 2**63, 4000, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, 4000, dtype=np.uint64)
    shifts = rng.integers(0, 64, 4000).astype(np.uint64)
    a = np.concatenate([np.array(edge, src), (bits >> shifts).view(src)])  # every magnitude, both words
    x = gpu.tensor(a)
    for dst in ("float32", "float16"):
        got = await gpu.ops.cast(x, dst).numpy()
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(got, a.astype(dst), err_msg=f"{src} -> {dst}")


async def test_integers_wrap_to_narrower_integers_as_numpy(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    for src in ("int64", "uint64", "int32", "uint32", "int16", "uint16"):
        info = np.iinfo(src)
        a = rng.integers(info.min, info.max, 1003, dtype=src, endpoint=True)
        a[:2] = info.min, info.max
        x = gpu.tensor(a)
        for dst in INTS:
            got = await gpu.ops.cast(x, dst).numpy()
            np.testing.assert_array_equal(got, a.astype(dst), err_msg=f"{src} -> {dst}")


async def test_floats_out_of_an_integers_range_saturate(gpu: gpud_client.Client) -> None:
    a = np.array([1e10, -1e10, np.nan, np.inf, -np.inf, 3.99, -3.99, 3e19, -0.5], np.float32)
    x = gpu.tensor(a)
    for dst in INTS:
        info = np.iinfo(dst)
        want = [0 if math.isnan(v) else min(max(int(v), info.min), info.max) if math.isfinite(v) else
                info.max if v > 0 else info.min for v in a.tolist()]  # fmt: skip
        got = await gpu.ops.cast(x, dst).numpy()
        np.testing.assert_array_equal(got, np.array(want, dst), err_msg=dst)


async def test_a_cast_to_a_dtype_outside_the_table_names_the_op(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.ones(3, np.float32))
    with pytest.raises(InvalidArgument, match="the target dtype is float64; cast takes") as info:
        gpu.ops.cast(x, "float64")
    assert info.value.op == "cast"
    with pytest.raises(InvalidArgument, match="out is int8, the cast is to int32") as info:
        gpu.ops.cast(x, "int32", out=gpu.empty((3,), "int8"))
    assert info.value.op == "cast"


async def test_bool_casts_to_every_dtype_and_nothing_casts_to_bool(gpu: gpud_client.Client) -> None:
    keep = np.random.default_rng().random(1001) < 0.5
    x = gpu.tensor(keep)
    assert x.dtype == np.dtype(bool)
    np.testing.assert_array_equal(await x.numpy(), keep)
    for dst in ALL:
        got = await gpu.ops.cast(x, dst, out=poison(gpu, keep.shape, dst)).numpy()
        np.testing.assert_array_equal(got, keep.astype(dst), err_msg=f"bool -> {dst}")
    with pytest.raises(InvalidArgument, match="a cast to bool is not supported") as info:
        gpu.ops.cast(gpu.tensor(np.ones(3, np.float32)), bool)
    assert info.value.op == "cast"


def test_the_daemon_refuses_a_cast_into_a_bool_tensor() -> None:
    # A raw dispatch could write 2 into a bool: numpy would read a bool that is neither True nor False.
    spec, f32, flag = KERNELS["ew_cast"], TensorInfo("float32", (3,)), TensorInfo("bool", (3,))
    with pytest.raises(OpError, match="a cast to bool is not supported"):
        spec.verify([f32, flag], [3, DTYPES["float32"].code, DTYPES["bool"].code])
    spec.verify([flag, f32], [3, DTYPES["bool"].code, DTYPES["float32"].code])

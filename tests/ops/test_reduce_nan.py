"""NaN in max and argmax as numpy has it (gpud/ops/nan.*), on every backend: a row's max is NaN when
any element is, and argmax gives the first NaN's index; over the last axis (one workgroup a row,
NaN met in a thread's scan and in the merges between threads) and over any other axis (one thread an
output), float32, float16 and bfloat16. Softmax of a row holding NaN is NaN throughout, as numpy's
exp(x - max) / sum is."""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client.dtypes import bits_to_float32, float32_to_bits

DTYPES = ["float32", "float16", "bfloat16"]


def special_rows(rng: np.random.Generator, length: int) -> np.ndarray:
    """Rows of `length`: NaN first, last, in the middle, twice, everywhere, nowhere, beside -inf and
    +inf, and random rows with NaN in about one element of 97."""
    rows = rng.integers(-3, 4, (12, length)).astype(np.float32)  # ties everywhere
    rows[0, 0] = np.nan
    rows[1, -1] = np.nan
    rows[2, length // 2] = np.nan
    rows[3, [length // 3, length - 1]] = np.nan
    rows[4, :] = np.nan
    rows[6, :] = -np.inf
    rows[6, length // 2] = np.nan
    rows[7, 0] = np.inf
    rows[7, -1] = np.nan
    sparse = rng.random((4, length)) < 1 / 97
    rows[8:] = np.where(sparse, np.nan, rng.standard_normal((4, length)))
    return rows  # row 5 has no NaN


def upload(gpu: gpud_client.Client, a: np.ndarray, dtype: str) -> tuple[gpud_client.Tensor, np.ndarray]:
    """The tensor, and the float32 values it holds (rounded to its dtype)."""
    if dtype == "bfloat16":
        return gpu.tensor(a, dtype="bfloat16"), bits_to_float32(float32_to_bits(a))
    held = a.astype(dtype)
    return gpu.tensor(held), held.astype(np.float32)


async def check(gpu: gpud_client.Client, x: gpud_client.Tensor, held: np.ndarray, axis: int, what: str) -> None:
    got_max = np.asarray(await gpu.ops.max(x, axis=axis).numpy(), np.float32)
    np.testing.assert_array_equal(got_max, held.max(axis=axis), err_msg=f"max {what}")  # NaN equals NaN here
    np.testing.assert_array_equal(await gpu.ops.argmax(x, axis=axis).numpy(), held.argmax(axis=axis), f"argmax {what}")


@pytest.mark.parametrize("dtype", DTYPES)
async def test_nan_wins_max_and_argmax_over_the_last_axis(gpu: gpud_client.Client, dtype: str) -> None:
    rng = np.random.default_rng()
    for length in (1, 7, 257, 896, 70_000):
        a = special_rows(rng, length) if length > 1 else np.array([[np.nan], [1.0]], np.float32)
        x, held = upload(gpu, a, dtype)
        await check(gpu, x, held, -1, f"{dtype}, length {length}")


@pytest.mark.parametrize("dtype", DTYPES)
async def test_nan_wins_max_and_argmax_over_other_axes(gpu: gpud_client.Client, dtype: str) -> None:
    rng = np.random.default_rng()
    a = np.moveaxis(special_rows(rng, 300).reshape(3, 4, 300), -1, 1)  # (3, 300, 4): NaN along axis 1
    x, held = upload(gpu, np.ascontiguousarray(a), dtype)
    await check(gpu, x, held, 1, f"{dtype}, axis 1 of {a.shape}")
    await check(gpu, x, held, 0, f"{dtype}, axis 0 of {a.shape}")
    view = x.transpose(0, 1)  # a strided view, reduced over its axis 0 and its last
    await check(gpu, view, np.swapaxes(held, 0, 1), 0, f"{dtype}, axis 0 of a transposed view")


@pytest.mark.parametrize("dtype", DTYPES)
async def test_softmax_of_a_row_holding_nan_is_nan_throughout(gpu: gpud_client.Client, dtype: str) -> None:
    a = np.array([[1.0, np.nan, 2.0], [1.0, 2.0, 3.0], [-np.inf, -np.inf, -np.inf]], np.float32)
    want = np.array([[np.nan] * 3, np.exp(a[1] - 3) / np.exp(a[1] - 3).sum(), [0.0] * 3])  # only -inf: zeros
    x, _held = upload(gpu, a, dtype)
    tol = 1e-6 if dtype == "float32" else 1e-2
    for axis, view in ((-1, x), (0, x.transpose(0, 1))):  # the last axis, and another (one thread a row)
        got = np.asarray(await gpu.ops.softmax(view, axis=axis).numpy(), np.float32)
        got = got if axis == -1 else got.T
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"{dtype}, axis {axis}")

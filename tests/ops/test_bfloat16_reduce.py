"""bfloat16 in the reductions, norms, embedding, rotary and kv_append, on every backend, against numpy
in float64 from the bfloat16 inputs: sums within float32's accumulation, max, argmax, embedding and
kv_append exact, bfloat16 outputs within one rounding (2^-8 relative) of float64 plus float32's
error. Rows of odd length, so two rows' workgroups write the halves of one word; outputs poisoned, and
an output that ends inside a word leaves its neighbour's half alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client.dtypes import bits_to_float32, float32_to_bits
from ops.test_attention import rotary_ref
from ops.test_reduce import layernorm_ref, softmax_ref

ROUND = 2.0**-8 * 1.001  # bfloat16's unit roundoff, and a little for float32's error
OUT_TOL = {"bfloat16": ROUND, "float16": 2e-3, "float32": 1e-5}  # relative to max(1, |ref|)
PAIRS = [("bfloat16", "float32"), ("bfloat16", "float16"), ("bfloat16", "bfloat16"),
         ("float32", "bfloat16"), ("float16", "bfloat16")]  # fmt: skip


def bf(values: object) -> np.ndarray:
    return bits_to_float32(float32_to_bits(np.asarray(values, np.float32)))


def rand(shape: tuple[int, ...], scale: float = 1.0, offset: float = 0.0) -> np.ndarray:
    """bfloat16 values (as float32), none below 2^-7 in magnitude: float16 holds them exactly too."""
    v = np.random.default_rng().standard_normal(shape) * scale + offset
    return bf(np.copysign(np.maximum(np.abs(v), 2.0**-7), v))


def tensor(gpu: gpud_client.Client, values: np.ndarray, dtype: str) -> gpud_client.Tensor:
    """`values` (exact in every float dtype used here: bfloat16 ones, or any for float32) as `dtype`."""
    return gpu.tensor(values, dtype=dtype) if dtype == "bfloat16" else gpu.tensor(values.astype(dtype))


def poisoned(gpu: gpud_client.Client, shape: tuple[int, ...], dtype: str = "bfloat16") -> gpud_client.Tensor:
    return (
        gpu.tensor(np.full(shape, np.nan, np.float32), dtype=dtype)
        if dtype == "bfloat16"
        else (gpu.tensor(np.full(shape, -7 if dtype == "int32" else np.nan, dtype)))
    )


def close(got: np.ndarray, ref: np.ndarray, dtype: str, slack: Any = 0.0) -> None:
    got64 = got.astype(np.float64)
    assert got64.shape == ref.shape and not np.isnan(got64).any(), "NaN: an unwritten or poisoned element"
    err = np.abs(got64 - ref) - slack
    assert np.all(err <= OUT_TOL[dtype] * np.maximum(1.0, np.abs(ref))), np.max(err)


def narrowed(gpu: gpud_client.Client, shape: tuple[int, ...]) -> tuple[gpud_client.Tensor, gpud_client.Tensor]:
    """(a poisoned bfloat16 tensor one row longer than `shape`, its first rows: an output that, of an odd
    size, ends in the middle of a word whose other half is the next row's)."""
    whole = poisoned(gpu, (shape[0] + 1, *shape[1:]))
    return whole, whole.narrow(0, 0, shape[0])


@pytest.mark.parametrize("op", ["sum", "mean", "max", "argmax"])
async def test_reductions_over_any_axis(gpu: gpud_client.Client, op: str) -> None:
    for shape, axis in [((1,), -1), ((3, 7), -1), ((5, 257), -1), ((5, 7, 3), 0), ((5, 7, 3), 1), ((4, 6), None)]:
        a = rand(shape, 2.0, 0.5)
        x = gpu.tensor(a, dtype="bfloat16")
        got = await getattr(gpu.ops, op)(x, axis=axis).numpy()
        want = getattr(a.astype(np.float64), op)(axis=axis)
        if op in ("max", "argmax"):
            np.testing.assert_array_equal(got, want)
        else:
            length = a.size // max(want.size, 1)
            magnitude = np.abs(a.astype(np.float64)).sum(axis=axis) / (length if op == "mean" else 1)
            assert got.dtype == np.float32 and np.all(np.abs(got - want) <= 1e-5 * magnitude)
    t = gpu.tensor(rand((5, 7, 3)), dtype="bfloat16").transpose(0, 2)  # a view: the axis kernels
    np.testing.assert_array_equal(await gpu.ops.max(t, axis=1).numpy(), (await t.numpy()).max(axis=1))


async def test_softmax_rows_masks_and_axes(gpu: gpud_client.Client) -> None:
    a = rand((3, 7), 3.0)
    mask = np.where(np.random.default_rng().random((7,)) < 0.3, -np.inf, 0.0).astype(np.float32)
    whole, out = narrowed(gpu, a.shape)
    gpu.ops.softmax(gpu.tensor(a, dtype="bfloat16"), out=out)
    close(await out.numpy(), softmax_ref(a.astype(np.float64)), "bfloat16")
    assert np.isnan((await whole.numpy())[3]).all(), "the row after the output was written"
    masked = gpu.ops.softmax(gpu.tensor(a, dtype="bfloat16"), gpu.tensor(mask))
    close(await masked.numpy(), softmax_ref(a.astype(np.float64) + mask), "bfloat16")
    b = rand((5, 7, 3), 3.0)
    along = gpu.ops.softmax(gpu.tensor(b, dtype="bfloat16"), axis=1)
    close(await along.numpy(), np.moveaxis(softmax_ref(np.moveaxis(b.astype(np.float64), 1, -1)), -1, 1), "bfloat16")


@pytest.mark.parametrize("x_dtype, w_dtype", PAIRS)
async def test_rmsnorm_and_layernorm_with_bfloat16_x_or_weights(
    gpu: gpud_client.Client, x_dtype: str, w_dtype: str
) -> None:
    for shape in [(3, 7), (2, 257)]:
        a, w, b = rand(shape, 1.0, 0.3), rand(shape[-1:]), rand(shape[-1:])
        a64, w64 = a.astype(np.float64), w.astype(np.float64)
        x = tensor(gpu, a, x_dtype)
        whole, out = narrowed(gpu, shape) if x_dtype == "bfloat16" else (None, poisoned(gpu, shape, x_dtype))
        gpu.ops.rmsnorm(x, tensor(gpu, w, w_dtype), 1e-5, out=out)
        ref = a64 / np.sqrt((a64 * a64).mean(axis=-1, keepdims=True) + 1e-5) * w64
        close(await out.numpy(), ref, x_dtype)
        if whole is not None:
            assert np.isnan((await whole.numpy())[-1]).all(), "the row after the output was written"
        normed = gpu.ops.layernorm(x, tensor(gpu, w, w_dtype), tensor(gpu, b, w_dtype), 1e-5)
        ref, slack = layernorm_ref(a, w, b, 1e-5)
        close(await normed.numpy(), ref, x_dtype, slack)


async def test_normalize(gpu: gpud_client.Client) -> None:
    a = rand((3, 7))
    got = gpu.ops.normalize(gpu.tensor(a, dtype="bfloat16"), out=poisoned(gpu, a.shape))
    a64 = a.astype(np.float64)
    close(await got.numpy(), a64 / np.linalg.norm(a64, axis=-1, keepdims=True), "bfloat16")


@pytest.mark.parametrize("table_dtype, out_dtype", PAIRS)
async def test_embedding_tables_and_outputs(gpu: gpud_client.Client, table_dtype: str, out_dtype: str) -> None:
    vocab, dim = 37, 19  # odd: rows start mid-word
    table = rand((vocab, dim))
    ids = np.random.default_rng().integers(-2, vocab + 2, (3, 5)).astype(np.int32)
    out = poisoned(gpu, (3, 5, dim), out_dtype)
    gpu.ops.embedding(gpu.tensor(ids), tensor(gpu, table, table_dtype), dtype=out_dtype, out=out)
    valid = (ids >= 0) & (ids < vocab)
    ref = np.where(valid[..., None], table[np.clip(ids, 0, vocab - 1)], 0.0)
    np.testing.assert_array_equal(await out.numpy(), ref.astype(out_dtype) if out_dtype != "bfloat16" else ref)


@pytest.mark.parametrize("style", ["neox", "gptj"])
async def test_rotary_into_a_new_tensor_and_in_place(gpu: gpud_client.Client, style: str) -> None:
    shape, pos = (2, 5, 3, 6), np.array([3, 130], np.int32)
    a = rand(shape)
    ref, slack = rotary_ref(a, pos, style, 10000.0)
    p = gpu.tensor(pos)
    out = gpu.ops.rotary(gpu.tensor(a, dtype="bfloat16"), p, style=style, out=poisoned(gpu, shape))
    close(await out.numpy(), ref, "bfloat16", slack)
    x = gpu.tensor(a, dtype="bfloat16")
    assert gpu.ops.rotary(x, p, style=style, out=x) is x
    close(await x.numpy(), ref, "bfloat16", slack)


@pytest.mark.parametrize("cache_dtype, x_dtype", PAIRS)
async def test_kv_append_casts_into_the_cache(gpu: gpud_client.Client, cache_dtype: str, x_dtype: str) -> None:
    batch, length, heads, dim = 3, 16, 2, 7
    expected = rand((batch, length, heads, dim))
    cache = tensor(gpu, expected, cache_dtype)
    for steps, pos in [(4, [3, 14, 0]), (3, [-2, 100, 13])]:
        x = rand((batch, steps, heads, dim))
        gpu.ops.kv_append(cache, tensor(gpu, x, x_dtype), gpu.tensor(np.array(pos, np.int32)))
        for b in range(batch):
            for t in range(steps):
                if 0 <= pos[b] + t < length:
                    expected[b, pos[b] + t] = x[b, t]
        want = expected.astype(cache_dtype) if cache_dtype != "bfloat16" else expected
        np.testing.assert_array_equal(await cache.numpy(), want)

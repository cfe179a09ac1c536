"""Reductions over the last axis against numpy in float64, on every backend: fresh random inputs,
lengths 1, 7, 257, 896 and 70,000 (more than the 65,535 iterations lavapipe runs of a loop, were one
thread to walk a row), many rows (more than 65,535 too, so the grid folds into y), poisoned outputs,
NaN never passes.

Tolerances (every op accumulates in float32; float16 inputs are exact in float32, so the references
use the rounded inputs):
- sum, mean: |got - ref| <= 1e-5 * sum(|x|) of the row (mean: divided by the length), both dtypes;
- max, argmax: exact (argmax: the first index of the maximum);
- softmax: |got - ref| <= rtol * ref + atol, float32 1e-5 and 1e-9, float16 2e-3 (its rounding when
  stored is 4.9e-4) and 1e-7 (its subnormals);
- rmsnorm, layernorm: |got - ref| <= tol * max(1, |ref|), float32 1e-5, float16 2e-3; layernorm
  allows 4 * 2^-24 * |mean| / std * |weight| more (float32's rounding of x - mean: inherent, and far
  below the error of a one-pass variance, which the inputs, mean 60 and spread 0.5, would show).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument
from gpud_client.ops.base import _info
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.reduce import MAX_LENGTH
from gpud_protocol.ops.reduce_axis import geometry

DTYPES = ["float32", "float16"]
# Lengths 1, 7, 257, 896, 70,000; few rows and many.
SHAPES = [(1,), (7,), (300, 1), (33, 7), (3, 5, 257), (4, 896), (2, 70_000)]
FOLDED = (65_535 + 1001, 3)  # more rows than workgroups in one grid dimension
SUM_TOL = 1e-5
SOFTMAX_TOL = {"float32": (1e-5, 1e-9), "float16": (2e-3, 1e-7)}  # (rtol, atol)
NORM_TOL = {"float32": 1e-5, "float16": 2e-3}


def poisoned(gpu: gpud_client.Client, shape: tuple[int, ...], dtype: str) -> gpud_client.Tensor:
    """An output filled with NaN (int32: -7): an element the op does not write fails the check."""
    return gpu.tensor(np.full(shape, -7 if dtype == "int32" else np.nan, dtype))


def no_nan(got: np.ndarray) -> np.ndarray:
    got64 = got.astype(np.float64)
    assert not np.isnan(got64).any(), "NaN (an unwritten or poisoned element)"
    return got64


def close_sums(got: np.ndarray, ref: np.ndarray, magnitude: np.ndarray) -> None:
    """Sums and means: the error is relative to the sum of the magnitudes accumulated."""
    assert got.dtype == np.float32 and got.shape == ref.shape
    err = np.abs(no_nan(got) - ref)
    assert np.all(err <= SUM_TOL * magnitude), np.max(err / magnitude)


def close_softmax(got: np.ndarray, ref: np.ndarray, dtype: str) -> None:
    assert got.dtype == np.dtype(dtype) and got.shape == ref.shape
    rtol, atol = SOFTMAX_TOL[dtype]
    err = np.abs(no_nan(got) - ref)
    assert np.all(err <= rtol * ref + atol), np.max((err - atol) / np.maximum(ref, 1e-30))


def close_norm(got: np.ndarray, ref: np.ndarray, dtype: str, slack: Any = 0.0) -> None:
    """`slack`: an absolute allowance on top (layernorm: float32's rounding of the mean)."""
    assert got.dtype == np.dtype(dtype) and got.shape == ref.shape
    scale = np.maximum(1.0, np.abs(ref))
    err = np.abs(no_nan(got) - ref) - slack
    assert np.all(err <= NORM_TOL[dtype] * scale), np.max(err / scale)


def layernorm_ref(a: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(the float64 reference, the slack for float32 arithmetic): x - mean in float32 is off by a few
    of the mean's ulps, which the normalization divides by the standard deviation."""
    a64 = a.astype(np.float64)
    mean = a64.mean(axis=-1, keepdims=True)
    std = np.sqrt(((a64 - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    ref = (a64 - mean) / std * w.astype(np.float64) + b.astype(np.float64)
    return ref, 4 * 2.0**-24 * np.abs(mean) / std * np.abs(w.astype(np.float64))


def softmax_ref(v: np.ndarray) -> np.ndarray:
    """Softmax of float64 rows; a row of only -inf gives zeros."""
    top = v.max(axis=-1, keepdims=True)
    e = np.exp(v - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    result: np.ndarray = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return result


def random(shape: tuple[int, ...], dtype: str, scale: float = 1.0, offset: float = 0.0) -> np.ndarray:
    return (np.random.default_rng().standard_normal(shape) * scale + offset).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "mean", "max"])
async def test_sum_mean_max_over_the_last_axis(gpu: gpud_client.Client, op: str, dtype: str) -> None:
    for shape in SHAPES:
        a = random(shape, dtype, 2.0, 0.5)
        a64 = a.astype(np.float64)
        out = poisoned(gpu, shape[:-1], "float32")
        assert getattr(gpu.ops, op)(gpu.tensor(a), out=out) is out
        got = await out.numpy()
        if op == "max":
            np.testing.assert_array_equal(no_nan(got), a64.max(axis=-1))
        else:
            magnitude = np.abs(a64).sum(axis=-1)
            if op == "sum":
                close_sums(got, a64.sum(axis=-1), magnitude)
            else:
                close_sums(got, a64.mean(axis=-1), magnitude / shape[-1])


async def test_max_and_argmax_of_special_rows(gpu: gpud_client.Client) -> None:
    a = np.random.default_rng().integers(-3, 4, (6, 70_000)).astype(np.float32)  # ties everywhere
    a[1, :] = -np.inf
    a[2, 5:] = -np.inf  # the maximum among the first elements
    a[3, :] = 0.0
    a[3, -1] = 1.0  # the maximum last
    a[4, :] = 2.0
    a[4, 0] = 3.0  # the maximum first
    x = gpu.tensor(a)
    np.testing.assert_array_equal(await gpu.ops.max(x).numpy(), a.max(axis=-1))
    got = await gpu.ops.argmax(x).numpy()
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got[[0, 2, 3, 4]], a[[0, 2, 3, 4]].argmax(axis=-1))


@pytest.mark.parametrize("dtype", DTYPES)
async def test_argmax_is_the_first_index_of_the_maximum(gpu: gpud_client.Client, dtype: str) -> None:
    rng = np.random.default_rng()
    for shape in SHAPES:
        for a in (random(shape, dtype), rng.integers(0, 5, shape).astype(dtype)):  # the second: ties
            out = poisoned(gpu, shape[:-1], "int32")
            gpu.ops.argmax(gpu.tensor(a), out=out)
            got = await out.numpy()
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got, a.argmax(axis=-1))


@pytest.mark.parametrize("dtype", DTYPES)
async def test_argmax_of_vocabulary_rows(gpu: gpud_client.Client, dtype: str) -> None:
    """An LM head's rows (151,936 logits, every decoded token): on CUDA each thread's groups of loads in
    flight, then its last elements one at a time (past 147,456); ties keep the first index across both."""
    a = np.random.default_rng().integers(-50, 50, (6, 151_936)).astype(dtype)
    a[1, -1] = 100  # the last element
    a[2, [16_383, 16_384, 140_000]] = 100  # ties inside the grouped loads
    a[3, 0] = 100
    a[4, 151_000] = 100  # among the last elements
    a[5, [147_000, 150_000]] = 100  # a tie between a group and the last elements
    out = poisoned(gpu, (6,), "int32")
    gpu.ops.argmax(gpu.tensor(a), out=out)
    got = await out.numpy()
    np.testing.assert_array_equal(got, a.argmax(axis=-1))
    assert list(got[1:]) == [151_935, 16_383, 0, 151_000, 147_000]


@pytest.mark.parametrize("dtype", DTYPES)
async def test_softmax(gpu: gpud_client.Client, dtype: str) -> None:
    for shape in SHAPES:
        a = random(shape, dtype, 4.0, 30.0)  # far from 0: the max must be subtracted
        out = poisoned(gpu, shape, dtype)
        gpu.ops.softmax(gpu.tensor(a), out=out)
        close_softmax(await out.numpy(), softmax_ref(a.astype(np.float64)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
async def test_softmax_with_a_mask_broadcast_over_leading_axes(gpu: gpud_client.Client, dtype: str) -> None:
    rng = np.random.default_rng()

    def mask_of(shape: tuple[int, ...], masked: float) -> np.ndarray:
        m = rng.standard_normal(shape).astype(np.float32)
        m[rng.random(shape) < masked] = -np.inf
        return m

    cases: list[tuple[tuple[int, ...], np.ndarray]] = [
        ((3, 5, 257), mask_of((257,), 0.3)),
        ((3, 5, 257), mask_of((5, 257), 0.3)),
        ((3, 5, 257), mask_of((1, 5, 257), 0.5)),  # leading 1s broadcast too
        ((3, 5, 257), mask_of((3, 5, 257), 0.3)),
        ((2, 4, 896), mask_of((1, 1, 896), 0.9)),
        ((2, 70_000), mask_of((2, 70_000), 0.95)),
        ((33, 7), mask_of((7,), 0.0)),
        ((300, 1), mask_of((1,), 0.0)),
    ]
    causal = np.triu(np.full((7, 7), -np.inf, np.float32), k=1)
    cases.append(((2, 3, 7, 7), causal))
    fully = mask_of((5, 257), 0.2)
    fully[2] = -np.inf  # rows 2, 7 and 12 of x: all masked, zeros
    fully[3, ::2] = np.finfo(np.float32).min  # a finite "minus infinity" as some models use
    cases.append(((3, 5, 257), fully))
    for shape, m in cases:
        a = random(shape, dtype, 3.0)
        out = poisoned(gpu, shape, dtype)
        gpu.ops.softmax(gpu.tensor(a), gpu.tensor(m), out=out)
        ref = softmax_ref(a.astype(np.float64) + m.astype(np.float64))
        got = await out.numpy()
        close_softmax(got, ref, dtype)
        assert np.all(got[ref == 0] == 0)
    assert not (await out.numpy())[:, 2].any()


@pytest.mark.parametrize("wdtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
async def test_rmsnorm(gpu: gpud_client.Client, dtype: str, wdtype: str) -> None:
    for shape in SHAPES:
        a = random(shape, dtype, 3.0, 1.0)
        w = random(shape[-1:], wdtype, 1.0, 1.0)
        out = poisoned(gpu, shape, dtype)
        gpu.ops.rmsnorm(gpu.tensor(a), gpu.tensor(w), out=out)
        a64 = a.astype(np.float64)
        ref = a64 / np.sqrt((a64**2).mean(axis=-1, keepdims=True) + 1e-6) * w.astype(np.float64)
        close_norm(await out.numpy(), ref, dtype)
    a = random((3, 64), dtype) * 0  # all zeros: eps keeps it finite
    got = await gpu.ops.rmsnorm(gpu.tensor(a), gpu.tensor(np.ones(64, wdtype)), eps=1e-3).numpy()
    np.testing.assert_array_equal(no_nan(got), 0.0)


@pytest.mark.parametrize("wdtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
async def test_layernorm(gpu: gpud_client.Client, dtype: str, wdtype: str) -> None:
    for shape in SHAPES:
        # a mean far from 0 next to a small spread: a one-pass variance would cancel
        a = random(shape, dtype, 0.5, 60.0)
        w, b = random(shape[-1:], wdtype, 1.0, 1.0), random(shape[-1:], wdtype)
        out = poisoned(gpu, shape, dtype)
        gpu.ops.layernorm(gpu.tensor(a), gpu.tensor(w), gpu.tensor(b), eps=1e-4, out=out)
        ref, slack = layernorm_ref(a, w, b, 1e-4)
        close_norm(await out.numpy(), ref, dtype, slack)


async def test_more_rows_than_one_grid_dimension_holds(gpu: gpud_client.Client) -> None:
    a = random(FOLDED, "float32", 1.0, 1.0)
    a64 = a.astype(np.float64)
    x = gpu.tensor(a)
    sums, probs = poisoned(gpu, FOLDED[:1], "float32"), poisoned(gpu, FOLDED, "float32")
    gpu.ops.sum(x, out=sums)
    gpu.ops.softmax(x, out=probs)
    close_sums(await sums.numpy(), a64.sum(axis=-1), np.abs(a64).sum(axis=-1))
    close_softmax(await probs.numpy(), softmax_ref(a64), "float32")


async def test_mismatches_are_typed_errors_in_the_client_and_in_the_daemon(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.ones((4, 5), np.float32))
    w5 = gpu.tensor(np.ones(5, np.float32))
    cases: list[tuple[str, Any]] = [
        ("x is int32, not one of", lambda: gpu.ops.sum(gpu.tensor(np.ones((4, 5), np.int32)))),
        ("at least one axis", lambda: gpu.ops.mean(gpu.tensor(np.float32(1.0)))),
        ("out is float16", lambda: gpu.ops.sum(x, out=gpu.empty((4,), "float16"))),
        ("out is \\[4, 5\\]", lambda: gpu.ops.argmax(x, out=gpu.empty((4, 5), "int32"))),
        ("argmax is int32", lambda: gpu.ops.argmax(x, out=gpu.empty((4,), "float32"))),
        ("out is \\[5, 4\\]", lambda: gpu.ops.softmax(x, out=gpu.empty((5, 4), "float32"))),
        ("broadcast", lambda: gpu.ops.softmax(x, gpu.tensor(np.ones((3, 5), np.float32)))),
        ("broadcast", lambda: gpu.ops.softmax(x, gpu.tensor(np.ones((1, 4, 5), np.float32)))),
        ("mask is float16", lambda: gpu.ops.softmax(x, gpu.tensor(np.ones(5, np.float16)))),
        ("weight is \\[4\\]", lambda: gpu.ops.rmsnorm(x, gpu.tensor(np.ones(4, np.float32)))),
        ("weight is int32, not one of", lambda: gpu.ops.rmsnorm(x, gpu.tensor(np.ones(5, np.int32)))),
        ("bias is float16", lambda: gpu.ops.layernorm(x, w5, gpu.tensor(np.ones(5, np.float16)))),
        ("eps", lambda: gpu.ops.layernorm(x, w5, w5, eps=-1.0)),
        ("eps", lambda: gpu.ops.rmsnorm(x, w5, eps=math.nan)),
    ]
    for message, call in cases:
        with pytest.raises(InvalidArgument, match=message):
            call()
    # A client that skips the library's checks: the daemon applies the same rule, failing the
    # dispatch alone (each failure raises at the next await, in order).
    u32 = gpud_client.u32
    out, out2 = gpu.empty((4,), "float32"), gpu.empty((4, 5), "float32")
    gpu.dispatch(gpu.ops._kernel("reduce_f32"), 4, [x, out, u32(5), u32(5), u32(0)])
    with pytest.raises(InvalidArgument, match="reduce") as info:
        await out.numpy()
    assert info.value.op == "dispatch"
    # a mask row count that would read past the mask
    gpu.dispatch(gpu.ops._kernel("softmax_mask_f32"), 4, [x, w5, out2, u32(4), u32(5), u32(4)])
    with pytest.raises(InvalidArgument, match="mask_rows"):
        await out.numpy()
    gpu.dispatch(gpu.ops._kernel("layernorm_f32_f32"), 4, [x, w5, x, out2, u32(4), u32(5), 1e-5])
    with pytest.raises(InvalidArgument, match="bias is \\[4, 5\\]"):
        await out.numpy()
    gpu.dispatch(gpu.ops._kernel("argmax_f16"), 4, [x, out, u32(4), u32(5)])
    with pytest.raises(InvalidArgument, match="argmax"):
        await out.numpy()
    # the session goes on
    np.testing.assert_array_equal(await gpu.ops.sum(x).numpy(), np.full(4, 5.0, np.float32))


def test_the_rule_bounds_the_length_lavapipe_can_loop_over() -> None:
    """Checked without allocating: a row longer than 65,535 * 256 is refused (each thread walks it)."""
    spec = KERNELS["reduce_f32"]
    long = TensorInfo("float32", (2, MAX_LENGTH + 1))
    with pytest.raises(OpError, match="at most"):
        spec.check([long, TensorInfo("float32", (2,))], [2, MAX_LENGTH + 1, 0])
    spec.check([TensorInfo("float32", (2, MAX_LENGTH)), TensorInfo("float32", (2,))], [2, MAX_LENGTH, 0])
    with pytest.raises(OpError, match="empty"):
        spec.check([TensorInfo("float32", (2, 0)), TensorInfo("float32", (2,))], [2, 0, 0])
    with pytest.raises(OpError, match="no rows"):
        spec.check([TensorInfo("float32", (0, 3)), TensorInfo("float32", (0,))], [0, 3, 0])


async def test_ops_record_into_replay_graphs(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    w, b = rng.standard_normal(896).astype(np.float32), rng.standard_normal(896).astype(np.float32)
    m = np.where(rng.random(896) < 0.2, -np.inf, 0.0).astype(np.float32)
    g = gpu.graph("reduce")
    x = g.input("x", (6, 896), "float16")
    h = gpu.ops.layernorm(x, gpu.tensor(w), gpu.tensor(b), graph=g)  # float16 x, float32 weights
    p = gpu.ops.softmax(h, gpu.tensor(m), graph=g)
    total = gpu.ops.sum(p, graph=g)
    best = gpu.ops.argmax(h, graph=g)
    for name, tensor in (("h", h), ("p", p), ("total", total), ("best", best)):
        g.output(name, tensor)
    step = await g.build()
    for _ in range(2):
        a = random((6, 896), "float16", 2.0, 3.0)
        got = await step.replay(x=a)
        ref_h, slack = layernorm_ref(a, w, b, 1e-5)
        close_norm(got["h"], ref_h, "float16", slack)
        h16 = got["h"].astype(np.float64)  # the next ops read the stored float16
        close_softmax(got["p"], softmax_ref(h16 + m), "float16")
        close_sums(got["total"], got["p"].astype(np.float64).sum(axis=-1), np.ones(6))
        np.testing.assert_array_equal(got["best"], got["h"].argmax(axis=-1))


# ---------------------------------------------------------------------- any axis, and strided views

AXIS_SHAPES = [(7,), (33, 7), (3, 5, 257), (4, 1, 6), (2, 3, 4, 5)]  # odd sizes, a size-1 axis


def reduce_ref(op: str, a64: np.ndarray, axis: int | None) -> np.ndarray:
    if op == "max":
        return np.asarray(a64.max(axis=axis))
    return np.asarray(a64.sum(axis=axis) if op == "sum" else a64.mean(axis=axis))


def check_reduction(op: str, got: np.ndarray, a: np.ndarray, axis: int | None) -> None:
    a64 = a.astype(np.float64)
    ref = reduce_ref(op, a64, axis)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if op == "max":
        np.testing.assert_array_equal(no_nan(got), ref)
        return
    length = a.size if axis is None else a.shape[axis]
    magnitude = np.abs(a64).sum(axis=axis) / (length if op == "mean" else 1)
    close_sums(got, ref, magnitude)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "mean", "max"])
async def test_sum_mean_max_over_every_axis(gpu: gpud_client.Client, op: str, dtype: str) -> None:
    """numpy's keepdims=False: the axis goes from the shape; negative axes count from the end; None: all."""
    for shape in AXIS_SHAPES:
        a = random(shape, dtype, 2.0, 0.5)
        x = gpu.tensor(a)
        for axis in [*range(-len(shape), len(shape)), None]:
            reduced = () if axis is None else shape[: axis % len(shape)] + shape[axis % len(shape) + 1 :]
            out = poisoned(gpu, reduced, "float32")
            assert getattr(gpu.ops, op)(x, axis, out=out) is out
            check_reduction(op, await out.numpy(), a, axis)


@pytest.mark.parametrize("dtype", DTYPES)
async def test_argmax_over_every_axis_is_the_first_index_of_the_maximum(gpu: gpud_client.Client, dtype: str) -> None:
    rng = np.random.default_rng()
    for shape in AXIS_SHAPES:
        for a in (random(shape, dtype), rng.integers(0, 3, shape).astype(dtype)):  # the second: ties
            x = gpu.tensor(a)
            for axis in [*range(-len(shape), len(shape)), None]:
                got = await gpu.ops.argmax(x, axis=axis).numpy()
                assert got.dtype == np.int32
                np.testing.assert_array_equal(got, a.argmax(axis=axis))


def softmax_axis_ref(v: np.ndarray, axis: int | None) -> np.ndarray:
    if axis is None:
        return softmax_ref(v.reshape(-1)).reshape(v.shape)
    return np.moveaxis(softmax_ref(np.moveaxis(v, axis, -1)), -1, axis)


@pytest.mark.parametrize("dtype", DTYPES)
async def test_softmax_over_every_axis(gpu: gpud_client.Client, dtype: str) -> None:
    for shape in AXIS_SHAPES:
        a = random(shape, dtype, 4.0, 30.0)
        a[..., 0] = -np.inf  # masked-out elements, and (for a length-1 axis) rows of only -inf
        x = gpu.tensor(a)
        for axis in [*range(-len(shape), len(shape)), None]:
            out = poisoned(gpu, shape, dtype)
            gpu.ops.softmax(x, axis=axis, out=out)
            close_softmax(await out.numpy(), softmax_axis_ref(a.astype(np.float64), axis), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
async def test_reductions_read_strided_views_without_a_copy(gpu: gpud_client.Client, dtype: str) -> None:
    """Transposed and narrowed views (unaligned offsets included) go to the axis kernels as they are."""
    a = random((6, 9, 5), dtype, 2.0, 0.5)
    t = gpu.tensor(a)
    views = [
        (t.transpose(0, 2), a.transpose(2, 1, 0)),
        (t.narrow(1, 2, 5), a[:, 2:7]),
        (t.narrow(0, 1, 3), a[1:4]),  # contiguous at an odd offset: not bindable, read through its offset
        (t.permute(1, 0, 2).narrow(2, 1, 3), a.transpose(1, 0, 2)[:, :, 1:4]),
        (t.transpose(1, 2).narrow(0, 5, 1), a.swapaxes(1, 2)[5:6]),
    ]
    handles = (await gpu.stats())["session"]["handles"]
    kept: list[gpud_client.Tensor] = []
    results = 0
    for view, ref in views:
        for axis in [*range(-ref.ndim, ref.ndim), None]:
            if axis is None and not view.is_contiguous:
                continue  # axis=None flattens x: a view that does not flatten is refused (below)
            made = [gpu.ops.sum(view, axis), gpu.ops.max(view, axis=axis), gpu.ops.argmax(view, axis)]
            made.append(gpu.ops.softmax(view, axis=axis))
            check_reduction("sum", await made[0].numpy(), ref, axis)
            check_reduction("max", await made[1].numpy(), ref, axis)
            np.testing.assert_array_equal(await made[2].numpy(), ref.argmax(axis=axis))
            close_softmax(await made[3].numpy(), softmax_axis_ref(ref.astype(np.float64), axis), dtype)
            kept += made  # alive: a dropped result's handle is freed (or pooled)
            results += 4
    # the results are new tensors, the views none: the session holds t and the results only
    assert (await gpu.stats())["session"]["handles"] == handles + results


async def test_axis_reductions_say_what_they_cannot_take(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.ones((4, 6, 5), np.float32))
    mask = gpu.tensor(np.zeros(6, np.float32))
    scrambled = x.permute(1, 0, 2).narrow(1, 0, 3).transpose(0, 2)  # does not flatten
    seven = gpu.empty((2,) * 8).permute(7, 6, 5, 4, 3, 2, 1, 0)  # 7 axes besides the one reduced, unmergeable
    cases: list[tuple[str, Any]] = [
        ("^sum: axis 3 is out of range for 3 dimensions of x", lambda: gpu.ops.sum(x, 3)),
        ("^argmax: axis -4 is out of range", lambda: gpu.ops.argmax(x, axis=-4)),
        (r"^softmax: a mask is taken over the last axis only", lambda: gpu.ops.softmax(x, mask, axis=1)),
        (
            r"^max: x is a view whose axes other than 0 take 7 strides; at most 6: call gpu\.ops\.contiguous\(x\)",
            lambda: gpu.ops.max(seven, 0),
        ),
        (
            r"^mean: axis=None: x is a non-contiguous view .* gpu\.ops\.contiguous\(x\)",
            lambda: gpu.ops.mean(scrambled, None),
        ),
        ("^sum: axis 1 of x .* is empty", lambda: gpu.ops.sum(x.narrow(1, 0, 0), 1)),
        ("^sum: axis 0 of x is 70000 long", lambda: gpu.ops.sum(gpu.empty((70_000, 2)), 0)),
        (r"^sum: out is \[5, 4\], x without axis 1 is \[4, 5\]", lambda: gpu.ops.sum(x, 1, out=gpu.empty((5, 4)))),
    ]
    for message, call in cases:
        with pytest.raises(InvalidArgument, match=message):
            call()
    # no outputs: an empty result, nothing run
    assert (await gpu.ops.sum(x.narrow(0, 0, 0), 1).numpy()).shape == (0, 5)
    # A client that skips the library's checks: the daemon applies the same rule.
    u32 = gpud_client.u32
    out = gpu.empty((4, 5))
    view = geometry(_info(x), 1)
    n, length, inner, offset, s_length, *others = view
    for forged, message in [
        ([n, length + 1, inner, 0, offset, s_length, *others], "describes no axis"),  # reads past x
        ([n, length, inner, 0, offset + 1, s_length, *others], "describes no axis"),
        ([n, length, inner, 0, offset, s_length, *others[:-1], 31], "describes no axis"),
        ([n, length, inner, 3, offset, s_length, *others], "unknown reduction"),
    ]:
        gpu.dispatch(gpu.ops._kernel("reduce_axis_f32"), 1, [x, out, *(u32(v) for v in forged)])
        with pytest.raises(InvalidArgument, match=message):
            await out.numpy()
    gpu.dispatch(gpu.ops._kernel("reduce_axis_f32"), 1, [x, out, *(u32(v) for v in [*view[:3], 0, *view[3:]])])
    np.testing.assert_array_equal(await out.numpy(), np.full((4, 5), 6.0, np.float32))


def test_the_axis_rule_checks_the_view_passed_against_x() -> None:
    """Checked without a device: the kernels read x's tensor through the scalars, so they must be x's."""
    from gpud_protocol.ops.reduce_axis import MAX_AXIS_LENGTH

    spec = KERNELS["softmax_axis_f16"]
    x = TensorInfo("float16", (3, 4, 5), 7, (1, 15, 3))  # a permuted view, seven elements in
    pad = [1, 1, 1, 1, 0, 0, 0, 0]
    # (n, length, inner, offset, s_length), then the other axes (3, 5) with strides (1, 3), padded
    assert geometry(x, 1) == [15, 4, 5, 7, 15, *pad[:4], 3, 5, *pad[4:], 1, 3]
    assert geometry(TensorInfo("float32", (3, 4, 5)), 2) == [12, 5, 1, 0, 1, *pad[:4], 1, 12, *pad[4:], 0, 5]
    spec.verify([x, TensorInfo("float16", (3, 4, 5))], geometry(x, 1))
    for bad in ([16, *geometry(x, 1)[1:]], [*geometry(x, 1)[:-1], 4], [*geometry(x, 1)[:3], 8, *geometry(x, 1)[4:]]):
        with pytest.raises(OpError, match="describes no axis"):
            spec.verify([x, TensorInfo("float16", (3, 4, 5))], bad)
    with pytest.raises(OpError, match="out is a view starting at byte 2"):
        spec.verify([x, TensorInfo("float16", (3, 4, 5), 1)], geometry(x, 1))
    long = TensorInfo("float32", (2, MAX_AXIS_LENGTH + 1, 1))
    with pytest.raises(OpError, match="65535"):
        KERNELS["argmax_axis_f32"].verify([long, TensorInfo("int32", (2, 1))], geometry(long, 1))


async def test_axis_reductions_record_into_replay_graphs(gpu: gpud_client.Client) -> None:
    g = gpu.graph("axis-reductions")
    x = g.input("x", (3, 5, 7), "float32")
    g.output("s", gpu.ops.sum(x, 0, graph=g))
    g.output("m", gpu.ops.max(x, axis=None, graph=g))
    g.output("i", gpu.ops.argmax(x, 1, graph=g))
    g.output("p", gpu.ops.softmax(x, axis=1, graph=g))
    g.output("q", gpu.ops.softmax(x, axis=None, graph=g))
    step = await g.build()
    for _ in range(2):
        a = random((3, 5, 7), "float32", 2.0)
        got = await step.replay(x=a)
        check_reduction("sum", got["s"], a, 0)
        check_reduction("max", got["m"], a, None)
        np.testing.assert_array_equal(got["i"], a.argmax(axis=1))
        close_softmax(got["p"], softmax_axis_ref(a.astype(np.float64), 1), "float32")
        close_softmax(got["q"], softmax_axis_ref(a.astype(np.float64), None), "float32")

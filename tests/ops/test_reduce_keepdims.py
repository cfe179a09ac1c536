"""numpy's axes: keepdims=True keeps the reduced axis (every axis, for axis=None) with size 1 in sum,
mean, max and argmax, so the result broadcasts back against x (x - x.mean(-1, keepdims=True)); sum,
mean and max take a tuple of axes; into `out=` of numpy's shape, and in a replay graph."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument

OPS = ["sum", "mean", "max", "argmax", "min", "argmin"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op", OPS)
async def test_keepdims_is_numpys(gpu: gpud_client.Client, op: str, dtype: str) -> None:
    x = np.random.default_rng().standard_normal((3, 4, 300)).astype(dtype)
    t = gpu.tensor(x)
    for axis in (None, 0, 1, 2, -1, -3):
        got = await getattr(gpu.ops, op)(t, axis=axis, keepdims=True).numpy()
        want = getattr(np, op)(x.astype(np.float64), axis=axis, keepdims=True)
        assert got.shape == want.shape, (axis, got.shape, want.shape)
        if op == "argmax":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-4 * np.abs(x).sum(), err_msg=f"axis {axis}")


async def test_a_kept_mean_broadcasts_back_into_out_and_graphs(gpu: gpud_client.Client) -> None:
    x = np.random.default_rng().standard_normal((5, 8)).astype(np.float32)
    t = gpu.tensor(x)
    centred = gpu.ops.sub(t, gpu.ops.mean(t, axis=-1, keepdims=True))
    np.testing.assert_allclose(await centred.numpy(), x - x.mean(-1, keepdims=True), atol=1e-6)
    out = gpu.tensor(np.full((5, 1), np.nan, np.float32))
    assert gpu.ops.max(t, axis=1, keepdims=True, out=out) is out
    np.testing.assert_array_equal(await out.numpy(), x.max(1, keepdims=True))
    with pytest.raises(InvalidArgument, match=r"out is \[5\], the result is \[5, 1\]") as info:
        gpu.ops.sum(t, axis=1, keepdims=True, out=gpu.empty((5,)))
    assert info.value.op == "sum"

    g = gpu.graph("kept")
    v = g.input("v", (5, 8), "float32")
    g.output("c", gpu.ops.sub(v, gpu.ops.mean(v, axis=-1, keepdims=True, graph=g), graph=g))
    step = await g.build()
    got = await step.replay(v=x)
    np.testing.assert_allclose(got["c"], x - x.mean(-1, keepdims=True), atol=1e-6)


@pytest.mark.parametrize("op", ["sum", "mean", "max"])
async def test_a_tuple_of_axes_is_numpys(gpu: gpud_client.Client, op: str) -> None:
    x = np.random.default_rng().standard_normal((3, 4, 5, 6)).astype(np.float32)
    t = gpu.tensor(x)
    for axes in [(0, 1), (1, 3), (0, 2, 3), (-1, -2), (3, 0), (0, 1, 2, 3), (2,)]:
        for keepdims in (False, True):
            got = await getattr(gpu.ops, op)(t, axis=axes, keepdims=keepdims).numpy()
            want = getattr(np, op)(x.astype(np.float64), axis=axes, keepdims=keepdims)
            assert got.shape == want.shape, (axes, keepdims)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=f"axis {axes}")
    g = gpu.graph(f"axes-{op}")
    v = g.input("v", x.shape, "float32")
    g.output("r", getattr(gpu.ops, op)(v, axis=(0, 2), keepdims=True, graph=g))
    got = (await (await g.build()).replay(v=x))["r"]
    np.testing.assert_allclose(got, getattr(np, op)(x.astype(np.float64), axis=(0, 2), keepdims=True), atol=1e-4)
    refused: list[tuple[Any, str]] = [
        ((1, 1), "once"),
        ((), "at least one"),
        ((0, 9), "out of range"),
        ((0, 1.5), "axis"),
    ]
    for axes, message in refused:
        with pytest.raises(InvalidArgument, match=message) as info:
            getattr(gpu.ops, op)(t, axis=axes)
        assert info.value.op == op
    with pytest.raises(InvalidArgument, match=r"axis is \(0, 1\): an int or None") as info:
        gpu.ops.argmax(t, axis=(0, 1))  # type: ignore[arg-type]  # numpy's argmax takes one axis too


@pytest.mark.parametrize("dtype", ["float32", "float16"])
async def test_min_and_argmin_are_numpys(gpu: gpud_client.Client, dtype: str) -> None:
    x = np.random.default_rng().integers(-3, 4, (3, 4, 300)).astype(dtype)  # ties everywhere
    x[0, 1, 7] = np.nan  # NaN is the minimum of its row, as numpy's min says
    t = gpu.tensor(x)
    for axis in (None, 0, 1, -1, (0, 2)):
        for keepdims in (False, True):
            got = await gpu.ops.min(t, axis=axis, keepdims=keepdims).numpy()
            np.testing.assert_array_equal(got, np.min(x.astype(np.float32), axis=axis, keepdims=keepdims))
            if not isinstance(axis, tuple):
                got = await gpu.ops.argmin(t, axis=axis, keepdims=keepdims).numpy()
                np.testing.assert_array_equal(got, np.argmin(x, axis=axis, keepdims=keepdims), f"axis {axis}")


def test_the_rules_take_the_kept_shape_and_no_other() -> None:
    """Checked without a device: keepdims needs no view of the result, since the kernels write x's shape
    with the axis as 1 as they write it without (the same dense elements); any other shape is refused."""
    from gpud_protocol.ops import KERNELS, OpError, TensorInfo
    from gpud_protocol.ops.reduce_axis import geometry

    x = TensorInfo("float32", (2, 3, 4))
    KERNELS["reduce_f32"].verify([x, TensorInfo("float32", (2, 3, 1))], [6, 4, 0])
    KERNELS["argmax_f32"].verify([x, TensorInfo("int32", (2, 3, 1))], [6, 4])
    KERNELS["reduce_axis_f32"].verify(
        [x, TensorInfo("float32", (2, 1, 4))], [*geometry(x, 1)[:3], 0, *geometry(x, 1)[3:]]
    )
    KERNELS["argmax_axis_f32"].verify([x, TensorInfo("int32", (2, 1, 4))], geometry(x, 1))
    with pytest.raises(OpError, match=r"out is \[2, 1, 3\], x's leading axes are \[2, 3\]"):
        KERNELS["reduce_f32"].verify([x, TensorInfo("float32", (2, 1, 3))], [6, 4, 0])
    with pytest.raises(OpError, match=r"out is \[1, 2, 4\], x without axis 1 is \[2, 4\]"):
        KERNELS["argmax_axis_f32"].verify([x, TensorInfo("int32", (1, 2, 4))], geometry(x, 1))


async def test_a_kept_result_is_one_tensor_not_a_view(gpu: gpud_client.Client) -> None:
    t = gpu.tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    for op in ("sum", "mean", "max", "argmax"):
        for axis in (0, 1, -1):
            kept = getattr(gpu.ops, op)(t, axis=axis, keepdims=True)
            assert not kept.is_view, (op, axis)
            want = getattr(np, op)(np.arange(24, dtype=np.float64).reshape(2, 3, 4), axis=axis, keepdims=True)
            np.testing.assert_array_equal(await kept.numpy(), want)

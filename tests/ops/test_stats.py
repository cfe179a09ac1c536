"""var and std as numpy's (gpud_client.ops.stats): population variance by default, ddof, any axis or
tuple of axes or None, keepdims, out=, float16 and bfloat16 input (float32 out), strided views, in a
replay graph; eager calls leave no temporary behind; refusals name the op."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument

AXES: list[Any] = [-1, 0, 1, 2, -2, None, (0, 2), (1, 2), (0, 1, 2), (-1, 0), [0, 1]]


def close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == np.float32, (what, got.shape, want.shape, got.dtype)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("op", ["var", "std"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
async def test_var_and_std_are_numpys(gpu: gpud_client.Client, op: str, dtype: str) -> None:
    x = (np.random.default_rng().standard_normal((3, 4, 50)) * 2 + 5).astype(dtype)
    t = gpu.tensor(x)
    wide = x.astype(np.float64)
    for axis in AXES:
        for keepdims in (False, True):
            want = getattr(np, op)(wide, axis=None if axis is None else tuple(np.atleast_1d(axis)), keepdims=keepdims)
            close(await getattr(gpu.ops, op)(t, axis, keepdims=keepdims).numpy(), want, f"axis {axis} {keepdims}")
    for ddof in (1, 2, 0.5):
        got = await getattr(gpu.ops, op)(t, axis=1, ddof=ddof).numpy()
        close(got, getattr(np, op)(wide, axis=1, ddof=ddof), f"ddof {ddof}")
    close(await getattr(gpu.ops, op)(t).numpy(), getattr(np, op)(wide, axis=-1), "the default axis, the last")


async def test_picogpts_layer_norm_and_views(gpu: gpud_client.Client) -> None:
    x = np.random.default_rng().standard_normal((6, 32)).astype(np.float32)
    t = gpu.tensor(x)
    mean = gpu.ops.mean(t, axis=-1, keepdims=True)
    variance = gpu.ops.var(t, axis=-1, keepdims=True)
    normed = (t - mean) / gpu.ops.sqrt(variance + 1e-5)
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(await normed.numpy(), want, rtol=1e-4, atol=1e-5)
    for view, host in [(t.T, x.T), (t[1::2, 3:20], x[1::2, 3:20]), (t.reshape(3, 2, 32).permute(2, 0, 1), None)]:
        host = x.reshape(3, 2, 32).transpose(2, 0, 1) if host is None else host
        close(await gpu.ops.var(view, axis=0).numpy(), host.astype(np.float64).var(axis=0), "a view")
        close(await gpu.ops.std(view, axis=(0, -1), ddof=1).numpy(), host.astype(np.float64).std((0, -1), ddof=1), "")


async def test_bfloat16_out_and_degrees_of_freedom(gpu: gpud_client.Client) -> None:
    x = np.random.default_rng().integers(-8, 8, (5, 7)).astype(np.float32)  # exact in bfloat16
    t = gpu.tensor(x, dtype="bfloat16")
    close(await gpu.ops.std(t, axis=0).numpy(), x.astype(np.float64).std(0), "bfloat16")
    out = gpu.tensor(np.full((1, 7), np.nan, np.float32))
    assert gpu.ops.var(t, axis=0, keepdims=True, out=out) is out
    close(await out.numpy(), x.astype(np.float64).var(0, keepdims=True), "out=")
    assert gpu.ops.std(t, axis=0, ddof=1, keepdims=True, out=out) is out
    close(await out.numpy(), x.astype(np.float64).std(0, ddof=1, keepdims=True), "out=, std")
    rows = gpu.tensor(np.array([[1.0, 3.0], [2.0, 2.0]], np.float32))
    with np.errstate(divide="ignore", invalid="ignore"), pytest.warns(RuntimeWarning):
        want = np.var(np.array([[1.0, 3.0], [2.0, 2.0]]), axis=-1, ddof=2)  # N - ddof = 0: numpy warns
    np.testing.assert_array_equal(await gpu.ops.var(rows, ddof=2).numpy(), want.astype(np.float32))  # [inf, nan]


async def test_eager_calls_free_every_temporary(gpu: gpud_client.Client) -> None:
    """Each temporary is freed by the call, not left for Python to drop (which pools it at the next call)."""
    x = np.random.default_rng().standard_normal((4, 8, 16)).astype(np.float32)
    t = gpu.tensor(x)
    for op in ("var", "std"):
        for ddof in (0, 1):
            gpu.ops.sum(t).free()  # drains what was dropped before
            r = getattr(gpu.ops, op)(t.transpose(0, 2), axis=(0, 1), ddof=ddof)
            assert not gpu._pool.dropped, (op, ddof)
            want = getattr(np, op)(x.transpose(2, 1, 0).astype(np.float64), axis=(0, 1), ddof=ddof)
            close(await r.numpy(), want, f"{op} ddof {ddof}")
            r.free()


@pytest.mark.parametrize("op", ["var", "std"])
async def test_recorded_in_a_graph(gpu: gpud_client.Client, op: str) -> None:
    x = np.random.default_rng().standard_normal((5, 3, 24)).astype(np.float16)
    g = gpu.graph(f"moment-{op}")
    v = g.input("v", x.shape, "float16")
    g.output("last", getattr(gpu.ops, op)(v, graph=g))
    g.output("kept", getattr(gpu.ops, op)(v, axis=(0, 2), ddof=1, keepdims=True, graph=g))
    g.output("all", getattr(gpu.ops, op)(v, axis=None, graph=g))
    step = await g.build()
    for _ in range(2):
        x = np.random.default_rng().standard_normal(x.shape).astype(np.float16)
        got = await step.replay(v=x)
        wide = x.astype(np.float64)
        close(got["last"], getattr(np, op)(wide, axis=-1), "graph, last axis")
        close(got["kept"], getattr(np, op)(wide, axis=(0, 2), ddof=1, keepdims=True), "graph, kept")
        close(np.asarray(got["all"]), np.asarray(getattr(np, op)(wide)), "graph, every element")


@pytest.mark.parametrize("op", ["var", "std"])
async def test_refusals_name_the_op(gpu: gpud_client.Client, op: str) -> None:
    t = gpu.empty((3, 4))
    call = getattr(gpu.ops, op)
    cases: list[tuple[Any, str]] = [
        (lambda: call(gpu.empty((3, 4), "int32")), "x is int32"),
        (lambda: call(t, axis=2), "out of range"),
        (lambda: call(t, axis=(0, 0)), "once"),
        (lambda: call(t, axis=()), "at least one"),
        (lambda: call(t, axis=1.5), "axis"),
        (lambda: call(t, ddof=float("nan")), "ddof must be a finite number"),
        (lambda: call(t, ddof="1"), "ddof"),
        (lambda: call(gpu.empty((3, 0))), "empty"),
        (lambda: call(t, out=gpu.empty((4,))), r"out is float32 \[4\], the result float32 \[3\]"),
        (lambda: call(t, out=gpu.empty((3,), "float16")), "out is float16"),
        (lambda: call(np.ones((3, 4))), "numpy array"),
    ]
    for fn, message in cases:
        with pytest.raises(InvalidArgument, match=message) as info:
            fn()
        assert info.value.op == op

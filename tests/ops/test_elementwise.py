"""Elementwise ops against numpy in float64, on every backend: fresh random inputs, several sizes
(odd ones, and one past 65,535 workgroups so the grid folds), poisoned outputs, NaN never passes."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument

SHAPES = [(1,), (7,), (3, 5, 257), (1000,)]
BIG = (65_535 * 256 + 1000,)  # folds the grid into y
TOL = {"float32": 2e-6, "float16": 2e-3}  # relative to max(1, |ref|): float16 is stored rounded
erf = np.vectorize(math.erf)


def poisoned(gpu: gpud_client.Client, shape: tuple[int, ...], dtype: str) -> gpud_client.Tensor:
    """An output filled with NaN: an element the op does not write fails the check."""
    return gpu.tensor(np.full(shape, np.nan, dtype))


def close(got: np.ndarray, ref: np.ndarray, dtype: str) -> None:
    got64 = got.astype(np.float64)
    assert not np.isnan(got64).any(), "NaN (an unwritten or poisoned element)"
    scale = np.maximum(1.0, np.abs(ref))
    assert np.all(np.abs(got64 - ref) <= TOL[dtype] * scale), np.max(np.abs(got64 - ref) / scale)


BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "silu_mul": lambda x, y: x / (1 + np.exp(-x)) * y,
}
UNARY: dict[str, Callable[[Any], Any]] = {
    "exp": np.exp,
    "rsqrt": lambda v: 1 / np.sqrt(v),
    "silu": lambda v: v / (1 + np.exp(-v)),
    "gelu": lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2))),
    "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v**3))),
    "tanh": np.tanh,
}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op", sorted(BINARY))
async def test_binary_ops_broadcast_over_leading_axes(gpu: gpud_client.Client, op: str, dtype: str) -> None:
    rng = np.random.default_rng()
    for shape in SHAPES:
        a = rng.standard_normal(shape).astype(dtype)
        b = rng.standard_normal(shape[-1:]).astype(dtype)  # broadcast over the leading axes
        if op == "div":  # each operand is a divisor once: away from zero, so float16 cannot overflow
            a = (np.where(a < 0, -1, 1) * (np.abs(a) + 0.5)).astype(dtype)
            b = (np.abs(b) + 0.5).astype(dtype)
        x, y = gpu.tensor(a), gpu.tensor(b)
        for first, second in ((x, y), (y, x)) if op in ("sub", "div", "silu_mul") else ((x, y),):
            out = poisoned(gpu, shape, dtype)
            getattr(gpu.ops, op)(first, second, out=out)
            ref = BINARY[op](*(a.astype(np.float64) if t is x else b.astype(np.float64) for t in (first, second)))
            close(await out.numpy(), ref, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op", sorted(UNARY))
async def test_unary_ops(gpu: gpud_client.Client, op: str, dtype: str) -> None:
    rng = np.random.default_rng()
    for shape in SHAPES:
        a = rng.standard_normal(shape) * 3
        if op == "rsqrt":
            a = np.abs(a) + 0.1
        if op == "exp" and dtype == "float16":
            a = np.clip(a, -10, 10)  # exp(11.1) is past float16's largest, 65504
        a = a.astype(dtype)
        out = poisoned(gpu, shape, dtype)
        if op == "gelu_tanh":
            gpu.ops.gelu(gpu.tensor(a), approximate="tanh", out=out)
        else:
            getattr(gpu.ops, op)(gpu.tensor(a), out=out)
        close(await out.numpy(), UNARY[op](a.astype(np.float64)), dtype)


async def test_scale_and_a_grid_past_65535_workgroups(gpu: gpud_client.Client) -> None:
    a = np.random.default_rng().standard_normal(BIG).astype(np.float32)
    out = poisoned(gpu, BIG, "float32")
    gpu.ops.scale(gpu.tensor(a), -1.5, out=out)
    close(await out.numpy(), a.astype(np.float64) * -1.5, "float32")


async def test_casts_round_to_nearest(gpu: gpud_client.Client) -> None:
    a = (np.random.default_rng().standard_normal((33, 65)) * 100).astype(np.float32)
    half = gpu.ops.cast(gpu.tensor(a), "float16")
    np.testing.assert_array_equal(await half.numpy(), a.astype(np.float16))
    back = gpu.ops.cast(half, "float32")
    np.testing.assert_array_equal(await back.numpy(), a.astype(np.float16).astype(np.float32))


async def test_mismatches_are_typed_errors_in_the_client_and_in_the_daemon(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.ones((4, 5), np.float32))
    with pytest.raises(InvalidArgument, match="broadcast"):
        gpu.ops.add(x, gpu.tensor(np.ones(4, np.float32)))
    with pytest.raises(InvalidArgument, match="dtype"):
        gpu.ops.add(x, gpu.tensor(np.ones(5, np.float16)))
    with pytest.raises(InvalidArgument, match="cast"):
        gpu.ops.cast(x, "int32")
    # a client that skips the library's checks: the daemon applies the same rule
    k = gpu.ops._kernel("binary_f32")
    gpu.dispatch(k, 1, [x, x, x, gpud_client.u32(3), gpud_client.u32(20), gpud_client.u32(20), gpud_client.u32(0)])
    with pytest.raises(InvalidArgument, match="binary") as info:
        await x.numpy()
    assert info.value.op == "dispatch"


async def test_errors_of_an_op_name_the_op_called(gpu: gpud_client.Client, address: str) -> None:
    """Regression: `gpu.ops.add(x, y, out=ro)` with a read-only resident failed at the next await as
    `dispatch (op #104) failed: ... (declare writes=[...] when registering a kernel ...)`."""
    x = gpu.tensor(np.ones(8, np.float32))
    with pytest.raises(InvalidArgument, match="dtypes differ") as checked:
        gpu.ops.add(x, gpu.tensor(np.ones(8, np.float16)))
    assert checked.value.op == "add"
    name = f"ro-out-{id(gpu)}"
    async with gpud_client.connect(address) as publisher:
        publisher.publish(publisher.tensor(np.zeros(8, np.float32)), name, "ro")
        await publisher.sync()
        ro = await gpu.open(name)
        with pytest.raises(gpud_client.PermissionDenied, match="read-only") as at_call:
            gpu.ops.add(x, x, out=ro)  # the client knows: refused at the call, nothing sent
        assert at_call.value.op == "add" and at_call.value.seq is None
        np.testing.assert_array_equal(await x.numpy(), np.ones(8, np.float32))
        # A client that did not know (its handle claims read-write): the daemon refuses it, naming the op.
        ro.mode = "rw"
        gpu.ops.sub(x, x, out=ro)
        with pytest.raises(gpud_client.PermissionDenied) as later:
            await x.numpy()
        assert later.value.op == "sub"
        assert f"sub (binary_f32) writes its out argument, and that is read-only resident {name!r}" in str(later.value)
        np.testing.assert_array_equal(await ro.numpy(), np.zeros(8, np.float32))
        ro.free()
        publisher.unpublish(name)
        await publisher.sync()


async def test_ops_record_into_replay_graphs(gpu: gpud_client.Client) -> None:
    g = gpu.graph("ops")
    x = g.input("x", (300,), "float32")
    h = gpu.ops.silu(x, graph=g)
    y = gpu.ops.mul(h, x, graph=g)
    g.output("y", y)
    step = await g.build()
    a = np.random.default_rng().standard_normal(300).astype(np.float32)
    got = (await step.replay(x=a))["y"]
    close(got, a.astype(np.float64) ** 2 / (1 + np.exp(-a.astype(np.float64))), "float32")

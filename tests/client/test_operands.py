"""Operands that are no tensor: numbers in the elementwise ops become 0-d tensors of the other
operand's dtype (gpud_client.ops.constants: numpy's and torch's weak scalars), kept per client,
outside any scope, recorded into a graph as its own; anywhere else a number, and a numpy array
anywhere, is refused at the call naming the op and the argument (gpud_client.operands), never an
AttributeError or a numpy array's byte strides misread as a view's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument
from gpud_client.ops.constants import KEPT


async def test_numbers_in_elementwise_ops_are_numpys_weak_scalars(gpu: gpud_client.Client) -> None:
    x = ((np.arange(8) - 3.5) / 2).astype(np.float32)  # no zero (1 / x finite), exact in bfloat16
    t, h = gpu.tensor(x), gpu.tensor(x.astype(np.float16))
    cases: list[tuple[Any, np.ndarray]] = [
        (gpu.ops.add(t, 2.0), x + np.float32(2)),
        (gpu.ops.sub(1, t), np.float32(1) - x),
        (gpu.ops.div(1.0, t), np.float32(1) / x),
        (gpu.ops.maximum(t, np.float32(0.5)), np.maximum(x, np.float32(0.5))),
        (gpu.ops.mul(h, 3.0), x.astype(np.float16) * np.float16(3)),  # float16 stays float16
        (gpu.ops.where(gpu.tensor(x > 0), t, 0.0), np.where(x > 0, x, np.float32(0))),
        (gpu.ops.where(gpu.tensor(x > 0), -1, h), np.where(x > 0, np.float16(-1), x.astype(np.float16))),
    ]
    for got, want in cases:
        values = await got.numpy()
        assert values.dtype == want.dtype
        np.testing.assert_array_equal(values, want)
    b = gpu.tensor(x, dtype="bfloat16")  # exact in bfloat16, as are x + 0.5 and 2 x
    got = gpu.ops.add(b, 0.5)
    assert got.dtype_name == "bfloat16"
    np.testing.assert_array_equal(await got.numpy(), x + 0.5)
    g = gpu.graph("bf16-number")
    v = g.input("v", (8,), "bfloat16")
    g.output("o", gpu.ops.mul(v, 2.0, graph=g))
    np.testing.assert_array_equal((await (await g.build()).replay(v=x))["o"], 2 * x)


async def test_numbers_outlive_scopes_are_kept_bounded_and_recorded_by_graphs(gpu: gpud_client.Client) -> None:
    t = gpu.tensor(np.zeros(3, np.float32))
    async with gpu.scope():
        gpu.ops.add(t, 7.0)
    np.testing.assert_array_equal(await gpu.ops.add(t, 7.0).numpy(), 7)  # the scope did not free the 7
    for n in range(KEPT + 5):  # past the bound: the least recently used are freed, one at a time
        gpu.ops.add(t, float(n))
    np.testing.assert_array_equal(await gpu.ops.add(t, 0.0).numpy(), 0)  # made again
    assert len(gpu.ops._constants._kept) == KEPT

    g = gpu.graph("numbers")
    v = g.input("v", (3,), "float32")
    g.output("o", gpu.ops.mul(gpu.ops.add(v, 1.0, graph=g), 2.0, graph=g))
    step = await g.build()
    got = await step.replay(v=np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(got["o"], (np.arange(3) + 1) * 2)


async def test_what_is_no_tensor_is_refused_naming_the_op_and_argument(gpu: gpud_client.Client) -> None:
    t = gpu.tensor(np.arange(4, dtype=np.float32))
    host = np.ones(4, np.float32)
    cases: list[tuple[Callable[[], Any], str, str]] = [
        (lambda: gpu.ops.add(1.0, 2.0), "add", "x is the number 1.0, not a tensor"),
        (lambda: gpu.ops.add(t, 10**400), "add", "y is an integer of 1329 bits, past every float dtype"),
        (lambda: gpu.ops.add(t, host), "add", r"y is a numpy array \(host memory\)"),
        (lambda: gpu.ops.where(t, host, t), "where", "x is a numpy array"),
        (lambda: gpu.ops.matmul(t.reshape(2, 2), host.reshape(2, 2)), "matmul", "w is a numpy array"),
        (lambda: gpu.ops.matmul(t.reshape(2, 2), 2.0), "matmul", "w is the number 2.0"),
        (lambda: gpu.ops.sum(host), "sum", "x is a numpy array"),
        (lambda: gpu.ops.softmax(3.0), "softmax", "x is the number 3.0"),
        (lambda: gpu.ops.exp(host), "exp", "x is a numpy array"),
        (lambda: gpu.ops.cast([1.0], "float16"), "cast", "x is list, not a tensor"),
    ]
    for call, op, message in cases:
        with pytest.raises(InvalidArgument, match=message) as info:
            call()
        assert info.value.op == op, (op, info.value)
    np.testing.assert_array_equal(await t.numpy(), np.arange(4))  # the session goes on

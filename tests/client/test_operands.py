"""An operand that is no tensor (a Python or numpy number, a numpy array) is refused at the call with
an InvalidArgument naming the op and the argument (gpud_client.operands), never an AttributeError or
a misread numpy array (its strides are bytes, a view's are elements)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument


async def test_numbers_and_numpy_arrays_are_refused_naming_the_op_and_argument(gpu: gpud_client.Client) -> None:
    t = gpu.tensor(np.arange(4, dtype=np.float32))
    host = np.ones(4, np.float32)
    cases: list[tuple[Callable[[], Any], str, str]] = [
        (lambda: gpu.ops.add(t, 2.0), "add", "y is the number 2.0, not a tensor"),
        (lambda: gpu.ops.mul(3, t), "mul", "x is the number 3, not a tensor"),
        (lambda: gpu.ops.maximum(t, np.float32(1.5)), "maximum", "y is the number 1.5"),
        (lambda: gpu.ops.where(t, t, 0.0), "where", "y is the number 0.0"),
        (lambda: gpu.ops.add(t, host), "add", r"y is a numpy array \(host memory\)"),
        (lambda: gpu.ops.matmul(t.reshape(2, 2), host.reshape(2, 2)), "matmul", "w is a numpy array"),
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

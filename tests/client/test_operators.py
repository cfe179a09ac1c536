"""Python's operators on tensors (gpud_client.operators): each the op of gpu.ops of that name, numbers as
weak scalars, recorded into a graph from a recording's tensors; == and != stay identity; a numpy
array on the left defers to the tensor, whose op refuses host memory by name."""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument


async def test_operators_are_the_ops_of_their_names(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    x, w = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    tx, tw = gpu.tensor(x), gpu.tensor(w)
    cases = [
        ((tx @ tw + 1.0) * 2, (x @ w + 1) * 2),
        (1 / (tx * tx + 2) - 0.5, 1 / (x * x + 2) - 0.5),
        (3 - tx / 4, 3 - x / 4),
        (-tx, -x),
        (abs(tx), np.abs(x)),
        (2.0 * tx + tx, 3 * x),
    ]
    for got, want in cases:
        np.testing.assert_allclose(await got.numpy(), want, rtol=1e-5, atol=1e-6)
    reflected = 0 < tx  # noqa: SIM300 (the reflected comparison is the point)
    for got, want in [(tx > 0, x > 0), (tx >= 0.5, x >= 0.5), (reflected, x > 0), (tx <= tx, x <= x)]:
        np.testing.assert_array_equal(await got.numpy(), want)
    assert tx == tx and tx != tw and tx in [tw, tx] and len({tx, tw, tx}) == 2  # identity, as a key
    with pytest.raises(InvalidArgument, match=r"add: x is a numpy array \(host memory\)"):
        x + tx  # numpy defers to the tensor's __radd__

    g = gpu.graph("operators")
    v = g.input("v", (3, 4), "float32")
    g.output("o", -((v @ tw) * 0.5 + 1.0))
    got = (await (await g.build()).replay(v=x))["o"]
    np.testing.assert_allclose(got, -((x @ w) * 0.5 + 1), rtol=1e-5, atol=1e-6)


async def test_matmul_of_a_session_tensor_takes_every_kind_of_operand(gpu: gpud_client.Client) -> None:
    """`Tensor.__matmul__` sends two session tensors straight to the op; anything else goes the operators'
    way: a recording's tensor records the product, host memory is refused by the op's own check."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((2, 4)).astype(np.float32)
    tx, tw = gpu.tensor(x), gpu.tensor(w)
    np.testing.assert_allclose(await (tx @ tw.T).numpy(), x @ w.T, rtol=1e-5, atol=1e-6)
    with pytest.raises(InvalidArgument, match=r"matmul: .*numpy array \(host memory\)"):
        tx @ w.T
    g = gpu.graph("session-at-recording")
    u = g.input("u", (4, 2), "float32")
    g.output("o", tx @ u)  # the session tensor on the left, the recording's on the right
    got = (await (await g.build()).replay(u=np.ascontiguousarray(w.T)))["o"]
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-5, atol=1e-6)

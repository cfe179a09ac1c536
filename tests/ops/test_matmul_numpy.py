"""matmul with numpy.matmul's other shapes (gpud_client.ops.matmul_forms.numpy_forms): a 1-D x or w, batch
axes past one, a batch of one broadcast against many; into numpy's shape, `out=` of that shape, in a
replay graph; and what gpud does not broadcast, refused naming matmul."""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument
from gpud_client.ops.matmul_forms import numpy_forms
from gpud_protocol.ops import OpError

# (x's shape, w's shape as (.., K, N)): every one numpy.matmul takes
SHAPES = [
    ((8,), (8, 5)),
    ((4, 8), (8,)),
    ((8,), (8,)),
    ((8,), (3, 8, 5)),
    ((2, 4, 8), (8,)),
    ((1, 4, 8), (3, 8, 5)),
    ((3, 4, 8), (1, 8, 5)),
    ((2, 3, 4, 8), (2, 3, 8, 5)),
    ((2, 3, 4, 8), (8, 5)),
    ((4, 8), (2, 3, 8, 5)),
    ((1, 1, 4, 8), (3, 8, 5)),
    ((3, 4, 8), (1, 1, 8, 5)),
]


def transposed(w: np.ndarray) -> np.ndarray:
    """w as torch Linear's weight: (.., N, K); a 1-D w stays as it is."""
    return w if w.ndim == 1 else np.ascontiguousarray(np.swapaxes(w, -1, -2))


@pytest.mark.parametrize("wt", [False, True])
def test_numpy_forms(wt: bool) -> None:
    for xs, ws in SHAPES:
        w_shape = transposed(np.zeros(ws)).shape if wt else ws
        x_form, w_form, out_form, shape = numpy_forms(xs, w_shape, wt)
        assert shape == np.matmul(np.zeros(xs), np.zeros(ws)).shape
        assert np.prod(x_form) == np.prod(xs) and np.prod(w_form) == np.prod(ws) and np.prod(out_form) == np.prod(shape)
        assert len(x_form) in (2, 3) and len(w_form) in (2, 3)
    with pytest.raises(OpError, match=r"batch axes \[2, 1\] of x and \[3\] of w"):
        numpy_forms((2, 1, 4, 8), (3, 8, 5), False)
    with pytest.raises(OpError, match="no 0-d operand"):
        numpy_forms((), (8, 5), False)


@pytest.mark.parametrize("wt", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
async def test_matmul_takes_numpy_shapes(gpu: gpud_client.Client, wt: bool, dtype: str) -> None:
    rng = np.random.default_rng()
    for xs, ws in SHAPES:
        x, w = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)
        ref = np.matmul(x.astype(np.float64), w.astype(np.float64))
        got = await gpu.ops.matmul(gpu.tensor(x), gpu.tensor(transposed(w) if wt else w), transpose_w=wt).numpy()
        assert got.shape == ref.shape and got.dtype == np.dtype(dtype), (xs, ws, got.shape)
        tol = 1e-5 if dtype == "float32" else 2e-3
        scale = np.matmul(np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)))
        assert np.all(np.abs(got - ref) <= tol * (scale + np.abs(ref))), (xs, ws)


async def test_out_bias_and_graphs_take_numpy_shapes(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 4, 8), (8, 5), (5,)))
    want = x @ w + b
    out = gpu.tensor(np.full(want.shape, np.nan, np.float32))
    assert gpu.ops.matmul(gpu.tensor(x), gpu.tensor(w), bias=gpu.tensor(b), out=out) is out
    np.testing.assert_allclose(await out.numpy(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(InvalidArgument, match=r"matmul: out is \[2, 12, 5\], the product is \[2, 3, 4, 5\]"):
        gpu.ops.matmul(gpu.tensor(x), gpu.tensor(w), out=gpu.empty((2, 12, 5)))

    g = gpu.graph("numpy-matmul")
    v = g.input("v", (8,), "float32")
    g.output("y", gpu.ops.matmul(v, gpu.tensor(np.swapaxes(w, 0, 1).copy()), transpose_w=True, graph=g))
    step = await g.build()
    got = await step.replay(v=x[0, 0, 0])
    np.testing.assert_allclose(got["y"], x[0, 0, 0] @ w, rtol=1e-5, atol=1e-5)


async def test_a_transposed_w_is_read_in_place(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    q, k = rng.standard_normal((2, 3, 5, 8)).astype(np.float32), rng.standard_normal((2, 3, 7, 8)).astype(np.float32)
    scores = gpu.ops.matmul(gpu.tensor(q), gpu.tensor(k).transpose(-1, -2))  # q @ k.T, as torch users write it
    np.testing.assert_allclose(await scores.numpy(), q @ np.swapaxes(k, -1, -2), rtol=1e-5, atol=1e-5)
    w = rng.standard_normal((8, 6)).astype(np.float32)  # a Linear's weight seen as (K, N), asked as (N, K)
    got = gpu.ops.matmul(gpu.tensor(q), gpu.tensor(w).transpose(0, 1), transpose_w=True)
    np.testing.assert_allclose(await got.numpy(), q @ w, rtol=1e-5, atol=1e-5)


async def test_what_gpud_does_not_broadcast_is_refused_naming_matmul(gpu: gpud_client.Client) -> None:
    x, w = gpu.empty((2, 1, 4, 8)), gpu.empty((3, 8, 5))
    with pytest.raises(InvalidArgument, match=r"matmul: batch axes \[2, 1\] of x and \[3\] of w") as info:
        gpu.ops.matmul(x, w)
    assert info.value.op == "matmul"
    with pytest.raises(InvalidArgument, match="float32, float16 or bfloat16 operands, not x int32"):
        gpu.ops.matmul(gpu.empty((4,), "int32"), gpu.empty((4, 2)))  # the numpy path checks dtypes too
    with pytest.raises(InvalidArgument, match=r"matmul: .*K=8.* K=6"):
        gpu.ops.matmul(gpu.empty((2, 3, 4, 8)), gpu.empty((6, 5)))
    with pytest.raises(InvalidArgument, match=r"matmul: .*cannot be seen as"):  # batch axes that need a copy
        gpu.ops.matmul(gpu.empty((3, 2, 4, 8)).transpose(0, 1), gpu.empty((2, 3, 8, 5)))
    with pytest.raises(InvalidArgument, match=r"matmul: x is a non-contiguous view; call gpu.ops.contiguous"):
        gpu.ops.matmul(gpu.empty((2, 3, 8, 4)).transpose(-1, -2), gpu.empty((2, 3, 8, 5)))


async def test_a_transposed_operand_is_read_through_its_own_tensor(gpu: gpud_client.Client) -> None:
    """q @ k.T multiplies k itself in the other weight layout (no view made per call); a transpose of a
    view that is not a whole tensor's goes through a view of it, with the same result."""
    from gpud_client.ops.matmul import _swapped_back

    rng = np.random.default_rng()
    q, k = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal((6, 8)).astype(np.float32)
    tq, tk = gpu.tensor(q), gpu.tensor(k)
    assert _swapped_back(tk.T) is tk
    assert _swapped_back(tk.transpose(-1, -2)) is tk
    part = tk[:4]  # a view at the start of k (offsets elsewhere must be multiples of 256 bytes)
    swapped = _swapped_back(part.T)
    assert swapped is not tk and swapped.shape == (4, 8) and swapped.is_contiguous
    np.testing.assert_allclose(await (tq @ tk.T).numpy(), q @ k.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(await (tq @ part.T).numpy(), q @ k[:4].T, rtol=1e-5, atol=1e-5)

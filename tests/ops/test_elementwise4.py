"""ew_binary4 and ew_unary4, WebGPU's elementwise kernels of four floats a thread, against numpy in float64:
every float dtype for x, y and out (bfloat16 too), the broadcasts they take (same shape, a leading axis, a
size-1 inner axis, one element), 16-bit tensors whose last 8 bytes hold their last 4 elements, poisoned
outputs, which calls the client sends to them (and which to the generic kernels), and the rule. The
arithmetic, rounding and NaN rules themselves are test_elementwise.py's, whose calls mostly run these on
WebGPU.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument, u32
from gpud_protocol.ops import KERNELS, OpError, TensorInfo, grid_1d
from gpud_protocol.ops.broadcast import broadcast_layout
from gpud_protocol.ops.dtypes import DTYPES
from gpud_protocol.ops.elementwise import BINARY_OPS
from gpud_protocol.ops.elementwise4 import binary4_applies, unary4_applies
from ops.test_bfloat16 import bf
from ops.test_elementwise import BINARY, UNARY

FLOATS = ["float32", "float16", "bfloat16"]
TOL = {"float32": 2e-6, "float16": 2e-3, "bfloat16": 2**-8}  # relative to max(1, |ref|): the output's rounding
SHAPES = [  # (x, y): same shape (12 elements: a 16-bit tensor ends in the second half of a 16-byte word),
    ((12,), (12,)),  # a leading axis, a size-1 inner axis (one element for four), a short operand
    ((3, 5, 8), (5, 8)),
    ((4, 6, 4), (4, 6, 1)),
    ((4, 20), (4, 1)),
    ((1, 16), (3, 16)),
]


def webgpu_only(gpu: gpud_client.Client) -> None:
    if gpu.backend != "webgpu":
        pytest.skip("ew_binary4 and ew_unary4 are WebGPU's")


def draw(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Values exact in `dtype` (bfloat16's as float32), away from 0 (each operand divides once)."""
    a = rng.standard_normal(shape)
    a = np.where(a < 0, -1, 1) * (np.abs(a) + 0.5)
    return bf(a) if dtype == "bfloat16" else a.astype(dtype)


def tensor(gpu: gpud_client.Client, a: np.ndarray, dtype: str) -> gpud_client.Tensor:
    return gpu.tensor(a, dtype="bfloat16") if dtype == "bfloat16" else gpu.tensor(np.asarray(a, dtype))


def close(got: np.ndarray, ref: np.ndarray, dtype: str) -> None:
    got64 = got.astype(np.float64)
    assert got.shape == ref.shape and not np.isnan(got64).any(), "NaN (an unwritten or poisoned element)"
    error = np.abs(got64 - ref) / np.maximum(1.0, np.abs(ref))
    assert np.all(error <= TOL[dtype]), error.max()


@pytest.mark.parametrize("x_dtype", FLOATS)
@pytest.mark.parametrize("y_dtype", FLOATS)
async def test_every_float_mix_and_broadcast(gpu: gpud_client.Client, x_dtype: str, y_dtype: str) -> None:
    webgpu_only(gpu)
    rng = np.random.default_rng()
    for op, fn in BINARY.items():
        for xs, ys in SHAPES:
            x, y = draw(rng, xs, x_dtype), draw(rng, ys, y_dtype)
            ref = fn(x.astype(np.float64), y.astype(np.float64))
            for out_dtype in FLOATS:
                out = tensor(gpu, np.full(ref.shape, np.nan, np.float32), out_dtype)
                getattr(gpu.ops, op)(tensor(gpu, x, x_dtype), tensor(gpu, y, y_dtype), out=out)
                close(await out.numpy(), ref, out_dtype)
    assert set(gpu.ops._kernels) == {"ew_binary4"}


@pytest.mark.parametrize("dtype", FLOATS)
async def test_unary_ops_into_every_float_dtype(gpu: gpud_client.Client, dtype: str) -> None:
    webgpu_only(gpu)
    rng = np.random.default_rng()
    for op, fn in UNARY.items():
        x = draw(rng, (5, 12), dtype)
        if op in ("rsqrt", "sqrt", "log"):  # their domain (draw keeps |x| >= 0.5)
            x = np.abs(x)
        ref = fn(x.astype(np.float64))
        for out_dtype in FLOATS:
            out = tensor(gpu, np.full(ref.shape, np.nan, np.float32), out_dtype)
            if op == "gelu_tanh":
                gpu.ops.gelu(tensor(gpu, x, dtype), approximate="tanh", out=out)
            else:
                getattr(gpu.ops, op)(tensor(gpu, x, dtype), out=out)
            close(await out.numpy(), ref, out_dtype)
    assert set(gpu.ops._kernels) == {"ew_unary4"}


async def test_the_calls_that_go_to_the_generic_kernels(gpu: gpud_client.Client) -> None:
    """n not a multiple of 4, three merged axes, an inner axis not a multiple of 4, an operand whose bytes are
    no whole number of 8-byte words (one float32; three): ew_binary, ew_unary."""
    webgpu_only(gpu)
    rng = np.random.default_rng()
    cases = [((7,), (7,)), ((2, 3, 4), (2, 1, 4)), ((3, 6), (3, 1)), ((4, 6), (6,)), ((2, 4), (1,)), ((3, 8), (3, 1))]
    for xs, ys in cases:
        x, y = draw(rng, xs, "float16"), draw(rng, ys, "float32")
        got = await gpu.ops.mul(gpu.tensor(x), gpu.tensor(y)).numpy()
        close(got, x.astype(np.float64) * y, "float32")
    x = draw(rng, (3, 5), "float16")
    close(await gpu.ops.tanh(gpu.tensor(x)).numpy(), np.tanh(x.astype(np.float64)), "float16")
    assert set(gpu.ops._kernels) == {"ew_binary", "ew_unary"}


async def test_the_daemon_applies_the_rule(gpu: gpud_client.Client) -> None:
    """A client that skips the library's choice: ew_binary4 refuses an n off 4 and integer operands."""
    webgpu_only(gpu)
    kernel = gpu.ops._kernel("ew_binary4")
    f32 = DTYPES["float32"].code
    x, out = gpu.tensor(np.ones(6, np.float32)), gpu.empty((6,), "float32")
    lay = broadcast_layout((6,), (6,), (6,)).scalars()
    gpu.dispatch(kernel, grid_1d(2), [x, x, out, *map(u32, [6, BINARY_OPS["add"], *lay, f32, f32, f32])])
    with pytest.raises(InvalidArgument, match="multiple of 4"):
        await out.numpy()
    x8, out8 = gpu.tensor(np.ones(8, np.float32)), gpu.empty((8,), "float32")
    lay8 = broadcast_layout((8,), (8,), (8,)).scalars()
    gpu.dispatch(kernel, grid_1d(2), [x8, x8, out8, *map(u32, [8, BINARY_OPS["add"], *lay8, f32, f32, f32])])
    np.testing.assert_array_equal(await out8.numpy(), np.full(8, 2, np.float32))


def test_the_rule() -> None:
    check = KERNELS["ew_binary4"].check
    x, y, out = TensorInfo("float16", (3, 5, 8)), TensorInfo("bfloat16", (5, 8)), TensorInfo("float32", (3, 5, 8))
    codes = [DTYPES[t.dtype].code for t in (x, y, out)]
    lay = broadcast_layout(out.shape, x.shape, y.shape).scalars()
    check([x, y, out], [120, 0, *lay, *codes])
    assert binary4_applies(120, lay[0], lay[1:], codes, [120, 40])
    assert not binary4_applies(120, lay[0], lay[1:], [DTYPES["int32"].code, *codes[1:]], [120, 40])
    assert not binary4_applies(120, lay[0], lay[1:], codes, [120, 3])  # 6 bytes of y: not whole 8-byte words
    lay3 = broadcast_layout((2, 3, 4), (2, 1, 4), (2, 3, 4)).scalars()
    assert lay3[0] == 3 and not binary4_applies(24, lay3[0], lay3[1:], codes, [24, 8])
    with pytest.raises(OpError, match="multiple of 4"):
        odd = TensorInfo("float32", (3, 5, 6))
        check([odd, odd, odd], [90, 0, *broadcast_layout(odd.shape, odd.shape, odd.shape).scalars(), 0, 0, 0])
    unary = KERNELS["ew_unary4"].check
    unary([x, x], [120, 4, 0.0, 0.0, codes[0], codes[0]])
    with pytest.raises(OpError, match="multiple of 4"):
        unary([TensorInfo("float16", (7,))] * 2, [7, 4, 0.0, 0.0, codes[0], codes[0]])
    assert unary4_applies(8, codes[:2]) and not unary4_applies(6, codes[:2])

"""numpy's power (gpu.ops.power, `x ** y`): float32, float16 and bfloat16 operands of every mix against numpy
in float64, numpy broadcasting (shapes the generic kernels take, and on WebGPU ones ew_binary4 takes), every
float out=, poisoned; NaN exactly where numpy's is (a negative base to a non-integer exponent). C99 powf's
special values (NaN, infinities, signed zeros, +-1, odd and even integer exponents) as numpy's float32 power
gives them, signs of zeros and infinities included; the operators, numbers as weak scalars, a replay graph,
and the op's code and name in the protocol."""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.broadcast import broadcast_layout
from gpud_protocol.ops.dtypes import DTYPES
from gpud_protocol.ops.elementwise import BINARY_OPS
from ops.test_bfloat16 import bf
from ops.test_elementwise4 import tensor

FLOATS = ["float32", "float16", "bfloat16"]
# relative to |ref|: float32's own error (exp2 and log2, or one rounding a multiply), else the output's rounding
TOL = {"float32": 4e-6, "float16": 1e-3, "bfloat16": 4e-3}
SHAPES = [  # (x, y): odd sizes and three or more merged axes (ew_binary), and shapes ew_binary4 takes on WebGPU
    ((7,), (7,)),
    ((3, 5, 33), (33,)),
    ((4, 1, 3), (1, 5, 1)),
    ((2, 1, 3, 1, 5, 1), (1, 4, 1, 2, 1, 3)),
    ((12,), (12,)),
    ((3, 5, 8), (5, 8)),
    ((4, 20), (4, 1)),
    ((1, 16), (3, 16)),
]
BASES = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0]
EXPONENTS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.5, -0.5, 2.5, -2.5, 1e30]


def rounded(a: np.ndarray, dtype: str) -> np.ndarray:
    """a's values in dtype (bfloat16's as float32, as a bfloat16 tensor reads back)."""
    with np.errstate(over="ignore"):  # 1e30 is inf in float16
        return bf(a) if dtype == "bfloat16" else np.asarray(a).astype(dtype)


def draw(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, base: bool) -> np.ndarray:
    """Bases of either sign with magnitudes in [1/4, 4]; exponents half integers in [-4, 4], half reals in
    [-3, 3] (a negative base to those is NaN)."""
    if base:
        a = np.where(rng.random(shape) < 0.5, -1.0, 1.0) * 2.0 ** rng.uniform(-2, 2, shape)
    else:
        a = np.where(rng.random(shape) < 0.5, rng.integers(-4, 5, shape), rng.uniform(-3, 3, shape))
    return rounded(a, dtype)


def close(got: np.ndarray, ref: np.ndarray, dtype: str) -> None:
    """got against the float64 reference: NaN exactly where it has one, else within TOL of it."""
    got64 = got.astype(np.float64)
    assert got.shape == ref.shape
    np.testing.assert_array_equal(np.isnan(got64), np.isnan(ref), "NaN where numpy has none, or none where it has")
    finite = ~np.isnan(ref)
    error = np.abs(got64[finite] - ref[finite]) / np.abs(ref[finite])
    assert np.all(error <= TOL[dtype]), error.max()


@pytest.mark.parametrize("x_dtype", FLOATS)
@pytest.mark.parametrize("y_dtype", FLOATS)
async def test_power_broadcasts_and_mixes_as_numpy(gpu: gpud_client.Client, x_dtype: str, y_dtype: str) -> None:
    rng = np.random.default_rng()
    wider = x_dtype if x_dtype == y_dtype else "float32"
    for xs, ys in SHAPES + [(y, x) for x, y in SHAPES]:
        x, y = draw(rng, xs, x_dtype, True), draw(rng, ys, y_dtype, False)
        with np.errstate(invalid="ignore"):  # a negative base to a non-integer exponent
            ref = np.power(x.astype(np.float64), y.astype(np.float64))
        for out_dtype in FLOATS:
            out = tensor(gpu, np.full(ref.shape, np.nan, np.float32), out_dtype)  # poisoned
            assert gpu.ops.power(tensor(gpu, x, x_dtype), tensor(gpu, y, y_dtype), out=out) is out
            close(await out.numpy(), ref, out_dtype)
        made = gpu.ops.power(tensor(gpu, x, x_dtype), tensor(gpu, y, y_dtype))  # the wider dtype, numpy's shape
        assert (made.dtype_name, tuple(made.shape)) == (wider, ref.shape)
        close(await made.numpy(), ref, wider)
    if gpu.backend == "webgpu":  # both kernels: the generic one, and four floats a thread
        assert set(gpu.ops._kernels) == {"ew_binary", "ew_binary4"}


@pytest.mark.parametrize("dtype", FLOATS)
async def test_the_special_values_are_numpys_float32_power(gpu: gpud_client.Client, dtype: str) -> None:
    """Every base with every exponent, as an outer product (two broadcast axes) and flat (one axis, four
    elements a thread on WebGPU): NaN where numpy's is, zeros and infinities of numpy's signs, exact
    wherever the result is no finite number, or an integer or a power of 2 (+-1 too), close elsewhere."""
    x, y = rounded(np.array(BASES), dtype), rounded(np.array(EXPONENTS), dtype)
    with np.errstate(all="ignore"):
        want32 = np.power(x[:, None].astype(np.float32), y[None, :].astype(np.float32))
    want = rounded(want32, dtype)
    flat_x, flat_y = np.repeat(x, len(y)), np.tile(y, len(x))
    outer = gpu.ops.power(tensor(gpu, x[:, None], dtype), tensor(gpu, y[None, :], dtype))
    flat = gpu.ops.power(tensor(gpu, flat_x, dtype), tensor(gpu, flat_y, dtype))
    with np.errstate(invalid="ignore"):  # exact: an integer or a power of 2 (1 / 27 need not be: WGSL's division)
        exact = ~np.isfinite(want) | (np.round(want) == want) | (np.abs(np.frexp(want)[0]) == 0.5)
    for got in (await outer.numpy(), (await flat.numpy()).reshape(want.shape)):
        differ = (got != want) & ~(np.isnan(got) & np.isnan(want))
        wrong = [f"{x[i]} ** {y[j]}: {got[i, j]}, numpy {want[i, j]}" for i, j in np.argwhere(differ)]
        np.testing.assert_array_equal(got[exact], want[exact], "\n".join(wrong))
        np.testing.assert_array_equal(np.signbit(got[~np.isnan(want)]), np.signbit(want[~np.isnan(want)]))
        np.testing.assert_allclose(got[~exact], want[~exact], rtol=TOL[dtype])


async def test_the_operators_and_numbers(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    x = (2.0 ** rng.uniform(-2, 2, (5, 12)) * np.where(rng.random((5, 12)) < 0.5, -1, 1)).astype(np.float32)
    y = rng.uniform(-3, 3, 12).astype(np.float32)
    tx, ty, th = gpu.tensor(x), gpu.tensor(np.abs(y)), gpu.tensor(x.astype(np.float16))
    x64, h64 = x.astype(np.float64), x.astype(np.float16).astype(np.float64)
    square = await (tx**2).numpy()
    np.testing.assert_array_equal(square, x * x)  # numpy's x ** 2 is x * x, rounded once
    with np.errstate(invalid="ignore"):  # x ** 0.5 is NaN where x < 0
        cases = [
            (tx**3, x64**3, "float32"),
            (2.0**tx, 2.0**x64, "float32"),
            (th**-1, 1 / h64, "float16"),  # a number is of the tensor's dtype: float16 stays float16
            (gpu.ops.power(3, th), 3.0**h64, "float16"),
            (abs(tx) ** ty, np.abs(x64) ** np.abs(y.astype(np.float64)), "float32"),
            (gpu.ops.power(tx, 0.5), np.power(x64, 0.5), "float32"),
        ]
    for got, want, dtype in cases:
        assert got.dtype_name == dtype
        close(await got.numpy(), want, dtype)


async def test_numpy_arrays_and_integers_are_refused_naming_power(gpu: gpud_client.Client) -> None:
    t = gpu.tensor(np.ones(4, np.float32))
    with pytest.raises(InvalidArgument, match=r"power: x is a numpy array \(host memory\)"):
        np.ones(4, np.float32) ** t  # numpy defers to the tensor's __rpow__
    with pytest.raises(InvalidArgument, match="y is int32, not one of") as info:
        gpu.ops.power(t, gpu.tensor(np.ones(4, np.int32)))
    assert info.value.op == "power"


async def test_power_records_into_a_replay_graph(gpu: gpud_client.Client) -> None:
    g = gpu.graph("power")
    v = g.input("v", (3, 8), "float32")
    e = g.input("e", (8,), "float16")
    g.output("p", gpu.ops.power(v, e, graph=g))
    g.output("q", 2.0 ** (v**2))
    step = await g.build()
    rng = np.random.default_rng()
    a, b = rng.uniform(0.25, 2, (3, 8)).astype(np.float32), rng.uniform(-3, 3, 8).astype(np.float16)
    got = await step.replay(v=a, e=b)
    close(np.asarray(got["p"]), a.astype(np.float64) ** b.astype(np.float64), "float32")
    close(np.asarray(got["q"]), 2.0 ** (a.astype(np.float64) ** 2), "float32")


def test_the_op_code_is_16_and_unknown_codes_are_refused() -> None:
    assert BINARY_OPS["power"] == 16
    spec = KERNELS["ew_binary"]
    f32 = TensorInfo("float32", (4,))
    lay = broadcast_layout((4,), (4,), (4,)).scalars()
    codes = [DTYPES["float32"].code] * 3
    spec.verify([f32, f32, f32], [4, 16, *lay, *codes])
    assert spec.op_name([4, 16, *lay, *codes]) == "power"
    for unknown in (17, 99, 2**32 - 1):
        with pytest.raises(OpError, match=f"unknown binary op {unknown}"):
            spec.verify([f32, f32, f32], [4, unknown, *lay, *codes])
    with pytest.raises(OpError, match="out is bool"):  # power writes a float, never a bool
        spec.verify([f32, f32, TensorInfo("bool", (4,))], [4, 16, *lay, *codes[:2], DTYPES["bool"].code])

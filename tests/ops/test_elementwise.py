"""Elementwise ops against numpy in float64, on every backend: fresh random inputs, numpy broadcasting
(size-1 axes anywhere, missing leading axes, both sides at once, six alternating axis groups), float16
and float32 mixed, odd sizes (a float16 output's last word half full), one size past 65,535 workgroups
(the grid folds), poisoned outputs, NaN never passes where none is expected. Casts: test_casts.py."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument

SAME = [(7,), (3, 5, 257)]
PAIRS = [  # (x, y): numpy broadcasting, each pair also run the other way round
    ((5, 384), (1, 384)),
    ((2, 3, 4), (2, 3, 1)),
    ((3, 5, 257), (257,)),
    ((7,), (1,)),
    ((4, 1, 3), (1, 5, 1)),
    ((2, 1, 3, 1, 5, 1), (1, 4, 1, 2, 1, 3)),
]
MIXES = [("float32", "float32"), ("float16", "float16"), ("float32", "float16"), ("float16", "float32")]
BIG = (65_536 + 7, 257)  # past 65,535 * 256 threads: the grid folds into y
TOL = {"float32": 2e-6, "float16": 2e-3}  # relative to max(1, |ref|): float16 is stored rounded
erf = np.vectorize(math.erf)


def poisoned(gpu: gpud_client.Client, shape: tuple[int, ...], dtype: str) -> gpud_client.Tensor:
    """An output filled with NaN: an element the op does not write fails the check."""
    return gpu.tensor(np.full(shape, np.nan, dtype))


def close(got: np.ndarray, ref: np.ndarray, dtype: str, nan: np.ndarray | None = None) -> None:
    """got (of dtype) against the float64 reference; NaN exactly where `nan` says (nowhere by default)."""
    got64 = got.astype(np.float64)
    expected_nan = np.zeros(ref.shape, bool) if nan is None else nan
    assert got.shape == ref.shape
    assert np.array_equal(np.isnan(got64), expected_nan), "NaN where none belongs (or none where one does)"
    scale = np.maximum(1.0, np.abs(np.nan_to_num(ref)))
    error = np.abs(np.nan_to_num(got64) - np.nan_to_num(ref)) / scale
    assert np.all(error <= TOL[dtype]), error.max()


BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "silu_mul": lambda x, y: x / (1 + np.exp(-x)) * y,
    "maximum": np.maximum,
    "minimum": np.minimum,
}
UNARY: dict[str, Callable[[Any], Any]] = {
    "exp": np.exp,
    "rsqrt": lambda v: 1 / np.sqrt(v),
    "silu": lambda v: v / (1 + np.exp(-v)),
    "gelu": lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2))),
    "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v**3))),
    "tanh": np.tanh,
    "sqrt": np.sqrt,
    "log": np.log,
    "abs": np.abs,
    "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
    "negative": np.negative,
}


def operand(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, op: str) -> np.ndarray:
    a = rng.standard_normal(shape)
    if op == "div":  # each operand is a divisor once: away from zero, so float16 cannot overflow
        a = np.where(a < 0, -1, 1) * (np.abs(a) + 0.5)
    return a.astype(dtype)


@pytest.mark.parametrize("dtypes", MIXES, ids=["-".join(m) for m in MIXES])
@pytest.mark.parametrize("op", sorted(BINARY))
async def test_binary_ops_broadcast_and_mix_as_numpy(gpu: gpud_client.Client, op: str, dtypes: tuple[str, str]) -> None:
    rng = np.random.default_rng()
    wider = "float32" if "float32" in dtypes else "float16"
    for xs, ys in [(s, s) for s in SAME] + PAIRS + [(y, x) for x, y in PAIRS]:
        a, b = operand(rng, xs, dtypes[0], op), operand(rng, ys, dtypes[1], op)
        ref = BINARY[op](a.astype(np.float64), b.astype(np.float64))
        out = poisoned(gpu, ref.shape, wider)
        getattr(gpu.ops, op)(gpu.tensor(a), gpu.tensor(b), out=out)
        close(await out.numpy(), ref, wider)
    made = getattr(gpu.ops, op)(gpu.tensor(a), gpu.tensor(b))  # no out=: the wider dtype, numpy's shape
    assert (np.dtype(made.dtype).name, tuple(made.shape)) == (wider, ref.shape)
    close(await made.numpy(), ref, wider)


async def test_the_shapes_of_a_bert_model(gpu: gpud_client.Client) -> None:
    """Regression: `[5, 384] + [1, 384]` and `[2, 3, 4] * [2, 3, 1]` were refused ("one must end the
    other"), and float16 with float32 too ("dtypes differ")."""
    rng = np.random.default_rng()
    h, bias = rng.standard_normal((5, 384)).astype(np.float32), rng.standard_normal((1, 384)).astype(np.float16)
    got = await gpu.ops.add(gpu.tensor(h), gpu.tensor(bias)).numpy()
    close(got, h.astype(np.float64) + bias.astype(np.float64), "float32")
    x, w = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((2, 3, 1)).astype(np.float32)
    close(await gpu.ops.mul(gpu.tensor(x), gpu.tensor(w)).numpy(), x.astype(np.float64) * w, "float32")


async def test_maximum_and_minimum_propagate_nan(gpu: gpud_client.Client) -> None:
    a = np.array([1.0, np.nan, -2.0, np.nan, 0.0, -np.inf, 3.0], np.float32)
    b = np.array([np.nan, 1.0, 5.0, np.nan, -0.0, 2.0, np.inf], np.float16)
    for op, ref in (("maximum", np.maximum), ("minimum", np.minimum)):
        want = ref(a.astype(np.float64), b.astype(np.float64))
        got = await getattr(gpu.ops, op)(gpu.tensor(a), gpu.tensor(b)).numpy()
        assert np.array_equal(got, want.astype(np.float32), equal_nan=True), (op, got, want)


async def test_a_broadcast_past_65535_workgroups(gpu: gpud_client.Client) -> None:
    """Every kernel of the family computes its index as this one does (the grid folded into y)."""
    rng = np.random.default_rng()
    a, b = rng.standard_normal(BIG).astype(np.float32), rng.standard_normal(BIG[-1:]).astype(np.float32)
    out = poisoned(gpu, BIG, "float32")
    gpu.ops.sub(gpu.tensor(a), gpu.tensor(b), out=out)
    close(await out.numpy(), a.astype(np.float64) - b, "float32")


async def test_a_narrow_output_ending_inside_a_word_keeps_what_follows(gpu: gpud_client.Client) -> None:
    """A thread writes a whole 4-byte word of a float16 or int8 output: where the output (a view)
    ends inside one, the bytes after it are another tensor's and stay as they were."""
    a = np.arange(1, 8, dtype=np.float16)
    for dtype, length in (("float16", 7), ("int8", 5), ("uint8", 6)):
        whole = gpu.tensor(np.full(8, 99, dtype))
        gpu.ops.cast(gpu.tensor(a[:length]), dtype, out=whole.narrow(0, 0, length))
        want = np.concatenate([a[:length].astype(dtype), np.full(8 - length, 99, dtype)])
        np.testing.assert_array_equal(await whole.numpy(), want, err_msg=dtype)
    whole = gpu.tensor(np.full(8, 99, np.float16))
    gpu.ops.add(gpu.tensor(a), gpu.tensor(a[:1]), out=whole.narrow(0, 0, 7))
    np.testing.assert_array_equal(await whole.numpy(), np.append(a + a[0], np.float16(99)))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op", sorted(UNARY))
async def test_unary_ops(gpu: gpud_client.Client, op: str, dtype: str) -> None:
    rng = np.random.default_rng()
    for shape in [(1,), *SAME, (1000,)]:
        a = rng.standard_normal(shape) * 3
        if op in ("rsqrt", "sqrt", "log"):
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


async def test_unary_into_another_float_dtype(gpu: gpud_client.Client) -> None:
    a = (np.random.default_rng().standard_normal(1001) * 4).astype(np.float16)
    out = poisoned(gpu, a.shape, "float32")
    gpu.ops.exp(gpu.tensor(a), out=out)  # computed in float32 from the float16 input, not rounded to float16
    close(await out.numpy(), np.exp(a.astype(np.float64)), "float32")
    out = poisoned(gpu, a.shape, "float16")
    gpu.ops.scale(gpu.tensor(a.astype(np.float32)), -1.5, out=out)
    close(await out.numpy(), a.astype(np.float64) * -1.5, "float16")


async def test_the_edges_of_sqrt_log_abs_sigmoid_are_numpys(gpu: gpud_client.Client) -> None:
    x = np.array([-2.0, -0.0, 0.0, 1e-30, 0.5, 1.0, 2.0, 100.0, np.inf, -np.inf, np.nan], np.float32)
    t = gpu.tensor(x)
    with np.errstate(all="ignore"):
        for op in ("sqrt", "log", "abs", "sigmoid", "negative"):
            got = await getattr(gpu.ops, op)(t).numpy()
            want = UNARY[op](x.astype(np.float64)).astype(np.float32)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=op)  # NaN where numpy's is
            numbers = ~np.isnan(want)
            np.testing.assert_array_equal(np.signbit(got)[numbers], np.signbit(want)[numbers], err_msg=op)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
async def test_clamp_is_torch_clamp(gpu: gpud_client.Client, dtype: str) -> None:
    a = (np.random.default_rng().standard_normal(257) * 3).astype(dtype)
    a[[3, 100]] = np.nan
    x = gpu.tensor(a)
    a64 = a.astype(np.float64)
    for lo, hi in ((-1.0, 2.0), (None, 0.5), (-0.25, None), (1.0, -1.0)):  # min > max: max everywhere
        ref = a64 if lo is None else np.maximum(a64, lo)
        ref = ref if hi is None else np.minimum(ref, hi)
        out = poisoned(gpu, a.shape, dtype)
        gpu.ops.clamp(x, lo, hi, out=out)
        close(await out.numpy(), ref, dtype, nan=np.isnan(a))


COND_DTYPES = ["bool", "uint8", "int8", "int32", "int64", "float32", "float16"]


@pytest.mark.parametrize("cond_dtype", COND_DTYPES)
async def test_where_is_numpy_where(gpu: gpud_client.Client, cond_dtype: str) -> None:
    rng = np.random.default_rng()
    for (cs, xs, ys), (dx, dy) in zip(
        [((2, 1, 1, 7), (2, 3, 7, 7), (1,)), ((7,), (7,), (7,)), ((3, 1), (1, 257), (3, 257))], MIXES[1:], strict=True
    ):
        c = (rng.integers(-3, 3, cs) * (rng.random(cs) < 0.5)).astype(cond_dtype)  # about half zeros
        a, b = rng.standard_normal(xs).astype(dx), rng.standard_normal(ys).astype(dy)
        ref = np.where(c != 0, a.astype(np.float64), b.astype(np.float64))
        wider = "float32" if "float32" in (dx, dy) else "float16"
        out = poisoned(gpu, ref.shape, wider)
        gpu.ops.where(gpu.tensor(c), gpu.tensor(a), gpu.tensor(b), out=out)
        close(await out.numpy(), ref, wider)


async def test_where_tests_a_float_condition_by_value(gpu: gpud_client.Client) -> None:
    c = np.array([0.0, -0.0, np.nan, 1e-30, -np.inf, 2.0], np.float32)  # 1e-30: nonzero (a float32 subnormal)
    x, y = np.arange(6, dtype=np.float32) + 1, -np.arange(6, dtype=np.float32) - 1
    got = await gpu.ops.where(gpu.tensor(c), gpu.tensor(x), gpu.tensor(y)).numpy()
    np.testing.assert_array_equal(got, np.where(c != 0, x, y))


async def test_mismatches_are_typed_errors_in_the_client_and_in_the_daemon(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.ones((4, 5), np.float32))
    with pytest.raises(InvalidArgument, match=r"do not broadcast \(axis -1: sizes \[4, 5\]\)") as info:
        gpu.ops.add(x, gpu.tensor(np.ones(4, np.float32)))
    assert info.value.op == "add"
    with pytest.raises(InvalidArgument, match="y is int32, not one of") as info:
        gpu.ops.maximum(x, gpu.tensor(np.ones(5, np.int32)))
    assert info.value.op == "maximum"
    with pytest.raises(InvalidArgument, match="x is int64") as info:
        gpu.ops.where(x, gpu.tensor(np.ones(5, np.int64)), x)
    assert info.value.op == "where"
    with pytest.raises(InvalidArgument, match="at least one of min and max") as info:
        gpu.ops.clamp(x)
    assert info.value.op == "clamp"
    with pytest.raises(InvalidArgument, match="out is int32") as info:
        gpu.ops.exp(x, out=gpu.empty((4, 5), "int32"))
    assert info.value.op == "exp"
    # a client that skips the library's checks: the daemon applies the same rule
    k, u32 = gpu.ops._kernel("ew_binary"), gpud_client.u32
    y = gpu.tensor(np.ones(5, np.float32))
    wrong_layout = [20, 0, 1, 20, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0]  # as if y were (4, 5): it would be read past its end
    gpu.dispatch(k, 1, [x, y, x, *map(u32, wrong_layout)])
    with pytest.raises(InvalidArgument, match=r"binary \(ew_binary\): the broadcast layout") as info:
        await x.numpy()
    assert info.value.op == "dispatch"
    lying_dtype = [20, 0, 2, 4, 5, 1, 1, 1, 1, 0, 1, 0, 8, 0]  # y claimed int64: 8 bytes an element
    gpu.dispatch(k, 1, [x, y, x, *map(u32, lying_dtype)])
    with pytest.raises(InvalidArgument, match=r"y_dtype is 8, y is float32 \(code 0\)"):
        await x.numpy()


async def test_errors_of_an_op_name_the_op_called(gpu: gpud_client.Client, address: str) -> None:
    """Regression: `gpu.ops.add(x, y, out=ro)` with a read-only resident failed at the next await as
    `dispatch (op #104) failed: ... (declare writes=[...] when registering a kernel ...)`."""
    x = gpu.tensor(np.ones(8, np.float32))
    with pytest.raises(InvalidArgument, match="x is int32") as checked:
        gpu.ops.add(gpu.tensor(np.ones(8, np.int32)), x)
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
        kernel = {"webgpu": "ew_binary4", "cuda": "ew_binary16"}.get(gpu.backend, "ew_binary")  # wider threads
        assert f"sub ({kernel}) writes its out argument, and that is read-only resident {name!r}" in str(later.value)
        np.testing.assert_array_equal(await ro.numpy(), np.zeros(8, np.float32))
        ro.free()
        publisher.unpublish(name)
        await publisher.sync()


async def test_ops_record_into_replay_graphs(gpu: gpud_client.Client) -> None:
    g = gpu.graph("ops")
    x = g.input("x", (4, 300), "float32")
    bias = g.input("bias", (300,), "float16")
    h = gpu.ops.silu(x, graph=g)
    y = gpu.ops.maximum(gpu.ops.mul(h, x, graph=g), bias, graph=g)
    g.output("y", gpu.ops.cast(gpu.ops.where(y, y, bias, graph=g), "float16", graph=g))
    step = await g.build()
    rng = np.random.default_rng()
    a, b = rng.standard_normal((4, 300)).astype(np.float32), rng.standard_normal(300).astype(np.float16)
    got = (await step.replay(x=a, bias=b))["y"]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    y64 = np.maximum(a64**2 / (1 + np.exp(-a64)), b64)
    close(got, np.where(y64 != 0, y64, b64), "float16")


async def test_tanh_keeps_its_relative_precision_near_zero(gpu: gpud_client.Client) -> None:
    """Regression: lavapipe's tanh goes through exp near 0 (tanh(1e-5) was off by 0.8%: a bfloat16 test's
    random draw failed CI). gelu(approximate="tanh") shares it."""
    x = np.array([1e-5, -1e-5, 3e-4, -0.01, 0.1, 0.124, -0.126, 0.5, 3.0], np.float32)
    got = await gpu.ops.tanh(gpu.tensor(x)).numpy()
    np.testing.assert_allclose(got, np.tanh(x.astype(np.float64)), rtol=2e-6)
    assert np.signbit(await gpu.ops.tanh(gpu.tensor(np.array([-0.0], np.float32))).numpy()).all()

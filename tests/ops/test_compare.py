"""numpy's comparisons (greater, greater_equal, less, less_equal, equal, not_equal): float operands of
any mix, broadcast, numbers as weak scalars, a bool out; NaN compares false but for not_equal, -0.0
equals 0.0; odd sizes (a bool's last word shared with what follows), poisoned outputs; the rule
refuses any out but bool, in the client and in the daemon. numpy's logical ops (logical_and, _or,
_xor, _not) on operands of any dtype (nonzero is true, NaN too), a bool out."""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.dtypes import DTYPES
from gpud_protocol.ops.elementwise import COMPARISONS, LOGICAL

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5, 65504.0, 1e-8]


@pytest.mark.parametrize("op", list(COMPARISONS))
@pytest.mark.parametrize("dtypes", [("float32", "float32"), ("float16", "float32"), ("float16", "float16")])
async def test_comparisons_are_numpys(gpu: gpud_client.Client, op: str, dtypes: tuple[str, str]) -> None:
    rng = np.random.default_rng()
    a = rng.choice(SPECIAL, (3, 1, 13)).astype(dtypes[0])  # 13: the bool out ends inside a word
    b = rng.choice(SPECIAL, (5, 13)).astype(dtypes[1])
    want = getattr(np, op)(a.astype(np.float64), b.astype(np.float64))
    out = gpu.tensor(np.full(want.shape, 7, np.uint8).view(bool))  # poisoned: neither True nor False
    assert getattr(gpu.ops, op)(gpu.tensor(a), gpu.tensor(b), out=out) is out
    got = await out.numpy()
    assert got.dtype == np.dtype(bool)
    np.testing.assert_array_equal(got, want)
    fresh = await getattr(gpu.ops, op)(gpu.tensor(a), 1.0).numpy()  # a number: a's dtype
    np.testing.assert_array_equal(fresh, getattr(np, op)(a, a.dtype.type(1.0)))


async def test_a_comparison_feeds_where_and_records_into_a_graph(gpu: gpud_client.Client) -> None:
    x = np.array([-2.0, np.nan, 0.5, 3.0], np.float32)
    t = gpu.tensor(x)
    relu = await gpu.ops.where(gpu.ops.greater(t, 0.0), t, 0.0).numpy()
    np.testing.assert_array_equal(relu, np.where(x > 0, x, 0))
    g = gpu.graph("compare")
    v = g.input("v", (4,), "float32")
    g.output("m", gpu.ops.less_equal(v, 0.5, graph=g))
    got = (await (await g.build()).replay(v=x))["m"]
    np.testing.assert_array_equal(np.asarray(got, bool), x <= 0.5)


async def test_a_comparison_writes_bool_only(gpu: gpud_client.Client) -> None:
    t = gpu.tensor(np.ones(4, np.float32))
    with pytest.raises(InvalidArgument, match="a comparison or logical op writes bool") as info:
        gpu.ops.greater(t, t, out=gpu.empty((4,), "float32"))
    assert info.value.op == "greater"
    spec = KERNELS["ew_binary"]
    f32, flag = TensorInfo("float32", (4,)), TensorInfo("bool", (4,))
    layout = [1, 4, 1, 1, 1, 1, 1, 0, 0]
    codes = [DTYPES["float32"].code] * 2
    with pytest.raises(OpError, match="a comparison or logical op writes bool"):
        spec.verify([f32, f32, f32], [4, COMPARISONS["equal"], *layout, *codes, DTYPES["float32"].code])
    with pytest.raises(OpError, match="out is bool"):  # and arithmetic never writes one
        spec.verify([f32, f32, flag], [4, 0, *layout, *codes, DTYPES["bool"].code])
    spec.verify([f32, f32, flag], [4, COMPARISONS["equal"], *layout, *codes, DTYPES["bool"].code])


@pytest.mark.parametrize("op", list(LOGICAL))
async def test_logical_ops_are_numpys_on_every_dtype(gpu: gpud_client.Client, op: str) -> None:
    rng = np.random.default_rng()
    operands = [
        rng.random((3, 1, 9)) < 0.5,  # bool
        rng.choice([0.0, -0.0, np.nan, 1.5, -np.inf], (4, 9)).astype(np.float16),
        rng.integers(-2, 3, (1, 4, 9)).astype(np.int64),
        rng.choice([0.0, 1e-30, np.nan], (9,)).astype(np.float32),
    ]
    for a in operands:
        for b in operands:
            got = await getattr(gpu.ops, op)(gpu.tensor(a), gpu.tensor(b)).numpy()
            assert got.dtype == np.dtype(bool)
            np.testing.assert_array_equal(got, getattr(np, op)(a, b), f"{a.dtype} {b.dtype}")
    for a in operands:
        np.testing.assert_array_equal(await gpu.ops.logical_not(gpu.tensor(a)).numpy(), np.logical_not(a))

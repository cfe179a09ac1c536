"""layernorm with a residual (a post-LN transformer's LayerNorm(x + sublayer(x))) on every backend: the bits
of layernorm(add(x, residual)) on the same backend, and numpy's float64 layernorm of the stored sum within
the norms' tolerance, at every dtype of x, on rows within a warp's reach and past it, more rows than a
block of the warp kernel holds, poisoned outputs. On CUDA one launch of add_layernorm_warp where a row fits
a warp, elsewhere two (add, then the layernorm kernel the op picks anyway); recorded into a graph alike.
The spec's rule, without a GPU; the op's and the daemon's refusals."""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
import gpud_protocol as proto
from gpud_client import InvalidArgument
from gpud_client.dtypes import bits_to_float32, float32_to_bits
from gpud_protocol.ops import KERNELS, OpError, TensorInfo, reduce_warp
from gpud_protocol.ops.reduce import SHORT
from gpud_protocol.ops.reduce_warp import ROWS_PER_BLOCK, WARP_ROW_MAX
from ops.test_bfloat16_reduce import close, poisoned, tensor
from ops.test_reduce import layernorm_ref

DTYPES = ["float32", "float16", "bfloat16"]
PAIRS = [(d, d) for d in DTYPES] + [("float16", "float32"), ("bfloat16", "float32")]
SHAPES = [(3, 7), (2, 3, 64), (2 * ROWS_PER_BLOCK + 3, 384), (ROWS_PER_BLOCK + 1, 1000), (2, WARP_ROW_MAX + 76)]


def stored(v: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as a tensor of `dtype` holds them (as float32)."""
    f = np.asarray(v, np.float32)
    if dtype == "bfloat16":
        rounded: np.ndarray = bits_to_float32(float32_to_bits(f))
        return rounded
    return f.astype(dtype).astype(np.float32)


def values(shape: tuple[int, ...], dtype: str, scale: float, offset: float) -> np.ndarray:
    """Random values of `dtype`, as float32."""
    return stored(np.random.default_rng().standard_normal(shape) * scale + offset, dtype)


async def bits(t: gpud_client.Tensor) -> bytes:
    got = await t.numpy()
    assert not np.isnan(np.asarray(got, np.float64)).any(), "NaN: an unwritten or poisoned element"
    return bytes(got.tobytes())


def dispatches(g: gpud_client.Graph) -> int:
    return sum(isinstance(step, proto.GraphDispatch) for step in g._steps)


@pytest.mark.parametrize(("dtype", "wdtype"), [*PAIRS])
async def test_the_bits_of_add_then_layernorm(gpu: gpud_client.Client, dtype: str, wdtype: str) -> None:
    for shape in SHAPES:
        # a mean far from 0 beside a small spread, r moving it: the sum's rounding shows in the result
        a, r = values(shape, dtype, 0.5, 60.0), values(shape, dtype, 0.25, -20.0)
        w, b = values(shape[-1:], wdtype, 1.0, 1.0), values(shape[-1:], wdtype, 1.0, 0.0)
        x, res = tensor(gpu, a, dtype), tensor(gpu, r, dtype)
        wt, bt = tensor(gpu, w, wdtype), tensor(gpu, b, wdtype)
        out = poisoned(gpu, shape, dtype)
        assert gpu.ops.layernorm(x, wt, bt, eps=1e-4, residual=res, out=out) is out
        total = gpu.ops.add(x, res)
        want = gpu.ops.layernorm(total, wt, bt, eps=1e-4)
        assert await bits(out) == await bits(want), (dtype, wdtype, shape)
        summed = np.asarray(await total.numpy(), np.float32)
        if dtype == "float16" and gpu.backend == "webgpu":  # WGSL leaves pack2x16float's rounding to the driver
            np.testing.assert_allclose(summed, stored(a + r, dtype), rtol=2.0**-10, atol=0)
        else:
            np.testing.assert_array_equal(summed, stored(a + r, dtype))
        ref, slack = layernorm_ref(summed, w, b, 1e-4)
        close(np.asarray(await out.numpy(), np.float32), ref, dtype, slack)
    fused = {name for name in gpu.ops._kernels if name.startswith("add_layernorm_warp_")}
    assert fused == ({f"add_layernorm_warp_{SHORT[dtype]}_{SHORT[wdtype]}"} if gpu.backend == "cuda" else set())


@pytest.mark.parametrize("length", [384, WARP_ROW_MAX + 1])
async def test_one_launch_on_cuda_where_a_row_fits_a_warp(gpu: gpud_client.Client, length: int) -> None:
    shape = (ROWS_PER_BLOCK + 2, length)
    g = gpu.graph(f"add-layernorm-{length}")
    x, r = g.input("x", shape, "float16"), g.input("r", shape, "float16")
    w, b = values((length,), "float16", 1.0, 1.0), values((length,), "float16", 1.0, 0.0)
    wt, bt = tensor(gpu, w, "float16"), tensor(gpu, b, "float16")
    g.output("y", gpu.ops.layernorm(x, wt, bt, residual=r, graph=g))
    assert dispatches(g) == (1 if gpu.backend == "cuda" and length <= WARP_ROW_MAX else 2)
    step = await g.build()
    a, c = values(shape, "float16", 2.0, 3.0), values(shape, "float16", 1.0, 0.0)
    got = (await step.replay(x=a.astype(np.float16), r=c.astype(np.float16)))["y"]
    want = gpu.ops.layernorm(gpu.ops.add(tensor(gpu, a, "float16"), tensor(gpu, c, "float16")), wt, bt)
    assert got.tobytes() == await bits(want)


async def test_more_rows_than_one_grid_dimension_holds(gpu: gpud_client.Client) -> None:
    if gpu.backend != "cuda":
        pytest.skip("the warp kernel's grid folds into y past 65,535 blocks of 8 rows: a long run elsewhere")
    shape = (65_535 * ROWS_PER_BLOCK + 9, 8)
    x, r = gpu.tensor(values(shape, "float32", 1.0, 2.0)), gpu.tensor(values(shape, "float32", 1.0, 0.0))
    w, b = gpu.tensor(values((8,), "float32", 1.0, 1.0)), gpu.tensor(values((8,), "float32", 1.0, 0.0))
    out = poisoned(gpu, shape, "float32")
    gpu.ops.layernorm(x, w, b, residual=r, out=out)
    assert await bits(out) == await bits(gpu.ops.layernorm(gpu.ops.add(x, r), w, b))
    assert "add_layernorm_warp_f32_f32" in gpu.ops._kernels


async def test_what_the_op_refuses(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.ones((4, 8), np.float32))
    w = gpu.tensor(np.ones(8, np.float32))
    cases = [
        (r"layernorm: residual is float16, x is float32", gpu.tensor(np.ones((4, 8), np.float16)), None),
        (r"layernorm: residual is \[1, 8\], not x's shape \[4, 8\]", gpu.tensor(np.ones((1, 8), np.float32)), None),
        (r"layernorm: out is also an input", gpu.tensor(np.ones((4, 8), np.float32)), x),
    ]
    for message, residual, out in cases:
        with pytest.raises(InvalidArgument, match=message) as info:
            gpu.ops.layernorm(x, w, w, residual=residual, out=out)
        assert info.value.op == "layernorm"
    wide = gpu.tensor(np.ones((4, 16), np.float32)).narrow(1, 8, 8)  # rows 16 apart: not contiguous
    with pytest.raises(InvalidArgument, match="layernorm: x is a non-contiguous view"):  # as add refuses it
        gpu.ops.layernorm(wide, w, w, residual=x)
    with pytest.raises(InvalidArgument, match="layernorm: residual is a non-contiguous view"):
        gpu.ops.layernorm(x, w, w, residual=wide)
    with pytest.raises(InvalidArgument, match=r"layernorm: bias is \[4\]"):
        gpu.ops.layernorm(x, w, gpu.tensor(np.ones(4, np.float32)), residual=x)
    np.testing.assert_array_equal(await gpu.ops.layernorm(x, w, w, residual=x).numpy(), np.ones((4, 8)))


async def test_the_daemon_applies_the_rule(gpu: gpud_client.Client) -> None:
    """A client that skips the library's checks: the daemon refuses a mismatched r, naming the kernel."""
    if gpu.backend != "cuda":
        pytest.skip("add_layernorm_warp is CUDA's")
    x, out = gpu.tensor(np.ones((4, 8), np.float32)), gpu.empty((4, 8), "float32")
    w, r = gpu.tensor(np.ones(8, np.float32)), gpu.tensor(np.ones((4, 8), np.float16))
    u32 = gpud_client.u32
    gpu.dispatch(gpu.ops._kernel("add_layernorm_warp_f32_f32"), 1, [x, r, w, w, out, u32(4), u32(8), 1e-5])
    with pytest.raises(InvalidArgument, match="add_layernorm_warp_f32_f32 adds r to x in x's dtype"):
        await out.numpy()


def test_the_rule() -> None:
    """Without a GPU: every dtype pair, layernorm_warp's scalars and block with r after x, refusals that name
    the kernel, CUDA's alone."""
    for xs in SHORT.values():
        for ws in SHORT.values():
            spec, warp = KERNELS[f"add_layernorm_warp_{xs}_{ws}"], KERNELS[f"layernorm_warp_{xs}_{ws}"]
            assert (spec.family, spec.op, spec.block) == (warp.family, warp.op, warp.block)
            assert spec.tensors == ("x", "r", "weight", "bias", "out") and spec.writes == (4,)
            assert spec.scalars == warp.scalars and spec in reduce_warp.SPECS
    assert reduce_warp.BACKENDS == ("cuda",)
    spec = KERNELS["add_layernorm_warp_f16_f32"]
    x, wk = TensorInfo("float16", (4, 384)), TensorInfo("float32", (384,))
    spec.verify([x, x, wk, wk, x], [4, 384, 1e-5])
    refused = [
        (r"adds r to x in x's dtype: r is float32, x is float16", x._replace(dtype="float32")),
        (r"adds r to x: r is \[4, 383\], x is \[4, 384\]", x._replace(shape=(4, 383))),
        (r"adds r to x: r is \[384\], x is \[4, 384\]", x._replace(shape=(384,))),
    ]
    for message, r in refused:
        with pytest.raises(OpError, match=f"add_layernorm_warp_f16_f32 {message}"):
            spec.verify([x, r, wk, wk, x], [4, 384, 1e-5])
    with pytest.raises(OpError, match="r is a non-contiguous view"):
        spec.verify([x, x._replace(strides=(1, 4)), wk, wk, x], [4, 384, 1e-5])
    x32 = x._replace(dtype="float32")  # x and r of one dtype, not the kernel's: layernorm's rule
    with pytest.raises(OpError, match="x is float32, this kernel takes float16"):
        spec.verify([x32, x32, wk, wk, x32], [4, 384, 1e-5])
    long, wl = TensorInfo("float16", (4, WARP_ROW_MAX + 8)), TensorInfo("float32", (WARP_ROW_MAX + 8,))
    with pytest.raises(OpError, match=r"add_layernorm_warp_f16_f32 keeps a row in a warp's registers: at most 1024"):
        spec.verify([long, long, wl, wl, long], [4, WARP_ROW_MAX + 8, 1e-5])
    with pytest.raises(OpError, match="bias is float16"):
        spec.verify([x, x, wk, TensorInfo("float16", (384,)), x], [4, 384, 1e-5])

"""rmsnorm_matmul on every backend: the bits of add_rmsnorm (rmsnorm without a residual) then matmul,
which is one launch on CUDA at one or two float32 rows (matvec_norm) and the two ops elsewhere; against
numpy in float64; recorded into a graph; its rules."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument, PermissionDenied
from ops.test_fused import stored

EPS = 1e-6


def operands(rows: int, k: int, n: int, wd: str, nd: str, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((rows, k)).astype(np.float32),
        "r": rng.standard_normal((rows, k)).astype(np.float32),
        "nw": stored(rng.standard_normal(k) * 0.5 + 1.0, nd),
        "w": stored(rng.standard_normal((n, k)) / np.sqrt(k), wd),
        "b": rng.standard_normal(n).astype(np.float32),
    }


def reference(a: dict[str, np.ndarray], residual: bool, bias: bool) -> np.ndarray:
    s = (a["x"] + a["r"] if residual else a["x"]).astype(np.float64)
    normed = s / np.sqrt((s * s).mean(-1, keepdims=True) + EPS) * a["nw"]
    out: np.ndarray = normed @ a["w"].astype(np.float64).T
    return out + a["b"] if bias else out


@pytest.mark.parametrize(
    ("rows", "k", "n", "wd", "nd", "bias"),
    [
        (1, 896, 1152, "float16", "float16", True),  # a decode step's q/k/v
        (1, 896, 9728, "float16", "float16", False),  # gate and up
        (2, 4864, 96, "bfloat16", "float32", False),  # K past 256 threads a row
        (1, 70, 33, "float32", "bfloat16", True),  # K not a multiple of 8: one element at a time
        (3, 64, 40, "float16", "float16", False),  # 3 rows: the two ops on every backend
    ],
)
async def test_rmsnorm_matmul_has_the_bits_of_add_rmsnorm_then_matmul(
    gpu: gpud_client.Client, rows: int, k: int, n: int, wd: str, nd: str, bias: bool
) -> None:
    a = operands(rows, k, n, wd, nd)
    x, r = gpu.tensor(a["x"]), gpu.tensor(a["r"])
    nw, w = gpu.tensor(a["nw"], dtype=nd), gpu.tensor(a["w"], dtype=wd)
    b = gpu.tensor(a["b"]) if bias else None
    total = gpu.empty((rows, k), "float32")
    got = gpu.ops.rmsnorm_matmul(x, nw, w, EPS, residual=r, sum_out=total, transpose_w=True, bias=b)
    want_sum, normed = gpu.ops.add_rmsnorm(x, r, nw, EPS)
    want = gpu.ops.matmul(normed, w, transpose_w=True, bias=b)
    np.testing.assert_array_equal(await total.numpy(), await want_sum.numpy())
    product = await got.numpy()
    np.testing.assert_array_equal(product, await want.numpy())
    ref = reference(a, True, bias)
    assert np.abs(product - ref).max() <= 2e-4 * max(1.0, np.abs(ref).max())
    unsummed = gpu.ops.rmsnorm_matmul(x, nw, w, EPS, residual=r, transpose_w=True, bias=b)  # no sum_out
    np.testing.assert_array_equal(await unsummed.numpy(), product)
    alone = gpu.ops.matmul(gpu.ops.rmsnorm(x, nw, EPS), w, transpose_w=True, bias=b)
    np.testing.assert_array_equal(
        await gpu.ops.rmsnorm_matmul(x, nw, w, EPS, transpose_w=True, bias=b).numpy(), await alone.numpy()
    )


def fused_launch(gpu: gpud_client.Client) -> str | None:
    """The kernel of the last rmsnorm_matmul the client planned, None for the two ops."""
    plans: Any = gpu.ops._plans
    launches = [p.launch for key, p in plans.items() if key[0] == "rmsnorm_matmul"]
    return None if launches[-1] is None else str(launches[-1].name)


async def test_on_cuda_one_launch_serves_one_or_two_rows(gpu: gpud_client.Client) -> None:
    a = operands(2, 64, 24, "float16", "float16")
    x, r, nw, w = (
        gpu.tensor(a["x"]),
        gpu.tensor(a["r"]),
        gpu.tensor(a["nw"], dtype="float16"),
        gpu.tensor(a["w"], dtype="float16"),
    )
    out = gpu.ops.rmsnorm_matmul(x, nw, w, EPS, residual=r, transpose_w=True)
    assert fused_launch(gpu) == ("matvec_norm_f32_f16_f16" if gpu.backend == "cuda" else None)
    ref = reference(a, True, False)
    assert np.abs(await out.numpy() - ref).max() <= 2e-4 * max(1.0, np.abs(ref).max())
    w_kn = gpu.tensor(np.ascontiguousarray(a["w"].T), dtype="float16")  # w as (K, N): two ops
    by_kn = gpu.ops.rmsnorm_matmul(x, nw, w_kn, EPS, residual=r)
    assert fused_launch(gpu) is None
    assert np.abs(await by_kn.numpy() - ref).max() <= 2e-4 * max(1.0, np.abs(ref).max())


async def test_views_and_a_recorded_graph_give_the_same_bits(gpu: gpud_client.Client) -> None:
    a = operands(1, 256, 48, "float16", "float16")
    whole = gpu.tensor(np.concatenate([np.zeros(64), a["x"][0], a["r"][0]]).astype(np.float32))
    x, r = whole.narrow(0, 64, 256).reshape(1, 256), whole.narrow(0, 320, 256).reshape(1, 256)  # views at an offset
    nw, w = gpu.tensor(a["nw"], dtype="float16"), gpu.tensor(a["w"], dtype="float16")
    got = await gpu.ops.rmsnorm_matmul(x, nw, w, EPS, residual=r, transpose_w=True).numpy()
    _, normed = gpu.ops.add_rmsnorm(gpu.tensor(a["x"]), gpu.tensor(a["r"]), nw, EPS)
    np.testing.assert_array_equal(got, await gpu.ops.matmul(normed, w, transpose_w=True).numpy())
    g = gpu.graph("norm-matmul")
    gx, gr = g.input("x", (1, 256), "float32"), g.input("r", (1, 256), "float32")
    total = g.empty((1, 256), "float32")
    g.output("y", gpu.ops.rmsnorm_matmul(gx, nw, w, EPS, residual=gr, sum_out=total, transpose_w=True, graph=g))
    g.output("s", total)
    step = await g.build()
    replayed = await step.replay(x=a["x"], r=a["r"])
    np.testing.assert_array_equal(replayed["y"], got)
    np.testing.assert_array_equal(replayed["s"], a["x"] + a["r"])
    step.free()


async def test_rmsnorm_matmul_rules(gpu: gpud_client.Client) -> None:
    a = operands(1, 32, 8, "float32", "float32")
    x, r, nw, w = (gpu.tensor(a[name]) for name in ("x", "r", "nw", "w"))
    with pytest.raises(InvalidArgument, match="there is no residual") as info:
        gpu.ops.rmsnorm_matmul(x, nw, w, EPS, sum_out=gpu.empty((1, 32), "float32"), transpose_w=True)
    assert info.value.op == "rmsnorm_matmul"
    with pytest.raises(InvalidArgument, match="eps must be finite"):
        gpu.ops.rmsnorm_matmul(x, nw, w, -1.0, residual=r, transpose_w=True)
    with pytest.raises(InvalidArgument, match="in place"):
        gpu.ops.rmsnorm_matmul(x, nw, w, EPS, residual=r, sum_out=x, transpose_w=True)
    name = f"norm-matmul-ro-{uuid.uuid4().hex[:8]}"
    resident = gpu.tensor(np.zeros((1, 32), np.float32))
    gpu.publish(resident, name, mode="ro")
    opened = await gpu.open(name)
    with pytest.raises(PermissionDenied):
        gpu.ops.rmsnorm_matmul(x, nw, w, EPS, residual=r, sum_out=opened, transpose_w=True)
    gpu.unpublish(name)
    await gpu.sync()


def test_the_rule() -> None:
    """matvec_norm's rule, pure: its rows, its residual and sum like x, its weights' shapes, a bias."""
    from gpud_protocol.ops import KERNELS, OpError, TensorInfo
    from gpud_protocol.ops.matvec_norm import norm_grid, norm_kernel

    rule = KERNELS[norm_kernel("float16", "float32")].check
    x, w, nw = TensorInfo("float32", (2, 64)), TensorInfo("float16", (24, 64)), TensorInfo("float32", (64,))
    out = TensorInfo("float32", (2, 24))
    rule([x, x, nw, w, x, x, out], [2, 24, 64, 1e-6, 0])
    rule([x, x, nw, w, TensorInfo("float16", (24,)), x, out], [2, 24, 64, 1e-6, 2])
    for tensors, scalars, says in [
        ([TensorInfo("float32", (3, 64)), x, nw, w, x, x, out], [2, 24, 64, 1e-6, 0], "m and k passed"),
        ([x, TensorInfo("float16", (2, 64)), nw, w, x, x, out], [2, 24, 64, 1e-6, 0], "res is float16"),
        ([x, x, nw, w, x, TensorInfo("float32", (1, 64)), out], [2, 24, 64, 1e-6, 0], "sum is float32 [1, 64]"),
        ([x, x, TensorInfo("float16", (64,)), w, x, x, out], [2, 24, 64, 1e-6, 0], "the norm's weight"),
        ([x, x, nw, w, x, x, out], [2, 24, 64, -1.0, 0], "eps"),
        ([x, x, nw, w, x, x, out], [2, 24, 64, 1e-6, 1], "bias is float32 [2, 64]"),
    ]:
        with pytest.raises(OpError, match=says.replace("[", r"\[").replace("]", r"\]")):
            rule(tensors, scalars)
    with pytest.raises(OpError, match="1 to 2 rows"):
        big = TensorInfo("float32", (3, 64))
        rule([big, big, nw, w, big, big, TensorInfo("float32", (3, 24))], [3, 24, 64, 1e-6, 0])
    assert norm_grid(9728, 896) == (1216, 1, 1)  # matvec's: 8 rows of 32 threads a block

"""matvec_sx_f32_<w> (CUDA only): matvec with x read once for several rows of w. Against numpy in float64
and, bit for bit, against matvec itself: dispatched directly at sizes off its blocks (N off the rows a
block takes, K not a multiple of 8, 1 to 8 rows of x, batches, a bias), and through the op, where each
row of a merged-decode-sized product (4 to 32 rows by a wide weight) gets the bits it gets alone; the
choice and grids as pure functions; the daemon's rule; on WebGPU, which has no such kernels, a refusal."""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_protocol.ops import KERNELS, MAX_GROUPS, OpError, TensorInfo
from gpud_protocol.ops.matmul import matvec_grid, threads_per_row
from gpud_protocol.ops.matvec_sx import MIN_BLOCKS, sx_grid, sx_kernel, sx_rows
from ops.test_matmul_bf16 import check, upload
from ops.test_matmul_bf16 import rand as rand_of

DTYPES = ["float32", "float16", "bfloat16"]
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


async def direct(
    gpu: gpud_client.Client, name: str, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None
) -> np.ndarray:
    """Kernel `name` (matvec_sx or matvec) on x (batch, M, K) and w (batch, N, K), into a poisoned out."""
    dtype = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[name.rsplit("_", 1)[1]]
    b, m, k = x.shape
    n = w.shape[1]
    tx, tw = gpu.tensor(x.astype(np.float32)), upload(gpu, w, dtype)
    out = gpu.tensor(np.full((b, m, n), np.nan, np.float32))
    tb = tx if bias is None else gpu.tensor(bias.astype(np.float32))
    grid = sx_grid(b, n, k, m) if name.startswith("matvec_sx") else matvec_grid(b, n, k, True)
    scalars = [b, m, n, k, m * k, n * k, 1, 0 if bias is None else 1]
    gpu.ops._run(name, grid, [tx, tw, tb, out], scalars, None)
    result: np.ndarray = await out.numpy()
    return result


@pytest.mark.parametrize("dtype", DTYPES)
async def test_every_row_count_at_edges_with_matvecs_bits(gpu: gpud_client.Client, dtype: str) -> None:
    rng = np.random.default_rng()
    name, short = f"matvec_sx_f32_{SHORT[dtype]}", SHORT[dtype]
    if gpu.backend != "cuda":
        with pytest.raises(gpud_client.GpudError, match="matvec_sx"):
            await direct(gpu, name, rand_of(rng, (1, 4, 16), "float32"), rand_of(rng, (1, 8, 16), dtype), None)
        return
    for m in range(1, 9):
        for n, k, biased in [(37, 70, True), (130, 896, False), (8, 1500, True)]:
            x, w = rand_of(rng, (2, m, k), "float32"), rand_of(rng, (2, n, k), dtype)
            bias = rand_of(rng, (n,), "float32", 4.0) if biased else None
            got = await direct(gpu, name, x, w, bias)
            for i in range(2):
                check(got[i], x[i], w[i], True, "float32", bias)
            np.testing.assert_array_equal(
                got, await direct(gpu, f"matvec_f32_{short}", x, w, bias), err_msg=f"{m} {n} {k}"
            )


async def test_through_the_op_each_row_gets_its_bits_alone(gpu: gpud_client.Client) -> None:
    """4, 8 and 32 rows (matvec's groups of 8) by a weight wide enough for matvec_sx: every row equals itself alone."""
    rng = np.random.default_rng()
    n, k = 8 * MIN_BLOCKS * 4, 64
    w = rand_of(rng, (n, k), "float16")
    tw = gpu.tensor(w)
    x = rand_of(rng, (32, k), "float32")
    alone = [await gpu.ops.matmul(gpu.tensor(x[r : r + 1]), tw, transpose_w=True).numpy() for r in (0, 3, 7, 31)]
    for m in (4, 8, 32):
        got = await gpu.ops.matmul(gpu.tensor(x[:m]), tw, transpose_w=True).numpy()
        check(got, x[:m], w, True, "float32")
        for row, want in zip((0, 3, 7, 31), alone, strict=True):
            if row < m:
                np.testing.assert_array_equal(got[row], want[0], err_msg=f"{m} rows, row {row}")
    assert (gpu.backend == "cuda") == ("matvec_sx_f32_f16" in gpu.ops._kernels)


def test_the_choice_and_grids() -> None:
    """From 4 rows of float32 x by a (N, K) weight whose grid keeps MIN_BLOCKS blocks; every row covered."""
    assert sx_kernel(4, 9728, 896, "float32", "float16", True) == "matvec_sx_f32_f16"
    assert sx_kernel(8, 151936, 896, "float32", "bfloat16", True) == "matvec_sx_f32_bf16"
    for refused in [
        (3, 9728, 896, "float32", "float16", True),
        (9, 9728, 896, "float32", "float16", True),
        (8, 896, 896, "float32", "float16", True),  # 56 blocks: matvec's 112 keep more multiprocessors busy
        (8, 9728, 896, "float16", "float16", True),
        (8, 9728, 896, "float32", "float16", False),
    ]:
        assert sx_kernel(*refused) is None, refused
    for m in range(1, 9):
        for n, k in [(1, 3), (37, 70), (151936, 896), (896, 4864), (10**6, 64)]:
            gx, gy, gz = sx_grid(2, n, k, m)
            rows = 256 // threads_per_row(k) * sx_rows(m)
            assert gz == 2 and gx <= MAX_GROUPS and gx * gy * rows >= n and (gx * gy - gx) * rows < n


def test_the_rule() -> None:
    rule = KERNELS["matvec_sx_f32_f16"].check
    x, w, out = TensorInfo("float32", (4, 5)), TensorInfo("float16", (6, 5)), TensorInfo("float32", (4, 6))
    rule([x, w, x, out], [1, 4, 6, 5, 0, 0, 1, 0])
    with pytest.raises(OpError, match="wt 1"):
        rule([x, w, x, out], [1, 4, 6, 5, 0, 0, 0, 0])
    with pytest.raises(OpError, match="at most 8 rows"):
        big, big_out = TensorInfo("float32", (9, 5)), TensorInfo("float32", (9, 6))
        rule([big, w, big, big_out], [1, 9, 6, 5, 0, 0, 1, 0])

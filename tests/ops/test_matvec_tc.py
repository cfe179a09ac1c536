"""The products of float32 x and a 16-bit Linear weight on the tensor cores (matvec_tc<R>_f32_<w>, CUDA
sm_80+; dispatched by name, and picked by the op in graphs of rows) against
numpy in float64: every variant at sizes off its tiles (K not a multiple of 8 (rows off 16-byte
alignment: one element at a time) or of 32, N odd, rows off 16), batches, a bias, inf and NaN in x;
every row with the bits it gets alone whatever the rows beside it and the variant (the property merged
replays need); the choice of variant and the grids as pure functions; the daemon's rule; and on WebGPU,
which has no such kernels, a typed refusal. Tolerance as test_matmul.py's for a float32 out
(1e-5 of the row's magnitude): x enters as two tf32 parts, about 22 of its 24 bits in every product."""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_protocol.ops import KERNELS, MAX_GROUPS, OpError, TensorInfo
from gpud_protocol.ops.matmul import plan
from gpud_protocol.ops.matvec_tc import (
    FEW_COLUMNS,
    TF_COLUMNS,
    TF_KERNELS,
    TF_ROWS,
    TF_WARPS,
    tf_grid,
    tf_kernel,
    tf_name,
    tf_warps,
)
from ops.test_matmul_bf16 import check, upload
from ops.test_matmul_bf16 import rand as rand_of

# (batch, M, N, K, bias, batched w)
EDGES = [
    (1, 1, 33, 70, False, False),
    (1, 3, 8, 200, True, False),
    (1, 16, 130, 896, False, False),
    (1, 17, 9, 64, True, False),
    (1, 31, 40, 40, False, False),
    (1, 32, 17, 896, True, False),
    (1, 33, 33, 136, False, False),
    (1, 64, 24, 8, True, False),
    (2, 5, 72, 96, True, True),
    (3, 4, 40, 24, False, False),  # a shared w: the batches as the grid's z (x_stride M*K, w_stride 0)
]


def w_dtype_of(name: str) -> str:
    return "bfloat16" if name.endswith("_bf16") else "float16"


async def direct(
    gpu: gpud_client.Client, name: str, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, batch: int
) -> np.ndarray:
    """Kernel `name` dispatched directly on x (batch, M, K) and w (N, K) or (batch, N, K), into a poisoned out."""
    dtype = w_dtype_of(name)
    b, m, k = x.shape
    n = w.shape[-2]
    tx, tw = gpu.tensor(x.astype(np.float32)), upload(gpu, w, dtype)
    out = gpu.tensor(np.full((b, m, n), np.nan, np.float32))
    tb = tx if bias is None else gpu.tensor(bias.astype(np.float32))
    x_stride, w_stride = m * k, n * k if w.ndim == 3 else 0
    scalars = [batch, m, n, k, x_stride, w_stride, 1, 0 if bias is None else 1]
    gpu.ops._run(name, tf_grid(name, batch, n), [tx, tw, tb, out], scalars, None)
    result: np.ndarray = await out.numpy()
    return result


@pytest.mark.parametrize("name", list(TF_KERNELS))
async def test_every_variant_at_edges(gpu: gpud_client.Client, name: str) -> None:
    rng = np.random.default_rng()
    dtype, (rows, _warps) = w_dtype_of(name), TF_KERNELS[name]
    if gpu.backend != "cuda":  # no WebGPU version of the family: the registration is refused
        x, w = rand_of(rng, (1, 2, 16), "float32"), rand_of(rng, (8, 16), dtype)
        with pytest.raises(gpud_client.GpudError, match="matvec_tc kernels have no webgpu version"):
            await direct(gpu, name, x, w, None, 1)
        return
    for batch, m, n, k, biased, batched in EDGES:
        if m > rows:
            continue
        x = rand_of(rng, (batch, m, k), "float32")
        w = rand_of(rng, (batch, n, k) if batched else (n, k), dtype)
        bias = rand_of(rng, (n,), "float32", 4.0) if biased else None
        got = await direct(gpu, name, x, w, bias, batch)
        for i in range(batch):
            check(got[i], x[i], w[i] if batched else w, True, "float32", bias)


async def test_inf_and_nan_in_x(gpu: gpud_client.Client) -> None:
    """An inf in x gives what numpy gives (inf where every weight it meets is positive), a NaN gives NaN."""
    if gpu.backend != "cuda":
        pytest.skip("the matvec_tc kernels run on CUDA")
    rng = np.random.default_rng()
    n, k = 24, 96
    special = rand_of(rng, (1, 3, k), "float32")
    special[0, 0, 5], special[0, 1, 7] = np.inf, np.nan
    w = np.abs(rand_of(rng, (n, k), "float16")) + np.float16(0.5)
    got = (await direct(gpu, "matvec_tc8_f32_f16", special, w, None, 1))[0]
    assert np.all(np.isposinf(got[0])) and np.all(np.isnan(got[1])) and np.all(np.isfinite(got[2]))


@pytest.mark.parametrize("warps", TF_WARPS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
async def test_each_row_gets_the_bits_it_gets_alone(gpu: gpud_client.Client, dtype: str, warps: int) -> None:
    """64 rows at once, reversed, 32, 16 and 5 at a time, and each alone, through every variant of one
    warp count that holds them: every row's output bits are the same (each variant sums a row in one
    order), the property a merged replay of many sessions' rows needs to equal each session replaying
    alone (64 rows of 16 warps meet in shared memory half at a time: the same sums)."""
    if gpu.backend != "cuda":
        pytest.skip("the matvec_tc kernels run on CUDA")
    rng = np.random.default_rng()
    n, k, short = 40, 896, "bf16" if dtype == "bfloat16" else "f16"
    x, w = rand_of(rng, (1, 64, k), "float32"), rand_of(rng, (n, k), dtype)
    whole = (await direct(gpu, tf_name(64, warps, short), x, w, None, 1))[0]
    check(whole, x[0], w, True, "float32")
    flipped = (await direct(gpu, tf_name(64, warps, short), x[:, ::-1].copy(), w, None, 1))[0]
    np.testing.assert_array_equal(flipped[::-1], whole)
    for rows in (32, 16, 5):
        for name in (tf_name(r, warps, short) for r in TF_ROWS if r >= rows):
            part = (await direct(gpu, name, x[:, 64 - rows :].copy(), w, None, 1))[0]
            np.testing.assert_array_equal(part, whole[64 - rows :], err_msg=name)
    for row in (0, 17, 63):
        alone = (await direct(gpu, tf_name(8, warps, short), x[:, row : row + 1].copy(), w, None, 1))[0]
        np.testing.assert_array_equal(alone[0], whole[row])


def test_the_choice_and_grids() -> None:
    """Up to 8, 16, 32, 64 rows: the smallest variant that holds them, with the warps the weight's N
    takes whatever the rows (16 up to FEW_COLUMNS columns, else 4); float32 x with a 16-bit w as (N, K) on
    sm_80 and later only; 32 threads a warp; one block per 16 columns, folded into y past 65,535."""
    wide, few = FEW_COLUMNS + 1, FEW_COLUMNS
    assert tf_kernel(1, wide, "float32", "float16", True, "9.0") == "matvec_tc8w4_f32_f16"
    assert tf_kernel(9, wide, "float32", "float16", True, "9.0") == "matvec_tc16w4_f32_f16"
    assert tf_kernel(17, wide, "float32", "bfloat16", True, "8.0") == "matvec_tc32w4_f32_bf16"
    assert tf_kernel(64, wide, "float32", "float16", True, "8.6") == "matvec_tc64w4_f32_f16"
    for m, rows in ((1, 8), (8, 8), (9, 16), (32, 32), (33, 64)):
        assert tf_kernel(m, few, "float32", "float16", True, "9.0") == f"matvec_tc{rows}w16_f32_f16"
    assert tf_warps(896) == 16 and tf_warps(151936) == 4
    for refused in [
        (65, wide, "float32", "float16", True, "9.0"),
        (8, wide, "float16", "float16", True, "9.0"),
        (8, wide, "float32", "float32", True, "9.0"),
        (8, wide, "float32", "float16", False, "9.0"),
        (8, few, "float32", "float16", True, "7.5"),
        (8, wide, "float32", "float16", True, ""),
    ]:
        assert tf_kernel(*refused) is None, refused
    for name, (rows, warps) in TF_KERNELS.items():
        assert KERNELS[name].block == 32 * warps and KERNELS[name].family == "matvec_tc"
        assert name.startswith(f"matvec_tc{rows}{'' if warps == 8 else f'w{warps}'}_f32_")
        columns = TF_COLUMNS
        assert tf_grid(name, 3, columns) == (1, 1, 3)
        gx, gy, gz = tf_grid(name, 1, 151936 * 8)
        blocks = -(-151936 * 8 // columns)
        assert gz == 1 and gx <= MAX_GROUPS and gx * gy >= blocks and gx * (gy - 1) < blocks


def test_the_rule_of_the_tensor_core_matvec() -> None:
    check_rule = KERNELS["matvec_tc32_f32_f16"].check
    x, w, out = TensorInfo("float32", (3, 8, 5)), TensorInfo("float16", (6, 5)), TensorInfo("float32", (3, 8, 6))
    sizes = list(plan(x.shape, w.shape, True).sizes)
    check_rule([x, w, x, out], [*sizes, 1, 0])
    with pytest.raises(OpError, match="wt 1"):
        check_rule([x, w, x, out], [*sizes, 0, 0])
    big, big_out = TensorInfo("float32", (33, 5)), TensorInfo("float32", (33, 6))
    with pytest.raises(OpError, match="1 to 32 rows"):
        check_rule([big, w, big, big_out], [1, 33, 6, 5, 0, 0, 1, 0])
    with pytest.raises(OpError, match="takes x float32"):
        half = TensorInfo("float16", (3, 8, 5))
        check_rule([half, w, half, out], [*sizes, 1, 0])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
async def test_the_op_picks_them_in_a_graph_of_rows_for_every_row_count(gpu: gpud_client.Client, dtype: str) -> None:
    """Recorded into a row-independent graph, float32 rows by a 16-bit Linear weight go to matvec_tc at 1
    to 64 rows on CUDA (every instance of the graph on kernels with the same bits for a row), and an
    instance's replayed rows equal the same rows replayed by the 1-row instance, bit for bit; outside
    such a graph, and on other backends, the op's choice is as before (matvec for one row)."""
    rng = np.random.default_rng(11)
    n, k = 72, 896
    wh = rand_of(rng, (n, k), dtype)
    w, short = upload(gpu, wh, dtype), "bf16" if dtype == "bfloat16" else "f16"
    x = rand_of(rng, (20, k), "float32")
    plain = gpu.ops._matmul_plan(gpu.tensor(x[:1]), w, True, None, None)
    assert plain.launch is not None and plain.launch.name.startswith("matvec_f32_")
    g = gpu.graph(f"tc-rows-{dtype}", rows=True)
    xi = g.input("x", (1, k), "float32")
    g.output("y", gpu.ops.matmul(xi, w, transpose_w=True, graph=g))
    picked = gpu.ops._matmul_plan(gpu.tensor(x[:1]), w, True, None, None, None, True)
    assert picked.launch is not None
    if gpu.backend != "cuda":
        assert picked.launch.name == plain.launch.name
        return
    assert picked.launch.name == tf_name(8, 16, short)  # 72 columns of out: 16 warps
    for m in (9, 33, 64):
        got = gpu.ops._matmul_plan(gpu.tensor(rand_of(rng, (m, k), "float32")), w, True, None, None, None, True)
        assert got.launch is not None and got.launch.name == tf_name(next(r for r in TF_ROWS if m <= r), 16, short)
    step = await g.build()
    alone = [np.asarray((await step.replay(x=x[i : i + 1]))["y"]) for i in range(3)]
    many = await direct(gpu, tf_name(32, 16, short), x[None], wh, None, 1)
    for i in range(3):
        np.testing.assert_array_equal(alone[i][0], many[0][i])
    check(np.concatenate(alone), x[:3], wh, True, "float32")
    step.free()

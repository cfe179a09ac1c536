"""Split-K for the TMA matmuls (matmul_tmak<S>_128x128_<t>_<t>: family matmul_tma, CUDA on compute
capability 9.0 only, clusters of S blocks): without a GPU, the entry points in the PTX (matmul_tma's
parameters, a cluster of S blocks), the daemon's tensor maps for them, the rule (refusals naming the
kernel), the choice of splits and the grids; on a Hopper GPU, every cluster size at sizes off the tiles
(M and N not multiples of 128, K not a multiple of S x 64, batches, biases of every float dtype) against
numpy in float64, the same bits at every run, an activation's bits those of its unary op on the product,
and the op eager and in a replay graph. Tolerances as in test_matmul_tc.py: the products are exact and
summed in float32 (in another order)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud.backends.cuda import tma
from gpud.ops import source
from gpud.testing import nvrtc
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.matmul import ACTIVATIONS, BIAS_KINDS
from gpud_protocol.ops.matmul_tma import SMS, TMA_TILES, tma_kernel
from gpud_protocol.ops.matmul_tmak import SPLITS, TMAK_TILES, splits_of, tma_splits, tmak_grid, tmak_name
from ops.test_matmul_activation import bits
from ops.test_matmul_bf16 import rand as rand_of
from ops.test_matmul_bf16 import upload
from ops.test_matmul_tc import close_of, dtype_of
from ops.test_matmul_tma import direct_product, hopper

# (batch, M, N, K, bias dtype, batched w, shared w unfolded: batch B with x_stride M K and w_stride 0)
EDGES = [
    (1, 130, 136, 1000, "float16", False, False),  # 16 slices, the last one partly past K
    (1, 257, 264, 584, "float32", False, False),  # 10 slices: splits of 1 or 2 (S = 8), 2 or 3 (S = 4)
    (1, 9, 8, 520, None, False, False),  # one tile, mostly past m and n
    (2, 40, 72, 1096, "bfloat16", True, False),  # batch 0's boxes read batch 1's rows past m and n
    (3, 50, 40, 1024, "float32", False, True),  # a shared w, batches unfolded
    (1, 40, 5, 70_000, "float16", False, False),  # one tile, 1,094 slices
    (1, 1300, 1400, 512, None, False, False),  # 121 tiles: more clusters than fit at once
]


async def tmak_product(
    gpu: gpud_client.Client, name: str, case: tuple[Any, ...], rng: np.random.Generator
) -> tuple[np.ndarray, list[Any]]:
    """Kernel `name` dispatched directly into a poisoned output; (out, its operands)."""
    return await direct_product(gpu, name, case, rng, tmak_grid)


@pytest.mark.parametrize("name", list(TMAK_TILES))
async def test_every_cluster_size_at_edges(gpu: gpud_client.Client, name: str) -> None:
    if not hopper(gpu):
        pytest.skip("the TMA kernels run on compute capability 9.0")
    rng = np.random.default_rng()
    for case in EDGES:
        got, (x, w, bias) = await tmak_product(gpu, name, case, rng)
        close_of(dtype_of(name), got, x, w, True, bias)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
async def test_the_same_bits_every_run_and_the_activation_on_them(gpu: gpud_client.Client, dtype: str) -> None:
    """Three launches of one product at each cluster size: the same bits every time (the blocks' sums
    added in rank order); with gelu, the bits of gelu's unary op on the product."""
    if not hopper(gpu):
        pytest.skip("the TMA kernels run on compute capability 9.0")
    rng = np.random.default_rng(7)
    m, n, k = 300, 264, 1536
    x, w, bias = rand_of(rng, (m, k), dtype), rand_of(rng, (n, k), dtype), rand_of(rng, (n,), dtype)
    tx, tw, tb = upload(gpu, x, dtype), upload(gpu, w, dtype), upload(gpu, bias, dtype)
    for splits in SPLITS:
        name = tmak_name(dtype, splits)
        runs = []
        for act in (0, 0, 0, ACTIVATIONS["gelu"]):
            out = gpu.empty((m, n), dtype)
            scalars = [1, m, n, k, 0, 0, 1, BIAS_KINDS[dtype] | act << 8]
            gpu.ops._run(name, tmak_grid(name, 1, m, n), [tx, tw, tb, out], scalars, None)
            runs.append(await out.numpy())
        assert bits(runs[0]) == bits(runs[1]) == bits(runs[2]), name
        close_of(dtype, runs[0], x, w, True, bias)
        assert bits(runs[3]) == bits(await gpu.ops.gelu(upload(gpu, runs[0], dtype)).numpy()), name


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
async def test_the_op_splits_k_eager_and_replayed(gpu: gpud_client.Client, dtype: str) -> None:
    """gpu.ops.matmul picks split-K by itself (Qwen2.5-0.5B's down_proj at 256 rows); a replay graph
    gives the eager call's bits."""
    if not hopper(gpu):
        pytest.skip("the TMA kernels run on compute capability 9.0")
    rng = np.random.default_rng()
    m, n, k = 256, 896, 4864
    splits = tma_splits(1, m, n, k, dtype)
    assert splits > 1
    x, w, bias = rand_of(rng, (m, k), dtype), rand_of(rng, (n, k), dtype), rand_of(rng, (n,), "float32")
    tx, tw, tb = upload(gpu, x, dtype), upload(gpu, w, dtype), upload(gpu, bias, "float32")
    planned = gpu.ops._matmul_plan(tx, tw, True, tb, None)
    assert planned.launch is not None and planned.launch.name == tmak_name(dtype, splits)
    eager = await gpu.ops.matmul(tx, tw, transpose_w=True, bias=tb).numpy()
    close_of(dtype, eager, x, w, True, bias)
    if dtype == "bfloat16":
        return  # a replay's inputs come as numpy arrays: float16 here
    g = gpu.graph("splitk")
    v = g.input("x", (m, k), dtype)
    g.output("y", gpu.ops.matmul(v, tw, transpose_w=True, bias=tb, graph=g))
    step = await g.build()
    assert bits(np.asarray((await step.replay(x=x))["y"])) == bits(eager)
    x2 = rand_of(rng, (m, k), dtype)
    close_of(dtype, np.asarray((await step.replay(x=x2))["y"]), x2, w, True, bias)


def test_the_entry_points_are_clusters_with_matmul_tmas_parameters() -> None:
    lib = nvrtc.library()
    if lib is None:
        pytest.skip("no libnvrtc (pip install nvidia-cuda-nvrtc-cu12)")
    ptx, log = nvrtc.compile_ptx(lib, source("matmul_tma", "cuda"), "sm_90a")
    assert ptx is not None, log
    for name in TMAK_TILES:
        params = re.search(rf"\.entry {name}\((.*?)\)", ptx, re.S).group(1)  # type: ignore[union-attr]
        kinds = re.findall(r"\.param (\.align 64 \.b8|\.u64|\.u32) \w+?(\[128\])?(?:,|\s*$)", params.strip())
        assert kinds == [(".align 64 .b8", "[128]")] * 2 + [(".u64", "")] * 2 + [(".u32", "")] * 8, params
        threads = TMAK_TILES[name].threads
        cluster = rf"\.entry {name}\(.*?\)\s*\.maxntid {threads}, 1, 1\s*\.minnctapersm 1\s*\.explicitcluster\s*"
        assert re.search(cluster + rf"\.reqnctapercluster {splits_of(name)}, 1, 1", ptx, re.S), name
    text = (Path(__file__).resolve().parents[2] / "gpud" / "ops" / "matmul_tma.cu").read_text()
    for name in TMAK_TILES:  # each entry point one line of the family's MATMUL_TMAK(name, bfloat16, splits)
        found = re.search(rf"^MATMUL_TMAK\({name}, (\w+), (\d+)\)$", text, re.M)
        assert found is not None, name
        assert found.groups() == (str("bf16" in name).lower(), str(splits_of(name)))


def test_the_daemon_makes_matmul_tmas_tensor_maps_for_them() -> None:
    for name, tile in TMAK_TILES.items():
        unsplit = "matmul_tma128x128_" + "_".join(name.split("_")[3:])
        assert tile == TMA_TILES[unsplit] and tma.layout(name) == tma.layout(unsplit) is not None


def infos(m: int, n: int, k: int, dtype: str = "float16") -> list[TensorInfo]:
    x, w, out = TensorInfo(dtype, (m, k)), TensorInfo(dtype, (n, k)), TensorInfo(dtype, (m, n))
    return [x, w, x, out]


def test_the_rule_names_the_kernel() -> None:
    for splits in SPLITS:
        name = tmak_name("float16", splits)
        spec = KERNELS[name]
        unsplit = KERNELS["matmul_tma128x128_f16_f16"]
        assert (spec.family, spec.tensors, spec.scalars, spec.block, spec.shared, spec.writes) == (
            unsplit.family,
            unsplit.tensors,
            unsplit.scalars,
            unsplit.block,
            unsplit.shared,
            unsplit.writes,
        )
        k = 64 * (splits - 1) + 8  # the last split's slice holds 8 of K
        spec.verify(infos(300, 96, k), [1, 300, 96, k, 0, 0, 1, ACTIVATIONS["silu"] << 8])
        for tensors, values, message in [
            (infos(300, 96, k - 8), [1, 300, 96, k - 8, 0, 0, 1, 0], rf"{name} splits K in {splits}: K must hold"),
            (infos(300, 96, 1000), [1, 300, 96, 1000, 0, 0, 0, 0], rf"{name} takes w as \(N, K\) only"),
            (infos(300, 96, 1004), [1, 300, 96, 1004, 0, 0, 1, 0], rf"{name} reads rows by TMA: K must be"),
            (infos(300, 96, 1000, "bfloat16"), [1, 300, 96, 1000, 0, 0, 1, 0], "takes x float16 and w float16"),
        ]:
            with pytest.raises(OpError, match=message):
                spec.check(tensors, values)
    KERNELS[tmak_name("bfloat16", 8)].verify(infos(300, 96, 1000, "bfloat16"), [1, 300, 96, 1000, 0, 0, 1, 0])


def test_the_choice_of_splits_and_the_grids() -> None:
    """Split-K where the 128 x 128 tiles are few and K long (Qwen2.5-0.5B's down_proj, MiniLM's FFN down
    at a few sentences), else the kernels as before; a cluster of S blocks per tile."""
    assert tma_splits(1, 256, 896, 4864, "float16") == 8  # 14 tiles of 76 slices
    assert tma_splits(1, 512, 896, 4864, "float16") == 4  # 28 tiles
    assert tma_splits(1, 1024, 896, 4864, "bfloat16") == 1  # 112 tiles of 128 x 64: matmul_tma128x64 (0.77 vs 0.70)
    assert tma_splits(1, 4096, 896, 4864, "float16") == 1  # 224 tiles: matmul_tma
    assert tma_splits(1, 64, 896, 4864, "float16") == 8  # 64 x 76 slices
    assert tma_splits(1, 32, 896, 4864, "float16") == 1  # 32 rows: matmul_tc
    assert tma_splits(1, 64, 896, 3072, "float16") == 1  # 64 x 48 slices: matmul_tc
    assert tma_splits(1, 256, 896, 2048, "float16") == 8  # 128 x 32 slices
    assert tma_splits(1, 1024, 384, 1536, "float16") == 1  # MiniLM's FFN down: 128 x 24 slices, matmul_wg
    assert tma_splits(1, 256, 4864, 896, "float16") == 1  # 14 slices
    assert tma_splits(1, 256, 896, 4868, "float16") == 1  # K not a multiple of 8
    assert tma_splits(1, 256, 896, 4864, "float32") == 1
    assert tma_splits(4, 64, 896, 4864, "float16") == 4  # batches count as tiles: 28
    assert tma_kernel(1, 256, 896, 4864, "float16") is None  # what the op used before: matmul_tc
    assert tmak_name("float16", 4) == "matmul_tmak4_128x128_f16_f16"
    assert splits_of("matmul_tmak8_128x128_bf16_bf16") == 8
    assert tmak_grid("matmul_tmak8_128x128_f16_f16", 1, 256, 896) == (112, 1, 1)
    assert tmak_grid("matmul_tmak2_128x128_bf16_bf16", 3, 300, 520) == (30, 1, 3)
    for m, n, k in [(256, 896, 4864), (64, 384, 1536), (1024, 896, 4864), (64, 100, 100_000), (8000, 40, 9000)]:
        splits = tma_splits(1, m, n, k, "float16")
        assert splits in (1, *SPLITS)
        assert splits == 1 or tmak_grid(tmak_name("float16", splits), 1, m, n)[0] <= SMS


def test_bench_ops_times_what_the_op_picks() -> None:
    from benchmarks.ops import _choice

    assert _choice("f16", 256, 896, 4864, "9.0") == ("matmul_tmak8_128x128_f16_f16", (112, 1, 1))
    assert _choice("f16", 4096, 896, 4864, "9.0") == ("matmul_tma128x128_f16_f16", (SMS, 1, 1))
    assert _choice("f16", 256, 896, 4864, "8.0")[0].startswith("matmul_tc")

"""The persistent TMA matmuls on Hopper (matmul_tma<BM>x<BN>_<t>_<t>, CUDA on compute capability 9.0 only):
without a GPU, the family's build and PTX interface (two 128-byte tensor maps, then matmul_wg's other
parameters), its interface module (tiles, shared memory, grids, the tensor maps' rows) and the rule the
daemon checks; on a Hopper GPU, every tile against numpy in float64 at sizes off its tile, over more
tiles than multiprocessors, batches (the next batch's rows read past m) and biases of every float dtype;
the 192-row tiles (three consumer warpgroups) also with an activation over blocks of several tiles.
Tolerances as in test_matmul_tc.py."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud.ops import source
from gpud.testing import nvrtc
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.matmul import ACTIVATIONS, BIAS_KINDS, plan
from gpud_protocol.ops.matmul_tma import (
    BOX_K,
    CAPABILITY,
    SHORT,
    SMS,
    TMA_TILES,
    tma_check,
    tma_grid,
    tma_kernel,
    tma_rows,
)
from ops.test_matmul_bf16 import rand as rand_of
from ops.test_matmul_bf16 import upload
from ops.test_matmul_tc import close_of, dtype_of

ROOT = Path(__file__).resolve().parents[2]
# (batch, M, N, K, bias dtype, batched w, shared w unfolded: batch B with x_stride M K and w_stride 0)
EDGES = [
    (1, 130, 136, 200, "float16", False, False),
    (1, 257, 264, 1000, "float32", False, False),
    (1, 70, 66, 48, "bfloat16", False, False),
    (1, 9, 8, 16, None, False, False),  # K under a box: the rest of the box is zeros
    (2, 40, 72, 136, "float32", True, False),  # batch 0's boxes read batch 1's rows past m and n
    (3, 20, 48, 96, "float16", True, False),
    (3, 7, 40, 24, None, False, False),  # a shared w: the batches fold into 21 rows
    (3, 50, 40, 64, "float32", False, True),
    (1, 2100, 2200, 128, None, False, False),  # more tiles than SMS: blocks walk several
    (1, 150, 40, 1000, None, False, False),
    # blocks of several tiles with K past the ring (ping-pong: each consumer steps over the other's stages)
    (1, 2100, 2200, 448, "bfloat16", False, False),  # 306 tiles: 42 blocks walk 3, 7 K-slices
    (2, 1700, 1800, 320, "float32", True, False),  # 210 tiles a batch: blocks of 2 and of 1
    (1, 3000, 2900, 328, None, False, False),  # 552 tiles: blocks of 5 and of 4, 6 K-slices
    # 192-row tiles: a second tile of 8 rows (its second and third consumers' rows all past m), and
    # 80 x 3 tiles of MiniLM's attention output at 15,360 rows, K = 384: 6 K-slices over 4 stages
    (1, 200, 264, 384, "float16", False, False),
    (1, 15360, 384, 384, "bfloat16", False, False),
]


def hopper(gpu: gpud_client.Client) -> bool:
    return bool(gpu.backend == "cuda" and gpu.devices[0].get("compute_capability") == CAPABILITY)


async def direct_product(
    gpu: gpud_client.Client,
    name: str,
    case: tuple[object, ...],
    rng: np.random.Generator,
    grid_of: Callable[[str, int, int, int], tuple[int, int, int]],
    activation: int = 0,
) -> tuple[np.ndarray, list[Any]]:
    """Kernel `name` (a TMA matmul, unsplit or split-K) dispatched directly into a poisoned output on the
    grid `grid_of(name, batch, m, n)`, with the epilogue's `activation` code; (out, [x, w, bias])."""
    batch, m, n, k, bias_dtype, batched, unfolded = case
    assert isinstance(batch, int) and isinstance(m, int) and isinstance(n, int) and isinstance(k, int)
    dtype = dtype_of(name)
    x = rand_of(rng, (batch, m, k), dtype)
    w = rand_of(rng, (batch, n, k) if batched else (n, k), dtype)
    bias = None if bias_dtype is None else rand_of(rng, (n,), str(bias_dtype), 4.0)
    p = plan(x.shape, w.shape, True)
    sizes = (batch, m, n, k, m * k, 0) if unfolded else p.sizes
    out = upload(gpu, np.full(p.out_shape, np.nan, np.float32), dtype)
    tx, tw = upload(gpu, x, dtype), upload(gpu, w, dtype)
    tb = tx if bias is None else upload(gpu, bias, str(bias_dtype))
    epilogue = (0 if bias is None else BIAS_KINDS[str(bias_dtype)]) | activation << 8
    gpu.ops._run(name, grid_of(name, sizes[0], sizes[1], sizes[2]), [tx, tw, tb, out], [*sizes, 1, epilogue], None)
    return await out.numpy(), [x, w, bias]


async def tma_product(gpu: gpud_client.Client, name: str, case: tuple[object, ...], rng: np.random.Generator) -> None:
    """Kernel `name` dispatched directly into a poisoned output, checked against float64."""
    got, (x, w, bias) = await direct_product(gpu, name, case, rng, tma_grid)
    close_of(dtype_of(name), got, x, w, True, bias)


@pytest.mark.parametrize("name", list(TMA_TILES))
async def test_every_tile_at_edges(gpu: gpud_client.Client, name: str) -> None:
    if not hopper(gpu):
        pytest.skip("the TMA kernels run on compute capability 9.0")
    rng = np.random.default_rng()
    for case in EDGES:
        await tma_product(gpu, name, case, rng)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
async def test_the_192_row_tiles_activation_over_blocks_of_several_tiles(gpu: gpud_client.Client, dtype: str) -> None:
    """matmul_tma192x128 (three consumer warpgroups, one named barrier of 384 threads) with a bias and each
    activation, K = 384, over 21 x 15 tiles: blocks of 2 and of 3, the last tiles' rows partly past m
    (4,000 = 20 x 192 + 160: the third consumer's 32 rows) and columns past n (1,800 = 14 x 128 + 8).
    Right against float64, and each activated out bit for bit its plain out through the unary op."""
    if not hopper(gpu):
        pytest.skip("the TMA kernels run on compute capability 9.0")
    name, case = f"matmul_tma192x128_{SHORT[dtype]}_{SHORT[dtype]}", (1, 4000, 1800, 384, dtype, False, False)
    assert tma_grid(name, 1, 4000, 1800) == (SMS, 1, 1)
    plain, (x, w, bias) = await direct_product(gpu, name, case, np.random.default_rng(11), tma_grid)
    close_of(dtype, plain, x, w, True, bias)
    await assert_activations_are_unary(gpu, name, case, 11, plain, dtype)


async def assert_activations_are_unary(
    gpu: gpud_client.Client, name: str, case: Any, seed: int, plain: np.ndarray[Any, Any], dtype: str
) -> dict[str, np.ndarray[Any, Any]]:
    """Kernel `name` with each epilogue activation on `case` (operands from `seed`) gives, bit for bit, its
    plain out `plain` through the unary op; those outs, by activation."""
    product = upload(gpu, plain, dtype)
    outs: dict[str, np.ndarray[Any, Any]] = {}
    for activation, code in ACTIVATIONS.items():
        fused, _ = await direct_product(gpu, name, case, np.random.default_rng(seed), tma_grid, code)
        unary = (
            gpu.ops.silu(product)
            if activation == "silu"
            else gpu.ops.gelu(product, approximate="tanh" if activation == "gelu_tanh" else "none")
        )
        want = await unary.numpy()
        assert np.ascontiguousarray(fused).tobytes() == np.ascontiguousarray(want).tobytes(), (
            f"{name} {activation}: not the product's unary op"
        )
        outs[activation] = fused
    return outs


def test_the_tiles_grids_and_rows() -> None:
    sizes = ("128x128", "128x64", "128x128pp", "192x128")
    assert set(TMA_TILES) == {f"matmul_tma{size}_{t}_{t}" for t in ("f16", "bf16") for size in sizes}
    assert {name: (t.bm, t.bn, t.stages, t.threads, t.pingpong) for name, t in TMA_TILES.items() if "_f16" in name} == {
        "matmul_tma128x128_f16_f16": (128, 128, 5, 384, False),
        "matmul_tma128x64_f16_f16": (128, 64, 8, 384, False),
        "matmul_tma128x128pp_f16_f16": (128, 128, 4, 384, True),
        "matmul_tma192x128_f16_f16": (192, 128, 4, 512, False),  # three consumer warpgroups
    }
    # the stages, the staging buffer of out, the barriers, 1 KB to align
    assert TMA_TILES["matmul_tma128x128_bf16_bf16"].shared == 5 * 256 * 128 + 34 * 1024 + 5 * 16 + 1024
    assert TMA_TILES["matmul_tma128x64_f16_f16"].shared == 8 * 192 * 128 + 18 * 1024 + 8 * 16 + 1024
    # ping-pong: a staging buffer per consumer, and the consumers' two turns beside the stages' barriers
    assert TMA_TILES["matmul_tma128x128pp_f16_f16"].shared == 4 * 256 * 128 + 2 * 34 * 1024 + 4 * 16 + 16 + 1024
    assert TMA_TILES["matmul_tma128x128pp_bf16_bf16"].shared == 201_808
    # 192 x 128: 4 stages of 40 KB, a staging buffer of 192 x 136 halves (51 KB)
    assert TMA_TILES["matmul_tma192x128_f16_f16"].shared == 4 * 320 * 128 + 51 * 1024 + 4 * 16 + 1024 == 217_152
    assert tma_grid("matmul_tma192x128_bf16_bf16", 1, 15360, 384) == (SMS, 1, 1)  # 80 x 3 tiles
    assert tma_grid("matmul_tma192x128_f16_f16", 3, 300, 200) == (4, 1, 3)  # 2 x 2 tiles a batch
    assert tma_grid("matmul_tma128x128pp_f16_f16", 4, 300, 200) == (6, 1, 4)  # matmul_tma128x128's
    assert tma_grid("matmul_tma128x128pp_bf16_bf16", 1, 2100, 2200) == (SMS, 1, 1)
    assert tma_grid("matmul_tma128x64_f16_f16", 1, 300, 200) == (12, 1, 1)  # 3 x 4 tiles
    for name, tile in TMA_TILES.items():
        assert KERNELS[name].shared == tile.shared <= 227 * 1024 and KERNELS[name].block == tile.threads
        assert tile.threads == 128 + (256 if tile.pingpong else 2 * tile.bm)  # a consumer warpgroup per 64 rows
    assert tma_grid("matmul_tma128x128_f16_f16", 1, 300, 200) == (6, 1, 1)  # 3 x 2 tiles
    assert tma_grid("matmul_tma128x128_f16_f16", 4, 300, 200) == (6, 1, 4)
    assert tma_grid("matmul_tma128x128_bf16_bf16", 2, 4096, 4096) == (SMS, 1, 2)  # 1,024 tiles
    assert tma_grid("matmul_tma128x128_f16_f16", 1, 128 * 12, 128 * 11) == (SMS, 1, 1)  # exactly SMS tiles
    assert tma_rows(1, 300, 200, 64, 0, 0) == (300, 200)
    assert tma_rows(3, 40, 72, 136, 40 * 136, 72 * 136) == (120, 216)  # batched: every batch's rows
    assert tma_rows(3, 50, 40, 64, 50 * 64, 0) == (150, 40)  # a shared w: its rows once
    assert tma_rows(2, 8, 40, 64, 8 * 64, 0) == (16, 40)
    assert BOX_K == 64


def infos(batch: int, m: int, n: int, k: int, dtype: str = "float16", batched: bool = True) -> list[TensorInfo]:
    x = TensorInfo(dtype, (batch, m, k))
    w = TensorInfo(dtype, (batch, n, k) if batched else (n, k))
    return [x, w, x, TensorInfo(dtype, (batch, m, n))]


def test_the_daemon_checks_the_dispatches() -> None:
    name = "matmul_tma128x128_f16_f16"
    verify, check = KERNELS[name].verify, KERNELS[name].check
    ok, scalars = infos(2, 300, 96, 64), [2, 300, 96, 64, 300 * 64, 96 * 64, 1, 0]
    verify(ok, scalars)
    verify(infos(1, 300, 96, 64, batched=False), [1, 300, 96, 64, 0, 0, 1, 0])
    verify(infos(3, 50, 40, 64, batched=False), [1, 150, 40, 64, 0, 0, 1, 0])  # shared w, folded
    verify(infos(3, 50, 40, 64, batched=False), [3, 50, 40, 64, 50 * 64, 0, 1, 0])  # ... and unfolded
    x12, w12, out12 = TensorInfo("float16", (12, 64)), TensorInfo("float16", (96, 64)), TensorInfo("float16", (12, 96))
    verify([x12, w12, x12, out12], [2, 6, 96, 64, 6 * 64, 0, 1, 0])  # matvec_groups' form: 2 groups of 6 rows
    bf = infos(1, 300, 96, 64, "bfloat16", batched=False)
    KERNELS["matmul_tma128x128_bf16_bf16"].verify(bf, [1, 300, 96, 64, 0, 0, 1, 0])
    x, w, _bias, out = ok
    for tensors, values, message in [
        (ok, [*scalars[:6], 0, 0], rf"{name} takes w as \(N, K\) only \(wt 1\), not wt 0"),
        (bf, [1, 300, 96, 64, 0, 0, 1, 0], "takes x float16 and w float16"),
        (ok, [2, 300, 96, 65, 300 * 64, 96 * 64, 1, 0], "do not match"),
        (
            infos(1, 300, 96, 60, batched=False),
            [1, 300, 96, 60, 0, 0, 1, 0],
            rf"{name} reads rows by TMA: K must be .* of 8, not 60",
        ),
        (infos(1, 300, 96, 3, batched=False), [1, 300, 96, 3, 0, 0, 1, 0], rf"{name} reads rows by TMA: .* not 3"),
        ([x._replace(offset=4), w, x, out], scalars, rf"{name} reads x by TMA .* x is a view at element 4"),
        ([x, w._replace(offset=12), x, out], scalars, rf"{name} reads w by TMA .* w is a view at element 12"),
    ]:
        with pytest.raises(OpError, match=message):
            check(tensors, values)
    # an offset of 8 elements is 16 bytes: the maps take it (verify's layout rule asks more of a view)
    check([x._replace(offset=8), w._replace(offset=16), x, out], scalars)


def test_the_tensor_maps_need_batches_of_whole_rows() -> None:
    """matmul's rule passes no such strides for whole tensors (tma_check comes after it in the spec's
    rule); tma_check refuses them on its own, as the kernel reads batch b from row b * stride / K."""
    name = "matmul_tma128x128_bf16_bf16"
    t = infos(2, 10, 8, 64, "bfloat16")
    with pytest.raises(OpError, match=rf"{name} reads batches as rows: x_stride 100 and w_stride 0 .* K 64"):
        tma_check(name, t, [2, 10, 8, 64, 100, 0, 1, 0])
    with pytest.raises(OpError, match="x_stride 640 and w_stride 72 must be multiples of K 64"):
        tma_check(name, t, [2, 10, 8, 64, 640, 72, 1, 0])
    tma_check(name, t, [1, 10, 8, 64, 100, 72, 1, 0])  # one batch: no stride is used
    tma_check(name, t, [2, 10, 8, 64, 640, 0, 1, 0])  # a shared w


def test_the_source_matches_its_interface() -> None:
    text = (ROOT / "gpud" / "ops" / "matmul_tma.cu").read_text()
    # each entry point one MATMUL_TMA(name, body, BM, BN, stages, bfloat16) line (its 128 + 2 BM threads a
    # block are checked in the PTX below); split-K's are MATMUL_TMAK lines: test_matmul_tmak.py
    found = re.findall(r"^MATMUL_TMA\((matmul_tma\w+), (matmul_tma(?:_pp)?), (\d+), (\d+), (\d+), (\w+)\)$", text, re.M)
    assert {name for name, *_ in found} == set(TMA_TILES)
    assert "__launch_bounds__(128 + 2 * (BM), 1) name(" in text
    for name, kernel, bm, bn, stages, bf in found:
        tile = TMA_TILES[name]
        assert (int(bm), int(bn), int(stages), bf) == (tile.bm, tile.bn, tile.stages, str("bf16" in name).lower())
        assert kernel == ("matmul_tma_pp" if tile.pingpong else "matmul_tma"), name
    full = source("matmul_tma", "cuda")
    assert full.count("struct alignas(64) TmaMap") == 1 and full.count("void wgmma_256_bf16(") == 1
    assert full.index("void gpud_wait_prior(") < full.index("u64 desc(") < full.index("struct alignas(64) TmaMap")


def test_the_family_builds_with_tensor_maps_first() -> None:
    """sm_90a only; each entry point takes x's and w's maps as 128-byte, 64-byte-aligned parameters, then
    bias and out as pointers and the eight u32 scalars of matmul."""
    lib = nvrtc.library()
    if lib is None:
        pytest.skip("no libnvrtc (pip install nvidia-cuda-nvrtc-cu12)")
    # test_cuda_sources builds every family of nvrtc.families() and finds every spec's entry point
    assert "matmul_tma" in nvrtc.families() and "matmul_tma" in nvrtc.SM_90A_ONLY
    ptx, log = nvrtc.compile_ptx(lib, source("matmul_tma", "cuda"), "sm_90a")
    assert ptx is not None, log
    for name in TMA_TILES:
        params = re.search(rf"\.entry {name}\((.*?)\)", ptx, re.S).group(1)  # type: ignore[union-attr]
        kinds = re.findall(r"\.param (\.align 64 \.b8|\.u64|\.u32) \w+?(\[128\])?(?:,|\s*$)", params.strip())
        assert kinds == [(".align 64 .b8", "[128]")] * 2 + [(".u64", "")] * 2 + [(".u32", "")] * 8, params
        assert re.search(rf"\.entry {name}\(.*?\)\s*\.maxntid {TMA_TILES[name].threads}, 1, 1", ptx, re.S)


def test_the_kernel_choice() -> None:
    """Large products only, as measured (h100/session6/wg-ws-persistent.json): MiniLM's and Qwen's layers."""
    f16, bf16 = "matmul_tma128x128_f16_f16", "matmul_tma128x128_bf16_bf16"
    assert tma_kernel(1, 4096, 384, 1536, "float16") == f16  # MiniLM's FFN down at 4,096 rows: 0.76x cuBLAS
    assert tma_kernel(1, 256, 4864, 896, "bfloat16") == bf16  # Qwen's gate/up at 256 rows: 76 tiles
    assert tma_kernel(1, 15360, 128, 896, "float16") == f16  # Qwen's k/v: 120 tiles
    assert tma_kernel(12, 1024, 1024, 128, "float16") == f16  # batched: 768 tiles of K 128
    assert tma_kernel(12, 512, 512, 64, "float16") is None  # 192 tiles of K 64: too little work
    assert tma_kernel(1, 256, 896, 4864, "float16") is None  # 14 tiles: matmul_wg
    assert tma_kernel(1, 4096, 384, 384, "float16") is None  # 96 tiles of K 384: matmul_wg won there
    assert tma_kernel(1, 15360, 384, 1532, "float16") is None  # K not a multiple of 8
    assert tma_kernel(1, 15360, 384, 1536, "float32") is None
    assert tma_kernel(1, 16, 151936, 896, "float16") is None  # an LM head at 16 rows: matmul_tc16x16 1.08x cuBLAS
    # ping-pong from 800 tiles with K up to 1,024 (h100/session8/gemm-sweep-pingpong.json)
    pp = "matmul_tma128x128pp_f16_f16"
    assert tma_kernel(1, 15360, 1536, 384, "float16") == pp  # MiniLM's FFN up at 15,360 rows: 1,440 tiles
    assert tma_kernel(1, 4096, 4864, 896, "bfloat16") == "matmul_tma128x128pp_bf16_bf16"  # Qwen's gate/up
    assert tma_kernel(1, 15360, 896, 4864, "float16") == f16  # Qwen's down: K 4,864
    assert tma_kernel(1, 4096, 896, 896, "float16") == f16  # 224 tiles: 2 a block
    assert tma_kernel(1, 64, 151936, 896, "float16") == "matmul_tma128x128pp_f16_f16"  # ... at 64 rows 1.06x
    # 128 x 64 tiles for one wave of 72 to 132 of them, 128 rows or more, K from 768 (h100/session8/gemm-sweep.json)
    narrow = "matmul_tma128x64_f16_f16"
    assert tma_kernel(1, 1024, 896, 896, "float16") == narrow  # Qwen's q/o: 112 tiles, 0.82x cuBLAS
    assert tma_kernel(1, 128, 4864, 896, "float16") == narrow  # gate/up at 128 rows: 76 tiles, 0.78x
    assert tma_kernel(1, 1024, 896, 4864, "bfloat16") == "matmul_tma128x64_bf16_bf16"  # down: 112 tiles
    assert tma_kernel(1, 64, 4864, 896, "float16") is None  # half of every tile's rows empty: matmul_wg
    assert tma_kernel(1, 1024, 1152, 384, "float16") != narrow  # 144 tiles: a second wave
    assert tma_kernel(1, 1024, 384, 1536, "float16") != narrow  # 48 tiles
    # 192 x 128 tiles from 1,024 rows: 180-760 of them with K up to 384, or up to 264 of them (h200x2/session9)
    wide = "matmul_tma192x128_f16_f16"
    assert tma_kernel(1, 15872, 1152, 384, "float16") == wide  # MiniLM's qkv at 256 x 62 tokens: 747 tiles
    assert tma_kernel(1, 15872, 384, 384, "float16") == wide  # its attention output: 249 tiles
    assert tma_kernel(1, 15872, 384, 1536, "bfloat16") == "matmul_tma192x128_bf16_bf16"  # FFN down: 249, K 1,536
    assert tma_kernel(1, 1024, 4864, 896, "float16") == wide  # Qwen's gate/up at 1,024 rows: 228 tiles
    assert tma_kernel(1, 15360, 896, 896, "float16") == pp  # 560 tiles of K 896: the ping-pong tiles won
    assert tma_kernel(1, 4096, 896, 896, "float16") != wide  # 154 tiles: a second wave mostly empty
    assert tma_kernel(12, 1024, 1024, 128, "float16") != wide  # batches: not measured


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
async def test_the_op_sends_large_products_there_eager_and_replayed(gpu: gpud_client.Client, dtype: str) -> None:
    """gpu.ops.matmul picks the kernel by itself; in a replay graph its tensor maps are made from the
    tensors bound at each replay (two different inputs, each product right)."""
    if not hopper(gpu):
        pytest.skip("the TMA kernels run on compute capability 9.0")
    rng = np.random.default_rng()
    m, n, k = 2048, 1536, 384
    assert tma_kernel(1, m, n, k, dtype) is not None
    x, w, bias = rand_of(rng, (m, k), dtype), rand_of(rng, (n, k), dtype), rand_of(rng, (n,), dtype)
    tw, tb = upload(gpu, w, dtype), upload(gpu, bias, dtype)
    close_of(
        dtype, await gpu.ops.matmul(upload(gpu, x, dtype), tw, transpose_w=True, bias=tb).numpy(), x, w, True, bias
    )
    assert any(name.startswith("matmul_tma") for name in gpu.ops._kernels)
    if dtype == "bfloat16":
        return  # a replay's inputs come as numpy arrays: float16 here
    g = gpu.graph("tma")
    v = g.input("x", (m, k), dtype)
    g.output("y", gpu.ops.matmul(v, tw, transpose_w=True, bias=tb, graph=g))
    step = await g.build()
    for _ in range(2):
        x = rand_of(rng, (m, k), dtype)
        close_of(dtype, np.asarray((await step.replay(x=x))["y"]), x, w, True, bias)

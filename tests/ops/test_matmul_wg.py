"""The float16 and bfloat16 matmuls on Hopper's warpgroup tensor cores (matmul_wg<BM>x<BN>_<t>_<t>, CUDA
on compute capability 9.0 only) against numpy in float64: every tile at sizes off its tile, K not a
multiple of 8 (rows off 16-byte alignment: the element-at-a-time loads), biases of every float dtype,
batches; the products the op sends there; the tile choice, grids and the daemon's checks as pure
functions; the kernel source against its generator and its interface module. Tolerances as in
test_matmul_tc.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gpud_client
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.matmul import BIAS_KINDS, plan
from gpud_protocol.ops.matmul_wg import CAPABILITY, MIN_ROWS, SMS, WG_TILES, wg_grid, wg_kernel
from ops.test_matmul_bf16 import rand as rand_of
from ops.test_matmul_bf16 import upload
from ops.test_matmul_tc import close_of, dtype_of

ROOT = Path(__file__).resolve().parents[2]
# (batch, M, N, K, bias dtype, batched w)
EDGES = [
    (1, 17, 33, 70, None, False),
    (1, 130, 136, 200, "float16", False),
    (1, 257, 264, 1000, "float32", False),
    (1, 70, 66, 44, "bfloat16", False),
    (2, 40, 72, 136, "float32", True),
    (3, 7, 40, 24, "float16", False),  # a shared w: the batches fold into 21 rows
    (1, 1, 5, 3, None, False),
    (1, 150, 40, 1000, None, False),
]


def hopper(gpu: gpud_client.Client) -> bool:
    return bool(gpu.backend == "cuda" and gpu.devices[0].get("compute_capability") == CAPABILITY)


async def wg_product(gpu: gpud_client.Client, name: str, case: tuple[object, ...], rng: np.random.Generator) -> None:
    """Kernel `name` dispatched directly into a poisoned output, checked against float64."""
    batch, m, n, k, bias_dtype, batched = case
    assert isinstance(batch, int) and isinstance(m, int) and isinstance(n, int) and isinstance(k, int)
    dtype = dtype_of(name)
    x = rand_of(rng, (batch, m, k), dtype)
    w = rand_of(rng, (batch, n, k) if batched else (n, k), dtype)
    bias = None if bias_dtype is None else rand_of(rng, (n,), str(bias_dtype), 4.0)
    p = plan(x.shape, w.shape, True)
    out = upload(gpu, np.full(p.out_shape, np.nan, np.float32), dtype)
    tx, tw = upload(gpu, x, dtype), upload(gpu, w, dtype)
    tb = tx if bias is None else upload(gpu, bias, str(bias_dtype))
    epilogue = 0 if bias is None else BIAS_KINDS[str(bias_dtype)]
    gpu.ops._run(name, wg_grid(name, p.batch, p.m, p.n), [tx, tw, tb, out], [*p.sizes, 1, epilogue], None)
    close_of(dtype, await out.numpy(), x, w, True, bias)


@pytest.mark.parametrize("name", list(WG_TILES))
async def test_every_tile_at_edges(gpu: gpud_client.Client, name: str) -> None:
    if not hopper(gpu):
        pytest.skip("the warpgroup kernels run on compute capability 9.0")
    rng = np.random.default_rng()
    for case in EDGES:
        await wg_product(gpu, name, case, rng)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
async def test_the_op_sends_wide_products_there(gpu: gpud_client.Client, dtype: str) -> None:
    if not hopper(gpu):
        pytest.skip("the warpgroup kernels run on compute capability 9.0")
    rng = np.random.default_rng()
    for m, n, k in ((256, 4864, 896), (1000, 384, 1536), (4096, 1536, 384)):
        assert wg_kernel(m, n, k, dtype) is not None
        x, w, bias = rand_of(rng, (m, k), dtype), rand_of(rng, (n, k), dtype), rand_of(rng, (n,), dtype)
        out = upload(gpu, np.full((m, n), np.nan, np.float32), dtype)
        gpu.ops.matmul(
            upload(gpu, x, dtype), upload(gpu, w, dtype), transpose_w=True, bias=upload(gpu, bias, dtype), out=out
        )
        close_of(dtype, await out.numpy(), x, w, True, bias)
    assert any(name.startswith("matmul_wg") for name in gpu.ops._kernels)


def test_the_tile_choice_and_grids() -> None:
    assert wg_kernel(MIN_ROWS - 1, 151936, 896, "float16") is None  # few rows: matmul_tc
    assert wg_kernel(256, 128, 896, "float16") is None  # too few tiles to fill the GPU
    assert wg_kernel(4096, 1536, 384, "float32") is None
    assert wg_kernel(4096, 4864, 896, "bfloat16") == "matmul_wg128x256_bf16_bf16"
    # refitted on h100/session8/gemm-sweep.json: 6 stages while the 64 x 64 tiles fit two blocks per
    # multiprocessor, 4 past that; from 56 tiles and 64 rows
    assert wg_kernel(256, 1152, 384, "float16") == "matmul_wg64x64d_f16_f16"  # MiniLM's qkv: 72 tiles
    assert wg_kernel(4096, 128, 896, "float16") == "matmul_wg64x64d_f16_f16"  # Qwen's k/v: 128 tiles
    assert wg_kernel(64, 4864, 896, "float16") == "matmul_wg64x64d_f16_f16"  # Qwen's gate/up at 64 rows
    assert wg_kernel(1024, 1152, 384, "float16") == "matmul_wg64x64_f16_f16"  # 288 tiles: three blocks per SM
    assert wg_kernel(256, 384, 384, "float16") is None  # 24 tiles: matmul_tc
    for m in (128, 300, 1024, 4096, 15360):
        for n in (384, 896, 1152, 4864, 151936):
            name = wg_kernel(m, n, 896, "float16")
            if name is None:
                continue
            tile = WG_TILES[name]
            tiles = -(-m // tile.bm) * -(-n // tile.bn)
            gx, gy, gz = wg_grid(name, 3, m, n)
            assert gz == 3 and gx * gy >= tiles and gx <= 65535 and (gy == 1 or gx * (gy - 1) < tiles)
            assert tiles >= SMS // 4, (m, n, name)


def test_the_daemon_checks_the_dispatches() -> None:
    check = KERNELS["matmul_wg64x64_f16_f16"].verify
    x, w, out = TensorInfo("float16", (300, 64)), TensorInfo("float16", (96, 64)), TensorInfo("float16", (300, 96))
    check([x, w, x, out], [1, 300, 96, 64, 0, 0, 1, 0])
    for tensors, scalars, message in [
        ([x, w, x, out], [1, 300, 96, 64, 0, 0, 0, 0], r"w as \(N, K\) only"),
        ([x, TensorInfo("bfloat16", (96, 64)), x, out], [1, 300, 96, 64, 0, 0, 1, 0], "takes x float16 and w float16"),
        ([x, w, x, TensorInfo("float32", (300, 96))], [1, 300, 96, 64, 0, 0, 1, 0], "out is float32"),
        ([x, w, x, out], [1, 300, 96, 65, 0, 0, 1, 0], "do not match"),
        ([x, w, TensorInfo("float16", (96,)), out], [1, 300, 96, 64, 0, 0, 1, 3], "bfloat16 bias"),
    ]:
        with pytest.raises(OpError, match=message):
            check(tensors, scalars)


def test_the_source_matches_its_generator_and_interface() -> None:
    source = (ROOT / "gpud" / "ops" / "matmul_wg.cu").read_text()
    generated = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-wgmma.py")], capture_output=True, text=True, check=True
    ).stdout
    # the wgmma wrappers (the prelude wgmma.cu's) are the generator's, unedited
    assert generated.strip() in (ROOT / "gpud" / "ops" / "wgmma.cu").read_text()
    found = re.findall(r"__launch_bounds__\((\d+), \d+\) (matmul_wg\w+)\(", source)
    entries = {name: int(threads) for threads, name in found}
    assert entries == {name: tile.threads for name, tile in WG_TILES.items()}
    for name, tile in WG_TILES.items():
        assert KERNELS[name].shared == tile.shared <= 227 * 1024 and KERNELS[name].block == tile.threads
        wg, bn, stages = re.search(rf"{name}\(.*?matmul_wg<(\d+), (\d+), (\d+),", source, re.S).groups()  # type: ignore[union-attr]
        assert (64 * int(wg), int(bn), int(stages)) == (tile.bm, tile.bn, tile.stages)


def test_the_shared_helpers_are_defined_once_before_the_families_that_use_them() -> None:
    """cp_async.cu and products.cu: the copies, the 16-bit conversions and the bias reader of both
    matrix families, one definition each (matmul_wg had its own bfloat16 rounding)."""
    from gpud.ops import source

    for family in ("matmul_tc", "matmul_wg"):
        text = source(family, "cuda")
        assert text.count("void cp_async16(") == 1 and text.index("void cp_async16(") < text.index("cp_async16(sa")
        for helper in ("short f2bf(float", "short f2h(float", "float bias_at("):
            assert text.count(helper) == 1 and text.index(helper) < text.index("__global__"), (family, helper)

"""Every tensor-core matmul kernel at every point of README's GEMM table, beside cuBLAS and the op's
choice: what the choice functions (tc_kernel, wg_kernel, tma_kernel, tma_splits) are fitted on. CUDA,
Hopper, in process; float16 x and w (N, K); timed as `gpud bench ops` times them (benchmarks/ops.py:
CUDA graphs of many calls over copies of w spanning 4x the L2 cache, the best of several replays).

    python3 -m benchmarks.gemm_sweep [--json FILE] [--shapes NAME ...]

Printed per point: torch's µs, the op's pick and its throughput ratio to torch, the best kernel and
its ratio; at the end how many points meet issue #15's target (1.0 up to 8 rows, 0.8 past) with the
pick and with the best kernel of each point.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import write_json
from benchmarks.ops import MAX_LAUNCHES, MINILM, SHAPES, _choice, _gpud_matmul, _torch_linear
from benchmarks.ops_device import check, open_device0, optional_torch, verify, weight_copies
from gpud_protocol.ops.matmul import TC_TILES, tc_grid
from gpud_protocol.ops.matmul_tma import TMA_TILES, tma_grid
from gpud_protocol.ops.matmul_tmak import SPLITS, tmak_grid, tmak_name
from gpud_protocol.ops.matmul_wg import WG_TILES, wg_grid

ROWS = (8, 16, 64, 128, 256, 1024, 4096, 15360)
LAUNCH_US = 2.0  # a graph node's own cost beside the product, for the count of calls per graph
SMS = 132


def target(m: int) -> float:
    return 1.0 if m <= 8 else 0.8


def candidates(m: int, n: int, k: int) -> list[tuple[str, tuple[int, int, int]]]:
    """The float16 kernels worth timing for (m, k) @ (n, k)^T: skips only the hopeless (small tiles at
    thousands of rows, split-K over far more blocks than multiprocessors)."""
    out: list[tuple[str, tuple[int, int, int]]] = []
    for name, tile in TC_TILES.items():
        if (tile.bm <= 32 and m > 2048) or (tile.bm <= 16 and m > 256):
            continue
        out.append((name, tc_grid(name, 1, m, n)))
    if m >= 64:
        out += [(name, wg_grid(name, 1, m, n)) for name in WG_TILES if name.endswith("_f16_f16")]
    if k % 8 == 0:
        out += [(name, tma_grid(name, 1, m, n)) for name in TMA_TILES if name.endswith("_f16_f16")]
        tiles = -(-m // 128) * -(-n // 128)
        for splits in SPLITS:
            if m >= 16 and tiles * splits <= 2 * SMS and k > (splits - 1) * 64:
                name = tmak_name("float16", splits)
                out.append((name, tmak_grid(name, 1, m, n)))
    return out


async def _measure(cache_dir: str, shapes: set[str] | None) -> dict[str, Any]:
    torch, skipped = optional_torch()
    if skipped:
        print(f"torch skipped: {skipped}")
    reps = 5
    dev = open_device0(cache_dir)
    rt, cu = dev.rt, dev.cu
    print(f"device: {dev.name}, L2 {dev.l2 >> 20} MiB, capability {dev.capability}")
    rng = np.random.default_rng(0)
    results: list[dict[str, Any]] = []
    points = [(s, n, k) for s, n, k, _ in SHAPES] + MINILM
    for shape, n, k in points:
        if shapes and shape not in shapes:
            continue
        w_host = (rng.standard_normal((n, k), dtype=np.float32) / math.sqrt(k)).astype(np.float16)
        w64 = w_host.astype(np.float64)
        w_dev, stride, copies = weight_copies(dev, w_host, MAX_LAUNCHES)
        for m in ROWS:
            if shape == "lm_head" and m > 4096:
                continue
            x_host = rng.standard_normal((m, k), dtype=np.float32).astype(np.float16)
            est = max(w_host.nbytes / 3e12, 2 * m * n * k / 3e14) + LAUNCH_US * 1e-6
            launches = max(3, min(MAX_LAUNCHES, math.ceil(2e-3 / est)))
            picked = _choice("f16", m, n, k, dev.capability)[0]
            row: dict[str, Any] = {"shape": shape, "n": n, "k": k, "m": m, "picked": picked, "us": {}}
            if torch is not None:
                samples, _ = _torch_linear(torch, w_host, copies, x_host, launches, reps)
                row["us"]["torch"] = min(samples) / launches * 1e6
            for kernel, grid in candidates(m, n, k):
                if kernel not in dev.functions:
                    await dev.compile(kernel)
                weights = [w_dev + (i % copies) * stride for i in range(launches)]
                samples, got = _gpud_matmul(dev, kernel, x_host, weights, n, reps, grid)
                try:
                    verify(f"{kernel} {shape} M={m}", got, x_host, w64, min(m, 8))
                except AssertionError as exc:  # kept, and timed: the sweep goes on
                    print(f"WRONG: {exc}", flush=True)
                    row.setdefault("wrong", []).append(kernel)
                row["us"][kernel] = min(samples) / launches * 1e6
            results.append(row)
            _print(row)
        dev.free_all()
    check(cu.cuStreamDestroy(dev.stream))
    await rt.close()
    return {"device": dev.name, "torch": None if torch is None else torch.__version__, "results": results}


def _short(kernel: str) -> str:
    return kernel.removeprefix("matmul_").removesuffix("_f16_f16")


def best(row: dict[str, Any]) -> str:
    us: dict[str, float] = row["us"]
    kernels: list[str] = [kernel for kernel in us if kernel != "torch" and kernel not in row.get("wrong", [])]
    return min(kernels, key=lambda kernel: us[kernel])


def _print(row: dict[str, Any]) -> None:
    us, torch = row["us"], row["us"].get("torch", math.nan)
    pick, top = us.get(row["picked"], math.nan), best(row)
    others = "  ".join(f"{_short(kernel)} {t:.2f}" for kernel, t in sorted(us.items(), key=lambda kv: kv[1]))
    print(
        f"{row['shape']:<16} {row['n']:>6}x{row['k']:<5} M={row['m']:<6} torch {torch:8.2f}"
        f"  pick {_short(row['picked']):<14} {torch / pick:5.2f}  best {_short(top):<14} {torch / us[top]:5.2f}"
        f"  | {others}",
        flush=True,
    )


def summary(results: list[dict[str, Any]]) -> str:
    rows = [r for r in results if "torch" in r["us"]]
    met_pick = sum(r["us"]["torch"] / r["us"].get(r["picked"], math.inf) >= target(r["m"]) for r in rows)
    met_best = sum(r["us"]["torch"] / r["us"][best(r)] >= target(r["m"]) for r in rows)
    return f"{len(rows)} points: {met_pick} meet the target with the op's pick, {met_best} with each point's best"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--shapes", nargs="*", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:  # GPUD_CACHE_DIR: kernels compiled before (device-check's)
        cache_dir = os.environ.get("GPUD_CACHE_DIR", scratch)
        measured = asyncio.run(_measure(cache_dir, set(args.shapes) if args.shapes else None))
    print(summary(measured["results"]))
    write_json(args.json, {"benchmark": "gemm-sweep", **measured})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

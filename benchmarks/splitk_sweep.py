"""Split-K's sweep (matmul_tmak: gpud_protocol.ops.matmul_tmak) on CUDA, in process, beside cuBLAS: for
products of few 128 x 128 tiles, every count of splits, the kernel the op picked without split-K, and
torch's F.linear, timed as `gpud bench ops` times them (benchmarks/ops.py: CUDA graphs of many calls
over copies of w spanning 4x the L2 cache, the best of several replays). What tma_splits is fitted on.

    python3 -m benchmarks.splitk_sweep [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import write_json
from benchmarks.ops import MAX_LAUNCHES, _gpud_matmul, _torch_linear
from benchmarks.ops_device import check, open_device0, optional_torch, verify, weight_copies
from gpud_protocol.ops.matmul import tc_grid, tc_kernel
from gpud_protocol.ops.matmul_tma import tma_grid, tma_kernel
from gpud_protocol.ops.matmul_tmak import SPLITS, tma_splits, tmak_grid, tmak_name
from gpud_protocol.ops.matmul_wg import wg_grid, wg_kernel

POINTS = [  # (name, N, K, rows)
    ("down_proj", 896, 4864, (16, 32, 64, 128, 256, 512, 1024, 2048)),
    ("K 3072", 896, 3072, (64, 256, 1024)),  # about MIN_WORK (gpud_protocol.ops.matmul_tmak)
    ("K 2048", 896, 2048, (64, 256)),
    ("gate/up_proj", 4864, 896, (64, 128, 256)),
    ("q_proj", 896, 896, (128, 256, 1024)),
    ("k_proj/v_proj", 128, 896, (1024, 4096)),
    ("minilm ffn down", 384, 1536, (64, 256, 1024, 2048)),
    ("minilm ffn up", 1536, 384, (256, 1024)),
    ("minilm qkv", 1152, 384, (256, 1024)),
    ("minilm attn", 384, 384, (1024, 4096)),
]
LAUNCH_US = 2.0  # a graph node's own cost beside the product, for the count of calls per graph


def unsplit(m: int, n: int, k: int) -> tuple[str, tuple[int, int, int]]:
    """The kernel and grid the op picked before split-K (float16, Hopper)."""
    if (name := tma_kernel(1, m, n, k, "float16")) is not None:
        return name, tma_grid(name, 1, m, n)
    if (name := wg_kernel(m, n, k, "float16")) is not None:
        return name, wg_grid(name, 1, m, n)
    name = tc_kernel(m, n, k)
    return name, tc_grid(name, 1, m, n)


async def _measure(cache_dir: str) -> dict[str, Any]:
    torch, skipped = optional_torch()
    if skipped:
        print(f"torch skipped: {skipped}")
    reps = 7
    dev = open_device0(cache_dir)
    rt, cu = dev.rt, dev.cu
    print(f"device: {dev.name}, L2 {dev.l2 >> 20} MiB")
    rng = np.random.default_rng(0)
    results: list[dict[str, Any]] = []
    for shape, n, k, rows in POINTS:
        w_host = (rng.standard_normal((n, k), dtype=np.float32) / math.sqrt(k)).astype(np.float16)
        w64 = w_host.astype(np.float64)
        w_dev, stride, copies = weight_copies(dev, w_host, MAX_LAUNCHES)
        for m in rows:
            x_host = rng.standard_normal((m, k), dtype=np.float32).astype(np.float16)
            before, before_grid = unsplit(m, n, k)
            tma = "matmul_tma128x128_f16_f16"
            ways: list[tuple[str, str, Any]] = [("before", before, before_grid), ("1", tma, tma_grid(tma, 1, m, n))]
            for splits in SPLITS:
                name = tmak_name("float16", splits)
                ways.append((str(splits), name, tmak_grid(name, 1, m, n)))
            ways += [("torch", "torch", None)] if torch is not None else []
            row: dict[str, Any] = {"shape": shape, "n": n, "k": k, "m": m, "tiles": tma_grid(tma, 1, m, n)[0]}
            row["picked"] = tma_splits(1, m, n, k, "float16")
            row["before"], row["us"] = before, {}
            for key, kernel, grid in ways:
                if kernel != "torch" and kernel not in dev.functions:
                    await dev.compile(kernel)
                est = max(w_host.nbytes / 3e12, 2 * m * n * k / 3e14) + LAUNCH_US * 1e-6
                launches = max(3, min(MAX_LAUNCHES, math.ceil(2e-3 / est)))
                if kernel == "torch":
                    samples, got = _torch_linear(torch, w_host, copies, x_host, launches, reps)
                else:
                    weights = [w_dev + (i % copies) * stride for i in range(launches)]
                    samples, got = _gpud_matmul(dev, kernel, x_host, weights, n, reps, grid)
                    try:
                        verify(f"{kernel} {shape} M={m}", got, x_host, w64, min(m, 8))
                    except AssertionError as exc:  # kept, and timed: the sweep goes on
                        print(f"WRONG: {exc}", flush=True)
                        row.setdefault("wrong", []).append(key)
                row["us"][key] = min(samples) / launches * 1e6
            results.append(row)
            us = row["us"]
            best = min((s for s in us if s.isdigit()), key=lambda s: us[s])  # "1": matmul_tma unsplit
            print(
                f"{shape:<16} {n:>5}x{k:<5} M={m:<5} tiles {row['tiles']:>3}  torch {us.get('torch', math.nan):6.2f}"
                f"  before {us['before']:6.2f} ({before.split('_')[1]})  best split {best:>2}: {us[best]:6.2f}"
                f"  picked {row['picked']}  | " + " ".join(f"{s}:{us[s]:.2f}" for s in us if s.isdigit()),
                flush=True,
            )
        dev.free_all()
    check(cu.cuStreamDestroy(dev.stream))
    await rt.close()
    return {"device": dev.name, "torch": None if torch is None else torch.__version__, "results": results}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache_dir:
        measured = asyncio.run(_measure(cache_dir))
    write_json(args.json, {"benchmark": "splitk-sweep", **measured})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`gpud bench ops`: the op library's matrix products on CUDA, in process, beside PyTorch.

    python3 -m gpud bench ops [--quick] [--json FILE]

The linear layers of a 0.5B decoder (Qwen2.5-0.5B), out = x @ w.T with w (N, K) float16
(transpose_w=True): q/o_proj (896, 896), k/v_proj (128, 896), gate/up_proj (4864, 896), down_proj
(896, 4864) and the LM head (151936, 896); and MiniLM's (384, 384), (1152, 384), (1536, 384) and
(384, 1536). M = 1 and 8 rows of x (decode: the matvec kernel; float16 x at 8 rows goes to the tensor
cores, as the op sends it), then 16 to 4096 (prefill: the kernel the op picks); x float32 (float32 out:
the FFMA tiles past 8 rows, timed up to M = 256 only) and float16 (float16 out: the tensor cores past 8
rows); and PyTorch's `torch.nn.functional.linear` with
float16 x and w on the same shapes (cuBLAS). --quick: M = 1 and 128 only.

Timing: each way is captured into one CUDA graph of many calls, each call reading another copy of w
(the copies span 4x the L2 cache, so w comes from memory as in a decode step), and the graph is
replayed between two synchronizes; the best of several replays, per call. GB/s counts w's bytes once
per call (x and out are small beside w at decode sizes); "of copy" divides that by the bandwidth of a
1 GiB cuMemcpyDtoD counting bytes read plus written (what the memory sustains); TFLOP/s = 2 M N K / t.
Every output is checked against numpy (float64, its first rows) before it is timed. For the float16
matmul on its own (every shape and M, tile variants, edge cases) see benchmarks/gemm_harness.py.

The kernels are gpud/ops/matmul.cu and matmul_tc.cu compiled through gpud's CUDA backend (a
DeviceRuntime over device 0: NVRTC, the disk cache) and launched with cuLaunchKernel: no daemon, no
socket. Nothing GPU-related is imported before main() runs. PyTorch is optional (its rows are skipped without it).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import write_json
from benchmarks.ops_device import Device, check, open_device0, optional_torch, times, verify, weight_copies

SHAPES = [  # (name, N, K, count per decode step: 24 layers of the decoder, then the LM head)
    ("q_proj+o_proj", 896, 896, 48),
    ("k_proj/v_proj", 128, 896, 48),
    ("gate/up_proj", 4864, 896, 48),
    ("down_proj", 896, 4864, 24),
    ("lm_head", 151936, 896, 1),
]
MINILM = [  # (name, N, K): a MiniLM encoder's linear layers (hidden 384, FFN 1536)
    ("minilm attn", 384, 384),
    ("minilm qkv", 1152, 384),
    ("minilm ffn up", 1536, 384),
    ("minilm ffn down", 384, 1536),
]
ROWS = (1, 8, 16, 64, 128, 256, 1024, 4096, 15360)  # 15,360: MiniLM's 256 sentences of 60 tokens
FFMA_ROWS = 256  # the float32 tiles are timed up to this many rows (past it, minutes of FFMA)
GRAPH_SECONDS = 2e-3  # aim for a graph replay this long
MAX_LAUNCHES = 2000
SHORT = {"float32": "f32", "float16": "f16"}


def _choice(x_short: str, m: int, n: int, k: int, capability: str) -> tuple[str, tuple[int, int, int]]:
    """The kernel and grid gpu.ops.matmul picks on CUDA for x @ w.T with w (N, K) float16 (client/
    gpud_client/ops/matmul.py: matvec, then on the tensor cores matmul_tmak (split-K), matmul_tma,
    matmul_wg or matmul_tc)."""
    from gpud_protocol.ops.matmul import MATVEC_ROWS, matmul_grid, matvec_grid, tc_grid, tc_kernel
    from gpud_protocol.ops.matmul_tma import tma_grid, tma_kernel
    from gpud_protocol.ops.matmul_tmak import tma_splits, tmak_grid, tmak_name
    from gpud_protocol.ops.matmul_wg import CAPABILITY, wg_grid, wg_kernel

    if m == 1 or (m <= MATVEC_ROWS and x_short != "f16"):  # 16-bit x from 2 rows: the tensor cores
        return f"matvec_{x_short}_f16", matvec_grid(1, n, k, True)
    if x_short == "f16":
        hopper = capability == CAPABILITY
        if hopper and (splits := tma_splits(1, m, n, k, "float16")) > 1:
            split = tmak_name("float16", splits)
            return split, tmak_grid(split, 1, m, n)
        if hopper and (name := tma_kernel(1, m, n, k, "float16")) is not None:
            return name, tma_grid(name, 1, m, n)
        if hopper and (name := wg_kernel(m, n, k, "float16")) is not None:
            return name, wg_grid(name, 1, m, n)
        name = tc_kernel(m, n, k)
        return name, tc_grid(name, 1, m, n)
    return f"matmul_{x_short}_f16", matmul_grid(1, m, n)


def _gpud_matmul(
    dev: Device,
    kernel: str,
    x_host: np.ndarray,
    weights: list[int],
    n: int,
    reps: int,
    grid: tuple[int, int, int] | None = None,
) -> tuple[list[float], np.ndarray]:
    """The kernel over w (N, K) at each of `weights` in turn, a CUDA graph of one launch per address;
    also its output for the first weight, for the check. `grid`: the kernel's, where not the op's choice."""
    m, k = x_host.shape
    out_dtype = "float16" if x_host.dtype == np.float16 else "float32"
    x_dev, out_dev = dev.alloc(x_host.nbytes), dev.alloc(m * n * np.dtype(out_dtype).itemsize)
    dev.upload(x_dev, x_host)
    grid = grid or _choice(SHORT[x_host.dtype.name], m, n, k, dev.capability)[1]
    scalars = [1, m, n, k, 0, 0, 1, 0]  # batch, m, n, k, strides, transpose_w, no bias
    dev.launch(kernel, grid, [x_dev, weights[0], x_dev, out_dev], scalars)
    dev.sync()
    got = dev.download(out_dev, (m, n), out_dtype)

    def calls() -> None:
        for w in weights:
            dev.launch(kernel, grid, [x_dev, w, x_dev, out_dev], scalars)

    return times(dev.graph(calls), dev.sync, reps), got


def _torch_linear(
    torch: Any, w_host: np.ndarray, copies: int, x_host: np.ndarray, launches: int, reps: int
) -> tuple[list[float], np.ndarray]:
    """F.linear(x, w_i) in float16, a CUDA graph of `launches` calls over the copies of w."""
    functional = torch.nn.functional
    w = torch.empty((copies, *w_host.shape), dtype=torch.float16, device="cuda")
    w[0].copy_(torch.from_numpy(w_host))
    w[1:].copy_(w[0].expand(copies - 1, *w_host.shape))
    x = torch.from_numpy(x_host.astype(np.float16)).cuda()
    check = functional.linear(x, w[0]).cpu().numpy()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            functional.linear(x, w[1])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            functional.linear(x, w[i % copies])
    samples = times(graph.replay, torch.cuda.synchronize, reps)
    del graph, w, x
    torch.cuda.empty_cache()
    return samples, check


async def _measure(quick: bool, cache_dir: str) -> dict[str, Any]:
    torch, torch_skipped = optional_torch()
    reps = 3 if quick else 7
    rows_list = (1, 128) if quick else ROWS
    dev = open_device0(cache_dir)
    rt, cu = dev.rt, dev.cu
    copy_bw = dev.copy_bandwidth(reps)
    print(f"device: {dev.name}, L2 {dev.l2 >> 20} MiB")
    print(f"cuMemcpyDtoD of 1 GiB: {copy_bw / 1e9:.0f} GB/s (bytes read + written)")

    rng = np.random.default_rng(0)
    results: list[dict[str, Any]] = []
    for shape_name, n, k in [(name, n, k) for name, n, k, _count in SHAPES] + MINILM:
        w_host = (rng.standard_normal((n, k), dtype=np.float32) / math.sqrt(k)).astype(np.float16)
        w_bytes, w64 = w_host.nbytes, w_host.astype(np.float64)
        w_dev, stride, copies = weight_copies(dev, w_host, MAX_LAUNCHES)
        for m in rows_list:
            x32 = rng.standard_normal((m, k), dtype=np.float32)
            ways: list[tuple[str, str, Any]] = []
            for x_dtype in ("float32", "float16"):
                kernel = _choice(SHORT[x_dtype], m, n, k, dev.capability)[0]
                kind = kernel.split("_")[0] if x_dtype == "float32" or m <= 8 else "_".join(kernel.split("_")[:2])[:10]
                if kernel.startswith("matmul_tmak"):
                    kind = kernel.split("_")[1]  # tmak<splits>
                if (x_dtype == "float32" and m > FFMA_ROWS) or (shape_name == "lm_head" and m > 4096):
                    continue
                ways.append((f"gpud {SHORT[x_dtype]} x, f16 w ({kind})", kernel, x_dtype))
                if kernel not in dev.functions:
                    await dev.compile(kernel)
            if torch is not None:
                ways.append(("torch F.linear f16", "torch", "float16"))
            for way, kernel, x_dtype in ways:
                x_host = x32.astype(x_dtype)
                rate = 2e13 if kernel.startswith("matmul_f") else 3e14  # FFMA tiles, else tensor cores
                est = max(w_bytes / 3e12, 2 * m * n * k / rate) + 2e-6
                launches = max(3, min(MAX_LAUNCHES, math.ceil(GRAPH_SECONDS / est)))
                if quick:
                    launches = max(3, launches // 2)
                check_rows = min(m, 8)
                if kernel == "torch":
                    samples, got = _torch_linear(torch, w_host, copies, x_host, launches, reps)
                    # cuBLAS may reduce in float16 (split K): a looser bound, a sanity check only
                    verify(f"torch {shape_name} M={m}", got, x_host, w64, check_rows, 1e-3)
                else:
                    weights = [w_dev + (i % copies) * stride for i in range(launches)]
                    samples, got = _gpud_matmul(dev, kernel, x_host, weights, n, reps)
                    verify(f"{kernel} {shape_name} M={m}", got, x_host, w64, check_rows)
                seconds = min(samples) / launches
                gb_s = w_bytes / seconds / 1e9
                results.append(
                    {
                        "shape": shape_name,
                        "n": n,
                        "k": k,
                        "m": m,
                        "way": way,
                        "kernel": kernel,
                        "us_per_call": seconds * 1e6,
                        "us_per_call_median": statistics.median(samples) / launches * 1e6,
                        "weight_gb_s": gb_s,
                        "of_copy_bandwidth": gb_s * 1e9 / copy_bw,
                        "tflop_s": 2 * m * n * k / seconds / 1e12,
                        "weight_copies": copies,
                        "calls_per_graph": launches,
                    }
                )
        dev.free_all()
    check(cu.cuStreamDestroy(dev.stream))
    await rt.close()
    return {
        "device": dev.name,
        "l2_bytes": dev.l2,
        "copy_gb_s": copy_bw / 1e9,
        "torch": None if torch is None else torch.__version__,
        "torch_skipped": torch_skipped,
        "results": results,
    }


def _print(measured: dict[str, Any]) -> dict[str, Any]:
    rows = measured["results"]
    print(
        f"\n{'shape':<16} {'N x K':>12} {'M':>4}  {'way':<36} {'us/call':>9} {'GB/s':>7} {'of copy':>8} {'TFLOP/s':>8}"
    )
    for r in rows:
        print(
            f"{r['shape']:<16} {str(r['n']) + 'x' + str(r['k']):>12} {r['m']:>4}  {r['way']:<36}"
            f" {r['us_per_call']:9.2f} {r['weight_gb_s']:7.0f} {r['of_copy_bandwidth']:8.1%} {r['tflop_s']:8.2f}"
        )
    # one decode step's linear layers (24 layers and the LM head), by way, at M = 1
    summary: dict[str, Any] = {}
    counts = {name: count for name, _n, _k, count in SHAPES}
    weight_bytes = sum(n * k * 2 * count for _name, n, k, count in SHAPES)
    for way in dict.fromkeys(r["way"] for r in rows if r["m"] == 1):
        per = {r["shape"]: r["us_per_call"] for r in rows if r["m"] == 1 and r["way"] == way and r["shape"] in counts}
        if len(per) == len(SHAPES):
            total_us = sum(per[name] * counts[name] for name in per)
            gb_s = weight_bytes / (total_us * 1e-6) / 1e9
            summary[way] = {"us": total_us, "weight_gb_s": gb_s, "of_copy_bandwidth": gb_s / measured["copy_gb_s"]}
    if summary:
        print(
            f"\none decode step's linear layers at M = 1 (24 layers + LM head, {weight_bytes / 1e6:.0f} MB of weights):"
        )
        for way, s in summary.items():
            print(f"  {way:<28} {s['us']:9.1f} us  {s['weight_gb_s']:6.0f} GB/s  {s['of_copy_bandwidth']:6.1%} of copy")
    lm = [r for r in rows if r["shape"] == "lm_head" and r["m"] == 1 and r["kernel"] == "matvec_f32_f16"]
    if lm:
        print(f"\nmatvec, f32 x and f16 w, on the LM head: {lm[0]['of_copy_bandwidth']:.1%} of the copy bandwidth")
    if measured["torch_skipped"]:
        print(f"\ntorch skipped: {measured['torch_skipped']}")
    return summary


def main(args: argparse.Namespace) -> int:
    quick = bool(getattr(args, "quick", False))
    with tempfile.TemporaryDirectory() as cache_dir:
        measured = asyncio.run(_measure(quick, cache_dir))
    summary = _print(measured)
    write_json(
        getattr(args, "json", None), {"benchmark": "ops-matmul", "quick": quick, **measured, "decode_step": summary}
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    raise SystemExit(main(parser.parse_args()))

"""The op library's float16 matmul on the tensor cores, standalone: no daemon, no gpud import.

    cd <repo> && python3 benchmarks/gemm_harness.py [--sweep] [--quick] [--json FILE]

Compiles gpud/ops/matmul_tc.cu with NVRTC for the device (as the daemon does: sm_<cc>, no includes),
loads it through the driver (cuda-python) into PyTorch's context, and
  1. checks every matmul_tc kernel (and with --sweep every tile variant of gemm_sweep.py) against
     numpy float64 on edge cases: K not a multiple of 8 or of the tile, N odd, M and N off the tile,
     both layouts of w, batches, float32 and float16 biases, x and w one element off 16-byte
     alignment; outputs poisoned with NaN and followed by a guard that must stay untouched;
  2. times the kernel that gpud_protocol.ops.matmul.tc_kernel picks for each target shape (the
     linear layers of Qwen2.5-0.5B and MiniLM, w as (N, K)) and M in ROWS beside torch F.linear
     (cuBLAS), both captured into CUDA graphs of many calls replayed between CUDA events, the calls
     cycling through copies of w that span twice the L2 cache; every output is checked first
     (float64 on sampled rows, every element against a float32 product on the GPU).
Reads from the repository only gpud/ops/matmul_tc.cu and protocol/gpud_protocol/ops/matmul.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

# run as a script, benchmarks/ heads sys.path and its cuda.py would shadow cuda-python: load the helper
# beside this file by its path instead (spawned compile workers rerun this and find it registered)
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
_spec = importlib.util.spec_from_file_location("gemm_device", _HERE / "gemm_device.py")
assert _spec is not None and _spec.loader is not None
gd = sys.modules["gemm_device"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gd)
if TYPE_CHECKING:
    from benchmarks.gemm_device import Device, Kernel

SHAPES = [  # (model, layer, N, K): out = x @ w.T, w (N, K)
    ("qwen2.5-0.5b", "q/o_proj", 896, 896),
    ("qwen2.5-0.5b", "k/v_proj", 128, 896),
    ("qwen2.5-0.5b", "gate/up_proj", 4864, 896),
    ("qwen2.5-0.5b", "down_proj", 896, 4864),
    ("qwen2.5-0.5b", "lm_head", 151936, 896),
    ("minilm", "attn out", 384, 384),
    ("minilm", "qkv", 1152, 384),
    ("minilm", "ffn up", 1536, 384),
    ("minilm", "ffn down", 384, 1536),
]
ROWS = (16, 64, 256, 1024, 4096)
EDGES = [  # (batch, m, n, k, wt, epilogue, x_off, w_off, batched_w)
    (1, 17, 33, 70, 1, 0, 0, 0, False),
    (1, 33, 31, 64, 0, 1, 0, 0, False),
    (1, 130, 136, 200, 0, 2, 0, 0, False),
    (1, 257, 264, 1000, 1, 2, 0, 0, False),
    (3, 20, 48, 96, 1, 1, 0, 0, True),
    (2, 40, 72, 136, 0, 0, 0, 0, True),
    (1, 70, 129, 128, 1, 1, 1, 0, False),
    (1, 70, 136, 128, 0, 0, 0, 1, False),
    (1, 9, 8, 16, 1, 2, 0, 0, False),
    (1, 1, 5, 3, 0, 0, 0, 0, False),
    (1, 300, 40, 4864, 1, 0, 0, 0, False),
]


def edge_case(dev: Device, fn: Kernel, case: tuple[Any, ...], rng: np.random.Generator) -> float:
    """One edge case against float64; the worst error over its bound (must be <= 1)."""
    torch = dev.torch
    batch, m, n, k, wt, epilogue, x_off, w_off, batched_w = case
    x = rng.standard_normal((batch, m, k)).astype(np.float16)
    w = rng.standard_normal((batch if batched_w else 1, *((n, k) if wt else (k, n)))).astype(np.float16)
    bias = (rng.standard_normal(n) * 4).astype(np.float32 if epilogue == 1 else np.float16)
    fold = not batched_w  # a shared w: the batches are rows (batch 1, m = B*M), as the client plans it
    gx = dev.place(x.ravel(), x_off)
    gw = dev.place(w.ravel(), w_off)
    gb = dev.place(bias, 0)
    total = batch * m * n
    out = torch.full((total + 64,), float("nan"), dtype=torch.float16, device="cuda")
    out[total:] = 7.0  # the guard
    sizes = (1, batch * m, n, k, 0, 0) if fold else (batch, m, n, k, m * k, n * k)
    dev.launch(
        fn, sizes[0], sizes[1], sizes[2], [gx, gw, gb if epilogue else gx, out.data_ptr()], [*sizes, wt, epilogue]
    )
    torch.cuda.synchronize()
    got = out.cpu().numpy()
    if not np.all(got[total:] == 7.0):
        raise AssertionError(f"{fn.name} {case}: wrote past the end of out")
    got = got[:total].reshape(batch, m, n).astype(np.float64)
    w64 = w.astype(np.float64)
    w64 = np.swapaxes(w64, -1, -2) if wt else w64
    x64 = x.astype(np.float64)
    ref, scale = x64 @ w64, np.abs(x64) @ np.abs(w64)
    if epilogue:
        ref, scale = ref + bias.astype(np.float64), scale + np.abs(bias.astype(np.float64))
    if np.isnan(got).any():
        raise AssertionError(f"{fn.name} {case}: NaN (an element not written)")
    return float(np.max(np.abs(got - ref) / (1e-5 * scale + 2e-3 * np.abs(ref) + 1e-30)))


class Reference:
    """What a point's outputs are checked against: float64 on a few rows, float32 everywhere."""

    def __init__(self, x: Any, w: Any) -> None:
        m = x.shape[0]
        self.rows = sorted({0, m // 2, m - 1})
        x64, w64 = x[self.rows].double().cpu().numpy(), w.double().cpu().numpy()
        self.exact, self.exact_scale = x64 @ w64.T, np.abs(x64) @ np.abs(w64).T
        self.ref32 = x.float() @ w.float().T
        self.scale32 = x.float().abs() @ w.float().abs().T

    def error(self, torch: Any, out: Any) -> float:
        """The worst error over its bound (<= 1 passes; inf for a NaN: an element not written)."""
        if bool(torch.isnan(out).any()):
            return math.inf
        bound = 2e-5 * self.scale32 + 2e-3 * self.ref32.abs() + 1e-30
        full = float(((out.float() - self.ref32).abs() / bound).max())
        got = out[self.rows].double().cpu().numpy()
        bound64 = 1e-5 * self.exact_scale + 2e-3 * np.abs(self.exact) + 1e-30
        return max(full, float(np.max(np.abs(got - self.exact) / bound64)))


def measure_point(dev: Device, kernels: list[Kernel], plan: str, n: int, k: int, m: int, quick: bool) -> dict[str, Any]:
    torch = dev.torch
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 13 + k)
    w_bytes = n * k * 2
    copies = max(1, min(64, -(-2 * dev.l2 // w_bytes)))
    ws = torch.randn((copies, n, k), device="cuda", generator=gen, dtype=torch.float32).div_(math.sqrt(k)).half()
    x = torch.randn((m, k), device="cuda", generator=gen, dtype=torch.float32).half()
    ref = Reference(x, ws[0])
    est = max(2 * m * n * k / 4e14, (w_bytes + 2 * m * (n + k)) / 2.5e12) + 3e-6
    launches = max(3, min(200 if not quick else 50, int((4e-4 if quick else 1.5e-3) / est)))
    reps = 5 if quick else 9
    point: dict[str, Any] = {"n": n, "k": k, "m": m, "weight_copies": copies, "calls_per_graph": launches}

    def torch_call(i: int) -> None:
        torch.nn.functional.linear(x, ws[i % copies])

    point["torch_err"] = ref.error(torch, torch.nn.functional.linear(x, ws[0]))
    point["torch_us"] = statistics.median(dev.graph_time(torch_call, launches, reps)) * 1e6
    point["kernels"] = {}
    for fn in kernels:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        grid = gd.grid(fn.bm, fn.bn, 1, m, n)
        w_ptrs = [int(ws[i].data_ptr()) for i in range(copies)]

        def call(i: int, fn: Kernel = fn, out: Any = out, grid: Any = grid, w_ptrs: list[int] = w_ptrs) -> None:
            dev.launch_grid(
                fn, grid, [x.data_ptr(), w_ptrs[i % copies], x.data_ptr(), out.data_ptr()], [1, m, n, k, 0, 0, 1, 0]
            )

        call(0)
        torch.cuda.synchronize()
        err = ref.error(torch, out)
        us = statistics.median(dev.graph_time(call, launches, reps)) * 1e6 if err <= 1 else math.nan
        point["kernels"][fn.name] = {"us": us, "err": err, "ratio": point["torch_us"] / us if us == us else 0.0}
        del out
    point["plan"] = plan
    plan_row = point["kernels"][plan]
    point["gpud_us"], point["ratio"] = plan_row["us"], plan_row["ratio"]
    best = max(point["kernels"].items(), key=lambda item: item[1]["ratio"])
    point["best"], point["best_ratio"] = best[0], best[1]["ratio"]
    return point


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also check and time every tile variant")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--shapes", help="comma-separated layer names (default: all)")
    parser.add_argument("--rows", help=f"comma-separated M values (default: {','.join(map(str, ROWS))})")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--compile-only", type=Path, metavar="DIR", help="no GPU: build for sm_90 into DIR")
    args = parser.parse_args()
    started = time.time()
    if args.compile_only:
        args.compile_only.mkdir(parents=True, exist_ok=True)
        for i, image in enumerate(gd.build_images("sm_90", gd.SWEEP if args.sweep else [])):
            (args.compile_only / f"{i:02d}.cubin").write_bytes(image)
        print(f"compiled in {time.time() - started:.1f} s")
        return 0
    mm = gd.load_protocol()
    dev = gd.Device()
    print(f"device: {dev.name}, {dev.sms} SMs, L2 {dev.l2 >> 20} MiB, NVRTC {dev.arch}, torch {dev.torch.__version__}")
    production = [gd.Tile(name, *mm.TC_TILES[name]) for name in mm.TC_TILES]
    for tile in production:  # the harness launches with gd.grid: the protocol's grid must be the same
        for m, n in ((16, 896), (4096, 151936), (1000, 70000), (65536, 65536)):
            assert mm.tc_grid(tile.name, 2, m, n) == gd.grid(tile.bm, tile.bn, 2, m, n), tile
    kernels = dev.build(production, gd.SWEEP if args.sweep else [])
    print(f"compiled {len(kernels)} kernels in {time.time() - started:.1f} s")
    for fn in kernels:
        print(f"  {fn.name:<32} {fn.threads:>3} threads  {fn.regs:>3} regs  {fn.local:>4} B local  {fn.smem:>6} B smem")

    rng = np.random.default_rng()
    edges: dict[str, float] = {}
    for fn in kernels:
        worst = 0.0
        for case in EDGES:
            try:
                worst = max(worst, edge_case(dev, fn, case, rng))
            except AssertionError as exc:
                print(f"edge case FAILED: {exc}")
                worst = math.inf
        edges[fn.name] = worst
    bad = {name: err for name, err in edges.items() if not err <= 1}
    print(
        f"edge cases: {len(EDGES)} per kernel, worst error/bound {max(edges.values()):.3f}"
        + (f"; FAILED {bad}" if bad else "")
    )

    wanted_shapes = None if not args.shapes else set(args.shapes.split(","))
    rows_list = ROWS if not args.rows else tuple(int(r) for r in args.rows.split(","))
    points = []
    by_name = {fn.name: fn for fn in kernels}
    for model, layer, n, k in SHAPES:
        if wanted_shapes and layer not in wanted_shapes:
            continue
        for m in rows_list:
            plan = mm.tc_kernel(m, n, k)
            timed = kernels if args.sweep else [by_name[plan]]
            point = {"model": model, "layer": layer, **measure_point(dev, timed, plan, n, k, m, args.quick)}
            points.append(point)
            dev.torch.cuda.empty_cache()
            print(
                f"{model:<13} {layer:<13} {n:>6}x{k:<5} M={m:<5} torch {point['torch_us']:8.1f} us"
                f"  gpud {point['gpud_us']:8.1f} us"
                f"  ratio {point['ratio']:5.2f}  ({plan}; best {point['best']} {point['best_ratio']:.2f})",
                flush=True,
            )
    print_table(points)
    failed = bool(bad) or any(not p["kernels"][p["plan"]]["err"] <= 1 for p in points)
    result = {
        "benchmark": "gemm-harness",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": dev.name,
        "sms": dev.sms,
        "l2_bytes": dev.l2,
        "arch": dev.arch,
        "torch": dev.torch.__version__,
        "kernels": [fn.info() for fn in kernels],
        "edge_cases": {"cases": [list(c) for c in EDGES], "worst_error_over_bound": edges},
        "points": points,
        "seconds": time.time() - started,
        "failed": failed,
    }
    gd.write_result(args.json, result)
    return 1 if failed else 0


def print_table(points: list[dict[str, Any]]) -> None:
    print(f"\n{'layer':<26} {'N x K':>12} " + " ".join(f"{'M=' + str(m):>17}" for m in ROWS))
    keys = dict.fromkeys((p["model"], p["layer"], p["n"], p["k"]) for p in points)
    ratios = []
    for model, layer, n, k in keys:
        cells = []
        for m in ROWS:
            p = next((q for q in points if (q["layer"], q["n"], q["k"], q["m"]) == (layer, n, k, m)), None)
            if p is None:
                cells.append(f"{'-':>17}")
                continue
            ratios.append(p["ratio"])
            cells.append(f"{p['gpud_us']:6.1f}/{p['torch_us']:<6.1f}{p['ratio']:4.2f}")
        print(f"{model[:6] + ' ' + layer:<26} {str(n) + 'x' + str(k):>12} " + " ".join(cells))
    if ratios:
        geomean = math.exp(statistics.fmean(map(math.log, ratios)))
        print(f"(gpud us / cuBLAS us, throughput ratio); min {min(ratios):.2f}, geomean {geomean:.2f}")


if __name__ == "__main__":
    raise SystemExit(main())

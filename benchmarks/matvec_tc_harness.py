"""matvec_tc (gpud/ops/matvec_tc.cu: float32 x times float16 or bfloat16 w as (N, K), up to 64 rows of x,
on the tensor cores) beside the matvec it replaces and cuBLAS, standalone: no daemon, no gpud import.

    cd <repo> && python3 benchmarks/matvec_tc_harness.py [--quick] [--rows 1,8,64] [--shapes lm_head,o_proj]
        [--dtype bf16] [--all-variants] [--json FILE]
    python3 benchmarks/matvec_tc_harness.py --compile-only DIR    # no GPU: the cubins for sm_90

Builds with NVRTC, as the daemon does, pdl.cu + products.cu + matvec_tc.cu and pdl.cu + matmul.cu (the
old matvec_f32_<w>), loads them through gemm_device.py into PyTorch's context, then
  1. checks every matvec_tc kernel against numpy float64 on edge cases: M up to the variant's rows, N
     and K off 8 and 32, batched w, a float32 bias, x and w one element off 16-byte alignment, inf and
     NaN in x; out poisoned with a NaN pattern and followed by a guard that must keep it;
  2. checks bit identity: each row of x gets the same bits alone, among other rows in any order (next
     to inf and NaN rows too) and in every variant;
  3. times, for Qwen2.5-0.5B's decode shapes and M in ROWS, the variant tf_kernel picks, the old matvec
     (past 8 rows in groups of 4 to 8 along z, as matvec_groups), F.linear on 16-bit x and w (x cast
     outside the timed call) and on float32 x and w (cuBLAS), in CUDA graphs of many calls cycling
     through copies of w that span twice the L2 cache, every output checked first.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# run as a script, benchmarks/ heads sys.path and its cuda.py would shadow cuda-python: load the helpers
# beside this file by their paths instead (spawned compile workers rerun this and find them registered)
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
_spec = importlib.util.spec_from_file_location("matvec_tc_device", _HERE / "matvec_tc_device.py")
assert _spec is not None and _spec.loader is not None
mv = sys.modules["matvec_tc_device"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mv)
gd = mv.gd

Array = npt.NDArray[Any]
SHAPES = [  # Qwen2.5-0.5B's decode products (name, N, K): out = x @ w.T, w (N, K)
    ("o_proj", 896, 896),
    ("qkv_proj", 1152, 896),
    ("gate_up_proj", 9728, 896),
    ("down_proj", 896, 4864),
    ("lm_head", 151936, 896),
]
ROWS = (1, 2, 4, 8, 16, 32, 64)
EDGE_ROWS = (1, 3, 16, 17, 31, 32, 33, 64)
EDGES = [  # (batch, n, k, bias, x_off, w_off); batch 2 has a w per batch (x_stride m*k, w_stride n*k)
    (1, 33, 70, False, 0, 0),
    (1, 8, 200, True, 0, 0),
    (1, 130, 896, True, 0, 0),
    (2, 33, 200, True, 0, 0),
    (2, 8, 70, False, 0, 0),
    (1, 130, 896, False, 1, 0),
    (1, 33, 200, True, 0, 1),
    (1, 1, 3, True, 1, 1),
]


def edge_case(dev: Any, fn: Any, dtype: str, m: int, case: tuple[Any, ...], rng: np.random.Generator) -> float:
    """One edge case against float64: the worst error over its bound (<= 1 passes)."""
    batch, n, k, has_bias, x_off, w_off = case
    x = rng.standard_normal((batch, m, k)).astype(np.float32)
    w = mv.weight_bits(rng.standard_normal((batch, n, k)), dtype)
    bias = (rng.standard_normal(n) * 4).astype(np.float32)
    if m >= 3:  # inf, inf against -inf, inf times a zero of w, NaN: nonfinite where float64 has them
        x[0, 0, [0, k - 1]] = np.inf, -np.inf
        x[0, m // 2, k // 2], w[0, 0, k // 2] = np.inf, 0
        x[0, m - 1, k // 3] = np.nan
    total = batch * m * n
    out = mv.poisoned(dev.torch, total + 64)
    gx, gw, gb = dev.place(x, x_off), dev.place(w, w_off), dev.place(bias, 0)
    strides = (m * k, n * k) if batch > 1 else (0, 0)
    sizes = [batch, m, n, k, *strides, 1, int(has_bias)]
    dev.launch_grid(fn, mv.tc_grid(fn.bm, batch, n), [gx, gw, gb if has_bias else gx, out.data_ptr()], sizes)
    dev.torch.cuda.synchronize()
    dev.keep.clear()
    bits = out.cpu().numpy().view(np.uint32)
    where = f"{fn.name} M={m} {case}"
    if not np.all(bits[total:] == mv.POISON):
        raise AssertionError(f"{where}: wrote past the end of out")
    if np.any(bits[:total] == mv.POISON):
        raise AssertionError(f"{where}: an element of out not written")
    got = bits[:total].view(np.float32).reshape(batch, m, n).astype(np.float64)
    x64, w64 = x.astype(np.float64), mv.weight_values(w, dtype)
    with np.errstate(invalid="ignore"):  # einsum: no BLAS, so inf and NaN go through IEEE arithmetic
        ref = np.einsum("bmk,bnk->bmn", x64, w64) + (bias if has_bias else 0.0)
        scale = np.einsum("bmk,bnk->bmn", np.abs(x64), np.abs(w64)) + (np.abs(bias) if has_bias else 0.0)
    finite = np.isfinite(ref)
    if not np.array_equal(got[~finite], ref[~finite], equal_nan=True):
        raise AssertionError(f"{where}: inf or NaN where float64 has none, or not where it has them")
    return float(np.max(np.abs(got[finite] - ref[finite]) / (1e-5 * scale[finite] + 1e-30), initial=0.0))


def bit_identity(dev: Any, kernels: dict[str, Any], dtype: str, rng: np.random.Generator) -> list[str]:
    """Each of 64 rows of x launched alone through matvec_tc8 against every variant with the rows in
    order, reversed, shuffled in launches of random size, between inf/NaN rows, and alone: the failures."""
    torch, t, n, failures = dev.torch, mv.SHORT[dtype], 896, []
    for k in (896, 4864):
        x = rng.standard_normal((65, k)) * np.exp2(rng.integers(-8, 9, (65, k)))
        x[64] = np.resize([np.inf, -np.inf, np.nan, 3e38, -3e38], k)  # row 64: what a neighbour may hold
        xs = torch.from_numpy(x.astype(np.float32)).cuda()
        w = torch.from_numpy(mv.weight_bits(rng.standard_normal((n, k)) / math.sqrt(k), dtype)).cuda()

        def run(name: str, layout: list[list[int]], k: int = k, xs: Any = xs, w: Any = w) -> Array:
            """out's rows 0..63 from one launch per list of rows of x (64: the junk row)."""
            rows, outs = [], []
            for group in layout:
                sub, out = xs[group].contiguous(), mv.poisoned(torch, len(group) * n)
                ptrs = [sub.data_ptr(), w.data_ptr(), sub.data_ptr(), out.data_ptr()]
                fn = kernels[name]
                dev.launch_grid(fn, mv.tc_grid(fn.bm, 1, n), ptrs, [1, len(group), n, k, 0, 0, 1, 0])
                rows += group
                outs.append(out.view(len(group), n))
            got: Array = torch.cat(outs).cpu().numpy().view(np.uint32)
            return got[np.argsort(rows, kind="stable")][:64]

        alone = [[i] for i in range(64)]
        for warps in ("", "w4", "w16"):  # each warp count its own bits, the same for every row count
            failures += bit_failures(run, rng, t, k, warps, alone, x, w, dtype)
    return failures


def bit_failures(
    run: Any, rng: np.random.Generator, t: str, k: int, warps: str, alone: list[list[int]], x: Any, w: Any, dtype: str
) -> list[str]:
    """matvec_tc8<warps> with each row alone against the float64 bound, then every variant of that warp
    count with the rows in order, reversed, shuffled, between inf/NaN rows and alone: the failures."""
    failures = []
    solo = run(f"matvec_tc8{warps}_f32_{t}", alone)
    x64, w64 = x[:64].astype(np.float32).astype(np.float64), mv.weight_values(w.cpu().numpy(), dtype)
    err = np.abs(solo.view(np.float32) - x64 @ w64.T) / (1e-5 * (np.abs(x64) @ np.abs(w64).T) + 1e-30)
    if not err.max() <= 1:
        failures.append(f"K={k}{warps}: alone, error {err.max():.3g} x the bound")
    for r in mv.TF_ROWS:
        cuts = np.cumsum(rng.integers(1, r + 1, 64))
        layouts = {
            "in order": [list(range(s, s + r)) for s in range(0, 64, r)],
            "reversed": [list(range(63 - s, 63 - s - r, -1)) for s in range(0, 64, r)],
            "shuffled": [c.tolist() for c in np.split(rng.permutation(64), cuts[cuts < 64])],
            "beside inf/NaN": [[j for i in range(s, s + r // 2) for j in (i, 64)] for s in range(0, 64, r // 2)],
            "alone": alone,
        }
        for what, layout in layouts.items():
            differ = np.flatnonzero(np.any(run(f"matvec_tc{r}{warps}_f32_{t}", layout) != solo, axis=1))
            if len(differ):
                failures.append(f"K={k} matvec_tc{r}{warps} {what}: {len(differ)} rows differ (first {differ[0]})")
    return failures


def measure_point(dev: Any, kernels: dict[str, Any], dtype: str, n: int, k: int, m: int, args: Any) -> dict[str, Any]:
    torch, t = dev.torch, mv.SHORT[dtype]
    linear = torch.nn.functional.linear
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 13 + k)
    w_bytes = n * k * 2
    # copies of w spanning twice the L2 (float32: once, as many bytes), at most 64; one with --hot
    copies, copies32 = (1 if args.hot else max(1, min(64, -(-span * dev.l2 // w_bytes))) for span in (2, 1))
    ws = torch.randn((copies, n, k), device="cuda", generator=gen).div_(math.sqrt(k)).to(getattr(torch, dtype))
    ws32 = ws[:copies32].float()
    x = torch.randn((m, k), device="cuda", generator=gen)
    x16 = x.to(ws.dtype)
    x64, w64 = x.double(), ws[0].double()
    ref, bound = x64 @ w64.T, 1e-5 * (x64.abs() @ w64.abs().T) + 1e-30
    del x64, w64
    w_ptrs = [int(ws[i].data_ptr()) for i in range(copies)]

    def kernel_call(fn: Any, batch: int, rows: int, grid: tuple[int, int, int]) -> Callable[[int], Any]:
        out = torch.empty((m, n), device="cuda")
        scalars = [batch, rows, n, k, rows * k if batch > 1 else 0, 0, 1, 0]

        def call(i: int) -> Any:
            dev.launch_grid(fn, grid, [x.data_ptr(), w_ptrs[i % copies], x.data_ptr(), out.data_ptr()], scalars)
            return out

        return call

    plan = mv.tc_name(m, n, t)
    names = [name for name, fn in kernels.items() if name.startswith("matvec_tc") and name.endswith(f"_f32_{t}")]
    names = [name for name in names if kernels[name].bm >= m] if args.all_variants else [plan]
    calls = {name: kernel_call(kernels[name], 1, m, mv.tc_grid(kernels[name].bm, 1, n)) for name in names}
    group = mv.mv_group(m)
    if group is not None:
        calls["old"] = kernel_call(kernels[f"matvec_f32_{t}"], m // group, group, mv.mv_grid(m // group, n, k))
        calls["sx"] = kernel_call(kernels[f"matvec_sx_f32_{t}"], m // group, group, mv.sx_grid(m // group, n, k, group))
    calls["torch16"] = lambda i: linear(x16, ws[i % copies])
    calls["torch32"] = lambda i: linear(x, ws32[i % len(ws32)])
    launches = max(3, min(50 if args.quick else 200, int((4e-4 if args.quick else 1.5e-3) / (w_bytes / 2.5e12 + 3e-6))))
    point: dict[str, Any] = {"n": n, "k": k, "m": m, "dtype": dtype, "plan": plan, "weight_copies": copies}
    point.update(calls_per_graph=launches, us={}, err={})
    for name, call in calls.items():
        out = call(0).double()
        torch.cuda.synchronize()
        err = math.inf if bool(out.isnan().any()) else float(((out - ref).abs() / bound).max())
        checked = name.startswith("torch") or err <= 1  # cuBLAS's errors are reported, not held to the bound
        samples = dev.graph_time(call, launches, 5 if args.quick else 9) if checked else [math.nan]
        point["us"][name], point["err"][name] = statistics.median(samples) * 1e6, err
    return point


def print_table(points: list[dict[str, Any]]) -> None:
    print(f"\n{'layer':<13}{'N':>7}{'K':>6}{'M':>4}  {'kernel':<22}{'new us':>8}{'old us':>8}{'sx us':>8}{'t16 us':>8}"
          f"{'f32 us':>8}{'old/new':>8}{'t16/new':>8}{'GB/s':>7}")  # fmt: skip
    for p in points:
        us = p["us"]
        new, old, sx = us[p["plan"]], us.get("old", math.nan), us.get("sx", math.nan)
        print(
            f"{p['layer']:<13}{p['n']:>7}{p['k']:>6}{p['m']:>4}  {p['plan']:<22}{new:8.2f}{old:8.2f}{sx:8.2f}"
            f"{us['torch16']:8.2f}{us['torch32']:8.2f}{old / new:8.2f}{us['torch16'] / new:8.2f}"
            f"{p['n'] * p['k'] * 2 / new / 1e3:7.0f}"
        )
    print("(old: matvec, in groups of 8 past 8 rows; sx: matvec_sx, the same groups; t16: F.linear on float16 or")
    print(" bfloat16 x and w; f32: on float32 x and w; GB/s: w's bytes / new us)")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls per graph and replays")
    parser.add_argument("--shapes", help=f"comma-separated of {','.join(s[0] for s in SHAPES)} (default: all)")
    parser.add_argument("--rows", help=f"comma-separated M values (default: {','.join(map(str, ROWS))})")
    parser.add_argument("--dtype", choices=("f16", "bf16"), default="f16", help="w's dtype in the timings")
    parser.add_argument("--hot", action="store_true", help="one copy of w: every call reads it from L2")
    parser.add_argument("--all-variants", action="store_true", help="time every matvec_tc variant that takes M")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--compile-only", type=Path, metavar="DIR", help="no GPU: build for sm_90 into DIR")
    args = parser.parse_args()
    started = time.time()
    if args.compile_only:
        args.compile_only.mkdir(parents=True, exist_ok=True)
        mv.check_protocol()
        for files, image in zip(mv.SOURCES, mv.compile_images("sm_90"), strict=True):
            (args.compile_only / f"{Path(files[-1]).stem}.cubin").write_bytes(image)
        count = sum(map(len, mv.SOURCES.values()))
        print(f"compiled {count} kernels into {args.compile_only} in {time.time() - started:.1f} s")
        return 0
    mv.check_protocol()
    dev = gd.Device()
    torch = dev.torch
    print(f"device: {dev.name}, {dev.sms} SMs, L2 {dev.l2 >> 20} MiB, NVRTC {dev.arch}, torch {torch.__version__}")
    kernels = mv.build(dev)
    print(f"compiled {len(kernels)} kernels in {time.time() - started:.1f} s")
    for fn in kernels.values():
        print(f"  {fn.name:<22} {fn.regs:>3} regs  {fn.local:>4} B local  {fn.smem:>6} B smem")

    rng = np.random.default_rng(1)
    edges: dict[str, float] = {}
    for name, fn in kernels.items():
        if not name.startswith("matvec_tc"):
            continue
        dtype = next(d for d, t in mv.SHORT.items() if name.endswith("_" + t))
        worst = 0.0
        for m in (m for m in EDGE_ROWS if m <= fn.bm):
            for case in EDGES:
                try:
                    worst = max(worst, edge_case(dev, fn, dtype, m, case, rng))
                except AssertionError as exc:
                    print(f"edge case FAILED: {exc}")
                    worst = math.inf
        edges[name] = worst
    bad = {name: err for name, err in edges.items() if not err <= 1}
    print(f"edge cases: worst error/bound {max(edges.values()):.3f}" + (f"; FAILED {bad}" if bad else "; PASS"))
    identity = {dtype: bit_identity(dev, kernels, dtype, rng) for dtype in mv.SHORT}
    for dtype, failures in identity.items():
        print(f"bit identity {dtype}: " + ("PASS" if not failures else "FAIL\n  " + "\n  ".join(failures)))

    dtype = next(d for d, t in mv.SHORT.items() if t == args.dtype)
    shapes = [s for s in SHAPES if not args.shapes or s[0] in args.shapes.split(",")]
    points = []
    for layer, n, k in shapes:
        for m in ROWS if not args.rows else tuple(int(r) for r in args.rows.split(",")):
            point = {"layer": layer, **measure_point(dev, kernels, dtype, n, k, m, args)}
            points.append(point)
            torch.cuda.empty_cache()
            cells = "  ".join(f"{name} {us:.2f} us (err {point['err'][name]:.2g})" for name, us in point["us"].items())
            print(f"{layer:<13} {n:>6}x{k:<5} M={m:<3} {cells}", flush=True)
    print_table(points)
    untimed = [(p["layer"], p["m"], name) for p in points for name, us in p["us"].items() if us != us]
    failed = bool(bad) or any(identity.values()) or bool(untimed)
    if untimed:
        print(f"FAILED (error over the bound: not timed): {untimed}")
    result = {
        "benchmark": "matvec-tc-harness",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": dev.name,
        "sms": dev.sms,
        "l2_bytes": dev.l2,
        "arch": dev.arch,
        "torch": torch.__version__,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "kernels": [fn.info() for fn in kernels.values()],
        "edge_cases": {"rows": EDGE_ROWS, "cases": EDGES, "worst_error_over_bound": edges},
        "bit_identity_failures": identity,
        "points": points,
        "seconds": time.time() - started,
        "failed": failed,
    }
    gd.write_result(args.json, result)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""matmul_wg (wgmma, sm_90a) beside matmul_tc and torch F.linear, standalone: no daemon.

    cd <repo> && python3 benchmarks/wg_harness.py [--quick] [--json FILE]

Builds gpud/ops/matmul_wg.cu for sm_90a with NVRTC, checks every kernel on gemm_harness's edge cases
(w as (N, K)) and on bfloat16 products against float64, then times every matmul_wg kernel, the
matmul_tc kernel gpud picks, and cuBLAS on gemm_harness's shapes (M from 128), CUDA graphs of many
calls cycling through copies of w. Prints the best tile per point and the ratio to cuBLAS."""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
for _name in ("gemm_device", "gemm_harness"):
    _spec = importlib.util.spec_from_file_location(_name, _HERE / f"{_name}.py")
    assert _spec is not None and _spec.loader is not None
    sys.modules[_name] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_name])
gd, gh = sys.modules["gemm_device"], sys.modules["gemm_harness"]
ROWS = (128, 256, 1024, 4096, 15360)
SWEEP = [  # (warpgroups, BN, stages, blocks per multiprocessor for __launch_bounds__); production in WG_TILES
    (2, 128, 3, 2),
    (2, 128, 4, 1),
    (1, 128, 4, 2),
]


def sweep_entries() -> tuple[str, list[tuple[str, int, int, int, int]]]:
    """Extra entry points (float16) for the SWEEP variants, and (name, bm, bn, threads, shared) of each."""
    text, tiles = "", []
    for wg, bn, stages, blocks in SWEEP:
        name = f"sweep_wg{64 * wg}x{bn}_s{stages}_b{blocks}"
        text += (
            f'\nextern "C" __global__ void __launch_bounds__({128 * wg}, {blocks}) {name}(const u16* x, const u16* w, '
            "const void* bias, u16* out, unsigned int batch, unsigned int m, unsigned int n, unsigned int k, "
            "unsigned int x_stride, unsigned int w_stride, unsigned int wt, unsigned int epilogue) {\n"
            f"    matmul_wg<{wg}, {bn}, {stages}, false>"
            "(x, w, bias, out, batch, m, n, k, x_stride, w_stride, epilogue);\n}\n"
        )
        tiles.append((name, 64 * wg, bn, 128 * wg, stages * (64 * wg + bn) * 128 + 1024))
    return text, tiles


def build_wg(dev: Any, wg: Any) -> list[Any]:
    extra, sweep = sweep_entries()
    ops = gd.ROOT / "gpud" / "ops"  # the preludes, wgmma.cu, then the family (gpud.ops.preludes' order)
    image = gd.compile_cubin(gd.with_preludes(ops / "wgmma.cu") + (ops / "matmul_wg.cu").read_text() + extra, "sm_90a")
    module = gd._check(dev.cu.cuModuleLoadData(image))
    dev.modules.append(module)
    attr = dev.cu.CUfunction_attribute
    kernels = []
    tiles = [(name, t.bm, t.bn, t.threads, t.shared) for name, t in wg.WG_TILES.items()] + sweep
    for name, bm, bn, threads, shared in tiles:
        fn = gd._check(dev.cu.cuModuleGetFunction(module, name.encode()))
        gd._check(dev.cu.cuFuncSetAttribute(fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared))
        regs = gd._check(dev.cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, fn))
        local = gd._check(dev.cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn))
        kernels.append(gd.Kernel(name, bm, bn, threads, fn, regs, local, shared, shared))
    return kernels


def bf16_case(dev: Any, fn: Any, m: int, n: int, k: int, x_off: int, epilogue: int) -> float:
    torch = dev.torch
    x = torch.randn((m, k), device="cuda").bfloat16()
    w = torch.randn((n, k), device="cuda").bfloat16()
    bias = torch.randn(n, device="cuda") * 4
    if epilogue == 3:
        bias = bias.bfloat16()
    xbuf = torch.empty(m * k + 8, dtype=torch.bfloat16, device="cuda")
    xbuf[x_off : x_off + m * k] = x.ravel()
    out = torch.full((m * n + 64,), float("nan"), dtype=torch.bfloat16, device="cuda")
    out[m * n :] = 7.0
    dev.launch(
        fn,
        1,
        m,
        n,
        [xbuf.data_ptr() + 2 * x_off, w.data_ptr(), bias.data_ptr(), out.data_ptr()],
        [1, m, n, k, 0, 0, 1, epilogue],
    )
    torch.cuda.synchronize()
    if not bool((out[m * n :] == 7.0).all()):
        raise AssertionError(f"{fn.name}: wrote past the end")
    got = out[: m * n].reshape(m, n).double()
    ref = x.double() @ w.double().T + (bias.double() if epilogue else 0)
    scale = x.double().abs() @ w.double().abs().T + (bias.double().abs() if epilogue else 0)
    if bool(torch.isnan(got).any()):
        return math.inf
    return float(((got - ref).abs() / (1e-5 * scale + 8e-3 * ref.abs() + 1e-30)).max())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    started = time.time()
    mm = gd.load_protocol()
    wg = sys.modules.get("gpud_protocol.ops.matmul_wg") or __import__("gpud_protocol.ops.matmul_wg").ops.matmul_wg
    dev = gd.Device()
    production = [gd.Tile(name, *mm.TC_TILES[name]) for name in mm.TC_TILES if name.endswith("_f16_f16")]
    tc = {fn.name: fn for fn in dev.build(production, [])}
    kernels = build_wg(dev, wg)
    print(f"device {dev.name}; built in {time.time() - started:.1f} s")
    for fn in kernels:
        print(
            f"  {fn.name:<28} {fn.threads:>3} threads {fn.regs:>3} regs {fn.local:>3} B local {fn.shared:>6} B shared"
        )
    rng = np.random.default_rng()
    edges: dict[str, float] = {}
    for fn in kernels:
        worst = 0.0
        try:
            if "_bf16" in fn.name:
                for case in ((300, 264, 1000, 0, 3), (129, 70, 72, 1, 1), (1000, 384, 384, 0, 0), (200, 130, 37, 0, 3)):
                    worst = max(worst, bf16_case(dev, fn, *case))
            else:
                for case in gh.EDGES:
                    if case[4] == 1:
                        worst = max(worst, gh.edge_case(dev, fn, case, rng))
        except AssertionError as exc:
            print(f"edge case FAILED: {exc}")
            worst = math.inf
        edges[fn.name] = worst
    bad = {name: e for name, e in edges.items() if not e <= 1}
    print(f"edge cases: worst error/bound {max(edges.values()):.3f}" + (f"; FAILED {bad}" if bad else ""), flush=True)

    f16 = [fn for fn in kernels if "_bf16" not in fn.name]
    points = []
    for model, layer, n, k in gh.SHAPES:
        for m in map(int, args.rows.split(",")):
            if layer == "lm_head" and m > 4096:
                continue
            plan_tc = mm.tc_kernel(m, n, k)
            point = {
                "model": model,
                "layer": layer,
                **gh.measure_point(dev, [tc[plan_tc], *f16], plan_tc, n, k, m, args.quick),
            }
            point["wg_plan"] = wg.wg_kernel(m, n, k, "float16")
            wgs = {name: r for name, r in point["kernels"].items() if "_wg" in name}
            best = max(wgs, key=lambda name: wgs[name]["ratio"])
            plan_ratio = wgs[point["wg_plan"]]["ratio"] if point["wg_plan"] in wgs else float("nan")
            points.append(point)
            dev.torch.cuda.empty_cache()
            print(
                f"{model[:6]:<6} {layer:<12} {n:>6}x{k:<5} M={m:<5} torch {point['torch_us']:7.1f} us"
                f"  tc {point['ratio']:4.2f}"
                f"  wg-plan {plan_ratio:4.2f} ({point['wg_plan']})  wg-best {wgs[best]['ratio']:4.2f} {best} "
                + " ".join(
                    f"{name.split('wg')[1].removesuffix('_f16_f16')}:{r['ratio']:.2f}" for name, r in wgs.items()
                ),
                flush=True,
            )
    result = {
        "benchmark": "wg-harness",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": dev.name,
        "kernels": [fn.info() for fn in kernels],
        "edges": edges,
        "points": points,
        "seconds": time.time() - started,
    }
    gd.write_result(args.json, result)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`gpud bench wgsl_matmul`: the WGSL matmul kernels through a webgpu daemon, before and after, in one run.

    python3 -m gpud bench wgsl_matmul [--quick] [--json FILE]
    python3 -m benchmarks.wgsl_matmul [--quick] [--json FILE] [--dtypes f32_f16,f16_f16|all] [--reps N]
                                      [--before FILE] [--after FILE]

Shapes: MiniLM's linear layers over 16 sequences of 62 tokens (M = 992; N x K = 384x384, 1152x384,
1536x384, 384x1536) and Qwen2.5-0.5B's q_proj over a 128-token prefill (M = 128, 896x896); w is (N, K)
(transpose_w, a Linear's weight), x float32 and w float16 by default (the models' weights). "before"
is benchmarks/wgsl_matmul_before.wgsl (the kernels of git 112914c) registered as a user kernel;
"after" is gpu.ops.matmul, the op library's gpud/ops/matmul.wgsl (or --after FILE as a user kernel).
Both run in the same daemon on the same tensors, shape by shape; each output is checked against numpy
float64 with the bound of tests/ops/test_matmul.py before it is timed.

Timing: `calls` dispatches queued back to back, then one sync, per call; the best of the repetitions
(2, --quick 1). `calls` is sized from one call to about CALL_SECONDS per repetition. Two clocks: wall time, and
the daemon process's CPU time (/proc), which on lavapipe (where the daemon's own thread runs the
shader: LP_NUM_THREADS=0, set here unless already set) holds still while other processes share the
cores; on a GPU only the wall time means anything.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

import gpud_client
from benchmarks import write_json
from gpud.testing.spawn import daemon
from gpud_protocol.ops.matmul import matmul_grid

SHAPES = [  # (name, M, N, K)
    ("minilm attn", 992, 384, 384),
    ("minilm qkv", 992, 1152, 384),
    ("minilm ffn up", 992, 1536, 384),
    ("minilm ffn down", 992, 384, 1536),
    ("qwen q_proj prefill", 128, 896, 896),
]
DTYPES = {"f32": "float32", "f16": "float16"}
BEFORE = Path(__file__).with_name("wgsl_matmul_before.wgsl")
CALL_SECONDS = 0.2  # aim for a repetition this long
MAX_CALLS = 200


def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads), or None where /proc is missing."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _check(got: np.ndarray, x: np.ndarray, w: np.ndarray) -> float:
    """The largest error over the test's bound (<= 1 passes): 1e-5 * (|x| @ |w|) + out_tol * |ref|."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64).T
    ref, scale = x64 @ w64, np.abs(x64) @ np.abs(w64)
    out_tol = 2e-3 if got.dtype == np.float16 else 0.0
    err = np.abs(got.astype(np.float64) - ref)
    if np.isnan(err).any():
        return float("inf")
    return float(np.max(err / (1e-5 * scale + out_tol * np.abs(ref))))


class Way:
    """One kernel for x @ w.T into `out`: the op library (kernel None) or a user kernel's source."""

    def __init__(self, gpu: gpud_client.Client, name: str, kernel: gpud_client.Kernel | None) -> None:
        self.gpu, self.name, self.kernel = gpu, name, kernel

    def call(self, x: gpud_client.Tensor, w: gpud_client.Tensor, out: gpud_client.Tensor) -> None:
        if self.kernel is None:
            self.gpu.ops.matmul(x, w, transpose_w=True, out=out)
            return
        (m, k), n = x.shape, w.shape[0]
        scalars = map(gpud_client.u32, (1, m, n, k, 0, 0, 1, 0))
        self.gpu.dispatch(self.kernel, matmul_grid(1, m, n), [x, w, x, out, *scalars])


async def _time(way: Way, tensors: tuple[Any, Any, Any], reps: int, pid: int) -> dict[str, float]:
    """Per call: one call sizes `calls`, then `reps` repetitions of that many; the best of each clock."""
    t0 = time.perf_counter()
    way.call(*tensors)
    await way.gpu.sync()
    calls = max(1, min(MAX_CALLS, math.ceil(CALL_SECONDS / (time.perf_counter() - t0))))
    walls, cpus = [], []
    for _ in range(reps):
        cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
        for _ in range(calls):
            way.call(*tensors)
        await way.gpu.sync()
        wall, cpu1 = time.perf_counter() - t0, _cpu_seconds(pid)
        walls.append(wall / calls)
        if cpu0 is not None and cpu1 is not None:
            cpus.append((cpu1 - cpu0) / calls)
    cpu_ms = min(cpus) * 1e3 if cpus else float("nan")
    return {"calls": calls, "wall_ms": min(walls) * 1e3, "daemon_cpu_ms": cpu_ms}


async def _measure(address: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    reps = 1 if args.quick else args.reps
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    async with gpud_client.connect(address) as gpu:
        device = gpu.devices[gpu.device] if gpu.devices else {}
        for pair in args.dtypes:
            xs, wsh = pair.split("_")
            entry = f"matmul_{xs}_{wsh}"
            ways = [Way(gpu, "before", await gpu.kernel(args.before.read_text(), entry))]
            after = None if args.after is None else await gpu.kernel(args.after.read_text(), entry)
            ways.append(Way(gpu, "after", after))
            for shape, m, n, k in SHAPES:
                x = rng.standard_normal((m, k)).astype(DTYPES[xs])
                w = rng.standard_normal((n, k)).astype(DTYPES[wsh])
                tx, tw = gpu.tensor(x), gpu.tensor(w)
                out_dtype = "float16" if xs == wsh == "f16" else "float32"
                for way in ways:
                    out = gpu.empty((m, n), out_dtype)
                    way.call(tx, tw, out)
                    error = _check(await out.numpy(), x, w)
                    if error > 1:
                        raise AssertionError(f"{way.name} {entry} {m}x{n}x{k}: error {error:.3g} x the bound")
                    timing = await _time(way, (tx, tw, out), reps, pid)
                    ms = timing["daemon_cpu_ms"] if device.get("adapter_type") == "CPU" else timing["wall_ms"]
                    rows.append(
                        {
                            "shape": shape,
                            "m": m,
                            "n": n,
                            "k": k,
                            "kernel": entry,
                            "way": way.name,
                            **timing,
                            "gflop_s": 2 * m * n * k / (ms * 1e-3) / 1e9,
                            "error_of_bound": error,
                        }
                    )
                    out.free()
                tx.free()
                tw.free()
    return {"device": device, "reps": reps, "results": rows}


def _print(measured: dict[str, Any]) -> dict[str, float]:
    rows = measured["results"]
    cpu = measured["device"].get("adapter_type") == "CPU"
    clock = "daemon CPU" if cpu else "wall"
    print(f"\n{measured['device'].get('name', '?')}: ms per call ({clock}; GFLOP/s from it)")
    print(f"{'shape':<20} {'M x N x K':>16} {'kernel':<15} {'before':>9} {'after':>9} {'speed-up':>8} {'GFLOP/s':>8}")
    speedups: dict[str, float] = {}
    key = "daemon_cpu_ms" if cpu else "wall_ms"
    total = {"before": 0.0, "after": 0.0}
    befores = {(b["shape"], b["kernel"]): b for b in rows if b["way"] == "before"}
    for r in rows:
        if r["way"] != "after":
            continue
        before = befores[r["shape"], r["kernel"]]
        speedups[f"{r['shape']} {r['kernel']}"] = before[key] / r[key]
        total["before"] += before[key]
        total["after"] += r[key]
        mnk = f"{r['m']}x{r['n']}x{r['k']}"
        print(
            f"{r['shape']:<20} {mnk:>16} {r['kernel']:<15} {before[key]:9.2f} {r[key]:9.2f}"
            f" {before[key] / r[key]:7.2f}x {r['gflop_s']:8.2f}"
        )
    speedups["total"] = total["before"] / total["after"]
    print(f"{'all of them':<53} {total['before']:9.2f} {total['after']:9.2f} {speedups['total']:7.2f}x")
    return speedups


def _shown(path: Path) -> str:
    """A path inside the repository as relative to it."""
    root = Path(__file__).resolve().parents[1]
    return str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(path)


def _parse_dtypes(value: str) -> list[str]:
    pairs = [f"{x}_{w}" for x in DTYPES for w in DTYPES] if value == "all" else value.split(",")
    for pair in pairs:
        if tuple(pair.split("_")) not in {(x, w) for x in DTYPES for w in DTYPES}:
            raise argparse.ArgumentTypeError(f"{pair}: x_w with each of f32, f16")
    return pairs


def main(args: argparse.Namespace) -> int:
    defaults = {"dtypes": ["f32_f16"], "before": BEFORE, "after": None, "reps": 2}
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    os.environ.setdefault("LP_NUM_THREADS", "0")  # lavapipe: the shader in the daemon's thread (see above)
    with daemon("webgpu") as (address, proc):
        measured = asyncio.run(_measure(address, proc.pid, args))
    speedups = _print(measured)
    write_json(
        getattr(args, "json", None),
        {
            "benchmark": "wgsl-matmul",
            "quick": bool(args.quick),
            "LP_NUM_THREADS": os.environ["LP_NUM_THREADS"],
            "before": _shown(args.before),
            "after": "gpu.ops.matmul" if args.after is None else _shown(args.after),
            **measured,
            "speedup": speedups,
        },
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--dtypes", type=_parse_dtypes, help="x_w pairs, comma-separated, or all (default f32_f16)")
    parser.add_argument("--before", type=Path, help=f"the WGSL source timed as before (default {BEFORE.name})")
    parser.add_argument("--after", type=Path, help="a WGSL source timed as after, instead of the op library")
    parser.add_argument("--reps", type=int, help="repetitions, the best kept (default 2)")
    raise SystemExit(main(parser.parse_args()))

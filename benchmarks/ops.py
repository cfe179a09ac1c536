"""`gpud bench ops`: the op library's matrix products on CUDA, in process, beside PyTorch.

    python3 -m gpud bench ops [--quick] [--json FILE]

The linear layers of a 0.5B decoder, out = x @ w.T with w (N, K) float16 (transpose_w=True):
q/o_proj (896, 896), k/v_proj (128, 896), gate/up_proj (4864, 896), down_proj (896, 4864) and the
LM head (151936, 896); M = 1 and 8 rows of x (decode: the matvec kernel) and M = 128 (prefill: the
tiled kernel); x float32 (the decoder's case, float32 out) and float16 (float16 out); and PyTorch's
`torch.nn.functional.linear` with float16 x and w on the same shapes (cuBLAS).

Timing: each way is captured into one CUDA graph of many calls, each call reading another copy of w
(the copies span 4x the L2 cache, so w comes from memory as in a decode step), and the graph is
replayed between two synchronizes; the best of several replays, per call. GB/s counts w's bytes once
per call (x and out are small beside w at decode sizes); "of copy" divides that by the bandwidth of a
1 GiB cuMemcpyDtoD counting bytes read plus written (what the memory sustains); TFLOP/s = 2 M N K / t.
Every output is checked against numpy (float64) before it is timed.

The kernels are gpud/ops/matmul.cu compiled through gpud's CUDA backend (a DeviceRuntime over device
0: NVRTC, the disk cache) and launched with cuLaunchKernel: no daemon, no socket. Nothing GPU-related
is imported before main() runs. PyTorch is optional (its rows are skipped without it).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import write_json

SHAPES = [  # (name, N, K, count per decode step: 24 layers of the decoder, then the LM head)
    ("q_proj+o_proj", 896, 896, 48),
    ("k_proj/v_proj", 128, 896, 48),
    ("gate/up_proj", 4864, 896, 48),
    ("down_proj", 896, 4864, 24),
    ("lm_head", 151936, 896, 1),
]
ROWS = (1, 8, 128)
COPY_BYTES = 1 << 30
GRAPH_SECONDS = 2e-3  # aim for a graph replay this long (at ~3 TB/s)
MAX_LAUNCHES = 2000
SHORT = {"float32": "f32", "float16": "f16"}


def _check(result: Any) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return rest[0] if len(rest) == 1 else (rest or None)


def _times(run: Callable[[], None], sync: Callable[[], None], reps: int) -> list[float]:
    run()
    sync()  # warm-up
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        sync()
        samples.append(time.perf_counter() - start)
    return samples


def _verify(what: str, got: np.ndarray, x: np.ndarray, w: np.ndarray, rows: int, tol: float = 1e-5) -> None:
    """The first `rows` rows against float64, with the tests' tolerance: 1e-5 (tol) of sum |x||w|, plus
    2e-3 |ref| for a float16 output."""
    x64, w64 = x[:rows].astype(np.float64), w.astype(np.float64)
    ref, scale = x64 @ w64.T, np.abs(x64) @ np.abs(w64).T
    g = got[:rows].astype(np.float64)
    bound = tol * scale + (2e-3 if got.dtype == np.float16 else 0.0) * np.abs(ref)
    if np.isnan(g).any() or not np.all(np.abs(g - ref) <= bound):
        raise AssertionError(
            f"{what} computed a wrong result (worst error / bound {np.nanmax(np.abs(g - ref) / bound)})"
        )


class Device:
    """Device 0: gpud's DeviceRuntime compiles the kernels; raw driver calls do the rest."""

    def __init__(self, rt: Any, cu: Any) -> None:
        self.rt, self.cu = rt, cu
        device = rt.device
        self.context = device._context
        _check(cu.cuCtxSetCurrent(self.context))
        self.name = device.info()["name"]
        attribute = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE
        self.l2 = int(_check(cu.cuDeviceGetAttribute(attribute, device._device)))
        self.stream = _check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
        self.functions: dict[str, Any] = {}
        self.buffers: list[Any] = []
        self.graphs: list[tuple[Any, Any]] = []  # (graph, executable)

    async def compile(self, name: str) -> None:
        from gpud.ops import source
        from gpud_protocol import KernelOptions

        got = self.rt.program(source("matmul", "cuda"), name, KernelOptions((256, 1, 1)))
        program = await got if isinstance(got, asyncio.Future) else got
        self.functions[name] = program.native.function

    def alloc(self, nbytes: int) -> int:
        pointer = _check(self.cu.cuMemAlloc(nbytes))
        self.buffers.append(pointer)
        return int(pointer)

    def free_all(self) -> None:
        self.sync()
        for graph, executable in self.graphs:
            self.cu.cuGraphExecDestroy(executable)
            self.cu.cuGraphDestroy(graph)
        self.graphs.clear()
        for pointer in self.buffers:
            self.cu.cuMemFree(pointer)
        self.buffers.clear()

    def upload(self, dst: int, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array)
        _check(self.cu.cuMemcpyHtoD(dst, data.ctypes.data, data.nbytes))

    def download(self, src: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        out = np.empty(shape, dtype)
        _check(self.cu.cuMemcpyDtoH(out.ctypes.data, src, out.nbytes))
        return out

    def sync(self) -> None:
        _check(self.cu.cuStreamSynchronize(self.stream))

    def copy_bandwidth(self, reps: int) -> float:
        """Bytes read plus written per second by a cuMemcpyDtoD of COPY_BYTES."""
        a, b = self.alloc(COPY_BYTES), self.alloc(COPY_BYTES)
        count = 5

        def run() -> None:
            for _ in range(count):
                _check(self.cu.cuMemcpyDtoDAsync(b, a, COPY_BYTES, self.stream))

        best = min(_times(run, self.sync, reps))
        for pointer in self.buffers[-2:]:
            self.cu.cuMemFree(pointer)
        del self.buffers[-2:]
        return 2 * COPY_BYTES * count / best

    def launch(self, name: str, grid: tuple[int, int, int], pointers: list[int], scalars: list[int]) -> None:
        slots = (ctypes.c_uint64 * (len(pointers) + len(scalars)))(*pointers, *scalars)
        address = ctypes.addressof(slots)
        params = (ctypes.c_void_p * len(slots))(*(address + 8 * i for i in range(len(slots))))
        _check(
            self.cu.cuLaunchKernel(self.functions[name], *grid, 256, 1, 1, 0, self.stream, ctypes.addressof(params), 0)
        )

    def graph(self, calls: Callable[[], None]) -> Callable[[], None]:
        """`calls` (launches on self.stream) captured into a CUDA graph; returns its replay."""
        cu = self.cu
        _check(cu.cuStreamBeginCapture(self.stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        try:
            calls()
        finally:
            graph = _check(cu.cuStreamEndCapture(self.stream))
        executable = _check(cu.cuGraphInstantiate(graph, 0))
        self.graphs.append((graph, executable))

        def replay() -> None:
            _check(cu.cuGraphLaunch(executable, self.stream))

        return replay


def _gpud_matmul(
    dev: Device, kernel: str, x_host: np.ndarray, weights: list[int], n: int, reps: int
) -> tuple[list[float], np.ndarray]:
    """The kernel over w (N, K) at each of `weights` in turn, a CUDA graph of one launch per address;
    also its output for the first weight, for the check."""
    from gpud_protocol.ops.matmul import MATVEC_ROWS, matmul_grid, matvec_grid

    m, k = x_host.shape
    out_dtype = "float16" if x_host.dtype == np.float16 else "float32"
    x_dev, out_dev = dev.alloc(x_host.nbytes), dev.alloc(m * n * np.dtype(out_dtype).itemsize)
    dev.upload(x_dev, x_host)
    grid = matvec_grid(1, n, k, True) if m <= MATVEC_ROWS else matmul_grid(1, m, n)
    scalars = [1, m, n, k, 0, 0, 1, 0]  # batch, m, n, k, strides, transpose_w, no bias
    dev.launch(kernel, grid, [x_dev, weights[0], x_dev, out_dev], scalars)
    dev.sync()
    got = dev.download(out_dev, (m, n), out_dtype)

    def calls() -> None:
        for w in weights:
            dev.launch(kernel, grid, [x_dev, w, x_dev, out_dev], scalars)

    return _times(dev.graph(calls), dev.sync, reps), got


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
    samples = _times(graph.replay, torch.cuda.synchronize, reps)
    del graph, w, x
    torch.cuda.empty_cache()
    return samples, check


async def _measure(quick: bool, cache_dir: str) -> dict[str, Any]:
    from gpud.backends.cuda import open_device
    from gpud.backends.cuda.driver import cu
    from gpud.runtime.runtime import DeviceRuntime
    from gpud.service.config import Config
    from gpud_protocol.ops.matmul import MATVEC_ROWS

    torch: Any = None
    torch_skipped: str | None = None
    try:
        import torch as torch_module

        torch_module.cuda.init()
        torch = torch_module
    except Exception as exc:
        torch_skipped = repr(exc)

    reps = 3 if quick else 7
    rows_list = (1, 128) if quick else ROWS
    loop = asyncio.get_running_loop()
    config = Config(cache_dir=Path(cache_dir))
    rt = DeviceRuntime(open_device(0, 0, loop, config), config, lambda _rt, error: None)
    dev = Device(rt, cu)
    for name in ("matvec_f32_f16", "matvec_f16_f16", "matmul_f32_f16", "matmul_f16_f16"):
        await dev.compile(name)
    _check(cu.cuCtxSetCurrent(dev.context))
    copy_bw = dev.copy_bandwidth(reps)
    print(f"device: {dev.name}, L2 {dev.l2 >> 20} MiB")
    print(f"cuMemcpyDtoD of 1 GiB: {copy_bw / 1e9:.0f} GB/s (bytes read + written)")

    rng = np.random.default_rng(0)
    results: list[dict[str, Any]] = []
    for shape_name, n, k, _count in SHAPES:
        w_host = (rng.standard_normal((n, k), dtype=np.float32) / math.sqrt(k)).astype(np.float16)
        w_bytes = w_host.nbytes
        stride = -(-w_bytes // 256) * 256
        copies = max(2, min(-(-4 * dev.l2 // w_bytes), MAX_LAUNCHES))
        launches = max(copies, min(MAX_LAUNCHES, math.ceil(GRAPH_SECONDS * 3e12 / w_bytes)))
        if quick:
            launches = max(copies, launches // 2)
        w_dev = dev.alloc(stride * copies)
        dev.upload(w_dev, w_host)
        for i in range(1, copies):
            _check(cu.cuMemcpyDtoD(w_dev + i * stride, w_dev, w_bytes))
        for m in rows_list:
            x32 = rng.standard_normal((m, k), dtype=np.float32)
            ways: list[tuple[str, str, Any]] = []
            for x_dtype in ("float32", "float16"):
                kind = "matvec" if m <= MATVEC_ROWS else "matmul"
                ways.append((f"gpud {SHORT[x_dtype]} x, f16 w ({kind})", f"{kind}_{SHORT[x_dtype]}_f16", x_dtype))
            if torch is not None:
                ways.append(("torch F.linear f16", "torch", "float16"))
            for way, kernel, x_dtype in ways:
                x_host = x32.astype(x_dtype)
                check_rows = min(m, 8)
                if kernel == "torch":
                    samples, got = _torch_linear(torch, w_host, copies, x_host, launches, reps)
                    # cuBLAS may reduce in float16 (split K): a looser bound, a sanity check only
                    _verify(f"torch {shape_name} M={m}", got, x_host, w_host, check_rows, 1e-3)
                else:
                    weights = [w_dev + (i % copies) * stride for i in range(launches)]
                    samples, got = _gpud_matmul(dev, kernel, x_host, weights, n, reps)
                    _verify(f"{kernel} {shape_name} M={m}", got, x_host, w_host, check_rows)
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
    _check(cu.cuStreamDestroy(dev.stream))
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
        f"\n{'shape':<14} {'N x K':>12} {'M':>4}  {'way':<28} {'us/call':>9} {'GB/s':>7} {'of copy':>8} {'TFLOP/s':>8}"
    )
    for r in rows:
        print(
            f"{r['shape']:<14} {str(r['n']) + 'x' + str(r['k']):>12} {r['m']:>4}  {r['way']:<28}"
            f" {r['us_per_call']:9.2f} {r['weight_gb_s']:7.0f} {r['of_copy_bandwidth']:8.1%} {r['tflop_s']:8.2f}"
        )
    # one decode step's linear layers (24 layers and the LM head), by way, at M = 1
    summary: dict[str, Any] = {}
    counts = {name: count for name, _n, _k, count in SHAPES}
    weight_bytes = sum(n * k * 2 * count for _name, n, k, count in SHAPES)
    for way in dict.fromkeys(r["way"] for r in rows if r["m"] == 1):
        per = {r["shape"]: r["us_per_call"] for r in rows if r["m"] == 1 and r["way"] == way}
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

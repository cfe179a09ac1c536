"""`gpud bench clients`: K client processes sharing one daemon and one resident input per device.

Each client opens the resident tensor `bench/w/<device>` read-only and, as fast as it can, runs steps
of a dependent chain `x <- x * a + w` followed by a readback of its first 4096 elements that it
checks against numpy. `--size` sets the floats per tensor: the default (4096) makes each step the
daemon's work (a few microseconds of GPU time per dispatch), a large one (16M) the GPU's. Reported
per K: aggregate and per-client dispatches per second, the spread between clients (fairness), and
the device memory in use (the resident input is held once however many clients open it).

`--devices all` (or a list): the same K clients spread round-robin over those devices, measured in
the same process run as with one device (the ratio is the multi-GPU speed-up), and a cross-device
copy's bandwidth through gpud against `cuMemcpyPeer` in process (cuda). With `--process-per-device`
the daemon of the several devices runs a worker process per device (no cross-device copy then).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import time
from typing import Any

import numpy as np

import gpud_client
from benchmarks import write_json
from gpud.testing import workloads as kernels
from gpud.testing.spawn import daemon
from gpud_client.status import device_count, memory_in_use

N = 4096  # floats per tensor (--size): small, each step is the daemon's work; large, the GPU's
CHECKED = 4096  # the elements read back and checked per step
CHAIN = 50
A = 0.5


def _expected(x0: np.ndarray, w: np.ndarray) -> np.ndarray:
    x = x0
    for _ in range(CHAIN):
        x = (x * np.float32(A) + w).astype(np.float32)
    return x


async def _client(address: str, start_at: float, seconds: float, seed: int, device: int, n: int) -> dict[str, Any]:
    async with gpud_client.connect(address, device=device) as gpu:
        source, options = kernels.axpw_source(gpu.backend)
        k = await gpu.kernel(source, "axpw", **options)  # type: ignore[arg-type]
        take, take_options = kernels.axpb_source(gpu.backend)
        head = await gpu.kernel(take, "axpb", **take_options)  # type: ignore[arg-type]
        w_tensor = await gpu.open(f"bench/w/{device}")
        w = await w_tensor.numpy()
        rng = np.random.default_rng(seed)
        x0 = rng.standard_normal(n).astype(np.float32)
        want = _expected(x0[:CHECKED], w[:CHECKED])  # elementwise: the head's reference is the head of it
        start = gpu.tensor(x0)  # uploaded once: each step starts from a device copy of it
        bufs = [gpu.empty(n), gpu.empty(n)]
        out = gpu.empty(min(n, CHECKED))
        n32, checked32 = gpud_client.u32(n), gpud_client.u32(out.shape[0])
        await asyncio.sleep(max(0.0, start_at - time.time()))
        steps = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            gpu.copy(start, bufs[0])
            for i in range(CHAIN):
                gpu.dispatch(k, kernels.groups(n), [bufs[i % 2], w_tensor, bufs[(i + 1) % 2], A, n32])
            # Only the head comes back: a large size makes the step the GPU's work, not the copies'.
            gpu.dispatch(head, kernels.groups(out.shape[0]), [bufs[CHAIN % 2], out, 1.0, 0.0, checked32])
            if not np.allclose(await out.numpy(), want, rtol=1e-4, atol=1e-5):
                raise AssertionError(f"client {seed}: wrong result")
            steps += 1
        elapsed = time.perf_counter() - t0
        return {"client": seed, "device": device, "steps": steps, "dispatches_per_s": steps * CHAIN / elapsed}


def _client_process(
    address: str, start_at: float, seconds: float, seed: int, device: int, n: int, results: Any
) -> None:
    results.put(asyncio.run(_client(address, start_at, seconds, seed, device, n)))


async def _publish(address: str, n: int) -> tuple[str, int]:
    """Publish the shared input on every device; it outlives this session, as resident tensors do. A session
    per device: with a process per device (`--process-per-device`) a session keeps to its own."""
    w, backend = np.linspace(-1, 1, n, dtype=np.float32), ""
    served = device_count(address)
    for device in range(served):
        async with gpud_client.connect(address, device=device) as gpu:
            gpu.publish(gpu.tensor(w, device=device), f"bench/w/{device}", mode="ro")
            await gpu.flush()
            backend = gpu.backend
    return backend, served


async def _unpublish(address: str, devices: int) -> None:
    for device in range(devices):
        async with gpud_client.connect(address, device=device) as gpu:
            gpu.unpublish(f"bench/w/{device}")
            await gpu.flush()


def _run_k(address: str, k: int, seconds: float, devices: int, n: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    start_at = time.time() + 3.0  # time for every process to connect and compile first
    procs = [
        ctx.Process(target=_client_process, args=(address, start_at, seconds, i, i % devices, n, results))
        for i in range(k)
    ]
    for p in procs:
        p.start()
    per_client = [results.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    rates = [r["dispatches_per_s"] for r in per_client]
    mean = statistics.fmean(rates)
    return {
        "clients": k,
        "devices": devices,
        "aggregate_dispatches_per_s": sum(rates),
        "per_client_dispatches_per_s": rates,
        "max_deviation_from_mean_pct": max(abs(r - mean) / mean * 100 for r in rates),
    }


def _sweep(
    backend: str, devices: str, counts: list[int], seconds: float, n: int, per_device: bool = False
) -> tuple[str, list[dict[str, Any]]]:
    runs = []
    extra = ("--devices", devices, *(("--process-per-device",) if per_device else ()))
    with daemon(backend, extra_args=extra) as (address, _proc):
        name, served = asyncio.run(_publish(address, n))
        layout = ", a process per device" if per_device and served > 1 else ""
        print(f"\nbackend {name}, {served} device(s) ({devices}{layout}); each client: steps of {CHAIN} dependent")
        print(
            f"dispatches on {n} floats + a readback of {min(n, CHECKED)}, clients spread round-robin over the devices"
        )
        print(f"{'clients':>7} {'aggregate/s':>12} {'per client/s (min..max)':>26} {'spread':>8} {'device MiB':>10}")
        for k in counts:
            run = _run_k(address, k, seconds, served, n)
            run["device_memory_bytes_after"] = memory_in_use(address)
            rates = run["per_client_dispatches_per_s"]
            print(
                f"{k:>7} {run['aggregate_dispatches_per_s']:>12.0f} {min(rates):>12.0f} .. {max(rates):<11.0f}"
                f" {run['max_deviation_from_mean_pct']:>7.1f}% {run['device_memory_bytes_after'] / 2**20:>10.2f}"
            )
            runs.append(run)
        asyncio.run(_unpublish(address, served))
    return name, runs


IN_A_ROW = 8


async def _copy_bandwidth(address: str, nbytes: int, reps: int) -> dict[str, float]:
    """gpud: copy device 0 -> device 1 and sync, per rep, and IN_A_ROW copies then one sync; GB/s of the best rep."""
    async with gpud_client.connect(address, device=0) as gpu:
        src = gpu.tensor(np.ones(nbytes, np.uint8), device=0)
        dst = gpu.empty(nbytes, "uint8", device=1)
        gpu.copy(src, dst)
        await gpu.sync()
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            gpu.copy(src, dst)
            await gpu.sync()
            best = min(best, time.perf_counter() - t0)
        in_a_row = float("inf")  # copies back to back, one sync: the round trip paid once
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(IN_A_ROW):
                gpu.copy(src, dst)
            await gpu.sync()
            in_a_row = min(in_a_row, (time.perf_counter() - t0) / IN_A_ROW)
        ok = bool((await dst.numpy()).all())
        stats = await gpu.stats()
        peer = stats["devices"][0].get("peer_copy_bytes", 0) > 0
    return {
        "gpud_GBps": nbytes / best / 1e9,
        f"gpud_{IN_A_ROW}_in_a_row_GBps": nbytes / in_a_row / 1e9,
        "peer_to_peer": float(peer),
        "correct": float(ok),
    }


def _cumemcpypeer_bandwidth(nbytes: int, reps: int) -> float:
    """In process: cuMemcpyPeer device 0 -> device 1 with peer access enabled; GB/s of the best rep."""
    from cuda.bindings import driver as cu

    def check(result: Any) -> Any:
        if result[0]:
            raise RuntimeError(str(result[0]))
        return result[1] if len(result) == 2 else None

    check(cu.cuInit(0))
    devices = [check(cu.cuDeviceGet(i)) for i in (0, 1)]
    contexts = [check(cu.cuDevicePrimaryCtxRetain(d)) for d in devices]
    pointers = []
    for context in contexts:
        check(cu.cuCtxSetCurrent(context))
        pointers.append(check(cu.cuMemAlloc(nbytes)))
    check(cu.cuCtxSetCurrent(contexts[0]))
    if check(cu.cuDeviceCanAccessPeer(devices[0], devices[1])):
        cu.cuCtxEnablePeerAccess(contexts[1], 0)  # already enabled is fine
    best = float("inf")
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        check(cu.cuMemcpyPeer(pointers[1], contexts[1], pointers[0], contexts[0], nbytes))
        check(cu.cuCtxSynchronize())
        best = min(best, time.perf_counter() - t0)
    for context, pointer in zip(contexts, pointers, strict=True):
        check(cu.cuCtxSetCurrent(context))
        check(cu.cuMemFree(pointer))
    for device in devices:
        check(cu.cuDevicePrimaryCtxRelease(device))
    return nbytes / best / 1e9


def _speedups(one: list[dict[str, Any]], many: list[dict[str, Any]]) -> list[float]:
    """Each count's aggregate rate on every device over its rate on one (stored in `many`'s runs too)."""
    ratios = []
    for a, b in zip(one, many, strict=True):
        b["speedup_over_one_device"] = b["aggregate_dispatches_per_s"] / a["aggregate_dispatches_per_s"]
        ratios.append(b["speedup_over_one_device"])
    return ratios


def main(args: argparse.Namespace) -> int:
    counts = [int(c) for c in args.clients.split(",")]
    seconds = 1.0 if args.quick else args.seconds
    n = int(getattr(args, "size", None) or N)
    repeat = int(getattr(args, "repeat", 1)) if args.devices != "0" else 1
    backend, runs = _sweep(args.backend, "0", counts, seconds, n)
    results: dict[str, Any] = {"benchmark": "clients", "backend": backend, "n": n, "chain": CHAIN, "seconds": seconds}
    results["runs"] = runs
    per_device = bool(getattr(args, "process_per_device", False))
    if args.devices != "0":
        _, spread = _sweep(args.backend, args.devices, counts, seconds, n, per_device)
        results["runs_all_devices"] = spread
        results["process_per_device"] = per_device
        ratios = [_speedups(runs, spread)]
        # the host's own noise moves a run by a fifth: one device, then all, again, and the median of each count
        for _ in range(repeat - 1):
            _, again = _sweep(args.backend, "0", counts, seconds, n)
            _, again_all = _sweep(args.backend, args.devices, counts, seconds, n, per_device)
            ratios.append(_speedups(again, again_all))
            results.setdefault("repeats", []).append({"runs": again, "runs_all_devices": again_all})
        medians = [statistics.median(column) for column in zip(*ratios, strict=True)]
        header = "".join(f"{f'run {i + 1}':>8}" for i in range(repeat)) if repeat > 1 else ""
        print(f"\n{'clients':>7} {'speed-up over one device':>26}{header}")
        for k, median, column in zip(counts, medians, zip(*ratios, strict=True), strict=True):
            each = "".join(f"{r:>7.2f}x" for r in column) if repeat > 1 else ""
            print(f"{k:>7} {median:>25.2f}x{each}")
        if repeat > 1:
            print(f"(the median of {repeat} runs, each one device then all, alternating)")
            results["median_speedup_over_one_device"] = dict(zip(map(str, counts), medians, strict=True))
        if len(spread) and spread[0]["devices"] >= 2 and not per_device:  # no copies between processes
            nbytes, reps = (64 << 20, 3) if args.quick else (256 << 20, 10)
            with daemon(args.backend, extra_args=("--devices", args.devices, "--staging-pool-bytes", str(1 << 30))) as (
                address,
                _proc,
            ):
                copy = asyncio.run(_copy_bandwidth(address, nbytes, reps))
            if backend == "cuda":
                copy["cuMemcpyPeer_in_process_GBps"] = _cumemcpypeer_bandwidth(nbytes, reps)
                for key in ("gpud_GBps", f"gpud_{IN_A_ROW}_in_a_row_GBps"):
                    copy[f"{key}_to_cuMemcpyPeer"] = copy[key] / copy["cuMemcpyPeer_in_process_GBps"]
            print(f"\ncross-device copy of {nbytes >> 20} MiB, device 0 -> 1: {copy}")
            results["cross_device_copy"] = {"bytes": nbytes, **copy}
    write_json(args.json, results)
    return 0

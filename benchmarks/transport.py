"""`gpud bench transport`: where a round trip's time goes, on this host.

Side by side in one run, all over ipc:// with an 80-byte payload:
1. raw ZeroMQ echo, blocking client and blocking server (the floor);
2. raw ZeroMQ echo, asyncio client and asyncio server (pyzmq's zmq.asyncio);
3. the same on uvloop, when installed;
4. gpud requests that touch no GPU (`flush`), `sync`, and a dispatch + 4-byte readback, through a
   real daemon, over ZeroMQ alone and over the session's shared-memory ring (`connect(ring=True)`,
   the client and the daemon each polling for up to 1 ms);
so a gpud readback's latency can be split into transport, daemon and GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import tempfile
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

import numpy as np
import zmq
import zmq.asyncio

import gpud_client
from benchmarks import percentiles_us, write_json
from gpud.testing import workloads as kernels
from gpud.testing.spawn import daemon
from gpud_client import u32

PAYLOAD = b"x" * 80


def _echo_blocking(address: str, ready: Any) -> None:
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.bind(address)
    ready.set()
    while True:
        frames = sock.recv_multipart(copy=False)
        if frames[1].bytes == b"stop":
            return
        sock.send_multipart(frames, copy=False)


async def _echo_async(address: str, ready: Any) -> None:
    sock = zmq.asyncio.Context().socket(zmq.ROUTER)
    sock.bind(address)
    ready.set()
    while True:
        frames = await sock.recv_multipart(copy=False)
        if frames[1].bytes == b"stop":
            return
        sock.send_multipart(frames, copy=False)


def _serve(kind: str, address: str, ready: Any) -> None:
    if kind == "blocking":
        _echo_blocking(address, ready)
    elif kind == "uvloop":
        import uvloop

        uvloop.run(_echo_async(address, ready))
    else:
        asyncio.run(_echo_async(address, ready))


def _client_blocking(address: str, samples: int) -> list[float]:
    sock = zmq.Context().socket(zmq.DEALER)
    sock.connect(address)
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        sock.send(PAYLOAD)
        sock.recv_multipart(copy=False)
        out.append(time.perf_counter() - t0)
    sock.send(b"stop")
    sock.close(linger=1000)
    return out


async def _client_async(address: str, samples: int) -> list[float]:
    sock = zmq.asyncio.Context().socket(zmq.DEALER)
    sock.connect(address)
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        await sock.send(PAYLOAD)
        await sock.recv_multipart(copy=False)
        out.append(time.perf_counter() - t0)
    await sock.send(b"stop")
    sock.close(linger=1000)
    return out


SPIN_US = 1000.0  # the zmq-spin way's polling, each end (the ring's default, RING_SPIN_US)
T = TypeVar("T")


def _run(loop: str, coro: Callable[[], Coroutine[Any, Any, T]]) -> T:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(coro())
    return asyncio.run(coro())


def _echo_round_trips(kind: str, samples: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        address = f"ipc://{tmp}/echo.sock"
        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        server = ctx.Process(target=_serve, args=(kind, address, ready))
        server.start()
        ready.wait(30)
        if kind == "blocking":
            result = _client_blocking(address, samples)
        else:
            result = _run(kind, lambda: _client_async(address, samples))
        server.join(10)
        return result[samples // 10 :]  # drop the warm-up


async def _gpud_round_trips(address: str, samples: int, ring: bool, spin_us: float = 0.0) -> dict[str, list[float]]:
    async with gpud_client.connect(address, ring=ring, spin_us=spin_us) as gpu:
        if gpu.ring != ring:
            raise RuntimeError("the daemon offered no ring")
        source, options = kernels.axpb_source(gpu.backend)
        k = await gpu.kernel(source, "axpb", writes=[1], **options)  # type: ignore[arg-type]
        x, y = gpu.tensor(np.ones(1, np.float32)), gpu.empty((1,), "float32")

        async def readback() -> None:
            gpu.dispatch(k, (1, 1, 1), [x, y, 2.0, 1.0, u32(1)])
            await y.numpy()

        out: dict[str, list[float]] = {}
        for name, request in (("flush", gpu.flush), ("sync", gpu.sync), ("readback", readback)):
            times = out[name] = []
            for _ in range(samples):
                t0 = time.perf_counter()
                await request()
                times.append(time.perf_counter() - t0)
            del times[: samples // 10]
        return out


def main(args: argparse.Namespace) -> int:
    samples = 500 if args.quick else 5000
    kinds = ["blocking", "asyncio"]
    try:
        import uvloop  # noqa: F401

        kinds.append("uvloop")
    except ImportError:
        print("uvloop is not installed: skipping it")
    results: dict[str, Any] = {"benchmark": "transport", "samples": samples, "cpus": os.cpu_count()}
    rows: dict[str, dict[str, float]] = {}
    for kind in kinds:
        rows[f"zmq_echo_{kind}"] = percentiles_us(_echo_round_trips(kind, samples))
    for loop in ["asyncio", *(["uvloop"] if "uvloop" in kinds else [])]:
        with daemon(args.backend, extra_args=("--event-loop", loop)) as (address, _proc):
            for way, ring in (("zmq", False), ("ring", True)):
                measured = _run(loop, partial(_gpud_round_trips, address, samples, ring))
                for name, values in measured.items():
                    rows[f"gpud_{name}_{way}_{loop}"] = percentiles_us(values)
        # ZeroMQ with both ends polling instead of sleeping: the client for its reply (spin_us), the
        # daemon for the next message (busy_poll_us); CPU spent for latency, as the ring does.
        spin = ("--busy-poll-us", str(SPIN_US))
        with daemon(args.backend, extra_args=("--event-loop", loop, *spin)) as (address, _proc):
            measured = _run(loop, partial(_gpud_round_trips, address, samples, False, SPIN_US))
            for name, values in measured.items():
                rows[f"gpud_{name}_zmq-spin_{loop}"] = percentiles_us(values)
    print(f"\nround trips over ipc (us), {samples} samples each")
    for name, p in rows.items():
        print(f"  {name:<30} p50 {p['p50']:8.1f}   p99 {p['p99']:8.1f}")
    results["round_trip_us"] = rows
    write_json(args.json, results)
    return 0

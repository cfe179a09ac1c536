"""`gpud demo`: a real client workload through a real daemon, verified against numpy.

Each step uploads a fresh input, runs a chain of dependent `axpb` dispatches (each reads the
previous one's output) and reads the result back. Then the same chain runs with one submit and
round trip per dispatch, to show what coalescing buys.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator

import numpy as np

import gpud_client
from gpud.testing import workloads as kernels
from gpud.testing.spawn import answers, daemon
from gpud_client import default_address


@contextlib.contextmanager
def _daemon_for(backend: str) -> Iterator[str]:
    address = default_address()
    if backend == "auto" and answers(address):
        print(f"using the gpud already running at {address}")
        yield address
        return
    print(f"starting a gpud (backend {backend}) for this demo ...")
    with daemon(backend) as (address, _proc):
        yield address


def _progress(done: int, total: int, label: str) -> None:
    width = 40
    filled = width * done // total
    sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


async def run_demo(backend: str, steps: int, chain: int, size: int) -> int:
    with _daemon_for(backend) as address:
        async with gpud_client.connect(address) as gpu:
            device = gpu.welcome["devices"][0]
            print(f"connected: session {gpu.session_id}, backend {gpu.backend}, device {device.get('name', '?')}")
            source, options = kernels.axpb_source(gpu.backend)
            k = await gpu.kernel(source, "axpb", **options)  # type: ignore[arg-type]
            rng = np.random.default_rng(0)
            bufs = [gpu.empty(size), gpu.empty(size)]
            warm = rng.standard_normal(size).astype(np.float32)
            await kernels.run_chain(gpu, k, bufs, warm, chain, each=False)  # compiles, caches: not timed
            worst = 0.0
            t0 = time.perf_counter()
            for step in range(steps):
                x0 = rng.standard_normal(size).astype(np.float32)
                out = await kernels.run_chain(gpu, k, bufs, x0, chain, each=False)
                ref = kernels.chain_reference(x0, chain)
                worst = max(worst, float(np.max(np.abs(out - ref))))
                if not np.allclose(out, ref, rtol=1e-4, atol=1e-5):
                    print(f"\nstep {step}: result differs from numpy (max error {worst:g})")
                    return 1
                _progress(step + 1, steps, "coalesced")
            coalesced = (time.perf_counter() - t0) / (steps * chain)
            each_steps = max(1, steps // 10)
            t0 = time.perf_counter()
            for step in range(each_steps):
                x0 = rng.standard_normal(size).astype(np.float32)
                out = await kernels.run_chain(gpu, k, bufs, x0, chain, each=True)
                if not np.allclose(out, kernels.chain_reference(x0, chain), rtol=1e-4, atol=1e-5):
                    print("\nper-dispatch result differs from numpy")
                    return 1
                _progress(step + 1, each_steps, "one submit per dispatch")
            each = (time.perf_counter() - t0) / (each_steps * chain)
            stats = await gpu.stats()
            for t in bufs:
                t.free()
    print(f"\n{steps} steps x {chain} dependent dispatches on {size} floats: all match numpy (max error {worst:.2g})")
    print(f"  coalesced through gpud:            {coalesced * 1e6:8.1f} us per dispatch")
    print(f"  one submit + round trip each:      {each * 1e6:8.1f} us per dispatch")
    print(f"  coalescing is {each / coalesced:.1f}x faster; the daemon made {stats['device']['flushes']} submissions")
    return 0

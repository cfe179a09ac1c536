"""Many clients reading back at once: upload, scale, read back, free, in a loop (issue 14 §1).

On a real GPU through Vulkan this found a staging-buffer race that lavapipe never shows. Each of
K client processes loops `t = gpu.tensor(a); b = gpu.ops.scale(t, 2.0); await b.numpy()` over
random sizes and checks every result; the run fails if any result is wrong or any error arrives.

    python -m benchmarks.readback_race --backend webgpu --clients 8 --iterations 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from typing import Any

import numpy as np


async def _client(address: str, seed: int, iterations: int) -> dict[str, Any]:
    import gpud_client

    rng = np.random.default_rng(seed)
    errors: list[str] = []
    wrong = 0
    async with gpud_client.connect(address) as gpu:
        for _ in range(iterations):
            a = rng.standard_normal(int(rng.integers(1, 5001))).astype(np.float32)
            t = gpu.tensor(a)
            b = gpu.ops.scale(t, 2.0)
            try:
                out = await b.numpy()
                if not np.array_equal(out, a * np.float32(2.0)):
                    wrong += 1
            except Exception as exc:  # recorded: the run fails on any
                errors.append(f"{type(exc).__name__}: {exc}")
                if len(errors) > 5:
                    break
            t.free()
            b.free()
        await gpu.sync()
    return {"seed": seed, "wrong": wrong, "errors": errors}


def _run(address: str, seed: int, iterations: int, results: Any) -> None:
    results.put(asyncio.run(_client(address, seed, iterations)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="readback_race")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--address", default=None, help="an existing daemon (else one is started)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from gpud.testing.spawn import daemon

    def run_all(address: str) -> list[dict[str, Any]]:
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=_run, args=(address, i, args.iterations, results)) for i in range(args.clients)]
        for p in procs:
            p.start()
        out = [results.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
        return out

    started = time.perf_counter()
    if args.address:
        outcomes = run_all(args.address)
        alive = True
    else:
        with daemon(args.backend) as (address, proc):
            outcomes = run_all(address)
            alive = proc.poll() is None
    seconds = time.perf_counter() - started
    wrong = sum(o["wrong"] for o in outcomes)
    errors = [e for o in outcomes for e in o["errors"]]
    summary = {"clients": args.clients, "iterations": args.iterations, "seconds": round(seconds, 2),
               "wrong": wrong, "errors": errors[:20], "daemon_alive": alive}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if not wrong and not errors and alive else 1


if __name__ == "__main__":
    sys.exit(main())

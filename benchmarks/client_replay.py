"""The client's side of a replay (issue #17): `Encoder.embed(ids, mask, "replay")` of a MiniLM-shaped
encoder (all-MiniLM-L6-v2's shapes, random float16 weights, a 1,000-word vocabulary: benchmarks.daemon_replay's
MINILM), 16 sentences of 16 tokens, against a daemon started with --trace (benchmarks.fake_ops: the device
computes nothing).

    python -m benchmarks.client_replay [--reps 300] [--runs 5]     (benchmarks.client_ops runs it too)

Per replay, as benchmarks.embed's --trace stages name them: `before send`, from the call until its message
is handed to ZeroMQ (ids cast, inputs packed, the message built and queued), and `after resume`, from the
awaiting task's resumption until the call returns (the outputs unpacked); and `client CPU`, this thread's
CPU for the whole replay (both of those, the reply's reading and the event loop's turns). Each the median
of `reps` replays; printed and kept: the least of `runs` such medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import numpy as np

import gpud_client
from benchmarks import fake_ops, write_json
from benchmarks.daemon_replay import MINILM
from gpud.testing import bert

BATCH = (16, 16)  # sentences, tokens
CASE = f"MiniLM replay {BATCH[0]}x{BATCH[1]}"


async def run(address: str, reps: int, runs: int) -> dict[str, float]:
    """Microseconds per replay by stage (`before send`, `after resume`, `client CPU`)."""
    async with gpud_client.connect(address) as gpu:
        arrays = bert.random_weights(MINILM, seed=0, dtype=np.float16)
        encoder = bert.Encoder(gpu, MINILM, {name: gpu.tensor(array) for name, array in arrays.items()})
        rng = np.random.default_rng(0)
        ids, mask = rng.integers(0, MINILM.vocab, BATCH), np.ones(BATCH, np.int64)  # a tokenizer's int64
        for _ in range(5):  # built, compiled, planned
            await encoder.embed(ids, mask, "replay")
        stages: dict[str, list[float]] = {"before send": [], "after resume": [], "client CPU": []}
        for _ in range(runs):
            before, after, cpu = [], [], []
            for _ in range(reps):
                c0, t0 = time.thread_time(), time.perf_counter()
                await encoder.embed(ids, mask, "replay")
                t1, c1 = time.perf_counter(), time.thread_time()
                trace = gpu.last_trace
                if trace is None:
                    raise RuntimeError("no trace: the daemon runs without --trace")
                before.append(trace.sent - t0)
                after.append(t1 - trace.resumed)
                cpu.append(c1 - c0)
            for name, values in zip(stages, (before, after, cpu), strict=True):
                stages[name].append(1e6 * statistics.median(values))
        encoder.free()
        results = {f"{CASE}: {name}": min(values) for name, values in stages.items()}
        for name, us in results.items():
            print(f"  {name:<40} {us:8.2f} us per replay (median)", flush=True)
        return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.client_replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=300, help="replays per run (their median is the run's)")
    parser.add_argument("--runs", type=int, default=5, help="runs (the least median is the result)")
    parser.add_argument("--json", type=Path, help="write the results (us per replay, by stage) here")
    args = parser.parse_args(argv)
    print(f"the client's side of a replay (fake daemon, {args.reps} replays a run, least median of {args.runs}):")
    with fake_ops.daemon(extra_args=("--trace",)) as address:
        results = asyncio.run(run(address, args.reps, args.runs))
    meta = {"reps": args.reps, "runs": args.runs, "batch": list(BATCH), "unit": "us per replay (median)"}
    write_json(args.json, {"benchmark": "client_replay", "meta": meta, "results": results})


if __name__ == "__main__":
    main()

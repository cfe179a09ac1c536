"""Where a MiniLM replay's round trip goes, over ZeroMQ and over the shared-memory ring: all-MiniLM-L6-v2's
shapes (random float16 weights, benchmarks.daemon_replay's MINILM) replayed at several batch sizes
against a daemon started with --trace, on any backend (no model weights needed), each batch the median
of every `--trace` stage plus the client's work before the request leaves and after it resumes.

    python -m benchmarks.replay_stages [--backend cuda] [--batches 16x16,64x60,256x60] [--reps 100]
        [--spin-us 1000] [--json PATH]

The ring's replies of a large batch come after the client's spin has ended (the GPU takes longer than
`--spin-us`): they are what the daemon's doorbell path (`gpud.service.rings.BELL_BYTES`) is for.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

import gpud_client
from benchmarks import fake_ops, write_json
from benchmarks.daemon_replay import MINILM
from gpud.service import admin
from gpud.testing import bert


def _batch(text: str) -> tuple[int, int]:
    sentences, _, tokens = text.partition("x")
    return int(sentences), int(tokens)


async def _stages(address: str, batches: list[tuple[int, int]], ring: bool, spin_us: float, reps: int) -> Any:
    """{batch: {stage: µs}} over one session, and the daemon's ring counters at its end."""
    out: dict[str, dict[str, float]] = {}
    async with gpud_client.connect(address, ring=ring, spin_us=spin_us) as gpu:
        arrays = bert.random_weights(MINILM, seed=0, dtype=np.float16)
        encoder = bert.Encoder(gpu, MINILM, {name: gpu.tensor(array) for name, array in arrays.items()})
        rng = np.random.default_rng(0)
        for shape in batches:
            ids, mask = rng.integers(0, MINILM.vocab, shape), np.ones(shape, np.int64)
            for _ in range(3):  # built, compiled, planned
                await encoder.embed(ids, mask, "replay")
            traces, before, after, total = [], [], [], []
            for _ in range(reps):
                t0 = time.perf_counter()
                await encoder.embed(ids, mask, "replay")
                t1 = time.perf_counter()
                trace = gpu.last_trace
                if trace is None:
                    raise RuntimeError("no trace: the daemon runs without --trace")
                traces.append(trace)
                before.append(trace.sent - t0)
                after.append(t1 - trace.resumed)
                total.append(t1 - t0)
            stages = {"client_before_send": 1e6 * statistics.median(before)}
            stages.update(gpud_client.Trace.median_stages_us(traces))
            stages["client_after_resume"] = 1e6 * statistics.median(after)
            stages["total"] = 1e6 * statistics.median(total)
            out[f"{shape[0]}x{shape[1]}"] = stages
            print(f"  {'ring' if ring else 'zmq '} {shape[0]:>4} x {shape[1]:<3} " + _line(stages), flush=True)
        rings = (await asyncio.to_thread(admin.query, address)).get("rings", {})
        encoder.free()
    return out, rings


def _line(stages: dict[str, float]) -> str:
    return " ".join(f"{name} {us:.0f}" for name, us in stages.items())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replay_stages", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="fake", help="fake (the device computes nothing), cuda or webgpu")
    parser.add_argument("--batches", default="16x16,64x60,256x60", help="sentences x tokens, comma-separated")
    parser.add_argument("--reps", type=int, default=100, help="replays per batch and way (their medians)")
    parser.add_argument("--spin-us", type=float, default=1000.0, help="the client's reply spin (connect(spin_us))")
    parser.add_argument("--json", type=Path, help="write the stages (µs, medians) here")
    args = parser.parse_args(argv)
    batches = [_batch(text) for text in args.batches.split(",")]
    results: dict[str, Any] = {}
    print(f"MiniLM-shaped replays on {args.backend}, µs (medians of {args.reps}):")
    with fake_ops.daemon(args.backend, extra_args=("--trace",)) as address:
        for way in ("zmq", "ring"):
            stages, rings = asyncio.run(_stages(address, batches, way == "ring", args.spin_us, args.reps))
            results[way] = stages
            if way == "ring":
                results["ring_counters"] = rings
                print(f"  the daemon's ring counters: {rings}")
    meta = {"backend": args.backend, "reps": args.reps, "spin_us": args.spin_us, "unit": "us (median)"}
    write_json(args.json, {"benchmark": "replay_stages", "meta": meta, "results": results})


if __name__ == "__main__":
    main()

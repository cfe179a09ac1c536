"""The daemon's CPU cost per op, in process: the decode workload's and the MiniLM eager forward's op mix
driven through the daemon's real path (decode_client_message -> Session.receive -> the flush policy ->
completions -> replies), on the fake backend with no-op kernels.

    python -m benchmarks.daemon_ops [--steps 20] [--reps 5] [--no-profile]

The client is the real `gpud_client.Client` and op library over an in-process connection (no socket):
its batches go straight to the daemon's decoder, the daemon's replies come back through the event loop.
Only the daemon's side is timed: `intake` is decoding a message, running its ops and the end-of-drain
flush decision (what the router does per message), `decode` the decoding alone; `completion` is what
runs when a submission completes (the ledger's callbacks, readback replies). `misses` counts the
dispatches per step that the session's memo did not hold (decoded, checked and prepared afresh).
The device is a fake one of kind "cuda" (the H100's op mix: its kernel names, grids and blocks)
whose kernels do nothing.

Workloads: the chain of `gpud bench cuda` (benchmarks/cuda.py: CHAIN dependent raw `gpu.dispatch` of
axpb alternating two buffers, then one readback; its ops per step are the dispatches, an upload and
the readback); the decode step (24 layers, Qwen2.5-0.5B's op sequence at tiny sizes) in its steady state,
where every dispatch repeats (`hits`); the same steps with the daemon's dispatch caches emptied
before each (`misses`: every dispatch decoded, checked and packed afresh; a kernel's rule, kept per
distinct call, is not run again); and the MiniLM forward in eager mode, which makes new tensors (new
handles) for its activations on every call.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import pstats
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np

import gpud_client
from benchmarks import write_json
from benchmarks.daemon_inproc import Clock, InProcessDaemon, Loopback
from gpud.session.session import Session
from gpud.testing import bert, transformer, transformer_weights, workloads

DECODE = transformer_weights.Config(24, 64, 4, 2, 16, 128, 256, 256)  # Qwen2.5-0.5B's 24 layers, tiny sizes
MINILM = bert.BertConfig(6, 384, 12, 1536, 1000, max_positions=64)  # all-MiniLM-L6-v2 but its vocabulary
MINILM_BATCH = (4, 16)  # sentences, tokens
CHAIN = 1000  # dispatches per step of the chain (`gpud bench cuda --quick`)
CHAIN_N = 4096  # floats per buffer, as benchmarks/cuda.py


class Result:
    def __init__(
        self, name: str, steps: int, ops: int, dispatches: int, decoded: int, seconds: dict[str, float]
    ) -> None:
        self.name, self.steps, self.ops, self.dispatches = name, steps, ops, dispatches
        self.decoded = decoded  # dispatches decoded, checked and prepared afresh (memo misses)
        self.seconds = seconds

    def as_dict(self) -> dict[str, Any]:
        per_op = 1e6 / self.ops
        intake, completion = self.seconds["intake"], self.seconds["completion"]
        return {
            "ops_per_step": self.ops // self.steps,
            "misses_per_step": self.decoded // self.steps,
            "intake_us_per_op": intake * per_op,
            "decode_us_per_op": self.seconds["decode"] * per_op,
            "completion_us_per_step": completion * 1e6 / self.steps,
            "total_us_per_op": (intake + completion) * per_op,
        }

    def row(self) -> str:
        intake, decode, completion = self.seconds["intake"], self.seconds["decode"], self.seconds["completion"]
        per_op = 1e6 / self.ops
        return (
            f"  {self.name:<34} {self.ops // self.steps:6d} {100 * self.dispatches / self.ops:9.0f}%"
            f" {self.decoded // self.steps:8d}"
            f" {intake * per_op:10.2f} {decode * per_op:8.2f} {completion * 1e6 / self.steps:12.1f}"
            f" {(intake + completion) * per_op:10.2f}"
        )


HEADER = (
    f"  {'workload':<34} {'ops':>6} {'dispatch':>10} {'misses':>8} {'intake':>10} {'decode':>8} {'completion':>12}"
    f" {'total':>10}\n"
    f"  {'':<34} {'/step':>6} {'':>10} {'/step':>8} {'us/op':>10} {'us/op':>8} {'us/step':>12} {'us/op':>10}"
)


async def _measure(
    daemon: InProcessDaemon, name: str, steps: int, step: Callable[[], Coroutine[Any, Any, Any]], before: Any = None
) -> Result:
    await asyncio.sleep(0)
    daemon.clock.reset()
    daemon.ops = daemon.dispatches = 0
    memo = daemon.session.dispatch_memo
    misses = memo.misses
    for _ in range(steps):
        if before is not None:
            before()
        await step()
    return Result(name, steps, daemon.ops, daemon.dispatches, memo.misses - misses, dict(daemon.clock.seconds))


def forget_dispatches(session: Session) -> None:
    """Empty the session's caches of decoded and prepared dispatches: the next step misses in both."""
    session.dispatch_memo.clear()
    session._prepared.clear()


async def run(
    steps: int,
    reps: int,
    profile: bool,
    decode: transformer_weights.Config = DECODE,
    minilm: bert.BertConfig = MINILM,
    batch: tuple[int, int] = MINILM_BATCH,
    chain: int = CHAIN,
) -> list[tuple[Result, str]]:
    """Each workload's median run (and its profile's top 20, when asked)."""
    loop = asyncio.get_running_loop()
    clock = Clock()
    daemon = InProcessDaemon(loop, clock)
    gpu = gpud_client.Client(Loopback(daemon))  # type: ignore[arg-type]  # a duck-typed connection
    session = daemon.session

    weights = await transformer_weights.Weights.publish(gpu, decode, seed=0, prefix="bench/")
    decoder = transformer.Decoder(gpu, decode, weights)
    ids, position = np.zeros(1, np.int32), [0]

    async def decode_step() -> None:
        pos = np.array([position[0] % decode.max_len], np.int32)
        position[0] += 1
        await decoder.step(ids, pos, "coalesced")

    arrays = bert.random_weights(minilm, seed=0, dtype=np.float16)
    tensors = {name: gpu.tensor(array) for name, array in arrays.items()}
    encoder = bert.Encoder(gpu, minilm, tensors)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, minilm.vocab, batch)
    mask = np.ones(batch, np.float32)

    async def minilm_forward() -> None:
        await encoder.embed(tokens, mask)

    axpb = await gpu.kernel("fake:axpb", "axpb")
    bufs = [gpu.empty(CHAIN_N), gpu.empty(CHAIN_N)]
    x0 = np.ones(CHAIN_N, np.float32)

    async def chain_step() -> None:
        await workloads.run_chain(gpu, axpb, bufs, x0, chain)

    for _ in range(3):  # compiles, first allocations, caches filled
        await chain_step()
        await decode_step()
        await minilm_forward()
    gc.collect()
    gc.freeze()  # as the server does once its devices are open
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, 20, 100)

    cases: list[tuple[str, Callable[[], Coroutine[Any, Any, Any]], Any]] = [
        (f"chain of {chain} raw axpb dispatches", chain_step, None),
        (f"decode {decode.layers} layers, hits", decode_step, None),
        ("decode, misses (caches emptied)", decode_step, lambda: forget_dispatches(session)),
        (f"MiniLM eager {batch[0]}x{batch[1]} (new handles)", minilm_forward, None),
    ]
    results: list[tuple[Result, str]] = []
    try:
        results = await _run_cases(daemon, cases, steps, reps, profile)
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        session.close()
        await daemon.runtimes[0].close()
    return results


async def _run_cases(
    daemon: InProcessDaemon,
    cases: list[tuple[str, Callable[[], Coroutine[Any, Any, Any]], Any]],
    steps: int,
    reps: int,
    profile: bool,
) -> list[tuple[Result, str]]:
    clock = daemon.clock
    results = []
    for name, step, before in cases:
        runs = [await _measure(daemon, name, steps, step, before) for _ in range(reps)]
        result = sorted(runs, key=lambda r: r.seconds["intake"])[len(runs) // 2]  # the median run
        top = ""
        if profile:
            clock.profile = cProfile.Profile()
            await _measure(daemon, name, max(3, steps // 3), step, before)
            top = _top(clock.profile, 20)
            clock.profile = None
        results.append((result, top))
    return results


def _top(profile: cProfile.Profile, count: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats(pstats.SortKey.TIME).print_stats(count)
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    return "\n".join(lines[start:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.daemon_ops", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="decode steps (MiniLM forwards) per measurement")
    parser.add_argument("--reps", type=int, default=5, help="measurements per workload (the median is printed)")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile top-20 of each workload")
    parser.add_argument("--json", type=Path, help="write the table's figures here")
    args = parser.parse_args(argv)
    results = asyncio.run(run(args.steps, args.reps, not args.no_profile))
    figures = {result.name: result.as_dict() for result, _top in results}
    write_json(args.json, {"benchmark": "daemon_ops", "steps": args.steps, "reps": args.reps, "results": figures})
    print(
        f"daemon CPU per op, in process (fake device of kind cuda, no-op kernels; "
        f"median of {args.reps} runs of {args.steps} steps)"
    )
    print(HEADER)
    for result, _top_text in results:
        print(result.row())
    for result, top in results:
        if top:
            print(f"\ncProfile, {result.name} (daemon code only; sorted by own time):\n{top}")


if __name__ == "__main__":
    main()

"""The daemon's CPU cost per replay, in process: a MiniLM-shaped encoder's replay graph and the decode
step's replay graph, replayed many times through the daemon's real path (decode_client_message ->
Session.receive -> graph_ops.replay -> upload, launch, readback -> the flush -> completions -> reply).

    python -m benchmarks.daemon_replay [--reps 300] [--runs 5] [--no-profile] [--json PATH]

As `benchmarks.daemon_ops` (whose in-process daemon and connection this uses), on a fake device of
kind "cuda" with no-op kernels, which here encodes a replay as the cuda backend does: each run of
consecutive dispatches one command (one CUDA graph launch), with only the launches that take
per-replay scalars patched. Printed per replay: `intake` (decoding the message, running it, the
end-of-drain flush), `decode` (the decoding alone), `to readback` (from the message's receipt to its
readback's creation: the `--trace` stage `daemon_decode_execute`), `completion` (the ledger's
callbacks and the reply), and a cProfile top list of the daemon's code.

Workloads: all-MiniLM-L6-v2's shapes (6 layers, hidden 384, 12 heads, FFN 1536; a 1,000-word
vocabulary, random float16 weights) at 16 and 64 sentences of 32 tokens, `Encoder.embed(..., "replay")`;
the decode step (24 layers, Qwen2.5-0.5B's op sequence at tiny sizes, 48 bound KV caches) in graph mode.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import gc
import pstats
import statistics
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import gpud_client
import gpud_protocol as proto
from benchmarks import write_json
from benchmarks.daemon_inproc import Clock, InProcessDaemon, Loopback, NoOpDevice
from gpud.backends.base import GraphStep
from gpud.service.config import Config
from gpud.testing import bert, transformer, transformer_weights

MINILM = bert.BertConfig(6, 384, 12, 1536, 1000, max_positions=64)  # all-MiniLM-L6-v2 but its vocabulary
BATCHES = ((16, 32), (64, 32))  # sentences, tokens
DECODE = transformer_weights.Config(24, 64, 4, 2, 16, 128, 256, 256)  # as benchmarks.daemon_ops


def _graph_launch(*_args: Any) -> None:
    pass


class GraphDevice(NoOpDevice):
    """The no-op device, encoding replays as `CudaCommands` does (gpud.backends.cuda.commands)."""

    def instantiate(self, steps: Sequence[GraphStep]) -> Any:
        segments: list[tuple[Any, ...]] = []
        for is_dispatch, item, variables in super().instantiate(steps):
            if not is_dispatch:
                segments.append(("copy", item))
                continue
            if not segments or segments[-1][0] != "run":
                segments.append(("run", [], []))
            run, patched = segments[-1][1], segments[-1][2]
            if variables:
                patched.append((len(run), variables))
            run.append(item)
        return segments

    def encode_replay(self, native: Any, values: Sequence[int | float]) -> None:
        for segment in native:
            if segment[0] == "copy":
                self.encode_copy(*segment[1])
                continue
            _, run, patched = segment
            patches = [(i, self.with_scalars(run[i], v, values)) for i, v in patched]
            self._commands.append(("dispatch", _graph_launch, [], [run, patches], 0))


class TracedLoopback(Loopback):
    """The in-process connection, keeping each reply's daemon stamps (`Config.trace`)."""

    def __init__(self, daemon: InProcessDaemon) -> None:
        super().__init__(daemon)
        self.stamps: list[list[float]] = []

    def _on_message(self, frames: list[Any]) -> None:
        header = proto.decode_server_message(frames, self.limits)[0]
        if header.get("t") == "reply" and "tr" in header:
            self.stamps.append(header["tr"])
        super()._on_message(frames)


@dataclasses.dataclass
class Result:
    name: str
    replays: int
    seconds: dict[str, float]
    to_readback: list[float]  # per replay, seconds

    def as_dict(self) -> dict[str, float]:
        per = 1e6 / self.replays
        return {
            "intake_us": self.seconds["intake"] * per,
            "decode_us": self.seconds["decode"] * per,
            "to_readback_us": 1e6 * statistics.median(self.to_readback),
            "completion_us": self.seconds["completion"] * per,
            "total_us": (self.seconds["intake"] + self.seconds["completion"]) * per,
        }

    def row(self) -> str:
        d = self.as_dict()
        return (
            f"  {self.name:<28} {d['intake_us']:9.1f} {d['decode_us']:8.1f} {d['to_readback_us']:11.1f}"
            f" {d['completion_us']:11.1f} {d['total_us']:9.1f}"
        )


HEADER = (
    f"  {'workload':<28} {'intake':>9} {'decode':>8} {'to readback':>11} {'completion':>11} {'total':>9}\n"
    f"  {'':<28} {'us':>9} {'us':>8} {'us (median)':>11} {'us':>11} {'us':>9}"
)

Step = Callable[[], Coroutine[Any, Any, Any]]


async def _measure(daemon: InProcessDaemon, link: TracedLoopback, name: str, reps: int, step: Step) -> Result:
    await asyncio.sleep(0)
    daemon.clock.reset()
    link.stamps.clear()
    for _ in range(reps):
        await step()
    to_readback = [executed - received for received, executed, *_rest in link.stamps]
    return Result(name, reps, dict(daemon.clock.seconds), to_readback)


async def run(
    reps: int, runs: int, profile: bool, batches: Sequence[tuple[int, int]] = BATCHES
) -> list[tuple[Result, str]]:
    """Each workload's median run (by intake), and its profile's top 25 when asked."""
    loop = asyncio.get_running_loop()
    daemon = InProcessDaemon(loop, Clock(), dataclasses.replace(Config(), trace=True), GraphDevice)
    link = TracedLoopback(daemon)
    gpu = gpud_client.Client(link)  # type: ignore[arg-type]  # a duck-typed connection
    cases: list[tuple[str, Step]] = []

    arrays = bert.random_weights(MINILM, seed=0, dtype=np.float16)
    encoder = bert.Encoder(gpu, MINILM, {name: gpu.tensor(array) for name, array in arrays.items()})
    rng = np.random.default_rng(0)
    for batch in batches:
        tokens, mask = rng.integers(0, MINILM.vocab, batch), np.ones(batch, np.float32)

        async def embed(tokens: Any = tokens, mask: Any = mask) -> None:
            await encoder.embed(tokens, mask, "replay")

        cases.append((f"MiniLM replay {batch[0]}x{batch[1]}", embed))

    weights = await transformer_weights.Weights.publish(gpu, DECODE, seed=0, prefix="bench/")
    decoder = transformer.Decoder(gpu, DECODE, weights)
    position = [0]

    async def decode_step() -> None:
        pos = np.array([position[0] % DECODE.max_len], np.int32)
        position[0] += 1
        await decoder.step(np.zeros(1, np.int32), pos, "graph")

    cases.append((f"decode {DECODE.layers} layers, graph", decode_step))

    for _name, step in cases:  # built, compiled, planned
        for _ in range(3):
            await step()
    gc.collect()
    gc.freeze()  # as the server does once its devices are open
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, 20, 100)
    results: list[tuple[Result, str]] = []
    try:
        for name, step in cases:
            measured = [await _measure(daemon, link, name, reps, step) for _ in range(runs)]
            result = sorted(measured, key=lambda r: r.seconds["intake"])[len(measured) // 2]
            top = ""
            if profile:
                daemon.clock.profile = cProfile.Profile()
                await _measure(daemon, link, name, max(20, reps // 3), step)
                top = top_per_replay(daemon.clock.profile, max(20, reps // 3), 25)
                daemon.clock.profile = None
            results.append((result, top))
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        daemon.session.close()
        await daemon.runtimes[0].close()
    return results


def top_per_replay(profile: cProfile.Profile, replays: int, count: int) -> str:
    """The functions with the most own time, in µs per replay (cProfile's overhead included)."""
    stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda item: -item[1][2])[:count]
    lines = [f"  {'own us':>8} {'cum us':>8} {'calls':>7}  function"]
    for (filename, line, name), (_cc, calls, own, cumulative, _callers) in rows:
        where = f"{Path(filename).name}:{line}({name})" if line else name
        lines.append(f"  {1e6 * own / replays:8.2f} {1e6 * cumulative / replays:8.2f} {calls / replays:7.1f}  {where}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.daemon_replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=300, help="replays per measurement")
    parser.add_argument("--runs", type=int, default=5, help="measurements per workload (the median is printed)")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile top-25 of each workload")
    parser.add_argument("--json", type=Path, help="write the table's figures here")
    args = parser.parse_args(argv)
    results = asyncio.run(run(args.reps, args.runs, not args.no_profile))
    figures = {result.name: result.as_dict() for result, _top in results}
    write_json(args.json, {"benchmark": "daemon_replay", "reps": args.reps, "runs": args.runs, "results": figures})
    print(f"daemon CPU per replay, in process (no-op device of kind cuda; median of {args.runs} runs of {args.reps})")
    print(HEADER)
    for result, _top_text in results:
        print(result.row())
    for result, top in results:
        if top:
            print(f"\ncProfile, {result.name} (daemon code only; sorted by own time):\n{top}")


if __name__ == "__main__":
    main()

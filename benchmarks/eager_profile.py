"""Where an eager MiniLM forward's time goes: the client's CPU per op, the messages it sends, the round
trips it waits for, and (with --daemon-profile) the daemon's CPU per op.

    python -m benchmarks.eager_profile [--backend fake|webgpu|cuda] [--batch 16] [--length 16]
                                       [--dtype float16] [--reps 20] [--daemon-profile [FILE]]

The model is a random BERT of all-MiniLM-L6-v2's shapes (gpud.testing.bert: hidden 384, 12 heads, 6
layers, FFN 1536), published read-only and opened as `gpud bench embed` does, and the forward is
`Encoder.embed(ids, mask, "eager")`. On the fake backend (default) the daemon's op library runs no-ops
(benchmarks.fake_ops): what is left is CPU, the client's and the daemon's. Printed:

- milliseconds per forward (`embed`, end to end), and per phase of one: the inputs' uploads, queueing
  the forward's ops (the client's CPU alone), the readback (the daemon executing them, then the round
  trip) and the scope's exit (its frees, queued);
- per forward: the messages sent, the ops they carried by kind, the requests the client waited for
  (round trips: eager work must have one, the readback) and those it did not wait for;
- the client's cost per op-library call (unprofiled: the queueing phase over the calls), and a
  cProfile of that phase (cumulative per call, then the top functions by own time);
- with --daemon-profile, the daemon's cProfile per forward (the whole run over its forwards: give
  enough --reps for the steady state to dominate).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import io
import pstats
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

import gpud_client
from benchmarks import fake_ops
from gpud.testing.bert import CONFIGS, Encoder, random_weights
from gpud_protocol import Opcode

OP_CALLS = ("attention.py", "elementwise.py", "reduce.py", "matmul.py")  # where op-library calls live
FORWARDS = 6  # the untimed ones: warm-up (3), then counted (3)
LIBRARY_OPS = ("add", "mul", "div", "gelu", "matmul", "layernorm", "attention", "embedding", "sum", "normalize")


class Counter:
    """Counts what the client sends and waits for, by wrapping its connection (one forward's worth)."""

    def __init__(self, gpu: gpud_client.Client) -> None:
        connection = gpu._connection
        self.messages = 0
        self.ops: collections.Counter[str] = collections.Counter()
        self.awaited = 0
        self.unawaited = 0
        send, request, expect = connection._sock.send_multipart, connection.request, connection.expect

        def counted_send(frames: list[Any], *args: Any, **kwargs: Any) -> Any:
            self.messages += 1
            header = msgpack.unpackb(bytes(frames[0]), raw=False, strict_map_key=False)
            self.ops.update(Opcode(op[0]).name.lower() for op in header.get("ops", ()))
            return send(frames, *args, **kwargs)

        async def counted_request(seq: int, expected: Any = None) -> Any:
            self.awaited += 1
            return await request(seq, expected)

        def counted_expect(seq: int) -> None:
            self.unawaited += 1
            expect(seq)

        connection._sock.send_multipart = counted_send  # type: ignore[method-assign,assignment]
        connection.request = counted_request  # type: ignore[method-assign]
        connection.expect = counted_expect  # type: ignore[method-assign]

    def reset(self) -> None:
        self.messages, self.awaited, self.unawaited = 0, 0, 0
        self.ops.clear()


async def _model(gpu: gpud_client.Client, dtype: str) -> Encoder:
    """The random MiniLM-shaped encoder over read-only residents this session publishes and opens."""
    config = CONFIGS["all-minilm-l6-v2"]
    prefix = "eager-profile/"
    for name, array in random_weights(config, 0, np.dtype(dtype)).items():
        gpu.publish(gpu.tensor(array), prefix + name, "ro")
    return Encoder(gpu, config, await gpu.open_prefix(prefix))


async def _phases(
    gpu: gpud_client.Client, encoder: Encoder, ids: Any, mask: Any, profile: cProfile.Profile | None
) -> list[float]:
    """One eager forward, as `Encoder.embed` runs it, timed by phase (seconds): uploads, queueing,
    readback, scope exit. `profile` (if any) runs during the queueing only."""
    positions = np.arange(ids.shape[1], dtype=np.int32)
    t0 = time.perf_counter()
    async with gpu.scope():
        inputs = [gpu.tensor(a, device=encoder.device) for a in (ids, mask, positions)]
        t1 = time.perf_counter()
        if profile is not None:
            profile.enable()
        y = encoder.forward(*inputs)
        if profile is not None:
            profile.disable()
        t2 = time.perf_counter()
        await y.numpy()
        t3 = time.perf_counter()
    t4 = time.perf_counter()
    return [t1 - t0, t2 - t1, t3 - t2, t4 - t3]


def _library_calls(profile: cProfile.Profile, forwards: int) -> dict[str, tuple[int, float]]:
    """{op: (calls per forward, cumulative profiled us per call)} of the op library's public calls."""
    stats = pstats.Stats(profile)
    out: dict[str, tuple[int, float]] = {}
    for (path, _line, name), (_cc, calls, _tt, cumulative, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if name in LIBRARY_OPS and path.endswith(OP_CALLS) and "gpud_client" in path:
            out[name] = (calls // forwards, cumulative / calls * 1e6)
    return dict(sorted(out.items(), key=lambda kv: -kv[1][0] * kv[1][1]))


def _top(profile: cProfile.Profile | pstats.Stats, sort: str, count: int) -> str:
    stream = io.StringIO()
    stats = profile if isinstance(profile, pstats.Stats) else pstats.Stats(profile, stream=stream)
    stats.stream = stream  # type: ignore[attr-defined]
    stats.strip_dirs().sort_stats(sort).print_stats(count)
    return "\n".join(line for line in stream.getvalue().splitlines() if line.strip())


async def run(address: str, args: argparse.Namespace) -> None:
    async with gpud_client.connect(address) as gpu:
        encoder = await _model(gpu, args.dtype)
        rng = np.random.default_rng(0)
        ids = rng.integers(0, encoder.c.vocab, (args.batch, args.length)).astype(np.int64)
        mask = np.ones((args.batch, args.length), np.float32)
        mask[:, args.length * 3 // 4 :] = 0  # padding, as a batch of sentences of several lengths has
        for _ in range(3):  # kernels registered and compiled, caches warm
            await encoder.embed(ids, mask)
        counter = Counter(gpu)
        await encoder.embed(ids, mask)
        counter.reset()  # a forward's frees leave with the next forward's message: two, each with one's frees
        await encoder.embed(ids, mask)
        await encoder.embed(ids, mask)
        messages, awaited, unawaited = counter.messages / 2, counter.awaited / 2, counter.unawaited
        ops = collections.Counter(counter.ops)
        walls = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            await encoder.embed(ids, mask)
            walls.append(time.perf_counter() - t0)
        phases = [await _phases(gpu, encoder, ids, mask, None) for _ in range(args.reps)]
        profile = cProfile.Profile()
        for _ in range(args.reps):
            await _phases(gpu, encoder, ids, mask, profile)
        encoder.free()

    per_phase = [statistics.median(p[i] for p in phases) * 1e3 for i in range(4)]
    calls = _library_calls(profile, args.reps)
    library_calls = sum(n for n, _us in calls.values())
    print(
        f"\neager MiniLM forward, {args.batch} x {args.length} tokens, {args.dtype}, {args.backend} daemon "
        f"(median of {args.reps}):"
    )
    print(f"  embed, end to end      {statistics.median(walls) * 1e3:8.2f} ms  (min {min(walls) * 1e3:.2f})")
    for name, ms in zip(
        ("uploads (3 inputs)", "queueing the forward", "readback (daemon + trip)", "scope exit (frees)"),
        per_phase,
        strict=True,
    ):
        print(f"  {name:<22} {ms:8.2f} ms")
    print(
        f"\nper forward: {messages:g} message(s), {sum(ops.values()) / 2:g} ops "
        f"({', '.join(f'{k} {v / 2:g}' for k, v in ops.most_common())}); "
        f"round trips waited for: {awaited:g}; requests not waited for (over 2 forwards): {unawaited}"
    )
    print(
        f"\nclient, per op-library call: {per_phase[1] * 1e3 / max(1, library_calls):.2f} us "
        f"(queueing over {library_calls} calls, reshapes and views included); profiled, cumulative per call:"
    )
    for name, (count, us) in calls.items():
        print(f"  {name:<10} x{count:<4} {us:8.2f} us")
    print("\nclient, queueing phase, top functions by own time (profiled):")
    print(_top(profile, "tottime", args.top))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.eager_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="fake", help="fake (no-op op library, the default), webgpu or cuda")
    parser.add_argument("--batch", type=int, default=16, help="sentences")
    parser.add_argument("--length", type=int, default=16, help="tokens per sentence")
    parser.add_argument("--dtype", default="float16", help="the weights' dtype (float16, as gpud bench embed)")
    parser.add_argument("--reps", type=int, default=20, help="timed forwards")
    parser.add_argument("--top", type=int, default=25, help="functions listed per profile")
    parser.add_argument(
        "--daemon-profile",
        nargs="?",
        const="",
        metavar="FILE",
        help="profile the daemon too (cProfile; its statistics kept in FILE if given)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpud-eager-") as tmp:
        stats = Path(args.daemon_profile or Path(tmp) / "daemon.prof")
        extra = ("--profile", str(stats)) if args.daemon_profile is not None else ()
        with fake_ops.daemon(args.backend, extra_args=extra) as address:
            asyncio.run(run(address, args))
        if args.daemon_profile is not None:  # written when the daemon exited
            _daemon_report(pstats.Stats(str(stats)), FORWARDS + 3 * args.reps, args.top)


def _daemon_report(stats: pstats.Stats, forwards: int, count: int) -> None:
    """The daemon's profile, per forward: the whole run (weights, warm-up) divided by its forwards, so
    run enough of them (--reps) for the steady state to dominate."""
    print(f"\ndaemon, profiled, per forward ({forwards} in the run; cProfile's own cost included):")
    print(f"  {'function':<58} {'calls/fwd':>9} {'us/call':>9} {'own us/fwd':>10} {'cum us/fwd':>10}")
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:count]  # type: ignore[attr-defined]
    for (path, line, name), (_cc, calls, own, cumulative, _callers) in rows:
        where = f"{Path(path).parent.name}/{Path(path).name}:{line}({name})" if line else name
        per_call = cumulative / calls * 1e6
        print(
            f"  {where[-58:]:<58} {calls / forwards:9.1f} {per_call:9.2f} "
            f"{own / forwards * 1e6:10.1f} {cumulative / forwards * 1e6:10.1f}"
        )


if __name__ == "__main__":
    main()

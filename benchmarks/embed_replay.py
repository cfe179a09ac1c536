"""Where a MiniLM replay's CPU time goes, both sides: one client replaying all-MiniLM-L6-v2 at one batch
size many times, its own calls under cProfile, the daemon's under its --profile (give GPUD_DAEMON_ARGS).

    GPUD_DAEMON_ARGS="--profile daemon.prof" python3 -m benchmarks.embed_replay --weights .embed \\
        [--sentences 16] [--reps 300] [--backend cuda]

Printed: the first replay's seconds (the graph built, its kernels compiled unless GPUD_CACHE_DIR holds
them), milliseconds per replay (median), the client's top functions by own time over the replays;
the daemon's profile is written at its exit (pstats can read it).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import time
from pathlib import Path

import gpud_client
from benchmarks.embed import _batches
from gpud.testing import minilm
from gpud.testing.bert import CONFIGS, Encoder
from gpud.testing.embedding import MODEL, Batch, new_prefix, publish, unpublish
from gpud.testing.spawn import daemon


async def _replays(address: str, prefix: str, batch: Batch, reps: int) -> None:
    async with gpud_client.connect(address) as gpu:
        encoder = Encoder(gpu, CONFIGS[MODEL], await gpu.open_prefix(prefix))
        t0 = time.perf_counter()
        await encoder.embed(batch.ids, batch.mask, "replay")  # kernels compiled (or read from the disk cache)
        print(f"the first replay, its graph built: {time.perf_counter() - t0:.2f} s")
        for _ in range(20):  # caches warm
            await encoder.embed(batch.ids, batch.mask, "replay")
        profile, times = cProfile.Profile(), []
        for _ in range(reps):
            t0 = time.perf_counter()
            profile.enable()
            await encoder.embed(batch.ids, batch.mask, "replay")
            profile.disable()
            times.append(time.perf_counter() - t0)
        encoder.free()
    sentences, tokens = batch.ids.shape
    print(f"{sentences} sentences x {tokens} tokens: {1e3 * statistics.median(times):.3f} ms a replay")
    pstats.Stats(profile).sort_stats("tottime").print_stats(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--weights", type=Path, default=None)
    parser.add_argument("--sentences", type=int, default=16)
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--backend", default="cuda")
    args = parser.parse_args()
    weights = minilm.weights_dir(args.weights)
    batch = _batches(minilm.load_tokenizer(weights), [args.sentences])[args.sentences]
    prefix = new_prefix()
    with daemon(args.backend) as (address, _proc):
        asyncio.run(publish(address, weights, prefix))
        asyncio.run(_replays(address, prefix, batch, args.reps))
        asyncio.run(unpublish(address, prefix))


if __name__ == "__main__":
    main()

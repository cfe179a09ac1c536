"""all-MiniLM-L6-v2 (real weights) through a daemon, one batch shape, eager and replay: seconds per batch.

    python -m benchmarks.embed_long [--weights .embed] [--backend webgpu] [--sentences 16] [--offset 16]
                                    [--reps 3] [--json FILE]

`gpud bench embed --sentences 16` embeds the demo's 16 short sentences (16 tokens); this one takes
`sentences` consecutive lines of benchmarks/embed_sentences.txt from `offset` (lines 16 to 31: 16 x 60
tokens once padded to the longest, 453 of them real), so a batch has an encoder's usual length.
Printed: the batch's shape, the median and every repetition of eager and replay, and the largest
difference between the two ways' embeddings (the same kernels: they agree to float rounding). The
daemon runs as `gpud bench` runs it (LP_NUM_THREADS as set in the environment: lavapipe's default is a
thread per core).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from pathlib import Path
from typing import Any

import numpy as np

import gpud_client
from benchmarks import write_json
from gpud.backends import resolve
from gpud.testing import minilm
from gpud.testing.bert import CONFIGS, MODES, Encoder
from gpud.testing.embedding import MODEL, Batch, embed_all, new_prefix, publish, unpublish
from gpud.testing.spawn import daemon

CORPUS = Path(__file__).with_name("embed_sentences.txt")


async def _run(address: str, prefix: str, batch: Batch, reps: int) -> tuple[dict[str, list[float]], float, str]:
    async with gpud_client.connect(address) as gpu:
        encoder = Encoder(gpu, CONFIGS[MODEL], await gpu.open_prefix(prefix))
        seconds, out = await embed_all(encoder, [batch], MODES, reps, lambda: None)
        encoder.free()
        device = str(gpu.devices[gpu.device].get("name", "?"))
    differ = float(np.abs(out[(0, "eager")] - out[(0, "replay")]).max())
    return {mode: seconds[(0, mode)] for mode in MODES}, differ, device


def main(args: argparse.Namespace) -> int:
    weights = minilm.weights_dir(args.weights)
    tokenizer = minilm.load_tokenizer(weights)
    lines = CORPUS.read_text().splitlines()[args.offset : args.offset + args.sentences]
    batch = Batch(*minilm.tokenize(tokenizer, lines))
    backend = resolve(args.backend)
    prefix = new_prefix()
    with daemon(backend) as (address, _proc):
        asyncio.run(publish(address, weights, prefix))
        try:
            seconds, differ, device = asyncio.run(_run(address, prefix, batch, args.reps))
        finally:
            asyncio.run(unpublish(address, prefix))
    shape = f"{batch.ids.shape[0]}x{batch.ids.shape[1]}"
    print(f"all-MiniLM-L6-v2, float16 weights, {backend} ({device}), batch {shape} ({int(batch.mask.sum())} tokens)")
    result: dict[str, Any] = {"benchmark": "embed-long", "device": device, "shape": shape, "eager_vs_replay": differ}
    for mode, times in seconds.items():
        result[f"{mode}_s"] = times
        print(
            f"  {mode:<7} {statistics.median(times):7.3f} s per batch (median of {len(times)}: "
            + ", ".join(f"{t:.3f}" for t in times)
            + ")"
        )
    print(f"  eager and replay embeddings differ by at most {differ:.2g}")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--weights", type=Path, default=None, help="model.safetensors + tokenizer.json")
    parser.add_argument("--backend", default="webgpu")
    parser.add_argument("--sentences", type=int, default=16)
    parser.add_argument("--offset", type=int, default=16, help="the first line of embed_sentences.txt taken")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    raise SystemExit(main(parser.parse_args()))

"""Kernel times of one decode step of the Qwen2.5-0.5B-shaped model, gpud's (one session decoding `batch`
sequences, coalesced: the kernels a replay of the same step runs) beside the torch step of
`gpud bench decode` (one sequence, eager), for Nsight Compute: each kernel's GPU time summed by name.

    ncu --target-processes all --clock-control none --metrics gpu__time_duration.sum --csv \\
        --log-file ncu.csv python3 -m benchmarks.decode_profile [--batch 16]
    python3 -m benchmarks.decode_profile --report ncu.csv

Each side runs STEPS steps (the first of gpud's compiles its kernels, which is no kernel time; torch's are
the warm-up steps `_torch_model` runs before it captures its graph), so the report divides each sum by
STEPS: microseconds per step."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import numpy as np

import gpud_client
from benchmarks.decode import _torch_model
from benchmarks.embed_profile import report
from gpud.testing.decoding import new_prefix, publish, unpublish
from gpud.testing.spawn import daemon
from gpud.testing.transformer import Decoder
from gpud.testing.transformer_weights import CONFIGS, Weights

MODEL = "qwen2.5-0.5b"
STEPS = 3  # the warm-up steps of benchmarks.decode._torch_model


async def _gpud(address: str, prefix: str, batch: int) -> None:
    async with gpud_client.connect(address) as gpu:
        config = CONFIGS[MODEL]
        decoder = Decoder(gpu, config, await Weights.open(gpu, config, prefix), batch)
        ids = np.arange(batch, dtype=np.int32)
        for step in range(STEPS):
            ids = (await decoder.step(ids, np.full(batch, step, np.int32), "coalesced")).next
        decoder.free()


def run(batch: int) -> None:
    prefix = new_prefix()
    with daemon("cuda") as (address, _proc):
        asyncio.run(publish(address, MODEL, prefix))
        asyncio.run(_gpud(address, prefix, batch))
        asyncio.run(unpublish(address, MODEL, prefix))
    _torch_model(CONFIGS[MODEL])  # its STEPS warm-up steps (then a graph captured, not run)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--batch", type=int, default=1, help="sequences gpud's session decodes together")
    parser.add_argument("--report", type=Path)
    parser.add_argument("--by-grid", action="store_true", help="report: a row per kernel and grid (layer shapes)")
    args = parser.parse_args()
    if args.report:
        report(args.report, STEPS, "step", args.by_grid)
    else:
        run(args.batch)


if __name__ == "__main__":
    main()

"""Kernel times of one all-MiniLM-L6-v2 forward, gpud (eager, on cuda) beside transformers' BertModel, for
Nsight Compute: each kernel's GPU time, summed by kernel name over the forwards.

    ncu --target-processes all --metrics gpu__time_duration.sum --csv --log-file ncu.csv \\
        python3 -m benchmarks.embed_profile --weights .embed [--sentences 256]
    python3 -m benchmarks.embed_profile --report ncu.csv

The run makes FORWARDS forwards of each (the first compiles gpud's kernels, captures nothing), so the
report divides each sum by FORWARDS: microseconds per forward."""

from __future__ import annotations

import argparse
import asyncio
import csv
import re
from collections import defaultdict
from pathlib import Path

import gpud_client
from benchmarks import embed_torch
from benchmarks.embed import _batches
from gpud.testing import minilm
from gpud.testing.bert import CONFIGS, Encoder
from gpud.testing.embedding import MODEL, new_prefix, publish, unpublish
from gpud.testing.spawn import daemon

FORWARDS = 2


async def _gpud(address: str, prefix: str, ids: object, mask: object) -> None:
    async with gpud_client.connect(address) as gpu:
        encoder = Encoder(gpu, CONFIGS[MODEL], await gpu.open_prefix(prefix))
        for _ in range(FORWARDS):
            await encoder.embed(ids, mask, "eager")  # type: ignore[arg-type]
        encoder.free()


def run(weights: Path, sentences: int) -> None:
    batch = _batches(minilm.load_tokenizer(weights), [sentences])[sentences]
    prefix = new_prefix()
    with daemon("cuda") as (address, _proc):
        asyncio.run(publish(address, weights, prefix))
        asyncio.run(_gpud(address, prefix, batch.ids, batch.mask))
        asyncio.run(unpublish(address, prefix))
    embed = embed_torch.eager(embed_torch.load(weights))
    for _ in range(FORWARDS):
        embed(batch.ids, batch.mask)


def report(path: Path, per: int = FORWARDS, unit: str = "forward", by_grid: bool = False) -> None:
    """Microseconds per `unit` (`per` of them profiled) by kernel (and grid, `by_grid`: one row per
    shape a kernel ran at), gpud's (the daemon's process) and torch's, largest first."""
    rows = list(csv.reader(line for line in path.read_text().splitlines() if line.startswith('"')))
    header = rows[0]
    name_at, pid_at, value_at = header.index("Kernel Name"), header.index("Process ID"), header.index("Metric Value")
    unit_at, grid_at = header.index("Metric Unit"), header.index("Grid Size")
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
    times: dict[tuple[str, str], float] = defaultdict(float)
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for row in rows[1:]:
        kernel = re.sub(r"\(.*", "", row[name_at])[:60] + (f" grid {row[grid_at]}" if by_grid else "")
        key = (row[pid_at], kernel)
        times[key] += float(row[value_at].replace(",", "")) * scale.get(row[unit_at], 1.0) / per
        counts[key] += 1
    for pid in sorted({p for p, _k in times}):
        total = sum(t for (p, _k), t in times.items() if p == pid)
        print(f"\nprocess {pid}: {total:.0f} us of kernels per {unit}")
        for (p, kernel), t in sorted(times.items(), key=lambda item: -item[1]):
            if p == pid and t >= 0.01 * total:
                print(f"  {t:9.1f} us  {counts[(p, kernel)] // per:4d} launches  {kernel}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--weights", type=Path, default=None)
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        report(args.report)
    else:
        run(minilm.weights_dir(args.weights), args.sentences)


if __name__ == "__main__":
    main()

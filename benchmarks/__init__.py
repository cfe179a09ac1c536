"""Benchmarks: gpud side by side with the in-process alternatives, in one process run."""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gpud import __version__


def per_item_us(samples: list[float], items: int) -> dict[str, float]:
    """Median and p10/p90 of per-item microseconds, from per-repetition seconds."""
    us = sorted(s / items * 1e6 for s in samples)
    return {
        "median": statistics.median(us),
        "p10": us[len(us) // 10],
        "p90": us[(len(us) * 9) // 10],
    }


def time_sync(fn: Callable[[], object], reps: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


async def time_async(fn: Callable[[], Awaitable[object]], reps: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        await fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t0)
    return samples


def percentiles_us(samples: list[float]) -> dict[str, float]:
    us = sorted(s * 1e6 for s in samples)
    return {"p50": us[len(us) // 2], "p99": us[min(len(us) - 1, (len(us) * 99) // 100)], "mean": statistics.fmean(us)}


def print_table(title: str, rows: list[tuple[str, float, str]]) -> None:
    """rows: (name, µs per dispatch, ratio text)."""
    print(f"\n{title}")
    width = max(len(r[0]) for r in rows)
    for name, us, ratio in rows:
        print(f"  {name:<{width}}  {us:10.2f} us  {ratio}")


def write_json(path: Path | None, results: dict[str, Any]) -> None:
    results = {
        "gpud": __version__,
        "python": sys.version.split()[0],
        "host": platform.node(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **results,
    }
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {path}")

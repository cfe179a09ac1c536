"""Run worker processes that report over a queue, and gather what each one reports (the decode and
embedding workloads' K processes)."""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Callable, Sequence
from typing import Any


def gather(
    procs: Sequence[Any],
    events: Any,
    exited: str,
    failed: str,
    on_event: Callable[[tuple[Any, ...]], None] | None = None,
) -> list[Any]:
    """Start `procs`, then collect each one's `("done", index, result)` from `events`, in index order.

    `("failed", index, why)` raises `RuntimeError(failed.format(index, why))`, a process that exits
    without reporting raises `RuntimeError(exited)`, and any other event goes to `on_event`. Every
    process is joined (killed after 30 s) on the way out."""
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        while len(results) < len(procs):
            try:
                event = events.get(timeout=5.0)
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError(exited) from None
                continue
            if event[0] == "failed":
                raise RuntimeError(failed.format(event[1], event[2]))
            if event[0] == "done":
                results[event[1]] = event[2]
            elif on_event is not None:
                on_event(event)
    finally:
        for p in procs:
            with contextlib.suppress(Exception):
                p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [results[i] for i in range(len(procs))]

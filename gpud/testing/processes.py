"""Run worker processes that report over a queue, and gather what each one reports (the decode and
embedding workloads' K processes)."""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable, Sequence
from typing import Any

POLL_S = 5.0  # how often a quiet queue is checked for processes that exited without reporting
JOIN_S = 30.0  # how long each process is given to exit at the end before it is killed


def gather(
    procs: Sequence[Any],
    events: Any,
    exited: str,
    failed: str,
    on_event: Callable[[tuple[Any, ...]], None] | None = None,
    stall_s: float | None = None,
) -> list[Any]:
    """Start `procs`, then collect each one's `("done", index, result)` from `events`, in index order.

    `("failed", index, why)` raises `RuntimeError(failed.format(index, why))`, a process that exits
    without reporting raises `RuntimeError(exited)`, and any other event goes to `on_event`. With
    `stall_s`, no event at all for that long raises `RuntimeError` naming the processes that have not
    reported (a hung run ends with what is known instead of waiting forever). Every process is joined
    (killed after `JOIN_S`) on the way out."""
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    heard = time.monotonic()
    silent: set[int] = set()  # processes found gone without reporting at the last quiet poll
    try:
        while len(results) < len(procs):
            try:
                event = events.get(timeout=POLL_S if stall_s is None else min(POLL_S, stall_s))
            except queue.Empty:
                # a process gone without reporting, at two quiet polls in a row: whatever it put before
                # it exited would have been read in between
                gone = {i for i, p in enumerate(procs) if p.exitcode is not None and i not in results}
                if gone & silent:
                    raise RuntimeError(exited) from None
                silent = gone
                if stall_s is not None and time.monotonic() - heard > stall_s:
                    waiting = [i for i in range(len(procs)) if i not in results]
                    stalled = f"no word from processes {waiting} for {stall_s:g} s: the run stalled"
                    raise RuntimeError(stalled) from None
                continue
            heard, silent = time.monotonic(), set()
            if event[0] == "failed":
                raise RuntimeError(failed.format(event[1], event[2]))
            if event[0] == "done":
                results[event[1]] = event[2]
            elif on_event is not None:
                on_event(event)
    finally:
        for p in procs:
            with contextlib.suppress(Exception):
                p.join(timeout=JOIN_S)
            if p.is_alive():
                p.kill()
    return [results[i] for i in range(len(procs))]

"""Waiting for a reply that is known to take long: sleep through most of it, spin at its end.

A session that spins for its replies (`spin_us`, the shared-memory ring's sessions by default) spins
right after each request, and a reply that comes later than the spin (a replay whose GPU work takes
longer) finds the client asleep: waking it costs as much as the rest of the round trip. A request
that repeats (a replay graph's) knows how long its last replies took; the client then sleeps first and
starts spinning shortly before the reply is due. The event loop's timers fire to the millisecond, so a
nap is whole milliseconds, and the spin that follows it runs from about half a spin to a millisecond and
a half before the reply is due until half a spin after it.
"""

from __future__ import annotations

import math

GRAIN_S = 1e-3  # the event loop's timer resolution (epoll waits in milliseconds)
KEPT = 3  # replies remembered: the least of them is the one expected


class Expected:
    """How long a repeated request's replies took, from the request leaving to its reply read."""

    __slots__ = ("_recent",)

    def __init__(self) -> None:
        self._recent: list[float] = []

    def seconds(self) -> float:
        """When the next reply is due (the quickest of the last `KEPT`), or 0 before `KEPT` came."""
        return min(self._recent) if len(self._recent) == KEPT else 0.0

    def add(self, seconds: float) -> None:
        self._recent.append(seconds)
        if len(self._recent) > KEPT:
            del self._recent[0]


def nap_s(due_s: float, spin_s: float, elapsed_s: float) -> float:
    """Seconds to sleep before spinning for a reply due `due_s` after its request left, `elapsed_s`
    ago (whole milliseconds; 0: spin now)."""
    return max(0.0, math.floor((due_s - spin_s / 2 - elapsed_s) / GRAIN_S) * GRAIN_S)

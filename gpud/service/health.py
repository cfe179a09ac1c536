"""Health by progress, not liveness.

A daemon whose event loop runs can still be useless: a GPU that hangs holds every session's work
forever. So health is judged from each device's completion ledger: when work is pending on a
device (submitted, not completed) and nothing has completed for `health_stall_s`, the daemon is
unhealthy. `gpud status` and systemd's `STATUS=` say which device and for how long, and the
watchdog is no longer fed, so systemd restarts a hung engine (`WatchdogSec=` in the unit).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol


class Ledger(Protocol):
    @property
    def in_flight(self) -> int: ...

    def stalled_for(self, now: float) -> float: ...


class Runtime(Protocol):
    @property
    def index(self) -> int: ...

    @property
    def ledger(self) -> Ledger: ...


class Health(NamedTuple):
    healthy: bool
    problems: tuple[str, ...]  # one line each: which device, how long, why
    stalled: tuple[float, ...]  # per device: seconds of pending work without a completion

    def summary(self) -> str:
        return "healthy" if self.healthy else "UNHEALTHY: " + "; ".join(self.problems)


def assess(runtimes: Sequence[Runtime], stall_s: float, now: float, fatal: BaseException | None = None) -> Health:
    """The daemon's health at `now` (time.monotonic())."""
    problems: list[str] = []
    stalled: list[float] = []
    if fatal is not None:
        problems.append(f"fatal device error: {fatal}")
    for rt in runtimes:
        ledger = rt.ledger
        stall = ledger.stalled_for(now)
        stalled.append(stall)
        if stall >= stall_s:
            problems.append(
                f"device {rt.index}: {ledger.in_flight} submission(s) pending and none completed "
                f"for {stall:.1f} s (health_stall_s = {stall_s:g})"
            )
    return Health(not problems, tuple(problems), tuple(stalled))

"""Health by progress, not liveness.

A daemon whose event loop runs can still be useless: a GPU that hangs holds every session's work
forever. So health is judged from each device's completion ledger: when work is pending on a
device (submitted, not completed) and nothing has completed for `health_stall_s`, the daemon is
unhealthy. `gpud status` and systemd's `STATUS=` say which device and for how long, and the
watchdog is no longer fed, so systemd restarts a hung engine (`WatchdogSec=` in the unit).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import anyio

from gpud.service.notify import Notifier, watchdog_interval

log = logging.getLogger(__name__)

STATUS_EVERY_S = 2.0  # how often systemd's STATUS= line is refreshed


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


async def watch(assess_now: Callable[[float], Health], notifier: Notifier, status_line: Callable[[], str]) -> None:
    """Health, STATUS= and the watchdog, from a task of the loop itself: a loop that stops
    running stops feeding the watchdog too."""
    watchdog = watchdog_interval()  # half of WatchdogSec=
    tick = min(watchdog, 1.0) if watchdog else 1.0
    last_status = last_ping = time.monotonic()
    last = Health(True, (), ())
    while True:
        await anyio.sleep(tick)
        now = time.monotonic()
        health = assess_now(now)
        changed = health.healthy != last.healthy
        if changed and not health.healthy:
            log.warning("unhealthy: %s", "; ".join(health.problems))
        elif changed:
            log.info("healthy again: work is completing")
        last = health
        if watchdog is not None and health.healthy and now - last_ping >= watchdog * 0.95:
            notifier.send("WATCHDOG=1")
            last_ping = now
        if changed or now - last_status >= STATUS_EVERY_S:
            notifier.send(f"STATUS={status_line()}")
            last_status = now

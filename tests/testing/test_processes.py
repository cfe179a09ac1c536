"""Gathering worker processes' reports (gpud.testing.processes): results in order, failures named, and
neither a process that exits without reporting nor a run that stalls waits forever. The processes are
stand-ins run on threads (what `gather` uses of a process: start, exitcode, join, is_alive, kill)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpud.testing import processes

Events = queue.Queue[tuple[Any, ...]]


class FakeProcess:
    def __init__(self, target: Callable[[int, Events, threading.Event], None], index: int, events: Events) -> None:
        self._killed = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(target, index, events), daemon=True)
        self.exitcode: int | None = None

    def _run(self, target: Callable[[int, Events, threading.Event], None], index: int, events: Events) -> None:
        target(index, events, self._killed)
        self.exitcode = -9 if self._killed.is_set() else 0

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def kill(self) -> None:
        self._killed.set()


def _reports(index: int, events: Events, _killed: threading.Event) -> None:
    events.put(("step", index))
    events.put(("done", index, index * 10))


def _fails(index: int, events: Events, _killed: threading.Event) -> None:
    events.put(("failed", index, "it broke"))


def _exits_silently(index: int, events: Events, _killed: threading.Event) -> None:
    return


def _hangs(index: int, events: Events, killed: threading.Event) -> None:
    killed.wait(60)


@pytest.fixture(autouse=True)
def _quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "POLL_S", 0.1)
    monkeypatch.setattr(processes, "JOIN_S", 0.5)


def _run(targets: list[Any], stall_s: float | None = None) -> tuple[list[Any], list[Any]]:
    events: Events = queue.Queue()
    procs = [FakeProcess(target, i, events) for i, target in enumerate(targets)]
    seen: list[Any] = []
    return processes.gather(procs, events, "exited without reporting", "{} failed: {}", seen.append, stall_s), seen


def test_results_come_in_index_order_and_other_events_go_to_the_callback() -> None:
    results, seen = _run([_reports, _reports, _reports])
    assert results == [0, 10, 20]
    assert sorted(seen) == [("step", 0), ("step", 1), ("step", 2)]


def test_a_failure_is_raised_with_its_process_and_reason() -> None:
    with pytest.raises(RuntimeError, match="1 failed: it broke"):
        _run([_reports, _fails])


def test_a_process_that_exits_cleanly_without_reporting_ends_the_run() -> None:
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited without reporting"):
        _run([_reports, _exits_silently])
    assert time.monotonic() - t0 < 30  # it used to wait forever


def test_a_stalled_run_ends_naming_the_processes_that_never_reported() -> None:
    with pytest.raises(RuntimeError, match=r"no word from processes \[1\] for 0.5 s: the run stalled"):
        _run([_reports, _hangs], stall_s=0.5)

"""Gathering worker processes' reports (gpud.testing.processes): results in order, failures named, and
neither a process that exits without reporting nor a run that stalls waits forever."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any

import pytest

from gpud.testing import processes

CTX = mp.get_context("fork")  # the targets below need no import in the child


def _reports(index: int, events: Any) -> None:
    events.put(("step", index))
    events.put(("done", index, index * 10))


def _fails(index: int, events: Any) -> None:
    events.put(("failed", index, "it broke"))


def _exits_silently(index: int, events: Any) -> None:
    os._exit(0)


def _hangs(index: int, events: Any) -> None:
    time.sleep(60)


@pytest.fixture(autouse=True)
def _quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "POLL_S", 0.2)
    monkeypatch.setattr(processes, "JOIN_S", 1.0)


def _run(targets: list[Any], stall_s: float | None = None) -> tuple[list[Any], list[Any]]:
    events = CTX.Queue()
    procs = [CTX.Process(target=target, args=(i, events)) for i, target in enumerate(targets)]
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
    with pytest.raises(RuntimeError, match=r"no word from processes \[1\] for 1 s: the run stalled"):
        _run([_reports, _hangs], stall_s=1.0)

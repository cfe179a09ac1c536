"""GPUD_TRACEMALLOC: off by default; when set, SIGUSR2 appends a report of the Python heap."""

from __future__ import annotations

import atexit
import os
import signal
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpud.service import heapdump


@pytest.fixture
def restore() -> Iterator[None]:
    handler = signal.getsignal(signal.SIGUSR2)
    yield
    signal.signal(signal.SIGUSR2, handler)
    tracemalloc.stop()


def test_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(heapdump.ENV, raising=False)
    assert heapdump.install_from_env() is None
    assert not tracemalloc.is_tracing()


def test_sigusr2_appends_reports_with_growth(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, restore: None) -> None:
    path = tmp_path / "heap.txt"
    monkeypatch.setenv(heapdump.ENV, str(path))
    heap = heapdump.install_from_env()
    assert heap is not None
    atexit.unregister(heap.dump)
    assert tracemalloc.is_tracing()
    os.kill(os.getpid(), signal.SIGUSR2)
    assert heap.thread is not None
    heap.thread.join(30)
    kept = [bytearray(1000) for _ in range(100)]  # noqa: F841 - growth between the two reports
    os.kill(os.getpid(), signal.SIGUSR2)
    heap.thread.join(30)
    text = path.read_text()
    assert text.count("=== report") == 2
    assert "(SIGUSR2)" in text and "rss " in text and "traced " in text and "malloc: " in text
    assert text.count("--- growth since the previous report") == 1
    assert "test_heapdump.py" in text.split("--- growth")[1]

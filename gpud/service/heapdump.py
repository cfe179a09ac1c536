"""Debug only: `GPUD_TRACEMALLOC=PATH` traces the daemon's Python allocations and appends a report to PATH
on SIGUSR2 and at exit (off by default: tracing costs time and memory).

Each report gives the traced total beside the process's RSS and glibc's malloc totals (a growing RSS
with a flat traced total points at native memory), the largest allocation sites, counts of live gpud
and wgpu objects, and the growth since the previous report. Tracing itself costs RSS (its traces and
the snapshot kept for the next comparison live outside the traced heap): measure RSS without it.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import os
import signal
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from types import FrameType

ENV = "GPUD_TRACEMALLOC"
FRAMES = 8
TOP = 25


def _rss_bytes() -> int:
    try:
        fields = Path("/proc/self/statm").read_text().split()
        return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return -1


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def _malloc_summary() -> str:
    """glibc's view of the C heap, every arena: in use vs. held free (fragmentation) vs. mmapped."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return "malloc: no mallinfo2"
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return f"malloc: in use {info.uordblks} B, free in arenas {info.fordblks} B, mmapped {info.hblkhd} B"


def _project_objects() -> Counter[str]:
    counts: Counter[str] = Counter()
    for obj in gc.get_objects():
        cls = type(obj)
        module = cls.__dict__.get("__module__")  # a descriptor on some builtin classes
        if isinstance(module, str) and module.startswith(("gpud", "wgpu")):
            counts[f"{module}.{cls.__qualname__}"] += 1
    return counts


class HeapDump:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.previous: tracemalloc.Snapshot | None = None
        self.count = 0
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def dump(self, reason: str) -> None:
        with self.lock:
            self._dump(reason)

    def _dump(self, reason: str) -> None:
        ours = (tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib.*"))
        snapshot = tracemalloc.take_snapshot().filter_traces(ours)
        current, peak = tracemalloc.get_traced_memory()
        self.count += 1
        lines = [
            f"=== report {self.count} ({reason}) at {time.time():.0f}: traced {current} B (peak {peak} B), "
            f"rss {_rss_bytes()} B, pid {os.getpid()}",
            _malloc_summary(),
            "--- top by line",
        ]
        lines += [str(stat) for stat in snapshot.statistics("lineno")[:TOP]]
        lines.append("--- live objects of the project's classes")
        lines += [f"{count:>8} {name}" for name, count in _project_objects().most_common(TOP)]
        if self.previous is not None:
            lines.append("--- growth since the previous report, by traceback")
            for stat in snapshot.compare_to(self.previous, "traceback")[:TOP]:
                lines.append(str(stat))
                lines += [f"    {line}" for line in stat.traceback.format()]
        self.previous = snapshot
        with self.path.open("a") as out:
            out.write("\n".join(lines) + "\n")

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Comparing tracebacks takes seconds: off the event loop's thread, or clients think the daemon gone.
        self.thread = threading.Thread(target=self.dump, args=(signal.Signals(signum).name,), daemon=True)
        self.thread.start()


def install_from_env() -> HeapDump | None:
    """Start tracing if `GPUD_TRACEMALLOC` names a file; dump on SIGUSR2 and at exit."""
    target = os.environ.get(ENV)
    if not target:
        return None
    tracemalloc.start(FRAMES)
    heap = HeapDump(Path(target))
    signal.signal(signal.SIGUSR2, heap.on_signal)
    atexit.register(heap.dump, "exit")
    return heap

"""Runs of launches issued on the stream: one by one, or captured once into a CUDA graph and replayed.

A run is the launches between two other commands of a submission. A run seen again with exactly
the same launches (kernels, grids, argument bytes) is captured into a graph on its second time and
replayed from then on: steps of a decoder or a solver repeat, and a replay costs about a
microsecond a kernel. Shorter runs than `min_launches` are launched one by one; a cache size of 0
never captures.

`issue` runs on whichever thread submits (one submission at a time); unloading a module (loop
thread) drops every graph, since a graph must not outlive a kernel it launches. `lock` guards the
caches for both. A graph exec that leaves the cache may still be used by the submission being
issued: it goes to a dead list, which the device takes right after recording that submission's
event (`take_dead`) and destroys once the event has completed.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from gpud.backends.cuda.driver import check, cu, error
from gpud.runtime.cache import LruCache

log = logging.getLogger(__name__)

Run = Sequence[tuple[Any, ...]]  # packed launches, see `launch.pack`


class GraphRunner:
    def __init__(self, stream: Any, max_args: int, cache_size: int, min_launches: int) -> None:
        self.lock = threading.Lock()
        self._stream = stream
        self._cache_size = cache_size
        self._min_launches = min_launches
        self._graphs: LruCache[tuple[Any, ...], Any] = LruCache(max(1, cache_size), self._evicted)
        self._seen: LruCache[tuple[Any, ...], int] = LruCache(max(1, 2 * cache_size))
        self._dead: list[Any] = []
        self._generation = 0  # bumped when the caches are dropped: a capture under way is not cached
        self.captured = 0
        self.replays = 0
        # Launch parameters: one 8-byte slot per argument and a void* array pointing at the slots.
        # cuLaunchKernel copies the values, so one buffer serves every launch.
        slots = max(max_args, 1)
        self._params = (ctypes.c_uint64 * slots)()
        self._params_address = ctypes.addressof(self._params)
        self._pointers = (ctypes.c_void_p * slots)(*(self._params_address + 8 * i for i in range(slots)))
        self._pointers_address = ctypes.addressof(self._pointers)

    def issue(self, run: Run) -> None:
        """Put the run on the stream (on the submitting thread, with the context current)."""
        if self._cache_size == 0 or len(run) < self._min_launches:
            self._launch_all(run)
            return
        key = tuple(run)
        capture = False
        with self.lock:
            graph = self._graphs.get(key)
            if graph is None:
                seen = (self._seen.get(key) or 0) + 1
                capture = seen >= 2
                if capture:
                    self._seen.pop(key)
                else:
                    self._seen.put(key, seen)
            generation = self._generation
        if graph is not None:
            self.replays += 1
            check(cu.cuGraphLaunch(graph, self._stream), "replaying a graph")
            return
        if not capture:
            self._launch_all(run)
            return
        graph = self._capture(run)
        self.captured += 1
        try:
            check(cu.cuGraphLaunch(graph, self._stream), "launching a captured graph")
        except BaseException:
            with self.lock:
                self._dead.append(graph)
            raise
        with self.lock:
            if self._generation == generation:
                self._graphs.put(key, graph)  # may evict another into the dead list
            else:
                self._dead.append(graph)  # a module was unloaded meanwhile

    def _launch_all(self, run: Run) -> None:
        params, pointers, stream = self._params_address, self._pointers_address, self._stream
        for _module, function, gx, gy, gz, bx, by, bz, values in run:
            ctypes.memmove(params, values, len(values))
            (status,) = cu.cuLaunchKernel(function, gx, gy, gz, bx, by, bz, 0, stream, pointers, 0)
            if status:
                raise error(status, "launching a kernel")

    def _capture(self, run: Run) -> Any:
        """An instantiated graph of the run; the launches are recorded, not run."""
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(cu.cuStreamBeginCapture(self._stream, mode), "capturing a graph")
        try:
            self._launch_all(run)
        except BaseException:
            ended = cu.cuStreamEndCapture(self._stream)  # ends the invalidated capture
            if not ended[0] and ended[1] is not None:
                cu.cuGraphDestroy(ended[1])
            raise
        graph = check(cu.cuStreamEndCapture(self._stream), "capturing a graph")
        try:
            return check(cu.cuGraphInstantiate(graph, 0), "instantiating a graph")
        finally:
            cu.cuGraphDestroy(graph)

    def _evicted(self, _key: tuple[Any, ...], graph: Any) -> None:
        self._dead.append(graph)  # under the lock: every put and clear holds it

    def forget_all(self) -> None:
        """Drop every graph and every run seen (a module is being unloaded)."""
        with self.lock:
            self._graphs.clear()
            self._seen.clear()
            self._generation += 1

    def take_dead(self) -> list[Any]:
        """Graph execs that left the cache: destroy them once the submission just recorded completed."""
        with self.lock:
            dead, self._dead = self._dead, []
        return dead

    @staticmethod
    def destroy(graphs: Iterable[Any]) -> None:
        for graph in graphs:
            (status,) = cu.cuGraphExecDestroy(graph)
            if status:
                log.debug("cuGraphExecDestroy: %s", error(status))

    def stats(self) -> dict[str, Any]:
        with self.lock:
            cache = self._graphs.stats()
        return {"graph_cache": cache, "graphs_captured": self.captured, "graph_replays": self.replays}

"""The device's one non-blocking stream: a submission's commands issued in order, and its completion.

`submit` (any thread, one submission at a time) issues the commands and records an event
(blocking-sync, recycled). `watch` (loop thread) polls that event for `completion_spin_us` when a
client awaits the result, else hands it to the one completion thread, which waits on the events in
order and reports each on the loop thread. A command that fails part-way fails the submission
(SubmissionFailed) only once what was issued before it has finished. On completion the event is
recycled, the modules of programs that died before the submission are unloaded, and the graph
execs that left the graph cache while it was issued are destroyed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from gpud.backends.base import Done, SubmissionFailed
from gpud.backends.cuda.driver import E, check, cu, error
from gpud.backends.cuda.graph import GraphRunner
from gpud_protocol.errors import DeviceLost

log = logging.getLogger(__name__)


class Commands(NamedTuple):
    """`take_commands`' result: ("run", launches) | ("copy", dst, src, n) | ("htod", dst, pinned, n)
    | ("dtoh", pinned, src, n) | ("peer", dst, dst_ctx, src, src_ctx, n) | ("mark", event) | ("wait", event)
    | ("zero", ptr, n), in op order; and modules to unload after them."""

    items: list[tuple[Any, ...]]
    modules: list[int]


class Submitted(NamedTuple):
    event: Any
    modules: list[int]
    graphs: list[Any]  # graph execs to destroy once the event has completed
    failure: BaseException | None  # a command failed part-way; what was issued before it still runs


class Stream:
    def __init__(
        self,
        index: int,
        context: Any,
        loop: asyncio.AbstractEventLoop,
        settings: Any,
        max_args: int,
        unload: Callable[[int], None],
        dead_modules: list[int],
    ) -> None:
        self._index = index
        self._context = context
        self._loop = loop
        self._unload = unload
        self._dead_modules = dead_modules  # the device's: modules of a refused submission go back there
        self.handle = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "creating a stream")
        self.graphs = GraphRunner(
            self.handle, max_args, settings.graph_cache_size, settings.graph_min_launches, settings.graph_pdl
        )
        self._spin_s = settings.completion_spin_us / 1e6
        self._poll_s = getattr(settings, "completion_poll_us", 0.0) / 1e6
        flags = cu.CUevent_flags
        self._event_flags = flags.CU_EVENT_DISABLE_TIMING | flags.CU_EVENT_BLOCKING_SYNC
        self._events: list[Any] = []  # idle events: appended on the loop thread, taken by submit
        self._closed = False
        self._completions: queue.SimpleQueue[tuple[Submitted, Done] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._wait_events, name=f"gpud-cuda-events-{index}", daemon=True)
        self._thread.start()

    def _current(self) -> None:
        check(cu.cuCtxSetCurrent(self._context), "making the CUDA context current")

    def submit(self, commands: Commands) -> Submitted:
        self._current()
        stream, failure = self.handle, None
        try:
            for command in commands.items:
                op = command[0]
                if op == "run":
                    self.graphs.issue(command[1])
                elif op == "graph":
                    self.graphs.replay(command[1], command[2])
                elif op == "copy":
                    check(cu.cuMemcpyDtoDAsync(command[1], command[2], command[3], stream), "copy")
                elif op == "htod":
                    check(cu.cuMemcpyHtoDAsync(command[1], command[2], command[3], stream), "upload")
                elif op == "dtoh":
                    check(cu.cuMemcpyDtoHAsync(command[1], command[2], command[3], stream), "download")
                elif op == "peer":
                    _, dst, dst_context, src, src_context, nbytes = command
                    check(cu.cuMemcpyPeerAsync(dst, dst_context, src, src_context, nbytes, stream), "peer copy")
                elif op == "mark":
                    check(cu.cuEventRecord(command[1], stream), "recording a marker")
                elif op == "wait":
                    check(cu.cuStreamWaitEvent(stream, command[1], 0), "waiting on a peer's marker")
                else:
                    check(cu.cuMemsetD8Async(command[1], 0, command[2], stream), "zero fill")
        except DeviceLost:
            raise
        except Exception as exc:  # the submission fails once what was issued has finished
            failure = exc
        try:
            event = self._events.pop()
        except IndexError:
            event = None
        try:
            if event is None:
                event = check(cu.cuEventCreate(self._event_flags), "creating an event")
            check(cu.cuEventRecord(event, stream), "recording an event")
        except BaseException:
            if event is not None:
                self._events.append(event)
            self._dead_modules.extend(commands.modules)  # unloaded after a later submission
            raise
        return Submitted(event, commands.modules, self.graphs.take_dead(), failure)

    def watch(self, submitted: Submitted, done: Done, awaited: bool) -> None:
        if awaited:
            if self._finished_within_spin(submitted.event):
                # Short work a client waits on: report it now, saving two thread hand-offs. A stream
                # completes in order, so earlier submissions are done too.
                self._finish(submitted, done, None)
                return
            if self._poll_s > 0:
                # Longer work a client waits on: poll between the loop's other callbacks for a while
                # (the loop keeps serving everyone) before handing it to the completion thread.
                deadline = time.perf_counter() + self._poll_s
                self._loop.call_soon(self._poll, submitted, done, deadline)
                return
        self._completions.put((submitted, done))

    def _poll(self, submitted: Submitted, done: Done, deadline: float) -> None:
        (status,) = cu.cuEventQuery(submitted.event)
        if status == E.CUDA_SUCCESS:
            self._finish(submitted, done, None)
        elif status != E.CUDA_ERROR_NOT_READY or time.perf_counter() > deadline:
            self._completions.put((submitted, done))  # errors are reported by the completion thread
        else:
            self._loop.call_soon(self._poll, submitted, done, deadline)

    def _finished_within_spin(self, event: Any) -> bool:
        with contextlib.suppress(Exception):
            self._current()
        deadline = time.perf_counter() + self._spin_s
        while True:
            (status,) = cu.cuEventQuery(event)
            if status == E.CUDA_SUCCESS:
                return True
            if status != E.CUDA_ERROR_NOT_READY or time.perf_counter() > deadline:
                return False  # errors are reported by the completion thread

    def _wait_events(self) -> None:
        """The completion thread: waits on each submission's event in order, reports on the loop thread."""
        cu.cuCtxSetCurrent(self._context)
        while (item := self._completions.get()) is not None:
            (status,) = cu.cuEventSynchronize(item[0].event)
            failure = error(status, "the GPU stream failed") if status else None
            try:
                self._loop.call_soon_threadsafe(self._finish, item[0], item[1], failure)
            except RuntimeError:  # the loop is closed: nobody waits any more
                return

    def _finish(self, submitted: Submitted, done: Done, failure: BaseException | None) -> None:
        if failure is not None:  # any error of the stream is sticky: the device is lost
            done(failure if isinstance(failure, DeviceLost) else DeviceLost(str(failure)))
            return
        if not self._closed:
            try:
                self._current()
                self._events.append(submitted.event)
                for module_id in submitted.modules:
                    self._unload(module_id)
                GraphRunner.destroy(submitted.graphs)
            except Exception:  # never raised from a completion
                log.exception("device %d: releasing what a submission used", self._index)
        if submitted.failure is None:
            done(None)
        else:
            done(SubmissionFailed(f"device {self._index}: a command failed: {submitted.failure}"))

    def close(self) -> None:
        """Stop the completion thread; destroy the graphs, the events and the stream."""
        if self._closed:
            return
        self._closed = True
        self._completions.put(None)
        self._thread.join(timeout=10)
        with contextlib.suppress(Exception):
            self._current()
        self.graphs.forget_all()
        GraphRunner.destroy(self.graphs.take_dead())
        for event in self._events:
            cu.cuEventDestroy(event)
        self._events.clear()
        cu.cuStreamDestroy(self.handle)

"""Worker threads that run the calls that may block: submits, and compiles.

On lavapipe `queue.submit` blocks while an earlier submission runs, and a CUDA launch blocks once
the device's launch queue is full; NVRTC and pipeline compiles take tens of milliseconds (a family of
the op library's Hopper matmuls, seconds). None of that may run on the event-loop thread, which must
keep answering every other session. A worker of one thread runs its jobs in the order they were given
(a submit worker per device keeps submissions in order); one of several threads (compiles that may run
at once) starts them in order. Each result comes back to the loop thread through `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

Then = Callable[[Any, BaseException | None], None]
Job = tuple[Callable[[], Any], Then]


class Worker:
    def __init__(self, name: str, loop: asyncio.AbstractEventLoop, threads: int = 1) -> None:
        self._loop = loop
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.queued = 0  # jobs given and not yet reported back (loop thread only)
        self._threads = [
            threading.Thread(target=self._run, name=name if threads == 1 else f"{name}-{i}", daemon=True)
            for i in range(max(1, threads))
        ]
        for thread in self._threads:
            thread.start()

    @property
    def idle(self) -> bool:
        return self.queued == 0

    def run(self, job: Callable[[], Any], then: Callable[[Any, BaseException | None], None]) -> None:
        """Run `job()` on the worker; then `then(result, error)` on the loop thread."""
        self.queued += 1
        self._jobs.put((job, then))

    def future(self, job: Callable[[], Any]) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = self._loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if not future.done():
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)

        self.run(job, settle)
        return future

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            if not self._do(*item):
                return
            # Nothing of the job stays alive while this thread waits for the next (which, with several
            # threads, may be long): a compiled kernel nobody holds any more must be freed, its module unloaded.
            item = None

    def _do(self, job: Callable[[], Any], then: Then) -> bool:
        """Run one job and hand its outcome to the loop; False once the loop is closed."""
        try:
            result, error = job(), None
        except BaseException as exc:  # reported to the loop, never lost in this thread
            result, error = None, exc
        try:
            self._loop.call_soon_threadsafe(self._report, then, result, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            return False
        return True

    def _report(self, then: Then, result: Any, error: BaseException | None) -> None:
        self.queued -= 1
        then(result, error)

    def close(self, timeout: float = 10.0) -> None:
        for _thread in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join(timeout)

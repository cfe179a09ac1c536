"""The worker threads that run what may block: results back on the loop thread, jobs of a worker of
several threads side by side."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

from gpud.runtime.submitter import Worker


async def test_a_worker_of_several_threads_runs_jobs_side_by_side() -> None:
    worker = Worker("test-compile", asyncio.get_running_loop(), threads=2)
    both = threading.Barrier(2, timeout=5)  # each job waits for the other: one thread could not run them

    def job(value: int) -> int:
        both.wait()
        return value

    try:
        assert list(await asyncio.gather(worker.future(lambda: job(1)), worker.future(lambda: job(2)))) == [1, 2]
        assert worker.idle
    finally:
        worker.close(5)


async def test_a_worker_of_one_thread_keeps_the_order() -> None:
    worker = Worker("test-submit", asyncio.get_running_loop())
    ran: list[int] = []
    try:
        await asyncio.gather(*(worker.future(lambda i=i: ran.append(i)) for i in range(20)))  # type: ignore[misc]
        assert ran == list(range(20))
    finally:
        worker.close(5)


async def test_a_thread_keeps_nothing_of_a_job_while_it_waits() -> None:
    """Regression: an idle compile thread held its last kernel (and so its module) until its next job."""
    worker = Worker("test-compile", asyncio.get_running_loop(), threads=2)

    class Made:
        pass

    try:
        made = await worker.future(Made)
        seen = weakref.ref(made)
        del made
        await asyncio.sleep(0.01)  # the report has run on the loop
        gc.collect()
        assert seen() is None, "the worker thread still holds the job's result"
    finally:
        worker.close(5)

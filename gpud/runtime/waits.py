"""What an op that cannot go on yet hands back (`Wait`), and the small helpers of futures and waits
that the runtime's parts share."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple


class Wait(NamedTuple):
    """An op that cannot go on yet: await `ready`, then call `resume()` (which may wait again)."""

    ready: Awaitable[Any]
    resume: Callable[[], Wait | None]


def settle(future: asyncio.Future[Any], value: Any, error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)


def outcome(future: asyncio.Future[None]) -> None:
    """Raise the future's error, if it has one."""
    future.result()


def then(wait: Wait | None, next_step: Callable[[], Wait | None]) -> Wait | None:
    """Run `next_step` after `wait` (and whatever it leads to) is done."""
    if wait is None:
        return next_step()
    return Wait(wait.ready, lambda: then(wait.resume(), next_step))


def guarded(
    step: Callable[[], Wait | None],
    release: Callable[[], None],
    gone: Callable[[], bool],
    done: Callable[[], None] | None = None,
) -> Wait | None:
    """`step()`, and whatever it waits for, calling `release()` if it raises, or if `gone()` (its owner
    ended) once a wait is over, since nothing resumes it then; `done()` once it finished."""
    try:
        wait = step()
    except BaseException:
        release()
        raise
    if wait is None:
        if done is not None:
            done()
        return None

    async def ready() -> None:
        try:
            await wait.ready
        finally:
            if gone():
                release()

    return Wait(ready(), lambda: guarded(wait.resume, release, gone, done))

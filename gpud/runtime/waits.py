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

"""Scopes: `async with gpu.scope() as scope:` frees, at exit, every tensor and view this client made
inside, in this task, except those passed to `scope.keep(t)`.

Scopes nest: a tensor belongs to the innermost scope open in its task when it was made, and one
that scope keeps moves to the scope around it (which frees it at its own exit unless it keeps it
too). Keeping a view keeps its tensor. The exit frees whether or not an exception ends the block,
and queues the frees like `t.free()` (no round trip). Tensors made by other tasks (even ones
started inside the block) and by other clients are not the scope's.

Freeing an op-library call's output does not give its memory back to the daemon: the client pools it
for the next output of its device, dtype and shape (gpud_client.pool), so a loop of scopes allocates
once. Pooled memory is still the session's as the daemon counts it (`gpu.stats()`, the quota):
at most a quarter of the session's memory quota (at least 1 GiB) and 1,024 tensors
(`gpu.set_pool_limits`); `gpu.trim()` frees all of it, and the
client does that by itself before it raises an OutOfMemory, so that a retry finds that memory free.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from types import TracebackType
from typing import Any, Protocol, TypeVar

Task = Any  # asyncio.Task, or None outside a task


class Owned(Protocol):
    """What a scope does with a tensor (gpud_client.tensor.Tensor): free it, keep its base."""

    @property
    def base(self) -> Owned: ...

    def free(self) -> None: ...


class Scoped(Protocol):
    """What a scope needs of its client (gpud_client.client_base.ClientBase): the open scopes of each task."""

    _scopes: dict[Any, list[Scope]]


T = TypeVar("T", bound=Owned)


def _current_task_311() -> Task:
    """asyncio.current_task() without its Python frame (3.11 has no C version; every op output asks), and
    for the task that last opened a scope (`_entered`) without asking for the running loop either: 3.11's
    asks getpid(), a system call, each time. That task is the current one where its loop's current task
    (asyncio's own table) is it and this is the thread it opened the scope in (a task runs in its loop's
    thread; a forked child forgets it)."""
    task, loop, thread = _entered
    if _TASKS.get(loop) is task and _get_ident() == thread and task is not None:
        return task
    loop = _running_loop()
    return None if loop is None else _TASKS.get(loop)


def _current_task() -> Task:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop
        return None


_running_loop = asyncio.events._get_running_loop
_current_tasks: dict[Any, Any] | None = getattr(asyncio.tasks, "_current_tasks", None)
_TASKS: dict[Any, Any] = {} if _current_tasks is None else _current_tasks
current_task = _current_task_311 if sys.version_info < (3, 12) and _current_tasks is not None else _current_task

_get_ident = threading.get_ident
_NOBODY: tuple[Task, Any, int] = (None, None, 0)
_entered = _NOBODY  # (the task that last opened a scope, its loop, its thread) while its scopes are open


def _remember(task: Task) -> None:
    global _entered
    _entered = _NOBODY if task is None else (task, task.get_loop(), _get_ident())


def _forget(task: Task) -> None:
    global _entered
    if _entered[0] is task:
        _entered = _NOBODY  # (no finished task kept alive)


os.register_at_fork(after_in_child=lambda: _remember(None))


class Scope:
    def __init__(self, client: Scoped) -> None:
        self._client = client
        self._task: Task = None
        self._made: dict[int, Owned] = {}  # id -> tensor, in the order made
        self._open = False

    async def __aenter__(self) -> Scope:
        if self._open:
            raise RuntimeError("this scope is already open: make a new one with gpu.scope()")
        self._open = True
        self._task = current_task()
        self._client._scopes.setdefault(self._task, []).append(self)
        _remember(self._task)
        return self

    async def __aexit__(
        self, _type: type[BaseException] | None, _exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        scopes = self._client._scopes
        stack = scopes.get(self._task, [])
        if self in stack:
            stack.remove(self)
        if not stack:
            scopes.pop(self._task, None)  # none left: making a tensor costs one check again
            _forget(self._task)
        made, self._made = self._made, {}
        for tensor in made.values():
            tensor.free()

    def keep(self, tensor: T) -> T:
        """Leave `tensor` (and, for a view, its tensor) alive at this scope's exit; returns it."""
        parent = self._parent()
        for t in (tensor, tensor.base):
            if self._made.pop(id(t), None) is not None and parent is not None:
                parent.add(t)
        return tensor

    def add(self, tensor: Owned) -> None:
        self._made[id(tensor)] = tensor

    def _parent(self) -> Scope | None:
        stack = self._client._scopes.get(self._task, [])
        index = stack.index(self) if self in stack else len(stack)
        return stack[index - 1] if index > 0 else None


def disown(client: Scoped, tensor: Owned) -> None:
    """`tensor` is the client's own (an op's scratch kept across calls), not the scope's it was made in."""
    stack = client._scopes.get(current_task())
    if stack:
        stack[-1]._made.pop(id(tensor), None)


def made(client: Scoped, tensor: Owned) -> None:
    """`tensor` was just made: it belongs to the innermost scope open in this task, if any."""
    stack = client._scopes.get(current_task())
    if stack:
        stack[-1]._made[id(tensor)] = tensor  # `add`, inlined: every op's output comes here

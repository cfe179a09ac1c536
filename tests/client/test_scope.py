"""`gpu.scope()`: tensors and views made inside are freed at exit unless kept, on every backend.

Memory is measured by the daemon (`gpu.stats()`: the session's private bytes and handles), after
`gpu.trim()` (the op outputs a scope frees are pooled: tests/client/test_pool.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import Client, InvalidArgument, Tensor


async def usage(gpu: Client) -> tuple[int, int]:
    gpu.trim()  # freed op outputs are pooled (still the session's memory): give them back first
    session = (await gpu.stats())["session"]
    return session["private_bytes"], session["handles"]


async def test_everything_made_inside_is_freed_but_what_is_kept(gpu: Client, address: str) -> None:
    outside = gpu.tensor(np.arange(8, dtype=np.float32))
    async with gpud_client.connect(address) as other:
        published = other.tensor(np.ones(4, np.float32))
        other.publish(published, f"test/scope-{id(gpu)}", "ro")
        await other.sync()
        baseline = await usage(gpu)
        async with gpu.scope() as scope:
            x = gpu.tensor(np.arange(8, dtype=np.float32))
            y = gpu.ops.add(x, outside)  # an op's output is made inside too
            z = gpu.ops.scale(y.reshape(2, 4), 2.0)  # and a view, of a tensor made inside
            seen = outside.reshape(4, 2)  # a view of a tensor made outside
            opened = await gpu.open(f"test/scope-{id(gpu)}")  # a handle on a resident
            kept = scope.keep(gpu.ops.scale(x, 3.0))
            assert kept.freed is False
            assert await usage(gpu) != baseline
        assert all(t.freed for t in (x, y, z, seen, opened))
        assert not outside.freed and not kept.freed
        np.testing.assert_array_equal(await kept.numpy(), np.arange(8) * 3)
        np.testing.assert_array_equal(await outside.numpy(), np.arange(8))
        with pytest.raises(InvalidArgument):
            await z.numpy()
        kept.free()
        assert await usage(gpu) == baseline
        other.unpublish(f"test/scope-{id(gpu)}")
        published.free()
    outside.free()


async def test_nested_scopes_hand_kept_tensors_outwards(gpu: Client) -> None:
    baseline = await usage(gpu)
    async with gpu.scope() as outer:
        a = gpu.empty((16,))
        async with gpu.scope() as inner:
            b = gpu.empty((16,))
            c = inner.keep(gpu.empty((16,)))  # now the outer scope's
            view = inner.keep(gpu.empty((2, 8)).reshape(16))  # keeping a view keeps its tensor
        assert b.freed and not c.freed and not view.freed and not view.base.freed
        np.testing.assert_array_equal(await view.numpy(), np.zeros(16))
        d = outer.keep(c)
    assert a.freed and view.freed and view.base.freed
    assert not d.freed
    d.free()
    assert await usage(gpu) == baseline


async def test_an_exception_inside_still_frees(gpu: Client) -> None:
    baseline = await usage(gpu)
    made: list[Tensor] = []
    with pytest.raises(RuntimeError, match="boom"):
        async with gpu.scope():
            made.append(gpu.tensor(np.ones(1000, np.float32)))
            raise RuntimeError("boom")
    assert made[0].freed
    assert await usage(gpu) == baseline
    assert not gpu._scopes  # nothing left open: making a tensor costs one check again


async def test_tensors_of_other_tasks_are_not_the_scopes(gpu: Client) -> None:
    async def elsewhere() -> Tensor:
        return gpu.empty((4,))

    async with gpu.scope():
        theirs = await asyncio.create_task(elsewhere())  # a task of its own, started inside
        mine = gpu.empty((4,))
    assert mine.freed and not theirs.freed
    theirs.free()


async def test_the_task_a_scope_belongs_to_is_asyncios_current_task() -> None:
    """scope.current_task reads asyncio's table directly on 3.11 (no C current_task there): the same answer."""
    from gpud_client import scope as scope_module

    assert scope_module.current_task() is asyncio.current_task()
    got = await asyncio.gather(*(asyncio.create_task(_own_task(scope_module.current_task)) for _ in range(3)))
    assert len({id(t) for t in got}) == 3


async def _own_task(current: Any) -> Any:
    task = current()
    assert task is asyncio.current_task() and task is not None
    return task


def test_outside_a_running_loop_there_is_no_task() -> None:
    from gpud_client import scope as scope_module

    assert scope_module.current_task() is None


async def test_the_task_that_opened_a_scope_is_answered_without_asking_the_loop(gpu: Client) -> None:
    """On 3.11 the task that last opened a scope is the current one where asyncio's table says its loop runs
    it and this is its thread (no getpid per op output): every other task, and another thread, is told apart."""
    import threading

    from gpud_client import scope as scope_module

    async def other_task() -> tuple[Any, Any]:
        return scope_module.current_task(), asyncio.current_task()

    def other_thread() -> Any:
        return scope_module.current_task()  # no loop runs in this thread

    async with gpu.scope():
        me = asyncio.current_task()
        assert scope_module._entered[0] is me and scope_module.current_task() is me
        theirs, truly = await asyncio.create_task(other_task())
        assert theirs is truly and theirs is not me
        assert await asyncio.get_running_loop().run_in_executor(None, other_thread) is None
        assert scope_module._entered[2] == threading.get_ident()
        made = gpu.empty((4,))
        async with gpu.scope():  # nested: the same task
            inner = gpu.empty((4,))
        assert inner.freed and not made.freed
    assert made.freed
    assert scope_module._entered[0] is None  # its scopes closed: the task is not kept alive
    assert scope_module.current_task() is asyncio.current_task()


async def test_a_scope_of_another_task_takes_over_the_hint_and_both_stay_right(gpu: Client) -> None:
    """Two tasks with scopes open at once: each tensor is its own task's scope's, whichever task opened last."""
    started, go_on = asyncio.Event(), asyncio.Event()

    async def second() -> Tensor:
        async with gpu.scope():
            started.set()
            await go_on.wait()
            return gpu.empty((4,))

    async with gpu.scope():
        task = asyncio.create_task(second())
        await started.wait()  # the second task opened its scope last
        mine = gpu.empty((4,))
        go_on.set()
        theirs = await task
        assert not mine.freed and theirs.freed  # the second task's scope freed its own at exit
        late = gpu.ops.add(mine, mine)  # the hint was forgotten: the answer asked of the loop
    assert mine.freed and late.freed

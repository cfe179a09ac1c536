"""A recording's pieces (`gpud.runtime.graph`): the allocations a replay marks with its submission."""

from __future__ import annotations

import asyncio

from gpud.backends.base import Buffer, CopyStep, DispatchStep, GraphStep
from gpud.runtime.graph import allocations_of
from gpud_protocol import ArgKind, KernelOptions
from runtime.test_runtime import Owner, make


def test_allocations_are_the_views_bases_each_once_but_those_left() -> None:
    a, b = Buffer(1, 256, None, 0), Buffer(2, 256, None, 0)
    view = Buffer(3, 64, None, 0, offset=64, base=a)
    other = Buffer(4, 64, None, 0, offset=128, base=a)
    assert allocations_of([view, b, other, a]) == (a, b)
    assert allocations_of([view, b, other], {id(a)}) == (b,)


async def test_a_replay_marks_its_allocations_but_those_tracked_by_their_owner() -> None:
    rt, _lost = make()
    got = rt.program("fake:scale", "scale", KernelOptions())
    program = await got if isinstance(got, asyncio.Future) else got
    x, y, owned, out = rt.alloc(256), rt.alloc(256), rt.alloc(256), rt.alloc(256)
    view = rt.view(y, 64, 64)
    steps: list[GraphStep] = [
        DispatchStep(program, (1, 1, 1), (x, view, (ArgKind.F32, 2.0))),
        CopyStep(owned, 0, out, 0, 64),
    ]
    replayable = rt.instantiate(steps, tracked=[owned])
    rt.flush()
    before = owned.last_use
    rt.replay(replayable, [], Owner())
    index = rt.ledger.pending_index
    assert x.last_use == y.last_use == out.last_use == index  # a view marks its allocation
    assert owned.last_use == before < index  # its owner keeps its last use
    rt.flush()
    await rt.close()


async def test_work_after_a_views_use_waits_for_its_allocations_last_use() -> None:
    """A copy into a view from another device (`Transfers.copy_to`) waits on the view's `after_use`: the
    replay above left the view's own last use at 0, its allocation's is the replay's submission."""
    rt, _lost = make()
    got = rt.program("fake:scale", "scale", KernelOptions())
    program = await got if isinstance(got, asyncio.Future) else got
    x, y = rt.alloc(256), rt.alloc(256)
    replayable = rt.instantiate([DispatchStep(program, (1, 1, 1), (x, y, (ArgKind.F32, 2.0)))])
    rt.replay(replayable, [], Owner())
    fresh = rt.view(y, 64, 64)
    assert fresh.last_use == 0 < y.last_use
    seen: list[int] = []
    rt.after_use(fresh, lambda _error: seen.append(rt.ledger.completed))
    assert not seen  # not yet: the replay is pending
    rt.flush()
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.01)
    assert seen and seen[0] >= y.last_use
    await rt.close()

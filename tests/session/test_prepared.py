"""A session's prepared dispatches: kept in the entries of its dispatch memo, bounded (the least recently
used entry evicted one at a time), and dropped when a handle they use is freed without leaving their
keys behind in the index. A repeated dispatch is one lookup from the wire to the device."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
from runtime.test_runtime import make

import gpud_protocol as proto
from gpud.session.prepared import PreparedDispatches
from gpud.session.session import Session
from gpud_protocol import ArgKind, DispatchEntry, KernelOptions, Opcode
from session.test_graph_build import Daemon, Settings


def entry(cache: PreparedDispatches, n: int, handles: tuple[int, ...]) -> DispatchEntry:
    new = DispatchEntry((n,))
    cache.memo.put((n,), new)
    cache.add(new, f"p{n}", "rt", handles)
    return new


def test_a_full_cache_evicts_its_least_recent_entry_only() -> None:
    """Regression: the cache was cleared wholesale when full: every dispatch of a steady step missed."""
    cache = PreparedDispatches(capacity=3)
    entries = [entry(cache, n, (10 + n,)) for n in range(3)]
    assert cache.memo.get((0,)) is entries[0]  # now the most recent
    entry(cache, 3, (13,))
    assert len(cache.memo) == 3 and cache.memo.evictions == 1
    assert (1,) not in cache.memo and all((n,) in cache.memo for n in (0, 2, 3))
    assert entries[1].prepared is None and entries[0].prepared == ("p0", "rt", (10,))
    assert cache.handles_indexed() == 3  # handle 11 left the index with its entry


def test_forgetting_a_handle_drops_what_was_prepared_with_it_and_its_index() -> None:
    cache = PreparedDispatches(capacity=100)
    a, b, c = entry(cache, 0, (1, 2)), entry(cache, 1, (2, 3)), entry(cache, 2, (4,))
    cache.forget(2)
    assert a.prepared is None and b.prepared is None and c.prepared is not None
    assert len(cache.memo) == 3  # the decoded fields stay: they name no tensor's memory
    assert cache.handles_indexed() == 1  # handles 1 and 3 are not left pointing at dropped entries
    cache.forget(99)  # unknown: nothing
    assert c.prepared is not None


def test_a_long_lived_handle_with_churning_partners_does_not_grow_the_index() -> None:
    cache = PreparedDispatches(capacity=4)
    for n in range(1000):  # handle 1 stays, each step with a new partner that is then freed
        entry(cache, n, (1, 1000 + n))
        cache.forget(1000 + n)
    assert cache.handles_indexed() == 0
    for n in range(1000):  # never freed: bounded by the capacity
        entry(cache, 1000 + n, (1, 3000 + n))
    assert len(cache.memo) == 4 and cache.handles_indexed() == 5


def _message(ops: list[Any]) -> list[bytes]:
    return [proto.encode_batch(b"".join(msgpack.packb(op) for op in ops), len(ops), 0)]


async def test_a_repeated_dispatch_is_one_lookup_from_the_wire_to_the_device() -> None:
    """Regression: a repeated dispatch was looked up twice (the codec's memo, then the session's cache)."""
    rt, _ = make()
    session = Session("s1", "test", lambda _frames: None, Daemon(rt), Settings(), 0)
    memo = session.dispatch_memo
    setup: list[Any] = [
        proto.RegisterKernel(1, 1, "fake:scale", "scale", KernelOptions()),
        proto.Alloc(2, 2, "float32", (64,), 0),
        proto.Alloc(3, 3, "float32", (64,), 0),
    ]
    session.receive(proto.Batch(list(setup), (), [], 0, False))
    daemon: Any = session._daemon
    await asyncio.gather(*daemon.tasks)  # the kernel compiles on the compile worker, then the session resumes
    dispatch = [Opcode.DISPATCH, 4, 1, [1, 1, 1], [[0, 2], [0, 3], [int(ArgKind.F32), 2.0]], None]
    for round_ in range(3):
        batch = proto.decode_client_message(_message([dispatch]), proto.DEFAULT_LIMITS, memo)
        assert isinstance(batch, proto.Batch)
        (op,) = batch.ops
        assert isinstance(op, proto.Memoized)
        entry: DispatchEntry = op.entry
        assert (entry.prepared is not None) == (round_ > 0)  # found prepared by the decoder's lookup
        hits = memo.hits
        session.receive(batch)
        assert memo.hits == hits and entry.prepared is not None  # no second lookup
    assert rt.dispatch_count == 3 and not session.failures
    session.receive(proto.Batch([proto.Free(5, 3)], (), [], 0, False))
    assert entry.prepared is None  # a handle it used is gone: prepared again on its next use
    session.close()
    await rt.close()

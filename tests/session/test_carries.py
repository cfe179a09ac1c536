"""A graph family's carries (`gpud.session.carries`) on stand-ins for the runtime, the instance and the
session: made once per session and instance and charged, refused to chain before one exists or past
the quota, laid out a fed output every 256 bytes, given back and uncharged when the session leaves."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest

from gpud.session.carries import PLACE, Carries, carry_bytes
from gpud_protocol.errors import InvalidArgument, OutOfMemory


class Part(NamedTuple):
    offset: int
    nbytes: int


class Runtime:
    """What a carry asks of a device runtime: memory, and a call once work completed."""

    index = 0

    def __init__(self) -> None:
        self.alive: list[Any] = []
        self.later: list[Any] = []

    def alloc(self, nbytes: int) -> Any:
        buffer = SimpleNamespace(nbytes=nbytes, last_use=0)
        self.alive.append(buffer)
        return buffer

    def release(self, buffer: Any) -> None:
        self.alive = [b for b in self.alive if b is not buffer]

    @property
    def ledger(self) -> Any:
        return SimpleNamespace(after=lambda _index, call: self.later.append(call))


def instance(feeds: list[tuple[int, int]]) -> Any:
    outputs = [Part(0, 4), Part(256, 600)]
    return SimpleNamespace(key=((4,),), inputs=[Part(0, 4), Part(256, 600)], outputs=outputs, feeds=feeds)


def session(name: str, quota: int = 1 << 20) -> Any:
    settings = SimpleNamespace(session_memory_bytes=quota)
    return SimpleNamespace(id=name, private_bytes=[0], closed=False, _settings=settings, work_lost=lambda _e: None)


def test_a_carry_per_session_and_instance_charged_until_the_session_leaves() -> None:
    rt: Any = Runtime()
    carries, fed = Carries(), instance([(0, 0), (1, 1)])
    a, b = session("a"), session("b")
    assert carry_bytes(fed) == PLACE + 3 * PLACE  # 4 bytes on one place, 600 on three
    with pytest.raises(InvalidArgument, match="there is none"):
        carries.take(a, rt, fed, True, "g")
    first = carries.take(a, rt, fed, False, "g")
    assert first is not None and carries.take(a, rt, fed, True, "g") is first  # kept: chained from it
    assert carries.take(b, rt, fed, False, "g") is not first
    assert a.private_bytes == b.private_bytes == [4 * PLACE]
    carries.leave(a, rt)
    assert not carries.holds(first) and all(b is not first for b in rt.alive)
    for call in rt.later:
        call(None)
    assert a.private_bytes == [0] and b.private_bytes == [4 * PLACE]
    assert carries.release_all() and not carries.release_all()


def test_a_graph_without_feeds_keeps_nothing_and_the_quota_holds() -> None:
    rt: Any = Runtime()
    carries = Carries()
    assert carries.take(session("a"), rt, instance([]), False, "g") is None
    with pytest.raises(InvalidArgument, match="feeds no input"):
        carries.take(session("a"), rt, instance([]), True, "g")
    with pytest.raises(OutOfMemory, match="session quota"):
        carries.take(session("a", quota=PLACE), rt, instance([(0, 0), (1, 1)]), False, "g")
    assert not rt.alive

"""A replay's bound tensors checked once per session and handles (`gpud.session.graph_binds`): a
repeated replay reuses the check and the plan's key; any other handle under those ids is checked
again, with the errors a first replay gets."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support import axpb

import gpud_client
from gpud.backends.base import Buffer
from gpud.runtime.cache import LruCache
from gpud.session import graph_binds
from gpud.session.binding import UNBOUND, Binding
from gpud.session.tensors import Handle, Tensor
from gpud_client import InvalidArgument as ClientInvalidArgument
from gpud_client import u32
from gpud_protocol import GraphTensor
from gpud_protocol.errors import InvalidArgument, NotFound, PermissionDenied
from gpud_protocol.views import TensorView

SPEC = GraphTensor("cache", "float32", (4,))


class _Session:
    def __init__(self) -> None:
        self.id = "s1"
        self.handles: dict[Any, Handle] = {}

    def _handle(self, ref: Any) -> Handle:
        if isinstance(ref, TensorView):
            raise InvalidArgument("a view")
        if (handle := self.handles.get(ref)) is None:
            raise NotFound(f"unknown tensor handle {ref}")
        return handle


class _Instance:
    def __init__(self, writes: frozenset[int] = frozenset({0})) -> None:
        self.binds: tuple[GraphTensor, ...] = (SPEC,)
        self.bind_writes = writes
        self.bindings: LruCache[tuple[Any, ...], Any] = LruCache(32)


class _Family:
    name, device, generation = "g", 0, 0

    def __init__(self) -> None:
        self.planned: list[tuple[Any, ...]] = []

    def plan_key(self, binds: tuple[Buffer, ...]) -> tuple[Any, ...]:
        return (self.generation, *[b.id for b in binds])

    def plan(self, _instance: Any, binds: tuple[Buffer, ...], key: tuple[Any, ...]) -> Any:
        self.planned.append(key)
        return ("plan", key)


_ids = iter(range(1, 1 << 30))


def _handle(writable: bool = True, shape: tuple[int, ...] = (4,), dtype: str = "float32") -> Handle:
    return Handle(Tensor(Buffer(next(_ids), 16, bytearray(16), 0), dtype, shape), writable, shape)


def _bind(session: _Session, family: _Family, instance: _Instance, refs: tuple[Any, ...]) -> Binding:
    return graph_binds.bind(session, family, instance, refs)  # type: ignore[arg-type]


def test_the_same_handles_reuse_the_binding_and_its_plan_key() -> None:
    session, family, instance = _Session(), _Family(), _Instance()
    session.handles[5] = handle = _handle()
    first = _bind(session, family, instance, (5,))
    assert first.buffers == (handle.tensor.buffer,)
    assert _bind(session, family, instance, (5,)) is first
    plan: Any = graph_binds.plan(family, instance, first)  # type: ignore[arg-type]
    assert plan == ("plan", (0, handle.tensor.buffer.id))
    assert first.key == (0, handle.tensor.buffer.id)
    family.generation = 1  # a slot was replaced: the key follows
    graph_binds.plan(family, instance, first)  # type: ignore[arg-type]
    assert first.key == (1, handle.tensor.buffer.id)


def test_another_handle_under_the_same_id_is_checked_again() -> None:
    session, family, instance = _Session(), _Family(), _Instance()
    session.handles[5] = _handle()
    first = _bind(session, family, instance, (5,))
    session.handles[5] = other = _handle()  # freed, and the id given to another tensor
    second = _bind(session, family, instance, (5,))
    assert second is not first and second.buffers == (other.tensor.buffer,)
    session.handles[5] = _handle(writable=False)  # a read-only resident where the graph writes
    with pytest.raises(PermissionDenied, match="read-only"):
        _bind(session, family, instance, (5,))
    session.handles[5] = _handle(shape=(2, 2))
    with pytest.raises(InvalidArgument, match="must be float32"):
        _bind(session, family, instance, (5,))
    del session.handles[5]
    with pytest.raises(NotFound, match="unknown tensor handle 5"):
        _bind(session, family, instance, (5,))


def test_a_read_only_handle_binds_where_the_graph_only_reads() -> None:
    session, family, instance = _Session(), _Family(), _Instance(writes=frozenset())
    session.handles[5] = _handle(writable=False)
    assert _bind(session, family, instance, (5,)) is _bind(session, family, instance, (5,))


def test_bindings_are_kept_per_session() -> None:
    family, instance = _Family(), _Instance()
    one, two = _Session(), _Session()
    two.id = "s2"
    one.handles[5], two.handles[5] = _handle(), _handle()
    a, b = _bind(one, family, instance, (5,)), _bind(two, family, instance, (5,))
    assert a.buffers != b.buffers
    assert _bind(one, family, instance, (5,)) is a and _bind(two, family, instance, (5,)) is b


def test_a_view_is_checked_every_time_and_never_kept() -> None:
    session, family, instance = _Session(), _Family(), _Instance()
    view = TensorView(5, 0, (4,), (1,))
    for _ in range(2):
        with pytest.raises(InvalidArgument, match="a view"):
            _bind(session, family, instance, (view,))
    assert len(instance.bindings) == 0


def test_a_wrong_count_is_refused_before_any_handle_is_looked_up() -> None:
    session, family, instance = _Session(), _Family(), _Instance()
    with pytest.raises(InvalidArgument, match="binds 1 tensors, 2 given"):
        _bind(session, family, instance, (5, 6))
    no_binds = _Instance()
    no_binds.binds = ()
    assert _bind(session, family, no_binds, ()) is UNBOUND


async def test_replays_follow_their_bound_tensors_across_frees(gpu: gpud_client.Client) -> None:
    """Through the daemon: each replay writes the tensor it binds, whichever handles came before."""
    k = await axpb(gpu)
    g = gpu.graph("rebind")
    x = g.input("x", (64,), "float32")
    out = g.bind("out", (64,), "float32")
    g.dispatch(k, 1, [x, out, 2.0, 1.0, u32(64)])
    g.output("x", x)
    step = await g.build()
    x0 = np.arange(64, dtype=np.float32)
    for round_ in range(3):
        a, b = gpu.empty(64), gpu.empty(64)
        await step.replay(x=x0 + round_, out=a)
        await step.replay(x=x0 - round_, out=b)
        await step.replay(x=x0 + round_, out=a)
        np.testing.assert_array_equal(await a.numpy(), (x0 + round_) * 2 + 1)
        np.testing.assert_array_equal(await b.numpy(), (x0 - round_) * 2 + 1)
        a.free()
        b.free()
    wrong = gpu.empty(32)
    with pytest.raises(ClientInvalidArgument, match="must be float32"):
        await step.replay(x=x0, out=wrong)
    step.free()

"""A session's graph ops: build, replay, launch, free, publish, open, unpublish (see `graphs`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gpud_protocol as proto
from gpud.runtime.graph import Replayable
from gpud.runtime.runtime import Wait
from gpud.runtime.waits import then
from gpud.session import graph_binds
from gpud.session.graph_build import build_graph
from gpud.session.graph_run import execute, execute_steps
from gpud.session.graphs import ALIGN, Family, Instance
from gpud.session.merging import Pending
from gpud_protocol import ArgKind
from gpud_protocol.errors import Busy, InvalidArgument, NotFound, OutOfMemory

if TYPE_CHECKING:
    from gpud.session.state import SessionState as Session


def _check_value(value: int | float, kind: int, name: str) -> int | float:
    if kind == ArgKind.F32:
        if not proto.f32_fits(float(value)):
            raise InvalidArgument(f"scalar {name!r}: {value!r} does not fit a 32-bit float")
        return float(value)
    low, high = proto.SCALAR_RANGES[ArgKind(kind)]
    if type(value) is not int or not low <= value <= high:
        what = proto.SCALAR_NAMES[ArgKind(kind)]
        raise InvalidArgument(f"scalar {name!r} is {what}: {value!r} is not in [{low}, {high}]")
    return value


AnyReplay = proto.Replay | proto.Launch | proto.ReplaySteps


def replay(session: Session, op: proto.Replay | proto.Launch, batch: proto.Batch) -> Wait | None:
    readback = type(op) is proto.Replay
    if readback:
        session._admit()
    family, instance, values, plan, data = _checked(session, op, batch, 1)
    rt = family.runtime
    if rt.saturated:
        return Wait(rt.unsaturated(), lambda: replay(session, op, batch))
    slot, zeroed = _slot(session, family, instance)
    if readback:
        _reserve(session, instance.output_bytes)
    session.touched.add(rt.index)
    if family.pool is None and not (family.rows and session._settings.merge_replays):
        return _reserved(
            session, instance.output_bytes if readback else None, execute, op, family, instance, values, data, plan
        )
    return _queue(session, family, Pending(session, op, instance, values, data, _future(), slot), zeroed)


def _slot(session: Session, family: Family, instance: Instance) -> tuple[int, Wait | None]:
    """A slot graph's slot of this session (taken now if it had none, its state rows zeroed: the
    uploads encoded, or a Wait for staging), or -1."""
    pool = family.pool
    if pool is None:
        return -1, None
    if instance.rows != 1:
        raise InvalidArgument(f"graph {family.name!r} has slots: each replay is one row (its 1-row instance)")
    slot = pool.slot_of(session.id)
    if slot is not None:
        return slot, None
    slot = pool.acquire(session.id, family.name)
    rt = family.runtime
    uploads = []
    for tensor in pool.state:
        row = tensor.buffer.nbytes // pool.size
        uploads.append((rt.view(tensor.buffer, slot * row, row), memoryview(bytes(row))))
    return slot, rt.upload_all(uploads, session)


def leave(session: Session, family: Family) -> None:
    """The session holds no handle of `family` any more: its slot, if any, is free, and so are its carries."""
    if all(f is not family for f in session.graphs.values()):
        family.carries.leave(session, family.runtime)
        if family.pool is not None:
            family.pool.release(session.id)


def replay_steps(session: Session, op: proto.ReplaySteps, batch: proto.Batch) -> Wait | None:
    """`op.steps` replays back to back, each step's fed inputs copied on the device from the outputs
    of the step before (`graph_run.execute_steps`); of a row-independent graph, merged as a replay is
    with other sessions' replays of as many steps (a slot graph's row at its slot)."""
    session._admit()
    family, instance, values, plan, data = _checked(session, op, batch, op.steps)
    rt = family.runtime
    if rt.saturated:
        return Wait(rt.unsaturated(), lambda: replay_steps(session, op, batch))
    scratch = op.steps * (instance.input_bytes + instance.output_bytes)
    quota, used = session._settings.session_memory_bytes, session.private_bytes[rt.index]
    if used + scratch > quota:
        raise OutOfMemory(
            f"{op.steps} steps need {scratch} bytes of device memory: the session quota has {quota - used}"
        )
    merged = family.pool is not None or (family.rows and session._settings.merge_replays)
    if op.chain and merged:
        raise InvalidArgument(
            f"graph {family.name!r} merges its replays with other sessions' (rows or slots): chain=True "
            "is for graphs that run alone"
        )
    carry = None if merged else family.carries.take(session, rt, instance, op.chain, family.name)
    slot, zeroed = _slot(session, family, instance)
    _reserve(session, op.steps * instance.output_bytes)
    session.touched.add(rt.index)
    if not merged:
        return _reserved(
            session, op.steps * instance.output_bytes, execute_steps, op, family, instance, values, data, plan, carry
        )
    return _queue(session, family, Pending(session, op, instance, values, data, _future(), slot), zeroed)


def _future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


def _queue(session: Session, family: Family, pending: Pending, zeroed: Wait | None) -> Wait | None:
    """At the end of this slice, perhaps merged with other sessions' rows; a slot graph's row at its
    slot (`merging`): the session waits until its rows are encoded."""

    def queued() -> Wait:
        session._daemon.merger.add(family, pending)
        return Wait(pending.done, pending.done.result)

    return then(zeroed, queued)


def _reserved(session: Session, nbytes: int | None, encode: Callable[..., Wait | None], *args: Any) -> Wait | None:
    """`encode(session, *args)` of a request whose reply `_reserve` counted (nbytes None: none): where it
    raises (its scratch refused, its plan failed), no reply will end the reservation, so it ends here."""
    try:
        return encode(session, *args)
    except BaseException:
        if nbytes is not None:
            session._unreserve(nbytes)
        raise


def _reserve(session: Session, nbytes: int) -> None:
    limit = session._settings.session_reply_bytes
    if session.reply_bytes_reserved + nbytes > limit:
        raise Busy(f"replies of {session.reply_bytes_reserved + nbytes} bytes would wait unsent")
    session.requests_in_flight += 1
    session.reply_bytes_reserved += nbytes


def _checked(
    session: Session, op: AnyReplay, batch: proto.Batch, steps: int
) -> tuple[Family, Instance, tuple[int | float, ...], Replayable, memoryview | None]:
    """A replay's graph, instance, scalar values, plan (with its bound tensors) and packed inputs
    (`steps` steps' worth), checked."""
    family = graph_of(session, op.graph)
    instance = family.instances.get(op.shapes)
    if instance is None:
        shapes = [list(s) for s in op.shapes]
        raise NotFound(f"graph {family.name!r} has no instance for input shapes {shapes}: build one")
    if len(op.scalars) != len(instance.scalars):
        raise InvalidArgument(f"graph {family.name!r} takes {len(instance.scalars)} scalars, {len(op.scalars)} given")
    values = tuple([_check_value(v, s.kind, s.name) for v, s in zip(op.scalars, instance.scalars, strict=True)])
    binding = graph_binds.bind(session, family, instance, op.binds)
    data: memoryview | None = None
    if instance.input_bytes:
        if op.frame < 0:
            raise InvalidArgument(f"graph {family.name!r} takes inputs: {instance.input_bytes} packed bytes")
        frame = batch.frames[op.frame]
        data = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
        data = data.cast("B") if data.format != "B" else data
        if data.nbytes != instance.input_bytes * steps:
            want = instance.input_bytes * steps
            raise InvalidArgument(f"the packed inputs are {data.nbytes} bytes, graph {family.name!r} takes {want}")
    elif op.frame >= 0:
        raise InvalidArgument(f"graph {family.name!r} takes no inputs")
    plan = graph_binds.plan(family, instance, binding)  # checked here: a refused step fails this replay alone
    return family, instance, values, plan, data


def graph_of(session: Session, handle: int) -> Family:
    family = session.graphs.get(handle)
    if family is None:
        raise NotFound(f"unknown graph handle {handle}")
    return family


def free_graph(session: Session, op: proto.FreeGraph, _batch: proto.Batch) -> None:
    family = session.graphs.pop(op.graph, None)
    if family is None:
        raise NotFound(f"unknown graph handle {op.graph}")
    leave(session, family)
    if session._graph_names.get(family.name) == op.graph and family.owner == session.id:
        del session._graph_names[family.name]
    drop(session, family)


def drop(session: Session, family: Family) -> None:
    """One reference less; the last one releases the family's memory once its replays completed."""
    family.refs -= 1
    if not family.refs:
        release(family, session._residents)


def release(family: Family, residents: Any) -> None:
    rt = family.runtime
    for buffer in family.release_all():
        rt.release(buffer)
    builder = family.builder
    if builder is not None and not builder.closed:
        builder.private_bytes[family.device] -= family.charged
    family.charged = 0
    for tensor in family.held:
        if builder is not None and not builder.closed and builder._held[tensor]:
            builder._held[tensor] -= 1
            if not builder._held[tensor]:
                del builder._held[tensor]
            builder.uncharge_if_unheld(tensor)
        residents.drop(tensor)
    family.held.clear()


def publish_graph(session: Session, op: proto.PublishGraph, _batch: proto.Batch) -> None:
    session._graph_store.publish(graph_of(session, op.graph), op.name)


def open_graph(session: Session, op: proto.OpenGraph, _batch: proto.Batch) -> None:
    session._admit()
    if op.handle in session.handles or op.handle in session.kernels or op.handle in session.graphs:
        raise InvalidArgument(f"handle {op.handle} is in use")
    if len(session.graphs) >= session._settings.session_max_graphs:
        raise OutOfMemory(f"more than {session._settings.session_max_graphs} graphs in this session")
    family = session._graph_store.open(op.name)
    session.graphs[op.handle] = family
    session._reply(op.seq, device=session.shown_device(family.device), **family.signature.describe())


def unpublish_graph(session: Session, op: proto.UnpublishGraph, _batch: proto.Batch) -> None:
    family = session._graph_store.unpublish(op.name, by=session.id)
    drop(session, family)


__all__ = [
    "ALIGN",
    "build_graph",
    "drop",
    "free_graph",
    "leave",
    "open_graph",
    "publish_graph",
    "release",
    "replay",
    "replay_steps",
    "unpublish_graph",
]

"""Building a replay graph: check the whole recording, then allocate, upload and add the instance.

Nothing is allocated before every step has been checked (`graph_record`) and the session's quota
has room for what the build adds. The buffers of the recorded uploads are then charged to the
session and released on every way out: an error, or the session ending while the build waits for
staging; once the instance is added, the family owns (and charges) them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gpud_protocol as proto
from gpud.backends.base import Buffer, Program
from gpud.runtime.runtime import DeviceRuntime, Wait
from gpud.runtime.waits import guarded, then
from gpud.session.graph_record import Recording, record
from gpud.session.graph_rows import feeds_of, pads_of, rows_of
from gpud.session.graphs import Family, Signature
from gpud.session.slots import Pool
from gpud.session.tensors import Tensor
from gpud_protocol import ArgKind
from gpud_protocol.errors import InvalidArgument, NotFound, OutOfMemory, PermissionDenied

if TYPE_CHECKING:
    from gpud.session.state import SessionState as Session


def build_graph(session: Session, op: proto.BuildGraph, batch: proto.Batch) -> Wait | None:
    session._admit()
    graph = op.graph
    handle = session._graph_names.get(op.name)
    family = session.graphs.get(handle) if handle is not None else None
    if family is None:
        if op.handle in session.handles or op.handle in session.kernels or op.handle in session.graphs:
            raise InvalidArgument(f"handle {op.handle} is in use")
        if len(session.graphs) >= session._settings.session_max_graphs:
            raise OutOfMemory(f"more than {session._settings.session_max_graphs} graphs in this session")
    elif family.owner != session.id:
        raise PermissionDenied(f"graph {op.name!r} was opened, not built, by this session")
    fixed = _fixed_tensors(session, graph)
    devices = {t.device for t in fixed.values()}
    if len(devices) > 1:
        raise InvalidArgument(f"the graph uses tensors on devices {sorted(devices)}: one device per graph")
    device = devices.pop() if devices else (family.device if family is not None else session.device)
    if family is not None and family.device != device:
        raise InvalidArgument(f"graph {op.name!r} lives on device {family.device}, these tensors on {device}")
    rt = session.runtimes[device]
    programs = _programs(session, graph, rt)
    if isinstance(programs, asyncio.Future):
        future = programs

        def compiled() -> Wait | None:
            future.result()  # a compile error fails the build
            return build_graph(session, op, batch)

        return Wait(future, compiled)
    signature = Signature(
        tuple((t.name, t.dtype) for t in graph.inputs),
        tuple((s.name, s.kind) for s in graph.scalars),
        tuple((b.name, b.dtype) for b in graph.binds),
        tuple(o.name for o in graph.outputs),
        graph.feeds,
    )
    if family is not None and family.signature != signature:
        raise InvalidArgument(
            f"graph {op.name!r}: another instance has other input, scalar, bind or output names, or feeds"
        )
    if family is not None and family.rows != graph.rows:
        raise InvalidArgument(f"graph {op.name!r}: its other instances were built with rows={family.rows}")
    state = [fixed[int(handle)] for _kind, handle in graph.state]
    if family is not None and (family.pool.size if family.pool else 0, family.pool.state if family.pool else []) != (
        graph.slots,
        state,
    ):
        raise InvalidArgument(f"graph {op.name!r}: its other instances have other slots or state tensors")
    for (_kind, state_handle), tensor in zip(graph.state, state, strict=True):
        if not tensor.shape or tensor.shape[0] != graph.slots:
            raise InvalidArgument(f"graph {op.name!r}: state tensor {tensor.describe()} needs {graph.slots} rows")
        if not session.handles[int(state_handle)].writable:  # a slot's rows are zeroed for each new holder
            raise PermissionDenied(f"graph {op.name!r}: state tensor {tensor.describe()} is a read-only resident")
    recording = record(session, graph, programs, fixed, rt, batch)
    instance = recording.instance
    if graph.rows:
        instance.rows = rows_of(op.name, graph, instance)
        instance.pads = pads_of(op.name, graph, instance)
        if graph.slots and instance.rows > graph.slots:
            raise InvalidArgument(f"graph {op.name!r}: {instance.rows} rows, more than its {graph.slots} slots")
    instance.feeds = feeds_of(op.name, graph, instance)
    slots: list[tuple[Any, int]] = [("in", instance.input_bytes), ("out", instance.output_bytes)]
    slots += [(index, part.nbytes) for index, part in enumerate(instance.temps)]
    current = family.slots if family is not None else {}
    growth = sum(max(0, need - (current[slot].nbytes if slot in current else 0)) for slot, need in slots)
    growth += sum(data.nbytes for data in recording.uploads)
    quota, used = session._settings.session_memory_bytes, session.private_bytes[device]
    if used + growth > quota:
        raise OutOfMemory(f"the graph's memory would exceed the session quota on device {device} ({used} in use)")
    owned = _Owned(session, rt, [data.nbytes for data in recording.uploads])

    def finish() -> None:
        nonlocal family
        recording.place(owned.buffers)
        new = family is None
        if family is None:
            family = Family(op.name, session.id, rt, signature, session)
            family.max_instances = session._settings.graph_instances
            family.rows = graph.rows
            family.pool = Pool(graph.slots, state) if graph.slots else None
        before = family.nbytes
        released = family.add(instance)  # raises with the family unchanged
        owned.hand_over()
        for buffer in released:
            rt.release(buffer)
        if new:
            session.graphs[op.handle] = family
            session._graph_names[op.name] = op.handle
        for tensor in instance.fixed:
            if all(t is not tensor for t in family.held):
                family.held.append(tensor)
                tensor.refs += 1
                session._held[tensor] += 1
        grown = family.nbytes - before
        family.charged += grown
        session.private_bytes[device] += grown
        session._reply(
            op.seq,
            handle=op.handle if new else handle,
            device=session.shown_device(device),
            inputs=[[p.name, p.dtype, list(p.shape), p.offset] for p in instance.inputs],
            input_bytes=instance.input_bytes,
        )

    uploads = list(zip(owned.buffers, recording.uploads, strict=True))
    return owned.guard(lambda: then(rt.upload_all(uploads, session), finish))


class _Owned:
    """The recorded uploads' buffers while the build owns them: charged to the session, released
    (and uncharged) unless handed over to the family."""

    def __init__(self, session: Session, rt: DeviceRuntime, sizes: list[int]) -> None:
        self.session, self.rt = session, rt
        self.buffers: list[Buffer] = []
        self.nbytes = 0
        try:
            for size in sizes:
                self.buffers.append(rt.alloc(size))
                self.nbytes += size
                session.private_bytes[rt.index] += size
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        for buffer in self.buffers:
            self.rt.release(buffer)
        self.hand_over()

    def hand_over(self) -> None:
        """The family owns them now (and charges them with the rest of its memory)."""
        self.session.private_bytes[self.rt.index] -= self.nbytes
        self.buffers, self.nbytes = [], 0

    def guard(self, step: Callable[[], Wait | None]) -> Wait | None:
        """`step()`, and whatever it waits for, releasing the buffers if it raises or if the
        session ends during a wait (then nothing resumes it)."""
        return guarded(step, self.release, lambda: self.session.closed)


def _fixed_tensors(session: Session, graph: proto.GraphDef) -> dict[int, Tensor]:
    """Session tensors the recording names, by handle (checked to exist)."""
    refs: list[proto.Arg] = []
    for step in graph.steps:
        if type(step) is proto.GraphDispatch:
            refs += list(step.args)
        elif type(step) is proto.GraphCopy:
            refs += [step.src, step.dst]
        elif type(step) is proto.GraphUpload:
            refs.append(step.dst)
    refs += [o.ref for o in graph.outputs]
    refs += [ref for ref, _shape in graph.views]
    refs += list(graph.state)
    return {int(v): session._handle(int(v)).tensor for k, v in refs if k == ArgKind.TENSOR}


def _programs(
    session: Session, graph: proto.GraphDef, rt: DeviceRuntime
) -> dict[int, Program] | asyncio.Future[Program]:
    """The program of each kernel the graph dispatches, on its device; or a compile to wait for."""
    programs: dict[int, Program] = {}
    for step in graph.steps:
        if type(step) is not proto.GraphDispatch or step.kernel in programs:
            continue
        kernel = session.kernels.get(step.kernel)
        if kernel is None:
            raise NotFound(session.kernels.unknown(step.kernel))
        program = kernel.programs.get(rt.index)
        if program is None:
            got = rt.program(kernel.source, kernel.entry, kernel.options)
            if isinstance(got, asyncio.Future):
                return got
            program = kernel.programs[rt.index] = got
        programs[step.kernel] = program
    return programs


__all__ = ["Recording", "build_graph"]

"""A session's graph ops: build, replay, launch, free, publish, open, unpublish (see `graphs`)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gpud_protocol as proto
from gpud.backends.base import Buffer, Program
from gpud.runtime.runtime import DeviceRuntime, Wait
from gpud.session.graphs import ALIGN, Family, Instance, Part, Signature, nbytes_of, pack_inputs
from gpud.session.tensors import Tensor
from gpud_protocol import ArgKind
from gpud_protocol.errors import Busy, InvalidArgument, NotFound, OutOfMemory, PermissionDenied
from gpud_protocol.ops import TensorInfo

if TYPE_CHECKING:
    from gpud.session.session import Session

_SCALAR_RANGES = {ArgKind.I32: (-(1 << 31), (1 << 31) - 1), ArgKind.U32: (0, (1 << 32) - 1)}


def _check_value(value: int | float, kind: int, name: str) -> int | float:
    if kind == ArgKind.F32:
        if not proto.f32_fits(float(value)):
            raise InvalidArgument(f"scalar {name!r}: {value!r} does not fit a 32-bit float")
        return float(value)
    low, high = _SCALAR_RANGES[ArgKind(kind)]
    if type(value) is not int or not low <= value <= high:
        what = proto.SCALAR_NAMES[ArgKind(kind)]
        raise InvalidArgument(f"scalar {name!r} is {what}: {value!r} is not in [{low}, {high}]")
    return value


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
    )
    if family is not None and family.signature != signature:
        raise InvalidArgument(f"graph {op.name!r}: another instance has other input, scalar, bind or output names")
    instance = _instance(session, graph, programs, fixed, rt, batch)
    if family is None:
        family = Family(op.name, session.id, rt, signature, session)
        family.max_instances = session._settings.graph_instances
        session.graphs[op.handle] = family
        session._graph_names[op.name] = op.handle
        handle = op.handle
    for tensor in instance.fixed:
        if all(t is not tensor for t in family.held):
            family.held.append(tensor)
            tensor.refs += 1
            session._held[tensor] += 1
    before = family.nbytes
    growth = sum(
        max(0, need - (family.slots[slot].nbytes if slot in family.slots else 0))
        for slot, need in [("in", instance.input_bytes), ("out", instance.output_bytes)]
        + [(i, p.nbytes) for i, p in enumerate(instance.temps)]
    ) + sum(b.nbytes for b in instance.constants)
    quota, used = session._settings.session_memory_bytes, session.private_bytes[device]
    if used + growth > quota:
        for buffer in instance.constants:
            rt.release(buffer)
        raise OutOfMemory(f"the graph's memory would exceed the session quota on device {device} ({used} in use)")
    for buffer in family.add(instance):
        rt.release(buffer)
    growth = family.nbytes - before
    family.charged += growth
    session.private_bytes[device] += growth
    session._reply(
        op.seq,
        handle=handle,
        device=device,
        inputs=[[p.name, p.dtype, list(p.shape), p.offset] for p in instance.inputs],
        input_bytes=instance.input_bytes,
    )
    return None


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
            raise NotFound(f"unknown kernel handle {step.kernel}")
        program = kernel.programs.get(rt.index)
        if program is None:
            got = rt.program(kernel.source, kernel.entry, kernel.options)
            if isinstance(got, asyncio.Future):
                return got
            program = kernel.programs[rt.index] = got
        programs[step.kernel] = program
    return programs


def _instance(
    session: Session,
    graph: proto.GraphDef,
    programs: dict[int, Program],
    fixed: dict[int, Tensor],
    rt: DeviceRuntime,
    batch: proto.Batch,
) -> Instance:
    inputs, input_bytes = pack_inputs(list(graph.inputs))
    temps = [Part(f"temp{i}", dtype, shape, 0, nbytes_of(dtype, shape)) for i, (dtype, shape) in enumerate(graph.temps)]
    specs = {ArgKind.INPUT: graph.inputs, ArgKind.BIND: graph.binds}

    def describe(ref: proto.Arg) -> tuple[str, tuple[int, ...]]:
        kind, value = ref
        if kind == ArgKind.TENSOR:
            return fixed[int(value)].dtype, session.handles[int(value)].shape
        if kind == ArgKind.VIEW:
            view_of, shape = graph.views[int(value)]
            return describe(view_of)[0], shape
        if kind == ArgKind.TEMP:
            return graph.temps[int(value)]
        spec = specs[ArgKind(kind)][int(value)]
        return spec.dtype, spec.shape

    def writable(ref: proto.Arg, what: str) -> None:
        kind, value = base(ref)
        if kind == ArgKind.TENSOR and not session.handles[int(value)].writable:
            raise PermissionDenied(f"{what} writes read-only resident {fixed[int(value)].name!r}")
        if kind == ArgKind.BIND:
            bind_writes.add(int(value))

    def base(ref: proto.Arg) -> proto.Arg:
        """A view's memory is its tensor's: replays see only buffers."""
        while ref[0] == ArgKind.VIEW:
            ref = graph.views[int(ref[1])][0]
        return ref

    for number, (view_of, shape) in enumerate(graph.views):
        dtype, of_shape = describe(view_of)
        if math.prod(shape) != math.prod(of_shape):
            raise InvalidArgument(f"graph view {number}: cannot view {dtype}{list(of_shape)} as {list(shape)}")

    bind_writes: set[int] = set()
    steps: list[tuple[Any, ...]] = []
    constants: list[Buffer] = []
    order = list(fixed)
    position_of = {handle: i for i, handle in enumerate(order)}
    for number, step in enumerate(graph.steps):
        what = f"graph step {number}"
        if isinstance(step, proto.GraphDispatch):
            program = programs[step.kernel]
            limit = rt.device.max_grid
            if any(g > m for g, m in zip(step.grid, limit, strict=True)):
                raise InvalidArgument(f"{what}: grid {step.grid} exceeds the device limit {limit}")
            tensors = [a for a in step.args if a[0] in proto.GRAPH_TENSOR_KINDS]
            kinds = tuple(
                proto.SCALAR_NAMES[ArgKind(graph.scalars[int(v)].kind if k == ArgKind.SCALAR else k)]
                for k, v in step.args
                if k not in proto.GRAPH_TENSOR_KINDS
            )
            kernel = session.kernels.get(step.kernel)
            assert kernel is not None
            kernel.check_arguments(program, len(tensors), kinds)
            fixed_scalars = [v for k, v in step.args if k not in proto.GRAPH_TENSOR_KINDS]
            if any(k == ArgKind.SCALAR for k, _ in step.args):
                if kernel.builtin is not None:  # its rule (the bounds of what it reads) is checked here only
                    op = f"{kernel.builtin.op} ({kernel.builtin.name})"
                    raise InvalidArgument(f"{what}: built-in op {op} takes no per-replay scalars (checked at build)")
            else:
                kernel.check_op([TensorInfo(*describe(ref)) for ref in tensors], fixed_scalars)
            written = kernel.writes(program)
            for position, ref in enumerate(tensors):
                if written is None or position in written or position in (step.writes or ()):
                    writable(ref, f"{what} ({program.entry}, tensor argument {position})")
            args = tuple(_local(base(arg), position_of) for arg in step.args)
            steps.append(("dispatch", program, step.grid, args))
        elif isinstance(step, proto.GraphCopy):
            if describe(step.src) != describe(step.dst):
                raise InvalidArgument(f"{what}: copy between {describe(step.src)} and {describe(step.dst)}")
            writable(step.dst, what)
            dtype, shape = describe(step.src)
            src, dst = _local(base(step.src), position_of), _local(base(step.dst), position_of)
            steps.append(("copy", src, dst, nbytes_of(dtype, shape)))
        else:
            frame = batch.frames[step.frame]
            data = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
            dtype, shape = describe(step.dst)
            if data.nbytes != nbytes_of(dtype, shape):
                raise InvalidArgument(f"{what}: {data.nbytes} bytes recorded for a tensor of {nbytes_of(dtype, shape)}")
            writable(step.dst, what)
            constant = rt.alloc(data.nbytes)
            constants.append(constant)
            wait = rt.upload(constant, data.cast("B") if data.format != "B" else data, session)
            if wait is not None:  # the staging pool is full: the recording is too large to stage at once
                raise Busy("a graph's recorded uploads do not fit the staging pool at once; record smaller ones")
            steps.append(("copy", constant, _local(base(step.dst), position_of), data.nbytes))
    outputs, out_bytes = pack_inputs([(o.name, *describe(o.ref)) for o in graph.outputs])
    return Instance(
        key=tuple(t.shape for t in graph.inputs),
        inputs=inputs,
        input_bytes=input_bytes,
        temps=temps,
        outputs=outputs,
        output_bytes=out_bytes,
        binds=graph.binds,
        bind_writes=frozenset(bind_writes),
        scalars=graph.scalars,
        steps=steps,
        output_refs=[_local(base(o.ref), position_of) for o in graph.outputs],
        fixed=[fixed[h] for h in order],
        constants=constants,
    )


def _local(ref: proto.Arg, position_of: dict[int, int]) -> proto.Arg:
    """A session tensor's handle becomes its position in the family's list of fixed tensors."""
    kind, value = ref
    return (kind, position_of[int(value)]) if kind == ArgKind.TENSOR else ref


def replay(session: Session, op: proto.Replay | proto.Launch, batch: proto.Batch) -> Wait | None:
    readback = type(op) is proto.Replay
    if readback:
        session._admit()
    family = graph_of(session, op.graph)
    instance = family.instances.get(op.shapes)
    if instance is None:
        shapes = [list(s) for s in op.shapes]
        raise NotFound(f"graph {family.name!r} has no instance for input shapes {shapes}: build one")
    if len(op.scalars) != len(instance.scalars):
        raise InvalidArgument(f"graph {family.name!r} takes {len(instance.scalars)} scalars, {len(op.scalars)} given")
    values = tuple(_check_value(v, s.kind, s.name) for v, s in zip(op.scalars, instance.scalars, strict=True))
    if len(op.binds) != len(instance.binds):
        raise InvalidArgument(f"graph {family.name!r} binds {len(instance.binds)} tensors, {len(op.binds)} given")
    binds: list[Buffer] = []
    for index, (handle_id, spec) in enumerate(zip(op.binds, instance.binds, strict=True)):
        handle = session._handle(handle_id)
        tensor = handle.tensor
        if (tensor.dtype, handle.shape) != (spec.dtype, spec.shape):
            raise InvalidArgument(
                f"bound tensor {spec.name!r} must be {spec.dtype}{list(spec.shape)}, got {handle.describe()}"
            )
        if tensor.device != family.device:
            where = f"device {tensor.device}, the graph on {family.device}"
            raise InvalidArgument(f"bound tensor {spec.name!r} is on {where}")
        if index in instance.bind_writes and not handle.writable:
            raise PermissionDenied(f"the graph writes bound tensor {spec.name!r}, a read-only resident")
        binds.append(tensor.buffer)
    data: memoryview | None = None
    if instance.input_bytes:
        if op.frame < 0:
            raise InvalidArgument(f"graph {family.name!r} takes inputs: {instance.input_bytes} packed bytes")
        frame = batch.frames[op.frame]
        data = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
        data = data.cast("B") if data.format != "B" else data
        if data.nbytes != instance.input_bytes:
            want = instance.input_bytes
            raise InvalidArgument(f"the packed inputs are {data.nbytes} bytes, graph {family.name!r} takes {want}")
    elif op.frame >= 0:
        raise InvalidArgument(f"graph {family.name!r} takes no inputs")
    rt = family.runtime
    if rt.saturated:
        return Wait(rt.unsaturated(), lambda: replay(session, op, batch))
    if readback:
        limit = session._settings.session_reply_bytes
        if session.reply_bytes_reserved + instance.output_bytes > limit:
            raise Busy(f"replies of {session.reply_bytes_reserved + instance.output_bytes} bytes would wait unsent")
        session.requests_in_flight += 1
        session.reply_bytes_reserved += instance.output_bytes
    session.touched.add(rt.index)
    plan = family.plan(instance, tuple(binds))
    slots = family.slots

    def run() -> Wait | None:
        rt.replay(plan, values, session)
        family.last_use = rt.ledger.pending_index
        if not readback:
            return None
        layout = [[p.name, p.dtype, list(p.shape), p.offset] for p in instance.outputs]
        reply = session._readback_reply(op.seq, instance.output_bytes, rt, {"outputs": layout})
        if instance.output_bytes == 0:
            reply.deliver(0, b"", None)
            rt.want_flush()
            return None
        return rt.download(rt.view(slots["out"], 0, instance.output_bytes), reply.deliver, session)

    if data is None:
        return run()
    return _then(rt.upload(rt.view(slots["in"], 0, instance.input_bytes), data, session), run)


def _then(wait: Wait | None, next_step: Callable[[], Wait | None]) -> Wait | None:
    if wait is None:
        return next_step()
    return Wait(wait.ready, lambda: _then(wait.resume(), next_step))


def graph_of(session: Session, handle: int) -> Family:
    family = session.graphs.get(handle)
    if family is None:
        raise NotFound(f"unknown graph handle {handle}")
    return family


def free_graph(session: Session, op: proto.FreeGraph, _batch: proto.Batch) -> None:
    family = session.graphs.pop(op.graph, None)
    if family is None:
        raise NotFound(f"unknown graph handle {op.graph}")
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
    session._reply(op.seq, device=family.device, **family.signature.describe())


def unpublish_graph(session: Session, op: proto.UnpublishGraph, _batch: proto.Batch) -> None:
    family = session._graph_store.unpublish(op.name, by=session.id)
    drop(session, family)


__all__ = [
    "ALIGN",
    "build_graph",
    "drop",
    "free_graph",
    "open_graph",
    "publish_graph",
    "release",
    "replay",
    "unpublish_graph",
]

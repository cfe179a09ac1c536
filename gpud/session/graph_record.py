"""A graph's recording checked step by step into an `Instance`, before anything is allocated.

Each step is checked against the kernel it dispatches, the shapes it copies, the tensors it may
write, and the memory it names (`graph_checks`: no step names one buffer twice where the device
would refuse it). Recorded uploads are only checked here: `Recording.place` puts the buffers
`graph_build` allocates for them into the steps.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import gpud_protocol as proto
from gpud.backends.base import Buffer, Program
from gpud.runtime.runtime import DeviceRuntime
from gpud.session.graph_checks import build_key, check_copy, check_dispatch
from gpud.session.graphs import Instance, Part, nbytes_of, pack_inputs
from gpud.session.kernels import KernelRef
from gpud.session.tensors import Tensor
from gpud_protocol import ArgKind
from gpud_protocol.errors import InvalidArgument, PermissionDenied
from gpud_protocol.ops import TensorInfo

if TYPE_CHECKING:
    from gpud.session.state import SessionState as Session


@dataclasses.dataclass(eq=False)
class Recording:
    instance: Instance  # its recorded uploads are ("upload", index, dst, nbytes, step) until placed
    uploads: list[memoryview]  # the recorded data, by index

    def place(self, buffers: list[Buffer]) -> None:
        """The recorded uploads copy from `buffers` (one per upload, filled) at their places."""
        self.instance.steps = [("copy", buffers[t[1]], *t[2:]) if t[0] == "upload" else t for t in self.instance.steps]
        self.instance.constants = list(buffers)


def record(
    session: Session,
    graph: proto.GraphDef,
    programs: dict[int, Program],
    fixed: dict[int, Tensor],
    rt: DeviceRuntime,
    batch: proto.Batch,
) -> Recording:
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

    def name(ref: proto.Arg) -> str:
        kind, value = ref
        if kind == ArgKind.VIEW:
            return f"view {value} of {name(graph.views[int(value)][0])}"
        if kind == ArgKind.TENSOR:
            return f"tensor {value}"
        if kind == ArgKind.TEMP:
            return f"intermediate {value}"
        word = "input" if kind == ArgKind.INPUT else "bound tensor"
        return f"{word} {specs[ArgKind(kind)][int(value)].name!r}"

    def base(ref: proto.Arg) -> proto.Arg:
        """A view's memory is its tensor's: replays see only buffers."""
        while ref[0] == ArgKind.VIEW:
            ref = graph.views[int(ref[1])][0]
        return ref

    def key(ref: proto.Arg) -> Hashable:
        kind, value = base(ref)
        return build_key(kind, int(value), lambda handle: fixed[handle].buffer)

    def writable(ref: proto.Arg, what: str) -> None:
        kind, value = base(ref)
        if kind == ArgKind.TENSOR and not session.handles[int(value)].writable:
            raise PermissionDenied(f"{what} writes read-only resident {fixed[int(value)].name!r}")
        if kind == ArgKind.TENSOR:
            written.add(id(fixed[int(value)]))
        if kind == ArgKind.BIND:
            bind_writes.add(int(value))

    def read_early(ref: proto.Arg, kernel: KernelRef, position: int, what: str) -> None:
        """A tensor read before the kernel before it finishes: read-only, and written by no step (below)."""
        kind, value = base(ref)
        if kind != ArgKind.TENSOR or session.handles[int(value)].writable:
            raise InvalidArgument(f"{what}: {kernel.early_problem(position, name(ref))}")
        early.append((fixed[int(value)], position, kernel, what))

    for number, (view_of, shape) in enumerate(graph.views):
        dtype, of_shape = describe(view_of)
        # A reshape, or the first rows of a tensor (a slot graph's view of its state): at the same offset.
        rows = len(shape) == len(of_shape) > 0 and shape[1:] == of_shape[1:] and shape[0] <= of_shape[0]
        if math.prod(shape) != math.prod(of_shape) and not rows:
            raise InvalidArgument(f"graph view {number}: cannot view {dtype}{list(of_shape)} as {list(shape)}")

    bind_writes: set[int] = set()
    written: set[int] = set()  # ids of the fixed tensors that steps write
    early: list[tuple[Tensor, int, KernelRef, str]] = []  # what `read_early` took
    steps: list[tuple[Any, ...]] = []
    uploads: list[memoryview] = []
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
            check_dispatch(number, program, [key(ref) for ref in tensors], [name(ref) for ref in tensors])
            writes = kernel.writes(program)
            for position, ref in enumerate(tensors):
                if writes is None or position in writes or position in (step.writes or ()):
                    writable(ref, f"{what} ({program.entry}, tensor argument {position})")
            for position in kernel.early:
                read_early(tensors[position], kernel, position, what)
            args = tuple(_local(base(arg), position_of) for arg in step.args)
            steps.append(("dispatch", program, step.grid, args, number))
        elif isinstance(step, proto.GraphCopy):
            if describe(step.src) != describe(step.dst):
                raise InvalidArgument(f"{what}: copy between {describe(step.src)} and {describe(step.dst)}")
            check_copy(number, key(step.src), key(step.dst), (name(step.src), name(step.dst)))
            writable(step.dst, what)
            dtype, shape = describe(step.src)
            src, dst = _local(base(step.src), position_of), _local(base(step.dst), position_of)
            steps.append(("copy", src, dst, nbytes_of(dtype, shape), number))
        else:
            frame = batch.frames[step.frame]
            data = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
            dtype, shape = describe(step.dst)
            if data.nbytes != nbytes_of(dtype, shape):
                raise InvalidArgument(f"{what}: {data.nbytes} bytes recorded for a tensor of {nbytes_of(dtype, shape)}")
            writable(step.dst, what)
            steps.append(("upload", len(uploads), _local(base(step.dst), position_of), data.nbytes, number))
            uploads.append(data.cast("B") if data.format != "B" else data)
    for tensor, position, kernel, what in early:
        if id(tensor) in written:  # through another handle of the same memory
            raise InvalidArgument(f"{what}: {kernel.early_problem(position, 'a tensor another step writes')}")
    outputs, out_bytes = pack_inputs([(o.name, *describe(o.ref)) for o in graph.outputs])
    instance = Instance(
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
        constants=[],
    )
    return Recording(instance, uploads)


def _local(ref: proto.Arg, position_of: dict[int, int]) -> proto.Arg:
    """A session tensor's handle becomes its position in the family's list of fixed tensors."""
    kind, value = ref
    return (kind, position_of[int(value)]) if kind == ArgKind.TENSOR else ref

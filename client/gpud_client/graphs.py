"""Replay graphs: record a step once, build it on the daemon, replay it with fresh inputs in one message.

    g = gpu.graph("decode_step")                 # a recorder: ops go into g, not to the stream
    x = g.input("x", (n,), "float32")            # host data, uploaded per replay (packed)
    pos = g.scalar("pos", "u32")                 # a scalar set per replay
    kv = g.bind("kv", (L, n), "float16")         # a device tensor chosen per replay (the caller's own)
    h = g.empty((n,), "float32")                 # an intermediate, from the graph's memory
    g.dispatch(k, grid=(...), args=[x, w, kv, h, pos])   # same rules as gpu.dispatch
    g.output("h", h)                             # read back in the replay's reply
    step = await g.build()                       # the daemon validates and instantiates it
    out = await step.replay(x=arr, pos=7, kv=my_kv)   # one message; returns {"h": ndarray}
    step.launch(x=arr, pos=7, kv=my_kv)          # queued like a dispatch, no readback

Building the same name again with inputs of other shapes adds an instance (one per shape, e.g.
per batch size); a replay picks the instance by the shapes of its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import gpud_protocol as proto
from gpud_client.dtypes import HostDType, exact_bits, from_storage, host_dtype, is_bfloat16, name_of
from gpud_client.errors import InvalidArgument
from gpud_client.values import dim3, reshaped
from gpud_protocol import ArgKind
from gpud_protocol.ops import TensorInfo

if TYPE_CHECKING:
    from gpud_client.client import Client
    from gpud_client.values import Kernel

ALIGN = 256  # the packing of a replay's inputs: each at an offset aligned to this many bytes
_KINDS = {"f32": int(ArgKind.F32), "i32": int(ArgKind.I32), "u32": int(ArgKind.U32)}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}
_KIND_WORDS = {ArgKind.INPUT: "input", ArgKind.BIND: "bound tensor", ArgKind.TEMP: "intermediate", ArgKind.VIEW: "view"}


class GraphTensor:
    """A tensor of a recording: an input, a bound tensor or an intermediate."""

    def __init__(self, graph: Graph, kind: int, index: int, dtype: HostDType, shape: tuple[int, ...]) -> None:
        self.graph = graph
        self.kind = kind
        self.index = index
        self.dtype = dtype
        self.dtype_name = name_of(dtype)
        self.shape = shape
        self.info = TensorInfo(self.dtype_name, shape)  # what the op library's rules see: dense
        self.base: Any = self  # the tensor whose memory this is (of the graph, or a session's)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def reshape(self, *shape: int | Sequence[int]) -> GraphTensor:
        """The same memory with another shape (-1: inferred), as in `Tensor.reshape`."""
        return self.graph.view(self, shape)

    def transpose(self, *_args: Any) -> GraphTensor:
        raise self._no_strides("transpose")

    def permute(self, *_args: Any) -> GraphTensor:
        raise self._no_strides("permute")

    def narrow(self, *_args: Any) -> GraphTensor:
        raise self._no_strides("narrow")

    def _no_strides(self, op: str) -> InvalidArgument:
        return InvalidArgument(
            f"graph {self.graph.name!r}: a recording's tensors take reshapes only ({op} views are not "
            "recorded: graph views carry no strides)",
            op=op,
        )

    def __repr__(self) -> str:
        what = _KIND_WORDS[ArgKind(self.kind)]
        return f"<graph {self.graph.name!r} {what} #{self.index} {self.dtype}{list(self.shape)}>"


class GraphScalar:
    def __init__(self, graph: Graph, index: int, kind: int) -> None:
        self.graph = graph
        self.index = index
        self.kind = kind


class Graph:
    """A recorder: nothing reaches the daemon until `build()`."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.name = name
        self._inputs: list[tuple[str, str, tuple[int, ...]]] = []
        self._scalars: list[tuple[str, int]] = []
        self._binds: list[tuple[str, str, tuple[int, ...]]] = []
        self._temps: list[tuple[str, tuple[int, ...]]] = []
        self._steps: list[proto.GraphDispatch | proto.GraphCopy | proto.GraphUpload] = []
        self._outputs: list[tuple[str, proto.Arg]] = []
        self._views: list[tuple[proto.Arg, tuple[int, ...]]] = []
        self._session_views: dict[proto.TensorView, GraphTensor] = {}  # a session view, as a view of the graph's
        self._uploads: list[bytes] = []
        self._names: set[str] = set()

    def _named(self, name: str) -> str:
        if name in self._names:
            raise InvalidArgument(f"graph {self.name!r} already has an input, scalar or bound tensor {name!r}")
        self._names.add(name)
        return name

    def input(self, name: str, shape: int | Sequence[int], dtype: Any = "float32") -> GraphTensor:
        """Host data, packed with the other inputs and uploaded per replay."""
        dims, np_dtype = _shape(shape), _dtype(dtype)
        self._inputs.append((self._named(name), np_dtype.name, dims))
        return GraphTensor(self, ArgKind.INPUT, len(self._inputs) - 1, np_dtype, dims)

    def scalar(self, name: str, kind: str = "f32") -> GraphScalar:
        """A scalar argument set per replay: "f32", "i32" or "u32"."""
        if kind not in _KINDS:
            raise InvalidArgument(f"scalar kind {kind!r}: use one of {sorted(_KINDS)}")
        self._scalars.append((self._named(name), _KINDS[kind]))
        return GraphScalar(self, len(self._scalars) - 1, _KINDS[kind])

    def bind(self, name: str, shape: int | Sequence[int], dtype: Any = "float32") -> GraphTensor:
        """A device tensor of the caller's, chosen per replay (a KV cache, an output of its own)."""
        dims, np_dtype = _shape(shape), _dtype(dtype)
        self._binds.append((self._named(name), np_dtype.name, dims))
        return GraphTensor(self, ArgKind.BIND, len(self._binds) - 1, np_dtype, dims)

    def empty(self, shape: int | Sequence[int], dtype: Any = "float32") -> GraphTensor:
        """An intermediate: memory of the graph's, kept between replays (not cleared)."""
        dims, np_dtype = _shape(shape), _dtype(dtype)
        self._temps.append((np_dtype.name, dims))
        return GraphTensor(self, ArgKind.TEMP, len(self._temps) - 1, np_dtype, dims)

    def view(self, tensor: Any, shape: int | Sequence[Any]) -> GraphTensor:
        """`tensor` (of this graph, or a session tensor) seen with another shape; no copy."""
        dims = reshaped(tuple(tensor.shape), shape)
        self._views.append((self._ref(tensor), dims))
        view = GraphTensor(self, ArgKind.VIEW, len(self._views) - 1, host_dtype(tensor.dtype), dims)
        view.base = tensor.base
        return view

    def dispatch(
        self,
        kernel: Kernel,
        grid: int | Sequence[int],
        args: Sequence[Any] = (),
        *,
        writes: Sequence[int] | None = None,
    ) -> None:
        encoded = tuple(self._arg(a) for a in args)
        dims = (grid, 1, 1) if type(grid) is int else dim3(grid)
        self._steps.append(proto.GraphDispatch(kernel.handle, dims, encoded, None if writes is None else tuple(writes)))

    def copy(self, src: Any, dst: Any) -> None:
        self._steps.append(proto.GraphCopy(self._ref(src), self._ref(dst)))

    def upload(self, dst: Any, array: Any) -> None:
        """Record data (copied now) written into `dst` at this point of every replay."""
        self._uploads.append(np.asarray(array, order="C").tobytes())
        self._steps.append(proto.GraphUpload(len(self._uploads) - 1, self._ref(dst)))

    def output(self, name: str, tensor: Any) -> None:
        """Read `tensor` back in each replay's reply, as `name`."""
        self._outputs.append((name, self._ref(tensor)))

    def _ref(self, value: Any) -> proto.Arg:
        if isinstance(value, GraphTensor):
            if value.graph is not self:
                raise InvalidArgument(f"{value!r} belongs to another graph")
            return (value.kind, value.index)
        ref = self._client._ref_of(value)
        self._client._hold(value)  # a built graph holds the memory: never reused as another op's output
        if isinstance(ref, proto.TensorView):  # a session view: recorded as a view of its base
            _whole_view(f"graph {self.name!r}", value)
            view = self._session_views.get(ref)
            if view is None:
                view = self._session_views[ref] = self.view(value.base, value.shape)
            return self._ref(view)
        return (int(ArgKind.TENSOR), ref)

    def _arg(self, value: Any) -> proto.Arg:
        if isinstance(value, GraphTensor):
            return self._ref(value)
        if isinstance(value, GraphScalar):
            if value.graph is not self:
                raise InvalidArgument("a scalar of another graph")
            return (int(ArgKind.SCALAR), value.index)
        kind, v = self._client._arg(value)
        if isinstance(v, proto.TensorView):
            return self._ref(value)
        if kind == ArgKind.TENSOR:
            self._client._hold(value)  # a built graph holds the memory: never reused as another op's output
        return (kind, v)

    async def build(self) -> Step:
        """Send the recording; the daemon checks it against every kernel and instantiates it."""
        definition = proto.GraphDef(
            tuple(proto.GraphTensor(*i) for i in self._inputs),
            tuple(proto.GraphScalar(*s) for s in self._scalars),
            tuple(proto.GraphTensor(*b) for b in self._binds),
            tuple(self._temps),
            tuple(self._steps),
            tuple(proto.GraphOutput(*o) for o in self._outputs),
            tuple(self._views),
        )
        client = self._client
        frames = list(self._uploads)
        if frames:
            client._connection.send_batch()  # the recorded uploads are frames of a batch of their own
            base = [client._connection.queue.add_frame(f) for f in frames]
            if any(index is None for index in base):
                raise InvalidArgument("the graph's recorded uploads are too large for one message")
            steps = tuple(
                proto.GraphUpload(int(base[s.frame] or 0), s.dst) if type(s) is proto.GraphUpload else s
                for s in definition.steps
            )
            definition = definition._replace(steps=steps)
        seq = client._next_seq()
        handle = next(client._handles)
        client._queue(proto.BuildGraph(seq, handle, self.name, definition), request=seq)
        header, _ = await client._connection.request(seq)
        return Step(
            client,
            int(header["handle"]),
            self.name,
            int(header["device"]),
            [(n, d) for n, d, _ in self._inputs],
            [(n, _KIND_NAMES[k]) for n, k in self._scalars],
            [(n, d) for n, d, _ in self._binds],
            [n for n, _ in self._outputs],
        )


class Step:
    """A built (or opened) graph: replay it with keyword arguments named after its inputs, scalars
    and bound tensors."""

    def __init__(
        self,
        client: Client,
        handle: int,
        name: str,
        device: int,
        inputs: list[tuple[str, str]],
        scalars: list[tuple[str, str]],
        binds: list[tuple[str, str]],
        outputs: list[str],
    ) -> None:
        self._client = client
        self.handle = handle
        self.name = name
        self.device = device
        self.inputs = inputs
        self.scalars = scalars
        self.binds = binds
        self.outputs = outputs
        self.freed = False

    async def replay(self, **values: Any) -> dict[str, np.ndarray[Any, Any]]:
        """One message; resolves with the outputs by name."""
        client = self._client
        seq = client._next_seq()
        client._queue(self._op(proto.Replay, seq, values), request=seq)
        header, data = await client._connection.request(seq)
        raw = np.zeros(0, np.uint8) if data is None else np.frombuffer(data, np.uint8)
        out: dict[str, np.ndarray[Any, Any]] = {}
        for name, dtype, shape, offset in header.get("outputs", ()):
            stored = host_dtype(dtype)
            count = math.prod(shape)
            out[name] = from_storage(raw[offset : offset + count * stored.itemsize], stored, copy=True).reshape(shape)
        return out

    def launch(self, **values: Any) -> None:
        """Queued like a dispatch: no round trip, no readback (results stay in bound tensors)."""
        self._op_queued(values)

    def _op_queued(self, values: dict[str, Any]) -> None:
        client = self._client
        client._queue(self._op(proto.Launch, client._next_seq(), values))

    def _op(self, kind: type[Any], seq: int, values: dict[str, Any]) -> Any:
        if self.freed:
            raise InvalidArgument(f"graph {self.name!r} is freed")
        known = {n for n, _ in self.inputs} | {n for n, _ in self.scalars} | {n for n, _ in self.binds}
        if unknown := set(values) - known:
            raise InvalidArgument(f"graph {self.name!r} has no input, scalar or bound tensor {sorted(unknown)}")
        if missing := known - set(values):
            raise InvalidArgument(f"graph {self.name!r} needs {sorted(missing)}")
        arrays = [_host_input(self.name, name, dtype, values[name]) for name, dtype in self.inputs]
        binds = tuple(self._client._ref_of(values[name]) for name, _ in self.binds)  # checked before a frame is queued
        for (name, _), ref in zip(self.binds, binds, strict=True):
            if isinstance(ref, proto.TensorView):
                _whole_view(f"graph {self.name!r} bound tensor {name!r}", values[name])
        frame = -1
        if arrays:
            total, offsets = 0, []
            for array in arrays:
                offsets.append(total)
                total = (total + array.nbytes + ALIGN - 1) // ALIGN * ALIGN
            packed = bytearray(total)
            for array, offset in zip(arrays, offsets, strict=True):
                packed[offset : offset + array.nbytes] = array.tobytes()
            queue = self._client._connection.queue
            index = queue.add_frame(bytes(packed))
            if index is None:
                self._client._connection.send_batch()
                index = queue.add_frame(bytes(packed))
            frame = int(index or 0)
        scalars = tuple(float(values[name]) if kind == "f32" else int(values[name]) for name, kind in self.scalars)
        shapes = tuple(tuple(a.shape) for a in arrays)
        return kind(seq, self.handle, frame, shapes, scalars, binds)

    def free(self) -> None:
        if not self.freed:
            self.freed = True
            client = self._client
            client._queue(proto.FreeGraph(client._next_seq(), self.handle))

    def __repr__(self) -> str:
        return f"<gpud graph {self.name!r} #{self.handle} device {self.device}>"


def _whole_view(what: str, tensor: Any) -> None:
    """Graphs name buffers: they take a session view only where it is its whole tensor (a reshape)."""
    if not tensor._whole:
        raise InvalidArgument(
            f"{what}: {tensor!r} is a transposed or narrowed view; graphs take whole tensors and their "
            "reshapes: call gpu.ops.contiguous() on it first (outside the recording)"
        )


def _host_input(graph: str, name: str, dtype: str, value: Any) -> np.ndarray[Any, Any]:
    """A replay's input as given: of the input's dtype exactly, as `Tensor.upload` takes data (host
    data is never converted: `gpu.tensor(a)` keeps a's dtype too). A bfloat16 input takes float32
    values, rounded to nearest even, or ml_dtypes.bfloat16 ones: its bits are sent."""
    if is_bfloat16(dtype):
        try:
            return exact_bits(value, f"graph {graph!r} input {name!r}")
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
    array = np.asarray(value, order="C")
    if array.dtype != np.dtype(dtype):
        raise InvalidArgument(
            f"graph {graph!r} input {name!r} is {dtype}, got {array.dtype}: convert it first "
            f"(np.asarray(value, {dtype!r}))"
        )
    return array


def _shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)


def _dtype(dtype: Any) -> HostDType:
    np_dtype = host_dtype(dtype)
    if np_dtype.name not in proto.DTYPE_SIZES:
        raise InvalidArgument(f"dtype {np_dtype} is not supported: use one of {sorted(proto.DTYPE_SIZES)}")
    return np_dtype


__all__ = ["Graph", "GraphScalar", "GraphTensor", "Step"]

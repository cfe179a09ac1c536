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

A step whose output feeds one of its inputs (`g.feed("next", into="ids")`) can run several times in
one message: `await step.replay_steps(n, ids=first, pos=per_step)` runs n replays back to back, the
output copied into the input on the device between them, and returns every step's outputs.

Building the same name again with inputs of other shapes adds an instance (one per shape, e.g.
per batch size); a replay picks the instance by the shapes of its inputs.

A row-independent step (`gpu.graph(name, rows=True)`): every input and output has the same leading
axis, the rows, and each output row depends on its own input rows alone (and on tensors every row
shares, such as weights); no bound tensors. Build it for several row counts (1, 2, 4, 8...), publish
it, and the daemon merges replays that sessions send at the same time into one launch of the
smallest instance that holds all their rows, each session getting back exactly its rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import gpud_protocol as proto
from gpud_client.dtypes import host_dtype
from gpud_client.errors import InvalidArgument
from gpud_client.graph_tensors import GraphScalar, GraphTensor, dims_of, graph_dtype, whole_view
from gpud_client.steps import Step
from gpud_client.values import dim3, reshaped
from gpud_protocol import ArgKind

if TYPE_CHECKING:
    from gpud_client.client_base import ClientBase
    from gpud_client.values import Kernel


class Graph:
    """A recorder: nothing reaches the daemon until `build()`."""

    def __init__(self, client: ClientBase, name: str, *, rows: bool = False, slots: int = 0) -> None:
        self._client = client
        self.name = name
        self.rows = rows or slots > 0
        self.slots = slots
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
        self._feeds: list[tuple[str, str]] = []
        self._state: list[proto.Arg] = []
        self._pads: list[tuple[str, int | float]] = []

    def _named(self, name: str) -> str:
        if name in self._names:
            raise InvalidArgument(f"graph {self.name!r} already has an input, scalar or bound tensor {name!r}")
        self._names.add(name)
        return name

    def input(
        self, name: str, shape: int | Sequence[int], dtype: Any = "float32", *, pad: int | float | None = None
    ) -> GraphTensor:
        """Host data, packed with the other inputs and uploaded per replay. `pad`: in a graph of rows,
        the value of this input's padding rows in a merged launch (default 0)."""
        dims, np_dtype = dims_of(shape), graph_dtype(dtype)
        self._inputs.append((self._named(name), np_dtype.name, dims))
        if pad is not None:
            self._pads.append((name, pad))
        return GraphTensor(self, ArgKind.INPUT, len(self._inputs) - 1, np_dtype, dims)

    def scalar(self, name: str, kind: str = "f32") -> GraphScalar:
        """A scalar argument set per replay: "f32", "i32" or "u32"."""
        if kind not in proto.SCALAR_KINDS:
            raise InvalidArgument(f"scalar kind {kind!r}: use one of {sorted(proto.SCALAR_KINDS)}")
        code = int(proto.SCALAR_KINDS[kind])
        self._scalars.append((self._named(name), code))
        return GraphScalar(self, len(self._scalars) - 1, code)

    def bind(self, name: str, shape: int | Sequence[int], dtype: Any = "float32") -> GraphTensor:
        """A device tensor of the caller's, chosen per replay (a KV cache, an output of its own)."""
        dims, np_dtype = dims_of(shape), graph_dtype(dtype)
        self._binds.append((self._named(name), np_dtype.name, dims))
        return GraphTensor(self, ArgKind.BIND, len(self._binds) - 1, np_dtype, dims)

    def empty(self, shape: int | Sequence[int], dtype: Any = "float32") -> GraphTensor:
        """An intermediate: memory of the graph's, kept between replays (not cleared)."""
        dims, np_dtype = dims_of(shape), graph_dtype(dtype)
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

    def state(self, tensor: Any, rows: int) -> GraphTensor:
        """In a slot graph (`gpu.graph(name, slots=P)`): `tensor`, of P rows (row s is slot s's), is
        state each session keeps in its own slot; the steps of this instance see its first `rows` rows."""
        if not self.slots:
            raise InvalidArgument(f"graph {self.name!r} has no slots: record it with gpu.graph(name, slots=P)")
        ref = self._client._ref_of(tensor)
        if isinstance(ref, proto.TensorView):
            raise InvalidArgument(f"graph {self.name!r}: state is a whole tensor, not a view")
        if not tensor.shape or tensor.shape[0] != self.slots or not 0 < rows <= self.slots:
            raise InvalidArgument(
                f"graph {self.name!r}: state of {self.slots} rows, seen {rows} at a time; got {list(tensor.shape)}"
            )
        self._client._hold(tensor)
        seen = (rows, *tensor.shape[1:])
        self._state.append((int(ArgKind.TENSOR), ref))
        self._views.append(((int(ArgKind.TENSOR), ref), seen))
        return GraphTensor(self, ArgKind.VIEW, len(self._views) - 1, host_dtype(tensor.dtype), seen)

    def feed(self, output: str, *, into: str) -> None:
        """In a multi-step replay (`Step.replay_steps`), output `output` of each step becomes input
        `into` of the next, copied on the device (one dtype, as many elements)."""
        self._feeds.append((output, into))

    def _ref(self, value: Any) -> proto.Arg:
        if isinstance(value, GraphTensor):
            if value.graph is not self:
                raise InvalidArgument(f"{value!r} belongs to another graph")
            return (value.kind, value.index)
        ref = self._client._ref_of(value)
        self._client._hold(value)  # a built graph holds the memory: never reused as another op's output
        if isinstance(ref, proto.TensorView):  # a session view: recorded as a view of its base
            whole_view(f"graph {self.name!r}", value)
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
            self.rows,
            tuple(self._feeds),
            self.slots,
            tuple(self._state),
            tuple(self._pads),
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
            [(n, proto.SCALAR_NAMES[ArgKind(k)]) for n, k in self._scalars],
            [(n, d) for n, d, _ in self._binds],
            [n for n, _ in self._outputs],
            dict(self._feeds),
        )


__all__ = ["Graph", "GraphScalar", "GraphTensor", "Step"]

"""A built (or opened) replay graph: replayed with fresh inputs in one message, or launched like a
dispatch (see gpud_client.graphs)."""

from __future__ import annotations

import math
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import numpy as np

import gpud_protocol as proto
from gpud_client import packing
from gpud_client.dtypes import exact_bits, from_storage, host_dtype, is_bfloat16, storage_dtype
from gpud_client.errors import InvalidArgument
from gpud_client.graph_tensors import whole_view
from gpud_client.naps import Expected

if TYPE_CHECKING:
    from gpud_client.client_base import ClientBase

ALIGN = 256  # the packing of a replay's inputs: each at an offset aligned to this many bytes


class Step:
    """A built (or opened) graph: replay it with keyword arguments named after its inputs, scalars
    and bound tensors."""

    def __init__(
        self,
        client: ClientBase,
        handle: int,
        name: str,
        device: int,
        inputs: list[tuple[str, str]],
        scalars: list[tuple[str, str]],
        binds: list[tuple[str, str]],
        outputs: list[str],
        feeds: dict[str, str] | None = None,
    ) -> None:
        self._client = client
        self.handle = handle
        self.name = name
        self.device = device
        self.inputs = inputs
        self.scalars = scalars
        self.binds = binds
        self.outputs = outputs
        self.feeds = feeds or {}  # output -> the input it feeds in `replay_steps`
        self.freed = False
        self._fed_like: dict[str, Any] | None = None  # zeros like the fed inputs of the last replay_steps
        self._names = frozenset(name for name, _ in (*inputs, *scalars, *binds))  # what a replay is given
        self._expected = Expected()  # how long replays took: when a spinning session spins for the next

    async def replay(self, **values: Any) -> dict[str, np.ndarray[Any, Any]]:
        """One message; resolves with the outputs by name."""
        client = self._client
        seq = client._next_seq()
        client._queue_packed(packing.graph_run(self._op(proto.Replay, seq, values)), request=seq)
        header, data = await client._connection.request(seq, self._expected)
        return _outputs(header, data, 1)[0]

    def replay_steps(
        self, steps: int, *, chain: bool = False, **values: Any
    ) -> Coroutine[Any, Any, dict[str, np.ndarray[Any, Any]]]:
        """`steps` replays back to back in one message: each output that feeds an input (`Graph.feed`)
        is copied into that input of the next step on the device. A fed input takes its first step's
        value; every other input takes one value per step, stacked on a new leading axis of `steps`;
        scalars and bound tensors are the same for every step. Resolves with each output stacked the
        same way: (steps, *shape). Of a row-independent graph, the daemon launches it together with the
        other sessions' replays of as many steps (each session's rows of every step its own).

        The message is sent when this is called; await what it returns for the outputs. `chain=True`
        starts from the device: the fed inputs (left out) take the fed outputs of the last step of this
        session's previous `replay_steps` of the graph, so the next window of steps can be sent before
        the last one has answered (a graph that merges with other sessions' replays cannot chain)."""
        if type(steps) is not int or not 1 <= steps <= self._client.limits.max_replay_steps:
            raise InvalidArgument(f"steps is an int from 1 to {self._client.limits.max_replay_steps}, not {steps!r}")
        fed = set(self.feeds.values())
        if chain:
            values = self._chained(values, fed)
        per_step = []
        for k in range(steps):
            step = dict(values)
            for name, _ in self.inputs:
                if name not in values:
                    continue
                if name in fed:
                    step[name] = values[name] if k == 0 else _like(values[name])
                else:
                    stacked = values[name]
                    if len(stacked) != steps:
                        raise InvalidArgument(
                            f"graph {self.name!r} input {name!r}: one value per step, stacked ({steps}, ...); "
                            f"got {len(stacked)}"
                        )
                    step[name] = stacked[k]
            per_step.append(step)
        client = self._client
        seq = client._next_seq()
        op = self._op(proto.ReplaySteps, seq, per_step[0], per_step, steps)._replace(chain=chain)
        client._queue_packed(packing.graph_run(op), seq)
        self._fed_like = {name: _like(values[name]) for name in fed if name in values}
        return _stacked(client._connection.submit(seq), steps)

    def _chained(self, values: dict[str, Any], fed: set[str]) -> dict[str, Any]:
        """A chained replay's values: its fed inputs' placeholders (the daemon does not read them)."""
        if given := sorted(fed & values.keys()):
            raise InvalidArgument(f"graph {self.name!r}: with chain=True the fed inputs {given} come from the device")
        if not fed or self._fed_like is None:
            raise InvalidArgument(
                f"graph {self.name!r}: chain=True continues an earlier replay_steps of a graph with feeds"
            )
        return {**values, **self._fed_like}

    def launch(self, **values: Any) -> None:
        """Queued like a dispatch: no round trip, no readback (results stay in bound tensors)."""
        self._op_queued(values)

    def _op_queued(self, values: dict[str, Any]) -> None:
        client = self._client
        client._queue_packed(packing.graph_run(self._op(proto.Launch, client._next_seq(), values)))

    def _op(
        self,
        kind: type[Any],
        seq: int,
        values: dict[str, Any],
        per_step: list[dict[str, Any]] | None = None,
        n: int = 1,
    ) -> Any:
        if self.freed:
            raise InvalidArgument(f"graph {self.name!r} is freed")
        if values.keys() != self._names:
            if unknown := set(values) - self._names:
                raise InvalidArgument(f"graph {self.name!r} has no input, scalar or bound tensor {sorted(unknown)}")
            raise InvalidArgument(f"graph {self.name!r} needs {sorted(self._names - set(values))}")
        arrays = [host_input(self.name, name, dtype, values[name]) for name, dtype in self.inputs]
        each = [arrays]  # every step's inputs (`per_step[0]` is `values`)
        if per_step:
            each += [
                [host_input(self.name, name, dtype, step[name]) for name, dtype in self.inputs] for step in per_step[1:]
            ]
            if any(a.shape != b.shape for later in each[1:] for a, b in zip(later, arrays, strict=True)):
                raise InvalidArgument(f"graph {self.name!r}: every step's inputs need the shapes of the first step's")
        binds: tuple[Any, ...] = ()
        if self.binds:  # checked before the frame is queued
            binds = tuple([self._client._ref_of(values[name]) for name, _ in self.binds])
            for (name, _), ref in zip(self.binds, binds, strict=True):
                if isinstance(ref, proto.TensorView):
                    whole_view(f"graph {self.name!r} bound tensor {name!r}", values[name])
        frame = -1
        if arrays:
            packed = packed_inputs(each)
            queue = self._client._connection.queue
            index = queue.add_frame(packed)
            if index is None:
                self._client._connection.send_batch()
                index = queue.add_frame(packed)
            frame = int(index or 0)
        scalars = tuple([float(values[name]) if sort == "f32" else int(values[name]) for name, sort in self.scalars])
        shapes = tuple([a.shape for a in arrays])
        if kind is proto.ReplaySteps:
            return kind(seq, self.handle, frame, shapes, scalars, binds, n)
        return kind(seq, self.handle, frame, shapes, scalars, binds)

    def free(self) -> None:
        if not self.freed:
            self.freed = True
            client = self._client
            client._queue(proto.FreeGraph(client._next_seq(), self.handle))

    def __repr__(self) -> str:
        return f"<gpud graph {self.name!r} #{self.handle} device {self.device}>"


def packed_inputs(steps: list[list[np.ndarray[Any, Any]]]) -> bytes:
    """A replay's input frame: each step's inputs one after another, each at an offset aligned to ALIGN
    bytes (zeros between them), the steps one after another (each packed alike). One copy of the data."""
    chunks: list[Any] = []
    for arrays in steps:
        for array in arrays:  # C-ordered (`host_input`): its buffer is its bytes
            chunks.append(array)
            if pad := -array.nbytes % ALIGN:
                chunks.append(_ZEROS[:pad])
    return b"".join(chunks)


_ZEROS = bytes(ALIGN)


async def _stacked(reply: Coroutine[Any, Any, Any], steps: int) -> dict[str, np.ndarray[Any, Any]]:
    header, data = await reply
    outs = _outputs(header, data, steps)
    return {name: np.stack([out[name] for out in outs]) for name in outs[0]} if outs else {}


def _outputs(header: dict[str, Any], data: Any, steps: int) -> list[dict[str, np.ndarray[Any, Any]]]:
    """Each step's outputs by name, from a reply's packed data (the steps one after another)."""
    raw = b"" if data is None else data  # a frame's buffer, or an assembled uint8 array
    layout = header.get("outputs", ())
    view = memoryview(raw)
    size = view.nbytes // steps if steps > 1 else 0  # a step's bytes
    copy = view.readonly  # a ZeroMQ frame's; a ring's reply and assembled parts are this reply's own
    outs: list[dict[str, np.ndarray[Any, Any]]] = []
    for k in range(steps):
        out: dict[str, np.ndarray[Any, Any]] = {}
        for name, dtype, shape, offset in layout:
            stored = host_dtype(dtype)
            elements = np.frombuffer(raw, storage_dtype(stored), math.prod(shape), k * size + offset)
            out[name] = from_storage(elements, stored, copy=copy).reshape(shape)
        outs.append(out)
    return outs


def _like(first: Any) -> Any:
    """A later step's value of a fed input: overwritten on the device, so zeros of the first's shape."""
    return np.zeros_like(np.asarray(first))


def host_input(graph: str, name: str, dtype: str, value: Any) -> np.ndarray[Any, Any]:
    """A replay's input as given: of the input's dtype exactly, as `Tensor.upload` takes data (host
    data is never converted: `gpu.tensor(a)` keeps a's dtype too). A bfloat16 input takes float32
    values, rounded to nearest even, or ml_dtypes.bfloat16 ones: its bits are sent."""
    if is_bfloat16(dtype):  # (of the name: a numpy dtype's name takes microseconds)
        try:
            return exact_bits(value, f"graph {graph!r} input {name!r}")
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
    array = np.asarray(value, order="C")
    if array.dtype != host_dtype(dtype):  # (numpy's dtype of the name, kept)
        raise InvalidArgument(
            f"graph {graph!r} input {name!r} is {dtype}, got {array.dtype}: convert it first "
            f"(np.asarray(value, {dtype!r}))"
        )
    return array

"""A built (or opened) replay graph: replayed with fresh inputs in one message, or launched like a
dispatch (see gpud_client.graphs)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

import gpud_protocol as proto
from gpud_client.dtypes import exact_bits, from_storage, host_dtype, is_bfloat16
from gpud_client.errors import InvalidArgument
from gpud_client.graph_tensors import whole_view

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
        arrays = [host_input(self.name, name, dtype, values[name]) for name, dtype in self.inputs]
        binds = tuple(self._client._ref_of(values[name]) for name, _ in self.binds)  # checked before a frame is queued
        for (name, _), ref in zip(self.binds, binds, strict=True):
            if isinstance(ref, proto.TensorView):
                whole_view(f"graph {self.name!r} bound tensor {name!r}", values[name])
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


def host_input(graph: str, name: str, dtype: str, value: Any) -> np.ndarray[Any, Any]:
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

"""Tensors, handles and the resident store.

A `Tensor` is a device buffer with dtype and shape and a reference count: each session handle
that names it holds one reference, and a published name holds one more. The buffer is released
(after its last use completes) when the count drops to zero, so a resident tensor outlives the
session that made it and its memory is held once however many sessions open it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gpud.backends.base import Backend, Buffer
from gpud_protocol.errors import AlreadyExists, NotFound, PermissionDenied


@dataclasses.dataclass(eq=False)
class Tensor:
    buffer: Buffer
    dtype: str
    shape: tuple[int, ...]
    owner: str  # session id that allocated it
    charged: bool = True  # counted in the owner's quota while the owner holds its handle
    refs: int = 1
    name: str | None = None  # set while published
    mode: str = "rw"  # the publisher's mode for other sessions
    publisher: str = ""  # session id that published it

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes


@dataclasses.dataclass(eq=False)
class Handle:
    tensor: Tensor
    writable: bool


class ResidentStore:
    def __init__(self, backend: Backend, is_connected: Callable[[str], bool] = lambda _session: False) -> None:
        self._backend = backend
        self._is_connected = is_connected  # session id -> still connected?
        self._by_name: dict[str, Tensor] = {}

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self._by_name.values())

    def publish(self, tensor: Tensor, name: str, mode: str, by: str) -> None:
        if name in self._by_name:
            raise AlreadyExists(f"a resident tensor named {name!r} exists")
        if tensor.name is not None:
            raise AlreadyExists(f"tensor is already published as {tensor.name!r}")
        tensor.name, tensor.mode, tensor.publisher = name, mode, by
        tensor.refs += 1
        self._by_name[name] = tensor

    def open(self, name: str) -> Tensor:
        tensor = self._lookup(name)
        tensor.refs += 1
        return tensor

    def unpublish(self, name: str, by: str) -> None:
        """Remove a name. A read-only one only by its publisher while the publisher is connected,
        so that a reader cannot take shared weights away from everyone else."""
        tensor = self._lookup(name)
        if tensor.mode == "ro" and tensor.publisher != by and self._is_connected(tensor.publisher):
            raise PermissionDenied(f"{name!r} is read-only and its publishing session is still connected")
        del self._by_name[name]
        tensor.name = None
        self.drop(tensor)

    def drop(self, tensor: Tensor) -> None:
        """Release one reference; the last one frees the buffer once its work completes."""
        tensor.refs -= 1
        if tensor.refs == 0:
            self._backend.release(tensor.buffer)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def _lookup(self, name: str) -> Tensor:
        try:
            return self._by_name[name]
        except KeyError:
            raise NotFound(f"no resident tensor named {name!r}") from None

    def clear(self) -> None:
        for tensor in list(self._by_name.values()):
            self.unpublish(tensor.name or "", by=tensor.publisher)

"""The resident store: tensors published under a name, shared by every session.

Bounded by count and bytes (daemon-wide). A name is removed by `unpublish`; the memory goes once
the name and the last handle are gone. A read-only name is removed only by its publisher while the
publisher is connected, so a reader cannot take shared weights away from everyone else.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from gpud.session.tensors import Tensor
from gpud_protocol.errors import AlreadyExists, NotFound, OutOfMemory, PermissionDenied


class ResidentStore:
    def __init__(
        self,
        release: Callable[[Tensor], None],
        is_connected: Callable[[str], bool] = lambda _session: False,
        max_count: int = 4096,
        max_bytes: int = 64 << 30,
    ) -> None:
        self._release = release  # frees a tensor's buffer once its work completed
        self._is_connected = is_connected  # session id -> still connected?
        self._by_name: dict[str, Tensor] = {}
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._by_name)

    def publish(self, tensor: Tensor, name: str, mode: str, by: str) -> None:
        if name in self._by_name:
            raise AlreadyExists(f"a resident tensor named {name!r} exists")
        if tensor.name is not None:
            raise AlreadyExists(f"tensor is already published as {tensor.name!r}")
        if len(self._by_name) >= self.max_count:
            raise OutOfMemory(f"the daemon holds {self.max_count} resident tensors, its limit")
        if self.nbytes + tensor.nbytes > self.max_bytes:
            raise OutOfMemory(
                f"publishing {tensor.nbytes} bytes would exceed the daemon's resident limit of {self.max_bytes} "
                f"({self.nbytes} in use)"
            )
        tensor.name, tensor.mode, tensor.publisher = name, mode, by
        tensor.refs += 1
        self._by_name[name] = tensor
        self.nbytes += tensor.nbytes

    def open(self, name: str) -> Tensor:
        tensor = self._lookup(name)
        tensor.refs += 1
        return tensor

    def unpublish(self, name: str, by: str) -> None:
        tensor = self._lookup(name)
        if tensor.mode == "ro" and tensor.publisher != by and self._is_connected(tensor.publisher):
            raise PermissionDenied(f"{name!r} is read-only and its publishing session is still connected")
        del self._by_name[name]
        self.nbytes -= tensor.nbytes
        tensor.name = None
        if tensor.charged_to is not None:
            tensor.charged_to.uncharge_if_unheld(tensor)
        self.drop(tensor)

    def drop(self, tensor: Tensor) -> None:
        """Release one reference; the last one frees the buffer once its work completes."""
        tensor.refs -= 1
        if tensor.refs == 0:
            self._release(tensor)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def matching(self, prefix: str, after: str, limit: int) -> tuple[list[tuple[str, Tensor]], int]:
        """The published names that start with `prefix` and sort after `after` ("": from the first), in
        name order, at most `limit` of them with their tensors; and how many start with `prefix`."""
        names = sorted(name for name in self._by_name if name.startswith(prefix))
        start = bisect.bisect_right(names, after) if after else 0
        return [(name, self._by_name[name]) for name in names[start : start + limit]], len(names)

    def _lookup(self, name: str) -> Tensor:
        try:
            return self._by_name[name]
        except KeyError:
            raise NotFound(f"no resident tensor named {name!r}") from None

    def clear(self) -> None:
        for tensor in list(self._by_name.values()):
            self.unpublish(tensor.name or "", by=tensor.publisher)

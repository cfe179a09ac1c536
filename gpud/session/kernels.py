"""The kernels a session registered: one handle per distinct (source, entry, options), compiled per
device on first use there, and the check of a dispatch's arguments against the kernel's interface."""

from __future__ import annotations

import dataclasses
import hashlib

from gpud.backends.base import Program
from gpud_protocol import KernelOptions
from gpud_protocol.errors import InvalidArgument, OutOfMemory

KernelKey = tuple[str, str, KernelOptions]


@dataclasses.dataclass(eq=False)
class KernelRef:
    handle: int
    source: str
    entry: str
    options: KernelOptions
    first: Program  # as compiled on the session's default device: what the reply described
    programs: dict[int, Program]  # device index -> program

    def check_arguments(self, program: Program, tensors: int, scalars: tuple[str, ...]) -> None:
        """The dispatch's arguments against what the backend knows of the kernel's parameters."""
        if program.tensors is not None and tensors != program.tensors:
            raise InvalidArgument(f"kernel {self.entry} takes {program.tensors} tensor arguments, {tensors} given")
        if program.scalars is not None and scalars != program.scalars:
            want = ", ".join(program.scalars) or "none"
            got = ", ".join(scalars) or "none"
            raise InvalidArgument(
                f"kernel {self.entry} takes scalars ({want}), the dispatch passes ({got}); "
                "Python floats go as f32 and ints as i32: use gpud_client.u32/i32/f32 to say which"
            )


class KernelTable:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_handle: dict[int, KernelRef] = {}
        self._by_key: dict[KernelKey, KernelRef] = {}

    def __len__(self) -> int:
        return len(self._by_handle)

    def __contains__(self, handle: object) -> bool:
        return handle in self._by_handle

    def get(self, handle: int) -> KernelRef | None:
        return self._by_handle.get(handle)

    def find(self, source: str, entry: str, options: KernelOptions) -> KernelRef | None:
        """The kernel this session registered already with the same source, entry and options."""
        return self._by_key.get(_key(source, entry, options))

    def check_room(self) -> None:
        if len(self._by_handle) >= self.capacity:
            raise OutOfMemory(f"more than {self.capacity} distinct kernels in this session")

    def add(
        self, handle: int, source: str, entry: str, options: KernelOptions, device: int, program: Program
    ) -> KernelRef:
        key = _key(source, entry, options)
        if (existing := self._by_key.get(key)) is not None:  # registered meanwhile (two requests in flight)
            return existing
        self.check_room()
        kernel = KernelRef(handle, source, entry, options, program, {device: program})
        self._by_handle[handle] = kernel
        self._by_key[key] = kernel
        return kernel

    def clear(self) -> None:
        self._by_handle.clear()
        self._by_key.clear()


def _key(source: str, entry: str, options: KernelOptions) -> KernelKey:
    return (hashlib.sha256(source.encode(errors="surrogatepass")).hexdigest(), entry, options)

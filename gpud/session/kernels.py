"""The kernels a session registered: one handle per distinct (source, entry, options), compiled per
device on first use there, and the check of a dispatch's arguments against the kernel's interface.

A built-in kernel's rule sees only the tensors' geometry and the scalars, never which tensors they
are: the arguments it passed are kept (bounded), so a step that makes new tensors of the same shapes
every time (an eager forward) is checked once per distinct call, not once per dispatch."""

from __future__ import annotations

import dataclasses
import hashlib

from gpud.backends.base import Program
from gpud_protocol import KernelOptions, LruCache
from gpud_protocol.errors import InvalidArgument, OutOfMemory
from gpud_protocol.ops import KernelSpec, OpError, TensorInfo

KernelKey = tuple[str, str, KernelOptions]
VERIFIED_KEPT = 256  # distinct calls of one kernel whose passing of its rule is kept
FAILURES_KEPT = 64  # handles whose registration failed, with why: what a dispatch naming one is told


@dataclasses.dataclass(eq=False)
class KernelRef:
    handle: int
    source: str
    entry: str
    options: KernelOptions
    first: Program  # as compiled on the session's default device: what the reply described
    programs: dict[int, Program]  # device index -> program
    builtin: KernelSpec | None = None  # a kernel of the op library: its interface is known exactly
    _writes: frozenset[int] | None = dataclasses.field(init=False)  # a built-in kernel's
    _scalar_kinds: tuple[str, ...] = dataclasses.field(init=False)  # a built-in kernel's
    early: tuple[int, ...] = dataclasses.field(init=False)  # tensors it reads before waiting (KernelSpec.early)
    _verified: LruCache[tuple[tuple[TensorInfo, ...], tuple[int | float, ...]], bool] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        builtin = self.builtin
        self._writes = None if builtin is None else frozenset(builtin.writes)
        self._scalar_kinds = () if builtin is None else tuple(kind for _name, kind in builtin.scalars)
        self.early = () if builtin is None else builtin.early
        self._verified = LruCache(VERIFIED_KEPT)

    def early_problem(self, position: int, what: str) -> str:
        """Why `what` may not be the tensor argument at early position `position`."""
        spec = self.builtin
        assert spec is not None
        return (
            f"{spec.op} ({spec.name}) reads its {spec.tensors[position]} argument before the kernel before it has "
            f"finished, so it takes a read-only resident there (a tensor opened read-only), fixed in a replay "
            f"graph that writes it nowhere; not {what}"
        )

    def writes(self, program: Program) -> frozenset[int] | None:
        return self._writes if self.builtin is not None else program.writes

    def check_op(self, tensors: list[TensorInfo], scalars: list[int | float]) -> None:
        """A built-in kernel's rule (gpud_protocol.ops), the same the client follows."""
        if self.builtin is None:
            return
        key = (tuple(tensors), tuple(scalars))  # the scalars' kinds were checked: equal values, equal types
        if self._verified.get(key) is not None:
            return
        try:
            self.builtin.verify(tensors, scalars)
        except (OpError, ValueError) as exc:
            raise InvalidArgument(f"{self.builtin.op} ({self.builtin.name}): {exc}") from None
        self._verified.put(key, True)

    def writes_read_only(self, position: int, resident: str | None, scalars: list[int | float]) -> str:
        """Why a dispatch may not pass read-only resident `resident` as tensor argument `position`."""
        what = f"read-only resident {resident!r}" if resident else "a read-only resident"
        if self.builtin is not None:  # the op library's: name the op the user called and the argument
            spec = self.builtin
            return (
                f"{spec.op_name(scalars)} ({spec.name}) writes its {spec.tensors[position]} argument, and that "
                f"is {what}: write into a tensor of your own"
            )
        return (
            f"tensor argument {position} is {what} and kernel {self.entry} may write it "
            "(declare writes=[...] when registering a kernel that only reads it)"
        )

    def check_arguments(self, program: Program, tensors: int, scalars: tuple[str, ...]) -> None:
        """The dispatch's arguments against what the backend knows of the kernel's parameters."""
        if self.builtin is not None:
            if tensors != len(self.builtin.tensors) or scalars != self._scalar_kinds:
                raise InvalidArgument(
                    f"{self.builtin.op} ({self.builtin.name}) takes tensors {list(self.builtin.tensors)} and "
                    f"scalars {list(self.builtin.scalars)}"
                )
            return
        if program.tensors is not None and tensors != program.tensors:
            raise InvalidArgument(f"kernel {self.entry} takes {program.tensors} tensor arguments, {tensors} given")
        if program.scalars is not None and scalars != program.scalars:
            wanted = ", ".join(program.scalars) or "none"
            given = ", ".join(scalars) or "none"
            raise InvalidArgument(
                f"kernel {self.entry} takes scalars ({wanted}), the dispatch passes ({given}); "
                "Python floats go as f32 and ints as i32: use gpud_client.u32/i32/f32 to say which"
            )


class KernelTable:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_handle: dict[int, KernelRef] = {}
        self._by_key: dict[KernelKey, KernelRef] = {}
        self._failures: LruCache[int, str] = LruCache(FAILURES_KEPT)

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, handle: object) -> bool:
        return handle in self._by_handle

    def get(self, handle: int) -> KernelRef | None:
        return self._by_handle.get(handle)

    def failed(self, handle: int, entry: str, why: str) -> None:
        """The registration of `handle` failed: a dispatch that names it is told why, not just that the
        handle is unknown (the op library registers its kernels unawaited, so its user sees the
        dispatch's error first)."""
        self._failures.put(handle, f"kernel {entry} (handle {handle}) could not be registered: {why}")

    def unknown(self, handle: int) -> str:
        """Why a dispatch naming `handle` finds no kernel."""
        return self._failures.get(handle) or f"unknown kernel handle {handle}"

    def find(self, source: str, entry: str, options: KernelOptions) -> KernelRef | None:
        """The kernel this session registered already with the same source, entry and options."""
        return self._by_key.get(_key(source, entry, options))

    def check_room(self) -> None:
        if len(self._by_handle) >= self.capacity:
            raise OutOfMemory(f"more than {self.capacity} distinct kernels in this session")

    def add(
        self,
        handle: int,
        key: tuple[str, str, KernelOptions],
        source: str,
        entry: str,
        options: KernelOptions,
        device: int,
        program: Program,
        builtin: KernelSpec | None = None,
    ) -> KernelRef:
        """`key`: what the client registered (source, entry, options); `source` and `options`: what
        compiles (a built-in kernel's family source)."""
        dedup = _key(*key)
        if (existing := self._by_key.get(dedup)) is not None:  # registered meanwhile (two requests in flight)
            return existing
        self.check_room()
        kernel = KernelRef(handle, source, entry, options, program, {device: program}, builtin)
        self._failures.pop(handle)
        self._by_handle[handle] = kernel
        self._by_key[dedup] = kernel
        return kernel

    def alias(self, handle: int, kernel: KernelRef) -> None:
        """Another handle for a registered kernel (a client that registered it again under a new one)."""
        self._failures.pop(handle)
        self._by_handle[handle] = kernel

    def clear(self) -> None:
        self._by_handle.clear()
        self._by_key.clear()
        self._failures.clear()


def _key(source: str, entry: str, options: KernelOptions) -> KernelKey:
    return (hashlib.sha256(source.encode(errors="surrogatepass")).hexdigest(), entry, options)

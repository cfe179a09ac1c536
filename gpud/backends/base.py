"""The backend contract, documented once: what a `Device` promises and who calls what, from where.

A backend drives one GPU (one CUDA device, one WebGPU adapter, one fake device). Everything
above it is backend-neutral: `gpud.runtime.DeviceRuntime` owns the flush policy, the completion
ledger, the staging pools and the caches, and calls these primitives. Implementations
(`cuda/`, `webgpu/`, `fake.py`) do not repeat this documentation.

Threads. Every method runs on the event-loop thread except `compile` (a compile worker), and
`submit`, `free` and `destroy_staging` (the submit worker, in order with the submits; `submit`
also on the loop thread when the device is idle and it cannot block). None of those touches the
pending command buffer or any state the loop thread uses; `forget` does the loop thread's part
of a free. A device whose submit blocks while earlier work runs (lavapipe) sets `serial_submits`:
the worker then waits, outside the driver, for the previous submission before the next, so no
call on the loop thread ever queues behind a blocked submit.

The pending command buffer. `encode_*` append to it in op order; `take_commands` closes it and
returns an opaque object that `submit` hands to the device; `watch` then arranges for
`done(error)` to be called on the loop thread once the device has finished that submission.
Completions arrive in submission order. `done(None)`: finished. `done(SubmissionFailed)`: the
device refused this submission but is fine. Any other error: the device is lost.

Memory. `alloc` returns a zero-filled allocation (or encodes the zero fill, see `zero_on_alloc`)
and raises OutOfMemory when the device has none left; `free` is called only after every
submission that used the allocation has completed. Staging buffers are host-visible: the runtime
fills an upload staging with `write_staging` before encoding the copy, and reads a download
staging with `read_staging` only after the submission that filled it completed (on WebGPU,
completion is the staging buffer's map). `recycle_staging` makes one ready for reuse.

Programs. `compile` turns source into a `Program` (raising CompileError with the compiler's log,
or InvalidArgument), saying which tensor arguments it writes and which scalars it takes, as far as
the backend can tell; `prepare` checks a dispatch against it (argument count, kinds, aliasing,
grid) and packs it once, so that `encode_dispatch` of the packed form is as cheap as possible.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from typing import Any, ClassVar, NamedTuple

from gpud_protocol import ArgKind, KernelOptions
from gpud_protocol.errors import DeviceLost, InternalError, InvalidArgument


class SubmissionFailed(InternalError):
    """A submission was refused without losing the device (a validation error the daemon did not
    catch before encoding). Its ops failed; the device goes on."""


Done = Callable[[BaseException | None], None]
Scalar = tuple[int, int | float]  # (ArgKind, value)


@dataclasses.dataclass(eq=False, slots=True)
class Buffer:
    """`nbytes` of device memory: an allocation (the backend may round its real size up), or a view
    at `offset` into one (a graph's intermediates in its arena); backends honour `offset` wherever
    they take a Buffer, and the runtime adds it to the offsets it passes with a native."""

    id: int
    nbytes: int
    native: Any
    device: int  # index of the runtime that owns it
    last_use: int = 0  # number of the last submission that uses it; 0: never used
    offset: int = 0
    base: Buffer | None = None  # a view's allocation, marked used with it (its release waits for the view's uses)


Arg = Buffer | Scalar


@dataclasses.dataclass(eq=False)
class Program:
    """A compiled kernel on one device."""

    key: tuple[Any, ...]
    entry: str
    native: Any
    tensors: int | None  # tensor arguments it takes; None: unknown
    scalars: tuple[str, ...] | None  # kinds ("f32", "i32", "u32") of its scalars, in order; None: unknown
    writes: frozenset[int] | None  # positions among tensor args it may write; None: all of them
    unchecked: tuple[str, ...] = ()  # what the daemon could not check about it, for the kernel's reply
    # Per tensor argument, where the backend refuses one buffer bound with two accesses in one
    # dispatch (WebGPU: "read" | "read_write"); None: no such rule, or the access is unknown.
    access: tuple[str, ...] | None = None


def program_key(source: str, entry: str, options: KernelOptions, *extra: Any) -> tuple[Any, ...]:
    """Exact cache key: a hash of the source plus every option as a separate tuple member."""
    digest = hashlib.sha256(source.encode(errors="surrogatepass")).hexdigest()
    return (digest, entry, options.block, options.flags, options.writes, options.shared, *extra)


def memory_key(buffer: Buffer) -> Hashable:
    """The allocation `buffer` is (a view is its base's): what WebGPU calls one buffer."""
    native = buffer.native
    return native if type(native) is int else id(native)  # cuda: a device pointer; else an object


def same_memory(a: Buffer, b: Buffer) -> bool:
    """One allocation: WebGPU refuses a copy between a buffer and itself, whatever the ranges."""
    return memory_key(a) == memory_key(b)


# ---------------------------------------------------------------------- recorded steps (replay graphs)


class Var(NamedTuple):
    """A scalar argument set per replay: the replay's value number `value`, of ArgKind `kind`."""

    value: int
    kind: int


class DispatchStep(NamedTuple):
    program: Program
    grid: tuple[int, int, int]
    args: tuple[Buffer | Scalar | Var, ...]


class CopyStep(NamedTuple):
    src: Buffer
    src_offset: int
    dst: Buffer
    dst_offset: int
    nbytes: int


GraphStep = DispatchStep | CopyStep


class Device(ABC):
    kind: ClassVar[str]
    #: the largest workgroup/block count per grid dimension
    max_grid: tuple[int, int, int] = ((1 << 31) - 1, 65535, 65535)
    #: alloc returns zeroed memory; else the runtime encodes `encode_zero` after it
    zero_on_alloc: bool = True
    #: a software rasteriser (lavapipe): slow, and every shader loop stops at 65,535 iterations
    software: bool = False
    #: submit blocks while earlier work runs: keep one submission on the device at a time
    serial_submits: bool = False
    #: compiles that may run at once, each on a worker thread of its own (a compiler that releases the GIL)
    compile_threads: int = 1
    #: prepare may record work on its buffers that goes with the next submission (WebGPU's
    #: validation probes): the runtime keeps those buffers alive until it completes
    prepare_uses_buffers: bool = False

    def __init__(self, index: int, loop: asyncio.AbstractEventLoop) -> None:
        self.index = index
        self.loop = loop
        #: set by the runtime: call (on the loop thread) when the device is lost outside a submission
        self.on_lost: Callable[[DeviceLost], None] = lambda _error: None

    @abstractmethod
    def info(self) -> dict[str, Any]:
        """Name, vendor, memory: what the welcome tells clients about this device."""

    def memory(self) -> tuple[int, int] | None:
        """(free, total) bytes of device memory, where the backend can tell."""
        return None

    # ------------------------------------------------------------------ memory

    @abstractmethod
    def alloc(self, nbytes: int) -> Any: ...

    def forget(self, native: Any) -> None:
        """The loop thread's part of freeing `native` (drop what refers to it), before `free`."""
        return None

    @abstractmethod
    def free(self, native: Any) -> None: ...

    def encode_zero(self, native: Any, nbytes: int) -> None:
        raise NotImplementedError

    @abstractmethod
    def make_staging(self, nbytes: int, upload: bool) -> Any: ...

    @abstractmethod
    def destroy_staging(self, staging: Any) -> None: ...

    @abstractmethod
    def write_staging(self, staging: Any, data: memoryview) -> None: ...

    @abstractmethod
    def read_staging(self, staging: Any, nbytes: int) -> bytes | memoryview: ...

    def recycle_staging(self, staging: Any, upload: bool, done: Callable[[bool], None]) -> None:
        done(True)

    def drop_caches(self) -> None:
        """Release what can be rebuilt (bind groups...) to free memory."""
        return None

    # ------------------------------------------------------------------ programs

    def program_key(self, source: str, entry: str, options: KernelOptions) -> tuple[Any, ...]:
        return program_key(source, entry, options, self.kind)

    @abstractmethod
    def compile(self, key: tuple[Any, ...], source: str, entry: str, options: KernelOptions) -> Program: ...

    @abstractmethod
    def prepare(self, program: Program, grid: tuple[int, int, int], args: Sequence[Arg]) -> Any: ...

    # ------------------------------------------------------------------ encoding

    @abstractmethod
    def encode_dispatch(self, packed: Any) -> None: ...

    @abstractmethod
    def encode_copy(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None: ...

    @abstractmethod
    def encode_upload(self, staging: Any, dst: Any, offset: int, nbytes: int) -> None: ...

    @abstractmethod
    def encode_download(self, src: Any, offset: int, staging: Any, nbytes: int) -> None: ...

    def peer_copy(self, other: Device) -> bool:
        """Whether `encode_peer_copy` can copy from this device into `other`'s memory, and markers order
        the work of the two devices on the devices themselves (below)."""
        return False

    def encode_peer_copy(
        self, src: Any, src_offset: int, other: Device, dst: Any, dst_offset: int, nbytes: int
    ) -> None:
        """Copy from this device's `src` into `other`'s `dst`, on this device's queue, in op order."""
        raise NotImplementedError

    def new_marker(self) -> Any:
        """A marker orders two devices' work on the devices: recorded in this device's queue (`encode_mark`),
        waited on in a peer's (`encode_wait`: the peer's later work runs after this device's work before the
        mark). Submit a wait only once the mark's submission was issued (its `submit` returned); drop the
        marker once every submission waiting on it has completed."""
        raise NotImplementedError

    def encode_mark(self, marker: Any) -> None:
        raise NotImplementedError

    def encode_wait(self, marker: Any) -> None:
        raise NotImplementedError

    def drop_marker(self, marker: Any) -> None:
        raise NotImplementedError

    @abstractmethod
    def take_commands(self) -> Any: ...

    @abstractmethod
    def submit(self, commands: Any) -> Any: ...

    @abstractmethod
    def watch(self, submitted: Any, done: Done, awaited: bool) -> None:
        """Call `done(error)` once `submitted` has completed, on the loop thread, in submission order:
        the runtime takes a report as covering every earlier submission too, and reads their
        stagings then. `awaited`: a client waits on this submission (a backend may poll briefly
        instead of handing the completion to another thread)."""

    # ------------------------------------------------------------------ replay graphs

    def instantiate(self, steps: Sequence[GraphStep]) -> Any:
        """A recorded step (`GraphStep`s over this device's buffers) in the form `encode_replay`
        encodes: here the packed dispatches and the places of their `Var` scalars."""
        plan: list[tuple[bool, Any, tuple[tuple[int, int, int, int], ...]]] = []
        for step in steps:
            if isinstance(step, CopyStep):
                src, dst = step.src, step.dst
                if same_memory(src, dst):  # the graph checked this: a last line before a refused submission
                    raise InvalidArgument("a recorded copy's source and destination are the same memory")
                item = (src.native, src.offset + step.src_offset, dst.native, dst.offset + step.dst_offset, step.nbytes)
                plan.append((False, item, ()))
                continue
            args: list[Arg] = []
            variables: list[tuple[int, int, int, int]] = []  # (argument position, scalar position, value, kind)
            scalars = 0
            for position, arg in enumerate(step.args):
                if type(arg) is Var:
                    variables.append((position, scalars, arg.value, arg.kind))
                    args.append((arg.kind, 0.0 if arg.kind == ArgKind.F32 else 0))
                else:
                    args.append(arg)
                if type(arg) is not Buffer:
                    scalars += 1
            packed = self.prepare(step.program, step.grid, args)
            plan.append((True, packed, tuple(variables)))
        return plan

    def encode_replay(self, native: Any, values: Sequence[int | float]) -> None:
        """Encode one replay of an instantiated step, its `Var` scalars set from `values`."""
        for is_dispatch, item, variables in native:
            if not is_dispatch:
                self.encode_copy(*item)
            elif variables:
                self.encode_dispatch(self.with_scalars(item, variables, values))
            else:
                self.encode_dispatch(item)

    def with_scalars(
        self, packed: Any, variables: Sequence[tuple[int, int, int, int]], values: Sequence[int | float]
    ) -> Any:
        """`packed` (from `prepare`) with the scalars at `variables` set from `values`."""
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        """Release the device; called once every submission has completed (or the device is lost)."""
        return None

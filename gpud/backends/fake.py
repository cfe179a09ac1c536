"""A fake backend for tests without a GPU: host memory, a worker thread as the "device", and a few
kernels written with numpy. Several fake devices exist (`GPUD_FAKE_DEVICES`, default 2), so the
placement, cross-device copies and per-device quotas run in CI. They copy to each other peer to peer,
ordered by markers (`GPUD_FAKE_PEER=0`: through host memory, as WebGPU devices do); a wait on a
marker whose mark was not issued first refuses its submission, where CUDA would not wait at all.

Kernel sources are `fake:<name>` with entry `<name>`; the kernels (`FAKE_KERNELS`) take their
tensors first, then their scalars, and process min(n, grid.x * 64) elements. `spin` holds the
device for `ms` milliseconds (a hung or slow device, for health tests).
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from gpud.backends.base import Arg, Buffer, Device, Done, Program
from gpud_protocol import KernelOptions
from gpud_protocol.errors import CompileError, InvalidArgument, OutOfMemory

GROUP = 64


def _f32(memory: bytearray) -> np.ndarray[Any, Any]:
    return np.frombuffer(memory, np.float32)


def _axpb(t: list[bytearray], a: float, b: float, n: int, count: int) -> None:
    x, y = _f32(t[0]), _f32(t[1])
    k = min(n, count, x.size, y.size)
    y[:k] = x[:k] * np.float32(a) + np.float32(b)


def _axpw(t: list[bytearray], a: float, n: int, count: int) -> None:
    x, w, y = _f32(t[0]), _f32(t[1]), _f32(t[2])
    k = min(n, count, x.size, w.size, y.size)
    y[:k] = x[:k] * np.float32(a) + w[:k]


def _add(t: list[bytearray], n: int, count: int) -> None:
    x, y, z = _f32(t[0]), _f32(t[1]), _f32(t[2])
    k = min(n, count, x.size, y.size, z.size)
    z[:k] = x[:k] + y[:k]


def _scale(t: list[bytearray], a: float, count: int) -> None:
    x, y = _f32(t[0]), _f32(t[1])
    k = min(count, x.size, y.size)
    y[:k] = x[:k] * np.float32(a)


def _spin(t: list[bytearray], ms: int, count: int) -> None:
    time.sleep(ms / 1000)


class FakeKernel(NamedTuple):
    run: Callable[..., None]
    tensors: int
    scalars: tuple[str, ...]
    writes: frozenset[int]


FAKE_KERNELS: dict[str, FakeKernel] = {
    "axpb": FakeKernel(_axpb, 2, ("f32", "f32", "u32"), frozenset({1})),
    "axpw": FakeKernel(_axpw, 3, ("f32", "u32"), frozenset({2})),
    "add": FakeKernel(_add, 3, ("u32",), frozenset({2})),
    "scale": FakeKernel(_scale, 2, ("f32",), frozenset({1})),
    "spin": FakeKernel(_spin, 1, ("u32",), frozenset()),
}


def device_count() -> int:
    return int(os.environ.get("GPUD_FAKE_DEVICES", "2"))


class _Submission:
    """Finished by the device thread; `watch` may come before or after."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._finished = False
        self._done: Done | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def finish(self) -> None:
        with self._lock:
            self._finished = True
            done, loop = self._done, self._loop
        if done is not None and loop is not None:
            loop.call_soon_threadsafe(done, None)

    def watch(self, loop: asyncio.AbstractEventLoop, done: Done) -> None:
        with self._lock:
            if not self._finished:
                self._done, self._loop = done, loop
                return
        done(None)


class FakeMarker:
    def __init__(self) -> None:
        self.issued = False  # a submission holding its mark was issued
        self.reached = threading.Event()  # the device ran the mark


class FakeDevice(Device):
    kind = "fake"

    def __init__(
        self, index: int, loop: asyncio.AbstractEventLoop, memory_bytes: int = 1 << 30, ordinal: int | None = None
    ) -> None:
        super().__init__(index, loop)
        self.ordinal = index if ordinal is None else ordinal  # the host's number for it: its name
        self.memory_bytes = memory_bytes
        self.used = 0
        self.peers = os.environ.get("GPUD_FAKE_PEER", "1") != "0"
        self._commands: list[tuple[Any, ...]] = []
        self._queue: queue.SimpleQueue[tuple[list[tuple[Any, ...]], _Submission] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._execute, name=f"gpud-fake-{index}", daemon=True)
        self._thread.start()

    def info(self) -> dict[str, Any]:
        return {"name": f"fake device {self.ordinal}", "vendor": "gpud", "memory_total": self.memory_bytes}

    def memory(self) -> tuple[int, int]:
        return self.memory_bytes - self.used, self.memory_bytes

    def alloc(self, nbytes: int) -> bytearray:
        if self.used + nbytes > self.memory_bytes:
            raise OutOfMemory(f"fake device {self.index} has {self.memory_bytes - self.used} bytes free")
        self.used += nbytes
        return bytearray(nbytes)

    def forget(self, native: Any) -> None:
        self.used -= len(native)

    def free(self, native: Any) -> None:
        pass

    def make_staging(self, nbytes: int, upload: bool) -> bytearray:
        return bytearray(nbytes)

    def destroy_staging(self, staging: Any) -> None:
        pass

    def write_staging(self, staging: Any, data: memoryview) -> None:
        staging[: data.nbytes] = data

    def read_staging(self, staging: Any, nbytes: int) -> bytes:
        return bytes(staging[:nbytes])

    def compile(self, key: tuple[Any, ...], source: str, entry: str, options: KernelOptions) -> Program:
        name = source.strip().removeprefix("fake:")
        kernel = FAKE_KERNELS.get(name)
        if kernel is None or not source.strip().startswith("fake:"):
            raise CompileError(f"the fake backend knows only fake:{{{','.join(FAKE_KERNELS)}}}")
        if entry != name:
            raise CompileError(f"no entry point {entry!r} in fake:{name}")
        writes = kernel.writes | frozenset(options.writes or ())
        return Program(key, entry, kernel, kernel.tensors, kernel.scalars, writes)

    def prepare(self, program: Program, grid: tuple[int, int, int], args: Sequence[Arg]) -> Any:
        kernel: FakeKernel = program.native
        tensors = [memoryview(arg.native)[arg.offset : arg.offset + arg.nbytes] for arg in args if type(arg) is Buffer]
        scalars = [arg[1] for arg in args if type(arg) is not Buffer]  # type: ignore[index]
        if len(tensors) != kernel.tensors or len(scalars) != len(kernel.scalars):
            raise InvalidArgument(f"{program.entry} takes {kernel.tensors} tensors and {len(kernel.scalars)} scalars")
        return (kernel.run, tensors, scalars, grid[0] * grid[1] * grid[2] * GROUP)

    def with_scalars(
        self, packed: Any, variables: Sequence[tuple[int, int, int, int]], values: Sequence[int | float]
    ) -> Any:
        run, tensors, scalars, count = packed
        scalars = list(scalars)
        for _position, slot, index, _kind in variables:
            scalars[slot] = values[index]
        return (run, tensors, scalars, count)

    def encode_dispatch(self, packed: Any) -> None:
        self._commands.append(("dispatch", *packed))

    def encode_copy(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None:
        self._commands.append(("copy", src, src_offset, dst, dst_offset, nbytes))

    def encode_upload(self, staging: Any, dst: Any, offset: int, nbytes: int) -> None:
        self._commands.append(("copy", staging, 0, dst, offset, nbytes))

    def encode_download(self, src: Any, offset: int, staging: Any, nbytes: int) -> None:
        self._commands.append(("copy", src, offset, staging, 0, nbytes))

    def peer_copy(self, other: Device) -> bool:
        return self.peers and isinstance(other, FakeDevice) and other is not self

    def encode_peer_copy(
        self, src: Any, src_offset: int, other: Device, dst: Any, dst_offset: int, nbytes: int
    ) -> None:
        self.encode_copy(src, src_offset, dst, dst_offset, nbytes)

    def new_marker(self) -> FakeMarker:
        return FakeMarker()

    def encode_mark(self, marker: Any) -> None:
        self._commands.append(("mark", marker))

    def encode_wait(self, marker: Any) -> None:
        self._commands.append(("wait", marker))

    def drop_marker(self, marker: Any) -> None:
        pass

    def take_commands(self) -> list[tuple[Any, ...]]:
        commands, self._commands = self._commands, []
        return commands

    def submit(self, commands: Any) -> _Submission:
        if any(c[0] == "copy" and c[1] is c[3] for c in commands):  # refused whole, as wgpu's finish() does
            raise ValueError("Source and destination cannot be the same buffer")
        if any(c[0] == "wait" and not c[1].issued for c in commands):
            raise InvalidArgument("a wait on a marker whose mark was not issued first")
        for command in commands:
            if command[0] == "mark":
                command[1].issued = True
        submission = _Submission()
        self._queue.put((commands, submission))
        return submission

    def watch(self, submitted: Any, done: Done, awaited: bool) -> None:
        submitted.watch(self.loop, done)

    def _execute(self) -> None:
        while (item := self._queue.get()) is not None:
            commands, submission = item
            for command in commands:
                if command[0] == "dispatch":
                    _, run, tensors, scalars, count = command
                    run(tensors, *scalars, count)
                elif command[0] == "mark":
                    command[1].reached.set()
                elif command[0] == "wait":
                    command[1].reached.wait()
                else:
                    _, src, src_offset, dst, dst_offset, nbytes = command
                    dst[dst_offset : dst_offset + nbytes] = src[src_offset : src_offset + nbytes]
            submission.finish()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)


def open_device(position: int, ordinal: int, loop: asyncio.AbstractEventLoop, settings: Any) -> FakeDevice:
    return FakeDevice(position, loop, int(os.environ.get("GPUD_FAKE_MEMORY", str(1 << 30))), ordinal)

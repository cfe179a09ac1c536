"""A CUDA device's pending command list: a list of commands (see `stream.Commands`), in which
consecutive launches form one run, which `graph` may capture; replay graphs' segments; submission."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from gpud.backends.base import Device, Done, GraphStep
from gpud.backends.cuda.graph import ReplayRun
from gpud.backends.cuda.stream import Commands, Stream, Submitted
from gpud_protocol import SCALAR_FORMATS
from gpud_protocol.errors import InvalidArgument

_SCALAR_FORMAT = {int(kind): "<" + fmt for kind, fmt in SCALAR_FORMATS.items()}  # at the start of its 8-byte slot


class CudaCommands(Device):
    """The command half of `CudaDevice` (gpud.backends.cuda.device), which sets these up."""

    _commands: list[tuple[Any, ...]]
    _run: list[tuple[Any, ...]]  # launches since the last other command
    _dead_modules: list[int]  # of programs nobody holds (finalizers append from any thread)
    _stream: Stream

    def instantiate(self, steps: Sequence[GraphStep]) -> Any:
        """Consecutive dispatches become one `ReplayRun` (one CUDA graph, found by identity)."""
        segments: list[tuple[Any, ...]] = []
        for is_dispatch, item, variables in super().instantiate(steps):
            if not is_dispatch:
                segments.append(("copy", item))
                continue
            if not segments or segments[-1][0] != "run":
                segments.append(("run", ReplayRun([]), []))
            run, patched = segments[-1][1], segments[-1][2]
            if variables and item[0] in self._stream.graphs.tma_modules:
                raise InvalidArgument(
                    "a TMA kernel's scalars (its tensor maps' sizes) cannot be a replay's scalars: record the sizes"
                )
            if variables:
                patched.append((len(run.launches), variables))
            run.launches.append(item)
        return segments

    def encode_replay(self, native: Any, values: Sequence[int | float]) -> None:
        for segment in native:
            if segment[0] == "copy":
                self.encode_copy(*segment[1])
                continue
            _, run, patched = segment
            patches = [(i, self.with_scalars(run.launches[i], v, values)[-1]) for i, v in patched]
            self._add(("graph", run, patches))

    def with_scalars(
        self, packed: Any, variables: Sequence[tuple[int, int, int, int]], values: Sequence[int | float]
    ) -> Any:
        params = bytearray(packed[-1])
        for position, _slot, index, kind in variables:
            struct.pack_into(_SCALAR_FORMAT[kind], params, 8 * position, values[index])
        return (*packed[:-1], bytes(params))

    def encode_dispatch(self, packed: Any) -> None:
        self._run.append(packed)

    def _add(self, command: tuple[Any, ...]) -> None:
        if self._run:
            self._commands.append(("run", self._run))
            self._run = []
        self._commands.append(command)

    def encode_copy(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None:
        self._add(("copy", dst + dst_offset, src + src_offset, nbytes))

    def encode_upload(self, staging: Any, dst: Any, offset: int, nbytes: int) -> None:
        self._add(("htod", dst + offset, staging, nbytes))

    def encode_download(self, src: Any, offset: int, staging: Any, nbytes: int) -> None:
        self._add(("dtoh", staging, src + offset, nbytes))

    def encode_mark(self, marker: Any) -> None:
        self._add(("mark", marker))

    def encode_wait(self, marker: Any) -> None:
        self._add(("wait", marker))

    def take_commands(self) -> Commands:
        if self._run:
            self._commands.append(("run", self._run))
            self._run = []
        commands, self._commands = self._commands, []
        count = len(self._dead_modules)  # finalizers may append meanwhile
        dead = self._dead_modules[:count]
        del self._dead_modules[:count]
        return Commands(commands, dead)

    def submit(self, commands: Commands) -> Submitted:
        return self._stream.submit(commands)

    def watch(self, submitted: Any, done: Done, awaited: bool) -> None:
        self._stream.watch(submitted, done, awaited)

"""Compiled programs of one runtime: compiled once on the compile worker, whoever asks, and kept in a
bounded cache shared by every session."""

from __future__ import annotations

import asyncio
from typing import Any

from gpud.backends.base import Program
from gpud.runtime.cache import LruCache
from gpud.runtime.state import RuntimeState
from gpud.runtime.submitter import Worker
from gpud_protocol import KernelOptions


class Programs(RuntimeState):
    programs: LruCache[tuple[Any, ...], Program]
    compiler: Worker
    _compiling: dict[tuple[Any, ...], asyncio.Future[Program]]

    def program(self, source: str, entry: str, options: KernelOptions) -> Program | asyncio.Future[Program]:
        """The compiled program, or a future of it (compiled once on the compile worker, whoever asks)."""
        key = self.device.program_key(source, entry, options)
        if (program := self.programs.get(key)) is not None:
            return program
        future = self._compiling.get(key)
        if future is None:
            future = self.compiler.future(lambda: self.device.compile(key, source, entry, options))
            self._compiling[key] = future
            future.add_done_callback(lambda f: self._compiled(key, f))
        return future

    def _compiled(self, key: tuple[Any, ...], future: asyncio.Future[Program]) -> None:
        self._compiling.pop(key, None)
        if not future.cancelled() and future.exception() is None:
            self.programs.put(key, future.result())
            self.counters["compiles"] += 1
        else:
            self.counters["compile_errors"] += 1

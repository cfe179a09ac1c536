"""Process-level pieces of the daemon: the lock beside the ipc socket and the event loop choice."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any


class AddressInUse(RuntimeError):
    """Another gpud serves this ipc:// path."""


@contextlib.contextmanager
def ipc_endpoint(path: Path) -> Iterator[None]:
    """Hold a lock file beside the socket: a second daemon must not silently take our clients."""
    if len(str(path)) > 107:
        raise ValueError(f"ipc path {path} is longer than the 107 bytes a unix socket allows")
    path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o660)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            raise AddressInUse(f"ipc://{path} is already served by gpud (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale socket of a daemon that died; we hold the lock
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            if _lock_held(fd):
                path.unlink()
        os.close(fd)


def _lock_held(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def run_loop(main: Coroutine[Any, Any, int], event_loop: str) -> int:
    """Run `main` on uvloop when it is installed (`event_loop` "auto"), else on asyncio's loop."""
    if event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if event_loop == "uvloop":
                main.close()
                raise
        else:
            return uvloop.run(main)
    return asyncio.run(main)

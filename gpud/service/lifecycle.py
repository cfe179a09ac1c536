"""Process-level pieces of the daemon: the lock beside the ipc socket, the event loop choice, logging."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sys
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TextIO

# syslog priorities by logging level: what journald reads from a "<N>" line prefix (sd-daemon(3))
_PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


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


def under_journal(stream: TextIO | None = None) -> bool:
    """True when `stream` (stderr) is connected to journald: `JOURNAL_STREAM` names its device and inode."""
    stream = sys.stderr if stream is None else stream
    device, _, inode = os.environ.get("JOURNAL_STREAM", "").partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


class JournalFormatter(logging.Formatter):
    """`<priority>logger: message`, each line prefixed: journald adds the time, the unit and the pid."""

    def format(self, record: logging.LogRecord) -> str:
        priority = next((p for level, p in _PRIORITIES if record.levelno >= level), 7)
        text = super().format(record)
        return "\n".join(f"<{priority}>{line}" for line in text.splitlines() or [""])


def configure_logging(verbose: bool = False, stream: TextIO | None = None) -> None:
    """Log to stderr: under journald without timestamps and with priority prefixes, else with both."""
    stream = sys.stderr if stream is None else stream
    handler = logging.StreamHandler(stream)
    if under_journal(stream):
        handler.setFormatter(JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)

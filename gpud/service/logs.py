"""The daemon's log: to stderr, and under journald without timestamps and with a priority on every line."""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

# syslog priorities by logging level: what journald reads from a "<N>" line prefix (sd-daemon(3))
_PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


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


def configure_logging(verbose: bool = False, stream: TextIO | None = None, prefix: str = "") -> None:
    """Log to stderr: under journald without timestamps and with priority prefixes, else with both.
    `prefix`: before each logger name (a process-per-device worker's device)."""
    stream = sys.stderr if stream is None else stream
    handler = logging.StreamHandler(stream)
    prefix = prefix.replace("%", "%%")
    if under_journal(stream):
        handler.setFormatter(JournalFormatter(f"{prefix}%(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)

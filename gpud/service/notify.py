"""systemd's notify protocol without libsystemd: one datagram per message to `$NOTIFY_SOCKET`.

The daemon says `READY=1` once every device is open and the socket is bound, `STATUS=...` every few
seconds, `WATCHDOG=1` while it is healthy, and `STOPPING=1` when it starts to drain. Outside systemd
(no `NOTIFY_SOCKET`) every call does nothing. A send never blocks and never raises: a full or gone
listener costs a lost datagram, never a stalled event loop.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        address = os.environ.get("NOTIFY_SOCKET", "") if address is None else address
        self.enabled = bool(address) and hasattr(socket, "AF_UNIX") and address[0] in "/@"
        # "@name" is a socket in the abstract namespace: a leading NUL byte on the wire.
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self._sock: socket.socket | None = None
        if self.enabled:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.setblocking(False)
        self._warned = False

    def send(self, *assignments: str) -> bool:
        """Send `KEY=value` lines in one datagram; True if it went out."""
        if self._sock is None:
            return False
        text = "\n".join(a.replace("\n", " ") for a in assignments)
        try:
            self._sock.sendto(text.encode(), self._address)
            return True
        except OSError as exc:  # no listener, a full queue: never worth stopping the daemon for
            if not self._warned:
                self._warned = True
                log.debug("notify socket %s: %s", self._address.lstrip("\0"), exc)
            return False

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval() -> float | None:
    """Seconds between `WATCHDOG=1` pings (half of `WATCHDOG_USEC`), or None when no watchdog is asked for.

    As sd_watchdog_enabled(3): `WATCHDOG_PID`, when set, must name this process.
    """
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2e6

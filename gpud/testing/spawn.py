"""Start a daemon as a child process and wait until it is ready (demo, benchmarks, tests).

Readiness is systemd's: the child gets a `NOTIFY_SOCKET` of ours (a unix datagram socket in a temp
dir) and is ready when it sends `READY=1`, which it does once every device is open and the socket
bound. Where that cannot work (tcp://, no AF_UNIX) the socket is polled with a handshake instead.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import zmq

import gpud_protocol as proto


def answers(address: str, timeout: float = 1.0, server_public_key: bytes | None = None) -> bool:
    """True if a gpud at `address` completes a handshake within `timeout` seconds."""
    if address.startswith("ipc://") and not Path(address[len("ipc://") :]).exists():
        return False
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if server_public_key is not None:
        sock.curve_serverkey = server_public_key
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
    try:
        sock.connect(address)
        sock.send(proto.encode_hello("gpud-probe", os.getpid()))
        if not sock.poll(int(timeout * 1000)):
            return False
        header, _ = proto.decode_server_message(sock.recv_multipart(), proto.DEFAULT_LIMITS)
        sock.send(proto.BYE)
        return header.get("t") in ("welcome", "redirect")  # a process-per-device front redirects
    finally:
        sock.close(linger=0)
        ctx.term()


class NotifyListener:
    """Stands in for systemd's notify socket: collects the `KEY=value` datagrams a daemon sends.

    `messages` holds each datagram as a dict, with its arrival time (monotonic) under "_at".
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self.messages: list[dict[str, str | float]] = []
        self._cursor = 0

    def poll(self, timeout: float = 0.0) -> list[dict[str, str | float]]:
        """Read what arrived (waiting up to `timeout` for the first datagram); return the new ones."""
        new: list[dict[str, str | float]] = []
        self._sock.settimeout(max(0.0, timeout))  # 0: non-blocking
        while True:
            try:
                data = self._sock.recv(65536)
            except (BlockingIOError, TimeoutError):
                break
            fields: dict[str, str | float] = {"_at": time.monotonic()}
            for line in data.decode(errors="replace").splitlines():
                key, _, value = line.partition("=")
                fields[key] = value
            new.append(fields)
            self._sock.settimeout(0.0)
        self.messages += new
        return new

    def wait_for(
        self, key: str, timeout: float, alive: subprocess.Popen[bytes] | None = None
    ) -> dict[str, str | float]:
        """The first message carrying `key` after the one the previous `wait_for` returned."""
        deadline = time.monotonic() + timeout
        while True:
            for i in range(self._cursor, len(self.messages)):
                if key in self.messages[i]:
                    self._cursor = i + 1
                    return self.messages[i]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {key} from the daemon within {timeout:g} s")
            if alive is not None and alive.poll() is not None:
                raise RuntimeError(f"the daemon exited ({alive.returncode}) before it sent {key}")
            self.poll(min(0.1, remaining))

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


@contextlib.contextmanager
def daemon(
    backend: str = "auto",
    address: str | None = None,
    extra_args: tuple[str, ...] = (),
    startup_timeout: float = 60.0,
    server_public_key: bytes | None = None,
    env: Mapping[str, str | None] | None = None,
    notify: NotifyListener | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run `python -m gpud serve` on `address` (default: a fresh ipc socket in a temp dir).

    It reads no config file (`--no-config`) unless `extra_args` names one. Pass `notify` to keep
    listening to what the daemon tells systemd after it is ready (the caller closes it); `env` adds
    to the daemon's environment (a value of None removes that variable). For a tcp:// daemon with
    CURVE, pass its public key so that the readiness probe can talk to it.
    """
    with tempfile.TemporaryDirectory(prefix="gpud-") as tmp:
        address = address or f"ipc://{tmp}/gpud.sock"
        log_path = Path(tmp) / "daemon.log"
        use_notify = address.startswith("ipc://") and hasattr(socket, "AF_UNIX")
        listener = notify
        if listener is None and use_notify:
            listener = NotifyListener(Path(tmp) / "notify.sock")
        with open(log_path, "wb") as log:
            extra = (*extra_args, *shlex.split(os.environ.get("GPUD_DAEMON_ARGS", "")))  # e.g. --profile FILE
            config = () if "--config" in extra else ("--no-config",)
            cmd = [sys.executable, "-m", "gpud", "serve", "--address", address, "--backend", backend, *config, *extra]
            child_env = {**os.environ, "GPUD_CACHE_DIR": os.environ.get("GPUD_CACHE_DIR", f"{tmp}/cache")}
            for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM", "INVOCATION_ID"):
                child_env.pop(key, None)  # ours, not those of a systemd unit the caller may run under
            for key, value in (env or {}).items():
                if value is None:
                    child_env.pop(key, None)
                else:
                    child_env[key] = value
            if listener is not None:
                child_env["NOTIFY_SOCKET"] = str(listener.path)
            # A group of its own: whatever it starts (a process-per-device front's workers) is stopped with it.
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
        try:
            try:
                if listener is not None:
                    listener.wait_for("READY", startup_timeout, alive=proc)
                else:
                    deadline = time.monotonic() + startup_timeout
                    while not answers(address, 0.5, server_public_key):
                        if proc.poll() is not None or time.monotonic() > deadline:
                            raise TimeoutError("no answer")
                        time.sleep(0.05)
            except (TimeoutError, RuntimeError) as exc:
                raise RuntimeError(
                    f"gpud did not start ({exc}; exit {proc.poll()}):\n{log_path.read_text()[-4000:]}"
                ) from None
            finally:
                if listener is not None and notify is None:
                    listener.close()  # the daemon's later STATUS= datagrams find no listener: harmless
            yield address, proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # nothing of its group outlives it

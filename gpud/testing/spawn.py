"""Start a daemon as a child process and wait until it answers (demo, benchmarks, tests)."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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
        return header.get("t") == "welcome"
    finally:
        sock.close(linger=0)
        ctx.term()


@contextlib.contextmanager
def daemon(
    backend: str = "auto",
    address: str | None = None,
    extra_args: tuple[str, ...] = (),
    startup_timeout: float = 60.0,
    server_public_key: bytes | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run `python -m gpud serve` on `address` (default: a fresh ipc socket in a temp dir).

    For a tcp:// daemon with CURVE, pass its public key so that the readiness probe can talk to it.
    """
    with tempfile.TemporaryDirectory(prefix="gpud-") as tmp:
        address = address or f"ipc://{tmp}/gpud.sock"
        log_path = Path(tmp) / "daemon.log"
        with open(log_path, "wb") as log:
            extra = (*extra_args, *shlex.split(os.environ.get("GPUD_DAEMON_ARGS", "")))  # e.g. --profile FILE
            cmd = [sys.executable, "-m", "gpud", "serve", "--address", address, "--backend", backend, *extra]
            env = {**os.environ, "GPUD_CACHE_DIR": os.environ.get("GPUD_CACHE_DIR", f"{tmp}/cache")}
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + startup_timeout
            while not answers(address, 0.5, server_public_key):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gpud did not start (exit {proc.poll()}):\n{log_path.read_text()[-4000:]}")
                time.sleep(0.05)
            yield address, proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

"""A daemon on the fake backend whose op library runs no-ops: the CPU cost of op-library work alone.

The fake backend ships only a few test kernels (`fake:<name>`); the op library's kernels (`gpud:<name>`)
have no fake sources, so a forward through `gpu.ops` fails there. This launcher starts `gpud serve` with
two benchmark-only patches, made in this process before the daemon runs: the fake backend gets a
stand-in source per op family, and compiles a built-in kernel into a no-op with the interface of its
`gpud_protocol.ops` spec (tensors, scalar kinds, writes). Every check of the daemon still runs (the
op's rule, the program's interface, handles, views); the device computes nothing.

    with fake_ops.daemon() as address: ...        # a child process, an ipc:// socket in a temp dir
    python -m benchmarks.fake_ops serve ...       # what the child runs (gpud's own CLI otherwise)
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STAND_IN = "fake-ops:"  # the source a built-in kernel gets on the fake backend


def _noop(*_args: Any) -> None:
    pass


def patch() -> None:
    """Let the fake backend compile the op library's kernels into no-ops (this process only). Call it
    before the daemon's modules are imported: they take `gpud.ops.source` by name when they are."""
    import gpud.ops
    from gpud.backends import fake
    from gpud.backends.base import Program
    from gpud_protocol.ops import KERNEL_BACKENDS, KERNELS

    original_source = gpud.ops.source
    original_compile = fake.FakeDevice.compile

    def source(family: str, backend: str) -> str:
        return STAND_IN + family if backend == "fake" else original_source(family, backend)

    def compile(self: fake.FakeDevice, key: tuple[Any, ...], source: str, entry: str, options: Any) -> Program:
        if not source.startswith(STAND_IN):
            return original_compile(self, key, source, entry, options)
        spec = KERNELS[entry]
        kinds = tuple(kind for _name, kind in spec.scalars)
        kernel = fake.FakeKernel(_noop, len(spec.tensors), kinds, frozenset(spec.writes))
        return Program(key, entry, kernel, kernel.tensors, kernel.scalars, kernel.writes)

    for name, backends in KERNEL_BACKENDS.items():  # every kernel of the library has a fake stand-in
        KERNEL_BACKENDS[name] = (*backends, "fake")
    gpud.ops.source = source  # type: ignore[assignment]
    fake.FakeDevice.compile = compile  # type: ignore[method-assign]


@contextlib.contextmanager
def daemon(backend: str = "fake", extra_args: tuple[str, ...] = (), timeout: float = 60.0) -> Iterator[str]:
    """A daemon of `backend` on a fresh ipc:// socket (fake: with the no-op op library); yields its address."""
    from gpud.testing import spawn

    if backend != "fake":
        with spawn.daemon(backend, extra_args=("--devices", "0", *extra_args)) as (address, _proc):
            yield address
        return
    with tempfile.TemporaryDirectory(prefix="gpud-bench-") as tmp:
        address = f"ipc://{tmp}/gpud.sock"
        log_path = Path(tmp) / "daemon.log"
        cmd = [sys.executable, "-m", "benchmarks.fake_ops", "serve", "--address", address, "--backend", "fake"]
        cmd += ["--no-config", "--devices", "0", *extra_args]
        env = {**os.environ, "GPUD_CACHE_DIR": f"{tmp}/cache"}
        env.pop("NOTIFY_SOCKET", None)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + timeout
            while not spawn.answers(address, 0.5):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the fake daemon did not start:\n{log_path.read_text()[-4000:]}")
                time.sleep(0.05)
            yield address
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def main() -> int:
    patch()
    from gpud.service.cli import main as gpud_main

    return gpud_main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())

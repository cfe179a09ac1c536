"""WebGPU backend (wgpu-py, WGSL): any Vulkan/Metal/D3D12 GPU, and lavapipe without a GPU.

Parts: `compiler` (WGSL to a pipeline, the kernel's interface from `wgsl`, the reflection), `dispatch`
(checking, packing and encoding dispatches), `device` (memory, staging, commands, completion).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from gpud.backends.webgpu.device import WebGpuDevice


@functools.cache
def _adapters() -> tuple[Any, ...]:
    """One adapter per GPU: hardware ones when there are any, else the software ones (lavapipe); an
    OpenGL adapter only where no native API (Vulkan, Metal, D3D12) reaches that GPU."""
    import wgpu

    with _runtime_dir():
        adapters = [(a, dict(a.info)) for a in wgpu.gpu.enumerate_adapters_sync()]
    hardware = [(a, i) for a, i in adapters if str(i.get("adapter_type", "")).upper() != "CPU"]
    chosen = hardware or adapters
    native = [(a, i) for a, i in chosen if str(i.get("backend_type", "")) != "OpenGL"]
    return tuple(a for a, _ in (native or chosen))


@contextlib.contextmanager
def _runtime_dir() -> Iterator[None]:
    """Without a valid XDG_RUNTIME_DIR (root started by hand, a container), Mesa's Vulkan drivers
    print "error: XDG_RUNTIME_DIR is invalid or not set in the environment." for each adapter while
    they look for a display server: lend them a private, empty one (0700) while adapters are found."""
    given = os.environ.get("XDG_RUNTIME_DIR")
    if given and os.path.isdir(given):
        yield
        return
    private = tempfile.mkdtemp(prefix="gpud-runtime-")
    os.environ["XDG_RUNTIME_DIR"] = private
    try:
        yield
    finally:
        if given is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = given
        shutil.rmtree(private, ignore_errors=True)


def device_count() -> int:
    return len(_adapters())


def open_device(position: int, ordinal: int, loop: asyncio.AbstractEventLoop, settings: Any) -> WebGpuDevice:
    return WebGpuDevice(position, loop, _adapters()[ordinal], settings)


__all__ = ["WebGpuDevice", "device_count", "open_device"]

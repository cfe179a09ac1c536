"""WebGPU backend (wgpu-py, WGSL): any Vulkan/Metal/D3D12 GPU, and lavapipe without a GPU.

Parts: `compiler` (WGSL to a pipeline, the kernel's interface from `reflect`), `dispatch`
(checking, packing and encoding dispatches), `device` (memory, staging, commands, completion).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from gpud.backends.webgpu.device import WebGpuDevice


@functools.cache
def _adapters() -> tuple[Any, ...]:
    """One adapter per GPU: hardware ones when there are any, else the software ones (lavapipe); an
    OpenGL adapter only where no native API (Vulkan, Metal, D3D12) reaches that GPU."""
    import wgpu

    adapters = [(a, dict(a.info)) for a in wgpu.gpu.enumerate_adapters_sync()]
    hardware = [(a, i) for a, i in adapters if str(i.get("adapter_type", "")).upper() != "CPU"]
    chosen = hardware or adapters
    native = [(a, i) for a, i in chosen if str(i.get("backend_type", "")) != "OpenGL"]
    return tuple(a for a, _ in (native or chosen))


def device_count() -> int:
    return len(_adapters())


def open_device(position: int, ordinal: int, loop: asyncio.AbstractEventLoop, settings: Any) -> WebGpuDevice:
    return WebGpuDevice(position, loop, _adapters()[ordinal], settings)


__all__ = ["WebGpuDevice", "device_count", "open_device"]

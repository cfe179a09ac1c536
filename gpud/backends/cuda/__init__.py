"""CUDA backend (cuda-python driver API, CUDA C through NVRTC).

Parts: `driver` (cuda-python, typed errors, pinned memory), `compiler` (source checks, the kernel's
interface from its parameter list, NVRTC, the disk cache), `launch` (checking and packing
dispatches), `graph` (runs of launches, captured into CUDA graphs when they repeat), `device`
(memory, staging, commands, submission, completion). Only `driver` and what imports it need
cuda-python: the source checks run anywhere.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from gpud.backends.cuda.compiler import check_flags, check_source, parse_parameters, scalar_kinds, written_tensors

if TYPE_CHECKING:
    from gpud.backends.cuda.device import CudaDevice


def device_count() -> int:
    """CUDA devices on this host; 0 without cuda-python, a driver, or a device."""
    try:
        from cuda.bindings import driver as cu

        (status,) = cu.cuInit(0)
        if status:
            return 0
        status, count = cu.cuDeviceGetCount()
        return 0 if status else int(count)
    except Exception:
        return 0


def open_device(position: int, ordinal: int, loop: asyncio.AbstractEventLoop, settings: Any) -> CudaDevice:
    from gpud.backends.cuda.device import CudaDevice

    return CudaDevice(position, ordinal, loop, settings)


def __getattr__(name: str) -> Any:
    if name == "CudaDevice":  # imported on first use: it needs cuda-python
        from gpud.backends.cuda.device import CudaDevice

        return CudaDevice
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CudaDevice",
    "check_flags",
    "check_source",
    "device_count",
    "open_device",
    "parse_parameters",
    "scalar_kinds",
    "written_tensors",
]

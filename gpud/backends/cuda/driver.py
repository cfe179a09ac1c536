"""cuda-python, imported once: typed errors for driver and NVRTC results, pinned host memory."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import numpy as np

from gpud_protocol.errors import CompileError, DeviceLost, GpudError, InvalidArgument, OutOfMemory

try:
    from cuda.bindings import driver as cu
    from cuda.bindings import nvrtc
except ImportError as exc:  # only imported when the cuda backend is selected
    raise ImportError("the cuda backend needs cuda-python: pip install 'cuda-bindings>=12.6'") from exc

__all__ = ["STICKY", "E", "address", "check", "cu", "error", "host_alloc", "host_free", "nvrtc"]

log = logging.getLogger(__name__)

E = cu.CUresult
_STICKY_NAMES = """
    ILLEGAL_ADDRESS LAUNCH_FAILED ILLEGAL_INSTRUCTION MISALIGNED_ADDRESS HARDWARE_STACK_ERROR INVALID_ADDRESS_SPACE
    INVALID_PC ASSERT ECC_UNCORRECTABLE NVLINK_UNCORRECTABLE LAUNCH_TIMEOUT UNKNOWN CONTAINED TENSOR_MEMORY_LEAK
    EXTERNAL_DEVICE CONTEXT_IS_DESTROYED INVALID_CONTEXT DEINITIALIZED NOT_INITIALIZED NO_DEVICE DEVICE_UNAVAILABLE
    SYSTEM_NOT_READY SYSTEM_DRIVER_MISMATCH MPS_CONNECTION_FAILED MPS_RPC_FAILURE MPS_SERVER_NOT_READY
    MPS_CLIENT_TERMINATED
"""
#: after these the context is unusable: every later call fails with them too ("sticky" errors)
STICKY = frozenset(getattr(E, f"CUDA_ERROR_{n}") for n in _STICKY_NAMES.split() if hasattr(E, f"CUDA_ERROR_{n}"))


def error(status: Any, what: str = "") -> GpudError:
    """The typed error for a failed CUresult or nvrtcResult."""
    if isinstance(status, nvrtc.nvrtcResult):
        cls: type[GpudError] = (
            InvalidArgument if status == nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION else CompileError
        )
        text = nvrtc.nvrtcGetErrorString(status)[1]
    else:
        cls = DeviceLost if status in STICKY else InvalidArgument
        if status == E.CUDA_ERROR_OUT_OF_MEMORY:
            cls = OutOfMemory
        text = None
        with contextlib.suppress(Exception):  # no driver library
            text = cu.cuGetErrorString(status)[1]
    name = getattr(status, "name", str(status))
    message = f"{name}: {text.decode(errors='replace')}" if isinstance(text, bytes) else name
    return cls(f"{what}: {message}" if what else message)


def check(result: tuple[Any, ...], what: str = "") -> Any:
    """Unwrap cuda-python's `(status, *values)`: the value (a tuple if several), or raise the typed error."""
    if result[0]:  # CUDA_SUCCESS and NVRTC_SUCCESS are both 0
        raise error(result[0], what)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def host_alloc(nbytes: int) -> int:
    """Pinned host memory, usable from every context (PORTABLE)."""
    return int(check(cu.cuMemHostAlloc(nbytes, cu.CU_MEMHOSTALLOC_PORTABLE), "pinned staging"))


def host_free(pointer: int) -> None:
    """Never raises: reported in the log."""
    (status,) = cu.cuMemFreeHost(pointer)
    if status:
        log.debug("cuMemFreeHost: %s", error(status))


def address(data: memoryview) -> int:
    """Address of a contiguous buffer, read-only ones included."""
    return int(np.frombuffer(data, np.uint8).ctypes.data)

"""Backend selection: `cuda` where a CUDA device exists, else `webgpu` (lavapipe without a GPU)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpud.backends.base import Backend
from gpud.config import Config

log = logging.getLogger(__name__)

BACKENDS = ("auto", "cuda", "webgpu")


def cuda_available() -> bool:
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return False
    try:
        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return False
        err, count = cu.cuDeviceGetCount()
    except Exception:  # no driver library at all
        return False
    return bool(err == cu.CUresult.CUDA_SUCCESS and count > 0)


def resolve(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}: choose from {BACKENDS}")
    if name == "auto":
        return "cuda" if cuda_available() else "webgpu"
    return name


def create_backend(config: Config, on_fatal: Callable[[BaseException], None]) -> Backend:
    """Create the configured backend; call inside the running event loop."""
    name = resolve(config.backend)
    if name == "cuda":
        from gpud.backends.cuda import CudaBackend

        return CudaBackend(config, on_fatal)
    from gpud.backends.webgpu import WebGpuBackend

    return WebGpuBackend(config, on_fatal)

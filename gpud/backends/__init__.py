"""Backends and the devices they serve: `cuda` where a CUDA device exists, else `webgpu` (lavapipe
without a GPU); `fake` for tests. `open_devices` opens every device the configuration allows."""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any, Protocol, cast

from gpud.backends.base import Device

log = logging.getLogger(__name__)

BACKENDS = ("auto", "cuda", "webgpu", "fake")


class BackendModule(Protocol):
    """What each backend package exports."""

    def device_count(self) -> int: ...

    def open_device(self, position: int, ordinal: int, loop: asyncio.AbstractEventLoop, settings: Any) -> Device: ...


class BackendUnavailable(RuntimeError):
    """The chosen backend cannot run here (package missing, no device); the message says why."""


def cuda_problem() -> str | None:
    """Why the cuda backend cannot run here, or None if it can."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return "cuda-python is not installed (pip install 'gpud[cuda]')"
    try:
        (err,) = cu.cuInit(0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return f"cuInit failed: {getattr(err, 'name', err)}"
        err, count = cu.cuDeviceGetCount()
    except Exception as exc:  # no driver library at all
        return f"no NVIDIA driver ({type(exc).__name__}: {exc})"
    if err != cu.CUresult.CUDA_SUCCESS or count == 0:
        return "no CUDA device"
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        return f"NVRTC is missing ({why}); install gpud[cuda] (nvidia-cuda-nvrtc-cu12) or the CUDA toolkit"
    return None


def cuda_available() -> bool:
    return cuda_problem() is None


def resolve(name: str) -> str:
    """The backend to use for `name` (auto: cuda if it can run, else webgpu); raises BackendUnavailable."""
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}: choose from {BACKENDS}")
    if name == "auto":
        problem = cuda_problem()
        if problem is None:
            return "cuda"
        log.info("backend auto: using webgpu because the cuda backend cannot run: %s", problem)
        return "webgpu"
    if name == "cuda" and (problem := cuda_problem()) is not None:
        raise BackendUnavailable(f"the cuda backend cannot run: {problem}")
    return name


def chosen_devices(name: str, devices: str | list[int]) -> tuple[BackendModule, list[int]]:
    """The backend and the device indices `devices` names ("all" or a list), without opening any."""
    backend = resolve(name)
    module = cast(BackendModule, importlib.import_module(f"gpud.backends.{backend}"))
    count = module.device_count()
    if count == 0:
        raise BackendUnavailable(f"the {backend} backend finds no device")
    chosen = list(range(count)) if isinstance(devices, str) else [int(i) for i in devices]
    if missing := [i for i in chosen if not 0 <= i < count]:
        raise BackendUnavailable(f"no {backend} device {missing[0]}: this host has {count} (0..{count - 1})")
    return module, chosen


def open_devices(name: str, devices: str | list[int], loop: asyncio.AbstractEventLoop, settings: Any) -> list[Device]:
    """Open every device `devices` names ("all" or a list of the backend's device indices)."""
    module, chosen = chosen_devices(name, devices)
    opened: list[Device] = []
    try:
        for position, ordinal in enumerate(chosen):
            opened.append(module.open_device(position, ordinal, loop, settings))
    except BaseException:
        for device in opened:
            device.close()
        raise
    return opened

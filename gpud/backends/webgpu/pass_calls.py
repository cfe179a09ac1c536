"""The three calls a dispatch makes on an open compute pass, straight into wgpu-native.

wgpu-py wraps every C call in error capture (a thread-local stack push and pop, a Python frame): about
7 µs of a 13 µs dispatch encode, on the hot path of every replay. Commands recorded into a compute
pass are validated at `finish()` (and every new pipeline and binding was probed before, see
`dispatch`), so a capture around each recording call catches nothing: these call the C functions
directly. Where wgpu-py's private modules are not what this expects, the public methods serve.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SetPipeline = Callable[[Any, Any], None]  # (compute pass, pipeline)
SetBindGroup = Callable[[Any, Any], None]  # (compute pass, bind group), at index 0, no dynamic offsets
Dispatch = Callable[[Any, int, int, int], None]  # (compute pass, x, y, z)


def _public() -> tuple[SetPipeline, SetBindGroup, Dispatch]:
    def set_pipeline(compute: Any, pipeline: Any) -> None:
        compute.set_pipeline(pipeline)

    def set_bind_group(compute: Any, group: Any) -> None:
        compute.set_bind_group(0, group)

    def dispatch(compute: Any, x: int, y: int, z: int) -> None:
        compute.dispatch_workgroups(x, y, z)

    return set_pipeline, set_bind_group, dispatch


def _direct() -> tuple[SetPipeline, SetBindGroup, Dispatch]:
    from wgpu.backends.wgpu_native._ffi import ffi, lib

    pipeline_call = lib.wgpuComputePassEncoderSetPipeline
    group_call = lib.wgpuComputePassEncoderSetBindGroup
    dispatch_call = lib.wgpuComputePassEncoderDispatchWorkgroups
    null = ffi.NULL

    def set_pipeline(compute: Any, pipeline: Any) -> None:
        pipeline_call(compute._internal, pipeline._internal)

    def set_bind_group(compute: Any, group: Any) -> None:
        group_call(compute._internal, 0, group._internal, 0, null)

    def dispatch(compute: Any, x: int, y: int, z: int) -> None:
        dispatch_call(compute._internal, x, y, z)

    return set_pipeline, set_bind_group, dispatch


def calls() -> tuple[SetPipeline, SetBindGroup, Dispatch]:
    """(set_pipeline, set_bind_group, dispatch) for compute passes: direct where wgpu-py allows it."""
    try:
        return _direct()
    except (ImportError, AttributeError):
        return _public()

"""WGSL to a compute pipeline, and the kernel's interface read from the source.

Convention: tensor arguments bind, in order, to `@group(0) @binding(0..n-1)` (storage buffers);
scalar arguments (f32/i32/u32, 4 bytes each) are packed in order into one uniform struct at
`@binding(n)`. What a kernel writes is decided from a parse of the source (`reflect`), never a
regex, and fails safe: a binding whose index or access is not known exactly counts as written.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpud.backends.base import Program
from gpud.backends.webgpu.wgsl.model import Binding, Reflection
from gpud.backends.webgpu.wgsl.reflect import reflect
from gpud_protocol import SCALAR_NAMES, KernelOptions
from gpud_protocol.errors import CompileError, InvalidArgument

SCALARS = frozenset(SCALAR_NAMES.values())  # the WGSL types of scalar arguments


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """What `Program.native` holds on WebGPU."""

    pipeline: Any
    layout: Any  # bind group layout of group 0; None: the kernel binds nothing
    id: int
    access: tuple[str, ...] | None  # per tensor binding: "read" | "read_write"; None: unknown


def compile_wgsl(
    device: Any, key: tuple[Any, ...], source: str, entry: str, options: KernelOptions, pid: int
) -> Program:
    """Runs on the compile worker: wgpu compiles, then the interface comes from the source."""
    if options.block is not None:
        raise InvalidArgument("WGSL kernels set their block size with @workgroup_size, not 'block'")
    if options.flags:
        raise InvalidArgument("WGSL kernels take no compiler flags")
    if options.shared:
        raise InvalidArgument("WGSL kernels declare their workgroup memory in the source, not with 'shared'")
    try:
        module = device.create_shader_module(code=source)
        pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": entry})
    except Exception as exc:  # wgpu raises GPUValidationError / GPUError with the naga log
        raise CompileError(str(exc)) from None
    try:
        layout = pipeline.get_bind_group_layout(0)
    except Exception:
        layout = None  # the kernel binds nothing
    reflection = reflect(source)
    tensors, scalars, access, unchecked = interface(reflection)
    written = reflection.written(0)
    # A declaration may add written bindings, never hide one the source shows.
    writes = None if written is None else frozenset(written | set(options.writes or ()))
    if writes is None:
        unchecked.append("which bindings it writes: every tensor argument counts as written")
    native = Pipeline(pipeline, layout, pid, access)
    return Program(key, entry, native, tensors, scalars, writes, tuple(unchecked), access)


def interface(reflection: Reflection) -> tuple[int | None, tuple[str, ...] | None, tuple[str, ...] | None, list[str]]:
    """(tensor count, scalar kinds, access per tensor, what could not be checked) from group 0."""
    unchecked = [f"the source: {problem}" for problem in reflection.problems]
    if not reflection.exact:
        return None, None, None, unchecked
    group = reflection.group(0)
    others = [b for b in reflection.bindings if b.group != 0]
    if others:
        unchecked.append(f"bindings outside @group(0) ({others[0].name}): gpud binds group 0 only")
    storage = [group[i] for i in sorted(group) if group[i].space == "storage"]
    uniforms = [group[i] for i in sorted(group) if group[i].space == "uniform"]
    count = len(storage)
    if (
        [b.binding for b in storage] != list(range(count))
        or len(uniforms) > 1
        or (uniforms and uniforms[0].binding != count)
    ):
        unchecked.append("bindings do not follow gpud's convention (tensors at 0..n-1, one uniform struct at n)")
        return None, None, None, unchecked
    if any(b.space not in ("storage", "uniform") for b in group.values()):
        unchecked.append("non-buffer bindings (textures, samplers) cannot be bound by gpud")
        return None, None, None, unchecked
    access = tuple(b.access for b in storage)
    scalars = _scalars(reflection, uniforms[0]) if uniforms else ()
    if scalars is None:
        unchecked.append("the uniform's members are not all f32/i32/u32: scalar arguments are not checked")
    return count, scalars, access, unchecked


def _scalars(reflection: Reflection, uniform: Binding) -> tuple[str, ...] | None:
    members = reflection.uniform_members(0, uniform.binding)
    if members is None or any(m.type not in SCALARS for m in members):
        return None
    return tuple(m.type for m in members)

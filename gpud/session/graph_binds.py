"""A replay's bound tensors: checked against the instance's specs once per session and set of handles,
and the plan they make looked up by a key made once (a decode step binds 48 KV caches and sends the
same handles every step: its replay then compares the handles it names with those it named before).

A binding is valid for as long as the session's handles of those ids are equal to the ones checked:
a handle is immutable (its tensor, shape, view and mode), so equal handles pass the same checks and
bind the same buffers. A view given as a bound tensor (refused unless whole) is checked every time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpud.backends.base import Buffer
from gpud.runtime.graph import Replayable
from gpud.session.binding import UNBOUND, Binding
from gpud.session.tensors import Handle
from gpud_protocol.errors import InvalidArgument, PermissionDenied
from gpud_protocol.views import TensorView

if TYPE_CHECKING:
    from gpud.session.graphs import Family, Instance
    from gpud.session.state import SessionState as Session


def bind(session: Session, family: Family, instance: Instance, refs: tuple[int | TensorView, ...]) -> Binding:
    """The bound tensors `refs` names for a replay of `instance`, checked (once per session and handles)."""
    if len(refs) != len(instance.binds):
        raise InvalidArgument(f"graph {family.name!r} binds {len(instance.binds)} tensors, {len(refs)} given")
    if not refs:
        return UNBOUND
    by_id: dict[Any, Handle] = session.handles
    handles = tuple(map(by_id.get, refs))  # a view's ref finds no handle: never a hit
    key = (session.id, refs)
    binding = instance.bindings.get(key)
    if binding is not None and binding.handles == handles:
        return binding
    binding = Binding(handles, _checked(session, family, instance, refs))
    if not any(type(ref) is not int for ref in refs):
        instance.bindings.put(key, binding)
    return binding


def plan(family: Family, instance: Instance, binding: Binding) -> Replayable:
    """The plan of `instance` with `binding`'s buffers (checked, instantiated once: `Family.plan`)."""
    key = binding.key
    if key is None or key[0] != family.generation:
        key = binding.key = family.plan_key(binding.buffers)
    return family.plan(instance, binding.buffers, key)


def _checked(
    session: Session, family: Family, instance: Instance, refs: tuple[int | TensorView, ...]
) -> tuple[Buffer, ...]:
    binds: list[Buffer] = []
    for index, (handle_id, spec) in enumerate(zip(refs, instance.binds, strict=True)):
        handle = session._handle(handle_id)
        tensor = handle.tensor
        if (tensor.dtype, handle.shape) != (spec.dtype, spec.shape):
            raise InvalidArgument(
                f"bound tensor {spec.name!r} must be {spec.dtype}{list(spec.shape)}, got {handle.describe()}"
            )
        if not handle.whole:  # a replay binds buffers: a view's offset and strides would be lost
            raise InvalidArgument(
                f"bound tensor {spec.name!r} is a transposed or narrowed view: a graph binds whole tensors "
                "(or reshapes of them); call gpu.ops.contiguous() on it first"
            )
        if tensor.device != family.device:
            where = f"device {tensor.device}, the graph on {family.device}"
            raise InvalidArgument(f"bound tensor {spec.name!r} is on {where}")
        if index in instance.bind_writes and not handle.writable:
            raise PermissionDenied(f"the graph writes bound tensor {spec.name!r}, a read-only resident")
        binds.append(tensor.buffer)
    return tuple(binds)

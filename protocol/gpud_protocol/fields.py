"""Validators of the fields of an op from a client: each checks one kind of field (`field_types.Field`)
against `Limits` before anything is allocated, and returns the value the daemon will use."""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Sequence
from typing import Any

from gpud_protocol.arg_kinds import SCALAR_NAMES, SCALAR_RANGES, ArgKind, DispatchArg
from gpud_protocol.field_types import RESIDENT_MODES, KernelOptions
from gpud_protocol.limits import DTYPE_SIZES, Limits
from gpud_protocol.views import TensorView, extent
from gpud_protocol.wire import bad, describe, f32_fits, is_int

_NAME_RE = re.compile(r"[A-Za-z0-9_.:/-]+")
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.:/-]*")
_OPTION_KEYS = frozenset(KernelOptions._fields)
MAX_SHARED = 1 << 20  # bytes of dynamic shared memory a kernel may ask; the device refuses past its own limit

Validator = typing.Callable[[Any, Limits, Sequence[Any]], Any]
_TENSOR, _F32, _I32, _U32 = (int(kind) for kind in (ArgKind.TENSOR, ArgKind.F32, ArgKind.I32, ArgKind.U32))
(_I32_LOW, _I32_HIGH), (_U32_LOW, _U32_HIGH) = SCALAR_RANGES[ArgKind.I32], SCALAR_RANGES[ArgKind.U32]
_ARG_KINDS = ", ".join([f"{_TENSOR} tensor handle or view", *(f"{int(k)} {name}" for k, name in SCALAR_NAMES.items())])


def check_handle(value: Any, limits: Limits, _payloads: Sequence[Any]) -> int:
    if type(value) is not int or not 0 < value <= limits.max_handle:
        raise bad(f"bad handle {describe(value)}: an int in [1, {limits.max_handle}]")
    return value


def check_dtype(value: Any, _limits: Limits, _payloads: Sequence[Any]) -> str:
    if type(value) is not str or value not in DTYPE_SIZES:
        raise bad(f"dtype {describe(value)} is not one of {sorted(DTYPE_SIZES)}")
    return value


def check_int_list(value: Any, length: int | None, lo: int, hi: int, what: str) -> tuple[int, ...]:
    if type(value) is not tuple or (length is not None and len(value) != length):
        raise bad(f"{what} must be a list of {length or 'some'} ints, got {describe(value)}")
    for v in value:
        if not is_int(v) or not lo <= v <= hi:
            raise bad(f"{what} values must be ints in [{lo}, {hi}], got {describe(v)}")
    return value


def check_shape(value: Any, limits: Limits, _payloads: Sequence[Any]) -> tuple[int, ...]:
    dims = check_int_list(value, None, 0, limits.max_tensor_bytes, "shape")
    if len(dims) > limits.max_ndim:
        raise bad(f"more than {limits.max_ndim} dimensions")
    return dims


def check_device(value: Any, limits: Limits, _payloads: Sequence[Any]) -> int:
    if not is_int(value) or not 0 <= value < limits.max_devices:
        raise bad(f"bad device index {describe(value)}")
    return int(value)


def check_frame(value: Any, _limits: Limits, payloads: Sequence[Any]) -> int:
    if not is_int(value) or not 0 <= value < len(payloads):
        raise bad(f"frame index {describe(value)} out of range (the message has {len(payloads)} payload frames)")
    return int(value)


def check_nbytes(value: Any, limits: Limits, _payloads: Sequence[Any]) -> int:
    if not is_int(value) or not 0 <= value <= limits.max_tensor_bytes:
        raise bad(f"byte count {describe(value)} out of range")
    return int(value)


def check_source(value: Any, limits: Limits, _payloads: Sequence[Any]) -> str:
    if type(value) is not str or not value or len(value.encode(errors="replace")) > limits.max_source_bytes:
        raise bad(f"kernel source must be a non-empty string of at most {limits.max_source_bytes} bytes")
    return value


def check_entry(value: Any, limits: Limits, _payloads: Sequence[Any]) -> str:
    if type(value) is not str or not value.isidentifier() or len(value) > limits.max_name_len:
        raise bad(f"bad entry point {describe(value)}")
    return value


def check_options(value: Any, limits: Limits, _payloads: Sequence[Any]) -> KernelOptions:
    if type(value) is not dict or len(value) > limits.max_options or not set(value) <= _OPTION_KEYS:
        raise bad(f"kernel options must be a map with keys from {sorted(_OPTION_KEYS)}")
    block, flags, writes = value.get("block"), value.get("flags", ()), value.get("writes")
    if type(flags) is not tuple or len(flags) > limits.max_options:
        raise bad("flags must be a list of strings")
    for flag in flags:
        if type(flag) is not str or not flag.startswith("-") or len(flag) > 256:
            raise bad(f"each compiler flag must be a string starting with '-', got {describe(flag)}")
    shared = value.get("shared", 0)
    if type(shared) is not int or not 0 <= shared <= MAX_SHARED:
        raise bad(f"shared (dynamic shared memory bytes) must be an integer in 0..{MAX_SHARED}, not {describe(shared)}")
    return KernelOptions(
        None if block is None else check_int_list(block, 3, 1, 1024, "block"),  # type: ignore[arg-type]
        flags,
        None if writes is None else check_int_list(writes, None, 0, limits.max_args - 1, "writes"),
        shared,
    )


def check_grid(value: Any, limits: Limits, _payloads: Sequence[Any]) -> tuple[int, int, int]:
    return check_int_list(value, 3, 0, limits.max_grid, "grid")  # type: ignore[return-value]


def check_writes(value: Any, limits: Limits, _payloads: Sequence[Any]) -> tuple[int, ...] | None:
    return None if value is None else check_int_list(value, None, 0, limits.max_args - 1, "writes")


def check_name(value: Any, limits: Limits, _payloads: Sequence[Any]) -> str:
    if type(value) is not str or not 0 < len(value) <= limits.max_name_len or not _NAME_RE.fullmatch(value):
        raise bad(f"bad name {describe(value)}: 1-{limits.max_name_len} of [A-Za-z0-9_.:/-]")
    return value


def check_prefix(value: Any, limits: Limits, _payloads: Sequence[Any]) -> str:
    if type(value) is not str or len(value) > limits.max_name_len or not _PREFIX_RE.fullmatch(value):
        raise bad(f"bad name prefix {describe(value)}: 0-{limits.max_name_len} of [A-Za-z0-9_.:/-]")
    return value


def check_mode(value: Any, _limits: Limits, _payloads: Sequence[Any]) -> str:
    if value not in RESIDENT_MODES or type(value) is not str:
        raise bad(f"mode must be one of {RESIDENT_MODES}, got {describe(value)}")
    return value


def check_view(value: tuple[Any, ...], limits: Limits) -> TensorView:
    """[handle, offset, shape, strides] (see `views`): bounded here; the daemon, which knows the base's
    size, checks that the view lies inside it."""
    if len(value) != 4:
        raise bad(f"a tensor view must be [handle, offset, shape, strides], got {describe(value)}")
    handle, offset, shape, strides = value
    handle = check_handle(handle, limits, ())
    if not is_int(offset) or not 0 <= offset <= limits.max_tensor_bytes:
        raise bad(f"view offset {describe(offset)} out of range")
    shape = check_shape(shape, limits, ())
    strides = check_int_list(strides, len(shape), 0, limits.max_tensor_bytes, "view strides")
    view = TensorView(handle, offset, shape, strides)
    elements, reach = math.prod(shape), extent(view)
    if elements > limits.max_tensor_bytes or reach > limits.max_tensor_bytes:
        raise bad(f"a view of {describe(elements)} elements reaching element {describe(reach)}: larger than a tensor")
    return view


def check_operand(value: Any, limits: Limits, _payloads: Sequence[Any]) -> int | TensorView:
    """A tensor: its handle, or a view of it."""
    if type(value) is tuple:
        return check_view(value, limits)
    return check_handle(value, limits, ())


def check_operands(value: Any, limits: Limits, _payloads: Sequence[Any]) -> tuple[int | TensorView, ...]:
    if type(value) is not tuple or len(value) > limits.max_graph_tensors:
        raise bad(f"tensors must be a list of at most {limits.max_graph_tensors}")
    if not value:
        return value
    # The usual case (a replay's bound tensors, handles alone) checked at once; else one by one.
    if set(map(type, value)) == {int} and min(value) > 0 and max(value) <= limits.max_handle:
        return value
    return tuple([check_operand(v, limits, ()) for v in value])


def check_args(value: Any, limits: Limits, _payloads: Sequence[Any]) -> tuple[DispatchArg, ...]:
    if type(value) is not tuple or len(value) > limits.max_args:
        raise bad(f"args must be a list of at most {limits.max_args}, got {describe(value)}")
    decoded: list[DispatchArg] = []
    max_handle = limits.max_handle
    for item in value:
        if type(item) is not tuple or len(item) != 2 or type(item[0]) is not int:  # True == 1, 1.0 == 1
            raise bad(f"each arg must be [kind, value], got {describe(item)}")
        kind, v = item
        t = type(v)
        if kind == _F32 and (t is float or t is int):
            v = float(v)
            if not f32_fits(v):
                raise bad(f"f32 argument {describe(v)} is out of the range of a 32-bit float")
            decoded.append((1, v))
        elif t is int and (
            (kind == _TENSOR and 0 < v <= max_handle)
            or (kind == _I32 and _I32_LOW <= v <= _I32_HIGH)
            or (kind == _U32 and _U32_LOW <= v <= _U32_HIGH)
        ):
            decoded.append(item)
        elif kind == _TENSOR and t is tuple:
            decoded.append((kind, check_view(v, limits)))
        else:
            raise bad(f"bad arg [{describe(kind)}, {describe(v)}]: kind {_ARG_KINDS}")
    return tuple(decoded)


def check_frame_or_none(value: Any, limits: Limits, payloads: Sequence[Any]) -> int:
    return -1 if value == -1 and is_int(value) else check_frame(value, limits, payloads)


def check_shapes(value: Any, limits: Limits, _payloads: Sequence[Any]) -> tuple[tuple[int, ...], ...]:
    if type(value) is not tuple or len(value) > limits.max_graph_tensors:
        raise bad(f"shapes must be a list of at most {limits.max_graph_tensors}")
    return tuple(check_shape(v, limits, ()) for v in value)


def check_values(value: Any, limits: Limits, _payloads: Sequence[Any]) -> tuple[int | float, ...]:
    if type(value) is not tuple or len(value) > limits.max_graph_tensors:
        raise bad(f"scalar values must be a list of at most {limits.max_graph_tensors}")
    for v in value:
        if type(v) is not int and type(v) is not float:
            raise bad(f"a scalar value must be a number, got {describe(v)}")
    return value


def check_steps(value: Any, limits: Limits, _payloads: Sequence[Any]) -> int:
    if not is_int(value) or not 1 <= value <= limits.max_replay_steps:
        raise bad(f"steps must be an int from 1 to {limits.max_replay_steps}, got {describe(value)}")
    return int(value)


def check_flag(value: Any, _limits: Limits, _payloads: Sequence[Any]) -> bool:
    if value is not True and value is not False:
        raise bad(f"a flag must be true or false, got {describe(value)}")
    return value

"""Encode and decode the messages of `schema`: the client's encoder and the daemon's decoder.

Decoding checks every field against `Limits` before anything is allocated and never calls
`str()` or `repr()` on a value from the wire (a list nested a thousand deep would recurse).
"""

from __future__ import annotations

import math
import re
import struct
import typing
from collections.abc import Sequence
from typing import Any

import msgpack

from gpud_protocol import schema
from gpud_protocol.errors import ErrorCode, ProtocolViolation
from gpud_protocol.limits import DTYPE_SIZES, Limits
from gpud_protocol.lru import LruCache
from gpud_protocol.schema import (
    Alloc,
    ArgKind,
    Batch,
    Beat,
    Bye,
    ClientMessage,
    Dispatch,
    Field,
    Hello,
    KernelOptions,
    Op,
    Opcode,
    OpError,
    Ping,
    Upload,
)
from gpud_protocol.views import TensorView, extent

_NAME_RE = re.compile(r"[A-Za-z0-9_.:/-]+")
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.:/-]*")
_OPTION_KEYS = frozenset(KernelOptions._fields)
_F32 = struct.Struct("<f")

# --------------------------------------------------------------------------- describing wire values


def describe(value: object) -> str:
    """A short description of a value from the wire, without recursing into it."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        text = str(value)
        return text if len(text) <= 24 else text[:10] + "..." + text[-6:]
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value[:40] + ("..." if len(value) > 40 else ""))
    if isinstance(value, tuple | list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return f"a map of {len(value)}"
    return f"a {type(value).__name__}"


def _bad(message: str) -> ProtocolViolation:
    return ProtocolViolation(ErrorCode.INVALID_ARGUMENT, message)


def _is_int(value: object) -> bool:
    return type(value) is int


def f32_fits(value: float) -> bool:
    """True if `value` is representable as a 32-bit float (infinities and NaN included)."""
    if not math.isfinite(value):
        return True
    try:
        _F32.pack(value)
    except OverflowError:
        return False
    return True


# --------------------------------------------------------------------------- field validators

Validator = typing.Callable[[Any, Limits, Sequence[Any]], Any]


def _handle(value: Any, limits: Limits, _payloads: Sequence[Any]) -> int:
    if not _is_int(value) or not 0 < value <= limits.max_handle:
        raise _bad(f"bad handle {describe(value)}: an int in [1, {limits.max_handle}]")
    return int(value)


def _dtype(value: Any, _limits: Limits, _payloads: Sequence[Any]) -> str:
    if type(value) is not str or value not in DTYPE_SIZES:
        raise _bad(f"dtype {describe(value)} is not one of {sorted(DTYPE_SIZES)}")
    return value


def _int_list(value: Any, length: int | None, lo: int, hi: int, what: str) -> tuple[int, ...]:
    if type(value) is not tuple or (length is not None and len(value) != length):
        raise _bad(f"{what} must be a list of {length or 'some'} ints, got {describe(value)}")
    for v in value:
        if not _is_int(v) or not lo <= v <= hi:
            raise _bad(f"{what} values must be ints in [{lo}, {hi}], got {describe(v)}")
    return value


def _shape(value: Any, limits: Limits, _payloads: Sequence[Any]) -> tuple[int, ...]:
    dims = _int_list(value, None, 0, limits.max_tensor_bytes, "shape")
    if len(dims) > limits.max_ndim:
        raise _bad(f"more than {limits.max_ndim} dimensions")
    return dims


def _device(value: Any, limits: Limits, _payloads: Sequence[Any]) -> int:
    if not _is_int(value) or not 0 <= value < limits.max_devices:
        raise _bad(f"bad device index {describe(value)}")
    return int(value)


def _frame(value: Any, _limits: Limits, payloads: Sequence[Any]) -> int:
    if not _is_int(value) or not 0 <= value < len(payloads):
        raise _bad(f"frame index {describe(value)} out of range (the message has {len(payloads)} payload frames)")
    return int(value)


def _nbytes(value: Any, limits: Limits, _payloads: Sequence[Any]) -> int:
    if not _is_int(value) or not 0 <= value <= limits.max_tensor_bytes:
        raise _bad(f"byte count {describe(value)} out of range")
    return int(value)


def _source(value: Any, limits: Limits, _payloads: Sequence[Any]) -> str:
    if type(value) is not str or not value or len(value.encode(errors="replace")) > limits.max_source_bytes:
        raise _bad(f"kernel source must be a non-empty string of at most {limits.max_source_bytes} bytes")
    return value


def _entry(value: Any, limits: Limits, _payloads: Sequence[Any]) -> str:
    if type(value) is not str or not value.isidentifier() or len(value) > limits.max_name_len:
        raise _bad(f"bad entry point {describe(value)}")
    return value


def _options(value: Any, limits: Limits, _payloads: Sequence[Any]) -> KernelOptions:
    if type(value) is not dict or len(value) > limits.max_options or not set(value) <= _OPTION_KEYS:
        raise _bad(f"kernel options must be a map with keys from {sorted(_OPTION_KEYS)}")
    block, flags, writes = value.get("block"), value.get("flags", ()), value.get("writes")
    if type(flags) is not tuple or len(flags) > limits.max_options:
        raise _bad("flags must be a list of strings")
    for flag in flags:
        if type(flag) is not str or not flag.startswith("-") or len(flag) > 256:
            raise _bad(f"each compiler flag must be a string starting with '-', got {describe(flag)}")
    return KernelOptions(
        None if block is None else _int_list(block, 3, 1, 1024, "block"),  # type: ignore[arg-type]
        flags,
        None if writes is None else _int_list(writes, None, 0, limits.max_args - 1, "writes"),
    )


def _grid(value: Any, limits: Limits, _payloads: Sequence[Any]) -> tuple[int, int, int]:
    return _int_list(value, 3, 0, limits.max_grid, "grid")  # type: ignore[return-value]


def _writes(value: Any, limits: Limits, _payloads: Sequence[Any]) -> tuple[int, ...] | None:
    return None if value is None else _int_list(value, None, 0, limits.max_args - 1, "writes")


def _name(value: Any, limits: Limits, _payloads: Sequence[Any]) -> str:
    if type(value) is not str or not 0 < len(value) <= limits.max_name_len or not _NAME_RE.fullmatch(value):
        raise _bad(f"bad name {describe(value)}: 1-{limits.max_name_len} of [A-Za-z0-9_.:/-]")
    return value


def _prefix(value: Any, limits: Limits, _payloads: Sequence[Any]) -> str:
    if type(value) is not str or len(value) > limits.max_name_len or not _PREFIX_RE.fullmatch(value):
        raise _bad(f"bad name prefix {describe(value)}: 0-{limits.max_name_len} of [A-Za-z0-9_.:/-]")
    return value


def _mode(value: Any, _limits: Limits, _payloads: Sequence[Any]) -> str:
    if value not in schema.RESIDENT_MODES or type(value) is not str:
        raise _bad(f"mode must be one of {schema.RESIDENT_MODES}, got {describe(value)}")
    return value


def _view(value: tuple[Any, ...], limits: Limits) -> TensorView:
    """[handle, offset, shape, strides] (see `views`): bounded here; the daemon, which knows the base's
    size, checks that the view lies inside it."""
    if len(value) != 4:
        raise _bad(f"a tensor view must be [handle, offset, shape, strides], got {describe(value)}")
    handle, offset, shape, strides = value
    handle = _handle(handle, limits, ())
    if not _is_int(offset) or not 0 <= offset <= limits.max_tensor_bytes:
        raise _bad(f"view offset {describe(offset)} out of range")
    shape = _shape(shape, limits, ())
    strides = _int_list(strides, len(shape), 0, limits.max_tensor_bytes, "view strides")
    view = TensorView(handle, offset, shape, strides)
    elements, reach = math.prod(shape), extent(view)
    if elements > limits.max_tensor_bytes or reach > limits.max_tensor_bytes:
        raise _bad(f"a view of {describe(elements)} elements reaching element {describe(reach)}: larger than a tensor")
    return view


def _operand(value: Any, limits: Limits, _payloads: Sequence[Any]) -> int | TensorView:
    """A tensor: its handle, or a view of it."""
    if type(value) is tuple:
        return _view(value, limits)
    return _handle(value, limits, ())


def _operands(value: Any, limits: Limits, _payloads: Sequence[Any]) -> tuple[int | TensorView, ...]:
    if type(value) is not tuple or len(value) > limits.max_graph_tensors:
        raise _bad(f"tensors must be a list of at most {limits.max_graph_tensors}")
    return tuple(_operand(v, limits, ()) for v in value)


def _args(value: Any, limits: Limits, _payloads: Sequence[Any]) -> tuple[schema.DispatchArg, ...]:
    if type(value) is not tuple or len(value) > limits.max_args:
        raise _bad(f"args must be a list of at most {limits.max_args}, got {describe(value)}")
    decoded: list[schema.DispatchArg] = []
    max_handle = limits.max_handle
    for item in value:
        if type(item) is not tuple or len(item) != 2 or type(item[0]) is not int:  # True == 1, 1.0 == 1
            raise _bad(f"each arg must be [kind, value], got {describe(item)}")
        kind, v = item
        t = type(v)
        if kind == ArgKind.F32 and (t is float or t is int):
            v = float(v)
            if not f32_fits(v):
                raise _bad(f"f32 argument {describe(v)} is out of the range of a 32-bit float")
            decoded.append((1, v))
        elif t is int and (
            (kind == ArgKind.TENSOR and 0 < v <= max_handle)
            or (kind == ArgKind.I32 and -(1 << 31) <= v < (1 << 31))
            or (kind == ArgKind.U32 and 0 <= v < (1 << 32))
        ):
            decoded.append(item)
        elif kind == ArgKind.TENSOR and t is tuple:
            decoded.append((kind, _view(v, limits)))
        else:
            raise _bad(f"bad arg [{describe(kind)}, {describe(v)}]: kind 0 tensor handle or view, 1 f32, 2 i32, 3 u32")
    return tuple(decoded)


def _graph_tensor(value: Any, limits: Limits, what: str) -> schema.GraphTensor:
    if type(value) is not tuple or len(value) != 3:
        raise _bad(f"each graph {what} must be [name, dtype, shape], got {describe(value)}")
    name, dtype, shape = value
    return schema.GraphTensor(_name(name, limits, ()), _dtype(dtype, limits, ()), _shape(shape, limits, ()))


def _graph_ref(value: Any, counts: dict[int, int], limits: Limits, scalars: bool = False) -> schema.Arg:
    """A tensor of a graph recording (kind TENSOR, INPUT, BIND or TEMP), or with `scalars` any argument."""
    if type(value) is not tuple or len(value) != 2 or type(value[0]) is not int:
        raise _bad(f"a graph reference must be [kind, value], got {describe(value)}")
    kind, v = value
    if kind == ArgKind.TENSOR:
        return (kind, _handle(v, limits, ()))
    if kind in counts:
        if kind == ArgKind.SCALAR and not scalars:
            raise _bad("a graph scalar is not a tensor")
        if not _is_int(v) or not 0 <= v < counts[kind]:
            raise _bad(f"graph reference [{kind}, {describe(v)}]: the graph has {counts[kind]} of that kind")
        return (kind, v)
    if scalars:
        return _args((value,), limits, ())[0]  # type: ignore[return-value]  # not a TENSOR: handled above
    raise _bad(f"bad graph tensor kind {describe(kind)}")


_GRAPH_KEYS = frozenset(schema.GraphDef._fields)


def _graph(value: Any, limits: Limits, payloads: Sequence[Any]) -> schema.GraphDef:
    if type(value) is not dict or not set(value) <= _GRAPH_KEYS:
        raise _bad(f"a graph must be a map with keys from {sorted(_GRAPH_KEYS)}")
    cap = limits.max_graph_tensors

    def part(key: str, bound: int) -> tuple[Any, ...]:
        items = value.get(key, ())
        if type(items) is not tuple or len(items) > bound:
            raise _bad(f"graph {key} must be a list of at most {bound}")
        return items

    inputs = tuple(_graph_tensor(v, limits, "input") for v in part("inputs", cap))
    binds = tuple(_graph_tensor(v, limits, "bound tensor") for v in part("binds", cap))
    scalars = []
    for item in part("scalars", cap):
        if type(item) is not tuple or len(item) != 2 or item[1] not in (1, 2, 3) or type(item[1]) is not int:
            raise _bad(f"each graph scalar must be [name, kind 1|2|3], got {describe(item)}")
        scalars.append(schema.GraphScalar(_name(item[0], limits, ()), item[1]))
    temps = []
    for item in part("temps", cap):
        if type(item) is not tuple or len(item) != 2:
            raise _bad(f"each graph intermediate must be [dtype, shape], got {describe(item)}")
        temps.append((_dtype(item[0], limits, ()), _shape(item[1], limits, ())))
    names = [t.name for t in inputs] + [t.name for t in binds] + [t.name for t in scalars]
    if len(set(names)) != len(names):
        raise _bad("the names of a graph's inputs, scalars and bound tensors must differ")
    counts: dict[int, int] = {ArgKind.INPUT: len(inputs), ArgKind.BIND: len(binds), ArgKind.TEMP: len(temps)}
    views: list[tuple[schema.Arg, tuple[int, ...]]] = []
    for item in part("views", cap):
        if type(item) is not tuple or len(item) != 2:
            raise _bad(f"each graph view must be [tensor, shape], got {describe(item)}")
        counts[ArgKind.VIEW] = len(views)  # a view names a tensor, or an earlier view
        views.append((_graph_ref(item[0], counts, limits), _shape(item[1], limits, ())))
    counts[ArgKind.VIEW] = len(views)
    with_scalars = {**counts, int(ArgKind.SCALAR): len(scalars)}
    steps: list[schema.GraphDispatch | schema.GraphCopy | schema.GraphUpload] = []
    for step in part("steps", limits.max_graph_steps):
        if type(step) is not tuple or not step or type(step[0]) is not int:
            raise _bad(f"a graph step must be a list [kind, ...], got {describe(step)}")
        if step[0] == 0 and len(step) == 5:
            _, kernel, grid, args, writes = step
            if type(args) is not tuple or len(args) > limits.max_args:
                raise _bad(f"args must be a list of at most {limits.max_args}")
            refs = tuple(_graph_ref(a, with_scalars, limits, scalars=True) for a in args)
            kernel, grid = _handle(kernel, limits, ()), _grid(grid, limits, ())
            steps.append(schema.GraphDispatch(kernel, grid, refs, _writes(writes, limits, ())))
        elif step[0] == 1 and len(step) == 3:
            steps.append(schema.GraphCopy(_graph_ref(step[1], counts, limits), _graph_ref(step[2], counts, limits)))
        elif step[0] == 2 and len(step) == 3:
            steps.append(schema.GraphUpload(_frame(step[1], limits, payloads), _graph_ref(step[2], counts, limits)))
        else:
            raise _bad(f"unknown graph step {describe(step[0])} with {len(step) - 1} fields")
    outputs = []
    for item in part("outputs", cap):
        if type(item) is not tuple or len(item) != 2:
            raise _bad(f"each graph output must be [name, tensor], got {describe(item)}")
        outputs.append(schema.GraphOutput(_name(item[0], limits, ()), _graph_ref(item[1], counts, limits)))
    if len({o.name for o in outputs}) != len(outputs):
        raise _bad("graph outputs need distinct names")
    return schema.GraphDef(inputs, tuple(scalars), binds, tuple(temps), tuple(steps), tuple(outputs), tuple(views))


def _frame_or_none(value: Any, limits: Limits, payloads: Sequence[Any]) -> int:
    return -1 if value == -1 and _is_int(value) else _frame(value, limits, payloads)


def _shapes(value: Any, limits: Limits, _payloads: Sequence[Any]) -> tuple[tuple[int, ...], ...]:
    if type(value) is not tuple or len(value) > limits.max_graph_tensors:
        raise _bad(f"shapes must be a list of at most {limits.max_graph_tensors}")
    return tuple(_shape(v, limits, ()) for v in value)


def _values(value: Any, limits: Limits, _payloads: Sequence[Any]) -> tuple[int | float, ...]:
    if type(value) is not tuple or len(value) > limits.max_graph_tensors:
        raise _bad(f"scalar values must be a list of at most {limits.max_graph_tensors}")
    for v in value:
        if type(v) is not int and type(v) is not float:
            raise _bad(f"a scalar value must be a number, got {describe(v)}")
    return value


_VALIDATORS: dict[Field, Validator] = {
    Field.HANDLE: _handle,
    Field.DTYPE: _dtype,
    Field.SHAPE: _shape,
    Field.DEVICE: _device,
    Field.FRAME: _frame,
    Field.NBYTES: _nbytes,
    Field.SOURCE: _source,
    Field.ENTRY: _entry,
    Field.OPTIONS: _options,
    Field.GRID: _grid,
    Field.ARGS: _args,
    Field.WRITES: _writes,
    Field.NAME: _name,
    Field.MODE: _mode,
    Field.GRAPH: _graph,
    Field.FRAME_OR_NONE: _frame_or_none,
    Field.SHAPES: _shapes,
    Field.VALUES: _values,
    Field.TENSOR: _operand,
    Field.TENSORS: _operands,
    Field.PREFIX: _prefix,
}


def _field_validators(cls: type[Any]) -> tuple[Validator, ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    validators = []
    for name in cls._fields[1:]:  # after seq
        (kind,) = [m for m in getattr(hints[name], "__metadata__", ()) if isinstance(m, Field)]
        validators.append(_VALIDATORS[kind])
    return tuple(validators)


# opcode -> (NamedTuple, validator of each field after seq), from the schema's annotations
_DECODERS: dict[int, tuple[type[Any], tuple[Validator, ...]]] = {
    int(code): (spec.type, _field_validators(spec.type)) for code, spec in schema.OPS.items()
}


# --------------------------------------------------------------------------- decode (daemon side)


def unpack_header(frame: Any, limits: Limits) -> dict[str, Any]:
    if len(frame) > limits.max_header_bytes:
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"header of {len(frame)} bytes is too large")
    try:
        header = msgpack.unpackb(
            frame,
            raw=False,
            strict_map_key=True,
            use_list=False,  # arrays decode as tuples: cheaper, hashable, ignored by the garbage collector
            max_str_len=max(limits.max_source_bytes, limits.max_name_len),
            max_bin_len=0,
            max_ext_len=0,
            max_array_len=max(limits.max_ops_per_batch, limits.max_args, limits.max_ndim, 8),
            max_map_len=64,
        )
    except Exception as exc:  # msgpack raises many types: ValueError, ExtraData, FormatError, RecursionError...
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"undecodable header: {type(exc).__name__}") from None
    if type(header) is not dict or type(header.get("t")) is not str:
        raise ProtocolViolation(ErrorCode.PROTOCOL, "header must be a map with a string 't'")
    return header


DispatchMemo = LruCache[tuple[Any, ...], tuple[Any, ...]]
DISPATCH_MEMO_SIZE = 4096


def new_dispatch_memo(capacity: int = DISPATCH_MEMO_SIZE) -> DispatchMemo:
    """A session's memo of validated dispatches, for `decode_client_message` (bounded LRU)."""
    return LruCache(capacity)


def decode_client_message(
    frames: Sequence[Any], limits: Limits, dispatch_memo: DispatchMemo | None = None
) -> ClientMessage:
    """Decode and validate one message from a client; raise ProtocolViolation if it is unusable.

    An op that fails validation becomes an `OpError` in the batch (reported against its seq);
    only a batch whose envelope is broken raises. `dispatch_memo` (one per session) remembers
    dispatches that passed validation, keyed by everything but their seq, so a repeated step is
    not checked again; keys compare by value (1 == 1.0 == True is taken as the validated op).
    """
    if not frames:
        raise ProtocolViolation(ErrorCode.PROTOCOL, "empty message")
    if sum(len(f) for f in frames) > limits.max_message_bytes:
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"message larger than {limits.max_message_bytes} bytes")
    header = unpack_header(frames[0], limits)
    kind = header["t"]
    if kind == "batch":
        return _decode_batch(header, frames[1:], limits, dispatch_memo)
    if len(frames) != 1:
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"a {describe(kind)} message carries no frames")
    if kind == "ping":
        return Ping()
    if kind == "beat":
        session, key = header.get("session"), header.get("key")
        if type(session) is not str or type(key) is not str or len(session) > 64 or len(key) > 64:
            raise ProtocolViolation(ErrorCode.PROTOCOL, "beat needs str 'session' and 'key'")
        return Beat(session, key)
    if kind == "bye":
        return Bye()
    if kind == "status":
        return schema.Status()
    if kind == "hello":
        version, name, pid = header.get("v", -1), header.get("name", ""), header.get("pid", 0)
        device = header.get("device")
        if not _is_int(version) or type(name) is not str or not _is_int(pid):
            raise ProtocolViolation(ErrorCode.PROTOCOL, "hello needs int 'v', str 'name', int 'pid'")
        if device is not None and (not _is_int(device) or not 0 <= device < limits.max_devices):
            raise ProtocolViolation(ErrorCode.PROTOCOL, "hello's 'device' must be a device index or nil")
        if len(name) > limits.max_name_len:
            raise ProtocolViolation(ErrorCode.PROTOCOL, "client name too long")
        return Hello(version, name, pid, device)
    raise ProtocolViolation(ErrorCode.PROTOCOL, f"unknown message type {describe(kind)}")


def _decode_batch(header: dict[str, Any], payloads: Sequence[Any], limits: Limits, memo: DispatchMemo | None) -> Batch:
    raw_ops, n_frames, ack = header.get("ops"), header.get("nf"), header.get("ack")
    number, receipt = header.get("b", 0), header.get("rc", False)
    if type(raw_ops) is not tuple or not _is_int(n_frames):
        raise ProtocolViolation(ErrorCode.PROTOCOL, "batch needs a list 'ops' and an int 'nf'")
    if ack is None:
        ack = ()
    elif type(ack) is not tuple or not all(_is_int(s) for s in ack):
        raise ProtocolViolation(ErrorCode.PROTOCOL, "'ack' must be a list of ints or nil")
    if not _is_int(number) or number < 0 or type(receipt) is not bool:
        raise ProtocolViolation(ErrorCode.PROTOCOL, "'b' must be a non-negative int and 'rc' a bool")
    if len(raw_ops) > limits.max_ops_per_batch:
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"more than {limits.max_ops_per_batch} ops in a batch")
    if n_frames != len(payloads) or n_frames > limits.max_frames:
        raise ProtocolViolation(
            ErrorCode.PROTOCOL, f"header announces {describe(n_frames)} payload frames, message has {len(payloads)}"
        )
    ops: list[Op | OpError] = []
    used_frames: set[int] = set()
    dispatch, new_tuple = int(Opcode.DISPATCH), tuple.__new__
    for raw in raw_ops:  # the hot loop: a memo hit costs a lookup and a tuple
        if type(raw) is not tuple or len(raw) < 2 or type(raw[0]) is not int or type(raw[1]) is not int:
            raise ProtocolViolation(ErrorCode.PROTOCOL, "an op must be a list [opcode, seq, ...]")
        if memo is not None and raw[0] == dispatch:
            try:
                fields = memo.get(raw[2:])
            except TypeError:  # a map somewhere inside: unhashable, and invalid anyway
                fields = None
            if fields is not None:
                ops.append(new_tuple(Dispatch, (raw[1], *fields)))
                continue
        try:
            op = decode_op(raw, payloads, limits)
            if memo is not None and type(op) is Dispatch:
                memo.put(raw[2:], op[1:])
            frames = _frames_of(op)
            if frames:
                if used_frames.intersection(frames) or len(set(frames)) != len(frames):
                    raise _bad(f"a payload frame of op #{op.seq} is used twice")
                used_frames.update(frames)
            ops.append(op)
        except ProtocolViolation as exc:
            used_frames.update(_claimed_frames(raw, len(payloads)))  # a failed op consumed its frames
            ops.append(OpError(raw[1], exc.code, exc.message, schema.op_name(raw[0])))
        except RecursionError:
            ops.append(OpError(raw[1], ErrorCode.INVALID_ARGUMENT, "value nested too deeply", schema.op_name(raw[0])))
    if len(used_frames) != n_frames:
        raise ProtocolViolation(ErrorCode.PROTOCOL, "some payload frames are not used by any op")
    return Batch(ops, ack, list(payloads), number, receipt)


def _frames_of(op: Op) -> list[int]:
    """The payload frames an op consumes."""
    t = type(op)
    if t is Upload or t is schema.UploadPart:
        return [op.frame]  # type: ignore[union-attr]
    if t is schema.Replay or t is schema.Launch:
        return [op.frame] if op.frame >= 0 else []  # type: ignore[union-attr]
    if t is schema.BuildGraph:
        return [s.frame for s in op.graph.steps if type(s) is schema.GraphUpload]  # type: ignore[union-attr]
    return []


def _claimed_frames(raw: tuple[Any, ...], count: int) -> list[int]:
    """Frames a malformed op names, best effort, so the batch is refused for that op alone."""

    def index(value: Any) -> list[int]:
        return [value] if _is_int(value) and 0 <= value < count else []

    code = raw[0]
    if code in (Opcode.UPLOAD, Opcode.UPLOAD_PART) and len(raw) > 3:
        return index(raw[3])
    if code in (Opcode.REPLAY, Opcode.LAUNCH) and len(raw) > 3:
        return index(raw[3])
    if code == Opcode.GRAPH and len(raw) > 5 and type(raw[5]) is dict:
        steps = raw[5].get("steps")
        if type(steps) is tuple:
            return [f for s in steps if type(s) is tuple and len(s) == 3 and s[0] == 2 for f in index(s[1])]
    return []


def decode_op(raw: tuple[Any, ...], payloads: Sequence[Any], limits: Limits) -> Op:
    """One op (a tuple from msgpack) into its NamedTuple, every field checked."""
    decoder = _DECODERS.get(raw[0])
    if decoder is None:
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"unknown opcode {describe(raw[0])}")
    cls, validators = decoder
    if len(raw) != len(validators) + 2:
        raise _bad(f"expected {len(validators)} fields, got {len(raw) - 2}")
    op: Op = cls(raw[1], *[check(value, limits, payloads) for check, value in zip(validators, raw[2:], strict=True)])
    if type(op) is Alloc:
        nbytes = op.nbytes
        if nbytes > limits.max_tensor_bytes:
            raise _bad(f"tensor of {nbytes} bytes exceeds {limits.max_tensor_bytes}")
    elif (type(op) is Upload or type(op) is schema.UploadPart) and len(payloads[op.frame]) != op.nbytes:
        raise _bad(f"frame {op.frame} holds {len(payloads[op.frame])} bytes, the op says {op.nbytes}")
    return op


# --------------------------------------------------------------------------- encode (client side)

_packer = msgpack.Packer(use_bin_type=True)


def pack(value: Any) -> bytes:
    packed: bytes = _packer.pack(value)
    return packed


def _wire(field: Any) -> Any:
    if type(field) is KernelOptions:
        return {k: v for k, v in field._asdict().items() if v is not None and v != ()}
    if type(field) is schema.GraphDef:
        return {
            "inputs": [list(t) for t in field.inputs],
            "scalars": [list(t) for t in field.scalars],
            "binds": [list(t) for t in field.binds],
            "temps": [list(t) for t in field.temps],
            "steps": [_step(step) for step in field.steps],
            "outputs": [list(o) for o in field.outputs],
            "views": [[list(ref), list(shape)] for ref, shape in field.views],
        }
    return field


def _step(step: schema.GraphDispatch | schema.GraphCopy | schema.GraphUpload) -> list[Any]:
    if type(step) is schema.GraphDispatch:
        return [0, *step]
    return [1 if type(step) is schema.GraphCopy else 2, *step]


def encode_op(op: Op) -> bytes:
    """An op as the client sends it: [opcode, seq, *fields]."""
    return pack([schema.SPEC_OF_TYPE[type(op)].opcode, *[_wire(f) for f in op]])


class DispatchEncoder:
    """Packs dispatches; the bytes of everything but the seq are kept per distinct dispatch
    (steps repeat), so encoding one costs a lookup and packing one integer."""

    PREFIX = bytes([0x96]) + pack(int(Opcode.DISPATCH))  # a msgpack array of 6, then the opcode

    def __init__(self, capacity: int = 4096) -> None:
        self._bodies: LruCache[tuple[Any, ...], bytes] = LruCache(capacity)

    def encode(self, seq: int, kernel: int, grid: tuple[int, ...], args: tuple[Any, ...], writes: Any) -> bytes:
        key = (kernel, grid, args, writes)
        body = self._bodies.get(key)
        if body is None:
            body = b"".join([pack(field) for field in key])
            self._bodies.put(key, body)
        return self.PREFIX + pack(seq) + body


_BATCH_PREFIX = b"\x86" + pack("t") + pack("batch") + pack("ops")  # a map of 6
_NF, _ACK, _B, _RC = pack("nf"), pack("ack"), pack("b"), pack("rc")


def encode_batch(
    packed_ops: bytes | bytearray,
    count: int,
    n_frames: int,
    ack: Sequence[int] | None = None,
    number: int = 0,
    receipt: bool = False,
) -> bytes:
    """A batch header from ops already packed one by one (`encode_op`, `DispatchEncoder`)."""
    if count < 16:
        array = bytes([0x90 | count])
    elif count < 1 << 16:
        array = b"\xdc" + count.to_bytes(2, "big")
    else:
        array = b"\xdd" + count.to_bytes(4, "big")
    ack_value = None if not ack else list(ack)
    tail = (_NF, pack(n_frames), _ACK, pack(ack_value), _B, pack(number), _RC, pack(receipt))
    return b"".join((_BATCH_PREFIX, array, packed_ops, *tail))


def encode_ops(ops: Sequence[Op], n_frames: int, ack: Sequence[int] | None = None, number: int = 0) -> bytes:
    return encode_batch(b"".join([encode_op(op) for op in ops]), len(ops), n_frames, ack, number)


def encode_hello(name: str, pid: int, device: int | None = None) -> bytes:
    return pack({"t": "hello", "v": schema.PROTOCOL_VERSION, "name": name, "pid": pid, "device": device})


def encode_beat(session: str, key: str) -> bytes:
    return pack({"t": "beat", "session": session, "key": key})


PING = pack({"t": "ping"})
BYE = pack({"t": "bye"})

# --------------------------------------------------------------------------- daemon -> client

PONG = pack({"t": "pong"})


def encode_reply(seq: int, **fields: Any) -> bytes:
    return pack({"t": "reply", "seq": seq, "ok": True, **fields})


def encode_part(seq: int, index: int) -> bytes:
    return pack({"t": "part", "seq": seq, "i": index})


def encode_receipt(number: int) -> bytes:
    return pack({"t": "receipt", "b": number})


def encode_error_reply(seq: int, code: ErrorCode, message: str, failed_seq: int, op: str) -> bytes:
    return pack({"t": "reply", "seq": seq, "ok": False, "err": [int(code), message, failed_seq, op]})


def encode_error(code: ErrorCode, message: str) -> bytes:
    return pack({"t": "error", "code": int(code), "msg": message})


def decode_server_message(frames: Sequence[Any], limits: Limits) -> tuple[dict[str, Any], list[Any]]:
    """A daemon message on the client, bounded like everything else: (header, payload frames)."""
    first = frames[0]
    header = unpack_header(first.buffer if hasattr(first, "buffer") else first, limits)
    return header, list(frames[1:])

"""Decode a client's message on the daemon: the envelope, each op of a batch (every field checked
against `Limits` before anything is allocated), and the payload frames the ops claim."""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Any

from gpud_protocol.daemon_batch import Body, NotCanonical, ReplayBody, read_batch
from gpud_protocol.errors import ErrorCode, ProtocolViolation
from gpud_protocol.field_types import Field
from gpud_protocol.fields import (
    Validator,
    check_args,
    check_device,
    check_dtype,
    check_entry,
    check_flag,
    check_frame,
    check_frame_or_none,
    check_grid,
    check_handle,
    check_mode,
    check_name,
    check_nbytes,
    check_operand,
    check_operands,
    check_options,
    check_prefix,
    check_shape,
    check_shapes,
    check_source,
    check_steps,
    check_values,
    check_writes,
)
from gpud_protocol.graph_def import GraphUpload
from gpud_protocol.graph_fields import check_graph
from gpud_protocol.limits import Limits
from gpud_protocol.memo import DispatchEntry, DispatchMemo, Memoized
from gpud_protocol.op_table import OPS, Opcode, op_name
from gpud_protocol.op_types import Alloc, BuildGraph, Dispatch, Launch, Op, Replay, ReplaySteps, Upload, UploadPart
from gpud_protocol.schema import Batch, Beat, Bye, ClientMessage, Doorbell, Hello, OpError, Ping, Status
from gpud_protocol.wire import bad, describe, is_int, unpack_header

_VALIDATORS: dict[Field, Validator] = {
    Field.HANDLE: check_handle,
    Field.DTYPE: check_dtype,
    Field.SHAPE: check_shape,
    Field.DEVICE: check_device,
    Field.FRAME: check_frame,
    Field.NBYTES: check_nbytes,
    Field.SOURCE: check_source,
    Field.ENTRY: check_entry,
    Field.OPTIONS: check_options,
    Field.GRID: check_grid,
    Field.ARGS: check_args,
    Field.WRITES: check_writes,
    Field.NAME: check_name,
    Field.MODE: check_mode,
    Field.GRAPH: check_graph,
    Field.FRAME_OR_NONE: check_frame_or_none,
    Field.SHAPES: check_shapes,
    Field.VALUES: check_values,
    Field.STEPS: check_steps,
    Field.FLAG: check_flag,
    Field.TENSOR: check_operand,
    Field.TENSORS: check_operands,
    Field.PREFIX: check_prefix,
}


def _field_validators(cls: type[Any]) -> tuple[Validator, ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    validators = []
    for name in cls._fields[1:]:  # after seq
        (kind,) = [m for m in getattr(hints[name], "__metadata__", ()) if isinstance(m, Field)]
        validators.append(_VALIDATORS[kind])
    return tuple(validators)


# opcode -> (NamedTuple, validator of each field after seq), from the ops' annotations (`op_types`)
_DECODERS: dict[int, tuple[type[Any], tuple[Validator, ...]]] = {
    int(code): (spec.type, _field_validators(spec.type)) for code, spec in OPS.items()
}


def decode_client_message(
    frames: Sequence[Any], limits: Limits, dispatch_memo: DispatchMemo | None = None
) -> ClientMessage:
    """Decode and validate one message from a client; raise ProtocolViolation if it is unusable.

    An op that fails validation becomes an `OpError` in the batch (reported against its seq);
    only a batch whose envelope is broken raises. `dispatch_memo` (one per session, `memo`)
    remembers dispatches that passed validation, keyed by everything but their seq, so a repeated
    step is not checked again: such a dispatch comes as `Memoized(seq, entry)`. Keys are the body's
    bytes as the client packed them, or its values where the message is read the general way
    (which compare by value: 1 == 1.0 == True is taken as the validated op).
    """
    if not frames:
        raise ProtocolViolation(ErrorCode.PROTOCOL, "empty message")
    if sum(len(f) for f in frames) > limits.max_message_bytes:
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"message larger than {limits.max_message_bytes} bytes")
    try:
        return _decode_batch(read_batch(frames[0], limits, dispatch_memo), frames[1:], limits, dispatch_memo)
    except NotCanonical:
        pass  # not the client's layout: read the general way
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
    if kind == "ring":
        return Doorbell()
    if kind == "status":
        return Status()
    if kind == "hello":
        version, name, pid = header.get("v", -1), header.get("name", ""), header.get("pid", 0)
        device = header.get("device")
        if not is_int(version) or type(name) is not str or not is_int(pid):
            raise ProtocolViolation(ErrorCode.PROTOCOL, "hello needs int 'v', str 'name', int 'pid'")
        if device is not None and (not is_int(device) or not 0 <= device < limits.max_devices):
            raise ProtocolViolation(ErrorCode.PROTOCOL, "hello's 'device' must be a device index or nil")
        if len(name) > limits.max_name_len:
            raise ProtocolViolation(ErrorCode.PROTOCOL, "client name too long")
        return Hello(version, name, pid, device)
    raise ProtocolViolation(ErrorCode.PROTOCOL, f"unknown message type {describe(kind)}")


def _decode_batch(header: dict[str, Any], payloads: Sequence[Any], limits: Limits, memo: DispatchMemo | None) -> Batch:
    raw_ops, n_frames, ack = header.get("ops"), header.get("nf"), header.get("ack")
    number, receipt = header.get("b", 0), header.get("rc", False)
    if type(raw_ops) is not tuple or not is_int(n_frames):
        raise ProtocolViolation(ErrorCode.PROTOCOL, "batch needs a list 'ops' and an int 'nf'")
    if ack is None:
        ack = ()
    elif type(ack) is not tuple or not all(is_int(s) for s in ack):
        raise ProtocolViolation(ErrorCode.PROTOCOL, "'ack' must be a list of ints or nil")
    if not is_int(number) or number < 0 or type(receipt) is not bool:
        raise ProtocolViolation(ErrorCode.PROTOCOL, "'b' must be a non-negative int and 'rc' a bool")
    if len(raw_ops) > limits.max_ops_per_batch:
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"more than {limits.max_ops_per_batch} ops in a batch")
    if n_frames != len(payloads) or n_frames > limits.max_frames:
        raise ProtocolViolation(
            ErrorCode.PROTOCOL, f"header announces {describe(n_frames)} payload frames, message has {len(payloads)}"
        )
    ops: list[Op | OpError | Memoized] = []
    used_frames: set[int] = set()
    dispatch, new_tuple = int(Opcode.DISPATCH), tuple.__new__
    for raw in raw_ops:  # the hot loop: `read_batch` found the repeated dispatches in the memo
        key: Any = None
        known = False  # a replay whose fields the memo holds checked (its frame is checked here)
        if type(raw) is Memoized:
            ops.append(raw)
            continue
        if type(raw) is ReplayBody:
            if raw.entry is not None:
                raw, known = (raw.code, raw.seq, *raw.entry.fields), True
            else:
                key, raw = (raw.code, raw.body), raw.unpacked(limits)
        elif type(raw) is Body:  # a dispatch read by `read_batch` that the memo lacked: its body's bytes
            key = raw.body
            if memo is not None and key in memo:  # added by an earlier op of this batch: one entry each
                memo.misses -= 1  # `read_batch` counted a miss before that op added it
                ops.append(new_tuple(Memoized, (raw.seq, memo.get(key))))
                continue
            raw = raw.unpacked(limits)
        elif type(raw) is not tuple or len(raw) < 2 or type(raw[0]) is not int or type(raw[1]) is not int:
            raise ProtocolViolation(ErrorCode.PROTOCOL, "an op must be a list [opcode, seq, ...]")
        elif memo is not None and raw[0] == dispatch:
            key = raw[2:]
            try:
                entry = memo.get(key)
            except TypeError:  # a map somewhere inside: unhashable, and invalid anyway
                entry = key = None
            if entry is not None:
                ops.append(new_tuple(Memoized, (raw[1], entry)))
                continue
        try:
            if known:
                op = new_tuple(_DECODERS[raw[0]][0], raw[1:])
                check_frame_or_none(op.frame, limits, payloads)
            else:
                op = decode_op(raw, payloads, limits)
            if key is not None and memo is not None:
                entry = DispatchEntry(op[1:])
                memo.put(key, entry)
                if type(op) is Dispatch:
                    ops.append(new_tuple(Memoized, (op.seq, entry)))
                    continue
            frames = _frames_of(op)
            if frames:
                if used_frames.intersection(frames) or len(set(frames)) != len(frames):
                    raise bad(f"a payload frame of op #{op.seq} is used twice")
                used_frames.update(frames)
            ops.append(op)
        except ProtocolViolation as exc:
            used_frames.update(_claimed_frames(raw, len(payloads)))  # a failed op consumed its frames
            ops.append(OpError(raw[1], exc.code, exc.message, op_name(raw[0])))
        except RecursionError:
            ops.append(OpError(raw[1], ErrorCode.INVALID_ARGUMENT, "value nested too deeply", op_name(raw[0])))
    if len(used_frames) != n_frames:
        raise ProtocolViolation(ErrorCode.PROTOCOL, "some payload frames are not used by any op")
    return Batch(ops, ack, list(payloads), number, receipt)


def _frames_of(op: Op) -> list[int]:
    """The payload frames an op consumes."""
    t = type(op)
    if t is Upload or t is UploadPart:
        return [op.frame]  # type: ignore[union-attr]
    if t is Replay or t is Launch or t is ReplaySteps:
        return [op.frame] if op.frame >= 0 else []  # type: ignore[union-attr]
    if t is BuildGraph:
        return [s.frame for s in op.graph.steps if type(s) is GraphUpload]  # type: ignore[union-attr]
    return []


def _claimed_frames(raw: tuple[Any, ...], count: int) -> list[int]:
    """Frames a malformed op names, best effort, so the batch is refused for that op alone."""

    def index(value: Any) -> list[int]:
        return [value] if is_int(value) and 0 <= value < count else []

    code = raw[0]
    if code in (Opcode.UPLOAD, Opcode.UPLOAD_PART) and len(raw) > 3:
        return index(raw[3])
    if code in (Opcode.REPLAY, Opcode.LAUNCH, Opcode.REPLAY_STEPS) and len(raw) > 3:
        return index(raw[3])
    if code == Opcode.GRAPH and len(raw) > 5 and type(raw[5]) is dict:
        steps = raw[5].get("steps")
        if type(steps) is tuple:
            return [f for s in steps if type(s) is tuple and len(s) == 3 and s[0] == 2 for f in index(s[1])]
    return []


_new_tuple = tuple.__new__


def decode_op(raw: tuple[Any, ...], payloads: Sequence[Any], limits: Limits) -> Op:
    """One op (a tuple from msgpack) into its NamedTuple, every field checked."""
    decoder = _DECODERS.get(raw[0])
    if decoder is None:
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"unknown opcode {describe(raw[0])}")
    cls, validators = decoder
    if len(raw) != len(validators) + 2:
        raise bad(f"expected {len(validators)} fields, got {len(raw) - 2}")
    values = [check(value, limits, payloads) for check, value in zip(validators, raw[2:], strict=True)]
    op: Op = _new_tuple(cls, (raw[1], *values))  # the NamedTuple without its keyword-handling constructor
    if type(op) is Alloc:
        nbytes = op.nbytes
        if nbytes > limits.max_tensor_bytes:
            raise bad(f"tensor of {nbytes} bytes exceeds {limits.max_tensor_bytes}")
    elif (type(op) is Upload or type(op) is UploadPart) and len(payloads[op.frame]) != op.nbytes:
        raise bad(f"frame {op.frame} holds {len(payloads[op.frame])} bytes, the op says {op.nbytes}")
    return op

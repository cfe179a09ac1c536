"""Encode what a client sends: ops, batches of ops already packed, hello, heartbeat, ping and bye."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpud_protocol.field_types import KernelOptions
from gpud_protocol.graph_def import GraphCopy, GraphDef, GraphDispatch, GraphUpload
from gpud_protocol.lru import LruCache
from gpud_protocol.op_table import SPEC_OF_TYPE, Opcode
from gpud_protocol.op_types import Op
from gpud_protocol.schema import PROTOCOL_VERSION
from gpud_protocol.wire import pack


def _wire(field: Any) -> Any:
    if type(field) is KernelOptions:
        return {k: v for k, v in field._asdict().items() if v is not None and v != () and v != 0}
    if type(field) is GraphDef:
        return {
            "inputs": [list(t) for t in field.inputs],
            "scalars": [list(t) for t in field.scalars],
            "binds": [list(t) for t in field.binds],
            "temps": [list(t) for t in field.temps],
            "steps": [_step(step) for step in field.steps],
            "outputs": [list(o) for o in field.outputs],
            "views": [[list(ref), list(shape)] for ref, shape in field.views],
            **({"rows": True} if field.rows else {}),
            **({"feeds": [list(f) for f in field.feeds]} if field.feeds else {}),
            **({"slots": field.slots, "state": [list(r) for r in field.state]} if field.slots else {}),
            **({"pads": [list(p) for p in field.pads]} if field.pads else {}),
        }
    return field


def _step(step: GraphDispatch | GraphCopy | GraphUpload) -> list[Any]:
    if type(step) is GraphDispatch:
        return [0, *step]
    return [1 if type(step) is GraphCopy else 2, *step]


def encode_op(op: Op) -> bytes:
    """An op as the client sends it: [opcode, seq, *fields]."""
    return pack([SPEC_OF_TYPE[type(op)].opcode, *[_wire(f) for f in op]])


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
    return pack({"t": "hello", "v": PROTOCOL_VERSION, "name": name, "pid": pid, "device": device})


def encode_beat(session: str, key: str) -> bytes:
    return pack({"t": "beat", "session": session, "key": key})


PING = pack({"t": "ping"})
BYE = pack({"t": "bye"})

"""The message schema, defined once for the client's encoder and the daemon's decoder: here the
messages a client sends; each op in `op_types` (the kinds of its fields in `field_types`, a graph's
recording in `graph_def`), opcodes and which ops are requests in `op_table`, argument and scalar
kinds in `arg_kinds`.

A message is a list of ZeroMQ frames: frame 0 is a msgpack map (the header), the other frames are
raw tensor payloads referenced by index from the header. Payloads never go inside msgpack.

Client -> daemon headers:
    {"t": "hello", "v": PROTOCOL_VERSION, "name": str, "pid": int, "device": int | None}
    {"t": "batch", "ops": [op, ...], "nf": payload frames, "ack": [failed seq, ...] | None,
     "b": batch number (1, 2, 3...), "rc": True if the client wants a receipt}
    {"t": "ping"}
    {"t": "ring"}                                  a doorbell: look at this session's ring (no reply)
    {"t": "beat", "session": id, "key": beat key}   from any socket: keeps that session's lease
    {"t": "bye"}
    {"t": "status"}                                no session needed: answered with the daemon's state

An op is a list ``[opcode, seq, *fields]``; its fields are those of its NamedTuple (`op_types`), in order.
A tensor operand (`Operand`, a dispatch's tensor argument) is a handle or a view of one,
``[handle, offset, [shape...], [strides...]]`` (`gpud_protocol.views`): a view needs no handle.
Daemon -> client headers:
    {"t": "welcome", ...}                          answer to hello (see `Welcome`)
    {"t": "redirect", "address": str, "device": int}
                                                   a process-per-device front's answer to hello: say
                                                   hello at that worker instead (`redirect.py`)
    {"t": "reply", "seq": s, "ok": True, ...}      a request op done; its fields per `REPLY_FIELDS`;
                                                   a readback's first data part follows as frame 1
    {"t": "part", "seq": s, "i": k}                part k >= 1 of a readback's data, as frame 1
    {"t": "reply", "seq": s, "ok": False, "err": [code, message, failed_seq, op name]}
    {"t": "receipt", "b": n}                       batches up to n are executed (when "rc" asked)
    {"t": "pong"}
    {"t": "ring"}                                  a doorbell: a reply waits in this session's ring
    {"t": "error", "code": c, "msg": m}            unattributable: every pending request fails
    {"t": "status", "version": str, "backend": str, "state": "serving" | "stopping", "uptime_s": float,
     "health": {"healthy": bool, "problems": [str], "stall_s": float}, "devices": [map], "sessions": [map],
     "residents": [map], "graphs": [map], "counters": map, ...}
                                                   answer to status (gpud.service.server.Server.status:
                                                   operators' tools, not the client library, read it)
"""

from __future__ import annotations

from typing import Any, NamedTuple

# Re-exported: imported from here by gpud_client.loaders and the hostile-input tests.
from gpud_protocol.field_types import RESIDENT_MODES as RESIDENT_MODES
from gpud_protocol.field_types import Field as Field
from gpud_protocol.memo import Memoized
from gpud_protocol.op_types import RESIDENTS_PER_REPLY as RESIDENTS_PER_REPLY
from gpud_protocol.op_types import Op

PROTOCOL_VERSION = 2


class OpError(NamedTuple):
    """An op that failed validation; reported against its sequence number."""

    seq: int
    code: int  # an ErrorCode
    message: str
    op: str


class Hello(NamedTuple):
    version: int
    name: str
    pid: int
    device: int | None  # the session's default device; None: the daemon picks the least loaded


class Batch(NamedTuple):
    ops: list[Op | OpError | Memoized]  # a dispatch its session's memo holds comes as `Memoized`
    ack: tuple[int, ...]  # failed seqs the client has seen
    frames: list[Any]
    number: int  # 1, 2, 3... per session; 0 from clients that do not count
    receipt: bool


class Ping(NamedTuple):
    pass


class Beat(NamedTuple):
    session: str
    key: str


class Bye(NamedTuple):
    pass


class Doorbell(NamedTuple):
    """The client wrote into its ring while the daemon slept (`gpud_protocol.ring`)."""


class Status(NamedTuple):
    """A daemon-level request (`gpud status`, `gpud stats`): needs no session."""


ClientMessage = Hello | Batch | Ping | Beat | Bye | Doorbell | Status

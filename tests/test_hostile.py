"""Hostile input: well over 10,000 generated bad messages against a real daemon, while a
well-behaved client keeps checking its results.

The actors run concurrently in one event loop, each with a DEALER socket of its own:

- tenants (`Tenant`): sessions that send windows of hostile messages (mutated ops of every type,
  other sessions' handles, stale and duplicate handles, bad frames, bad dispatches, garbage
  kernels, bad resident names, junk messages, envelope-broken batches, pings, bad beats and
  hellos), then settle: every request must have had exactly one reply, and every non-request op
  predicted to fail must have been reported (the tenant acknowledges each failure it sees, so
  the next request reports the next one). Each tenant lives several sessions, ended by bye, bye
  in mid-stream, a reconnecting hello, or by just vanishing (the lease expires);
- strangers (`Stranger`): sockets without a session sending junk, batches before hello, pings,
  bad beats and bad hellos; each must get one unattributable error (bye gets nothing), a new socket
  per window of 24 (each peer without a session has a small budget, past which the daemon drops);
- a status flood (`status_flood`: a process sending status requests as fast as it can, never reading)
  and a garbage burst (`garbage_burst`: many sockets sending more junk than their budget, never
  reading): the daemon must drop the excess, hold a bounded number of reply bytes for them, and
  forget them once they are gone (`check_sessionless`);
- a beater thread keeping the tenants' leases (lease 1 s) with their beat keys;
- the good client: `gpud_client` axpb round trips checked against numpy, the whole time.

Each tenant also keeps a canary tensor (published read-only), which the others try to read, write,
free and unpublish through their own sessions; it is read back unchanged at the end of each life.
Unknown op types of the schema are fuzzed from their annotations (`schema_fuzz`), so new ops are
covered as they land.

Everything wrong is collected as a finding and reported at the end with the seed and the counts
(`GPUD_HOSTILE_SEED`, `GPUD_HOSTILE_SCALE` change them); the daemon's log errors come with it. Then,
once every hostile session ended (bye, or its lease expired: checked with beats), the daemon's device
memory, live buffers, resident tensors, file descriptors and threads must be back at their baseline
(descriptors with a slack of FD_SLACK), and its RSS may grow by at most RSS_GROWTH_LIMIT.

Allowed, by design or by timing, and so not findings:
- an op predicted `either` may succeed or fail (the backends differ: CUDA may run a dispatch that
  WebGPU refuses); its failure must still be well formed and reported against it;
- after a bye, the answers to messages sent before it may be missing: the daemon drops what waits in
  the peer's outbox (only used when its ZeroMQ queue is full) when the session ends;
- requests of a session that ended (bye, reconnect) may go unanswered; a batch waiting behind a
  compile is dropped with its session, receipt included.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import math
import os
import random
import re
import threading
import time
import typing
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import hostile_library
import hostile_messages
import hostile_rings
import msgpack
import numpy as np
import pytest
import zmq
import zmq.asyncio
from rawpeer import Flooder
from support import BAD_ENTRY, BAD_SOURCE, Daemon, axpb, check_well_behaved, wait_for_memory

import gpud_client
import gpud_protocol as proto
from gpud.service import admin
from gpud.service.peers import SESSIONLESS_BOXES
from gpud.testing import spawn
from gpud.testing import workloads as kernels
from gpud_protocol import DTYPE_SIZES, ErrorCode, Opcode
from gpud_protocol.ops import PREFIX as OPS_PREFIX
from gpud_protocol.schema import Field

SEED = int(os.environ.get("GPUD_HOSTILE_SEED", "20261122"))
SCALE = float(os.environ.get("GPUD_HOSTILE_SCALE", "1"))
LEASE_S = 1.0
TENANTS = 4
LIVES = 4  # sessions per tenant, each ended another way
RING_LIVES = len(hostile_rings.DAMAGES)  # ring sessions per ring abuser, each ring broken another way
WINDOWS_PER_LIFE = max(1, round(64 * SCALE))
STRANGERS = 2
STRANGER_MESSAGES = max(16, round(2500 * SCALE))
MIN_HOSTILE_MESSAGES = 10_000
REPLY_TIMEOUT_S = 30.0  # a reply later than this counts as missing (a compile on a loaded lavapipe is slow)
FAIL_BUDGET = 40  # ops that may fail per window: below the daemon's 64 unacknowledged failures kept per session
FD_SLACK = 2  # ZeroMQ may keep a socket of a peer that just left for a moment
# RSS may grow (caches, allocator arenas), but a leak of ~100 KiB per new buffer binding or per 50
# submissions shows at this workload's ~2,000 of each: 128 MiB, net of the staging pools (bounded by
# staging_pool_bytes, pinned host memory on cuda), tells those apart from growth that settles.
RSS_GROWTH_LIMIT = 128 << 20

LIMITS = proto.DEFAULT_LIMITS
MAX_HANDLE = LIMITS.max_handle
TENSOR, F32, I32, U32 = (
    int(k) for k in (proto.ArgKind.TENSOR, proto.ArgKind.F32, proto.ArgKind.I32, proto.ArgKind.U32)
)
INPUT, BIND, TEMP, SCALAR = (
    int(k) for k in (proto.ArgKind.INPUT, proto.ArgKind.BIND, proto.ArgKind.TEMP, proto.ArgKind.SCALAR)
)
GRAPH_N = 256  # elements of the valid graph's input, intermediate and bound output
ROWS_W = 64  # elements of a row of the row-independent graph
PROTOCOL, INVALID, NOT_FOUND, COMPILE = ErrorCode.PROTOCOL, ErrorCode.INVALID_ARGUMENT, ErrorCode.NOT_FOUND, 4
PERMISSION, SESSION, EXISTS, INTERNAL = ErrorCode.PERMISSION_DENIED, ErrorCode.SESSION, ErrorCode.ALREADY_EXISTS, 9
CODES = frozenset(int(c) for c in ErrorCode)
NAME_RE = re.compile(r"[A-Za-z0-9_.:/-]+")
FOLDED_RE = re.compile(r"and (\d+) later failed ops up to op #(-?\d+)")
OPTION_KEYS = frozenset(proto.KernelOptions._fields)

# --------------------------------------------------------------------------- findings


class Kind:
    """What went wrong; every finding fails the test."""

    INTERNAL = "INTERNAL error (a daemon bug)"
    DIED = "the daemon died or stopped answering"
    MISSING = "no reply (a message or op silently dropped, or a hang)"
    EXTRA = "unexpected or duplicate message"
    SHAPE = "malformed reply or error"
    CODE = "wrong error code or op name"
    UNREPORTED = "a failed op was never reported"
    SUCCEEDED = "an op that must fail succeeded"
    FAILED = "an op that must succeed failed"
    REFUSED = "a submission was refused (the daemon let an invalid op through)"
    DATA = "wrong data (isolation or integrity)"
    GOOD = "the good client saw an error"
    LEAK = "a resource did not return to its baseline"
    BUDGET = "a peer without a session was not held to its budget"


class Findings:
    KEEP = 25  # examples kept per kind

    def __init__(self) -> None:
        self.examples: dict[str, list[str]] = collections.defaultdict(list)
        self.counts: collections.Counter[str] = collections.Counter()

    def add(self, kind: str, text: str) -> None:
        self.counts[kind] += 1
        if len(self.examples[kind]) < self.KEEP:
            self.examples[kind].append(text)

    def __bool__(self) -> bool:
        return bool(self.counts)

    def report(self) -> str:
        lines = []
        for kind, count in self.counts.most_common():
            lines.append(f"* {kind}: {count}")
            lines.extend(f"    - {text}" for text in self.examples[kind])
        return "\n".join(lines)


@dataclasses.dataclass
class Run:
    """What the actors share: findings, counters, and what each tenant made (for the others to misuse)."""

    address: str
    backend: str
    kernel_source: str
    kernel_options: dict[str, Any]
    findings: Findings = dataclasses.field(default_factory=Findings)
    counts: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    handles: dict[int, collections.deque[int]] = dataclasses.field(default_factory=dict)  # tenant -> recent handles
    canaries: dict[int, int] = dataclasses.field(default_factory=dict)  # tenant -> its canary's handle
    kernels: dict[int, int] = dataclasses.field(default_factory=dict)  # tenant -> its kernel handle
    published: dict[str, Published] = dataclasses.field(default_factory=dict)  # confirmed resident names
    all_names: set[str] = dataclasses.field(default_factory=set)  # every name a publish may have created
    graphs: dict[int, int] = dataclasses.field(default_factory=dict)  # tenant -> its graph's handle
    graph_names: set[str] = dataclasses.field(default_factory=set)  # every graph name a publish may have created
    published_graphs: set[str] = dataclasses.field(default_factory=set)  # confirmed published graph names
    sessions: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # every hostile (session, key)
    live: dict[str, str] = dataclasses.field(default_factory=dict)  # session -> key, for the beater
    live_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    hostile_done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    devices: int = 1  # as the welcome says

    def foreign_handle(self, me: int, rng: random.Random) -> int:
        others = [h for t, hs in self.handles.items() if t != me for h in hs]
        others += [h for t, h in self.canaries.items() if t != me]
        return rng.choice(others) if others else (me + 2) * 100_000_000 + 1


@dataclasses.dataclass(frozen=True)
class Published:
    owner: int
    mode: str
    dtype: str
    shape: tuple[int, ...]
    data: bytes | None  # known contents (a canary), or None


# --------------------------------------------------------------------------- packing by hand


class Raw(bytes):
    """Bytes that go into a message as they are (msgpack already, possibly broken on purpose)."""


def pack(value: Any) -> bytes:
    if isinstance(value, Raw):
        return bytes(value)
    if isinstance(value, list) and any(isinstance(v, Raw) for v in value):
        return _array_header(len(value)) + b"".join(pack(v) for v in value)
    if isinstance(value, dict) and any(isinstance(v, Raw) for v in value.values()):
        return _map_header(len(value)) + b"".join(pack(k) + pack(v) for k, v in value.items())
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def _array_header(n: int) -> bytes:
    return (
        bytes([0x90 | n])
        if n < 16
        else b"\xdc" + n.to_bytes(2, "big")
        if n < 1 << 16
        else b"\xdd" + n.to_bytes(4, "big")
    )


def _map_header(n: int) -> bytes:
    return bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big")


def deep_list(depth: int) -> Raw:
    return Raw(b"\x91" * depth + b"\x01")


def deep_map(depth: int) -> Raw:
    return Raw(b"\x81\xa1k" * depth + b"\x01")


def bad_utf8() -> Raw:
    return Raw(b"\xa4\xff\xfe\xc3\x28")  # a str of 4 bytes that are not UTF-8


UNKNOWN_OPCODES = [0, 14, 15, 21, 42, 99, 127, 128, 255, 65535, -1, -(2**63), 2**63 - 1, 2**64 - 1]
NAN, INF = math.nan, math.inf
# Values that decode (msgpack-wise) but are wrong for most fields; each field's check rerolls the valid ones.
# fmt: off
FIELD_POOL: list[Any] = [
    None, True, False, 0, -1, 1, 2, 2**31 - 1, 2**31, 2**32, 2**63 - 1, -(2**63), 2**64 - 1,
    0.0, -0.0, 1.5, 1e300, -1e300, INF, -INF, NAN,
    "", "x", "float32", "float128", "object", "ro", "rw", "rx", "RO", "main", "bad name!", "a" * 129, "1abc",
    "\u00e9\u4e2d", "a\x00b", "../../etc/passwd",
    [], [1], [1, 1, 1], [0, 0, 0], [1, 1, 1, 1], [-1, 1, 1], [1.0, 1, 1], [2**31, 1, 1], [[1, 1, 1]], [1] * 9,
    [None], ["a"], [[0, 1]], [[9, 1]], [[1, "x"]], [[0, -1]], [[2, 2**40]], [[3, -1]], [[1, 1e300]],
    {"a": 1}, {}, {"block": [0, 1, 1]}, {"flags": "x"}, {"flags": ["O3"]}, {"writes": [99]}, {"block": [1, 1]},
]
# fmt: on
RARE_POOL: list[Any] = [deep_list(900), deep_map(300), list(range(4096)), "y" * 200_000]


def is_int(value: Any) -> bool:
    return type(value) is int


def _ints(value: Any, length: int | None, lo: int, hi: int) -> bool:
    return (
        type(value) is list
        and (length is None or len(value) == length)
        and all(is_int(v) and lo <= v <= hi for v in value)
    )


def _options_ok(value: Any) -> bool:
    if type(value) is not dict or not set(value) <= OPTION_KEYS:
        return False
    block, flags, writes = value.get("block"), value.get("flags", []), value.get("writes")
    return (
        (block is None or _ints(block, 3, 1, 1024))
        and type(flags) is list
        and all(type(f) is str and f.startswith("-") for f in flags)
        and (writes is None or _ints(writes, None, 0, LIMITS.max_args - 1))
    )


def _args_ok(value: Any) -> bool:
    if type(value) is not list or len(value) > LIMITS.max_args:
        return False
    for item in value:
        if type(item) is not list or len(item) != 2 or not is_int(item[0]):
            return False
        kind, v = item
        if kind == F32 and type(v) in (int, float) and (not math.isfinite(v) or abs(v) < 3.5e38):
            continue
        if is_int(v) and (
            (kind == TENSOR and 0 < v <= MAX_HANDLE)
            or (kind == I32 and -(2**31) <= v < 2**31)
            or (kind == U32 and 0 <= v < 2**32)
        ):
            continue
        return False
    return True


def field_may_pass(kind: str, value: Any, devices: int) -> bool:
    """Could `value` pass as this field (by the rules schema.py documents)? Such values are rerolled
    when a mutation must fail; erring towards True only costs a reroll."""
    if isinstance(value, Raw):
        return False
    match kind:
        case "handle":
            return is_int(value) and 0 < value <= MAX_HANDLE
        case "dtype":
            return type(value) is str and value in DTYPE_SIZES
        case "shape":
            return _ints(value, None, 0, LIMITS.max_tensor_bytes) and len(value) <= LIMITS.max_ndim
        case "device":
            return is_int(value) and 0 <= value < devices
        case "frame":
            return is_int(value) and 0 <= value <= LIMITS.max_frames
        case "nbytes":
            return is_int(value)  # the op fails unless it is the frame's size: only ints are rerolled
        case "source":
            return type(value) is str and bool(value)
        case "entry":
            return type(value) is str and value.isidentifier() and len(value) <= LIMITS.max_name_len
        case "options":
            return _options_ok(value)
        case "grid":
            return _ints(value, 3, 0, LIMITS.max_grid)
        case "args":
            return _args_ok(value)
        case "writes":
            return value is None or _ints(value, None, 0, LIMITS.max_args - 1)
        case "name":
            return type(value) is str and 0 < len(value) <= LIMITS.max_name_len and bool(NAME_RE.fullmatch(value))
        case "mode":
            return value in ("ro", "rw") and type(value) is str
        case "steps":
            return is_int(value) and 1 <= value <= LIMITS.max_replay_steps
    raise AssertionError(kind)


# fmt: off
KNOWN_KINDS = frozenset([
    "handle", "dtype", "shape", "device", "frame", "nbytes", "source", "entry", "options", "grid", "args", "writes",
    "name", "mode", "steps",
])
# fmt: on


def schema_kinds(opcode: int) -> list[str]:
    """The kind of each field after seq of an op type, from schema.py's annotations (as the codec reads them)."""
    cls = proto.OPS[Opcode(opcode)].type
    hints = typing.get_type_hints(cls, include_extras=True)
    kinds = []
    for name in cls._fields[1:]:
        marks = [m for m in getattr(hints[name], "__metadata__", ()) if isinstance(m, Field)]
        kinds.append(marks[0].value if marks else "?")
    return kinds


def same_value(a: Any, b: Any) -> bool:
    """Python equality (1 == 1.0 == True), as the daemon's dispatch memo compares."""
    try:
        return bool(a == b)
    except Exception:
        return False


# --------------------------------------------------------------------------- messages that break before any session


def junk_messages(rng: random.Random) -> tuple[list[bytes], str]:
    """A message that must get an unattributable PROTOCOL error, whatever the session."""
    hello: dict[str, Any] = {"t": "hello", "v": proto.PROTOCOL_VERSION, "name": "hostile", "pid": 1}
    choice = rng.randrange(22)
    match choice:
        case 0:
            return [rng.randbytes(rng.randrange(1, 64))], "random bytes"
        case 1:
            return [rng.randbytes(rng.randrange(64, 4096))], "random bytes (long)"
        case 2:
            return [b""], "an empty frame"
        case 3:
            return [pack(rng.choice([1, "x", [1, 2], None, 1.5, True]))], "not a map"
        case 4:
            return [pack({"x": 1})], "a map without 't'"
        case 5:
            return [pack({"t": rng.choice([1, None, [], {}, 2.5, True])})], "'t' not a string"
        case 6:
            return [
                pack({"t": rng.choice(["nope", "", "Batch", "welcome", "reply", "error", "x" * 100])})
            ], "unknown 't'"
        case 7:
            whole = pack(hello)
            return [whole[: rng.randrange(1, len(whole))]], "a truncated hello"
        case 8:
            return [pack({"t": "ping"}) + rng.randbytes(rng.randrange(1, 8))], "trailing bytes"
        case 9:
            return [b"\x81\x01\xa4ping"], "an int map key"
        case 10:
            return [pack({"t": "ping", "x": b"bin"})], "a bin value"
        case 11:
            return [Raw(b"\x82\xa1t\xa4ping\xa1x\xd4\x03\x00")], "an ext value"
        case 12:
            return [pack({"t": "ping", **{f"k{i}": i for i in range(65)}})], "a map of 65 keys"
        case 13:
            return [pack({"t": "ping", "x": deep_list(1100)})], "nested deeper than msgpack's stack"
        case 14:
            return [pack({"t": "ping", "x": list(range(5000))})], "an array past the bound"
        case 15:
            return [pack({"t": "ping", "x": bad_utf8()})], "a string that is not UTF-8"
        case 16:
            kind = rng.choice(["ping", "bye", "hello"])
            msg = pack(hello) if kind == "hello" else pack({"t": kind})
            return [msg, *[rng.randbytes(3)] * rng.randrange(1, 4)], f"a {kind} with payload frames"
        case 17:
            bad = dict(hello)
            key = rng.choice(["v", "name", "pid", "device"])
            bad[key] = rng.choice(
                ["2", 2.0, None, [2], {"a": 1}, -1, 64, 2**40, "x" * 200] if key != "v" else ["2", 2.0, [2]]
            )
            if key == "device" and bad[key] is None:
                bad[key] = -1
            if key == "name" and isinstance(bad[key], str) and len(bad[key]) <= LIMITS.max_name_len:
                bad[key] = 5
            if key == "pid" and is_int(bad[key]):
                bad[key] = "1"
            return [pack(bad)], f"a hello with a bad {key}"
        case 18:
            beat = {"t": "beat", "session": rng.choice([1, None, "s" * 65, [1]]), "key": rng.choice(["k", 2, "k" * 65])}
            return [pack(beat)], "a malformed beat"
        case 19:
            return [
                pack({"t": "ping", "pad": "p" * (LIMITS.max_header_bytes + rng.randrange(1, 100))})
            ], "a header past the bound"
        case 20:
            return [
                pack({"t": "ping", "s": "s" * (max(LIMITS.max_source_bytes, LIMITS.max_name_len) + 1)})
            ], "a string past the bound"
        case _:
            return [Raw(b"\xc1") + rng.randbytes(4)], "a never-used msgpack byte"


def broken_batch(rng: random.Random) -> tuple[list[bytes], str]:
    """A batch whose envelope is broken: one unattributable PROTOCOL error, none of its ops run."""
    sync = [int(Opcode.SYNC), 7]
    base: dict[str, Any] = {"t": "batch", "ops": [sync], "nf": 0, "ack": None, "b": 1, "rc": False}
    choice = rng.randrange(17)
    match choice:
        case 0:
            base["ops"] = rng.choice([{"a": 1}, 5, "ops", None, True])
            return [pack(base)], "'ops' not a list"
        case 1:
            del base[rng.choice(["ops", "nf"])]
            return [pack(base)], "'ops' or 'nf' missing"
        case 2:
            base["nf"] = rng.choice([None, "0", 0.0, True, [0]])
            return [pack(base)], "'nf' not an int"
        case 3:
            base["nf"] = rng.choice([1, 2, -1, 2**63 - 1])
            return [pack(base)], "'nf' announces frames that are not there"
        case 4:
            return [pack(base), b"unused"], "a payload frame no op uses"
        case 5:
            base["ack"] = rng.choice([5, "x", [1.5], [None], [[1]], {"a": 1}, [True]])
            return [pack(base)], "'ack' not a list of ints"
        case 6:
            base["b"] = rng.choice([-1, "1", 1.0, None, -(2**63)])
            return [pack(base)], "'b' not a non-negative int"
        case 7:
            base["rc"] = rng.choice([1, "yes", None, 0])
            return [pack(base)], "'rc' not a bool"
        case 8:
            base["ops"] = [sync, rng.choice([5, "op", None, {"a": 1}, 1.5])]
            return [pack(base)], "an op that is not a list"
        case 9:
            base["ops"] = [rng.choice([[], [7], [1.0, 1], ["sync", 1], [None, 1], [True, 1]])]
            return [pack(base)], "an op without an int opcode"
        case 10:
            base["ops"] = [[int(Opcode.SYNC), rng.choice([1.0, "1", None, True, [1], {"s": 1}])]]
            return [pack(base)], "an op without an int seq"
        case 11:
            base["ops"] = [[int(Opcode.SYNC), i] for i in range(LIMITS.max_ops_per_batch + 1)]
            return [pack(base)], "more ops than the bound"
        case 12:
            count = LIMITS.max_frames + 1
            ops = [[int(Opcode.UPLOAD), i, 1, i, 1] for i in range(count)]
            return [pack({**base, "ops": ops, "nf": count}), *[b"x"] * count], "more frames than the bound"
        case 13:
            base["ops"] = [[int(Opcode.READBACK), 1, deep_list(1030)]]
            return [pack(base)], "an op nested past msgpack's stack"
        case 14:
            base["ops"] = [[int(Opcode.OPEN), 1, 5, bad_utf8()]]
            return [pack(base)], "a name that is not UTF-8"
        case 15:
            base["ops"] = [[int(Opcode.UPLOAD), 1, 5, 0, 3]]
            base["nf"] = 1
            return [pack(base), b"abc", b"def"], "more frames than the header says"
        case _:
            base["ops"] = [[int(Opcode.UPLOAD), 1, 5, 0, 3], [int(Opcode.UPLOAD), 2, 6, 1, 3]]
            base["nf"] = 2
            return [pack(base), b"abc"], "fewer frames than the header says"


# --------------------------------------------------------------------------- a peer


@dataclasses.dataclass
class Expect:
    op: str  # the op's name as errors name it
    fail: bool | None  # True: must fail; False: must succeed; None: either
    codes: frozenset[int] | None  # the codes its own failure may carry (None: any)
    note: str
    names: str = ""  # a text its failure's message must hold (the op the user called, what was wrong)

    def __str__(self) -> str:
        return f"{self.op} ({self.note})"


def ok(op: str, note: str) -> Expect:
    return Expect(op, False, None, note)


def fails(op: str, note: str, *codes: int, names: str = "") -> Expect:
    return Expect(op, True, frozenset(int(c) for c in codes) or None, note, names)


def either(op: str, note: str, *codes: int) -> Expect:
    return Expect(op, None, frozenset(int(c) for c in codes) or None, note)


EXPECT = hostile_library.Expectations(ok, fails, either)  # for the generators of hostile_library and _messages


Then = Callable[["Sent", bool], None]  # (the op, whether it failed); for requests called on the reply


@dataclasses.dataclass
class Sent:
    seq: int
    order: int  # position among every op the session was sent
    batch: int  # the batch number that carried it
    exp: Expect
    request: bool
    then: Then | None = None
    nbytes: int | None = None  # readback: the size it must have
    data: bytes | None = None  # readback: the contents it must have
    reply: dict[str, Any] | None = None
    chunks: list[bytes] = dataclasses.field(default_factory=list)
    parts_left: int = 0
    reported: bool = False
    acked_in: int | None = None
    payload: bytes = b""  # a readback's or replay's data, once complete


class Peer:
    """A DEALER socket, its reader task, and the unattributable answers it waits for."""

    def __init__(self, ctx: zmq.asyncio.Context, run: Run, name: str) -> None:
        self.ctx = ctx
        self.run = run
        self.name = name
        self.findings = run.findings
        self.expected: list[tuple[frozenset[str], str]] = []  # answers that name no seq, in send order
        self.late: list[tuple[frozenset[str], str]] = []  # given up on (reported missing)
        self.changed = asyncio.Event()
        self.sock: zmq.asyncio.Socket | None = None
        self.reader: asyncio.Task[None] | None = None
        self.welcome: dict[str, Any] | None = None
        self.welcomes = 0
        self.phase = ""  # where the actor is, for reports

    def connect(self) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.run.address)
        self.sock = sock
        self.reader = asyncio.create_task(self._read(sock))

    async def disconnect(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.reader
        if self.sock is not None:
            self.sock.close(linger=0)
        self.sock = self.reader = None

    async def send(self, frames: list[bytes], *, hostile: bool = True) -> None:
        assert self.sock is not None
        await self.sock.send_multipart(frames)
        self.run.counts["hostile messages" if hostile else "control messages"] += 1

    def expect(self, accepted: str | set[str], what: str) -> None:
        self.expected.append((frozenset([accepted] if isinstance(accepted, str) else accepted), what))

    async def _read(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sock.recv_multipart()
            try:
                self.on_frames([bytes(f) for f in frames])
            except Exception as exc:  # a bug of this test: say so rather than hang
                self.findings.add(Kind.SHAPE, f"{self.name}: reading a message failed: {exc!r}")
            self.changed.set()

    def on_frames(self, frames: list[bytes]) -> None:
        try:
            header = msgpack.unpackb(frames[0], raw=False)
        except Exception as exc:
            self.findings.add(Kind.SHAPE, f"{self.name}: undecodable message from the daemon: {exc!r}")
            return
        if type(header) is not dict:
            self.findings.add(Kind.SHAPE, f"{self.name}: a message that is not a map: {short(header)}")
            return
        kind = header.get("t")
        if kind == "reply":
            self.on_reply(header, frames[1:])
        elif kind == "part":
            self.on_part(header, frames[1:])
        elif kind == "error":
            code = self.check_error(header.get("code"), header.get("msg"), "an unattributable error")
            self.match(f"error:{code}", header)
        elif kind == "welcome":
            self.match("welcome", header)
            self.on_welcome(header)
        elif kind in ("pong", "receipt"):
            self.match("pong" if kind == "pong" else f"receipt:{header.get('b')}", header)
        else:
            self.findings.add(Kind.EXTRA, f"{self.name}: a message of unknown type: {short(header)}")

    def check_error(self, code: Any, message: Any, what: str) -> int:
        if code == INTERNAL:
            self.findings.add(Kind.INTERNAL, f"{self.name}: {what}: {message!r}")
        elif not is_int(code) or code not in CODES:
            self.findings.add(Kind.SHAPE, f"{self.name}: {what} with code {code!r}: {message!r}")
        if type(message) is not str or not message:
            self.findings.add(Kind.SHAPE, f"{self.name}: {what} without a message (code {code!r})")
        return code if is_int(code) else -1

    def match(self, token: str, header: dict[str, Any]) -> None:
        for pending in (self.expected, self.late):
            for i, (accepted, _what) in enumerate(pending):
                if token in accepted:
                    del pending[i]
                    return
        waiting = "; ".join(f"{what} ({'|'.join(sorted(a))})" for a, what in self.expected[:3]) or "nothing"
        self.findings.add(Kind.EXTRA, f"{self.name}: unexpected {token}: {short(header)}; waiting for {waiting}")

    def on_reply(self, header: dict[str, Any], payload: list[bytes]) -> None:
        self.findings.add(Kind.EXTRA, f"{self.name}: a reply without a session: {short(header)}")

    def on_part(self, header: dict[str, Any], payload: list[bytes]) -> None:
        self.findings.add(Kind.EXTRA, f"{self.name}: a reply part without a session: {short(header)}")

    def on_welcome(self, header: dict[str, Any]) -> None:
        self.welcome = header
        self.welcomes += 1

    def pending(self) -> bool:
        return bool(self.expected)

    def describe_pending(self) -> str:
        return "; ".join(f"{what} ({'|'.join(sorted(a))})" for a, what in self.expected[:5])

    def give_up(self) -> None:
        self.late.extend(self.expected)
        self.expected.clear()

    async def wait_for(
        self, done: Callable[[], bool], what: Callable[[], str], timeout: float = REPLY_TIMEOUT_S
    ) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if done():
                return True
            self.changed.clear()
            if done():
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                self.findings.add(Kind.MISSING, f"{self.name} ({self.phase}): nothing within {timeout:.0f} s: {what()}")
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)

    async def wait_idle(self) -> None:
        if not await self.wait_for(lambda: not self.pending(), self.describe_pending):
            self.give_up()


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 300 else text[:300] + "..."


# --------------------------------------------------------------------------- strangers: no session


class Stranger(Peer):
    def __init__(self, ctx: zmq.asyncio.Context, run: Run, index: int) -> None:
        super().__init__(ctx, run, f"stranger{index}")
        self.rng = random.Random(f"{SEED}-stranger-{index}")

    async def main(self, count: int) -> None:
        self.connect()
        rng, sent, big = self.rng, 0, 0
        try:
            while sent < count:
                for _ in range(min(24, count - sent)):
                    sent += 1
                    await self.one(rng, allow_big=big < 3)
                    big += self.last_big
                await self.wait_idle()
                # A new socket (a new peer) per window: each peer without a session has a budget of
                # `sessionless_rate` messages a second, past which the daemon drops, unanswered.
                await self.disconnect()
                self.connect()
        finally:
            await self.disconnect()

    last_big = 0

    async def one(self, rng: random.Random, allow_big: bool) -> None:
        self.last_big = 0
        kind = rng.randrange(10)
        if kind <= 3:
            frames, what = junk_messages(rng)
            while not allow_big and len(frames[0]) > 100_000:
                frames, what = junk_messages(rng)
            self.last_big = int(len(frames[0]) > 100_000)
            self.expect("error:1", what)
        elif kind == 4:
            frames, what = broken_batch(rng)
            self.expect("error:1", what)
        elif kind == 5:  # a well-formed batch before any hello
            ops = [[int(rng.choice(list(Opcode))), 1, 1]] * rng.randrange(0, 4)
            frames, what = [proto.encode_batch(b"".join(pack(op) for op in ops), len(ops), 0)], "a batch before hello"
            self.expect("error:10", what)
        elif kind == 6:
            frames, what = [proto.PING], "a ping without a session"
            self.expect("error:10", what)
        elif kind == 7:  # a beat with a wrong key, for a real session or none
            sessions = self.run.sessions
            session = rng.choice(sessions)[0] if sessions and rng.random() < 0.7 else rng.randbytes(8).hex()
            frames, what = (
                [proto.encode_beat(session, rng.choice(["", "0" * 32, rng.randbytes(16).hex()]))],
                "a bad beat",
            )
            self.expect("error:10", what)
        elif kind == 8:
            frames, what = bad_hello(rng, self.run)
            self.expect(f"error:{int(ErrorCode.INVALID_ARGUMENT) if 'device' in what else 1}", what)
        else:
            frames, what = [proto.BYE], "a bye without a session"  # no answer: nothing to end
        await self.send(frames)


def bad_hello(rng: random.Random, run: Run) -> tuple[list[bytes], str]:
    """A hello the daemon must refuse: another protocol version, or a device it does not have."""
    if rng.random() < 0.7:
        version = rng.choice([0, 1, proto.PROTOCOL_VERSION + 1, -1, 2**63 - 1, -(2**63)])
        return [pack({"t": "hello", "v": version, "name": "h", "pid": 1})], "a hello of another version"
    # The last index the protocol allows: strangers may run before any welcome told the device count.
    return [pack({"t": "hello", "v": proto.PROTOCOL_VERSION, "name": "h", "pid": 1, "device": 63})], (
        "a hello for a device that does not exist"
    )


# --------------------------------------------------------------------------- floods: no session, never reading

FLOOD_S = 1.0
BURST_PEERS = 32
BURST_MESSAGES = 150  # per peer: more than its budget lets through at once (`sessionless_rate`: 100 a second)
SESSIONLESS_TOTAL_RATE = 100_000  # the strangers' windows together may pass the default (1,000 a second)
SESSIONLESS_REPLY_BYTES = 1 << 20  # the default of `sessionless_reply_bytes`


async def status_flood(run: Run) -> None:
    """A peer without a session sends status requests as fast as it can and never reads: the daemon
    drops what is over its budget and holds at most `sessionless_reply_bytes` of replies for it."""
    flooder = Flooder(run.address, FLOOD_S, "status")
    try:
        await flooder.start()
        run.counts["flood messages"] += await flooder.flooded()
        status = await asyncio.to_thread(admin.query, run.address, REPLY_TIMEOUT_S)  # the flooder still connected
        # the flooder's own budget; the other peers without a session (strangers, the burst) have theirs besides
        outboxes = status["outboxes"]
        most, waiting = outboxes["sessionless_most_bytes_waiting"], outboxes["sessionless_bytes_waiting"]
        if most > SESSIONLESS_REPLY_BYTES:
            run.findings.add(Kind.BUDGET, f"{most} reply bytes wait for one peer without a session that does not read")
        if waiting > SESSIONLESS_BOXES * SESSIONLESS_REPLY_BYTES:
            run.findings.add(Kind.BUDGET, f"{waiting} reply bytes wait for peers without a session that do not read")
        if not status["counters"].get("sessionless_dropped"):
            run.findings.add(Kind.BUDGET, "a status flood went past its budget and nothing was dropped")
    except Exception as exc:
        run.findings.add(Kind.BUDGET, f"the status flood: {type(exc).__name__}: {exc}")
    finally:
        await flooder.close()


async def garbage_burst(run: Run, ctx: zmq.asyncio.Context) -> None:
    """Many peers without a session each send more junk than their budget, never read, and leave."""
    rng = random.Random(f"{SEED}-burst")
    socks: list[zmq.asyncio.Socket] = []
    try:
        for _ in range(BURST_PEERS):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 1)
            sock.connect(run.address)
            socks.append(sock)
            for _ in range(BURST_MESSAGES):
                frames, _what = junk_messages(rng)
                while len(frames[0]) > 4096:
                    frames, _what = junk_messages(rng)
                await sock.send_multipart(frames)
                await asyncio.sleep(0)  # a send that need not wait does not yield: the other actors go on
            run.counts["burst messages"] += BURST_MESSAGES
        await asyncio.sleep(0.5)  # delivered before the sockets close
    finally:
        for sock in socks:
            sock.close(linger=0)


async def check_sessionless(run: Run) -> None:
    """Once the floods are over, nothing of them is left: no budget remembered, no reply waiting."""
    status = await asyncio.to_thread(admin.query, run.address, REPLY_TIMEOUT_S)
    if (peers := status.get("sessionless_peers", -1)) > 4 or peers < 0:  # this query's, beat sockets just closed
        run.findings.add(Kind.LEAK, f"the daemon keeps the budgets of {peers} peers without a session (-1: unknown)")
    if (waiting := status["outboxes"].get("peers_waiting", 0)) != 0:
        run.findings.add(Kind.LEAK, f"replies still wait for {waiting} peer(s) after every peer left")


# --------------------------------------------------------------------------- tenants: hostile sessions


@dataclasses.dataclass
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    data: bytes | None  # known contents, or None
    canary: bool = False
    published: bool = False


@dataclasses.dataclass
class Item:
    seq: int
    packed: bytes
    exp: Expect
    request: bool
    then: Then | None = None
    nbytes: int | None = None
    data: bytes | None = None


class Builder:
    """The ops and payload frames of one batch."""

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant
        self.items: list[Item] = []
        self.frames: list[bytes] = []
        self.risky = 0  # non-request ops that may fail

    def frame(self, data: bytes) -> int:
        self.frames.append(data)
        return len(self.frames) - 1

    def op(
        self,
        opcode: int,
        fields: list[Any],
        exp: Expect,
        *,
        then: Then | None = None,
        nbytes: int | None = None,
        data: bytes | None = None,
    ) -> int:
        seq = self.tenant.new_seq()
        request = opcode in proto.REQUEST_OPCODES
        if not request and exp.fail is not False:
            self.risky += 1
        packed = pack([opcode, seq, *fields])
        if opcode == Opcode.PUBLISH and len(fields) > 1 and type(fields[1]) is str:
            self.tenant.run.all_names.add(fields[1])  # whatever this test predicts, the cleanup removes it
        if opcode == Opcode.PUBLISH_GRAPH and len(fields) > 1 and type(fields[1]) is str:
            self.tenant.run.graph_names.add(fields[1])
        self.items.append(Item(seq, packed, exp, request, then, nbytes, data))
        return seq


class Tenant(Peer):
    def __init__(self, ctx: zmq.asyncio.Context, run: Run, index: int) -> None:
        super().__init__(ctx, run, f"tenant{index}")
        self.index = index
        self.rng = random.Random(f"{SEED}-tenant-{index}")
        self.next_handle = (index + 1) * 100_000_000  # tenants' handle ranges never meet
        run.handles[index] = collections.deque(maxlen=64)
        self._seqs = itertools.count(1)
        self._weird_seqs = [0, -1, -(2**63), 2**63 - 1, 2**64 - 1, 2**32, -(2**31), 2**53 + 1]
        self.requests: dict[int, Sent] = {}  # requests waiting for their reply
        self.nonreq: dict[int, Sent] = {}  # non-request ops since the last settle
        self.to_ack: set[int] = set()
        self.abandoned: set[int] = set()  # requests of a session that ended: a reply may or may not come
        self.order = 0
        self.batch_no = 0
        self.in_session = False
        self.session: tuple[str, str] | None = None
        self.devices = 1
        self._settle_replies: dict[int, dict[str, Any]] = {}
        self.reset_model()

    def reset_model(self) -> None:
        self.tensors: dict[int, TensorInfo] = {}
        self.kernel: int | None = None
        self.kernel_handles: set[int] = set()
        self.freed: list[int] = []
        self.opened: dict[int, tuple[str, Published]] = {}  # handle -> (name, what was published)
        self.names: dict[str, str] = {}  # names this session published -> mode
        self.leaving = False  # its names are being unpublished (bye-mid-stream): none may be counted on
        self.canary: int | None = None
        self.compiles = 0
        self.graph: int | None = None  # a valid graph: x (input) -> t (temp, the output) -> out (bound)
        self.graph_out: int | None = None  # the tensor bound as its `out`
        self.graph_names: set[str] = set()  # graph names this session published
        self.rows_graph: int | None = None  # a row-independent graph, y = 1.5 x - 0.5 fed into x, of 1 and 2 rows
        self.lib = hostile_library.Lib()  # built-in kernels and their tensors (`hostile_library.setup`)
        self.copy_graph: int | None = None  # a graph of copy steps (`hostile_messages.setup`)
        self.copy_tensors: list[int] = []

    # ------------------------------------------------------------------ numbering

    def new_seq(self) -> int:
        if self._weird_seqs and self.rng.random() < 0.002:
            return self._weird_seqs.pop()
        return next(self._seqs)

    def new_handle(self) -> int:
        self.next_handle += 1
        return self.next_handle

    def stale_handle(self) -> int:
        if self.freed and self.rng.random() < 0.6:
            return self.rng.choice(self.freed)
        return self.next_handle + self.rng.randrange(1_000, 50_000_000)  # in this tenant's range, never allocated

    # ------------------------------------------------------------------ sending

    async def send_batch(self, b: Builder, *, hostile: bool = True, receipt: bool = False, extra_ack: int = 0) -> None:
        self.batch_no += 1
        number = self.batch_no
        ack = sorted(self.to_ack)
        for seq in ack:
            if (sent := self.nonreq.get(seq)) is not None:
                sent.acked_in = number
        self.to_ack.clear()
        noise = [self.rng.randrange(-(10**15), -(10**12)) for _ in range(extra_ack)]  # never a seq of ours
        header = proto.encode_batch(
            b"".join(item.packed for item in b.items),
            len(b.items),
            len(b.frames),
            (ack + noise) or None,
            number,
            receipt,
        )
        for item in b.items:
            self.order += 1
            sent = Sent(item.seq, self.order, number, item.exp, item.request, item.then, item.nbytes, item.data)
            (self.requests if item.request else self.nonreq)[item.seq] = sent
        self.run.counts["hostile ops" if hostile else "control ops"] += len(b.items)
        if receipt:
            self.expect(f"receipt:{number}", f"the receipt of batch {number}")
        await self.send([header, *b.frames], hostile=hostile)

    # ------------------------------------------------------------------ receiving

    def on_welcome(self, header: dict[str, Any]) -> None:
        super().on_welcome(header)
        session, key = header.get("session"), header.get("key")
        if type(session) is not str or type(key) is not str or type(header.get("devices")) is not list:
            self.findings.add(Kind.SHAPE, f"{self.name}: a welcome without session, key or devices: {short(header)}")
            return
        self.session = (session, key)
        self.devices = self.run.devices = len(header["devices"])
        self.run.sessions.append(self.session)
        with self.run.live_lock:
            self.run.live[session] = key

    def on_reply(self, header: dict[str, Any], payload: list[bytes]) -> None:
        seq: Any = header.get("seq")
        sent = self.requests.pop(seq, None) if is_int(seq) else None
        if sent is None:
            if seq in self.abandoned:
                self.abandoned.discard(seq)
            else:
                self.findings.add(Kind.EXTRA, f"{self.name}: a reply to no request of ours: {short(header)}")
            return
        sent.reply = header
        status = header.get("ok")
        if status is True:
            if sent.exp.fail is True:
                self.findings.add(Kind.SUCCEEDED, f"{self.name}: request #{seq} {sent.exp} succeeded: {short(header)}")
            if "parts" in header and not self.readback_part(sent, header, payload, 0):
                return
            self.finish(sent, failed=False)
        elif status is False:
            self.on_failed_reply(sent, header)
            self.finish(sent, failed=True)
        else:
            self.findings.add(Kind.SHAPE, f"{self.name}: a reply without a boolean 'ok': {short(header)}")

    def readback_part(self, sent: Sent, header: dict[str, Any], payload: list[bytes], index: int) -> bool:
        """Take one part of a readback's data; True once the last one is in."""
        if index == 0:
            n: Any = header.get("n")
            parts: Any = header.get("parts")
            if not is_int(n) or not is_int(parts) or parts < 1:
                self.findings.add(Kind.SHAPE, f"{self.name}: a readback reply without n/parts: {short(header)}")
                return True
            if sent.nbytes is not None and n != sent.nbytes:
                self.findings.add(
                    Kind.DATA, f"{self.name}: readback #{sent.seq} {sent.exp}: {n} bytes, want {sent.nbytes}"
                )
            sent.parts_left = parts
        if len(payload) != 1:
            self.findings.add(Kind.SHAPE, f"{self.name}: readback #{sent.seq} part {index} has {len(payload)} frames")
        sent.chunks.extend(payload[:1])
        sent.parts_left -= 1
        if sent.parts_left > 0:
            self.requests[sent.seq] = sent  # more parts to come
            return False
        data = sent.payload = b"".join(sent.chunks)
        if sent.data is not None and data != sent.data:
            self.findings.add(Kind.DATA, f"{self.name}: readback #{sent.seq} {sent.exp}: the data differs")
        return True

    def on_part(self, header: dict[str, Any], payload: list[bytes]) -> None:
        seq: Any = header.get("seq")
        sent = self.requests.get(seq) if is_int(seq) else None
        if sent is None or sent.reply is None or sent.parts_left <= 0:
            if seq not in self.abandoned:
                self.findings.add(Kind.EXTRA, f"{self.name}: a part of no readback of ours: {short(header)}")
            return
        del self.requests[seq]
        if self.readback_part(sent, header, payload, int(header.get("i", -1))):
            self.finish(sent, failed=False)

    def finish(self, sent: Sent, failed: bool) -> None:
        if sent.exp.note == "settle" and sent.reply is not None:
            self._settle_replies[sent.seq] = sent.reply
        if sent.then is not None:
            sent.then(sent, failed)

    def on_failed_reply(self, sent: Sent, header: dict[str, Any]) -> None:
        err = header.get("err")
        if type(err) is not list or len(err) != 4:
            self.findings.add(Kind.SHAPE, f"{self.name}: an error reply without [code, msg, seq, op]: {short(header)}")
            return
        code, message, failed_seq, op = err
        if failed_seq == sent.seq or (failed := self.nonreq.get(failed_seq)) is None:
            what = f"request #{sent.seq} {sent.exp}"
        else:
            what = f"op #{failed_seq} {failed.exp}, reported on request #{sent.seq}"
        self.check_error(code, message, what)
        if failed_seq == sent.seq:  # its own failure
            if op != sent.exp.op:
                self.findings.add(Kind.CODE, f"{self.name}: #{sent.seq} {sent.exp} failed naming op {op!r}")
            if sent.exp.fail is False:
                self.findings.add(Kind.FAILED, f"{self.name}: request #{sent.seq} {sent.exp}: {code} {message!r}")
            elif sent.exp.codes is not None and code not in sent.exp.codes:
                self.findings.add(
                    Kind.CODE,
                    f"{self.name}: #{sent.seq} {sent.exp} failed with {code} {message!r}, want {set(sent.exp.codes)}",
                )
            elif type(message) is str and sent.exp.names not in message:
                self.findings.add(
                    Kind.CODE, f"{self.name}: #{sent.seq} {sent.exp}: {message!r} lacks {sent.exp.names!r}"
                )
            return
        self.attribute(failed_seq, code, message, op, sent)

    def attribute(self, failed_seq: Any, code: Any, message: Any, op: Any, by: Sent) -> None:
        """A request was answered with an earlier op's failure: that op must be ours, earlier, unacknowledged."""
        if op == "submission":
            self.findings.add(Kind.REFUSED, f"{self.name}: #{by.seq} {by.exp} reported {code} {message!r}")
            self.to_ack.add(failed_seq)
            return
        failed = self.nonreq.get(failed_seq)
        if failed is None:
            self.findings.add(
                Kind.CODE,
                f"{self.name}: #{by.seq} {by.exp} reported a failure of op #{failed_seq} ({op}), "
                "not one of ours since the last settle",
            )
            return
        if failed.order > by.order:
            self.findings.add(Kind.CODE, f"{self.name}: #{by.seq} reported #{failed_seq}, which came after it")
        if failed.acked_in is not None and failed.acked_in <= by.batch:
            self.findings.add(Kind.EXTRA, f"{self.name}: #{by.seq} reported #{failed_seq} {failed.exp} after its ack")
        if op != failed.exp.op:
            self.findings.add(Kind.CODE, f"{self.name}: #{failed_seq} {failed.exp} reported as op {op!r}")
        if failed.exp.fail is False:
            self.findings.add(Kind.FAILED, f"{self.name}: #{failed_seq} {failed.exp}: {code} {message!r}")
        elif failed.exp.codes is not None and code not in failed.exp.codes:
            self.findings.add(
                Kind.CODE,
                f"{self.name}: #{failed_seq} {failed.exp} failed with {code} {message!r}, want {set(failed.exp.codes)}",
            )
        elif type(message) is str and failed.exp.names not in message:
            lacks = f"{message!r} lacks {failed.exp.names!r}"
            self.findings.add(Kind.CODE, f"{self.name}: #{failed_seq} {failed.exp}: {lacks}")
        if not failed.reported:
            failed.reported = True
            if failed.acked_in is None:
                self.to_ack.add(failed_seq)
        if type(message) is str and (folded := FOLDED_RE.search(message)):
            # The daemon's list was full: later failures were counted on this one. Say so (this test keeps
            # its windows below that bound), and count the folded ops as reported.
            self.findings.add(Kind.UNREPORTED, f"{self.name}: failures folded: {message[-120:]!r}")
            last = self.nonreq.get(int(folded.group(2)))
            for other in self.nonreq.values():
                if failed.order < other.order <= (last.order if last else failed.order):
                    other.reported = True

    def pending(self) -> bool:
        return bool(self.expected or self.requests)

    def describe_pending(self) -> str:
        requests = ", ".join(f"#{s.seq} {s.exp}" for s in list(self.requests.values())[:5])
        return f"requests [{requests}] of {len(self.requests)}; answers [{super().describe_pending()}]"

    def give_up(self) -> None:
        super().give_up()
        self.abandoned.update(self.requests)
        self.requests.clear()

    def end_session(self) -> None:
        """The session is over (as far as this side knows): whatever it still waits for may not come."""
        self.abandoned.update(self.requests)
        self.requests.clear()
        receipts = [e for e in self.expected if any(a.startswith("receipt") for a in e[0])]
        self.late.extend(receipts)  # a batch still waiting behind a compile is dropped with the session
        self.expected = [e for e in self.expected if e not in receipts]
        self.nonreq.clear()
        self.to_ack.clear()
        self.in_session = False
        if self.session is not None:
            with self.run.live_lock:
                self.run.live.pop(self.session[0], None)
        self.run.canaries.pop(self.index, None)
        self.run.kernels.pop(self.index, None)
        for name in self.names:
            self.run.published.pop(name, None)
        self.run.graphs.pop(self.index, None)
        self.run.published_graphs.difference_update(self.graph_names)
        self.reset_model()

    # ------------------------------------------------------------------ settling

    async def settle(self) -> None:
        """Drain the failures (a sync per failure, acknowledging each), wait for every answer, then
        check that every op predicted to fail was reported."""
        last = self.order
        for _ in range(4 * FAIL_BUDGET + 20):
            b = Builder(self)
            seq = b.op(Opcode.SYNC, [], either("sync", "settle"))
            await self.send_batch(b, hostile=False)
            if not await self.wait_for(partial(self.answered, seq), partial(str, f"the settling sync #{seq}")):
                self.give_up()
                break
            reply = self.last_reply(seq)
            err = None if reply is None else reply.get("err")
            if reply is None or reply.get("ok") is True or type(err) is not list or len(err) != 4 or err[2] == seq:
                break  # done, or malformed, or a sync that failed on its own: reported already
        else:
            self.findings.add(Kind.MISSING, f"{self.name}: failures kept coming: {len(self.nonreq)} ops")
        await self.wait_idle()
        for sent in self.nonreq.values():
            if sent.order <= last and not sent.reported and sent.exp.fail is True:
                self.findings.add(Kind.UNREPORTED, f"{self.name}: #{sent.seq} {sent.exp} (batch {sent.batch})")
            if sent.order <= last and sent.then is not None:
                sent.then(sent, sent.reported)
        self.nonreq = {s: sent for s, sent in self.nonreq.items() if sent.order > last}
        self.to_ack = {s for s in self.to_ack if s in self.nonreq or s == 0}

    def answered(self, seq: int) -> bool:
        return seq not in self.requests

    def last_reply(self, seq: int) -> dict[str, Any] | None:
        return self._settle_replies.pop(seq, None)

    # ------------------------------------------------------------------ a life

    async def main(self, lives: int) -> None:
        self.connect()
        try:
            endings = ["bye", "vanish", "reconnect", "bye-mid-stream", "bad-device-hello"]
            for life in range(lives):
                self.phase = f"life {life}, start"
                if not self.in_session:
                    await self.hello()
                await self.setup(life)
                for w in range(WINDOWS_PER_LIFE):
                    self.phase = f"life {life}, window {w}"
                    await self.window()
                    await self.settle()
                await self.check_canary()
                await self.settle()
                await self.end(endings[(life + self.index) % len(endings)])
        finally:
            if self.in_session:
                await self.send([proto.BYE], hostile=False)
                self.end_session()
            await self.disconnect()

    async def hello(self) -> None:
        before = self.welcomes
        self.expect("welcome", "hello")
        await self.send([proto.encode_hello(self.name, os.getpid())], hostile=False)
        if await self.wait_for(lambda: self.welcomes > before, lambda: "the welcome"):
            self.in_session = True
        else:
            self.give_up()
            raise AssertionError(f"{self.name}: no welcome")

    async def setup(self, life: int) -> None:
        b = Builder(self)
        handle = self.new_handle()

        def kernel_ready(sent: Sent, failed: bool) -> None:
            if not failed and sent.reply is not None and is_int(sent.reply.get("handle")):
                self.kernel = sent.reply["handle"]
                self.kernel_handles.add(sent.reply["handle"])
                self.run.kernels[self.index] = sent.reply["handle"]

        b.op(
            Opcode.KERNEL,
            [handle, self.run.kernel_source, "axpb", self.run.kernel_options],
            ok("kernel", "axpb"),
            then=kernel_ready,
        )
        self.canary = self.alloc(b, "float32", (256,), canary=True)
        self.upload(
            b,
            self.canary,
            np.random.default_rng(self.rng.getrandbits(32)).standard_normal(256).astype(np.float32).tobytes(),
        )
        for _ in range(3):
            t = self.alloc(b, "float32", (64 * self.rng.randrange(1, 9),))
            self.upload(b, t, self.rng.randbytes(self.tensors[t].nbytes))
        self.alloc(b, "int32", (64,))
        if life == 0:  # a readback of several reply parts (and a size that is no multiple of 4)
            big = self.alloc(b, "uint8", (5 << 20 | 123,))
            info = self.tensors.pop(big)
            b.op(Opcode.READBACK, [big], ok("readback", "several parts"), nbytes=info.nbytes, data=info.data)
            b.op(Opcode.FREE, [big], ok("free", "the big tensor"))
        await self.send_batch(b, hostile=False)
        await self.settle()
        if self.kernel is None:
            self.findings.add(Kind.FAILED, f"{self.name}: the axpb kernel did not register")
        self.run.canaries[self.index] = self.canary
        # Publish the canary read-only (others may read it, never write it) and a scratch tensor read-write.
        b = Builder(self)
        canary = self.tensors[self.canary]
        ro_name = f"hostile.{SEED}/t{self.index}/l{life}/canary"
        rw_name = f"hostile.{SEED}/t{self.index}/l{life}/scratch"
        scratch = self.pick(lambda i: not i.canary and i.dtype == "float32")
        b.op(Opcode.PUBLISH, [self.canary, ro_name, "ro"], ok("publish", "the canary, ro"))
        self.run.all_names.add(ro_name)
        if scratch is not None:
            b.op(Opcode.PUBLISH, [scratch, rw_name, "rw"], ok("publish", "a scratch tensor, rw"))
            self.run.all_names.add(rw_name)
            self.tensors[scratch].published = True
            self.tensors[scratch].data = None  # others may write it
            self.names[rw_name] = "rw"
        self.names[ro_name] = "ro"
        canary.published = True
        await self.send_batch(b, hostile=False)
        await self.settle()
        self.run.published[ro_name] = Published(self.index, "ro", canary.dtype, canary.shape, canary.data)
        b = Builder(self)
        self.lib = hostile_library.setup(self, b, EXPECT)
        hostile_messages.setup(self, b, EXPECT, self.lib)
        await self.send_batch(b, hostile=False)
        await self.settle()
        if self.index == 0 and life == 0:
            await hostile_messages.mass_residents(self, partial(Builder, self), EXPECT, SEED)
        if self.kernel is not None:
            b = Builder(self)
            self.graph_out = self.alloc(b, "float32", (GRAPH_N,))
            self.tensors[self.graph_out].published = True  # keeps the other generators off it
            handle = self.new_handle()

            def built(sent: Sent, failed: bool) -> None:
                if not failed and sent.reply is not None and is_int(sent.reply.get("handle")):
                    self.graph = self.run.graphs[self.index] = sent.reply["handle"]

            b.op(Opcode.GRAPH, [handle, f"g{life}", self.graph_def()], ok("graph", "a valid graph"), then=built)
            for rows in (1, 2):  # one family of two instances: two of its replays in one slice run merged
                rows_handle = self.new_handle()

                def rows_built(sent: Sent, failed: bool) -> None:
                    if not failed and sent.reply is not None and is_int(sent.reply.get("handle")):
                        self.rows_graph = sent.reply["handle"]

                b.op(
                    Opcode.GRAPH,
                    [rows_handle, f"rows{life}", self.rows_graph_def(rows)],
                    ok("graph", f"a row-independent graph of {rows} rows"),
                    then=rows_built,
                )
            await self.send_batch(b, hostile=False)
            await self.settle()
            # Bad builds where no earlier failure waits to answer them instead (requests' own failures
            # are not kept, so they do not hide each other).
            b = Builder(self)
            for _ in range(4):
                self.bad_build(b)
            await self.send_batch(b)
            await self.settle()

    async def check_canary(self) -> None:
        if self.canary is None:
            return
        canary = self.tensors[self.canary]
        b = Builder(self)
        b.op(
            Opcode.READBACK,
            [self.canary],
            ok("readback", "the canary, at the end of a session"),
            nbytes=canary.nbytes,
            data=canary.data,
        )
        await self.send_batch(b, hostile=False)

    async def end(self, how: str) -> None:
        self.phase += f", ending: {how}"
        self.run.counts[f"sessions ended: {how}"] += 1
        if how in ("bye", "bye-mid-stream"):
            b = Builder(self)
            for name, mode in self.names.items():
                b.op(
                    Opcode.UNPUBLISH,
                    [name],
                    ok("unpublish", f"own {mode} name")
                    if mode == "ro"
                    else either("unpublish", "own rw name (anyone may remove it)", NOT_FOUND),
                )
            for name in self.graph_names:
                b.op(Opcode.UNPUBLISH_GRAPH, [name], either("unpublish_graph", "own graph name", NOT_FOUND))
            await self.send_batch(b, hostile=False)
            if how == "bye-mid-stream":
                self.leaving = True
                await self.window()  # ...and leave without waiting for any of it
            else:
                await self.settle()
            await self.send([proto.BYE], hostile=how == "bye-mid-stream")
            # A bye drops what waits in the daemon's outbox for this peer (when its ZeroMQ queue was
            # full): the answers to messages sent before the bye may not come. See the module doc.
            self.give_up()
            self.end_session()
            # The session is gone: a batch now is refused as a whole.
            b = Builder(self)
            b.op(Opcode.SYNC, [], either("sync", "after bye"))
            self.expect("error:10", "a batch after bye")
            await self.send_batch(b)
            self.requests.clear()
            await self.wait_idle()
        elif how == "vanish":  # no bye: the lease expires; the next life comes from a new socket
            self.end_session()
            await self.disconnect()
            self.connect()
        elif how == "reconnect":  # a hello on the same socket ends the session and starts another
            await self.window()
            self.end_session()
            await self.hello()
        else:  # a hello for a device that does not exist, in mid-session; then a good hello
            frames, what = bad_hello_device(self.devices)
            self.expect("error:2", what)
            await self.send(frames)
            await self.wait_idle()
            self.end_session()
            await self.hello()

    # ------------------------------------------------------------------ the hostile window

    async def window(self) -> None:
        rng = self.rng
        risky = 0
        for _ in range(rng.randrange(6, 15)):
            roll = rng.random()
            if roll < 0.62 and risky < FAIL_BUDGET:
                b = self.hostile_batch(big=rng.random() < 0.03, budget=FAIL_BUDGET - risky)
                risky += b.risky
                await self.send_batch(b, receipt=rng.random() < 0.05, extra_ack=rng.choice([0, 0, 0, 1, 3]))
            elif roll < 0.68 and risky < FAIL_BUDGET:
                b = Builder(self)
                for _ in range(rng.randrange(1, 9)):
                    self.schema_fuzz(b) if rng.random() < 0.8 else self.filler_request(b)
                risky += b.risky
                await self.send_batch(b)
            elif roll < 0.78:
                frames, what = junk_messages(rng)
                while len(frames[0]) > 100_000 and rng.random() < 0.97:
                    frames, what = junk_messages(rng)
                self.expect("error:1", what)
                await self.send(frames)
            elif roll < 0.88:
                frames, what = broken_batch(rng)
                self.expect("error:1", what)
                await self.send(frames)
            elif roll < 0.93:
                self.expect({"pong", "error:10"} if self.welcomes < 1 else "pong", "a ping")
                await self.send([proto.PING])
            elif roll < 0.97:
                others = [s for s in self.run.sessions if s != self.session]
                if others and rng.random() < 0.5:
                    session = rng.choice(others)[0]
                elif self.session is not None:
                    session = self.session[0]
                else:
                    session = "nobody"
                self.expect("error:10", "a beat with a wrong key")
                await self.send([proto.encode_beat(session, rng.choice(["", "k", "0" * 32]))])
            else:
                frames, what = bad_hello(rng, self.run)
                if "device" in what:  # ends this session: keep that for the end of a life
                    frames, what = [pack({"t": "hello", "v": "2", "name": "h", "pid": 1})], "a hello with a str version"
                self.expect("error:1", what)
                await self.send(frames)
            await asyncio.sleep(0)

    def hostile_batch(self, big: bool, budget: int) -> Builder:
        b = Builder(self)
        gens = self.generators()
        weights = [w for w, _ in gens]
        count = self.rng.randrange(100, 500) if big else self.rng.randrange(1, 12)
        hostile = 0
        for _ in range(count):
            if big and self.rng.random() < 0.8:
                self.filler_request(b)
                continue
            before = b.risky
            _, gen = self.rng.choices(gens, weights)[0]
            if b.risky >= budget:
                self.filler_request(b)
                continue
            gen(b)
            hostile += b.risky > before
        if not hostile:
            self.mutated(b)
        if self.rng.random() < 0.3:
            self.filler_request(b)
        return b

    def generators(self) -> list[tuple[float, Callable[[Builder], None]]]:
        gens: list[tuple[float, Callable[[Builder], None]]] = [
            (3, self.filler_request),
            (3, self.valid_write),
            (10, self.mutated),
            (2, self.arity),
            (2, self.unknown_opcode),
            (4, self.foreign),
            (3, self.stale),
            (2, self.duplicate),
            (2, self.alloc_edge),
            (2, self.frames),
            (4, self.bad_dispatch),
            (1, self.bad_copy),
            (3, self.residents),
            (4, self.graph_ops),
            (3, partial(hostile_library.library, self, e=EXPECT)),
            (2, partial(hostile_library.views, self, e=EXPECT)),
            (2, partial(hostile_messages.graph_copies, self, e=EXPECT)),
            (2, partial(hostile_messages.upload_parts, self, e=EXPECT)),
            (2, partial(hostile_messages.prefixes, self, e=EXPECT)),
        ]
        if self.compiles < 4:
            gens.append((0.3, self.garbage_kernel))
        return gens

    # ------------------------------------------------------------------ the model of this session

    def pick(self, want: Callable[[TensorInfo], bool]) -> int | None:
        handles = [h for h, info in self.tensors.items() if want(info)]
        return self.rng.choice(handles) if handles else None

    def alloc(self, b: Builder, dtype: str, shape: tuple[int, ...], canary: bool = False) -> int:
        handle = self.new_handle()
        nbytes = DTYPE_SIZES[dtype] * math.prod(shape)
        b.op(Opcode.ALLOC, [handle, dtype, list(shape), 0], ok("alloc", f"{dtype}{list(shape)}"))
        self.tensors[handle] = TensorInfo(dtype, shape, nbytes, bytes(nbytes), canary)
        self.run.handles[self.index].append(handle)
        return handle

    def upload(self, b: Builder, handle: int, data: bytes) -> None:
        frame = b.frame(data)
        b.op(Opcode.UPLOAD, [handle, frame, len(data)], ok("upload", "own tensor, right size"))
        self.tensors[handle].data = data

    def writable(self) -> int | None:
        return self.pick(lambda i: not i.canary and not i.published)

    def vectors(self) -> tuple[int, int, int] | None:
        """Two distinct own float32 tensors to run axpb on (y not the canary), and the element count."""
        xs = [h for h, i in self.tensors.items() if i.dtype == "float32" and len(i.shape) == 1 and i.nbytes >= 256]
        ys = [h for h in xs if not self.tensors[h].canary and not self.tensors[h].published]
        if not xs or not ys or self.kernel is None:
            return None
        y = self.rng.choice(ys)
        others = [h for h in xs if h != y]
        if not others:
            return None
        x = self.rng.choice(others)
        n = min(self.tensors[x].shape[0], self.tensors[y].shape[0])
        return x, y, n

    def axpb_args(self, x: int, y: int, n: int) -> list[list[Any]]:
        return [[TENSOR, x], [TENSOR, y], [F32, 1.5], [F32, -0.5], [U32, n]]

    # ------------------------------------------------------------------ generators

    def filler_request(self, b: Builder) -> None:
        kind = self.rng.randrange(5)
        if kind == 0 and self.tensors:
            handle = self.rng.choice(list(self.tensors))
            info = self.tensors[handle]
            b.op(Opcode.READBACK, [handle], ok("readback", "own tensor"), nbytes=info.nbytes, data=info.data)
        elif kind == 1:
            b.op(Opcode.STATS, [], ok("stats", "stats"))
        elif kind == 2:
            b.op(Opcode.FLUSH, [], ok("flush", "flush"))
        else:
            b.op(Opcode.SYNC, [], ok("sync", "sync"))

    def valid_write(self, b: Builder) -> None:
        kind = self.rng.randrange(5)
        if kind == 0 or len(self.tensors) < 4:
            t = self.alloc(b, "float32", (64 * self.rng.randrange(1, 5),))
            if self.rng.random() < 0.7:
                self.upload(b, t, self.rng.randbytes(self.tensors[t].nbytes))
        elif kind == 1 and (w := self.writable()) is not None:
            self.upload(b, w, self.rng.randbytes(self.tensors[w].nbytes))
        elif kind == 2 and (v := self.vectors()) is not None:
            x, y, n = v
            b.op(Opcode.DISPATCH, [self.kernel, [n // 64, 1, 1], self.axpb_args(x, y, n), None], ok("dispatch", "axpb"))
            self.tensors[y].data = None
        elif kind == 3:
            src = self.pick(lambda i: True)
            if src is not None:
                info = self.tensors[src]
                dst = self.pick(
                    lambda i: i.shape == info.shape and i.dtype == info.dtype and not i.canary and not i.published
                )
                if dst is not None:
                    b.op(Opcode.COPY, [src, dst], ok("copy", "own tensors"))
                    self.tensors[dst].data = info.data
        elif len(self.tensors) > 6 and (w := self.writable()) is not None:
            b.op(Opcode.FREE, [w], ok("free", "own tensor"))
            del self.tensors[w]
            self.freed.append(w)

    def templates(self, b: Builder) -> list[tuple[int, list[Any], list[str], bytes | None]]:
        """Valid ops of every type: (opcode, fields, field kinds, the frame an upload carries)."""
        own = self.pick(lambda i: True) or 1
        writable = self.writable() or own
        nbytes = self.tensors[writable].nbytes if writable in self.tensors else 4
        v = self.vectors()
        args = self.axpb_args(*v) if v else [[TENSOR, own], [TENSOR, writable], [F32, 1.0], [F32, 0.0], [U32, 0]]
        name = f"hostile.{SEED}/t{self.index}/never-published"
        return [
            (Opcode.ALLOC, [self.new_handle(), "float32", [16], 0], ["handle", "dtype", "shape", "device"], None),
            (Opcode.UPLOAD, [writable, None, nbytes], ["handle", "frame", "nbytes"], bytes(nbytes)),
            (Opcode.DISPATCH, [self.kernel or 1, [1, 1, 1], args, None], ["handle", "grid", "args", "writes"], None),
            (Opcode.READBACK, [own], ["handle"], None),
            (Opcode.FREE, [writable], ["handle"], None),
            (
                Opcode.KERNEL,
                [self.new_handle(), self.run.kernel_source, "axpb", self.run.kernel_options],
                ["handle", "source", "entry", "options"],
                None,
            ),
            (Opcode.SYNC, [], [], None),
            (Opcode.COPY, [own, writable], ["handle", "handle"], None),
            (Opcode.STATS, [], [], None),
            (Opcode.PUBLISH, [writable, name, "ro"], ["handle", "name", "mode"], None),
            (Opcode.OPEN, [self.new_handle(), name], ["handle", "name"], None),
            (Opcode.UNPUBLISH, [name], ["name"], None),
            (Opcode.FLUSH, [], [], None),
        ]

    def hostile_value(self, kind: str, original: Any) -> Any:
        rng = self.rng
        for _ in range(100):
            value = rng.choice(RARE_POOL) if rng.random() < 0.01 else rng.choice(FIELD_POOL)
            if not field_may_pass(kind, value, self.devices) and not (kind == "nbytes" and value == original):
                return value
        return [[[["never valid"]]]]

    def mutated(self, b: Builder) -> None:
        """A valid op with one field replaced by a value that must be refused: INVALID_ARGUMENT, at its seq."""
        opcode, fields, kinds, frame = self.rng.choice([t for t in self.templates(b) if t[2]])
        i = self.rng.randrange(len(fields))
        value = self.hostile_value(kinds[i], fields[i])
        name = proto.op_name(opcode)
        exp = fails(name, f"field {i + 2} ({kinds[i]}) = {short_value(value)}", INVALID)
        if opcode == Opcode.DISPATCH and same_value(value, fields[i]):
            exp = either(name, "a dispatch equal by value to a valid one", INVALID)
        if frame is not None:
            if kinds[i] == "frame":
                frame = None  # no frame for it: the op names none that exists
            else:
                fields[1] = b.frame(frame)
        fields[i] = value
        b.op(opcode, fields, exp)

    def schema_fuzz(self, b: Builder) -> None:
        """Any op type of the schema (those this test knows nothing else about included), its fields
        drawn from the pool; one field of a kind the schema documents made surely invalid. Only in
        batches without payload frames, so no frame index can be valid."""
        rng = self.rng
        opcode = rng.choice(sorted(proto.OPS))
        kinds = schema_kinds(opcode)
        fields = [rng.choice(FIELD_POOL) for _ in kinds]
        known = [i for i, k in enumerate(kinds) if k in KNOWN_KINDS]
        if known and rng.random() < 0.8:
            i = rng.choice(known)
            fields[i] = self.hostile_value(kinds[i], None)
        bad = [
            k for k, v in zip(kinds, fields, strict=True) if k in KNOWN_KINDS and not field_may_pass(k, v, self.devices)
        ]
        name = proto.op_name(opcode)
        if bad:
            b.op(opcode, fields, fails(name, f"random fields, a bad {bad[0]}", INVALID, PROTOCOL))
        else:
            b.op(opcode, fields, either(name, f"random fields {short_value(fields)}"))

    def arity(self, b: Builder) -> None:
        """Missing or extra fields."""
        opcode, fields, _kinds, frame = self.rng.choice(self.templates(b))
        name = proto.op_name(opcode)
        if fields and self.rng.random() < 0.5:
            fields = fields[: self.rng.randrange(len(fields))]
            what = f"{len(fields)} fields, missing some"
        else:
            fields = fields + [self.rng.choice(FIELD_POOL) for _ in range(self.rng.randrange(1, 4))]
            what = f"{len(fields)} fields, extra"
        if opcode == Opcode.UPLOAD and len(fields) >= 2:
            fields[1] = b.frame(frame or b"")  # the op's frame index is valid, so it uses that frame
        b.op(opcode, fields, fails(name, what, INVALID))

    def unknown_opcode(self, b: Builder) -> None:
        opcode = self.rng.choice([c for c in UNKNOWN_OPCODES if c not in proto.OPS])
        fields = [self.rng.choice(FIELD_POOL) for _ in range(self.rng.randrange(0, 6))]
        b.op(opcode, fields, fails(proto.op_name(opcode), "an unknown opcode", PROTOCOL))

    def foreign(self, b: Builder) -> None:
        """Another session's handles: NOT_FOUND, and never a touch of its data (its canary is checked)."""
        rng = self.rng
        other = self.run.foreign_handle(self.index, rng)
        own = self.pick(lambda i: True)
        kind = rng.randrange(9)
        if kind == 0:
            b.op(Opcode.READBACK, [other], fails("readback", "another session's handle", NOT_FOUND))
        elif kind == 1:
            b.op(Opcode.FREE, [other], fails("free", "another session's handle", NOT_FOUND))
        elif kind == 2 and own is not None:
            b.op(Opcode.COPY, [other, own], fails("copy", "from another session's handle", NOT_FOUND))
        elif kind == 3 and own is not None:
            b.op(Opcode.COPY, [own, other], fails("copy", "into another session's handle", NOT_FOUND))
        elif kind == 4:
            data = rng.randbytes(1024)
            b.op(
                Opcode.UPLOAD,
                [other, b.frame(data), len(data)],
                fails("upload", "into another session's handle", NOT_FOUND),
            )
        elif kind == 5 and (v := self.vectors()) is not None:
            x, y, n = v
            args = self.axpb_args(x, other, n) if rng.random() < 0.5 else self.axpb_args(other, y, n)
            b.op(
                Opcode.DISPATCH,
                [self.kernel, [1, 1, 1], args, None],
                fails("dispatch", "another session's tensor", NOT_FOUND),
            )
        elif (
            kind == 6
            and (v := self.vectors()) is not None
            and (kernels_ := [k for t, k in self.run.kernels.items() if t != self.index])
        ):
            b.op(
                Opcode.DISPATCH,
                [rng.choice(kernels_), [1, 1, 1], self.axpb_args(*v), None],
                fails("dispatch", "another session's kernel", NOT_FOUND),
            )
        elif kind == 7:
            name = f"hostile.{SEED}/t{self.index}/foreign{self.new_seq()}"
            b.op(
                Opcode.PUBLISH,
                [other, name, rng.choice(["ro", "rw"])],
                fails("publish", "another session's handle", NOT_FOUND),
            )
        else:
            b.op(
                Opcode.READBACK,
                [self.run.canaries.get((self.index + 1) % TENANTS, other)],
                fails("readback", "another session's canary", NOT_FOUND),
            )

    def stale(self, b: Builder) -> None:
        """Handles never allocated, or freed."""
        rng = self.rng
        stale = self.stale_handle()
        own = self.pick(lambda i: not i.canary and not i.published)
        kind = rng.randrange(6)
        if kind == 0:
            b.op(Opcode.READBACK, [stale], fails("readback", "a stale handle", NOT_FOUND))
        elif kind == 1:
            b.op(Opcode.FREE, [stale], fails("free", "a stale handle", NOT_FOUND))
        elif kind == 2 and own is not None:
            b.op(
                Opcode.COPY,
                [stale, own] if rng.random() < 0.5 else [own, stale],
                fails("copy", "a stale handle", NOT_FOUND),
            )
        elif kind == 3:
            b.op(Opcode.UPLOAD, [stale, b.frame(b"\x00" * 64), 64], fails("upload", "a stale handle", NOT_FOUND))
        elif kind == 4 and (v := self.vectors()) is not None:
            x, _y, n = v
            args = self.axpb_args(x, stale, n)
            b.op(
                Opcode.DISPATCH,
                [self.kernel, [1, 1, 1], args, None],
                fails("dispatch", "a stale tensor handle", NOT_FOUND),
            )
        elif (v := self.vectors()) is not None:
            b.op(
                Opcode.DISPATCH,
                [stale, [1, 1, 1], self.axpb_args(*v), None],
                fails("dispatch", "a stale kernel handle", NOT_FOUND),
            )
        else:
            b.op(Opcode.READBACK, [stale], fails("readback", "a stale handle", NOT_FOUND))

    def duplicate(self, b: Builder) -> None:
        """Handles already in use."""
        rng = self.rng
        in_use = [*self.tensors, *self.kernel_handles, *self.opened]
        kind = rng.randrange(4)
        if kind == 0 and in_use:
            b.op(Opcode.ALLOC, [rng.choice(in_use), "float32", [4], 0], fails("alloc", "a handle in use", INVALID))
        elif kind == 1:
            handle = self.new_handle()
            b.op(Opcode.ALLOC, [handle, "uint8", [64], 0], ok("alloc", "a new handle"))
            b.op(Opcode.ALLOC, [handle, "uint8", [64], 0], fails("alloc", "the same handle again, same batch", INVALID))
            self.tensors[handle] = TensorInfo("uint8", (64,), 64, bytes(64))
        elif kind == 2 and in_use:
            name = rng.choice([*self.run.published, "hostile.nothing"])
            b.op(Opcode.OPEN, [rng.choice(in_use), name], fails("open", "into a handle in use", INVALID, NOT_FOUND))
        elif in_use:
            source = rng.choice(["garbage", "@compute fn f() {}", BAD_SOURCE[self.run.backend]])
            b.op(
                Opcode.KERNEL,
                [rng.choice(list(self.tensors) or in_use), source, "main", {}],
                fails("kernel", "a tensor's handle", INVALID, COMPILE),
            )

    def alloc_edge(self, b: Builder) -> None:
        rng = self.rng
        kind = rng.randrange(6)
        if kind == 0:
            shape = rng.choice([[], [0], [3, 0], [0, 0, 0, 0, 0, 0, 0, 0], [1] * 8])
            dtype = rng.choice(list(DTYPE_SIZES))
            handle = self.new_handle()
            nbytes = DTYPE_SIZES[dtype] * math.prod(shape)

            def made(sent: Sent, failed: bool, h: int = handle, d: str = dtype, s: list[int] = shape) -> None:
                if not failed and self.in_session:
                    self.tensors[h] = TensorInfo(d, tuple(s), nbytes, bytes(nbytes))

            b.op(Opcode.ALLOC, [handle, dtype, shape, 0], either("alloc", f"{dtype}{shape}", INVALID), then=made)
        elif kind == 1:
            dtype = rng.choice(list(DTYPE_SIZES))
            too_many = LIMITS.max_tensor_bytes // DTYPE_SIZES[dtype] + 1
            huge = [LIMITS.max_tensor_bytes + 1]
            shape = rng.choice([[too_many], [2**20, 2**20], [2**16] * 4, [65536, 65536, 65536], huge])
            b.op(
                Opcode.ALLOC,
                [self.new_handle(), dtype, shape, 0],
                fails("alloc", f"too large: {dtype}{shape}", INVALID),
            )
        elif kind == 2 and self.devices < LIMITS.max_devices:
            device = rng.randrange(self.devices, LIMITS.max_devices)
            b.op(
                Opcode.ALLOC,
                [self.new_handle(), "float32", [4], device],
                fails("alloc", f"no device {device}", INVALID),
            )
        elif kind == 3:
            b.op(
                Opcode.ALLOC,
                [self.new_handle(), "float32", [4], rng.choice([64, -1, 2**31])],
                fails("alloc", "bad device", INVALID),
            )
        elif kind == 4:
            dtype = rng.choice(list(DTYPE_SIZES))
            self.alloc(b, dtype, (rng.randrange(1, 300),))
        else:
            b.op(Opcode.ALLOC, [self.new_handle(), "float32", [-1], 0], fails("alloc", "a negative dim", INVALID))

    def frames(self, b: Builder) -> None:
        """Payload frames of the wrong size, and two uploads of one frame."""
        rng = self.rng
        t = self.writable()
        if t is None:
            return
        info = self.tensors[t]
        kind = rng.randrange(4)
        if kind == 0:
            data = rng.randbytes(
                info.nbytes + rng.choice([-4, -1, 1, 4, 1000]) if info.nbytes >= 4 else info.nbytes + 3
            )
            b.op(
                Opcode.UPLOAD,
                [t, b.frame(data), info.nbytes],
                fails("upload", "frame size differs from nbytes", INVALID),
            )
        elif kind == 1:
            data = rng.randbytes(max(0, info.nbytes + rng.choice([-4, 4, 64])))
            if len(data) == info.nbytes:
                data += b"\x00\x00\x00\x00"
            b.op(
                Opcode.UPLOAD, [t, b.frame(data), len(data)], fails("upload", "nbytes differs from the tensor", INVALID)
            )
        elif kind == 2:
            same = self.pick(lambda i: i.nbytes == info.nbytes and not i.canary and not i.published)
            if same is None:
                return
            data = rng.randbytes(info.nbytes)
            frame = b.frame(data)
            b.op(Opcode.UPLOAD, [t, frame, info.nbytes], ok("upload", "the first of two uploads of one frame"))
            b.op(Opcode.UPLOAD, [same, frame, info.nbytes], fails("upload", "a frame used twice", INVALID))
            info.data = data
        else:
            b.op(
                Opcode.UPLOAD,
                [t, rng.choice([-1, 2000, 2**31, 2**63 - 1]), info.nbytes],
                fails("upload", "a frame out of range", INVALID),
            )

    def bad_dispatch(self, b: Builder) -> None:
        rng = self.rng
        v = self.vectors()
        if v is None:
            return
        x, y, n = v
        k = self.kernel
        good = self.axpb_args(x, y, n)
        kind = rng.randrange(13)
        if kind == 0:
            args, what = [], "no args"
        elif kind == 1:
            args, what = good[:1] + good[2:], "one tensor"
        elif kind == 2:
            args, what = [*good[:2], [TENSOR, x], *good[2:]], "three tensors"
        elif kind == 3:
            args, what = [[F32, 1.0], *good[1:]], "a scalar for a tensor"
        elif kind == 4:
            args, what = [*good[:2], [I32, 1], [F32, 0.0], [U32, n]], "i32 for f32"
        elif kind == 5:
            args, what = [*good[:4], [F32, float(n)]], "f32 for u32"
        elif kind == 6:
            args, what = good[:3], "too few scalars"
        elif kind == 7:
            args, what = [*good, [U32, 1], [I32, -1]], "too many scalars"
        elif kind == 8:
            args, what = [*good[:1], [TENSOR, k], *good[2:]], "a kernel handle for a tensor"
        else:
            args, what = good, ""
        if what:
            b.op(Opcode.DISPATCH, [k, [1, 1, 1], args, None], fails("dispatch", what, INVALID, NOT_FOUND))
            return
        if kind == 9:
            grid = rng.choice([[1, 1 << 20, 1], [1, 1, 1 << 20], [1, 65536, 65536], [2**31 - 1, 2**31 - 1, 2**31 - 1]])
            b.op(
                Opcode.DISPATCH, [k, grid, good, None], fails("dispatch", f"grid {grid} past the device limit", INVALID)
            )
        elif kind == 10:
            grid = rng.choice([[0, 0, 0], [0, 1, 1], [1, 0, 1], [1, 1, 0]])
            b.op(Opcode.DISPATCH, [k, grid, good, None], ok("dispatch", f"an empty grid {grid}"))
        elif kind == 11:  # backend-dependent: WebGPU refuses a buffer bound read and read-write, CUDA may run it
            zero = self.pick(lambda i: i.nbytes < 64)
            choice = rng.randrange(4)
            if choice == 0:
                args, what = self.axpb_args(y, y, n), "the same tensor as x and y"  # never the canary: CUDA runs it
            elif choice == 1 and zero is not None:
                args, what = [[TENSOR, zero], [TENSOR, y], [F32, 1.0], [F32, 0.0], [U32, 0]], "a tiny tensor as x"
            elif choice == 2:
                args, what = [*good[:4], [U32, 2**32 - 1]], "n past the tensors (grid within them)"
            else:
                args, what = good, "writes names a position past the tensors"
            writes = [rng.randrange(2, 32)] if choice == 3 else None
            b.op(
                Opcode.DISPATCH, [k, [max(1, min(n, 64) // 64), 1, 1], args, writes], either("dispatch", what, INVALID)
            )
            self.tensors[y].data = None
        else:
            scalars = [[F32, rng.choice([NAN, INF, -INF, 3.4e38, -0.0])], [F32, rng.choice([NAN, 1e-45])], [U32, n]]
            b.op(
                Opcode.DISPATCH,
                [k, [n // 64, 1, 1], good[:2] + scalars, rng.choice([None, [1], [0, 1]])],
                ok("dispatch", "edge float scalars"),
            )
            self.tensors[y].data = None

    def bad_copy(self, b: Builder) -> None:
        a = self.pick(lambda i: True)
        if a is None:
            return
        info = self.tensors[a]
        dst = self.pick(lambda i: (i.shape != info.shape or i.dtype != info.dtype) and not i.canary and not i.published)
        if dst is not None:
            b.op(Opcode.COPY, [a, dst], fails("copy", "dtype or shape differ", INVALID))
        elif (w := self.writable()) is not None:
            b.op(Opcode.COPY, [w, w], either("copy", "a tensor onto itself", INVALID))

    def residents(self, b: Builder) -> None:
        rng = self.rng
        kind = rng.randrange(12)
        theirs = [n for n, p in self.run.published.items() if p.owner != self.index]
        if kind == 0:
            name = rng.choice(["", "bad name!", "a" * 129, "x y", "\u00e9", "a\x00", "semi;colon", "tab\t"])
            own = self.pick(lambda i: True) or 1
            b.op(Opcode.PUBLISH, [own, name, "ro"], fails("publish", f"a bad name {name[:10]!r}", INVALID))
        elif kind == 1:
            own = self.writable() or 1
            mode = rng.choice(["", "RO", "rx", "r", "rwx", 1, None, ["ro"]])
            b.op(Opcode.PUBLISH, [own, f"hostile.{SEED}/mode", mode], fails("publish", f"a bad mode {mode!r}", INVALID))
        elif kind == 2 and self.canary is not None:
            name = f"hostile.{SEED}/t{self.index}/second-name-{self.new_seq()}"
            b.op(Opcode.PUBLISH, [self.canary, name, "ro"], fails("publish", "a tensor published already", EXISTS))
        elif kind == 3 and self.names and not self.leaving and (mine := self.writable()) is not None:
            b.op(Opcode.PUBLISH, [mine, rng.choice(list(self.names)), "rw"], fails("publish", "a name taken", EXISTS))
        elif kind == 4:
            bad_name = rng.choice(["", "bad name!", "a" * 129, 5, None])
            b.op(
                Opcode.OPEN,
                [self.new_handle(), bad_name],
                fails("open", f"a bad name {short_value(bad_name)}", INVALID),
            )
        elif kind == 5:
            b.op(
                Opcode.OPEN,
                [self.new_handle(), f"hostile.{SEED}/nothing/{self.new_seq()}"],
                fails("open", "no such name", NOT_FOUND),
            )
        elif kind == 6:
            b.op(
                Opcode.UNPUBLISH,
                [f"hostile.{SEED}/nothing/{self.new_seq()}"],
                fails("unpublish", "no such name", NOT_FOUND),
            )
        elif kind == 7 and theirs:
            name = rng.choice(theirs)
            b.op(Opcode.UNPUBLISH, [name], either("unpublish", "another session's ro name", PERMISSION, NOT_FOUND))
        elif kind == 8 and theirs and len(self.opened) < 4:
            name = rng.choice(theirs)
            published = self.run.published[name]
            handle = self.new_handle()

            def opened(sent: Sent, failed: bool, h: int = handle, n: str = name, p: Published = published) -> None:
                if failed or sent.reply is None or not self.in_session:
                    return
                r = sent.reply
                if (r.get("dtype"), tuple(r.get("shape") or ()), r.get("mode")) != (p.dtype, p.shape, p.mode):
                    self.findings.add(Kind.DATA, f"{self.name}: open {n!r} answered {short(r)}, published {p}")
                self.opened[h] = (n, p)

            b.op(Opcode.OPEN, [handle, name], either("open", "another session's ro name", NOT_FOUND), then=opened)
        elif self.opened:
            handle = rng.choice(list(self.opened))
            name, published = self.opened[handle]
            nbytes = DTYPE_SIZES[published.dtype] * math.prod(published.shape)
            choice = rng.randrange(6)
            if choice == 0:
                b.op(
                    Opcode.UPLOAD,
                    [handle, b.frame(bytes(nbytes)), nbytes],
                    fails("upload", "into a ro resident", PERMISSION),
                )
            elif choice == 1 and (src := self.pick(lambda i: True)) is not None:
                b.op(Opcode.COPY, [src, handle], fails("copy", "into a ro resident", PERMISSION, INVALID))
            elif choice == 2 and (v := self.vectors()) is not None:
                x, _y, n = v
                b.op(
                    Opcode.DISPATCH,
                    [self.kernel, [1, 1, 1], self.axpb_args(x, handle, min(n, 64)), None],
                    fails("dispatch", "writing a ro resident", PERMISSION),
                )
            elif choice == 3:
                b.op(
                    Opcode.PUBLISH,
                    [handle, f"hostile.{SEED}/t{self.index}/rw-{self.new_seq()}", "rw"],
                    fails("publish", "a ro resident as rw", PERMISSION),
                )
            elif choice == 4:
                b.op(Opcode.FREE, [handle], ok("free", "an opened resident"))
                del self.opened[handle]
            else:
                b.op(
                    Opcode.READBACK,
                    [handle],
                    ok("readback", f"another session's ro resident {name}"),
                    nbytes=nbytes,
                    data=published.data,
                )
        else:
            self.filler_request(b)

    def graph_def(self, **changes: Any) -> dict[str, Any]:
        """x -> t = x * a + 1 -> out = t * 2 + 0.5; outputs t. `changes` replaces parts (hostile builds)."""
        n, k = GRAPH_N, self.kernel
        grid = [n // 64, 1, 1]
        definition: dict[str, Any] = {
            "inputs": [["x", "float32", [n]]],
            "scalars": [["a", F32]],
            "binds": [["out", "float32", [n]]],
            "temps": [["float32", [n]]],
            "steps": [
                [0, k, grid, [[INPUT, 0], [TEMP, 0], [SCALAR, 0], [F32, 1.0], [U32, n]], None],
                [0, k, grid, [[TEMP, 0], [BIND, 0], [F32, 2.0], [F32, 0.5], [U32, n]], None],
            ],
            "outputs": [["t", [TEMP, 0]]],
        }
        definition.update(changes)
        return definition

    def rows_graph_def(self, rows: int) -> dict[str, Any]:
        """x (rows, 64) -> y = 1.5 x - 0.5, row-independent, y fed into x in a multi-step replay."""
        n = rows * ROWS_W
        return {
            "inputs": [["x", "float32", [rows, ROWS_W]]],
            "scalars": [],
            "binds": [],
            "temps": [["float32", [rows, ROWS_W]]],
            "steps": [[0, self.kernel, [max(1, n // 64), 1, 1], self.rows_args(n), None]],
            "outputs": [["y", [TEMP, 0]]],
            "feeds": [["y", "x"]],
            "rows": True,
        }

    @staticmethod
    def rows_args(n: int) -> list[list[Any]]:
        return [[INPUT, 0], [TEMP, 0], [F32, 1.5], [F32, -0.5], [U32, n]]

    def rows_steps(self, b: Builder) -> None:
        """Multi-step replays of the row-independent graph: good ones (two in a batch: one merged launch
        of both, each its own row of every step) checked against numpy, and ones that break a rule."""
        rng, graph = self.rng, self.rows_graph
        if graph is None:
            return
        choice = rng.randrange(6)
        name = proto.op_name(Opcode.REPLAY_STEPS)
        if choice <= 1:
            steps = rng.randint(1, 4)
            for _ in range(1 + choice):
                x = np.random.default_rng(rng.getrandbits(32)).standard_normal((1, ROWS_W)).astype(np.float32)
                data = x.tobytes() + bytes(4 * ROWS_W * (steps - 1))  # x is fed: its later steps' values unused
                fields = [graph, b.frame(data), [[1, ROWS_W]], [], [], steps, False]
                b.op(Opcode.REPLAY_STEPS, fields, ok(name, f"{steps} steps"), then=partial(self.check_steps, x, steps))
        elif choice == 2:
            bad: Any = rng.choice([0, -1, LIMITS.max_replay_steps + 1, 2.5])
            flag: Any = rng.choice([1, 0, "yes", None])
            chosen = rng.random() < 0.5
            fields = [
                graph,
                b.frame(bytes(4 * ROWS_W)),
                [[1, ROWS_W]],
                [],
                [],
                1 if chosen else bad,
                flag if chosen else False,
            ]
            b.op(Opcode.REPLAY_STEPS, fields, fails(name, f"chain {flag!r}" if chosen else f"steps {bad}", INVALID))
        elif choice == 3:
            size = rng.choice([4 * ROWS_W - 4, 4 * ROWS_W, 4 * ROWS_W * 3 + 4])  # 3 steps want 3 rows' worth
            fields = [graph, b.frame(bytes(size)), [[1, ROWS_W]], [], [], 3, False]
            b.op(Opcode.REPLAY_STEPS, fields, fails(name, f"{size} bytes of input for 3 steps", INVALID))
        elif choice == 4:  # a row graph merges with other sessions' rows: no window of its own to chain from
            fields = [graph, b.frame(bytes(4 * ROWS_W * 2)), [[1, ROWS_W]], [], [], 2, True]
            b.op(Opcode.REPLAY_STEPS, fields, fails(name, "chain on a merged graph", INVALID))
        else:
            fields = [graph, b.frame(bytes(4 * 3 * ROWS_W * 2)), [[3, ROWS_W]], [], [], 2, False]
            b.op(Opcode.REPLAY_STEPS, fields, fails(name, "3 rows: no such instance", NOT_FOUND, INVALID))

    def check_steps(self, x: np.ndarray[Any, Any], steps: int, sent: Sent, failed: bool) -> None:
        if failed or sent.reply is None:
            return
        if sent.reply.get("outputs") != [["y", "float32", [1, ROWS_W], 0]] or sent.reply.get("steps") != steps:
            self.findings.add(Kind.SHAPE, f"{self.name}: replay_steps #{sent.seq} answered {short(sent.reply)}")
            return
        want, y = [], x
        for _ in range(steps):
            y = (y * np.float32(1.5) - np.float32(0.5)).astype(np.float32)
            want.append(y)
        got = np.frombuffer(sent.payload[: steps * ROWS_W * 4], np.float32).reshape(steps, 1, ROWS_W)
        if not np.allclose(got, np.stack(want), rtol=1e-5, atol=1e-5):
            self.findings.add(Kind.DATA, f"{self.name}: replay_steps #{sent.seq}: not its own row's steps")

    def replay_fields(self, b: Builder, x: bytes | None = None, **changes: Any) -> list[Any]:
        """[graph, frame, shapes, scalars, binds] of a valid replay of this session's graph, some replaced."""
        data = x if x is not None else self.rng.randbytes(GRAPH_N * 4)
        fields: dict[str, Any] = {
            "graph": self.graph,
            "frame": None,
            "shapes": [[GRAPH_N]],
            "scalars": [1.5],
            "binds": [self.graph_out],
        }
        fields.update(changes)
        if fields["frame"] is None:
            fields["frame"] = b.frame(data)
        return [fields["graph"], fields["frame"], fields["shapes"], fields["scalars"], fields["binds"]]

    def graph_ops(self, b: Builder) -> None:
        """Replays and launches, good and bad; hostile builds; graph handles and names misused."""
        rng = self.rng
        if self.graph is None or self.graph_out is None or self.kernel is None:
            return
        out = self.tensors.get(self.graph_out)
        if out is not None:
            out.data = None  # replays write it
        kind = rng.randrange(17)
        if kind == 16:
            self.rows_steps(b)
            return
        op = Opcode.REPLAY if rng.random() < 0.6 else Opcode.LAUNCH
        name = proto.op_name(op)
        stale = self.stale_handle()
        if kind == 0:  # a good replay: t = x * a + 1, read back with the reply
            x = np.random.default_rng(rng.getrandbits(32)).standard_normal(GRAPH_N).astype(np.float32)
            b.op(
                Opcode.REPLAY,
                self.replay_fields(b, x.tobytes()),
                ok("replay", "a valid replay"),
                then=partial(self.check_replay, x),
            )
        elif kind == 1:
            b.op(Opcode.LAUNCH, self.replay_fields(b), ok("launch", "a valid launch"))
        elif kind == 2:
            graph = rng.choice([stale, *[g for t, g in self.run.graphs.items() if t != self.index]])
            b.op(op, self.replay_fields(b, graph=graph), fails(name, "a stale or foreign graph", NOT_FOUND))
        elif kind == 3:
            size = rng.choice([GRAPH_N + 1, 64, 1])
            fields = self.replay_fields(b, bytes(size * 4), shapes=[[size]])
            b.op(op, fields, fails(name, f"an input shape without an instance ({size})", NOT_FOUND, INVALID))
        elif kind == 4:
            shapes = rng.choice([[], [[GRAPH_N], [GRAPH_N]], [[GRAPH_N, 1]]])
            b.op(op, self.replay_fields(b, shapes=shapes), fails(name, f"shapes {shapes}", NOT_FOUND, INVALID))
        elif kind == 5:
            b.op(op, self.replay_fields(b, frame=-1), fails(name, "no input frame", INVALID))
        elif kind == 6:
            data = bytes(rng.choice([GRAPH_N * 4 - 4, GRAPH_N * 4 + 4, 0, 1]))
            b.op(op, self.replay_fields(b, data), fails(name, f"an input frame of {len(data)} bytes", INVALID))
        elif kind == 7:
            scalars = rng.choice([[], [1.0, 2.0], [1e300], [-3.5e38]])
            b.op(op, self.replay_fields(b, scalars=scalars), fails(name, f"scalars {scalars}", INVALID))
        elif kind == 8:
            foreign = self.run.foreign_handle(self.index, rng)
            binds = rng.choice([[stale], [foreign], [], [self.graph_out, self.graph_out]])
            b.op(op, self.replay_fields(b, binds=binds), fails(name, f"binds {binds}", NOT_FOUND, INVALID))
        elif kind == 9 and (wrong := self.pick(lambda i: i.shape != (GRAPH_N,) or i.dtype != "float32")):
            b.op(op, self.replay_fields(b, binds=[wrong]), fails(name, "a bound tensor of another shape", INVALID))
        elif kind == 10 and self.opened:
            ro = rng.choice(list(self.opened))
            b.op(op, self.replay_fields(b, binds=[ro]), fails(name, "a read-only resident bound as out", PERMISSION))
        elif kind == 11:
            self.bad_build(b)
        elif kind == 12:  # build, free, free again
            handle = self.new_handle()
            b.op(Opcode.GRAPH, [handle, f"tmp{self.new_seq()}", self.graph_def()], ok("graph", "a graph to free"))
            # the build is a request: an earlier failure not yet acknowledged answers it instead, unbuilt
            b.op(Opcode.FREE_GRAPH, [handle], either("free_graph", "a graph just built", NOT_FOUND))
            b.op(Opcode.FREE_GRAPH, [handle], fails("free_graph", "a graph freed already", NOT_FOUND))
        elif kind == 13:
            choice = rng.randrange(4)
            if choice == 0:
                gname = rng.choice(["", "bad name!", "a" * 129])
                b.op(Opcode.PUBLISH_GRAPH, [self.graph, gname], fails("publish_graph", "a bad name", INVALID))
            elif choice == 1:
                b.op(
                    Opcode.PUBLISH_GRAPH,
                    [stale, f"hostile.{SEED}/g/{self.new_seq()}"],
                    fails("publish_graph", "a stale graph", NOT_FOUND),
                )
            elif self.leaving:
                pass  # its graph names are being unpublished: whether a publish finds one taken is a race
            elif choice == 2 and not self.graph_names:
                gname = f"hostile.{SEED}/t{self.index}/graph{self.new_seq()}"
                b.op(
                    Opcode.PUBLISH_GRAPH,
                    [self.graph, gname],
                    ok("publish_graph", "own graph"),
                    then=self.graph_published,
                )
                self.graph_names.add(gname)
            elif self.graph_names:
                b.op(
                    Opcode.PUBLISH_GRAPH,
                    [self.graph, rng.choice(list(self.graph_names))],
                    fails("publish_graph", "a graph name taken", EXISTS, INVALID),
                )
        elif kind == 14:
            theirs = sorted(self.run.published_graphs - self.graph_names)
            choice = rng.randrange(4)
            if choice == 0:
                b.op(
                    Opcode.OPEN_GRAPH,
                    [self.new_handle(), f"hostile.{SEED}/nothing/{self.new_seq()}"],
                    fails("open_graph", "no such graph", NOT_FOUND),
                )
            elif choice == 1:
                b.op(
                    Opcode.OPEN_GRAPH,
                    [self.new_handle(), rng.choice(["", "bad name!", 7])],
                    fails("open_graph", "a bad name", INVALID),
                )
            elif choice == 2 and theirs:
                handle = self.new_handle()
                b.op(
                    Opcode.OPEN_GRAPH,
                    [handle, rng.choice(theirs)],
                    either("open_graph", "another session's graph", NOT_FOUND),
                )
                b.op(Opcode.FREE_GRAPH, [handle], either("free_graph", "an opened graph", NOT_FOUND))
            else:
                in_use = rng.choice([self.graph, self.graph_out, self.kernel])
                b.op(
                    Opcode.OPEN_GRAPH,
                    [in_use, rng.choice([*theirs, "x"])],
                    fails("open_graph", "into a handle in use", INVALID, NOT_FOUND),
                )
        else:
            theirs = sorted(self.run.published_graphs - self.graph_names)
            if theirs and rng.random() < 0.5:
                b.op(
                    Opcode.UNPUBLISH_GRAPH,
                    [rng.choice(theirs)],
                    either("unpublish_graph", "another session's graph", PERMISSION, NOT_FOUND),
                )
            else:
                b.op(
                    Opcode.UNPUBLISH_GRAPH,
                    [f"hostile.{SEED}/nothing/{self.new_seq()}"],
                    fails("unpublish_graph", "no such graph", NOT_FOUND),
                )

    def graph_published(self, sent: Sent, failed: bool) -> None:
        if not failed and self.in_session:
            self.run.published_graphs.update(self.graph_names)

    def check_replay(self, x: np.ndarray[Any, Any], sent: Sent, failed: bool) -> None:
        if failed or sent.reply is None:
            return
        outputs = sent.reply.get("outputs")
        if outputs != [["t", "float32", [GRAPH_N], 0]]:
            self.findings.add(Kind.SHAPE, f"{self.name}: replay #{sent.seq} outputs {short(outputs)}")
            return
        got = np.frombuffer(sent.payload[: GRAPH_N * 4], np.float32)
        want = x * np.float32(1.5) + np.float32(1.0)
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-5):
            self.findings.add(Kind.DATA, f"{self.name}: replay #{sent.seq}: t is not x * 1.5 + 1")

    def bad_build(self, b: Builder) -> None:
        """A graph that must not build: each part of a valid one broken in turn."""
        rng = self.rng
        n, k = GRAPH_N, self.kernel
        grid = [n // 64, 1, 1]
        good_args = [[INPUT, 0], [TEMP, 0], [SCALAR, 0], [F32, 1.0], [U32, n]]
        foreign = self.run.foreign_handle(self.index, rng)
        choice = rng.randrange(17)
        codes: tuple[int, ...] = (INVALID,)
        changes: dict[str, Any]
        handle = self.new_handle()
        if choice == 0:
            changes, what = {"steps": [[0, k, grid, [[INPUT, 5], *good_args[1:]], None]]}, "an input out of range"
        elif choice == 1:
            changes, what = {"steps": [[9, k, grid]]}, "an unknown step kind"
        elif choice == 2:
            changes, what = {"binds": [["x", "float32", [n]]]}, "two tensors named x"
        elif choice == 3:
            changes, what = {"outputs": [["t", [SCALAR, 0]]]}, "a scalar as an output"
        elif choice == 4:
            changes, what = {"steps": [[0, self.stale_handle(), grid, good_args, None]]}, "a stale kernel"
            codes = (NOT_FOUND,)
        elif choice == 5:
            args = [[INPUT, 0], [TENSOR, foreign], *good_args[2:]]
            changes, what, codes = {"steps": [[0, k, grid, args, None]]}, "another session's tensor", (NOT_FOUND,)
        elif choice == 6:
            changes, what = {"steps": [[0, k, grid, good_args[:3], None]]}, "too few args for axpb"
        elif choice == 7:
            changes, what = {"steps": [[0, k, [1, 1 << 20, 1], good_args, None]]}, "a grid past the device limit"
        elif choice == 8:
            changes, what = {"temps": [["float32", [LIMITS.max_tensor_bytes + 1]]]}, "an intermediate too large"
        elif choice == 9:
            changes, what = {"extra": []}, "an unknown key"
        elif choice == 10 and self.opened:
            ro = rng.choice(list(self.opened))
            args = [[INPUT, 0], [TENSOR, ro], *good_args[2:]]
            changes, what, codes = {"steps": [[0, k, grid, args, None]]}, "writing a read-only resident", (PERMISSION,)
        elif choice == 11:
            changes, what = {"rows": True}, "a row-independent graph that binds a tensor"
        elif choice == 12:
            rows: dict[str, Any] = {"rows": True, "binds": [], "steps": [[0, k, grid, good_args, None]]}
            changes, what = {**rows, "slots": 4, "state": [[TENSOR, foreign]]}, "another session's tensor as state"
            codes = (NOT_FOUND, INVALID)
        elif choice == 13:
            changes, what = {"slots": 4}, "slots without rows"
        elif choice == 14:
            changes, what = {"feeds": [["t", "nope"]]}, "a feed into no input"
        elif choice == 15:
            rows = {"rows": True, "binds": [], "steps": [[0, k, grid, good_args, None]]}
            changes, what = {**rows, "pads": [["x", rng.choice(["1", None, [1]])]]}, "a pad that is no number"
        else:
            handle = rng.choice([self.graph_out or 1, self.kernel or 1])
            changes, what = {}, "into a handle in use"
        b.op(Opcode.GRAPH, [handle, f"bad{self.new_seq()}", self.graph_def(**changes)], fails("graph", what, *codes))

    def garbage_kernel(self, b: Builder) -> None:
        """Kernel registrations that must not compile (few: compiles are slow on lavapipe)."""
        rng = self.rng
        self.compiles += 1
        choice = rng.randrange(8)
        handle = self.new_handle()
        options: dict[str, Any] = dict(self.run.kernel_options)  # cuda needs a block to reach the compiler
        if choice == 0:
            source, entry, what = (
                "".join(rng.choice("{}()[];:@<>,.+-*/ \nabcfnvarletu0123") for _ in range(300)),
                "main",
                "noise",
            )
            exp = fails("kernel", what, COMPILE, INVALID)
        elif choice == 1:
            source, entry, what = BAD_SOURCE[self.run.backend], BAD_ENTRY, "an undefined symbol"
            exp = fails("kernel", what, COMPILE)
        elif choice == 2:
            source, entry = (
                "@compute @workgroup_size(64)\nfn main(@builtin(global_invocation_id) g: vec3<u32>) {\n",
                "main",
            )
            exp = fails("kernel", "WGSL cut short", COMPILE, INVALID)
        elif choice == 3:
            source = 'extern "C" __global__ void main_k(float* x) { x[threadIdx.x] = 1.0f; }\n'
            entry = "main_k"
            exp = either("kernel", "CUDA C (compiles on cuda only)", COMPILE, INVALID)
        elif choice == 4:
            source, entry = self.run.kernel_source, "no_such_entry"
            exp = fails("kernel", "an entry point that does not exist", COMPILE, INVALID)
        elif choice == 5:
            source, entry = "// " + "z" * (LIMITS.max_source_bytes - 100) + "\n}}}", "main"
            exp = fails("kernel", "a 1 MiB source of comment and braces", COMPILE, INVALID)
        elif choice == 6:
            source, entry = "fn main() { let x = \u00e9\u4e2d\u0000; }", "main"
            exp = fails("kernel", "unicode and NUL", COMPILE, INVALID)
        else:  # options one backend takes and the other refuses
            source, entry = self.run.kernel_source, "axpb"
            options = rng.choice([{"block": [64, 1, 1]}, {"block": [1024, 1, 1]}, {"flags": ["-O3"]}, {"writes": [0]}])
            exp = either("kernel", f"options {options}", COMPILE, INVALID)

        def registered(sent: Sent, failed: bool, h: int = handle) -> None:
            if not failed and sent.reply is not None and is_int(sent.reply.get("handle")):
                self.kernel_handles.add(sent.reply["handle"])

        b.op(Opcode.KERNEL, [handle, source, entry, options], exp, then=registered)


def bad_hello_device(devices: int) -> tuple[list[bytes], str]:
    hello = {"t": "hello", "v": proto.PROTOCOL_VERSION, "name": "h", "pid": 1, "device": min(devices, 63)}
    return [pack(hello)], "a hello for a device that does not exist"


def short_value(value: Any) -> str:
    if isinstance(value, Raw):
        return f"raw msgpack of {len(value)} bytes"
    if isinstance(value, str) and len(value) > 20:
        return f"a str of {len(value)}"
    if isinstance(value, list) and len(value) > 10:
        return f"a list of {len(value)}"
    return repr(value)


# --------------------------------------------------------------------------- the beater and the good client


class Beater(threading.Thread):
    """Keeps the tenants' leases with their beat keys, from a socket of its own (as the client does)."""

    def __init__(self, run: Run) -> None:
        super().__init__(name="hostile-beats", daemon=True)
        self.shared = run
        self.stopped = threading.Event()
        self.refused = 0
        self.odd: list[str] = []

    def run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.shared.address)
        try:
            while not self.stopped.wait(LEASE_S / 5):
                with self.shared.live_lock:
                    live = list(self.shared.live.items())
                for session, key in live:
                    with contextlib.suppress(zmq.Again):
                        sock.send(proto.encode_beat(session, key), flags=zmq.NOBLOCK)
                while sock.poll(0):
                    try:
                        header = msgpack.unpackb(sock.recv(), raw=False)
                        refused = header.get("t") == "error" and header.get("code") == SESSION
                    except Exception as exc:
                        header, refused = repr(exc), False
                    if refused:
                        self.refused += 1  # a session that just ended
                    else:
                        self.odd.append(short(header))
        finally:
            sock.close(linger=0)
            ctx.term()


async def good_client(run: Run, rounds: list[int], ring: bool = False) -> None:
    """Round trips checked against numpy, from first to last, and a tensor of its own that nobody else
    may touch, read back now and then; any error is a finding. `ring`: through a shared-memory ring."""
    try:
        async with gpud_client.connect(run.address, ring=ring) as gpu:
            if gpu.ring != ring:
                run.findings.add(Kind.GOOD, "the good ring client got no ring")
            k = await axpb(gpu)
            mine = np.random.default_rng(SEED).standard_normal(4096).astype(np.float32)
            kept = gpu.tensor(mine)
            seed = 0
            while not run.hostile_done.is_set() or seed < 3:
                seed += 1
                await check_well_behaved(gpu, k, seed=seed)
                if seed % 10 == 0 and not np.array_equal(await kept.numpy(), mine):
                    run.findings.add(Kind.DATA, f"the good client's own tensor changed (round {seed})")
                rounds.append(seed)
                await asyncio.sleep(0.01)
            kept.free()
    except Exception as exc:
        run.findings.add(Kind.GOOD, f"after {len(rounds)} good rounds: {type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------- the daemon and its resources


@pytest.fixture(scope="module")
def hostile_daemon(daemon: Daemon) -> Iterator[Daemon]:
    """A daemon of this module's own, on each backend the `daemon` fixture covers, with a 1 s lease."""
    # One device: the model of each tenant allocates on device 0, its default (several devices:
    # test_devices.py).
    args = ("--lease-s", str(LEASE_S), "--devices", "0", "--sessionless-total-rate", str(SESSIONLESS_TOTAL_RATE))
    with spawn.daemon(daemon.backend, extra_args=args) as (address, proc):
        yield Daemon(address, proc, daemon.backend)


@dataclasses.dataclass
class Resources:
    memory_in_use: int
    live_buffers: int
    residents: int
    fds: int
    threads: int
    rss: int
    staging: int  # host staging pool bytes: bounded by configuration, not counted as growth
    submissions: int  # for the report: what the RSS grew over
    probes: int

    @classmethod
    async def of(cls, daemon: Daemon) -> Resources:
        """The daemon's counters (from a short session), then its process's, once that session's socket is gone."""
        async with gpud_client.connect(daemon.address) as gpu:
            stats = await gpu.stats()
        await asyncio.sleep(0.3)
        device = stats["device"]
        counts = process_counts(daemon.proc.pid)
        staging = sum(device.get(pool, {}).get("bytes", 0) for pool in ("upload_staging", "download_staging"))
        submissions, probes = device.get("flushes", 0), device.get("validation_probes", 0)
        memory, buffers, residents = device["memory_in_use"], device["live_buffers"], stats["residents"]["count"]
        return cls(memory, buffers, residents, *counts, staging, submissions, probes)

    def __str__(self) -> str:
        return (
            f"memory {self.memory_in_use}, buffers {self.live_buffers}, residents {self.residents}, "
            f"fds {self.fds}, threads {self.threads}, RSS {self.rss >> 20} MiB (staging {self.staging >> 20} MiB)"
        )


def process_counts(pid: int) -> tuple[int, int, int]:
    """(open file descriptors, threads, RSS bytes) of a process, from /proc."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return fds, int(fields["Threads"]), int(fields["VmRSS"].split()[0]) * 1024


def daemon_log_problems(address: str) -> str:
    """Tracebacks and errors from the daemon's log (spawn keeps it next to the socket)."""
    log = Path(address[len("ipc://") :]).parent / "daemon.log"
    if not log.exists():
        return ""
    out: list[str] = []
    taking = False
    for line in log.read_text(errors="replace").splitlines():
        if re.match(r"\d{4}-\d\d-\d\d ", line):  # a new record
            taking = " ERROR " in line or " CRITICAL " in line
            if taking and len(out) > 60:
                break
        if taking:
            out.append(line)
    return "\n".join(out)


# --------------------------------------------------------------------------- the test


async def test_hostile_input(hostile_daemon: Daemon) -> None:
    daemon = hostile_daemon
    started = time.monotonic()
    source, options = kernels.axpb_source(daemon.backend)
    run = Run(daemon.address, daemon.backend, source, {k: list(v) for k, v in options.items()})  # type: ignore[call-overload]

    # Warm up (kernels compiled, pools made, worker threads started), then take the baseline. A readback
    # of more than 64 KiB starts pyzmq's zero-copy garbage collector in the daemon (a thread and a
    # ZeroMQ context of its own: 3 threads, 7 descriptors), once: before the baseline, not after.
    async with gpud_client.connect(daemon.address) as gpu:
        await check_well_behaved(gpu)
        for name, _field in hostile_library.kernels(daemon.backend):  # compiled now: NVRTC's memory too
            await gpu.kernel(f"{OPS_PREFIX}{name}", name)
        big = gpu.empty(1 << 17)
        await big.numpy()
        big.free()
    await asyncio.sleep(0.3)
    baseline = await Resources.of(daemon)

    ctx = zmq.asyncio.Context()
    beater = Beater(run)
    beater.start()
    good_rounds: list[int] = []
    ring_rounds: list[int] = []

    def report(kind: str, text: str) -> None:
        run.findings.add(getattr(Kind, kind), text)

    tenants = [Tenant(ctx, run, i) for i in range(TENANTS)]
    strangers = [Stranger(ctx, run, i) for i in range(STRANGERS)]

    async def hostile() -> None:
        try:
            await asyncio.gather(
                *[t.main(LIVES) for t in tenants],
                *[s.main(STRANGER_MESSAGES) for s in strangers],
                status_flood(run),
                garbage_burst(run, ctx),
                *[hostile_rings.abuser(run.address, i, RING_LIVES, SEED, report, run.counts) for i in range(2)],
            )
        finally:
            run.hostile_done.set()

    try:
        async with asyncio.timeout(100):
            await asyncio.gather(hostile(), good_client(run, good_rounds), good_client(run, ring_rounds, ring=True))
    except TimeoutError:
        run.findings.add(Kind.MISSING, "the hostile run did not finish within 100 s (a hang?)")
    finally:
        beater.stopped.set()
        beater.join(5)
        for peer in [*tenants, *strangers]:
            await peer.disconnect()
        ctx.term()
    hostile_s = time.monotonic() - started

    after: Resources | str = "not measured"
    if daemon.proc.poll() is not None:
        run.findings.add(Kind.DIED, f"the daemon exited with {daemon.proc.returncode}")
    else:
        await cleanup(run)
        after = await check_resources(run, daemon, baseline)
        await check_sessionless(run)
    for odd in beater.odd[:5]:
        run.findings.add(Kind.EXTRA, f"beater: {odd}")

    counts = run.counts
    summary = (
        f"seed {SEED} (GPUD_HOSTILE_SEED), scale {SCALE}, backend {daemon.backend}: "
        f"{counts['hostile messages']} hostile messages ({counts['hostile ops']} ops in their batches), "
        f"{counts['control messages']} control messages ({counts['control ops']} ops), "
        f"{counts['flood messages']} flooded and {counts['burst messages']} burst messages without a session, "
        f"{len(good_rounds)} good round trips ({len(ring_rounds)} through a ring), {beater.refused} late beats "
        f"refused; {counts['ring damages']} rings broken, {counts['ring sessions ended']} of their sessions ended, "
        f"{counts['ring socket strangers']} strangers at the ring socket; "
        f"sessions ended: {', '.join(f'{k[16:]} {v}' for k, v in sorted(counts.items()) if k[:9] == 'sessions ')}; "
        f"hostile phase {hostile_s:.1f} s, total {time.monotonic() - started:.1f} s; "
        f"daemon before: {baseline}; after (fd slack {FD_SLACK}): {after}"
    )
    print(summary)
    if run.findings:
        problems = daemon_log_problems(daemon.address)
        raise AssertionError(f"{summary}\n{run.findings.report()}" + (f"\ndaemon log:\n{problems}" if problems else ""))
    assert counts["hostile messages"] >= MIN_HOSTILE_MESSAGES or SCALE < 1, summary
    assert len(good_rounds) >= 3 and len(ring_rounds) >= 3, summary


async def session_alive(address: str, session: str, key: str) -> bool:
    """A beat with the session's own key is accepted in silence while it lives, refused once it ended."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        await sock.send(proto.encode_beat(session, key))
        if not await sock.poll(500):
            return True
        header = msgpack.unpackb(await sock.recv(), raw=False)
        assert header.get("t") == "error" and header.get("code") == SESSION, header
        return False
    finally:
        sock.close(linger=0)
        ctx.term()


async def cleanup(run: Run) -> None:
    """Every hostile session must end (bye, or its lease expired); then remove the names they left.

    The check is a beat with the session's own key, which renews a live lease: so it comes once the
    leases have run out, and once more a lease later for a session that still answered."""
    await asyncio.sleep(2 * LEASE_S)
    alive = [(s, k) for s, k in run.sessions if await session_alive(run.address, s, k)]
    if alive:
        await asyncio.sleep(3 * LEASE_S)
        for session, key in alive:
            if await session_alive(run.address, session, key):
                run.findings.add(Kind.LEAK, f"session {session} is alive {5 * LEASE_S:.0f} s after its last message")
    async with gpud_client.connect(run.address) as gpu:
        for name in sorted(run.all_names):
            gpu.unpublish(name)
            with contextlib.suppress(gpud_client.GpudError):
                await gpu.sync()  # NOT_FOUND when it was removed already
        for name in sorted(run.graph_names):
            gpu.unpublish_graph(name)
            with contextlib.suppress(gpud_client.GpudError):
                await gpu.sync()


async def check_resources(run: Run, daemon: Daemon, baseline: Resources) -> Resources:
    expected = {"memory_in_use": baseline.memory_in_use, "live_buffers": baseline.live_buffers}
    try:
        await wait_for_memory(daemon.address, expected, timeout=15)
    except AssertionError as exc:
        run.findings.add(Kind.LEAK, str(exc))
    deadline = time.monotonic() + 10
    while True:
        now = await Resources.of(daemon)
        settled = now.fds <= baseline.fds + FD_SLACK and now.threads == baseline.threads
        if (settled and now.residents == baseline.residents) or time.monotonic() > deadline:
            break
    if now.residents != baseline.residents:
        run.findings.add(Kind.LEAK, f"resident tensors: {baseline.residents} -> {now.residents}")
    if now.fds > baseline.fds + FD_SLACK:
        run.findings.add(Kind.LEAK, f"file descriptors: {baseline.fds} -> {now.fds} (slack {FD_SLACK})")
    if now.threads != baseline.threads:
        run.findings.add(Kind.LEAK, f"threads: {baseline.threads} -> {now.threads}")
    growth = (now.rss - baseline.rss) - (now.staging - baseline.staging)
    if growth > RSS_GROWTH_LIMIT:
        run.findings.add(
            Kind.LEAK,
            f"RSS grew {growth >> 20} MiB net of the staging pools (bound {RSS_GROWTH_LIMIT >> 20}) over "
            f"{now.submissions - baseline.submissions} submissions, {now.probes - baseline.probes} validation probes",
        )
    return now

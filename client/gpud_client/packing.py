"""The ops that eager work sends most, packed without the generic encoder (`gpud_protocol.encode_op`
builds a NamedTuple and packs every field per op: about a microsecond): allocations, frees, the op
library's dispatches and replay graphs' runs. The bytes are exactly the generic encoder's
(tests/client/test_hot_path.py compares them); the parts that repeat (an allocation's dtype, shape and
device; a dispatch's grid and scalars) are packed once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

from gpud_client.memo import Memo
from gpud_protocol import ArgKind, DispatchEncoder, Launch, Opcode, Replay, ReplaySteps
from gpud_protocol.wire import pack

pack_fast: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True).pack  # `pack`'s bytes, minus a call

ALLOC = b"\x96" + pack(int(Opcode.ALLOC))  # [opcode, seq, handle, dtype, shape, device]
FREE = b"\x93" + pack(int(Opcode.FREE))  # [opcode, seq, handle]
DISPATCH = DispatchEncoder.PREFIX  # [opcode, seq, kernel, grid, args, writes]
NIL = pack(None)
TENSOR_ARG = b"\x92" + pack(int(ArgKind.TENSOR))  # a dispatch's tensor argument [TENSOR, ref], before its ref

_alloc_tails: Memo[tuple[str, tuple[int, ...], int], bytes] = Memo(4096)


def array_header(count: int) -> bytes:
    """The msgpack header of an array of `count` items."""
    if count < 16:
        return bytes([0x90 | count])
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def alloc(seq: int, handle: int, dtype: str, shape: tuple[int, ...], device: int) -> bytes:
    """`Alloc(seq, handle, dtype, shape, device)`, packed."""
    return ALLOC + pack_fast(seq) + pack_fast(handle) + alloc_tail(dtype, shape, device)


def alloc_tail(dtype: str, shape: tuple[int, ...], device: int) -> bytes:
    """What follows an Alloc's seq and handle: its dtype, shape and device, packed."""
    key = (dtype, shape, device)
    tail = _alloc_tails.get(key)
    if tail is None:
        tail = _alloc_tails.keep(key, pack(dtype) + pack(shape) + pack(device))
    return tail


def free(seq: int, handle: int) -> bytes:
    """`Free(seq, handle)`, packed."""
    return FREE + pack(seq) + pack(handle)


def dispatch_head(grid: tuple[int, int, int], args: int) -> bytes:
    """What follows the kernel in a dispatch of `args` arguments: the grid and the args' array header."""
    return pack(grid) + array_header(args)


def dispatch_tail(scalars: tuple[Any, ...]) -> bytes:
    """What follows the tensor arguments: the scalar arguments (`Scalar`s) and writes (none)."""
    return b"".join([pack(s) for s in scalars]) + NIL


_RUNS = {Replay: int(Opcode.REPLAY), ReplaySteps: int(Opcode.REPLAY_STEPS), Launch: int(Opcode.LAUNCH)}


def graph_run(op: Replay | ReplaySteps | Launch) -> bytes:
    """A replay graph's run (`Replay`, `ReplaySteps` or `Launch`), packed: its fields go as they are."""
    return pack_fast([_RUNS[type(op)], *op])

"""The daemon's reader of batches in the client's layout (`daemon_batch`): it decodes exactly what the
general decoder decodes, leaves anything else to it, and keys the memo by a dispatch body's bytes."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

import gpud_protocol as proto
from gpud_protocol import Opcode, ProtocolViolation
from gpud_protocol.daemon_batch import BATCH_PREFIX
from gpud_protocol.daemon_decode import _decode_batch
from gpud_protocol.wire import unpack_header

LIMITS = proto.DEFAULT_LIMITS
VIEW = [7, 0, [3, 4], [4, 1]]


def frames_of(ops: list[Any], frames: list[bytes] = ()) -> list[Any]:  # type: ignore[assignment]
    packed = b"".join(msgpack.packb(op) for op in ops)
    return [proto.encode_batch(packed, len(ops), len(frames), [3], 5, receipt=True), *frames]


def general(frames: list[Any]) -> Any:
    """What the general decoder makes of the message (no memo)."""
    return _decode_batch(unpack_header(frames[0], LIMITS), frames[1:], LIMITS, None)


def plain(ops: list[Any]) -> list[Any]:
    return [proto.Dispatch(op.seq, *op.entry.fields) if type(op) is proto.Memoized else op for op in ops]


def random_op(rng: random.Random, seq: int) -> list[Any]:
    handle = rng.choice([1, 2, 3, 0, -1, 2.0, True, "x"])
    grid = rng.choice([[1, 1, 1], [4, 2, 1], [0, 1, 1], [1, 1], [70_000, 1, 1], [1, 1, 1.5]])
    arg = rng.choice([[0, 1], [0, VIEW], [1, 2.5], [1, 3], [2, -4], [3, 7], [3, -1], [9, 1], [0, [7, 0]], 5])
    writes = rng.choice([None, [0], [1, 2], [-1], "w"])
    return rng.choice(
        [
            [Opcode.DISPATCH, seq, handle, grid, [arg, [0, 2]], writes],
            [Opcode.DISPATCH, seq, 2, [1, 1, 1], [arg]],  # a field short
            [Opcode.ALLOC, seq, handle, "float32", [2, 3], 0],
            [Opcode.FREE, seq, handle],
            [Opcode.READBACK, seq, rng.choice([handle, VIEW])],
            [Opcode.SYNC, seq],
            [99, seq],
        ]
    )


def test_the_client_layout_is_the_one_read() -> None:
    assert proto.encode_batch(b"", 0, 0).startswith(BATCH_PREFIX)


@pytest.mark.parametrize("seed", range(20))
def test_it_decodes_what_the_general_decoder_decodes(seed: int) -> None:
    rng = random.Random(seed)
    ops = [random_op(rng, seq) for seq in range(1, 40)]
    frames = frames_of(ops)
    assert proto.decode_client_message(frames, LIMITS) == general(frames)
    memo = proto.new_dispatch_memo()
    for _ in range(2):  # the second time, from the memo
        got = proto.decode_client_message(frames, LIMITS, memo)
        assert isinstance(got, proto.Batch)
        assert plain(got.ops) == general(frames).ops


def test_another_key_order_is_read_the_general_way() -> None:
    ops = [[Opcode.DISPATCH, 1, 2, [1, 1, 1], [[0, VIEW]], None]]
    header = {"ops": ops, "t": "batch", "nf": 0, "ack": None, "b": 0, "rc": False}
    got = proto.decode_client_message([msgpack.packb(header)], LIMITS)
    assert got == general(frames_of(ops))._replace(ack=(), number=0, receipt=False)


@pytest.mark.parametrize(
    "body",
    [
        [2, [1, 1, 1], [[0, "x" * (LIMITS.max_source_bytes + 1)]], None],  # a string over the limit
        [2, [1, 1, 1], [[0, {1: 2}]], None],  # a map with an int key
        [2, [1, 1, 1], [[0, b"bytes"]], None],  # bin
    ],
)
def test_a_body_over_a_limit_fails_the_whole_message_as_before(body: list[Any]) -> None:
    frames = frames_of([[Opcode.SYNC, 1], [Opcode.DISPATCH, 2, *body]])
    with pytest.raises(ProtocolViolation) as fast:
        proto.decode_client_message(frames, LIMITS, proto.new_dispatch_memo())
    with pytest.raises(ProtocolViolation) as slow:
        general(frames)
    assert fast.value.message == slow.value.message == "undecodable header: ValueError"


def test_trailing_bytes_and_truncation_are_left_to_the_general_decoder() -> None:
    frame = frames_of([[Opcode.SYNC, 1]])[0]
    for bad in (frame + b"\x00", frame[:-1], frame[: len(BATCH_PREFIX) + 3]):
        with pytest.raises(ProtocolViolation, match="undecodable header"):
            proto.decode_client_message([bad], LIMITS, proto.new_dispatch_memo())


def test_a_repeated_body_is_one_memo_lookup_and_its_encodings_are_told_apart() -> None:
    memo = proto.new_dispatch_memo()
    op = [Opcode.DISPATCH, 1, 2, [1, 1, 1], [[0, VIEW], [3, 5]], None]
    first = proto.decode_client_message(frames_of([op, [*op[:1], 2, *op[2:]]]), LIMITS, memo)
    assert isinstance(first, proto.Batch)
    a, b = first.ops
    assert isinstance(a, proto.Memoized) and isinstance(b, proto.Memoized)
    assert a.entry is b.entry and (a.seq, b.seq) == (1, 2)
    assert memo.hits == 1 and len(memo) == 1
    # The same values packed otherwise (5 as a uint8, not a fixint): another entry, the same fields.
    wider = b"\x96" + msgpack.packb(Opcode.DISPATCH) + msgpack.packb(3) + msgpack.packb(2)
    wider += msgpack.packb([1, 1, 1]) + b"\x92\x92\x00" + msgpack.packb(VIEW) + b"\x92\x03\xcc\x05" + b"\xc0"
    second = proto.decode_client_message([proto.encode_batch(wider, 1, 0)], LIMITS, memo)
    assert isinstance(second, proto.Batch)
    (c,) = second.ops
    assert isinstance(c, proto.Memoized)
    assert c.entry is not a.entry and c.entry.fields == a.entry.fields and len(memo) == 2


def test_a_chain_of_two_new_alternating_bodies_decodes_each_once_then_only_hits() -> None:
    """`gpud bench cuda`'s chain (x -> y, y -> x, ...) in its first batch: each body is decoded once
    and every later op shares its entry (the memo neither churns nor holds copies), then a second
    batch is all hits."""
    memo = proto.new_dispatch_memo()

    def chain(first_seq: int) -> list[Any]:
        return [
            [Opcode.DISPATCH, seq, 2, [64, 1, 1], [[0, 1 + seq % 2], [0, 2 - seq % 2], [3, 4096]], None]
            for seq in range(first_seq, first_seq + 100)
        ]

    first = proto.decode_client_message(frames_of(chain(1)), LIMITS, memo)
    assert isinstance(first, proto.Batch) and all(type(op) is proto.Memoized for op in first.ops)
    assert len(memo) == 2 and memo.misses == 2 and memo.hits == 98
    assert all(op.entry is first.ops[i % 2].entry for i, op in enumerate(first.ops))  # type: ignore[union-attr]
    second = proto.decode_client_message(frames_of(chain(101)), LIMITS, memo)
    assert isinstance(second, proto.Batch)
    assert [op.entry for op in second.ops] == [op.entry for op in first.ops]  # type: ignore[union-attr]
    assert len(memo) == 2 and memo.misses == 2 and memo.hits == 198


REPLAYS = [
    [Opcode.REPLAY, 1, 3, 0, [[16, 32], [32]], [], [4, 5, 6]],
    [Opcode.LAUNCH, 2, 3, 0, [[16, 32], [32]], [], [4, 5, 6]],  # the same body as a launch: frame 0 used twice
    [Opcode.REPLAY_STEPS, 3, 3, -1, [[2]], [1.5, 2], [4, VIEW], 8, False],
    [Opcode.REPLAY, 4, 3, 1, [[2]], [], []],  # frame 1: this message has one
    [Opcode.REPLAY, 5, 0, -1, [[2]], [], []],  # handle 0
    [Opcode.REPLAY, 6, 3, -1, [[2]], ["x"], []],
    [Opcode.REPLAY, 7, 3, -1, [[2]], [], [True]],
    [Opcode.REPLAY_STEPS, 8, 3, -1, [[2]], [], [], 0, False],
    [Opcode.REPLAY_STEPS, 10, 3, -1, [[2]], [], [], 4, True],
    [Opcode.REPLAY_STEPS, 11, 3, -1, [[2]], [], [], 4, 1],  # a chain that is not a flag
    [Opcode.REPLAY, 9, 3, -1, [[2]], []],  # a field short
]


def test_replays_decode_as_the_general_decoder_decodes_them_first_and_from_the_memo() -> None:
    frames = frames_of(REPLAYS, [b"\x00" * 16])
    memo = proto.new_dispatch_memo()
    for _ in range(3):
        got = proto.decode_client_message(frames, LIMITS, memo)
        assert isinstance(got, proto.Batch) and got.ops == general(frames).ops
    assert len(memo) == 4  # the valid bodies (a replay and a launch of the same bytes are told apart)
    assert memo.hits == 8


def test_a_remembered_replay_has_its_frame_checked_against_each_message() -> None:
    memo = proto.new_dispatch_memo()
    op = [Opcode.REPLAY, 1, 3, 0, [[4]], [], []]
    with_frame = frames_of([op], [b"\x00" * 16])
    assert proto.decode_client_message(with_frame, LIMITS, memo) == general(with_frame)
    without = frames_of([op])
    got = proto.decode_client_message(without, LIMITS, memo)
    assert memo.hits == 1 and got == general(without)
    assert isinstance(got, proto.Batch) and type(got.ops[0]) is proto.OpError
    assert "frame index 0 out of range" in got.ops[0].message
    twice = frames_of([op, [Opcode.REPLAY, 2, *op[2:]]], [b"\x00" * 16])
    got = proto.decode_client_message(twice, LIMITS, memo)  # the second use of frame 0 fails alone
    assert got == general(twice) and type(got.ops[1]) is proto.OpError  # type: ignore[union-attr]

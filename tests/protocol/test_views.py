"""Tensor views on the wire (a handle, or [handle, offset, shape, strides]) and the codec's caches,
which evict one entry at a time when full (never the whole cache)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

import gpud_protocol as proto
from gpud_protocol import ArgKind, ErrorCode, Opcode, TensorView

LIMITS = proto.DEFAULT_LIMITS
VIEW = [7, 0, [3, 4], [4, 1]]


def decode(ops: list[Any], memo: proto.DispatchMemo | None = None, frames: list[bytes] = ()) -> list[Any]:  # type: ignore[assignment]
    packed = b"".join(msgpack.packb(op) for op in ops)
    message = proto.decode_client_message([proto.encode_batch(packed, len(ops), len(frames)), *frames], LIMITS, memo)
    assert isinstance(message, proto.Batch)
    return message.ops


def test_views_in_every_tensor_operand_decode_to_a_tensor_view() -> None:
    view = TensorView(7, 0, (3, 4), (4, 1))
    ops = decode(
        [
            [Opcode.DISPATCH, 1, 2, [1, 1, 1], [[0, VIEW], [0, 8], [1, 2.0]], None],
            [Opcode.READBACK, 2, VIEW],
            [Opcode.COPY, 3, VIEW, 8],
            [Opcode.UPLOAD, 4, VIEW, 0, 4],
            [Opcode.REPLAY, 5, 30, -1, [], [], [VIEW, 9]],
            [Opcode.LAUNCH, 6, 30, -1, [], [], [VIEW]],
        ],
        frames=[b"abcd"],
    )
    assert ops == [
        proto.Dispatch(1, 2, (1, 1, 1), ((0, view), (0, 8), (1, 2.0)), None),
        proto.Readback(2, view),
        proto.Copy(3, view, 8),
        proto.Upload(4, view, 0, 4),
        proto.Replay(5, 30, -1, (), (), (view, 9)),
        proto.Launch(6, 30, -1, (), (), (view,)),
    ]
    assert type(ops[0].args[0][1]) is TensorView


def test_the_client_encodes_a_view_as_a_compact_array() -> None:
    view = proto.view_of_shape(7, (3, 4))
    assert view == TensorView(7, 0, (3, 4), (4, 1))
    encoded = proto.DispatchEncoder().encode(1, 2, (1, 1, 1), ((0, view),), None)
    assert msgpack.unpackb(encoded) == [Opcode.DISPATCH, 1, 2, [1, 1, 1], [[0, [7, 0, [3, 4], [4, 1]]]], None]
    assert msgpack.unpackb(proto.encode_op(proto.Readback(2, view))) == [Opcode.READBACK, 2, [7, 0, [3, 4], [4, 1]]]


BIG = LIMITS.max_tensor_bytes


@pytest.mark.parametrize(
    "view",
    [
        [7, 0, [3, 4]],  # no strides
        [7, 0, [3, 4], [4, 1], 0],
        [0, 0, [12], [1]],  # handle 0
        [LIMITS.max_handle + 1, 0, [12], [1]],
        [7.0, 0, [12], [1]],
        [7, -1, [12], [1]],
        [7, 1.0, [12], [1]],
        [7, BIG + 1, [1], [1]],
        [7, 0, [3, 4], [1]],  # strides of another rank
        [7, 0, [3], [-1]],
        [7, 0, [3], [1.0]],
        [7, 0, [3], [True]],
        [7, 0, [1] * (LIMITS.max_ndim + 1), [1] * (LIMITS.max_ndim + 1)],
        [7, 0, [BIG, BIG], [BIG, 1]],  # more elements than any tensor
        [7, 0, [2, 2], [BIG, 1]],  # reaching past any tensor
        [7, BIG, [2], [1]],
        [7, 0, "ab", "cd"],
        [7, 0, None, None],
        [[7], 0, [1], [1]],
        [],
    ],
)
def test_hostile_views_are_refused_against_their_op(view: Any) -> None:
    for raw in ([Opcode.DISPATCH, 1, 2, [1, 1, 1], [[0, view]], None], [Opcode.READBACK, 1, view]):
        (error,) = decode([raw])
        assert type(error) is proto.OpError and error.code == ErrorCode.INVALID_ARGUMENT, view
        assert error.seq == 1


def test_an_empty_view_and_the_largest_ones_are_taken() -> None:
    (op,) = decode([[Opcode.READBACK, 1, [7, 0, [0, 5], [5, 1]]]])
    assert op.handle == TensorView(7, 0, (0, 5), (5, 1))
    (op,) = decode([[Opcode.READBACK, 1, [7, 0, [0] * 8, [BIG] * 8]]])  # empty: reaches nothing
    assert op.handle.shape == (0,) * 8
    (op,) = decode([[Opcode.READBACK, 1, [7, 0, [BIG], [1]]]])
    assert op.handle.shape == (BIG,)
    (op,) = decode([[Opcode.READBACK, 1, [7, BIG - 1, [1], [1]]]])
    assert op.handle.offset == BIG - 1


def test_geometry() -> None:
    assert proto.contiguous_strides((2, 3, 4)) == (12, 4, 1)
    assert proto.contiguous_strides(()) == ()
    assert proto.is_contiguous((2, 3), (3, 1)) and not proto.is_contiguous((2, 3), (1, 2))
    assert proto.is_contiguous((2, 1, 3), (3, 99, 1))  # a dimension of 1 takes any stride
    assert proto.extent(TensorView(1, 0, (2, 3), (3, 1))) == 6
    assert proto.extent(TensorView(1, 5, (2, 3), (1, 2))) == 5 + 1 + 1 + 4
    assert proto.extent(TensorView(1, 5, (0, 3), (3, 1))) == 5


def test_a_graph_names_session_tensors_by_handle_not_by_view() -> None:
    graph = {"steps": [[0, 3, [1, 1, 1], [[0, VIEW]], None]]}
    (error,) = decode([[Opcode.GRAPH, 1, 30, "g", graph]])
    assert type(error) is proto.OpError and error.code == ErrorCode.INVALID_ARGUMENT


# --------------------------------------------------------------------------- caches: one entry at a time


def test_a_full_dispatch_memo_evicts_its_least_recent_entry_only() -> None:
    """Regression: the memo was cleared wholesale when full, so a steady step missed in storms."""
    memo = proto.new_dispatch_memo(2)
    dispatches = [[Opcode.DISPATCH, seq, 2, [seq, 1, 1], [[0, VIEW]], None] for seq in (1, 2, 3)]
    decode(dispatches[:2], memo)
    decode([[Opcode.DISPATCH, 9, 2, [1, 1, 1], [[0, VIEW]], None]], memo)  # a hit: the first is now recent
    decode(dispatches[2:], memo)
    assert len(memo) == 2 and memo.evictions == 1
    grids = {entry.fields[1] for entry in memo._items.values()}
    assert grids == {(1, 1, 1), (3, 1, 1)}  # the second went, the first (used since) stayed
    hits = memo.hits
    (op,) = decode([[Opcode.DISPATCH, 10, 2, [3, 1, 1], [[0, VIEW]], None]], memo)
    assert memo.hits == hits + 1
    assert type(op) is proto.Memoized  # the memo's entry, with the seq of this op
    view = TensorView(7, 0, (3, 4), (4, 1))
    assert proto.Dispatch(op.seq, *op.entry.fields) == proto.Dispatch(10, 2, (3, 1, 1), ((0, view),), None)


def test_a_full_dispatch_encoder_evicts_one_body() -> None:
    """Regression: the client's encoder cleared all its packed bodies when full."""
    encoder = proto.DispatchEncoder(capacity=2)
    view = proto.view_of_shape(7, (12,))
    first = encoder.encode(1, 2, (1, 1, 1), ((0, view),), None)
    encoder.encode(2, 2, (2, 1, 1), ((0, 8),), None)
    encoder.encode(3, 2, (1, 1, 1), ((0, view),), None)  # refreshes the first
    encoder.encode(4, 2, (3, 1, 1), ((int(ArgKind.F32), 1.0),), None)
    bodies = encoder._bodies
    assert len(bodies) == 2 and bodies.evictions == 1
    assert (2, (1, 1, 1), ((0, view),), None) in bodies and (2, (2, 1, 1), ((0, 8),), None) not in bodies
    assert encoder.encode(1, 2, (1, 1, 1), ((0, view),), None) == first

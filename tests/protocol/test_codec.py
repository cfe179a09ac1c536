"""Unit tests of the wire protocol: round trips, every limit, and a fuzz loop (no daemon)."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

import gpud_protocol as proto
from gpud_protocol import (
    Alloc,
    ArgKind,
    Batch,
    Copy,
    Dispatch,
    ErrorCode,
    FlushOp,
    Free,
    KernelOptions,
    Limits,
    Opcode,
    Open,
    OpError,
    ProtocolViolation,
    Publish,
    Readback,
    RegisterKernel,
    Stats,
    Sync,
    Unpublish,
    Upload,
)

LIMITS = proto.DEFAULT_LIMITS


def decode(header: Any, frames: list[bytes] = (), limits: Limits = LIMITS) -> proto.ClientMessage:  # type: ignore[assignment]
    raw = header if isinstance(header, bytes) else msgpack.packb(header, use_bin_type=True)
    return proto.decode_client_message([raw, *frames], limits)


def encode(ops: list[Any], n_frames: int, ack: list[int] | None = None) -> bytes:
    return proto.encode_batch(b"".join(msgpack.packb(op) for op in ops), len(ops), n_frames, ack)


def batch(ops: list[Any], frames: list[bytes] = (), ack: list[int] | None = None, limits: Limits = LIMITS) -> Batch:  # type: ignore[assignment]
    frames = list(frames)
    message = proto.decode_client_message([encode(ops, len(frames), ack), *frames], limits)
    assert isinstance(message, Batch)
    return message


def one_op(op: list[Any], frames: list[bytes] = ()) -> Any:  # type: ignore[assignment]
    decoded = batch([op], frames)
    assert len(decoded.ops) == 1
    return decoded.ops[0]


def op_error(op: list[Any], frames: list[bytes] = ()) -> OpError:  # type: ignore[assignment]
    result = one_op(op, frames)
    assert isinstance(result, OpError), f"{op!r} was accepted as {result!r}"
    assert result.seq == op[1]
    return result


def violation(header: Any, frames: list[bytes] = (), limits: Limits = LIMITS) -> ProtocolViolation:  # type: ignore[assignment]
    with pytest.raises(ProtocolViolation) as info:
        decode(header, frames, limits)
    return info.value


# --------------------------------------------------------------------------- round trips


OPS: list[tuple[list[Any], Any]] = [
    ([Opcode.ALLOC, 1, 7, "float32", [2, 3], 0], Alloc(1, 7, "float32", (2, 3), 0)),
    ([Opcode.ALLOC, 2, 8, "uint8", [], 1], Alloc(2, 8, "uint8", (), 1)),
    ([Opcode.ALLOC, 3, 9, "float16", [0], 63], Alloc(3, 9, "float16", (0,), 63)),
    (
        [Opcode.DISPATCH, 4, 2, [3, 1, 1], [[0, 7], [1, 2.5], [2, -3], [3, 4]], None],
        Dispatch(
            4,
            2,
            (3, 1, 1),
            ((ArgKind.TENSOR, 7), (ArgKind.F32, 2.5), (ArgKind.I32, -3), (ArgKind.U32, 4)),
            None,
        ),
    ),
    ([Opcode.DISPATCH, 5, 2, [0, 0, 0], [], [0, 2]], Dispatch(5, 2, (0, 0, 0), (), (0, 2))),
    ([Opcode.READBACK, 6, 7], Readback(6, 7)),
    ([Opcode.FREE, 7, 7], Free(7, 7)),
    (
        [Opcode.KERNEL, 8, 3, "src", "main", {}],
        RegisterKernel(8, 3, "src", "main", KernelOptions(None, (), None)),
    ),
    (
        [Opcode.KERNEL, 9, 4, "src", "k_2", {"block": [64, 2, 1], "flags": ["-O3", "--use_fast_math"], "writes": [1]}],
        RegisterKernel(9, 4, "src", "k_2", KernelOptions((64, 2, 1), ("-O3", "--use_fast_math"), (1,))),
    ),
    (
        [Opcode.KERNEL, 9, 4, "src", "k_3", {"block": [128, 1, 1], "shared": 100_000}],
        RegisterKernel(9, 4, "src", "k_3", KernelOptions((128, 1, 1), (), None, 100_000)),
    ),
    ([Opcode.SYNC, 10], Sync(10)),
    ([Opcode.COPY, 11, 7, 8], Copy(11, 7, 8)),
    ([Opcode.STATS, 12], Stats(12)),
    ([Opcode.PUBLISH, 13, 7, "weights/layer.0:q-k_v", "ro"], Publish(13, 7, "weights/layer.0:q-k_v", "ro")),
    ([Opcode.PUBLISH, 14, 7, "w", "rw"], Publish(14, 7, "w", "rw")),
    ([Opcode.OPEN, 15, 9, "w"], Open(15, 9, "w")),
    ([Opcode.UNPUBLISH, 16, "w"], Unpublish(16, "w")),
    ([Opcode.FLUSH, 17], FlushOp(17)),
    (
        [
            Opcode.GRAPH,
            18,
            30,
            "step",
            {"inputs": [["x", "float32", [4]]], "steps": [[0, 3, [1, 1, 1], [[4, 0]], None]]},
        ],
        proto.BuildGraph(
            18,
            30,
            "step",
            proto.GraphDef(
                (proto.GraphTensor("x", "float32", (4,)),),
                (),
                (),
                (),
                (proto.GraphDispatch(3, (1, 1, 1), ((4, 0),), None),),
                (),
            ),
        ),
    ),
    ([Opcode.REPLAY, 19, 30, -1, [], [7, 1.5], [7]], proto.Replay(19, 30, -1, (), (7, 1.5), (7,))),
    ([Opcode.LAUNCH, 20, 30, -1, [[4]], [], []], proto.Launch(20, 30, -1, ((4,),), (), ())),
    ([Opcode.REPLAY_STEPS, 31, 30, -1, [], [7], [], 16, False], proto.ReplaySteps(31, 30, -1, (), (7,), (), 16)),
    (
        [Opcode.REPLAY_STEPS, 32, 30, -1, [], [], [], 2, True],
        proto.ReplaySteps(32, 30, -1, (), (), (), 2, chain=True),
    ),
    ([Opcode.FREE_GRAPH, 21, 30], proto.FreeGraph(21, 30)),
    ([Opcode.PUBLISH_GRAPH, 22, 30, "g"], proto.PublishGraph(22, 30, "g")),
    ([Opcode.OPEN_GRAPH, 23, 31, "g"], proto.OpenGraph(23, 31, "g")),
    ([Opcode.UNPUBLISH_GRAPH, 24, "g"], proto.UnpublishGraph(24, "g")),
    ([Opcode.RESHAPE, 25, 9, 7, [3, 4]], proto.Reshape(25, 9, 7, (3, 4))),
    ([Opcode.OPEN_PREFIX, 27, 40, "model/layers.0."], proto.OpenPrefix(27, 40, "model/layers.0.")),
    ([Opcode.OPEN_PREFIX, 28, 40, ""], proto.OpenPrefix(28, 40, "")),
    ([Opcode.RESIDENTS, 29, "w/", ""], proto.ListResidents(29, "w/", "")),
    ([Opcode.RESIDENTS, 30, "", "w/b"], proto.ListResidents(30, "", "w/b")),
    (
        [
            Opcode.GRAPH,
            26,
            30,
            "views",
            {
                "inputs": [["x", "float32", [12]]],
                "views": [[[4, 0], [3, 4]], [[8, 0], [12]]],
                "outputs": [["y", [8, 1]]],
            },
        ],
        proto.BuildGraph(
            26,
            30,
            "views",
            proto.GraphDef(
                (proto.GraphTensor("x", "float32", (12,)),),
                (),
                (),
                (),
                (),
                (proto.GraphOutput("y", (8, 1)),),
                (((4, 0), (3, 4)), ((8, 0), (12,))),
            ),
        ),
    ),
]


@pytest.mark.parametrize(("raw", "expected"), OPS, ids=[f"{Opcode(r[0]).name.lower()}-{r[1]}" for r, _ in OPS])
def test_op_round_trip(raw: list[Any], expected: Any) -> None:
    assert one_op(raw) == expected


@pytest.mark.parametrize("steps", [0, -1, LIMITS.max_replay_steps + 1, 2.0, "3", None])
def test_replay_steps_takes_a_bounded_count(steps: Any) -> None:
    error = op_error([Opcode.REPLAY_STEPS, 1, 30, -1, [], [], [], steps, False])
    assert "steps must be an int" in error.message


@pytest.mark.parametrize("chain", [0, 1, "true", None, 1.0])
def test_replay_steps_chain_is_a_flag(chain: Any) -> None:
    error = op_error([Opcode.REPLAY_STEPS, 1, 30, -1, [], [], [], 2, chain])
    assert "a flag must be true or false" in error.message


def test_replay_steps_without_its_chain_is_refused() -> None:
    error = op_error([Opcode.REPLAY_STEPS, 1, 30, -1, [], [], [], 2])
    assert "expected 7 fields" in error.message


def test_graph_feeds_name_an_output_and_an_input_once() -> None:
    graph = {"inputs": [["x", "float32", [4]], ["z", "float32", [4]]], "outputs": [["y", [4, 0]]]}
    built = one_op([Opcode.GRAPH, 1, 30, "f", {**graph, "feeds": [["y", "x"]]}])
    assert built.graph.feeds == (("y", "x"),)
    encoded = msgpack.unpackb(proto.encode_op(built), raw=False)
    assert encoded[4]["feeds"] == [["y", "x"]]
    for feeds in ([["x", "y"]], [["y", "nope"]], [["y", "x"], ["y", "x"]], [["y"]], "y", [[1, 2]]):
        decoded = batch([[Opcode.GRAPH, 1, 30, "f", {**graph, "feeds": feeds}]])
        assert isinstance(decoded.ops[0], OpError), feeds


def test_a_slot_graph_names_its_slots_state_and_pads() -> None:
    graph = {"inputs": [["x", "int32", [1, 4]]], "outputs": [["y", [4, 0]]], "rows": True}
    good = {**graph, "slots": 8, "state": [[0, 9]], "pads": [["x", -1]]}
    built = one_op([Opcode.GRAPH, 1, 30, "s", good])
    assert (built.graph.slots, built.graph.state, built.graph.pads) == (8, ((0, 9),), (("x", -1),))
    assert msgpack.unpackb(proto.encode_op(built), raw=False)[4]["state"] == [[0, 9]]
    for bad in (
        {**graph, "slots": -1},
        {**graph, "slots": LIMITS.max_slots + 1},
        {**graph, "slots": True},
        {**graph, "rows": False, "slots": 2},
        {**graph, "slots": 2, "state": [[1, 0]]},  # an input is no session tensor
        {**graph, "state": [[0, 9]]},  # state without slots
        {**graph, "pads": [["nope", 1]]},
        {**graph, "pads": [["x", "1"]]},
        {**graph, "pads": [["x", 1], ["x", 2]]},
        {**graph, "rows": False, "pads": [["x", 1]]},
    ):
        decoded = batch([[Opcode.GRAPH, 1, 30, "s", bad]])
        assert isinstance(decoded.ops[0], OpError), bad


def test_a_row_independent_graph_says_so_with_a_boolean() -> None:
    graph = {"inputs": [["x", "float32", [2, 4]]], "outputs": [["y", [4, 0]]]}
    rows = one_op([Opcode.GRAPH, 1, 30, "rows", {**graph, "rows": True}])
    assert rows.graph.rows is True
    assert one_op([Opcode.GRAPH, 1, 30, "rows", graph]).graph.rows is False
    encoded = msgpack.unpackb(proto.encode_op(rows), raw=False)
    assert (
        encoded[4]["rows"] is True
        and "rows"
        not in msgpack.unpackb(proto.encode_op(rows._replace(graph=rows.graph._replace(rows=False))), raw=False)[4]
    )
    for bad in (1, "yes", None, [True]):
        decoded = batch([[Opcode.GRAPH, 1, 30, "rows", {**graph, "rows": bad}]])
        assert isinstance(decoded.ops[0], OpError) and "rows must be true or false" in decoded.ops[0].message


def test_upload_round_trip_and_frames() -> None:
    payloads = [b"\x01\x02\x03\x04", b"", b"x" * 70_000]
    ops = [[Opcode.UPLOAD, 1, 5, 0, 4], [Opcode.UPLOAD, 2, 6, 1, 0], [Opcode.UPLOAD, 3, 7, 2, 70_000]]
    decoded = batch(ops, payloads, ack=[41, 40])
    assert decoded.ops == [Upload(1, 5, 0, 4), Upload(2, 6, 1, 0), Upload(3, 7, 2, 70_000)]
    assert decoded.ack == (41, 40)
    assert [bytes(f) for f in decoded.frames] == payloads


def test_upload_part_round_trip_and_frames() -> None:
    payloads = [b"\x01\x02\x03\x04", b"x" * 70_000]
    ops = [[Opcode.UPLOAD_PART, 1, 5, 0, 8, 4], [Opcode.UPLOAD_PART, 2, 5, 1, 1 << 33, 70_000]]
    decoded = batch(ops, payloads)
    assert decoded.ops == [proto.UploadPart(1, 5, 0, 8, 4), proto.UploadPart(2, 5, 1, 1 << 33, 70_000)]


@pytest.mark.parametrize(
    ("offset", "nbytes"), [(0, 3), (0, 5), (-4, 4), (4.0, 4), ("0", 4), (LIMITS.max_tensor_bytes + 1, 4)]
)
def test_upload_part_bad_offset_or_size_is_its_own_error(offset: Any, nbytes: Any) -> None:
    error = op_error([Opcode.UPLOAD_PART, 3, 1, 0, offset, nbytes], [b"abcd"])
    assert error.code == ErrorCode.INVALID_ARGUMENT and error.op == "upload_part"


@pytest.mark.parametrize("prefix", ["bad prefix", "a" * (LIMITS.max_name_len + 1), "\u00e9", None, 1, ["a"], "a\x00"])
def test_bad_prefixes(prefix: Any) -> None:
    assert op_error([Opcode.OPEN_PREFIX, 3, 1, prefix]).op == "open_prefix"
    assert op_error([Opcode.RESIDENTS, 4, prefix, ""]).op == "residents"
    assert op_error([Opcode.RESIDENTS, 5, "", prefix]).op == "residents"


def test_every_opcode_has_a_round_trip() -> None:
    covered = {raw[0] for raw, _ in OPS} | {Opcode.UPLOAD, Opcode.UPLOAD_PART}
    assert covered == set(Opcode)


def test_all_ops_in_one_batch_keep_order() -> None:
    decoded = batch([raw for raw, _ in OPS])
    assert decoded.ops == [expected for _, expected in OPS]
    assert decoded.ack == ()


def test_control_messages_round_trip() -> None:
    hello = proto.decode_client_message([proto.encode_hello("trainer.py", 1234)], LIMITS)
    assert hello == proto.Hello(proto.PROTOCOL_VERSION, "trainer.py", 1234, None)
    hello = proto.decode_client_message([proto.encode_hello("trainer.py", 1234, 3)], LIMITS)
    assert hello == proto.Hello(proto.PROTOCOL_VERSION, "trainer.py", 1234, 3)
    beat = proto.decode_client_message([proto.encode_beat("abc", "key")], LIMITS)
    assert beat == proto.Beat("abc", "key")
    assert proto.decode_client_message([proto.PING], LIMITS) == proto.Ping()
    assert proto.decode_client_message([proto.BYE], LIMITS) == proto.Bye()


def test_server_messages_round_trip() -> None:
    header, frames = proto.decode_server_message([proto.encode_reply(5, n=3), b"abc"], LIMITS)
    assert header == {"t": "reply", "seq": 5, "ok": True, "n": 3}
    assert frames == [b"abc"]
    header, _ = proto.decode_server_message(
        [proto.encode_error_reply(9, ErrorCode.NOT_FOUND, "no such tensor", 4, "dispatch")], LIMITS
    )
    assert header == {"t": "reply", "seq": 9, "ok": False, "err": (3, "no such tensor", 4, "dispatch")}
    assert proto.decode_server_message([proto.encode_error(ErrorCode.SESSION, "who?")], LIMITS)[0] == {
        "t": "error",
        "code": int(ErrorCode.SESSION),
        "msg": "who?",
    }
    assert proto.decode_server_message([proto.PONG], LIMITS)[0] == {"t": "pong"}
    assert proto.decode_server_message([proto.encode_part(5, 2), b"x"], LIMITS)[0] == {"t": "part", "seq": 5, "i": 2}
    assert proto.decode_server_message([proto.encode_receipt(7)], LIMITS)[0] == {"t": "receipt", "b": 7}


def test_scalar_limits_accepted_at_the_edges() -> None:
    args = [[2, -(1 << 31)], [2, (1 << 31) - 1], [3, 0], [3, (1 << 32) - 1], [1, 3], [1, -1e38]]
    op = one_op([Opcode.DISPATCH, 1, 1, [1, 1, 1], args, None])
    assert [tuple(a) for a in op.args] == [
        (ArgKind.I32, -(1 << 31)),
        (ArgKind.I32, (1 << 31) - 1),
        (ArgKind.U32, 0),
        (ArgKind.U32, (1 << 32) - 1),
        (ArgKind.F32, 3.0),
        (ArgKind.F32, -1e38),
    ]
    assert isinstance(op.args[4][1], float)  # an int passed as f32 becomes a float


# --------------------------------------------------------------------------- message-level limits


def test_oversized_header() -> None:
    small = Limits(max_header_bytes=64)
    exc = violation({"t": "batch", "ops": [[Opcode.SYNC, 1]] * 20, "nf": 0, "ack": None}, limits=small)
    assert exc.code == ErrorCode.PROTOCOL and "too large" in exc.message
    big = msgpack.packb({"t": "ping", "pad": "x" * LIMITS.max_header_bytes})
    assert violation(big).code == ErrorCode.PROTOCOL


def test_too_many_ops() -> None:
    few = Limits(max_ops_per_batch=4)
    exc = violation({"t": "batch", "ops": [[Opcode.SYNC, i] for i in range(5)], "nf": 0, "ack": None}, limits=few)
    assert exc.code == ErrorCode.PROTOCOL and "more than 4 ops" in exc.message
    batch([[Opcode.SYNC, i] for i in range(4)], limits=few)
    n = LIMITS.max_ops_per_batch + 1
    assert violation({"t": "batch", "ops": [[Opcode.SYNC, i] for i in range(n)], "nf": 0, "ack": None}).code == (
        ErrorCode.PROTOCOL
    )


@pytest.mark.parametrize(
    "header",
    [
        [1, 2, 3],
        "batch",
        42,
        None,
        {"ops": []},
        {"t": 5},
        {"t": None},
    ],
)
def test_non_map_header_or_missing_type(header: Any) -> None:
    assert violation(header).code == ErrorCode.PROTOCOL


@pytest.mark.parametrize("kind", ["", "batchx", "Hello", "reply", "welcome", "x" * 100])
def test_unknown_message_type(kind: str) -> None:
    exc = violation({"t": kind})
    assert exc.code == ErrorCode.PROTOCOL and "unknown message type" in exc.message


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xc1",  # never used in msgpack
        b"\xff\x00garbage\x13\x37",
        b"GET / HTTP/1.1\r\n\r\n",
        msgpack.packb({"t": "ping"})[:-2],  # truncated
        msgpack.packb({"t": "ping"}) + b"\x00",  # trailing data
        bytes(range(256)),
    ],
)
def test_garbage_bytes(raw: bytes) -> None:
    assert violation(raw).code == ErrorCode.PROTOCOL


def test_empty_message() -> None:
    with pytest.raises(ProtocolViolation):
        proto.decode_client_message([], LIMITS)


def test_bin_and_ext_types_rejected() -> None:
    with_bin = msgpack.packb({"t": "batch", "ops": [[Opcode.READBACK, 1, b"\x01"]], "nf": 0, "ack": None})
    assert violation(with_bin).code == ErrorCode.PROTOCOL
    with_ext = msgpack.packb({"t": "ping", "x": msgpack.ExtType(1, b"\x00\x01")})
    assert violation(with_ext).code == ErrorCode.PROTOCOL
    timestamp = msgpack.packb({"t": "ping", "x": msgpack.Timestamp(1, 0)})
    assert violation(timestamp).code == ErrorCode.PROTOCOL


def test_strict_map_keys() -> None:
    assert violation(msgpack.packb({1: "ping"})).code == ErrorCode.PROTOCOL
    nested = {"t": "batch", "ops": [[Opcode.KERNEL, 1, 1, "s", "main", {1: [64, 1, 1]}]], "nf": 0, "ack": None}
    assert violation(msgpack.packb(nested)).code == ErrorCode.PROTOCOL
    assert violation(msgpack.packb({"t": "ping", None: 1})).code == ErrorCode.PROTOCOL


def test_map_too_large() -> None:
    header = {"t": "ping", **{f"k{i}": i for i in range(100)}}
    assert violation(header).code == ErrorCode.PROTOCOL


def test_control_messages_carry_no_frames() -> None:
    assert violation({"t": "ping"}, [b"x"]).code == ErrorCode.PROTOCOL
    assert violation(proto.encode_hello("x", 1), [b"x"]).code == ErrorCode.PROTOCOL


@pytest.mark.parametrize(
    "hello",
    [
        {"t": "hello", "v": "1", "name": "x", "pid": 1},
        {"t": "hello", "v": 1.0, "name": "x", "pid": 1},
        {"t": "hello", "v": True, "name": "x", "pid": 1},
        {"t": "hello", "v": 1, "name": 5, "pid": 1},
        {"t": "hello", "v": 1, "name": "x", "pid": "1"},
        {"t": "hello", "v": 1, "name": "x", "pid": False},
        {"t": "hello", "v": 1, "name": "n" * (LIMITS.max_name_len + 1), "pid": 1},
    ],
)
def test_bad_hello(hello: dict[str, Any]) -> None:
    assert violation(hello).code == ErrorCode.PROTOCOL


def test_hello_other_version_decodes() -> None:
    """A well-formed hello of another version decodes; the daemon answers it with an error."""
    assert decode({"t": "hello", "v": 99, "name": "x", "pid": 1}) == proto.Hello(99, "x", 1, None)
    version = decode({"t": "hello", "name": "x", "pid": 1})  # no version at all: answered the same way
    assert isinstance(version, proto.Hello) and version.version != proto.PROTOCOL_VERSION


@pytest.mark.parametrize(
    "header",
    [
        {"t": "batch", "nf": 0, "ack": None},
        {"t": "batch", "ops": {}, "nf": 0, "ack": None},
        {"t": "batch", "ops": [], "ack": None},
        {"t": "batch", "ops": [], "nf": True, "ack": None},
        {"t": "batch", "ops": [], "nf": 0.0, "ack": None},
        {"t": "batch", "ops": [], "nf": 0, "ack": "3"},
        {"t": "batch", "ops": [], "nf": 0, "ack": True},
        {"t": "batch", "ops": [], "nf": 0, "ack": 1.5},
    ],
)
def test_malformed_batch_header(header: dict[str, Any]) -> None:
    assert violation(header).code == ErrorCode.PROTOCOL


@pytest.mark.parametrize("op", [5, "op", None, {"op": 1}, [], [1], [1.0, 1], ["1", 1], [1, "1"], [True, 1], [1, None]])
def test_non_list_op(op: Any) -> None:
    exc = violation({"t": "batch", "ops": [op], "nf": 0, "ack": None})
    assert exc.code == ErrorCode.PROTOCOL and "op must be a list" in exc.message


# --------------------------------------------------------------------------- frames


def test_frame_count_mismatch() -> None:
    upload = [Opcode.UPLOAD, 1, 1, 0, 1]
    assert violation({"t": "batch", "ops": [upload], "nf": 2, "ack": None}, [b"x"]).code == ErrorCode.PROTOCOL
    assert violation({"t": "batch", "ops": [upload], "nf": 0, "ack": None}, [b"x"]).code == ErrorCode.PROTOCOL
    assert violation({"t": "batch", "ops": [upload], "nf": -1, "ack": None}, [b"x"]).code == ErrorCode.PROTOCOL
    assert violation({"t": "batch", "ops": [], "nf": 1, "ack": None}).code == ErrorCode.PROTOCOL


def test_too_many_frames() -> None:
    few = Limits(max_frames=2)
    ops = [[Opcode.UPLOAD, i + 1, i + 1, i, 1] for i in range(3)]
    exc = violation({"t": "batch", "ops": ops, "nf": 3, "ack": None}, [b"a", b"b", b"c"], limits=few)
    assert exc.code == ErrorCode.PROTOCOL


def test_frame_used_twice() -> None:
    decoded = batch([[Opcode.UPLOAD, 1, 1, 0, 2], [Opcode.UPLOAD, 2, 2, 0, 2]], [b"ab"])
    assert decoded.ops[0] == Upload(1, 1, 0, 2)
    error = decoded.ops[1]
    assert isinstance(error, OpError)
    assert (error.seq, error.code, error.op) == (2, ErrorCode.INVALID_ARGUMENT, "upload")
    assert "used twice" in error.message


def test_unused_frame() -> None:
    exc = violation({"t": "batch", "ops": [[Opcode.UPLOAD, 1, 1, 0, 1]], "nf": 2, "ack": None}, [b"a", b"b"])
    assert exc.code == ErrorCode.PROTOCOL and "not used" in exc.message


@pytest.mark.parametrize("frame_index", [-1, 1, 7, 1.0, "0", None, True])
def test_upload_frame_index_out_of_range(frame_index: Any) -> None:
    """An index that names no frame leaves frame 0 unused: the whole batch is refused."""
    ops = [[Opcode.UPLOAD, 1, 1, frame_index, 1]]
    assert violation({"t": "batch", "ops": ops, "nf": 1, "ack": None}, [b"a"]).code == ErrorCode.PROTOCOL


@pytest.mark.parametrize("nbytes", [3, 5, 0, -4, 4.0, "4", None, LIMITS.max_tensor_bytes + 1])
def test_upload_nbytes_must_match_frame(nbytes: Any) -> None:
    """The op that lies about its frame fails with its own clear error, against its seq."""
    error = op_error([Opcode.UPLOAD, 3, 1, 0, nbytes], [b"abcd"])
    assert error.code == ErrorCode.INVALID_ARGUMENT and error.op == "upload"
    assert "frame 0 holds 4 bytes" in error.message or "byte count" in error.message


def test_upload_with_bad_handle_consumes_its_frame() -> None:
    error = op_error([Opcode.UPLOAD, 3, 0, 0, 4], [b"abcd"])
    assert error.code == ErrorCode.INVALID_ARGUMENT and "bad handle" in error.message


# --------------------------------------------------------------------------- op-level validation


@pytest.mark.parametrize("handle", [0, -1, -(1 << 40), 1 << 31, 1 << 62, True, False, 1.0, "1", None, [1]])
def test_bad_handles(handle: Any) -> None:
    for op in (
        [Opcode.READBACK, 5, handle],
        [Opcode.FREE, 5, handle],
        [Opcode.ALLOC, 5, handle, "float32", [1], 0],
        [Opcode.COPY, 5, handle, 1],
        [Opcode.COPY, 5, 1, handle],
        [Opcode.DISPATCH, 5, handle, [1, 1, 1], [], None],
        [Opcode.DISPATCH, 5, 1, [1, 1, 1], [[0, handle]], None],
        [Opcode.KERNEL, 5, handle, "src", "main", {}],
        [Opcode.PUBLISH, 5, handle, "name", "ro"],
        [Opcode.OPEN, 5, handle, "name"],
    ):
        error = op_error(op)
        assert error.code == ErrorCode.INVALID_ARGUMENT


def test_largest_handle_accepted() -> None:
    assert one_op([Opcode.READBACK, 1, LIMITS.max_handle]) == Readback(1, LIMITS.max_handle)


@pytest.mark.parametrize(
    "dtype", ["float128", "object", "O", "complex64", "bool_", "", "f4", 5, None, 1.5, [], {}, ["x"]]
)
def test_bad_dtype(dtype: Any) -> None:
    error = op_error([Opcode.ALLOC, 1, 1, dtype, [4], 0])
    assert error.code == ErrorCode.INVALID_ARGUMENT and error.op == "alloc"


@pytest.mark.parametrize("dtype", sorted(proto.DTYPE_SIZES))
def test_every_whitelisted_dtype(dtype: str) -> None:
    op = one_op([Opcode.ALLOC, 1, 1, dtype, [3, 5], 0])
    assert op.nbytes == 15 * proto.DTYPE_SIZES[dtype]


@pytest.mark.parametrize(
    "shape",
    [
        [1] * (LIMITS.max_ndim + 1),
        [-1],
        [2, -3],
        [1.0],
        ["4"],
        [True],
        4,
        None,
        {},
        [[2]],
    ],
)
def test_bad_shape(shape: Any) -> None:
    assert op_error([Opcode.ALLOC, 1, 1, "float32", shape, 0]).code == ErrorCode.INVALID_ARGUMENT


def test_max_ndim_accepted() -> None:
    assert one_op([Opcode.ALLOC, 1, 1, "uint8", [1] * LIMITS.max_ndim, 0]).shape == (1,) * LIMITS.max_ndim


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [
        ("float32", [LIMITS.max_tensor_bytes // 4 + 1]),
        ("uint8", [LIMITS.max_tensor_bytes + 1]),
        ("float64", [1 << 20, 1 << 20]),
        ("float32", [1 << 30] * 8),  # 2**242 elements: no overflow, just refused
        ("uint8", [LIMITS.max_tensor_bytes + 1, 0]),
    ],
)
def test_nbytes_past_max_tensor_bytes(dtype: str, shape: list[int]) -> None:
    assert op_error([Opcode.ALLOC, 1, 1, dtype, shape, 0]).code == ErrorCode.INVALID_ARGUMENT


def test_a_tensor_may_be_larger_than_a_message() -> None:
    """A tensor's size is not bounded by a message's: a larger upload travels in parts."""
    assert LIMITS.max_tensor_bytes > LIMITS.max_message_bytes
    assert one_op([Opcode.ALLOC, 1, 1, "float16", [151936, 3584], 0]).nbytes == 151936 * 3584 * 2  # 1.09 GB


def test_nbytes_at_max_tensor_bytes_accepted() -> None:
    assert one_op([Opcode.ALLOC, 1, 1, "uint8", [LIMITS.max_tensor_bytes], 0]).nbytes == LIMITS.max_tensor_bytes


@pytest.mark.parametrize(
    "arg",
    [
        [4, 1],
        [-1, 1],
        [0, 1.5],
        [0, 0],
        [1, "1.0"],
        [1, True],
        [1, None],
        [2, 1.0],
        [2, 1 << 31],
        [2, -(1 << 31) - 1],
        [2, False],
        [3, -1],
        [3, 1 << 32],
        [3, 2.0],
        [1.0, 1],
        [True, 1],
        ["f32", 1.0],
        [1],
        [1, 2, 3],
        5,
        "x",
        None,
        {"k": 1},
    ],
)
def test_bad_args(arg: Any) -> None:
    error = op_error([Opcode.DISPATCH, 9, 1, [1, 1, 1], [[0, 1], arg], None])
    assert error.code == ErrorCode.INVALID_ARGUMENT and error.op == "dispatch"


def test_too_many_args() -> None:
    args = [[2, i] for i in range(LIMITS.max_args + 1)]
    assert op_error([Opcode.DISPATCH, 1, 1, [1, 1, 1], args, None]).code == ErrorCode.INVALID_ARGUMENT
    assert len(one_op([Opcode.DISPATCH, 1, 1, [1, 1, 1], args[:-1], None]).args) == LIMITS.max_args


@pytest.mark.parametrize(
    "grid",
    [[1, 1], [1, 1, 1, 1], [-1, 1, 1], [1 << 31, 1, 1], [1.0, 1, 1], [True, 1, 1], 4, None, "111"],
)
def test_bad_grid(grid: Any) -> None:
    assert op_error([Opcode.DISPATCH, 1, 1, grid, [], None]).code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize("writes", [[-1], [LIMITS.max_args], [1.0], "1", 3, [None]])
def test_bad_dispatch_writes(writes: Any) -> None:
    assert op_error([Opcode.DISPATCH, 1, 1, [1, 1, 1], [], writes]).code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("source", "entry", "options"),
    [
        ("", "main", {}),
        (5, "main", {}),
        (None, "main", {}),
        ("src", "", {}),
        ("src", "not an identifier", {}),
        ("src", "1main", {}),
        ("src", 5, {}),
        ("src", "m" * (LIMITS.max_name_len + 1), {}),
        ("src", "main", None),
        ("src", "main", []),
        ("src", "main", {"blocks": [1, 1, 1]}),
        ("src", "main", {"block": [0, 1, 1]}),
        ("src", "main", {"block": [1025, 1, 1]}),
        ("src", "main", {"block": [64, 1]}),
        ("src", "main", {"block": 64}),
        ("src", "main", {"flags": "-O3"}),
        ("src", "main", {"flags": ["O3"]}),
        ("src", "main", {"flags": [3]}),
        ("src", "main", {"flags": ["-" + "x" * 300]}),
        ("src", "main", {"flags": ["-x"] * (LIMITS.max_options + 1)}),
        ("src", "main", {"writes": [-1]}),
        ("src", "main", {"writes": "1"}),
        ("src", "main", {"shared": -1}),
        ("src", "main", {"shared": (1 << 20) + 1}),
        ("src", "main", {"shared": 1.5}),
        ("src", "main", {"shared": True}),
    ],
)
def test_bad_kernel(source: Any, entry: Any, options: Any) -> None:
    error = op_error([Opcode.KERNEL, 4, 1, source, entry, options])
    assert error.code == ErrorCode.INVALID_ARGUMENT and error.op == "kernel"


@pytest.mark.parametrize("source", ["x" * (LIMITS.max_source_bytes + 1), "é" * (LIMITS.max_source_bytes // 2 + 1)])
def test_oversized_kernel_source(source: str) -> None:
    """Strings past the source limit (in bytes) are refused by the unpacker, before any op is built."""
    op = [Opcode.KERNEL, 4, 1, source, "main", {}]
    assert violation({"t": "batch", "ops": [op], "nf": 0, "ack": None}).code == ErrorCode.PROTOCOL
    assert one_op([Opcode.KERNEL, 4, 1, "x" * LIMITS.max_source_bytes, "main", {}]).source == "x" * (
        LIMITS.max_source_bytes
    )


@pytest.mark.parametrize(
    "name", ["", "has space", "semi;colon", "new\nline", "ü", "n" * (LIMITS.max_name_len + 1), 5, None, ["w"]]
)
def test_bad_resident_names(name: Any) -> None:
    for op in ([Opcode.PUBLISH, 2, 1, name, "ro"], [Opcode.OPEN, 2, 1, name], [Opcode.UNPUBLISH, 2, name]):
        assert op_error(op).code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize("mode", ["r", "RO", "wo", "", None, 1, ["ro"]])
def test_bad_publish_mode(mode: Any) -> None:
    assert op_error([Opcode.PUBLISH, 2, 1, "w", mode]).code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "op",
    [
        [Opcode.READBACK, 1],
        [Opcode.READBACK, 1, 1, 1],
        [Opcode.SYNC, 1, 0],
        [Opcode.STATS, 1, None],
        [Opcode.FLUSH, 1, 1],
        [Opcode.ALLOC, 1, 1, "float32"],
        [Opcode.DISPATCH, 1, 1, [1, 1, 1], []],
        [Opcode.KERNEL, 1, 1, "src", "main"],
        [Opcode.COPY, 1, 1],
        [Opcode.PUBLISH, 1, 1, "w"],
        [Opcode.OPEN, 1, 1],
        [Opcode.UNPUBLISH, 1],
        [Opcode.UNPUBLISH, 1, "w", "x"],
    ],
)
def test_wrong_field_count(op: list[Any]) -> None:
    assert op_error(op).code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize("opcode", [0, max(Opcode) + 1, 99, -1, 1 << 40])
def test_unknown_opcode_is_reported_against_its_seq(opcode: int) -> None:
    decoded = batch([[Opcode.SYNC, 1], [opcode, 77, "whatever"], [Opcode.SYNC, 78]])
    assert decoded.ops[0] == Sync(1)
    error = decoded.ops[1]
    assert isinstance(error, OpError)
    assert (error.seq, error.code, error.op) == (77, ErrorCode.PROTOCOL, f"op{opcode}")
    assert "unknown opcode" in error.message
    assert decoded.ops[2] == Sync(78)  # the rest of the batch still decodes


# --------------------------------------------------------------------------- fuzz

VALID_OPS: list[list[Any]] = [raw for raw, _ in OPS] + [[Opcode.UPLOAD, 20, 1, 0, 8]]


def _random_object(rng: random.Random, depth: int = 0) -> Any:
    leaves = [
        lambda: rng.randint(-(1 << 40), 1 << 40),
        lambda: rng.choice([0, 1, -1, 2, 8, 64, 1 << 31, (1 << 31) - 1, 1 << 32, (1 << 63) - 1, -(1 << 63)]),
        lambda: rng.choice([0.0, -1.5, 1e300, float("inf"), float("nan")]),
        lambda: rng.choice([True, False, None]),
        lambda: rng.choice(["", "float32", "uint8", "ro", "rw", "main", "batch", "hello", "-O3", "é", "x" * 300]),
        lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(4))),
        lambda: msgpack.ExtType(rng.randrange(128), b"ab"),
    ]
    branches = [
        lambda: [_random_object(rng, depth + 1) for _ in range(rng.randrange(6))],
        lambda: {
            rng.choice(["t", "ops", "nf", "ack", "v", "name", "pid", "block", "flags", "writes"]): _random_object(
                rng, depth + 1
            )
            for _ in range(rng.randrange(5))
        },
    ]
    return rng.choice(leaves + branches if depth < 4 else leaves)()


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("field", range(2, 6))
def test_deep_nesting_in_any_field_is_an_invalid_argument(field: int) -> None:
    """A list nested ~1000 deep where a value belongs: a clear error against the op, never a RecursionError."""
    for raw in ([Opcode.DISPATCH, 9, 1, [1, 1, 1], [], None], [Opcode.ALLOC, 9, 1, "float32", [1], 0]):
        op = list(raw)
        if field < len(op):
            op[field] = _nested(1000)
            error = op_error(op)
            assert error.code == ErrorCode.INVALID_ARGUMENT and len(error.message) < 200


def test_f32_scalars_out_of_range_are_refused_at_decode() -> None:
    error = op_error([Opcode.DISPATCH, 4, 1, [1, 1, 1], [[1, 1e300]], None])
    assert error.code == ErrorCode.INVALID_ARGUMENT and "32-bit float" in error.message
    op = one_op([Opcode.DISPATCH, 5, 1, [1, 1, 1], [[1, float("inf")], [1, 3.4e38]], None])
    assert op.args[0][1] == float("inf")


def _mutate(rng: random.Random, op: list[Any]) -> list[Any]:
    op = list(op)
    for _ in range(rng.randrange(1, 3)):
        i = rng.randrange(len(op) + 1)
        action = rng.randrange(4)
        if action == 0 and i < len(op):
            op[i] = _random_object(rng)
        elif action == 1:
            op.insert(i, _random_object(rng))
        elif action == 2 and i < len(op):
            del op[i]
        elif i < len(op) and isinstance(op[i], list | dict) and op[i]:
            inner = op[i]
            if isinstance(inner, list):
                inner = list(inner)
                inner[rng.randrange(len(inner))] = _random_object(rng)
            else:
                inner = dict(inner)
                inner[rng.choice(list(inner))] = _random_object(rng)
            op[i] = inner
    return op


OP_TYPES = proto.Op  # every op the schema defines (`op_types`)


def _check(frames: list[bytes]) -> None:
    try:
        message = proto.decode_client_message(frames, LIMITS)
    except ProtocolViolation as exc:
        assert isinstance(exc.code, ErrorCode) and isinstance(exc.message, str)
        return
    assert isinstance(message, proto.Hello | proto.Batch | proto.Ping | proto.Beat | proto.Bye)
    if isinstance(message, proto.Batch):
        for op in message.ops:
            assert isinstance(op, OpError | OP_TYPES)


def test_fuzz_only_protocol_violations() -> None:
    """Random mutations of valid messages and random msgpack objects: decode raises nothing else."""
    rng = random.Random(20261122)
    frame = bytes(8)
    for _ in range(3000):  # mutated ops inside an otherwise valid batch
        ops = [_mutate(rng, rng.choice(VALID_OPS)) for _ in range(rng.randrange(1, 4))]
        nf = rng.choice([1, 1, 1, 0, 2])
        _check([encode(ops, nf, rng.choice([None, None, [3]])), *[frame] * nf])
    for _ in range(2000):  # random objects as the whole header, with the odd random frame
        header = _random_object(rng)
        try:
            raw = msgpack.packb(header, use_bin_type=True)
        except (OverflowError, ValueError):
            continue
        _check([raw, *[frame] * rng.randrange(2)])
    valid = encode([rng.choice(VALID_OPS) for _ in range(4)], 1, None)
    for _ in range(3000):  # byte flips, truncations and insertions in a valid header
        raw = bytearray(valid)
        for _ in range(rng.randrange(1, 4)):
            where = rng.randrange(len(raw))
            action = rng.randrange(3)
            if action == 0:
                raw[where] = rng.randrange(256)
            elif action == 1:
                del raw[where:]
                if not raw:
                    break
            else:
                raw.insert(where, rng.randrange(256))
        _check([bytes(raw), frame])

"""The scalar kinds are defined once (`arg_kinds`): the name, packing and range of each agree, and the
daemon's decoder accepts exactly that range."""

from __future__ import annotations

import struct

import pytest

import gpud_protocol as proto
from gpud_protocol import SCALAR_FORMATS, SCALAR_KINDS, SCALAR_NAMES, SCALAR_RANGES, ArgKind


def test_every_scalar_kind_has_a_name_and_a_format_and_the_names_invert() -> None:
    assert set(SCALAR_NAMES) == set(SCALAR_FORMATS) == {ArgKind.F32, ArgKind.I32, ArgKind.U32}
    assert set(SCALAR_RANGES) == {ArgKind.I32, ArgKind.U32}  # F32: any finite 32-bit float
    assert {SCALAR_KINDS[name]: name for name in SCALAR_KINDS} == SCALAR_NAMES
    assert all(struct.calcsize("<" + fmt) == 4 for fmt in SCALAR_FORMATS.values())


@pytest.mark.parametrize("kind", sorted(SCALAR_RANGES))
def test_an_integer_kind_packs_exactly_its_range(kind: ArgKind) -> None:
    low, high = SCALAR_RANGES[kind]
    fmt = "<" + SCALAR_FORMATS[kind]
    struct.pack(fmt, low)
    struct.pack(fmt, high)
    for outside in (low - 1, high + 1):
        with pytest.raises(struct.error):
            struct.pack(fmt, outside)


def decode_one(kind: int, value: int) -> object:
    """The op the daemon decodes from a dispatch with one scalar argument."""
    op = proto.encode_op(proto.Dispatch(1, 1, (1, 1, 1), ((kind, value),), None))
    message = proto.decode_client_message([proto.encode_batch(op, 1, 0)], proto.DEFAULT_LIMITS)
    assert isinstance(message, proto.Batch) and len(message.ops) == 1
    return message.ops[0]


@pytest.mark.parametrize("kind", sorted(SCALAR_RANGES))
def test_the_decoder_accepts_exactly_the_range(kind: ArgKind) -> None:
    low, high = SCALAR_RANGES[kind]

    for value in (low, high):
        op = decode_one(int(kind), value)
        assert isinstance(op, proto.Dispatch) and op.args == ((kind, value),)
    for outside in (low - 1, high + 1):
        failed = decode_one(int(kind), outside)
        assert isinstance(failed, proto.OpError) and failed.op == "dispatch" and str(outside) in failed.message


def test_a_bad_kind_is_answered_with_the_kinds_there_are() -> None:
    failed = decode_one(9, 1)
    assert isinstance(failed, proto.OpError)
    assert failed.message.endswith("kind 0 tensor handle or view, 1 f32, 2 i32, 3 u32")

"""Field validators (`gpud_protocol.fields`): the all-handles fast path of `check_operands` decides as
checking each operand does."""

from __future__ import annotations

from typing import Any

import pytest

from gpud_protocol import DEFAULT_LIMITS, ProtocolViolation
from gpud_protocol.fields import check_operand, check_operands
from gpud_protocol.views import TensorView

LIMITS = DEFAULT_LIMITS
TOP = LIMITS.max_handle


def _one_by_one(value: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(check_operand(v, LIMITS, ()) for v in value)


@pytest.mark.parametrize(
    "value",
    [(), (1,), (1, 2, 3), (TOP,), tuple(range(1, 49)), (1, (2, 0, (4,), (1,))), ((2, 0, (4,), (1,)),)],
)
def test_good_operands_decode_as_each_one_checked(value: tuple[Any, ...]) -> None:
    got = check_operands(value, LIMITS, ())
    assert got == _one_by_one(value)
    assert [type(v) for v in got] == [type(v) for v in _one_by_one(value)]
    if value and type(value[-1]) is tuple:
        assert type(got[-1]) is TensorView


@pytest.mark.parametrize("value", [(0,), (1, -1), (TOP + 1,), (True,), (1, False), (1, 2.0), (1, "2"), (1, None)])
def test_bad_operands_are_refused_as_each_one_checked(value: tuple[Any, ...]) -> None:
    with pytest.raises(ProtocolViolation):
        _one_by_one(value)
    with pytest.raises(ProtocolViolation):
        check_operands(value, LIMITS, ())


def test_operands_are_a_bounded_list() -> None:
    with pytest.raises(ProtocolViolation, match="at most"):
        check_operands([1, 2], LIMITS, ())
    with pytest.raises(ProtocolViolation, match="at most"):
        check_operands((1,) * (LIMITS.max_graph_tensors + 1), LIMITS, ())

"""The client's transport helpers that need no daemon: GPUD_SPIN_US, the default spin of a session."""

from __future__ import annotations

import pytest

from gpud_client import InvalidArgument
from gpud_client.transport import spin_from_environment


def test_no_spin_unless_the_environment_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUD_SPIN_US", raising=False)
    assert spin_from_environment() == 0.0
    monkeypatch.setenv("GPUD_SPIN_US", "")
    assert spin_from_environment() == 0.0
    monkeypatch.setenv("GPUD_SPIN_US", "250.5")
    assert spin_from_environment() == 250.5


@pytest.mark.parametrize("text", ["abc", "-1", "1e7", "nan", "inf"])
def test_a_spin_out_of_range_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("GPUD_SPIN_US", text)
    with pytest.raises(InvalidArgument, match="GPUD_SPIN_US must be microseconds from 0 to 1000000"):
        spin_from_environment()

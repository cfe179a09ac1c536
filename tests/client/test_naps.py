"""When a spinning session sleeps and when it spins for a repeated request's reply (gpud_client.naps)."""

from __future__ import annotations

import pytest

from gpud_client.naps import KEPT, Expected, nap_s


def test_a_reply_is_expected_only_after_several_came_and_then_at_the_quickest_of_the_last() -> None:
    expected = Expected()
    for seconds in (0.004, 0.003)[: KEPT - 1]:
        expected.add(seconds)
        assert expected.seconds() == 0.0
    expected.add(0.005)
    assert expected.seconds() == pytest.approx(0.003)
    for _ in range(KEPT):
        expected.add(0.010)
    assert expected.seconds() == pytest.approx(0.010)  # the older, quicker ones forgotten


@pytest.mark.parametrize(
    ("due_s", "spin_s", "elapsed_s", "nap"),
    [
        (0.0030, 0.001, 0.0001, 0.002),  # 2.4 ms to half a spin before: 2 whole milliseconds
        (0.0030, 0.001, 0.0009, 0.001),
        (0.0012, 0.001, 0.0001, 0.0),  # less than a millisecond: no nap, spin now
        (0.0030, 0.001, 0.0050, 0.0),  # already late
        (0.0200, 0.005, 0.0, 0.017),
    ],
)
def test_a_nap_is_whole_milliseconds_ending_at_least_half_a_spin_before_the_reply(
    due_s: float, spin_s: float, elapsed_s: float, nap: float
) -> None:
    got = nap_s(due_s, spin_s, elapsed_s)
    assert got == pytest.approx(nap)
    assert got == 0.0 or elapsed_s + got <= due_s - spin_s / 2 + 1e-12

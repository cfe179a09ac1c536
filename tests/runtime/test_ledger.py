"""The completion ledger: callbacks in submission order, none lost, failures kept to their submission."""

from __future__ import annotations

import pytest

from gpud.backends.base import SubmissionFailed
from gpud.runtime.ledger import CompletionLedger
from gpud_protocol.errors import DeviceLost


def make() -> tuple[CompletionLedger, list[DeviceLost]]:
    lost: list[DeviceLost] = []
    return CompletionLedger(lost.append), lost


def test_callbacks_run_in_order_once_their_submission_completes() -> None:
    ledger, _ = make()
    seen: list[tuple[str, BaseException | None]] = []
    first, second = ledger.next_submission(), ledger.next_submission()
    ledger.after(second, lambda e: seen.append(("second", e)))
    ledger.after(first, lambda e: seen.append(("first", e)))
    assert ledger.in_flight == 2
    ledger.complete(first)
    assert seen == [("first", None)]
    ledger.complete(second)
    assert seen == [("first", None), ("second", None)]
    ledger.after(first, lambda e: seen.append(("late", e)))  # already complete: runs at once
    assert seen[-1] == ("late", None)
    assert ledger.in_flight == 0


def test_a_callback_added_while_its_submission_completes_still_runs() -> None:
    """Regression: a session ended inside a completion callback registered frees for that very
    submission; they were appended to a list already popped, and its memory was never returned."""
    ledger, _ = make()
    index = ledger.next_submission()
    freed: list[int] = []

    def end_session(_error: BaseException | None) -> None:
        for buffer in (1, 2, 3):  # the session's buffers were last used by this submission
            ledger.after(index, lambda _e, b=buffer: freed.append(b))  # type: ignore[misc]

    ledger.after(index, end_session)
    ledger.complete(index)
    assert freed == [1, 2, 3]


def test_completing_a_later_submission_completes_the_earlier_ones() -> None:
    ledger, _ = make()
    seen: list[int] = []
    for _ in range(3):
        i = ledger.next_submission()
        ledger.after(i, lambda _e, i=i: seen.append(i))  # type: ignore[misc]
    ledger.complete(3)
    assert seen == [1, 2, 3]


def test_a_failed_submission_fails_its_own_waiters_only() -> None:
    ledger, lost = make()
    a, b, c = (ledger.next_submission() for _ in range(3))
    outcome: dict[int, BaseException | None] = {}
    for i in (a, b, c):
        ledger.after(i, lambda e, i=i: outcome.__setitem__(i, e))  # type: ignore[misc]
    ledger.complete(a)
    failure = SubmissionFailed("refused")
    ledger.complete(b, failure)
    ledger.complete(c)
    assert outcome == {a: None, b: failure, c: None}
    assert not lost and ledger.lost is None and ledger.failures == 1


def test_a_lost_device_fails_everything_now_and_later_and_reports_once() -> None:
    ledger, lost = make()
    a, b = ledger.next_submission(), ledger.next_submission()
    outcome: list[BaseException | None] = []
    ledger.after(a, outcome.append)
    ledger.after(b, outcome.append)
    ledger.complete(a, RuntimeError("illegal address"))
    assert len(outcome) == 2 and all(isinstance(e, DeviceLost) for e in outcome)
    ledger.after(b + 5, outcome.append)
    assert isinstance(outcome[-1], DeviceLost)
    ledger.lose(DeviceLost("again"))
    ledger.complete(b)
    assert len(lost) == 1


def test_a_raising_callback_does_not_strand_the_others(caplog: pytest.LogCaptureFixture) -> None:
    ledger, _ = make()
    i = ledger.next_submission()
    ran: list[str] = []

    def broken(_e: BaseException | None) -> None:
        raise ValueError("bug")

    ledger.after(i, broken)
    ledger.after(i, lambda _e: ran.append("after the broken one"))
    ledger.complete(i)
    assert ran == ["after the broken one"]
    assert "completion callback failed" in caplog.text

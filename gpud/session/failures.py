"""The failed ops of a session that its client has not acknowledged yet.

Ops without a reply (dispatch, upload, alloc...) report a failure here; every later request of
the session is answered with the earliest unacknowledged failure until the client acknowledges it
(the `ack` list of a batch), then with the next one: every failure reaches the client, in order.
Bounded: past `capacity`, later failures are counted on the last one kept ("and N more"), so
nothing is dropped silently.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from gpud_protocol import ErrorCode


class Failure(NamedTuple):
    seq: int
    code: ErrorCode
    message: str
    op: str
    more: int = 0  # later failures folded into this one (the list was full)
    last_seq: int = 0  # the seq of the last of them

    def text(self) -> str:
        if not self.more:
            return self.message
        return f"{self.message} (and {self.more} later failed ops up to op #{self.last_seq}, not kept)"


class Failures:
    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._items: deque[Failure] = deque()
        self.total = 0

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, failure: Failure) -> None:
        self.total += 1
        if len(self._items) < self.capacity:
            self._items.append(failure)
        else:
            last = self._items[-1]
            self._items[-1] = last._replace(more=last.more + 1, last_seq=failure.seq)

    def first(self) -> Failure | None:
        return self._items[0] if self._items else None

    def acknowledge(self, seqs: tuple[int, ...]) -> None:
        if seqs and self._items:
            seen = set(seqs)
            self._items = deque(f for f in self._items if f.seq not in seen)

"""Slots: one session's share of a slot graph's state (the rows of its pooled tensors, e.g. the KV
caches of many sequences in one tensor), and where its rows go in a merged launch.

A slot graph (`GraphDef.slots = P`) is row-independent, and its state tensors have P rows: row s is
slot s. A session that replays it takes the lowest free slot (its rows of every state tensor zeroed
first, so that nothing of an earlier holder can be read), keeps it while it holds the graph, and its
one row of inputs and outputs always sits at row s of the launch: it names no slot, so it cannot
name another's. Slots come back when the session frees its last handle of the graph or ends.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from gpud_protocol.errors import Busy

if TYPE_CHECKING:
    from gpud.session.tensors import Tensor


@dataclasses.dataclass(eq=False)
class Pool:
    size: int  # P: slots, the leading axis of every state tensor
    state: list[Tensor]  # the tensors whose rows are the slots
    owners: list[str | None] = dataclasses.field(default_factory=list)  # session id per slot

    def __post_init__(self) -> None:
        self.owners = [None] * self.size

    def slot_of(self, session: str) -> int | None:
        try:
            return self.owners.index(session)
        except ValueError:
            return None

    def acquire(self, session: str, graph: str) -> int:
        """The lowest free slot, now `session`'s (the caller zeroes its rows)."""
        try:
            slot = self.owners.index(None)
        except ValueError:
            raise Busy(f"graph {graph!r}: all {self.size} slots are taken; try again when a session leaves") from None
        self.owners[slot] = session
        return slot

    def release(self, session: str) -> None:
        for slot, owner in enumerate(self.owners):
            if owner == session:
                self.owners[slot] = None

    def taken(self) -> int:
        return sum(owner is not None for owner in self.owners)

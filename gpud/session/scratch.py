"""A multi-step or merged replay's scratch memory (`graph_run`): its inputs and outputs for every step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gpud.backends.base import Buffer
from gpud.runtime.runtime import DeviceRuntime, Wait
from gpud.runtime.waits import guarded

if TYPE_CHECKING:
    from gpud.session.state import SessionState as Session


class Scratch:
    """A multi-step replay's scratch buffers: charged to the sessions they serve (`charges`: each its
    share; None: all to `session`), given back (and uncharged once the work that uses them completed)
    when the replay is encoded or fails, or when its session ends while it waits; a merged launch's
    scratch (`merged`) outlives any one session, since the launch goes on for the others."""

    def __init__(
        self,
        session: Session,
        rt: DeviceRuntime,
        sizes: list[int],
        charges: Sequence[tuple[Session, int]] | None = None,
        merged: bool = False,
    ) -> None:
        self.session, self.rt, self.merged = session, rt, merged
        self.buffers: list[Buffer] = []
        self.charges: list[tuple[Session, int]] = []
        try:
            for size in sizes:
                self.buffers.append(rt.alloc(size))
        except BaseException:
            self.give_back()
            raise
        self.charges = list(charges) if charges is not None else [(session, sum(b.nbytes for b in self.buffers))]
        for owner, nbytes in self.charges:
            owner.private_bytes[rt.index] += nbytes

    def give_back(self) -> None:
        buffers, self.buffers = self.buffers, []
        if not buffers:
            return
        rt, charges = self.rt, self.charges
        for buffer in buffers:
            rt.release(buffer)

        def uncharge(_error: BaseException | None) -> None:
            for owner, nbytes in charges:
                if not owner.closed:
                    owner.private_bytes[rt.index] -= nbytes

        rt.ledger.after(max(b.last_use for b in buffers), uncharge)

    def guard(self, step: Callable[[], Wait | None]) -> Wait | None:
        gone = (lambda: False) if self.merged else (lambda: self.session.closed)
        return guarded(step, self.give_back, gone, self.give_back)

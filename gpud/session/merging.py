"""Merged replays: the rows of several replays of one row-independent graph in one launch.

A graph built with `rows=True` has the same leading axis (its rows) on every input and output, and
binds no tensors. Its replays do not run as they are read: each parks its session until the end of
the slice the daemon is reading (`run`, from the server's end-of-slice work, or at the latest on the
loop's next turn), or, while the family's last launch still runs on the device, until it completes:
replays that come meanwhile go together then, as a serving engine batches its requests. Then the
replays of each family are grouped by their scalars and the shapes of their rows. A group's rows are
concatenated in arrival order into the smallest instance that holds them (padding rows take each
input's pad, and their outputs are dropped), launched once, and each replay gets exactly its rows
back. A group larger than the largest instance goes in several launches, packed first fit with the
most rows first; a replay alone in its launch runs its own instance, as an unmerged replay would. A
slot graph (`slots`) places each session's row at its slot instead. A session never waits for more
than one launch of its graph. Multi-step replays (`ReplaySteps`) merge the same way with others of as
many steps: every step of the launch carries all their rows, the fed inputs copied for their rows only
(a padding row keeps its pad every step, so it never feeds a state row nobody replays).

Each row is computed by the instance the group ran, so a kernel that picks its method by the number
of rows (a matmul) may round a merged row differently than a replay of a smaller instance would:
within the op's tolerance, never another session's data. A session that ended before its group ran
is left out of it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import TYPE_CHECKING, Any

import gpud_protocol as proto
from gpud.runtime.runtime import DeviceRuntime, Wait
from gpud.session.graph_run import execute, execute_rows, execute_steps
from gpud.session.merged_rows import pack_rows, runs
from gpud_protocol.errors import InvalidArgument

if TYPE_CHECKING:
    from gpud.session.graphs import Family, Instance
    from gpud.session.state import SessionState as Session


@dataclasses.dataclass(eq=False)
class Pending:
    """One replay waiting for its slice to end."""

    session: Session
    op: proto.Replay | proto.Launch | proto.ReplaySteps
    instance: Instance  # the instance of its own rows (what a lone replay runs)
    values: tuple[int | float, ...]
    data: memoryview | None  # its packed inputs
    done: asyncio.Future[None]  # set once its rows are encoded (or failed): the session goes on
    slot: int = -1  # in a slot graph, the row its one row of inputs and outputs takes

    @property
    def steps(self) -> int:
        return self.op.steps if type(self.op) is proto.ReplaySteps else 1

    @property
    def key(self) -> tuple[Any, ...]:
        """Replays that may share a launch: the same scalars, row shapes and steps."""
        return (self.values, tuple(shape[1:] for shape in self.instance.key), self.steps)

    @property
    def reads(self) -> bool:
        """Whether it reads its rows back (a `Launch` does not)."""
        return type(self.op) is not proto.Launch


class Merger:
    """The replays of row-independent graphs read in this slice, by family."""

    def __init__(self) -> None:
        self._queues: dict[Family, list[Pending]] = {}
        self._scheduled = False

    def add(self, family: Family, pending: Pending) -> None:
        self._queues.setdefault(family, []).append(pending)
        if not self._scheduled:  # whoever ends the slice runs it; if nobody does, the loop's next turn
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run_late)

    def __bool__(self) -> bool:
        return bool(self._queues)

    def run(self) -> list[DeviceRuntime]:
        """Launch every group queued, but the families whose last launch is still running (their
        replays wait for it to complete, and go together then); the runtimes that got work."""
        queues, self._queues = self._queues, {}
        touched: list[DeviceRuntime] = []
        for family, pendings in queues.items():
            if self._busy(family, pendings):
                continue
            groups: dict[tuple[Any, ...], list[Pending]] = {}
            for pending in pendings:
                if pending.session.closed:
                    pending.done.set_result(None)  # nobody resumes it: its rows are simply left out
                else:
                    groups.setdefault(pending.key, []).append(pending)
            for group in groups.values():
                launches = _slot_launches(family, group) if family.pool is not None else _chunks(family, group)
                for chunk, instance in launches:
                    _launch(family, chunk, instance)
            self._launched(family, pendings)
            if family.runtime not in touched:
                touched.append(family.runtime)
        return touched

    def _launched(self, family: Family, pendings: list[Pending]) -> None:
        rt = family.runtime
        family.waking = False  # a hold's timer, if any, is moot now
        family.launched = index = rt.ledger.pending_index
        family.expected = frozenset(p.session.id for p in pendings if not p.session.closed)
        family.idle_since = float("inf")

        def completed(_error: BaseException | None) -> None:
            if family.launched == index:
                family.idle_since = time.monotonic()

        rt.ledger.after(index, completed)

    def _busy(self, family: Family, pendings: list[Pending]) -> bool:
        """Whether `pendings` wait: while the family's last launch runs (they go together once it
        completed, as a serving engine batches requests), and then for at most `merge_wait_us` while
        a session of that launch has not sent its next replay yet (so that sessions stepping in
        lockstep stay in one launch). Never when merging is off."""
        rt = family.runtime
        settings = pendings[0].session._settings
        if not settings.merge_replays or all(p.session.closed for p in pendings):
            return False
        if family.launched > rt.ledger.completed:
            self._hold(family, pendings)
            if not family.waking:
                family.waking = True

                def wake(_error: BaseException | None) -> None:
                    family.waking = False
                    self._run_late()

                rt.ledger.after(family.launched, wake)
            return True
        missing = family.expected - {p.session.id for p in pendings}
        now = time.monotonic()
        left = min(family.idle_since, now) + settings.merge_wait_us / 1e6 - now
        if not missing or left <= 0:
            return False
        self._hold(family, pendings)
        if family.waking:  # its timer is set already
            return True
        family.waking = True
        launch = family.launched

        def waited() -> None:
            if family.launched != launch:
                return  # they all came, and went in a launch since
            family.waking = False
            family.expected = frozenset()  # those that did not come are not waited for again
            self._run_late()

        asyncio.get_running_loop().call_later(left, waited)
        return True

    def _hold(self, family: Family, pendings: list[Pending]) -> None:
        self._queues.setdefault(family, [])[:0] = pendings

    def _run_late(self) -> None:
        self._scheduled = False
        for rt in self.run():
            rt.after_drain()


def _by_rows(family: Family, trailing: tuple[Any, ...]) -> list[tuple[int, int, Instance]]:
    """The family's instances of these row shapes, (rows, id, instance) by rows."""
    return sorted(
        (instance.rows, id(instance), instance)
        for instance in family.instances.values()
        if tuple(shape[1:] for shape in instance.key) == trailing
    )


def _chunks(family: Family, group: list[Pending]) -> list[tuple[list[Pending], Instance]]:
    """`group` in launches: each the smallest instance of the family (same row shapes) that holds
    its rows; a replay alone runs its own instance."""
    sizes = _by_rows(family, group[0].key[1])
    largest = sizes[-1][0] if sizes else 0
    chunks: list[list[Pending]] = []  # first fit, the most rows first: the fewest launches
    room: list[int] = []
    for pending in sorted(group, key=lambda p: -p.instance.rows):
        rows = pending.instance.rows
        place = next((i for i, left in enumerate(room) if left >= rows), None)
        if place is None:
            chunks.append([])
            room.append(largest)
            place = len(chunks) - 1
        chunks[place].append(pending)
        room[place] -= rows
    out: list[tuple[list[Pending], Instance]] = []
    for chunk in chunks:
        total = sum(p.instance.rows for p in chunk)
        fits = next((instance for size, _, instance in sizes if size >= total), None)
        if len(chunk) == 1 or fits is None:
            out += [([pending], pending.instance) for pending in chunk]
        else:
            out.append((chunk, fits))
    return out


def _slot_launches(family: Family, group: list[Pending]) -> list[tuple[list[Pending], Instance]]:
    """A slot graph's group in one launch of the smallest instance that holds its highest slot (each
    replay in a launch of its own when merging is off)."""
    sizes = _by_rows(family, group[0].key[1])
    merge = group[0].session._settings.merge_replays
    launches: list[tuple[list[Pending], Instance]] = []
    for chunk in [group] if merge else [[pending] for pending in group]:
        top = max(pending.slot for pending in chunk) + 1
        fits = next((instance for size, _, instance in sizes if size >= top), None)
        if fits is None:
            _fail(chunk, InvalidArgument(f"graph {family.name!r} has no instance of {top} rows or more: build one"))
            continue
        launches.append((chunk, fits))
    return launches


def _starts(family: Family, chunk: list[Pending]) -> list[int]:
    """The first row of each replay in the launch: its slot, or after the rows before it."""
    if family.pool is not None:
        return [pending.slot for pending in chunk]
    starts, at = [], 0
    for pending in chunk:
        starts.append(at)
        at += pending.instance.rows
    return starts


def _launch(family: Family, chunk: list[Pending], instance: Instance) -> None:
    """Encode one launch of `chunk`'s rows; resume their sessions once encoded, or fail them."""
    rt = family.runtime
    starts = _starts(family, chunk)
    alone = len(chunk) == 1 and starts[0] == 0 and instance is chunk[0].instance
    rt.counters["row_launches" if len(chunk) == 1 else "merged_launches"] += 1
    rt.counters["merged_rows"] += sum(p.instance.rows for p in chunk) if len(chunk) > 1 else 0
    try:
        if alone:
            pending, op = chunk[0], chunk[0].op
            if isinstance(op, proto.ReplaySteps):
                plan = family.plan(instance, ())
                wait = execute_steps(pending.session, op, family, instance, pending.values, pending.data, plan, None)
            else:
                wait = execute(pending.session, op, family, instance, pending.values, pending.data)
        else:
            wait = _merged(family, chunk, instance, starts)
    except Exception as exc:
        _fail(chunk, exc)
        return
    if wait is None:
        _done(chunk)
        return
    spawn = chunk[0].session._daemon.spawn

    async def drive(wait: Wait | None) -> None:
        try:
            while wait is not None:
                chunk[0].session._daemon.after_work()
                await wait.ready
                wait = wait.resume()
        except Exception as exc:
            _fail(chunk, exc)
            return
        _done(chunk)
        chunk[0].session._daemon.after_work()

    spawn(drive(wait))


def _merged(family: Family, chunk: list[Pending], instance: Instance, starts: list[int]) -> Wait | None:
    """The rows of `chunk`, placed from `starts` into `instance`'s inputs (the other rows padded), step
    by step for a multi-step replay; the outputs scattered back."""
    steps = chunk[0].steps
    places = [(p.instance, p.data, at) for p, at in zip(chunk, starts, strict=True)]
    merged = pack_rows(instance, places, steps)
    readers = [(p, start) for p, start in zip(chunk, starts, strict=True) if p.reads]
    rows = runs([(at, at + p.instance.rows) for p, at in zip(chunk, starts, strict=True)])
    return execute_rows(family, instance, chunk[0].values, memoryview(merged), readers, chunk[0].session, steps, rows)


def _done(chunk: list[Pending]) -> None:
    for pending in chunk:
        if not pending.done.done():
            pending.done.set_result(None)


def _fail(chunk: list[Pending], exc: BaseException) -> None:
    for pending in chunk:
        if pending.done.done():
            continue
        session = pending.session
        if pending.reads:  # its reservation, made when it was read
            session.requests_in_flight -= 1
            session.reply_bytes_reserved -= pending.steps * pending.instance.output_bytes
        if session.closed:
            pending.done.set_result(None)
        else:
            pending.done.set_exception(exc)

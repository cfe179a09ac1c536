"""Merged replays: the rows of several replays of one row-independent graph in one launch.

A graph built with `rows=True` has the same leading axis (its rows) on every input and output, and
binds no tensors. Its replays do not run as they are read: each parks its session until the end of
the slice the daemon is reading (`run`, from the server's end-of-slice work, or at the latest on the
loop's next turn), when the replays of each family are grouped by their scalars and the shapes of
their rows. A group's rows are concatenated in arrival order into the smallest instance that holds
them (padding rows are zeros, and their outputs are dropped), launched once, and each replay gets
exactly its rows back. A group larger than the largest instance goes in several launches, packed
first fit with the most rows first; a replay alone in its launch runs its own instance, as an
unmerged replay would. A session never waits for
more than the slice its replay came in.

Each row is computed by the instance the group ran, so a kernel that picks its method by the number
of rows (a matmul) may round a merged row differently than a replay of a smaller instance would:
within the op's tolerance, never another session's data. A session that ended before its group ran
is left out of it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

import gpud_protocol as proto
from gpud.runtime.runtime import DeviceRuntime, Wait
from gpud.session.graph_run import execute, execute_rows

if TYPE_CHECKING:
    from gpud.session.graphs import Family, Instance
    from gpud.session.session import Session


@dataclasses.dataclass(eq=False)
class Pending:
    """One replay waiting for its slice to end."""

    session: Session
    op: proto.Replay | proto.Launch
    instance: Instance  # the instance of its own rows (what a lone replay runs)
    values: tuple[int | float, ...]
    data: memoryview | None  # its packed inputs
    done: asyncio.Future[None]  # set once its rows are encoded (or failed): the session goes on

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.values, tuple(shape[1:] for shape in self.instance.key))


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
        """Launch every group queued; the runtimes that got work."""
        queues, self._queues = self._queues, {}
        touched: list[DeviceRuntime] = []
        for family, pendings in queues.items():
            groups: dict[tuple[Any, ...], list[Pending]] = {}
            for pending in pendings:
                if pending.session.closed:
                    pending.done.set_result(None)  # nobody resumes it: its rows are simply left out
                else:
                    groups.setdefault(pending.key, []).append(pending)
            for group in groups.values():
                for chunk, instance in _chunks(family, group):
                    _launch(family, chunk, instance)
            if family.runtime not in touched:
                touched.append(family.runtime)
        return touched

    def _run_late(self) -> None:
        self._scheduled = False
        for rt in self.run():
            rt.after_drain()


def _chunks(family: Family, group: list[Pending]) -> list[tuple[list[Pending], Instance]]:
    """`group` in launches: each the smallest instance of the family (same row shapes) that holds
    its rows; a replay alone runs its own instance."""
    trailing = group[0].key[1]
    sizes = sorted(
        (instance.rows, id(instance), instance)
        for instance in family.instances.values()
        if tuple(shape[1:] for shape in instance.key) == trailing
    )
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


def _launch(family: Family, chunk: list[Pending], instance: Instance) -> None:
    """Encode one launch of `chunk`'s rows; resume their sessions once encoded, or fail them."""
    rt = family.runtime
    rt.counters["merged_launches" if len(chunk) > 1 else "row_launches"] += 1
    rt.counters["merged_rows"] += sum(p.instance.rows for p in chunk) if len(chunk) > 1 else 0
    try:
        if len(chunk) == 1:
            pending = chunk[0]
            wait = execute(pending.session, pending.op, family, instance, pending.values, pending.data)
        else:
            wait = _merged(family, chunk, instance)
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


def _merged(family: Family, chunk: list[Pending], instance: Instance) -> Wait | None:
    """The rows of `chunk`, concatenated into `instance`'s inputs; the outputs scattered back."""
    rows = instance.rows
    merged = bytearray(instance.input_bytes)
    starts: list[int] = []
    at = 0
    for pending in chunk:
        starts.append(at)
        data = pending.data
        if data is not None:
            for whole, own in zip(instance.inputs, pending.instance.inputs, strict=True):
                row = whole.nbytes // rows
                merged[whole.offset + at * row : whole.offset + at * row + own.nbytes] = data[
                    own.offset : own.offset + own.nbytes
                ]
        at += pending.instance.rows
    readers = [(p, start) for p, start in zip(chunk, starts, strict=True) if type(p.op) is proto.Replay]
    return execute_rows(family, instance, chunk[0].values, memoryview(merged), readers, chunk[0].session)


def _done(chunk: list[Pending]) -> None:
    for pending in chunk:
        if not pending.done.done():
            pending.done.set_result(None)


def _fail(chunk: list[Pending], exc: BaseException) -> None:
    for pending in chunk:
        if pending.done.done():
            continue
        session = pending.session
        if type(pending.op) is proto.Replay:  # its reservation, made when it was read
            session.requests_in_flight -= 1
            session.reply_bytes_reserved -= pending.instance.output_bytes
        if session.closed:
            pending.done.set_result(None)
        else:
            pending.done.set_exception(exc)

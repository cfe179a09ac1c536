"""Encoding a replay once it is checked and admitted: the upload of its inputs, the launch, and the
readback of its outputs; for a merged launch (`merging`), the rows of several replays at once, each
replay's rows scattered back to it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import gpud_protocol as proto
from gpud.backends.base import Buffer
from gpud.runtime.runtime import DeviceRuntime, Wait

if TYPE_CHECKING:
    from gpud.session.graphs import Family, Instance
    from gpud.session.session import Session


class Reader(Protocol):
    """A merged replay that reads its rows back (`merging.Pending`)."""

    session: Session
    op: proto.Replay | proto.Launch
    instance: Instance


def execute(
    session: Session,
    op: proto.Replay | proto.Launch,
    family: Family,
    instance: Instance,
    values: tuple[int | float, ...],
    data: memoryview | None,
    binds: tuple[Buffer, ...] = (),
) -> Wait | None:
    """Encode one replay, checked and admitted: the upload of its inputs, the launch and its readback."""
    rt, slots = family.runtime, family.slots
    plan = family.plan(instance, binds)

    def run() -> Wait | None:
        rt.replay(plan, values, session)
        family.last_use = rt.ledger.pending_index
        if type(op) is not proto.Replay:
            return None
        reply = session._readback_reply(op.seq, instance.output_bytes, rt, {"outputs": layout(instance)})
        if instance.output_bytes == 0:
            reply.deliver(0, b"", None)
            rt.want_flush()
            return None
        return rt.download(rt.view(slots["out"], 0, instance.output_bytes), reply.deliver, session)

    if data is None:
        return run()
    return _then(rt.upload(rt.view(slots["in"], 0, instance.input_bytes), data, session), run)


def execute_rows(
    family: Family,
    instance: Instance,
    values: tuple[int | float, ...],
    merged: memoryview,
    readers: Sequence[tuple[Reader, int]],
    owner: Session,
) -> Wait | None:
    """Encode one launch of `instance` over several replays' rows (`merged` inputs); `readers`: the
    replays that read their rows back, each with its first row."""
    rt, slots = family.runtime, family.slots
    plan = family.plan(instance, ())

    def run() -> Wait | None:
        rt.replay(plan, values, owner)
        family.last_use = rt.ledger.pending_index
        if not readers:
            return None
        scatter = Scatter(instance, readers, rt)
        if instance.output_bytes == 0:
            scatter.deliver(0, b"", None)
            rt.want_flush()
            return None
        return rt.download(rt.view(slots["out"], 0, instance.output_bytes), scatter.deliver, owner)

    return _then(rt.upload(rt.view(slots["in"], 0, instance.input_bytes), merged, owner), run)


def layout(instance: Instance) -> list[list[Any]]:
    """The outputs' places in a replay's reply data."""
    return [[p.name, p.dtype, list(p.shape), p.offset] for p in instance.outputs]


class Scatter:
    """The readback of a merged launch: collected part by part, then each replay's rows sent to it as
    the reply of its own `Replay` (its outputs laid out as a lone replay of its rows lays them out)."""

    def __init__(self, instance: Instance, readers: Sequence[tuple[Reader, int]], rt: DeviceRuntime) -> None:
        self._instance = instance
        self._rt = rt
        self._data = bytearray(instance.output_bytes)
        self._left = rt.parts(instance.output_bytes) if instance.output_bytes else 1
        self._replies = [
            (
                reader,
                start,
                reader.session._readback_reply(
                    reader.op.seq, reader.instance.output_bytes, rt, {"outputs": layout(reader.instance)}
                ),
            )
            for reader, start in readers
        ]

    def deliver(self, part: int, data: bytes | memoryview | None, error: BaseException | None) -> None:
        if error is not None or data is None:
            for reader, _start, reply in self._replies:
                for k in range(max(1, self._rt.parts(reader.instance.output_bytes))):
                    reply.deliver(k, None, error)
            self._replies = []
            return
        at = part * self._rt.part_bytes
        self._data[at : at + len(data)] = data
        self._left -= 1
        if self._left:
            return
        whole, rows, part_bytes = self._instance, self._instance.rows, self._rt.part_bytes
        for reader, start, reply in self._replies:
            own = reader.instance
            out = bytearray(own.output_bytes)
            for merged_part, own_part in zip(whole.outputs, own.outputs, strict=True):
                at = merged_part.offset + start * (merged_part.nbytes // rows)
                out[own_part.offset : own_part.offset + own_part.nbytes] = self._data[at : at + own_part.nbytes]
            view = memoryview(out)
            for k in range(max(1, self._rt.parts(own.output_bytes))):
                reply.deliver(k, view[k * part_bytes : (k + 1) * part_bytes], None)


def _then(wait: Wait | None, next_step: Callable[[], Wait | None]) -> Wait | None:
    if wait is None:
        return next_step()
    return Wait(wait.ready, lambda: _then(wait.resume(), next_step))

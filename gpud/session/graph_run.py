"""Encoding a replay once it is checked and admitted: the upload of its inputs, the launch, and the
readback of its outputs; for a merged launch (`merging`), the rows of several replays at once, each
replay's rows scattered back to it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import gpud_protocol as proto
from gpud.backends.base import Buffer
from gpud.runtime.graph import Replayable
from gpud.runtime.runtime import DeviceRuntime, Wait
from gpud.runtime.waits import then
from gpud.session import carries
from gpud.session.graphs import ALIGN
from gpud.session.scratch import Scratch
from gpud_protocol.errors import NotFound

if TYPE_CHECKING:
    from gpud.session.graphs import Family, Instance
    from gpud.session.state import SessionState as Session


class Reader(Protocol):
    """A merged replay that reads its rows back (`merging.Pending`)."""

    session: Session
    op: proto.Replay | proto.Launch | proto.ReplaySteps
    instance: Instance


def execute(
    session: Session,
    op: proto.Replay | proto.Launch,
    family: Family,
    instance: Instance,
    values: tuple[int | float, ...],
    data: memoryview | None,
    plan: Replayable | None = None,
) -> Wait | None:
    """Encode one replay, checked and admitted: the upload of its inputs, the launch and its readback
    (`plan`: its plan with its bound tensors; None: the plan without any)."""
    rt = family.runtime
    if plan is None:
        plan = family.plan(instance, ())
    inputs, outputs = views(family, instance)

    def run() -> Wait | None:
        rt.replay(plan, values, session)
        family.last_use = rt.ledger.pending_index
        if type(op) is not proto.Replay:
            return None
        reply = session._readback_reply(op.seq, instance.output_bytes, rt, instance.reply_fields)
        if instance.output_bytes == 0:
            reply.deliver(0, b"", None)
            rt.want_flush()
            return None
        return rt.download(outputs, reply.deliver, session)

    if data is None:
        return run()
    return then(rt.upload(inputs, data, session), run)


def views(family: Family, instance: Instance) -> tuple[Buffer, Buffer]:
    """Views of `instance`'s packed inputs and outputs in the family's slots, made once per generation."""
    made = instance.io
    if made is None or made[0] != family.generation:
        rt, slots = family.runtime, family.slots
        inputs, outputs = rt.view(slots["in"], 0, instance.input_bytes), rt.view(slots["out"], 0, instance.output_bytes)
        made = instance.io = (family.generation, inputs, outputs)
    return made[1], made[2]


def execute_rows(
    family: Family,
    instance: Instance,
    values: tuple[int | float, ...],
    merged: memoryview,
    readers: Sequence[tuple[Reader, int]],
    owner: Session,
    steps: int = 1,
    rows: Sequence[tuple[int, int]] = (),
) -> Wait | None:
    """Encode one launch of `instance` over several replays' rows (`merged` inputs, `steps` steps'
    worth: a multi-step launch as `execute_steps` encodes one, its scratch charged to its replays, the fed
    inputs copied for the replays' `rows` only (runs [first, end)): a padding row keeps its pad every
    step, so it never feeds a state row of a slot nobody replays); `readers`: the replays that read
    their rows back, each with its first row."""
    rt, slots = family.runtime, family.slots
    plan = family.plan(instance, ())
    size_out = instance.output_bytes

    def read(outputs: Buffer) -> Wait | None:
        if not readers:
            return None
        scatter = Scatter(instance, readers, rt, steps)
        if size_out == 0:
            scatter.deliver(0, b"", None)
            rt.want_flush()
            return None
        return rt.download(rt.view(outputs, 0, steps * size_out), scatter.deliver, owner)

    if steps == 1:

        def run() -> Wait | None:
            rt.replay(plan, values, owner)
            family.last_use = rt.ledger.pending_index
            return read(slots["out"])

        return then(rt.upload(rt.view(slots["in"], 0, instance.input_bytes), merged, owner), run)
    # each session charged the share its own replay was checked for; the padding rows' by nobody
    shares = [(r.session, steps * (r.instance.input_bytes + r.instance.output_bytes)) for r, _ in readers]
    sizes = [max(ALIGN, steps * instance.input_bytes), max(ALIGN, steps * size_out)]
    scratch = Scratch(owner, rt, sizes, shares, merged=True)
    inputs, outputs = scratch.buffers

    def run_steps() -> Wait | None:
        _encode_steps(family, instance, plan, values, steps, inputs, outputs, owner, rows)
        return read(outputs)

    uploaded = rt.upload(rt.view(inputs, 0, steps * instance.input_bytes), merged, owner)
    return scratch.guard(lambda: then(uploaded, run_steps))


def execute_steps(
    session: Session,
    op: proto.ReplaySteps,
    family: Family,
    instance: Instance,
    values: tuple[int | float, ...],
    data: memoryview | None,
    plan: Replayable,
    carry: Buffer | None,
) -> Wait | None:
    """Encode `op.steps` replays of `plan` back to back (`_encode_steps`), every step's inputs uploaded
    at once into scratch memory, every step's outputs read back at once. The scratch is charged to the
    session until the steps completed, and given back on every way out (an error, or the session ending
    while the replay waits for staging)."""
    rt, steps = family.runtime, op.steps
    size_in, size_out = instance.input_bytes, instance.output_bytes
    scratch = Scratch(session, rt, [max(ALIGN, steps * size_in), max(ALIGN, steps * size_out)])
    inputs, outputs = scratch.buffers

    def run() -> Wait | None:
        if carry is not None and not family.carries.holds(carry):  # the graph was freed while this waited
            raise NotFound(f"graph {family.name!r} was freed before its replay ran")
        _encode_steps(family, instance, plan, values, steps, inputs, outputs, session, carry=carry, chain=op.chain)
        reply = session._readback_reply(op.seq, steps * size_out, rt, {"outputs": layout(instance), "steps": steps})
        if not size_out:
            reply.deliver(0, b"", None)
            rt.want_flush()
            return None
        return rt.download(rt.view(outputs, 0, steps * size_out), reply.deliver, session)

    if data is None:
        return scratch.guard(run)
    return scratch.guard(lambda: then(rt.upload(rt.view(inputs, 0, steps * size_in), data, session), run))


def _encode_steps(
    family: Family,
    instance: Instance,
    plan: Replayable,
    values: tuple[int | float, ...],
    steps: int,
    inputs: Buffer,
    outputs: Buffer,
    owner: Session,
    rows: Sequence[tuple[int, int]] = (),
    carry: Buffer | None = None,
    chain: bool = False,
) -> None:
    """`steps` replays of `plan`: each step's inputs copied in from `inputs` before it runs, the fed
    inputs (`instance.feeds`) then copied from the step before's outputs on the device (for the row
    runs `rows` only, when given; the first step's from `carry` with `chain`); each step's outputs
    copied into `outputs`, and the last step's fed outputs into `carry`."""
    rt, slots = family.runtime, family.slots
    size_in, size_out = instance.input_bytes, instance.output_bytes
    for k in range(steps):
        if size_in:
            rt.copy(rt.view(inputs, k * size_in, size_in), rt.view(slots["in"], 0, size_in), owner)
        if chain and not k and carry is not None:
            carries.load(rt, carry, instance, slots["in"], owner)
        for out_index, in_index in instance.feeds if k else ():
            src, dst = instance.outputs[out_index], instance.inputs[in_index]
            row = src.nbytes // instance.rows if rows else src.nbytes  # no runs: the whole part
            for first, end in rows or [(0, 1)]:
                rt.copy(
                    rt.view(outputs, (k - 1) * size_out + src.offset + first * row, (end - first) * row),
                    rt.view(slots["in"], dst.offset + first * row, (end - first) * row),
                    owner,
                )
        rt.replay(plan, values, owner)
        if size_out:
            rt.copy(rt.view(slots["out"], 0, size_out), rt.view(outputs, k * size_out, size_out), owner)
    if carry is not None:
        carries.save(rt, slots["out"], instance, carry, owner)
    family.last_use = rt.ledger.pending_index


def layout(instance: Instance) -> list[list[Any]]:
    """The outputs' places in a replay's reply data."""
    return [[p.name, p.dtype, list(p.shape), p.offset] for p in instance.outputs]


class Scatter:
    """The readback of a merged launch: collected part by part, then each replay's rows sent to it as
    the reply of its own `Replay` or `ReplaySteps` (its outputs laid out as a lone replay of its rows
    lays them out, step after step)."""

    def __init__(
        self, instance: Instance, readers: Sequence[tuple[Reader, int]], rt: DeviceRuntime, steps: int = 1
    ) -> None:
        self._instance = instance
        self._rt = rt
        self._steps = steps
        self._data = bytearray(steps * instance.output_bytes)
        self._left = rt.parts(steps * instance.output_bytes) if instance.output_bytes else 1
        self._replies = [
            (reader, start, reader.session._readback_reply(reader.op.seq, steps * reader.instance.output_bytes, rt, f))
            for reader, start in readers
            for f in [_fields(reader, steps)]
        ]

    def deliver(self, part: int, data: bytes | memoryview | None, error: BaseException | None) -> None:
        steps = self._steps
        if error is not None or data is None:
            for reader, _start, reply in self._replies:
                for k in range(max(1, self._rt.parts(steps * reader.instance.output_bytes))):
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
            out = bytearray(steps * own.output_bytes)
            for k in range(steps):
                for merged_part, own_part in zip(whole.outputs, own.outputs, strict=True):
                    at = k * whole.output_bytes + merged_part.offset + start * (merged_part.nbytes // rows)
                    to = k * own.output_bytes + own_part.offset
                    out[to : to + own_part.nbytes] = self._data[at : at + own_part.nbytes]
            view = memoryview(out)
            for k in range(max(1, self._rt.parts(steps * own.output_bytes))):
                reply.deliver(k, view[k * part_bytes : (k + 1) * part_bytes], None)


def _fields(reader: Reader, steps: int) -> dict[str, Any]:
    """A merged replay's reply fields: its outputs' layout, and its steps for a multi-step replay."""
    fields: dict[str, Any] = {"outputs": layout(reader.instance)}
    if type(reader.op) is proto.ReplaySteps:
        fields["steps"] = steps
    return fields

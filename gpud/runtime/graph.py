"""A recorded step as the runtime holds it: instantiated once on a device, replayed with fresh scalars.

A recording is a list of `GraphStep`s over resolved buffers (the Device contract defines them in
`gpud.backends.base`): dispatches, whose scalar arguments may be `Var`s set per replay, and copies.
`Device.instantiate` turns it into the backend's replayable form once (packed dispatches on every
backend; the CUDA backend's graph runner turns the run of launches into a CUDA graph and, on later
replays, updates only the kernel nodes whose parameters changed); `Device.encode_replay` puts one
replay into the pending command buffer.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

from gpud.backends.base import Buffer, CopyStep, GraphStep


class Piece(NamedTuple):
    """A run of a recording's steps, instantiated: the flush policy may submit between pieces."""

    native: Any  # the backend's form
    # The allocations of the buffers the piece uses (a view's base), once each: marked with the
    # submission that runs it (a release waits for an allocation's last use; a view is never
    # released), but those whose owner tracks their last use (`Encoding.instantiate`).
    buffers: tuple[Buffer, ...]
    dispatches: int


class Replayable(NamedTuple):
    """A recording instantiated on one device: what `DeviceRuntime.replay` encodes, piece by piece
    (one piece on a GPU; on a software device one per dispatch, so that long replays are
    submitted in parts the health check sees complete)."""

    pieces: tuple[Piece, ...]


def split(steps: Sequence[GraphStep], dispatches_per_piece: int) -> list[list[GraphStep]]:
    """`steps` in runs of at most `dispatches_per_piece` dispatches (0: one run); copies go with the
    dispatch before them."""
    if dispatches_per_piece <= 0:
        return [list(steps)] if steps else []
    pieces: list[list[GraphStep]] = []
    count = dispatches_per_piece
    for step in steps:
        is_dispatch = not isinstance(step, CopyStep)
        if not pieces or (is_dispatch and count >= dispatches_per_piece):
            pieces.append([])
            count = 0
        pieces[-1].append(step)
        count += is_dispatch
    return pieces


def buffers_of(steps: Sequence[GraphStep]) -> tuple[Buffer, ...]:
    seen: dict[int, Buffer] = {}
    for step in steps:
        if isinstance(step, CopyStep):
            seen.setdefault(step.src.id, step.src)
            seen.setdefault(step.dst.id, step.dst)
        else:
            for arg in step.args:
                if type(arg) is Buffer:
                    seen.setdefault(arg.id, arg)
    return tuple(seen.values())


def allocations_of(buffers: Sequence[Buffer], leave: Collection[int] = ()) -> tuple[Buffer, ...]:
    """The allocations `buffers` are or are views of, each once, but those whose id() is in `leave`."""
    seen: dict[int, Buffer] = {}
    for buffer in buffers:
        allocation = buffer.base or buffer
        if id(allocation) not in leave:
            seen.setdefault(id(allocation), allocation)
    return tuple(seen.values())

"""A recorded step as the runtime holds it: instantiated once on a device, replayed with fresh scalars.

A recording is a list of `GraphStep`s over resolved buffers (the Device contract defines them in
`gpud.backends.base`): dispatches, whose scalar arguments may be `Var`s set per replay, and copies.
`Device.instantiate` turns it into the backend's replayable form once (packed dispatches on every
backend; the CUDA backend's graph runner turns the run of launches into a CUDA graph and, on later
replays, updates only the kernel nodes whose parameters changed); `Device.encode_replay` puts one
replay into the pending command buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from gpud.backends.base import Buffer, CopyStep, GraphStep


class Replayable(NamedTuple):
    """A recording instantiated on one device: what `DeviceRuntime.replay` encodes."""

    native: Any  # the backend's form
    buffers: tuple[Buffer, ...]  # every buffer a replay uses (marked with the submission that runs it)
    dispatches: int


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

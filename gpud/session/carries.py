"""What a session's chained multi-step replays start from (`ReplaySteps.chain`): per graph family, each
session's fed outputs of its last multi-step replay of an instance, kept on the device. A client that
sends its next window of steps before the last one has answered starts it from these, so the token
never leaves the GPU between windows and no round trip separates them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from gpud.backends.base import Buffer
from gpud.runtime.state import Owner
from gpud_protocol.errors import InvalidArgument, OutOfMemory

if TYPE_CHECKING:
    from gpud.runtime.runtime import DeviceRuntime


class Part(Protocol):  # what a carry reads of an instance's inputs and outputs (`graphs.Part`)
    @property
    def offset(self) -> int: ...
    @property
    def nbytes(self) -> int: ...


class Instance(Protocol):  # ... and of the instance (`graphs.Instance`)
    @property
    def key(self) -> tuple[tuple[int, ...], ...]: ...
    @property
    def inputs(self) -> Sequence[Part]: ...
    @property
    def outputs(self) -> Sequence[Part]: ...
    @property
    def feeds(self) -> Sequence[tuple[int, int]]: ...


class Session(Owner, Protocol):  # ... and of the session it is charged to (`state.SessionState`)
    @property
    def id(self) -> str: ...
    @property
    def private_bytes(self) -> list[int]: ...
    @property
    def closed(self) -> bool: ...
    @property
    def _settings(self) -> Any: ...


PLACE = 256  # each carried output starts on a multiple of this (any copy takes such an offset)
Key = tuple[str, tuple[tuple[int, ...], ...]]  # (session id, the instance's input shapes)


class Carries:
    """One family's carries, each charged to its session until the session leaves the family."""

    def __init__(self) -> None:
        self._kept: dict[Key, tuple[Instance, Buffer]] = {}

    def take(self, session: Session, rt: DeviceRuntime, instance: Instance, chain: bool, name: str) -> Buffer | None:
        """The carry a multi-step replay of `instance` by `session` writes after its last step (and
        with `chain` reads before its first): made on the session's first such replay of a graph
        with feeds. None: the graph feeds nothing."""
        if not instance.feeds:
            if chain:
                raise InvalidArgument(f"graph {name!r} feeds no input (Graph.feed): there is nothing to chain")
            return None
        key = (session.id, instance.key)
        kept = self._kept.get(key)
        if kept is not None and kept[0] is instance:
            return kept[1]
        if chain:
            shapes = [list(s) for s in instance.key]
            raise InvalidArgument(
                f"graph {name!r}: chain=True continues this session's last replay_steps of the instance for "
                f"input shapes {shapes}, and there is none (or the instance was rebuilt since)"
            )
        nbytes = carry_bytes(instance)
        quota, used = session._settings.session_memory_bytes, session.private_bytes[rt.index]
        if used + nbytes > quota:
            raise OutOfMemory(
                f"graph {name!r}: its fed outputs need {nbytes} bytes, the session quota has {quota - used}"
            )
        buffer = rt.alloc(nbytes)
        session.private_bytes[rt.index] += nbytes
        if kept is not None:  # of an instance rebuilt since
            _give_back(session, rt, kept[1])
        self._kept[key] = (instance, buffer)
        return buffer

    def holds(self, buffer: Buffer) -> bool:
        return any(kept is buffer for _instance, kept in self._kept.values())

    def leave(self, session: Session, rt: DeviceRuntime) -> None:
        """`session` holds the family no more: its carries go once the work that uses them completed."""
        for key in [key for key in self._kept if key[0] == session.id]:
            _give_back(session, rt, self._kept.pop(key)[1])

    def release_all(self) -> list[Buffer]:
        buffers = [buffer for _instance, buffer in self._kept.values()]
        self._kept.clear()
        return buffers


def _give_back(session: Session, rt: DeviceRuntime, buffer: Buffer) -> None:
    rt.release(buffer)

    def uncharge(_error: BaseException | None) -> None:
        if not session.closed:
            session.private_bytes[rt.index] -= buffer.nbytes

    rt.ledger.after(buffer.last_use, uncharge)


def carry_bytes(instance: Instance) -> int:
    return max(PLACE, sum(-(-instance.outputs[out].nbytes // PLACE) * PLACE for out, _in in instance.feeds))


def _places(instance: Instance) -> list[tuple[int, int, int, int]]:
    """(output offset, input offset, bytes, offset in the carry) of each fed output."""
    places, at = [], 0
    for out, into in instance.feeds:
        part = instance.outputs[out]
        places.append((part.offset, instance.inputs[into].offset, part.nbytes, at))
        at += -(-part.nbytes // PLACE) * PLACE
    return places


def load(rt: DeviceRuntime, carry: Buffer, instance: Instance, inputs: Buffer, owner: Session) -> None:
    """The carried outputs into their fed inputs (the graph's packed inputs `inputs`), on the device."""
    for _out, into, nbytes, at in _places(instance):
        rt.copy(rt.view(carry, at, nbytes), rt.view(inputs, into, nbytes), owner)


def save(rt: DeviceRuntime, outputs: Buffer, instance: Instance, carry: Buffer, owner: Session) -> None:
    """The fed outputs of the step just encoded (the graph's packed outputs `outputs`) into the carry."""
    for out, _into, nbytes, at in _places(instance):
        rt.copy(rt.view(outputs, out, nbytes), rt.view(carry, at, nbytes), owner)

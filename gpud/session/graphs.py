"""Replay graphs: a recorded step built once per input shape, replayed with fresh inputs in one message.

A `Family` is what a name groups: the instances of one recorded step, one per tuple of input
shapes (a decoder builds one per batch size). Instances share the family's memory: one buffer for
the packed inputs, one per intermediate (by its index) and one for the packed outputs, each as
large as the largest instance needs; an instance binds views of them of its own sizes. Replays on
one device never overlap (one stream), so sharing is safe; intermediates are not cleared between
replays. (Separate buffers, not one arena: WebGPU refuses one buffer bound read-only and
read-write in one dispatch, whatever the ranges.) A family holds a reference to every session tensor
its steps use (no replay touches freed memory) and is private to the session that built it until
published; published, any session can open and replay it with its own inputs, scalars and bound tensors.

Per replay: one upload of the packed inputs into the arena, the instantiated steps (one per family
generation and bound-tensor set, cached), copies of the outputs into one packed region, and, for
`replay`, one readback of it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import gpud_protocol as proto
from gpud.backends.base import Buffer, CopyStep, DispatchStep, GraphStep, Var, memory_key
from gpud.runtime.cache import LruCache
from gpud.runtime.graph import Replayable
from gpud.runtime.runtime import DeviceRuntime
from gpud.session.binding import Binding
from gpud.session.carries import Carries
from gpud.session.graph_checks import check_copy, check_dispatch
from gpud.session.slots import Pool
from gpud.session.tensors import Tensor
from gpud_protocol import ArgKind
from gpud_protocol.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied

ALIGN = 256  # every part of the arena; also the packing of a replay's inputs (the client packs the same way)


def align(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def nbytes_of(dtype: str, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * proto.DTYPE_SIZES[dtype]


class Part(NamedTuple):
    """An input in the packed inputs, an intermediate, or an output in the packed outputs."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def pack_inputs(inputs: list[Any]) -> tuple[list[Part], int]:
    """The packed layout of (name, dtype, shape)s in order: each at a 256-byte aligned offset."""
    parts, offset = [], 0
    for name, dtype, shape in inputs:
        size = nbytes_of(dtype, shape)
        parts.append(Part(name, dtype, tuple(shape), offset, size))
        offset = align(offset + size)
    return parts, offset


@dataclasses.dataclass(eq=False)
class Instance:
    key: tuple[tuple[int, ...], ...]  # the shapes of the inputs
    inputs: list[Part]  # offsets in the packed inputs
    input_bytes: int
    temps: list[Part]
    outputs: list[Part]  # offsets in the packed outputs
    output_bytes: int
    binds: tuple[proto.GraphTensor, ...]
    bind_writes: frozenset[int]  # bound tensors the steps may write
    scalars: tuple[proto.GraphScalar, ...]
    # templates, each ending with its step number: ("dispatch", program, grid, args, step) |
    # ("copy", src, dst, nbytes, step), src a reference or a recorded upload's buffer
    steps: list[tuple[Any, ...]]
    output_refs: list[proto.Arg]
    fixed: list[Tensor]  # the session tensors its steps use; a TENSOR reference is a position here
    constants: list[Buffer]  # recorded uploads, copied in at their place every replay
    # One plan per set of bound tensors (in a decode, per client): instantiated once, replayed after.
    plans: LruCache[tuple[Any, ...], Replayable] = dataclasses.field(default_factory=lambda: LruCache(32))
    # Bound tensors checked once per (session, bind handles), with their plan's key (`graph_binds`).
    bindings: LruCache[tuple[Any, ...], Binding] = dataclasses.field(default_factory=lambda: LruCache(32))
    io: tuple[int, Buffer, Buffer] | None = None  # views of the packed inputs and outputs (`graph_run`), by generation
    rows: int = 0  # a row-independent graph's: the leading axis of every input and output
    feeds: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (output, input) positions
    pads: list[bytes] = dataclasses.field(default_factory=list)  # a row graph's padding row of each input

    @functools.cached_property
    def reply_fields(self) -> dict[str, Any]:
        """A replay's reply fields beside its data: the outputs' places in it (read, never changed)."""
        return {"outputs": [[p.name, p.dtype, list(p.shape), p.offset] for p in self.outputs]}

    def name(self, ref: proto.Arg) -> str:
        """A (non-view) reference, for an error message."""
        kind, value = ref
        if kind == ArgKind.TENSOR:
            return f"session tensor {self.fixed[int(value)].describe()}"
        if kind == ArgKind.INPUT:
            return f"input {self.inputs[int(value)].name!r}"
        if kind == ArgKind.BIND:
            return f"bound tensor {self.binds[int(value)].name!r}"
        return f"intermediate {value}"


class Signature(NamedTuple):
    inputs: tuple[tuple[str, str], ...]
    scalars: tuple[tuple[str, int], ...]
    binds: tuple[tuple[str, str], ...]
    outputs: tuple[str, ...]
    feeds: tuple[tuple[str, str], ...] = ()

    def describe(self) -> dict[str, Any]:
        return {
            "inputs": [list(i) for i in self.inputs],
            "scalars": [list(s) for s in self.scalars],
            "binds": [list(b) for b in self.binds],
            "outputs": list(self.outputs),
            "feeds": [list(f) for f in self.feeds],
        }


@dataclasses.dataclass(eq=False)
class Family:
    name: str
    owner: str  # the session that builds its instances
    runtime: DeviceRuntime
    signature: Signature
    builder: Any  # the building Session while it is open (its quota counts what the family holds)
    held: list[Tensor] = dataclasses.field(default_factory=list)  # one reference each, until the family goes
    instances: dict[tuple[tuple[int, ...], ...], Instance] = dataclasses.field(default_factory=dict)
    slots: dict[Any, Buffer] = dataclasses.field(default_factory=dict)  # "in", "out", or an intermediate's index
    generation: int = 0  # bumped when a slot is replaced: cached plans are stale
    refs: int = 1
    published: str | None = None
    last_use: int = 0  # the last submission a replay of it went into
    charged: int = 0  # bytes counted in the builder's quota
    max_instances: int = 8
    rows: bool = False  # row-independent: concurrent replays may be merged (`merging`)
    pool: Pool | None = None  # a slot graph's slots (`slots`)
    launched: int = 0  # the submission its last merged (or row) launch went into (`merging`)
    waking: bool = False  # a completion of that submission will run the replays that wait for it
    expected: frozenset[str] = frozenset()  # the sessions of that launch, whose next replays may join
    idle_since: float = 0.0  # when that launch completed (time.monotonic)
    carries: Carries = dataclasses.field(default_factory=Carries)  # what chained replays start from

    @property
    def device(self) -> int:
        return self.runtime.index

    @property
    def nbytes(self) -> int:
        constants = sum(b.nbytes for i in self.instances.values() for b in i.constants)
        return sum(b.nbytes for b in self.slots.values()) + constants

    def add(self, instance: Instance) -> list[Buffer]:
        """Add (or replace) an instance; grows the slots it needs. Returns buffers to release. If an
        allocation fails, it raises with the family unchanged."""
        needs: dict[Any, int] = {"in": instance.input_bytes, "out": instance.output_bytes}
        needs.update((index, part.nbytes) for index, part in enumerate(instance.temps))
        grown: dict[Any, Buffer] = {}
        try:
            for slot, size in needs.items():
                current = self.slots.get(slot)
                if current is None or current.nbytes < size:
                    grown[slot] = self.runtime.alloc(max(ALIGN, size))
        except BaseException:
            for buffer in grown.values():
                self.runtime.release(buffer)
            raise
        released: list[Buffer] = []
        old = self.instances.pop(instance.key, None)
        if old is not None:
            released += self._used(old.constants)
        while len(self.instances) >= self.max_instances:  # the least recently built goes
            released += self._used(self.instances.pop(next(iter(self.instances))).constants)
        self.instances[instance.key] = instance
        for slot, buffer in grown.items():
            if (current := self.slots.get(slot)) is not None:
                released += self._used([current])
            self.slots[slot] = buffer
        if grown:
            self.generation += 1
        return released

    def release_all(self) -> list[Buffer]:
        buffers = self._used([*[b for i in self.instances.values() for b in i.constants], *self.slots.values()])
        buffers += self.carries.release_all()
        self.slots.clear()
        self.instances.clear()
        return buffers

    def _used(self, buffers: list[Buffer]) -> list[Buffer]:
        """`buffers` of the family's own (slots, recorded uploads), marked with its last replay's
        submission: a replay leaves that to `last_use` (see `plan`)."""
        for buffer in buffers:
            buffer.last_use = max(buffer.last_use, self.last_use)
        return buffers

    def plan_key(self, binds: tuple[Buffer, ...]) -> tuple[Any, ...]:
        return (self.generation, *[b.id for b in binds])

    def plan(self, instance: Instance, binds: tuple[Buffer, ...], key: tuple[Any, ...] | None = None) -> Replayable:
        """The instance's steps over `binds`, checked and instantiated once (`key`: `plan_key(binds)`)."""
        if key is None:
            key = self.plan_key(binds)
        if (plan := instance.plans.get(key)) is not None:
            return plan
        rt, slots = self.runtime, self.slots
        inputs = [rt.view(slots["in"], p.offset, p.nbytes) for p in instance.inputs]
        temps = [rt.view(slots[index], 0, p.nbytes) for index, p in enumerate(instance.temps)]

        def tensor(ref: proto.Arg) -> Buffer:
            kind, value = ref
            if kind == ArgKind.TENSOR:
                return instance.fixed[int(value)].buffer
            if kind == ArgKind.INPUT:
                return inputs[int(value)]
            if kind == ArgKind.BIND:
                return binds[int(value)]
            return temps[int(value)]

        # The bound tensors are known now: each step is checked again with them (graph_checks).
        steps: list[GraphStep] = []
        for template in instance.steps:
            if template[0] == "dispatch":
                _, program, grid, args, number = template
                resolved: list[Any] = []
                refs: list[proto.Arg] = []
                for kind, value in args:
                    if kind == ArgKind.SCALAR:
                        resolved.append(Var(int(value), instance.scalars[int(value)].kind))
                    elif kind in proto.GRAPH_TENSOR_KINDS:
                        resolved.append(tensor((kind, value)))
                        refs.append((kind, value))
                    else:
                        resolved.append((kind, value))
                keys = [memory_key(tensor(ref)) for ref in refs]
                check_dispatch(number, program, keys, [instance.name(ref) for ref in refs])
                steps.append(DispatchStep(program, grid, tuple(resolved)))
            else:
                _, src, dst, nbytes, number = template
                source, target = src if isinstance(src, Buffer) else tensor(src), tensor(dst)
                if not isinstance(src, Buffer):  # a recorded upload's buffer is the instance's own
                    names = (instance.name(src), instance.name(dst))
                    check_copy(number, memory_key(source), memory_key(target), names)
                steps.append(CopyStep(source, 0, target, 0, nbytes))
        for ref, part in zip(instance.output_refs, instance.outputs, strict=True):
            steps.append(CopyStep(tensor(ref), 0, slots["out"], part.offset, part.nbytes))
        plan = rt.instantiate(steps, [*slots.values(), *instance.constants])  # their last use: `last_use`
        instance.plans.put(key, plan)
        return plan


class GraphStore:
    """Published graph families, by name (bounded)."""

    def __init__(self, is_connected: Any, max_count: int = 1024) -> None:
        self._by_name: dict[str, Family] = {}
        self._is_connected = is_connected
        self.max_count = max_count

    def __len__(self) -> int:
        return len(self._by_name)

    def publish(self, family: Family, name: str) -> None:
        if name in self._by_name:
            raise AlreadyExists(f"a graph named {name!r} is published")
        if family.published is not None:
            raise AlreadyExists(f"this graph is already published as {family.published!r}")
        if len(self._by_name) >= self.max_count:
            raise InvalidArgument(f"the daemon holds {self.max_count} published graphs, its limit")
        family.published = name
        family.refs += 1
        self._by_name[name] = family

    def open(self, name: str) -> Family:
        family = self._by_name.get(name)
        if family is None:
            raise NotFound(f"no published graph named {name!r}")
        family.refs += 1
        return family

    def unpublish(self, name: str, by: str) -> Family:
        """Remove the name; the caller drops the reference it held."""
        family = self._by_name.get(name)
        if family is None:
            raise NotFound(f"no published graph named {name!r}")
        if family.owner != by and self._is_connected(family.owner):
            raise PermissionDenied(f"graph {name!r} can be unpublished only by its builder while it is connected")
        del self._by_name[name]
        family.published = None
        return family

    def names(self) -> list[str]:
        return sorted(self._by_name)

"""Dispatches on WebGPU: checked and packed once, encoded into the pending compute pass.

wgpu validates a command buffer only at `finish()`: one invalid dispatch there would fail the
whole submission, other sessions' work included. So every new combination of pipeline and bound
buffers is first encoded into an encoder of its own and finished (a probe of no workgroups): wgpu's
own verdict lands on the op that caused it. Scalars go through one uniform buffer with a 256-byte
slot per distinct scalar bytes in the pending command buffer (dispatches with equal scalars share
one), written by one `write_buffer` right before the submit.
"""

from __future__ import annotations

import functools
import struct
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from gpud.backends.base import Arg, Buffer, Program
from gpud.backends.webgpu import pass_calls
from gpud.backends.webgpu.compiler import Pipeline
from gpud_protocol import SCALAR_FORMATS, ArgKind
from gpud_protocol.errors import InvalidArgument
from gpud_protocol.lru import LruCache

SLOT_BYTES = 256  # uniform slot per dispatch; >= every adapter's minUniformBufferOffsetAlignment
_SET_PIPELINE, _SET_BIND_GROUP, _DISPATCH = pass_calls.calls()


@functools.lru_cache(maxsize=256)
def scalar_struct(kinds: tuple[int, ...]) -> struct.Struct:
    """The packer of one scalar signature (bounded: signatures come from the wire)."""
    return struct.Struct("<" + "".join(SCALAR_FORMATS[ArgKind(k)] for k in kinds))


class Dispatcher:
    def __init__(self, device: Any, slots: int, bind_group_cache: int, max_binding: int) -> None:
        import wgpu

        self._device = device
        self.slots = slots
        self.uniform = device.create_buffer(
            size=slots * SLOT_BYTES,
            usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC,
        )
        self.uniform_host = bytearray(slots * SLOT_BYTES)
        self.used = 0  # slots used by the pending command buffer
        self._slot_of: dict[bytes, int] = {}  # its scalars' bytes -> their slot (at most `slots`)
        self._max_binding = max_binding
        self._bind_groups: LruCache[tuple[Any, ...], Any] = LruCache(bind_group_cache, self._forget)
        self._keys_of_buffer: defaultdict[Any, set[tuple[Any, ...]]] = defaultdict(set)
        self._probed: LruCache[tuple[Any, ...], bool] = LruCache(bind_group_cache)
        self.probes = 0
        # wgpu-native frees a finished command buffer only once it is submitted: the probes go
        # with the next submission (their buffers are marked as used by it, so they stay alive).
        self.finished_probes: list[Any] = []

    def prepare(self, program: Program, grid: tuple[int, int, int], args: Sequence[Arg]) -> tuple[Any, ...]:
        native: Pipeline = program.native
        tensors: list[Any] = []
        kinds: list[int] = []
        values: list[int | float] = []
        for arg in args:
            if type(arg) is Buffer:
                size = arg.native.size if arg.offset == 0 and arg.nbytes >= arg.native.size - 3 else _round4(arg.nbytes)
                if size > self._max_binding:
                    limit = self._max_binding
                    raise InvalidArgument(f"a tensor of {arg.nbytes} bytes exceeds the binding limit {limit}")
                tensors.append((arg.native, arg.offset, size))
            else:
                kinds.append(arg[0])  # type: ignore[index]
                values.append(arg[1])  # type: ignore[index]
        _check_aliasing(tensors, native.access, program.entry)
        packer = scalar_struct(tuple(kinds)) if kinds else None
        data = None
        if packer is not None:
            try:
                data = packer.pack(*values)
            except (struct.error, OverflowError) as exc:
                raise InvalidArgument(f"scalar out of range for {program.entry}: {exc}") from None
        key = (native.id, *tensors)
        if key not in self._probed:
            self._probe(native, tensors, packer is not None, program.entry)
            self._probed.put(key, True)
        return (native.pipeline, native.layout, native.id, tuple(tensors), packer, tuple(values), grid, data)

    def _probe(self, native: Pipeline, tensors: list[Any], scalars: bool, entry: str) -> None:
        """Encode the dispatch (of no workgroups) into an encoder of its own and finish it: wgpu's
        checks, no GPU work."""
        self.probes += 1
        bind_group = None
        if tensors or scalars:
            bind_group = self.bind_group(native.layout, native.id, tensors, 0 if scalars else -1)
        try:
            encoder = self._device.create_command_encoder()
            compute = encoder.begin_compute_pass()
            compute.set_pipeline(native.pipeline)
            if bind_group is not None:
                compute.set_bind_group(0, bind_group)
            compute.dispatch_workgroups(0, 0, 0)
            compute.end()
            self.finished_probes.append(encoder.finish())
        except Exception as exc:
            raise InvalidArgument(f"the arguments do not fit kernel {entry}: {_first_lines(exc)}") from None

    def bind_group(self, layout: Any, kernel_id: int, tensors: Sequence[Any], slot: int) -> Any:
        key = (kernel_id, slot, *tensors)
        if (bind_group := self._bind_groups.get(key)) is not None:
            return bind_group
        if layout is None:
            raise InvalidArgument("this kernel declares no bindings but was given arguments")
        entries: list[dict[str, Any]] = [
            {"binding": i, "resource": {"buffer": native, "offset": offset, "size": size}}
            for i, (native, offset, size) in enumerate(tensors)
        ]
        if slot >= 0:
            uniform = {"buffer": self.uniform, "offset": slot * SLOT_BYTES, "size": SLOT_BYTES}
            entries.append({"binding": len(tensors), "resource": uniform})
        try:
            bind_group = self._device.create_bind_group(layout=layout, entries=entries)
        except Exception as exc:
            raise InvalidArgument(f"the arguments do not match the kernel's bindings: {_first_lines(exc)}") from None
        self._bind_groups.put(key, bind_group)
        for native, _offset, _size in tensors:
            self._keys_of_buffer[native].add(key)
        return bind_group

    def encode(self, compute: Any, packed: tuple[Any, ...], current: list[Any]) -> None:
        """Append the dispatch to the open pass; `current` holds the pipeline set in it."""
        pipeline, layout, kernel_id, tensors, _packer, _values, grid, data = packed
        slot = -1
        if data is not None:
            # Dispatches with the same scalars (a decode step's layers, another session's step) share
            # a slot: fewer slots to write, and the slot, part of the bind group's key, repeats from
            # one command buffer to the next, so that key is found again (keyed on the bytes: -0.0 is not 0.0).
            slot = self._slot_of.get(data, -1)
            if slot < 0:
                slot = self._slot_of[data] = self.used
                assert slot < self.slots, "the runtime flushes before the uniform slots run out"
                self.uniform_host[slot * SLOT_BYTES : slot * SLOT_BYTES + len(data)] = data
                self.used += 1
        bind_group = None
        if tensors or data is not None:
            bind_group = self._bind_groups.get((kernel_id, slot, *tensors))
            if bind_group is None:
                bind_group = self.bind_group(layout, kernel_id, tensors, slot)
        if current[0] is not pipeline:
            _SET_PIPELINE(compute, pipeline)
            current[0] = pipeline
        if bind_group is not None:
            _SET_BIND_GROUP(compute, bind_group)
        _DISPATCH(compute, *grid)

    def take_uniforms(self) -> bytes | None:
        """The slots the pending command buffer used (written right before its submit)."""
        used, self.used = self.used, 0
        self._slot_of.clear()
        return bytes(self.uniform_host[: used * SLOT_BYTES]) if used else None

    def forget_buffer(self, native: Any) -> None:
        for key in self._keys_of_buffer.pop(native, ()):
            self._bind_groups.pop(key)
            self._probed.pop((key[0], *key[2:]))
            # The key's other buffers drop it too: a long-lived buffer (weights) kept every key it
            # shared with freed ones, and those keys kept the freed buffers (the lavapipe soak's RSS).
            self._forget(key, None)

    def _forget(self, key: tuple[Any, ...], _bind_group: Any) -> None:
        for native, _offset, _size in key[2:]:
            if keys := self._keys_of_buffer.get(native):
                keys.discard(key)
                if not keys:
                    del self._keys_of_buffer[native]

    def clear(self) -> None:
        self._bind_groups.clear()
        self._keys_of_buffer.clear()
        self._probed.clear()

    def stats(self) -> dict[str, Any]:
        return {"bind_group_cache": self._bind_groups.stats(), "validation_probes": self.probes}


def _round4(nbytes: int) -> int:
    return max(4, (nbytes + 3) & ~3)


def _check_aliasing(tensors: list[Any], access: tuple[str, ...] | None, entry: str) -> None:
    """WebGPU refuses one buffer bound read-only and read-write in one dispatch: say so at this op
    (where the access is unknown, the probe asks wgpu). Views of one allocation count as one buffer."""
    natives = [id(native) for native, _offset, _size in tensors]
    if len(set(natives)) == len(natives):
        return
    first: dict[int, int] = {}
    for position, native in enumerate(natives):
        earlier = first.setdefault(native, position)
        if earlier == position:
            continue
        if access is not None and access[earlier] != access[position]:
            raise InvalidArgument(
                f"tensor arguments {earlier} and {position} of {entry} are the same tensor, and WebGPU forbids a "
                "buffer bound both read-only and read-write in one dispatch: pass a copy"
            )


def _first_lines(exc: Exception) -> str:
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text[:400]

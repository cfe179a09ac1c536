"""Encoding work into the pending command buffer: dispatches (checked and packed once, then encoded as
often as asked), replays of recorded steps, and copies within the device, in op order."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from gpud.backends.base import Arg, Buffer, DispatchStep, GraphStep, Program, same_memory
from gpud.runtime.graph import Piece, Replayable, allocations_of, buffers_of, split
from gpud.runtime.state import Owner, Prepared, RuntimeState
from gpud_protocol.errors import InvalidArgument


class Encoding(RuntimeState):
    def prepare(self, program: Program, grid: tuple[int, int, int], args: Sequence[Arg]) -> Prepared:
        self._check_alive()
        gx, gy, gz = grid
        mx, my, mz = self.device.max_grid
        if gx > mx or gy > my or gz > mz:
            raise InvalidArgument(f"grid {grid} exceeds the device limit {self.device.max_grid}")
        buffers = tuple([arg for arg in args if type(arg) is Buffer])
        packed = self.device.prepare(program, grid, args)
        buffers += tuple({id(b.base): b.base for b in buffers if b.base is not None}.values())  # views' allocations
        if self.device.prepare_uses_buffers:
            self._encoded_with(*buffers)
        return Prepared(buffers, packed if gx and gy and gz else None)

    def dispatch(self, prepared: Prepared, owner: Owner) -> None:
        if prepared.packed is None:
            return  # an empty grid: nothing to run
        self.device.encode_dispatch(prepared.packed)
        self.encoded += 1
        index = self.ledger.submitted + 1
        for buffer in prepared.buffers:
            buffer.last_use = index
        self._owners.add(owner)
        self.dispatches_pending += 1
        self.dispatch_count += 1
        self.policy.dispatched(self.dispatches_pending)

    def instantiate(self, steps: Sequence[GraphStep], tracked: Collection[Buffer] = ()) -> Replayable:
        """A recorded step in this backend's replayable form (checked now, like a dispatch). A replay
        marks the allocations it uses with its submission, but those in `tracked`: their owner keeps
        their last use itself (a graph's own memory, released after the graph's last replay)."""
        self._check_alive()
        max_grid = self.device.max_grid
        kept: list[GraphStep] = []
        for step in steps:
            if isinstance(step, DispatchStep):
                gx, gy, gz = step.grid
                if gx > max_grid[0] or gy > max_grid[1] or gz > max_grid[2]:
                    raise InvalidArgument(f"grid {step.grid} exceeds the device limit {max_grid}")
                if not (gx and gy and gz):
                    continue  # an empty grid: nothing to run
            elif step.nbytes == 0:
                continue
            kept.append(step)
        if self.device.prepare_uses_buffers:  # validation probes go with the next submission, even if one fails
            self._encoded_with(*buffers_of(kept))
        # On a software device every dispatch is a piece of its own: a replay may take many seconds there.
        pieces = []
        for steps in split(kept, 1 if self.device.software else 0):
            dispatches = sum(1 for step in steps if isinstance(step, DispatchStep))
            marked = allocations_of(buffers_of(steps), {id(buffer) for buffer in tracked})
            pieces.append(Piece(self.device.instantiate(steps), marked, dispatches))
        self.counters["graphs_instantiated"] += 1
        return Replayable(tuple(pieces))

    def replay(self, replayable: Replayable, values: Sequence[int | float], owner: Owner) -> None:
        """Encode one replay into the pending command buffer, as if its ops had arrived one by one."""
        self._check_alive()
        self.counters["graph_replays"] += 1
        for piece in replayable.pieces:  # an empty step has none: nothing to encode
            self.policy.make_room(self.dispatches_pending, piece.dispatches)
            self.device.encode_replay(piece.native, values)
            self.encoded += 1  # `_encoded_with`, over allocations alone
            index = self.ledger.submitted + 1
            for buffer in piece.buffers:
                buffer.last_use = index
            self._owners.add(owner)
            self.dispatches_pending += piece.dispatches
            self.dispatch_count += piece.dispatches
            if len(replayable.pieces) > 1:
                self.policy.dispatched(self.dispatches_pending)

    def copy(self, src: Buffer, dst: Buffer, owner: Owner) -> None:
        """A copy between two buffers of this device, in op order."""
        self._check_alive()
        if same_memory(src, dst):
            if src.nbytes == 0 or (src.offset, src.nbytes) == (dst.offset, dst.nbytes):
                return  # onto itself: nothing to do
            # Parts of one buffer: WebGPU would refuse the whole submission, so refuse this op alone.
            raise InvalidArgument("copy: source and destination are parts of the same memory, which WebGPU refuses")
        if src.nbytes == 0:
            return
        self.device.encode_copy(src.native, src.offset, dst.native, dst.offset, min(src.nbytes, dst.nbytes))
        self._encoded_with(src, dst)
        self._owners.add(owner)

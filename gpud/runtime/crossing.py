"""A copy between two devices, peer to peer, ordered on the devices themselves.

The target marks its queue after what it has of the destination (its earlier readers and writers); the
source waits on that mark, copies (after its own earlier writes of the source) and marks its queue; the
target waits on that mark before anything it is given later. The host waits only for each part to be
issued (a submit call), never for the copy to complete. The parts go on without the session that asked:
a session that ends meanwhile leaves a copy that completes, whose buffers are held until their use is
marked.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gpud.backends.base import Buffer
from gpud.runtime.state import Owner, RuntimeState
from gpud.runtime.waits import settle


class PeerCopy:
    def __init__(self, source: RuntimeState, target: RuntimeState, src: Buffer, dst: Buffer, owner: Owner) -> None:
        self.source, self.target, self.src, self.dst, self.owner = source, target, src, dst, owner
        self.done: asyncio.Future[None] = source.device.loop.create_future()
        self._markers: list[tuple[RuntimeState, Any]] = []
        self._held = [(source, src), (target, dst)]

    def start(self) -> asyncio.Future[None]:
        """Encode the target's first part; the rest follows as each part is issued. Resolves once the
        copy is ordered before everything encoded from then on, on both devices."""
        source, target = self.source, self.target
        source.hold(self.src)
        target.hold(self.dst)
        try:
            target._check_alive()
            free = self._marker(target)
            target.device.encode_mark(free)
            target._encoded_with(self.dst)
            target.policy.flush()
        except Exception as exc:
            self._fail(exc)
            return self.done
        target.after_issued(lambda error: self._copy(free, error))
        return self.done

    def _copy(self, free: Any, error: BaseException | None) -> None:
        source = self.source
        try:
            if error is not None:
                raise error
            source._check_alive()
            copied = self._marker(source)
            device = source.device
            device.encode_wait(free)
            src, dst = self.src, self.dst
            device.encode_peer_copy(src.native, src.offset, self.target.device, dst.native, dst.offset, src.nbytes)
            device.encode_mark(copied)
            source._encoded_with(src)
            source._owners.add(self.owner)
            source.counters["peer_copy_bytes"] += src.nbytes
            self._unhold(source)
            source.policy.flush()
        except Exception as exc:
            self._fail(exc)
            return
        source.after_issued(lambda error: self._ordered(copied, error))

    def _ordered(self, copied: Any, error: BaseException | None) -> None:
        target = self.target
        try:
            if error is not None:
                raise error
            target._check_alive()
            target.device.encode_wait(copied)
            target._encoded_with(self.dst)
            target._owners.add(self.owner)
        except Exception as exc:
            self._fail(exc)
            return
        self._unhold(target)
        target.after_pending(lambda _error: self._drop())  # after the wait on the copy, so after the copy
        target.policy.after_drain(True)  # submitted with what comes next, or at the flush deadline
        settle(self.done, None)

    def _marker(self, runtime: RuntimeState) -> Any:
        marker = runtime.device.new_marker()
        self._markers.append((runtime, marker))
        return marker

    def _unhold(self, runtime: RuntimeState) -> None:
        for index, (held_by, buffer) in enumerate(self._held):
            if held_by is runtime:
                del self._held[index]
                runtime.unhold(buffer)
                return

    def _fail(self, error: BaseException) -> None:
        """Nothing more is encoded: once what was encoded on either device completed, drop the markers."""
        for runtime, _buffer in list(self._held):
            self._unhold(runtime)
        self.source.after(lambda _error: self.target.after(lambda _error: self._drop()))
        settle(self.done, None, error)

    def _drop(self) -> None:
        for runtime, marker in self._markers:
            runtime.device.drop_marker(marker)
        self._markers.clear()

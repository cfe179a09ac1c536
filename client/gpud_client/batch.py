"""The client's op queue: ops are packed as they are queued and leave as one batch message.

A batch goes when something is awaited, or when it reaches a limit of the daemon's (ops, frames,
header or payload bytes). Batches are numbered; at most `window` may be sent before the daemon
confirms them (a receipt, or the reply to a request they carry), so a client that queues faster
than the daemon executes holds its batches here instead of flooding the daemon.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gpud_protocol as proto


class OpQueue:
    def __init__(self, limits: proto.Limits, window: int = 64) -> None:
        self.limits = limits
        self.window = window
        self._packed = bytearray()
        self._count = 0
        self._frames: list[Any] = []
        self._frame_bytes = 0
        self._frames_full = False  # the frames reached a limit: the batch goes with the next op
        self._requests: list[int] = []
        self.acks: set[int] = set()  # failed seqs seen, acknowledged with the next batch
        self.number = 0  # of the last batch made
        self.confirmed = 0  # batches up to this one were executed by the daemon
        self._batch_of_request: dict[int, int] = {}
        self.held: deque[list[Any]] = deque()  # made but not sent (window full or socket full)

    @property
    def limits(self) -> proto.Limits:
        return self._limits

    @limits.setter
    def limits(self, limits: proto.Limits) -> None:
        self._limits = limits
        self._max_ops = limits.max_ops_per_batch
        self._max_packed = limits.max_header_bytes // 2

    def __len__(self) -> int:
        return self._count

    def add(self, packed: bytes, request: int | None = None) -> bool:
        """Queue one packed op; True if the batch should go now (a limit is reached)."""
        self._packed += packed
        self._count += 1
        if request is not None:
            self._requests.append(request)
        return self._count >= self._max_ops or len(self._packed) >= self._max_packed or self._frames_full

    def add_frame(self, payload: Any) -> int | None:
        """The index of `payload` in this batch, or None if it must go in the next batch (size limit)."""
        size = len(payload)
        limits = self._limits
        if self._frames and self._frame_bytes + size > frame_budget(limits):
            return None
        self._frames.append(payload)
        self._frame_bytes += size
        self._frames_full = len(self._frames) >= limits.max_frames or self._frame_bytes >= frame_budget(limits)
        return len(self._frames) - 1

    def take(self) -> list[Any] | None:
        """The queued ops as one batch message (frames), or None if nothing is queued."""
        if not self._count:
            return None
        self.number += 1
        for seq in self._requests:
            self._batch_of_request[seq] = self.number
        header = proto.encode_batch(
            self._packed, self._count, len(self._frames), sorted(self.acks), self.number, receipt=not self._requests
        )
        frames = [header, *self._frames]
        self._packed, self._count, self._frames, self._frame_bytes, self._requests = bytearray(), 0, [], 0, []
        self._frames_full = False
        self.acks.clear()
        return frames

    @property
    def window_open(self) -> bool:
        sent = self.number - len(self.held)
        return sent - self.confirmed < self.window

    def replied(self, seq: int) -> None:
        """The reply to request `seq` came: its batch, and every earlier one, was executed."""
        number = self._batch_of_request.pop(seq, 0)
        if number > self.confirmed:
            self.confirmed = number

    def receipt(self, number: int) -> None:
        if number > self.confirmed:
            self.confirmed = min(number, self.number)


def frame_budget(limits: proto.Limits) -> int:
    """Payload bytes one batch message may carry (a larger upload travels in parts)."""
    return limits.max_message_bytes - limits.max_header_bytes

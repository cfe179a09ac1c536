"""A session's memo of dispatches (daemon side): a dispatch's body, everything after its seq, decoded
and checked once, and kept with what the daemon made of it, so that a repeated dispatch costs one
lookup from the wire to the device (steps repeat: a decode step sends the same bodies every time).

The decoder keys an entry by the body's bytes as the client packed them (`daemon_batch`), or by the
decoded fields where it reads a message the general way; it hands a dispatch it found or added on
as `Memoized(seq, entry)`. The session fills `entry.prepared` and empties it when a tensor handle
the dispatch names is freed (a later tensor may get that handle). Bounded: when full, the least
recently used entry goes, one at a time, and its owner hears of it (`on_evict`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

from gpud_protocol.lru import LruCache

DISPATCH_MEMO_SIZE = 4096


class DispatchEntry:
    """One distinct dispatch body: its checked fields (kernel, grid, args, writes) and the daemon's
    prepared form of it (None until the session prepares it, and again once a handle it names goes)."""

    __slots__ = ("fields", "prepared")

    def __init__(self, fields: tuple[Any, ...]) -> None:
        self.fields = fields
        self.prepared: Any = None


class Memoized(NamedTuple):
    """A dispatch whose body the session's memo holds: the op is `Dispatch(seq, *entry.fields)`."""

    seq: int
    entry: DispatchEntry


DispatchMemo = LruCache[Hashable, DispatchEntry]


def new_dispatch_memo(
    capacity: int = DISPATCH_MEMO_SIZE, on_evict: Callable[[Hashable, DispatchEntry], None] | None = None
) -> DispatchMemo:
    """A session's memo, for `decode_client_message` (a bounded LRU)."""
    return LruCache(capacity, on_evict)

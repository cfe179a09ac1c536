"""A session's prepared dispatches: checked and packed once, reused while the same dispatch repeats.

They live in the entries of the session's dispatch memo (`gpud_protocol.memo`), so a repeated
dispatch is one lookup from the wire to the device: the decoder finds the entry by the dispatch's
body and the session encodes what the entry holds. Bounded with the memo: when full, the least
recently used entry goes, one at a time. A prepared form goes too when a tensor handle it uses is
freed, since a later tensor may get that handle (the decoded fields stay: they name no tensor's
memory).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from gpud_protocol.memo import DISPATCH_MEMO_SIZE, DispatchEntry, DispatchMemo, new_dispatch_memo

Prepared = tuple[Any, Any, tuple[int, ...]]  # (what the runtime dispatches, the runtime, tensor handles used)

CAPACITY = DISPATCH_MEMO_SIZE


class PreparedDispatches:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self.memo: DispatchMemo = new_dispatch_memo(capacity, self._evicted)
        self._by_handle: dict[int, dict[DispatchEntry, None]] = {}  # handle -> the entries that use it (an ordered set)

    def add(self, entry: DispatchEntry, prepared: Any, runtime: Any, handles: tuple[int, ...]) -> Prepared:
        """Keep `prepared` in `entry` (an entry of the memo) until a handle it uses is freed."""
        self._unprepare(entry)
        entry.prepared = kept = (prepared, runtime, handles)
        for handle in handles:
            self._by_handle.setdefault(handle, {})[entry] = None
        return kept

    def forget(self, handle: int) -> None:
        """Drop the prepared form of every entry that uses tensor handle `handle`."""
        for entry in list(self._by_handle.get(handle, ())):
            self._unprepare(entry)

    def handles_indexed(self) -> int:
        """How many handles the index knows (tests check it does not outgrow the entries)."""
        return len(self._by_handle)

    def clear(self) -> None:
        self.memo.clear()

    def _evicted(self, _key: Hashable, entry: DispatchEntry) -> None:
        self._unprepare(entry)

    def _unprepare(self, entry: DispatchEntry) -> None:
        kept, entry.prepared = entry.prepared, None
        if kept is None:
            return
        for handle in kept[2]:
            entries = self._by_handle.get(handle)
            if entries is not None:
                entries.pop(entry, None)
                if not entries:
                    del self._by_handle[handle]

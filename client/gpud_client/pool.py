"""The pool of freed op-library outputs: what PyTorch's caching allocator does for device memory, done
for handles (the client's side of it; `ClientBase` sends what it decides).

An op-library call's output (`gpu.ops.add(x, y)`, no `out=`) that is freed — by a scope's exit,
`t.free()`, or dropped by Python — keeps its handle here instead of sending Free, keyed exactly by
(device, dtype, shape). The next call that needs an output of that key takes it: no Alloc, and the same
handle as before, so the daemon's prepared dispatches (keyed by handles) hit again and an eager forward
sends its dispatches alone.

Why reusing one is safe:
- every op-library kernel writes its whole output, so the bytes left by the last user are never read
  (`gpu.empty`, which promises zeros, and `gpu.tensor`'s uploads never come from here);
- the daemon runs one client's ops in order (a copy to another device is waited for), so the op that
  writes a reused handle comes after every op queued before it that reads it, `out=` included;
- the Python object of a freed tensor stays freed, and so do its views: using it raises, it never
  sees the next owner's data; a tensor with a live view is never dropped by Python (a view holds it);
- what the daemon holds past the ops queued so far (a published tensor, a session tensor recorded into
  a replay graph) is never pooled (`ClientBase._hold`), and an allocation the daemon refused is no
  handle at all: never pooled, dropped if it was (`failed`).

Bounded: at most `max_bytes` and `max_entries`; past either the least recently pooled entry goes, one
at a time (its Free is sent). Pooled memory is still the session's, in the daemon's accounts.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import NamedTuple

POOL_BYTES = 1 << 30  # MiniLM eager at 64 x 60 tokens (fp16) frees ~330 MB a forward: at 256 MiB, 21 of 84 missed
POOL_ENTRIES = 1024


def default_bytes(quota: object) -> int:
    """The pool's bound for a session with this memory quota (the welcome's `memory_quota`, per
    device): a quarter of it, at least POOL_BYTES (an 8 GiB quota pools 2 GiB: MiniLM eager at 256 x 60
    tokens frees 1.3 GB a forward)."""
    return max(POOL_BYTES, quota // 4) if isinstance(quota, int) and quota > 0 else POOL_BYTES


FAILED_KEPT = 1024  # refused allocations remembered (their tensors may be freed later)

Key = tuple[int, str, tuple[int, ...]]  # (device, dtype name, shape)


class Origin(NamedTuple):
    """What a poolable tensor carries: its key, the seq of the Alloc that made its handle, its bytes; and
    how its handle travels as a dispatch argument, and that packed (each tensor of the handle takes them)."""

    key: Key
    seq: int
    nbytes: int
    wire: tuple[int, int] | None = None  # (TENSOR, handle)
    packed: bytes = b""


class Pool:
    def __init__(self, max_bytes: int = POOL_BYTES, max_entries: int = POOL_ENTRIES) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._by_key: dict[Key, OrderedDict[int, Origin]] = {}  # handles of a key, least recently pooled first
        self._order: OrderedDict[int, Origin] = OrderedDict()  # every pooled handle, least recently pooled first
        self._failed: OrderedDict[int, None] = OrderedDict()  # seqs of refused allocations
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        # Tensors Python dropped unfreed, as (handle, origin): appended by `Tensor.__del__` from any thread
        # (an append is atomic), pooled by the client at its next call (`ClientBase._collect`).
        self.dropped: deque[tuple[int, Origin]] = deque()

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, handle: object) -> bool:
        return handle in self._order

    def take(self, key: Key) -> tuple[int, Origin] | None:
        """A pooled handle of exactly `key` (the least recently pooled: a steady loop gets the same
        handle for the same op every time), now the caller's; None if there is none."""
        handles = self._by_key.get(key)
        if not handles:
            self.misses += 1
            return None
        taken = handles.popitem(last=False)  # (handle, origin), returned as it is
        if not handles:
            del self._by_key[key]
        del self._order[taken[0]]
        self.nbytes -= taken[1].nbytes
        self.hits += 1
        return taken

    def put(self, handle: int, origin: Origin) -> list[int] | None:
        """Pool a freed `handle`. Returns the handles to free now (evicted to stay within the bounds, or
        `handle` itself when it does not fit at all), or None when its allocation was refused (there is
        nothing to free)."""
        if origin.seq in self._failed:
            return None
        if handle in self._order:
            raise AssertionError(f"handle {handle} pooled twice")
        if origin.nbytes > self.max_bytes or self.max_entries < 1:
            return [handle]
        handles = self._by_key.get(origin.key)
        if handles is None:
            handles = self._by_key[origin.key] = OrderedDict()
        handles[handle] = origin
        self._order[handle] = origin
        self.nbytes += origin.nbytes
        if self.nbytes <= self.max_bytes and len(self._order) <= self.max_entries:
            return []
        return self._fit()

    def limit(self, max_bytes: int, max_entries: int) -> list[int]:
        """New bounds; the handles evicted to fit them (to free)."""
        self.max_bytes, self.max_entries = max_bytes, max_entries
        return self._fit()

    def clear(self) -> list[int]:
        """Empty the pool; every handle it held (to free)."""
        handles = list(self._order)
        self._by_key.clear()
        self._order.clear()
        self.nbytes = 0
        return handles

    def failed(self, seq: int) -> None:
        """The daemon refused the allocation `seq`: its handle names nothing. Drop it if pooled (without a
        Free: there is nothing to free), and never pool it later."""
        self._failed[seq] = None
        if len(self._failed) > FAILED_KEPT:
            self._failed.popitem(last=False)
        for handle, origin in list(self._order.items()):
            if origin.seq == seq:
                self._remove(handle, origin)

    def _fit(self) -> list[int]:
        evicted = []
        while self._order and (self.nbytes > self.max_bytes or len(self._order) > self.max_entries):
            handle, origin = next(iter(self._order.items()))
            self._remove(handle, origin)
            self.evictions += 1
            evicted.append(handle)
        return evicted

    def _remove(self, handle: int, origin: Origin) -> None:
        del self._order[handle]
        handles = self._by_key[origin.key]
        del handles[handle]
        if not handles:
            del self._by_key[origin.key]
        self.nbytes -= origin.nbytes

"""A bounded memo of a pure function's answers, for the client's hot paths (op plans, packed op tails,
view geometry): read as a plain dict (one lookup, no bookkeeping), at most `capacity` entries.

When full, `keep` drops the oldest entry, one at a time: never the whole memo (a steady workload must
not turn into periodic storms of misses). Oldest rather than least recently used because a hit must
cost nothing but the lookup; the working sets it serves (a model's shapes times its ops) are far
below the capacity, where both orders keep everything.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Memo(dict[K, V]):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        if capacity < 1:
            raise ValueError("memo capacity must be at least 1")
        self.capacity = capacity

    def keep(self, key: K, value: V) -> V:
        """Remember `value` for `key` (dropping the oldest entry when full); returns `value`."""
        if key not in self and len(self) >= self.capacity:
            del self[next(iter(self))]
        self[key] = value
        return value

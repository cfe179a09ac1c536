"""The budget of peers without a session: status requests, garbage, batches before hello, failed hellos.

Such a peer has had no op accepted, so what it sends may be dropped without breaking any promise.
Each peer identity has a token bucket (`sessionless_rate` messages per second, a second's worth at
once), and all of them share one more (`sessionless_total_rate`), which beats and hellos skip so
that a crowd of flooders cannot keep sessions from their leases or new clients from connecting. A
message over budget is dropped unread and counted.

Garbage leaves nothing behind: the table of buckets is bounded (`MAX_PEERS`, least recently seen
out first) and forgets a peer as soon as its bucket would be full again, which is the state of a
peer it never saw. A peer pushed out early comes back with a full bucket: the shared one bounds that.
"""

from __future__ import annotations

from collections import OrderedDict

import gpud_protocol as proto

MAX_PEERS = 4096
OWN_BUDGET_ONLY = (proto.Beat, proto.Hello)  # messages that skip the shared budget


class TokenBucket:
    """`rate` tokens a second, at most `burst` kept; `take` spends one if there is one."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def take(self, now: float) -> bool:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def full_at(self) -> float:
        """When the bucket is full again if nothing is taken meanwhile."""
        return self.stamp + (self.burst - self.tokens) / self.rate


class SessionlessBudget:
    def __init__(self, rate: float, total_rate: float, max_peers: int = MAX_PEERS) -> None:
        self.rate = rate
        self.burst = max(1.0, rate)  # a second's worth
        self.max_peers = max_peers
        self.shared = TokenBucket(total_rate, max(1.0, total_rate), 0.0)
        self._peers: OrderedDict[bytes, TokenBucket] = OrderedDict()  # least recently seen first
        self.dropped = 0  # messages over either budget

    def __len__(self) -> int:
        return len(self._peers)

    def peer(self, identity: bytes, now: float) -> bool:
        """Spend one of this peer's tokens; False: over its budget, drop the message."""
        peers = self._peers
        while peers:  # forget the peers whose buckets have refilled, oldest first
            oldest = next(iter(peers.values()))
            if oldest.full_at() > now:
                break
            peers.popitem(last=False)
        bucket = peers.get(identity)
        if bucket is None:
            bucket = peers[identity] = TokenBucket(self.rate, self.burst, now)
            if len(peers) > self.max_peers:
                peers.popitem(last=False)
        else:
            peers.move_to_end(identity)
        return self._count(bucket.take(now))

    def total(self, now: float) -> bool:
        """Spend one token of the budget all peers without a session share; False: drop the message."""
        return self._count(self.shared.take(now))

    def _count(self, taken: bool) -> bool:
        self.dropped += not taken
        return taken

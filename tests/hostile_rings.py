"""The hostile test's ring abusers: clients that take a shared-memory ring (gpud.service.rings) and
break it every way the shared memory allows, and strangers at the ring socket.

Each life: connect with `ring=True`, check a few round trips through the ring, then damage the ring
(an index far ahead or behind, a record head or frame lengths that lie, random bytes published as
records, valid records of garbage messages, batch numbers out of order, a reply ring claimed read
past its end), ring the doorbell and keep making requests over ZeroMQ. Every request must end within
`ANSWER_S`, and once the daemon has found the damage the session must be over (SessionLost, or the
daemon's error for the batch). Between lives, requests at the ring socket that are not a live
session's (wrong key, garbage, silence) must get no descriptor. `report(kind, text)` collects what
went wrong; the caller owns the findings.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import struct
from collections.abc import Callable

import anyio.to_thread
import msgpack
import numpy as np

import gpud_client
import gpud_client.ring
import gpud_protocol as proto
from gpud_client.errors import GpudError
from gpud_protocol import ring as R

ANSWER_S = 10.0
DAMAGES = (
    "written_far_ahead",
    "written_behind",
    "head_lies",
    "lengths_lie",
    "random_records",
    "garbage_messages",
    "numbers_back",
    "numbers_far_ahead",
    "reply_read_ahead",
)

Report = Callable[[str, str], None]  # (finding kind, text)


def damage(ring: R.Ring, replies: R.Ring, kind: str, rng: random.Random) -> None:
    """Break a client's ring in the way `kind` names (the client no longer uses it)."""
    words, own, capacity = ring._words, ring._own, ring.capacity
    data = ring._data
    if kind == "written_far_ahead":
        words[R.REQUEST_WRITTEN] = own + capacity + rng.randrange(8, 1 << 40, 8)
    elif kind == "written_behind":
        ring.produce([proto.PING])
        words[R.REQUEST_WRITTEN] = max(0, own - rng.randrange(8, 4096, 8))
    elif kind == "head_lies":
        body, count = rng.choice([(1 << 31, 1), (64, 0), (8, 3), (capacity, 1), (16, R.MAX_FRAMES + 1)])
        struct.pack_into("<II", data, own % capacity, body, count)
        words[R.REQUEST_WRITTEN] = own + 8 + R.padded(body if body < capacity else 8)
    elif kind == "lengths_lie":
        publish_lying_lengths(ring, rng.randrange(41, 1 << 32))
    elif kind == "random_records":
        size = rng.randrange(8, 2048, 8)
        at = own % capacity
        first = min(size, capacity - at)
        data[at : at + first] = rng.randbytes(first)
        data[: size - first] = rng.randbytes(size - first)
        words[R.REQUEST_WRITTEN] = own + size
    elif kind == "garbage_messages":
        for _ in range(rng.randrange(1, 6)):
            ring.produce([rng.randbytes(rng.randrange(0, 300)) for _ in range(rng.randrange(1, 4))])
        ring.produce([proto.encode_ops([], 0, number=0)])  # at least one the daemon must refuse
    elif kind == "numbers_back":
        ring.produce([proto.encode_ops([proto.FlushOp(10**6)], 0, number=1)])
    elif kind == "numbers_far_ahead":
        ring.produce([proto.encode_ops([proto.FlushOp(10**6)], 0, number=1 << 30)])
    else:  # reply_read_ahead: the daemon finds it when it next puts a reply in the ring
        replies._words[R.REPLY_READ] = rng.randrange(1 << 40, 1 << 60)
        replies.set_slot(R.CLIENT_POLLS_UNTIL, 1 << 62)


def publish_lying_lengths(ring: R.Ring, lie: int) -> None:
    """Publish a ping plus 40 bytes whose first frame length is `lie` (more than the record holds).

    The record is stored whole before the written index moves: a lie patched in after `produce` races
    a daemon that polls the ring, which may take the honest record first and rightly keep the session.
    """
    at = ring._put(ring._own % ring.capacity, struct.pack("<II", 8 + len(proto.PING) + 40, 2))
    at = ring._put(at, struct.pack("<II", lie, 40))
    ring._put(at, proto.PING + b"x" * 40)
    ring._words[R.REQUEST_WRITTEN] = ring._own + R.ALIGN + R.padded(8 + len(proto.PING) + 40)


async def abuser(address: str, index: int, lives: int, seed: int, report: Report, counts: dict[str, int]) -> None:
    rng = random.Random(seed * 1000 + index)
    for life in range(lives):
        kind = DAMAGES[(index + life) % len(DAMAGES)]
        try:
            await _life(address, kind, rng, report, counts)
        except TimeoutError:
            report("MISSING", f"ring abuser {index}, {kind}: a request went unanswered for {ANSWER_S} s")
        await _strangers(address, rng, report, counts)


async def _life(address: str, kind: str, rng: random.Random, report: Report, counts: dict[str, int]) -> None:
    ended = False
    broken: gpud_client.ring.ClientRing | None = None
    try:
        async with gpud_client.connect(address, ring=True) as gpu:
            if not gpu.ring:
                report("FAILED", "a ring abuser got no ring")
                return
            x = np.arange(64, dtype=np.float32) * rng.random()
            t = gpu.tensor(x)
            with anyio.fail_after(ANSWER_S):
                if not np.array_equal(await t.numpy(), x):
                    report("DATA", "a ring session read back other data than it wrote")
            connection = gpu._connection
            ring = broken = connection.ring
            assert ring is not None
            connection.ring = None  # from here on it speaks ZeroMQ alone; the damage stays
            damage(ring.requests, ring.replies, kind, rng)
            connection._send_control(proto.DOORBELL)
            counts["ring damages"] = counts.get("ring damages", 0) + 1
            for _ in range(200):
                with anyio.fail_after(ANSWER_S):
                    try:
                        await gpu.flush()
                    except GpudError as exc:
                        if isinstance(exc, gpud_client.SessionLost):
                            ended = True
                            break
                await asyncio.sleep(0.005)
    except (gpud_client.SessionLost, gpud_client.DaemonLost):
        ended = True
    finally:
        if broken is not None:
            broken.close()
    if ended:
        counts["ring sessions ended"] = counts.get("ring sessions ended", 0) + 1
    else:  # every damage breaks the ring's rules (garbage ends with a batch numbered 0)
        report("SUCCEEDED", f"a ring broken by {kind} did not end its session")


async def _strangers(address: str, rng: random.Random, report: Report, counts: dict[str, int]) -> None:
    path = address[len("ipc://") :] + ".ring"
    requests = [
        msgpack.packb({"session": os.urandom(8).hex(), "key": os.urandom(16).hex()}),
        rng.randbytes(rng.randrange(0, 600)),
        msgpack.packb({"session": 1, "key": None}),
        b"",
    ]
    for request in requests:
        fds = await anyio.to_thread.run_sync(_ask, path, request)
        counts["ring socket strangers"] = counts.get("ring socket strangers", 0) + 1
        if fds:
            report("DATA", f"the ring socket gave a descriptor to a stranger ({request[:24]!r})")
            for fd in fds:
                os.close(fd)


def _ask(path: str, request: bytes) -> list[int]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(ANSWER_S)
        conn.connect(path)
        if request:
            conn.sendall(request)
        else:
            conn.shutdown(socket.SHUT_WR)
        try:
            _data, fds, _flags, _addr = socket.recv_fds(conn, 512, 4)
        except OSError:
            return []
    return list(fds)

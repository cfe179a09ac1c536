"""A peer without a session that floods the daemon and never reads must not stall anyone else.

The flooder runs in a process of its own (so that it floods as fast as Python can, whatever this
test's event loop does) and never reads its socket. Meanwhile a well-behaved client makes upload +
readback round trips: each must complete, not wait out the flood. Afterwards the daemon must hold
only a bounded number of reply bytes for the flooder, and say what it dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import anyio
import msgpack
import pytest
from rawpeer import Flooder, RawPeer
from support import axpb, check_well_behaved

import gpud_client
from gpud.service import admin
from gpud.testing import spawn

MiB = 1 << 20
FLOOD_S = 2.5
ROUND_TRIP_BOUND_S = 2.0  # generous: a round trip normally takes milliseconds; one stalled by the flood takes FLOOD_S
SESSIONLESS_REPLY_BYTES = MiB  # the default of `sessionless_reply_bytes`


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


UNLIMITED = ("--sessionless-rate", "1e6", "--sessionless-total-rate", "1e7")  # only the reply bytes bound it


@pytest.mark.parametrize(
    ("kind", "args"),
    [("status", ()), ("mixed", ()), ("status", UNLIMITED)],
    ids=["status", "mixed", "status-unlimited-rate"],
)
async def test_a_sessionless_flood_stalls_nobody(kind: str, args: tuple[str, ...]) -> None:
    """Round trips go on during the flood, and the flooder's replies are bounded and counted."""
    with spawn.daemon("fake", extra_args=args) as (address, proc):
        async with gpud_client.connect(address) as gpu:
            k = await axpb(gpu)
            await check_well_behaved(gpu, k)
            rss_before = _rss(proc.pid)
            flooder = Flooder(address, FLOOD_S, kind)
            try:
                await flooder.start()
                rounds, slowest = 0, 0.0
                while flooder.flooding():
                    started = time.monotonic()
                    with anyio.fail_after(ROUND_TRIP_BOUND_S + FLOOD_S):  # a stalled one still ends, and is reported
                        await check_well_behaved(gpu, k, seed=rounds)
                    slowest = max(slowest, time.monotonic() - started)
                    rounds += 1
                flooded = await flooder.flooded()
                assert slowest < ROUND_TRIP_BOUND_S, f"a round trip stalled {slowest:.1f} s during the flood"
                assert rounds >= 2 and flooded > 1000, (rounds, flooded)

                # The flooder is still connected and still not reading.
                status = await asyncio.to_thread(admin.query, address, 10.0)
                outboxes, counters = status["outboxes"], status["counters"]
                waiting = outboxes["bytes_waiting"]
                assert waiting <= SESSIONLESS_REPLY_BYTES, f"{waiting} reply bytes held for a peer that never reads"
                if args == UNLIMITED:
                    assert counters["sessionless_replies_dropped"] > 0, counters
                else:
                    assert counters["sessionless_dropped"] > 0, counters
                grown = _rss(proc.pid) - rss_before
                assert grown < 64 * MiB, f"the daemon's RSS grew {grown / MiB:.0f} MiB during the flood"
                await check_well_behaved(gpu, k, seed=99)
            finally:
                await flooder.close()
            if kind == "mixed":  # garbage leaves nothing behind: its budget is forgotten once it would be full again
                await anyio.sleep(1.5)
                status = await asyncio.to_thread(admin.query, address, 10.0)
                assert status["sessionless_peers"] <= 3, status["sessionless_peers"]  # this query's, the beats'
                assert status["outboxes"]["peers_waiting"] == 0
        assert proc.poll() is None


async def test_a_session_asking_for_status_has_the_same_budget(raw: RawPeer) -> None:
    """A status request is not an op: a session that floods them is held to a peer's budget too."""
    await raw.hello()
    asked = 1000
    for _ in range(asked):
        await raw.send(msgpack.packb({"t": "status"}))
    answered = 0
    with contextlib.suppress(TimeoutError):
        while True:  # until a second passes without an answer
            header, _ = await raw.recv(timeout=1.0)
            assert header["t"] == "status", header
            answered += 1
    assert 0 < answered < asked

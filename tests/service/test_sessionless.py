"""The budget of peers without a session (gpud.service.budget) and their outboxes (gpud.service.peers), unit by unit."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import zmq

from gpud.service.budget import SessionlessBudget, TokenBucket
from gpud.service.intake import MAX_DRAIN, Intake
from gpud.service.peers import SESSIONLESS_BOXES, Outboxes
from gpud_protocol.reader import SocketReader

KiB = 1 << 10


def test_a_token_bucket_spends_its_burst_then_refills_at_its_rate() -> None:
    bucket = TokenBucket(rate=8.0, burst=8.0, now=100.0)
    assert all(bucket.take(100.0) for _ in range(8))
    assert not bucket.take(100.0)
    assert bucket.full_at() == 101.0
    assert bucket.take(100.125) and not bucket.take(100.125)  # one token per eighth of a second
    assert sum(bucket.take(200.0) for _ in range(50)) == 8  # never more than the burst, however long it waited


def test_each_peer_has_its_own_budget() -> None:
    budget = SessionlessBudget(rate=5.0, total_rate=1000.0)
    assert [budget.peer(b"flooder", 0.0) for _ in range(7)] == [True] * 5 + [False] * 2
    assert budget.peer(b"other", 0.0)  # the flooder spent only its own
    assert budget.peer(b"flooder", 0.2) and not budget.peer(b"flooder", 0.2)
    assert budget.dropped == 3  # counted, for `gpud stats` and the metrics


def test_the_shared_budget_bounds_all_peers_together() -> None:
    budget = SessionlessBudget(rate=100.0, total_rate=3.0)
    assert [budget.total(0.0) for _ in range(4)] == [True, True, True, False]
    assert budget.total(0.5) and budget.dropped == 1


def test_garbage_leaves_no_state_behind() -> None:
    """The table forgets a peer once its bucket has refilled, and never holds more than its bound."""
    budget = SessionlessBudget(rate=10.0, total_rate=1000.0, max_peers=8)
    for i in range(100):
        budget.peer(i.to_bytes(4, "big"), 0.0)
    assert len(budget) == 8
    for _ in range(20):  # one flooder, over its budget
        budget.peer(b"flooder", 0.0)
    assert len(budget) == 8
    budget.peer(b"later", 10.0)  # long after: every bucket is full again, so forgotten
    assert len(budget) == 1


# --------------------------------------------------------------------------- outboxes


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    """A ROUTER and a connected DEALER (identity b"peer") that never reads, with the smallest queues."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.SNDHWM, 1)
    dealer.setsockopt(zmq.RCVHWM, 1)
    dealer.setsockopt(zmq.ROUTING_ID, b"peer")
    router.bind("inproc://outboxes")
    dealer.connect("inproc://outboxes")
    dealer.send(b"hi")
    assert router.recv_multipart() == [b"peer", b"hi"]
    try:
        yield router, dealer
    finally:
        router.close(linger=0)
        dealer.close(linger=0)
        ctx.term()


def test_replies_to_a_peer_without_a_session_are_bounded_and_dropped(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    router, _dealer = pair
    stuck: list[tuple[bytes, str]] = []
    outboxes = Outboxes(router, lambda: None, lambda i, why: stuck.append((i, why)), 1 << 30, 60.0, 64 * KiB)
    reply = [b"x" * (10 * KiB)]
    for _ in range(50):
        outboxes.send(b"peer", reply, sessionless=True)
    stats = outboxes.stats()
    assert 0 < stats["sessionless_bytes_waiting"] <= 64 * KiB
    assert stats["sessionless_most_bytes_waiting"] == stats["sessionless_bytes_waiting"]  # one peer
    assert stats["bytes_waiting"] == stats["sessionless_bytes_waiting"]
    assert stats["sessionless_replies_dropped"] >= 50 - 2 - 6  # two in ZeroMQ's queues, six in the outbox
    assert not stuck  # dropping replies ends nothing

    outboxes.send(b"peer", reply)  # the peer said hello: its box follows a session's rules from now on
    assert outboxes.stats()["sessionless_bytes_waiting"] == 0
    assert outboxes.stats()["bytes_waiting"] > 64 * KiB
    outboxes.drop(b"peer")
    assert outboxes.stats()["bytes_waiting"] == 0 and not outboxes


def test_all_peers_without_a_session_share_a_bound(pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    router, _dealer = pair
    outboxes = Outboxes(router, lambda: None, lambda i, why: None, 1 << 30, 60.0, 64 * KiB)
    while not outboxes:  # until ZeroMQ's queues are full and a reply waits in the outbox
        outboxes.send(b"peer", [b"x" * (60 * KiB)], sessionless=True)
    assert outboxes.sessionless_waiting == 60 * KiB
    others = SESSIONLESS_BOXES * 64 * KiB - 61 * KiB  # as if other peers held all but a KiB
    outboxes.sessionless_waiting += others
    outboxes.send(b"peer", [b"x" * KiB], sessionless=True)  # fits, just
    outboxes.send(b"peer", [b"x"], sessionless=True)
    assert outboxes.sessionless_dropped == 1
    outboxes.drop(b"peer")
    assert outboxes.sessionless_waiting == others


# --------------------------------------------------------------------------- the receive loop's slices


async def test_a_slice_is_bounded_and_yields_to_the_loop_when_the_socket_stays_full() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router, flooder, other = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    try:
        router.bind("inproc://intake")
        flooder.connect("inproc://intake")
        other.connect("inproc://intake")
        for i in range(MAX_DRAIN + 100):
            flooder.send(b"%d" % i)
        other.send(b"me too")
        intake = Intake(SocketReader(router))
        before = intake.caught_up()
        ran: list[str] = []
        asyncio.get_running_loop().call_soon(ran.append, "the rest of the daemon")
        messages = await intake.next_slice()
        assert ran  # a message was waiting, yet the loop had its turn first
        assert len(messages) == MAX_DRAIN
        assert [b"me too"] in [[bytes(f) for f in frames] for _, frames in messages]  # ZeroMQ reads peers in turn
        assert intake.caught_up() > before  # a peer read twice: every peer's waiting message was read
        rest = await intake.next_slice()
        assert len(rest) == 101  # what is left, then the socket ran dry
    finally:
        for sock in (router, flooder, other):
            sock.close(linger=0)
        ctx.term()


async def test_a_failed_send_does_not_hide_a_waiting_message_from_the_reader() -> None:
    """A send that fails (the peer's queue is full) processes the socket's commands, which can take
    the edge that announced an incoming message: the outbox must poke the reader after every send,
    or the receive loop sleeps while a message waits (a flooder that does not read stalled others)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router, stuck, other = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    try:
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.SNDHWM, 1)
        stuck.setsockopt(zmq.RCVHWM, 1)
        stuck.setsockopt(zmq.ROUTING_ID, b"stuck")
        router.bind("inproc://edge")
        stuck.connect("inproc://edge")
        other.connect("inproc://edge")
        stuck.send(b"hello")
        reader = SocketReader(router)
        outboxes = Outboxes(router, reader.poke, lambda i, why: None, 1 << 30, 60.0)
        assert (await reader.recv())[0].bytes == b"stuck"
        while not outboxes:  # the stuck peer's queues are full: its replies wait in the outbox
            outboxes.send(b"stuck", [b"reply"])
        waiting = asyncio.ensure_future(reader.recv())
        await asyncio.sleep(0.05)  # the socket is empty: the reader waits for its descriptor
        other.send(b"ping")
        outboxes.retry()  # fails (EAGAIN), after the message's arrival was signalled
        frames = await asyncio.wait_for(waiting, 5)
        assert frames[-1].bytes == b"ping"
    finally:
        for sock in (router, stuck, other):
            sock.close(linger=0)
        ctx.term()


async def test_a_busy_polling_slice_takes_a_message_that_arrives_while_it_polls() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        router.bind("inproc://busy")
        dealer.connect("inproc://busy")
        intake = Intake(SocketReader(router), busy_poll_us=100_000)
        asyncio.get_running_loop().call_later(0.01, dealer.send, b"late")
        messages = await asyncio.wait_for(intake.next_slice(), 5)
        assert [[bytes(f) for f in frames] for _, frames in messages] == [[b"late"]]
    finally:
        router.close(linger=0)
        dealer.close(linger=0)
        ctx.term()

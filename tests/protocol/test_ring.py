"""The shared-memory ring (gpud_protocol.ring): records in order across the wrap, bounds, and every
way a hostile peer can lie about indices or records."""

from __future__ import annotations

import mmap
import random
import struct
from collections.abc import Iterator

import pytest

from gpud_protocol import ring as R

CAPACITY = 4096


@pytest.fixture
def segment() -> Iterator[mmap.mmap]:
    mm = mmap.mmap(-1, R.segment_bytes(CAPACITY))
    R.format_segment(mm, CAPACITY)
    yield mm


def pair(segment: mmap.mmap, requests: bool = True, max_message: int = 1 << 20) -> tuple[R.Ring, R.Ring]:
    return (
        R.Ring(segment, requests=requests, producer=True, max_message=max_message),
        R.Ring(segment, requests=requests, producer=False, max_message=max_message),
    )


def frames_of(message: list[R.RingFrame]) -> list[bytes]:
    return [bytes(frame.buffer) for frame in message]


def test_messages_arrive_whole_and_in_order_across_the_wrap(segment: mmap.mmap) -> None:
    producer, consumer = pair(segment)
    rnd = random.Random(7)
    sent: list[list[bytes]] = []
    for _ in range(3000):
        message = [rnd.randbytes(rnd.randint(0, 700)) for _ in range(rnd.randint(1, 4))]
        if producer.produce(message):
            sent.append(message)
        if rnd.random() < 0.6 and (got := consumer.consume()) is not None:
            assert frames_of(got) == sent.pop(0)
    while (got := consumer.consume()) is not None:
        assert frames_of(got) == sent.pop(0)
    assert not sent and not consumer.pending()
    assert producer.get_slot(R.REQUEST_WRITTEN) > 20 * CAPACITY  # wrapped many times


def test_the_two_directions_are_independent(segment: mmap.mmap) -> None:
    requests, request_reader = pair(segment, requests=True)
    replies, reply_reader = pair(segment, requests=False)
    assert requests.produce([b"to the daemon"]) and replies.produce([b"to the client", b"data"])
    assert frames_of(reply_reader.consume() or []) == [b"to the client", b"data"]
    assert frames_of(request_reader.consume() or []) == [b"to the daemon"]


def test_a_full_ring_and_a_large_message_are_refused_not_lost(segment: mmap.mmap) -> None:
    producer, consumer = pair(segment, max_message=1000)
    assert not producer.produce([bytes(1001)])  # past max_message: the caller uses ZeroMQ
    assert producer.max_message == 1000
    count = 0
    while producer.produce([bytes(900)]):
        count += 1
    assert count == CAPACITY // 912  # 8-byte head + 4-byte length + 900, padded to 912
    assert frames_of(consumer.consume() or []) == [bytes(900)]
    assert producer.produce([bytes(900)])  # room again once the consumer moved on


def test_max_message_is_at_most_half_the_ring(segment: mmap.mmap) -> None:
    producer, _ = pair(segment, max_message=1 << 30)
    assert producer.max_message == CAPACITY // 2


def test_what_the_consumer_returns_is_a_private_copy(segment: mmap.mmap) -> None:
    producer, consumer = pair(segment)
    producer.produce([b"A" * 64])
    got = consumer.consume()
    assert got is not None
    segment[R.HEADER_BYTES : R.HEADER_BYTES + CAPACITY] = bytes(CAPACITY)  # the peer scribbles afterwards
    assert frames_of(got) == [b"A" * 64]


def _set(segment: mmap.mmap, slot: int, value: int) -> None:
    struct.pack_into("<Q", segment, 8 * slot, value)


@pytest.mark.parametrize("written", [CAPACITY + 8, 1 << 63, 16 - 8])
def test_a_producer_index_out_of_reach_is_corrupt(segment: mmap.mmap, written: int) -> None:
    producer, consumer = pair(segment)
    producer.produce([b"x"])
    consumer.consume()  # read up to 16
    _set(segment, R.REQUEST_WRITTEN, 16 + written)
    if written == 16 - 8:
        _set(segment, R.REQUEST_WRITTEN, 8)  # behind what was read
    with pytest.raises(R.RingCorrupt):
        consumer.consume()


@pytest.mark.parametrize(
    ("body", "count"),
    [(0, 0), (8, 0), (4, 2), (1 << 31, 1), (CAPACITY, 1), (40, R.MAX_FRAMES + 1)],
)
def test_a_record_head_that_lies_is_corrupt(segment: mmap.mmap, body: int, count: int) -> None:
    _, consumer = pair(segment, max_message=CAPACITY // 2)
    struct.pack_into("<II", segment, R.HEADER_BYTES, body, count)
    _set(segment, R.REQUEST_WRITTEN, 64)
    with pytest.raises(R.RingCorrupt):
        consumer.consume()


def test_frame_lengths_that_do_not_add_up_are_corrupt(segment: mmap.mmap) -> None:
    producer, consumer = pair(segment)
    producer.produce([b"abcd", b"efgh"])
    struct.pack_into("<I", segment, R.HEADER_BYTES + 8, 5)  # first frame claims 5 bytes
    with pytest.raises(R.RingCorrupt):
        consumer.consume()


def test_a_consumer_index_that_moves_back_or_ahead_is_corrupt(segment: mmap.mmap) -> None:
    producer, consumer = pair(segment)
    producer.produce([b"one"])
    consumer.consume()
    assert producer.produce([b"two"])  # the producer has now seen the consumer at 16
    _set(segment, R.REQUEST_READ, 0)  # behind what it had read
    with pytest.raises(R.RingCorrupt):
        producer.produce([b"three"])
    _set(segment, R.REQUEST_READ, 1 << 40)  # ahead of anything written
    with pytest.raises(R.RingCorrupt):
        producer.produce([b"three"])


def test_a_segment_that_is_not_a_ring_is_refused() -> None:
    mm = mmap.mmap(-1, R.segment_bytes(CAPACITY))
    with pytest.raises(R.RingCorrupt, match="not a gpud ring"):
        R.Ring(mm, requests=True, producer=False, max_message=1024)
    R.format_segment(mm, CAPACITY)
    _set(mm, 1, 1 << 40)  # a request capacity past the segment
    with pytest.raises(R.RingCorrupt, match="does not fit"):
        R.Ring(mm, requests=True, producer=False, max_message=1024)
    mm.close()  # nothing of the refused rings holds the mapping


def test_a_released_ring_lets_its_mapping_close(segment: mmap.mmap) -> None:
    producer, consumer = pair(segment)
    producer.release()
    consumer.release()
    segment.close()

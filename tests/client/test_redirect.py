"""The client follows a process-per-device front's redirect at most once: a second redirect (from the
worker it was sent to), or a malformed one, is a protocol error. A stand-in daemon answers here."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

import gpud_client
import gpud_protocol as proto
from gpud_client import ProtocolError

Answer = Callable[[str], bytes]  # the stand-in's own address -> its answer to a hello


class StandIn(threading.Thread):
    """A ROUTER that answers every hello with `answer(its address)` until stopped."""

    def __init__(self, address: str, answer: Answer) -> None:
        super().__init__(daemon=True)
        self.address, self.answer = address, answer
        self.hellos = 0
        self._stop_event = threading.Event()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(address)

    def run(self) -> None:
        while not self._stop_event.is_set():
            if not self._sock.poll(50):
                continue
            identity, frame, *_ = self._sock.recv_multipart()
            if proto.decode_client_message([frame], proto.DEFAULT_LIMITS).__class__ is proto.Hello:
                self.hellos += 1
                self._sock.send_multipart([identity, self.answer(self.address)])

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)
        self._sock.close(linger=0)
        self._ctx.term()


@pytest.fixture
def stand_in(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StandIn]:
    server = StandIn(f"ipc://{tmp_path}/front.sock", request.param)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("stand_in", [lambda own: proto.encode_redirect(own, 0)], indirect=True)
async def test_a_second_redirect_is_a_protocol_error(stand_in: StandIn) -> None:
    with pytest.raises(ProtocolError, match="unexpected redirect"):
        async with gpud_client.connect(stand_in.address, timeout=5):
            pass
    assert stand_in.hellos == 2  # the front's hello, then the worker's: no third


@pytest.mark.parametrize(
    "stand_in", [lambda _own: proto.pack({"t": "redirect", "address": "tcp://h:1", "device": 0})], indirect=True
)
async def test_a_bad_redirect_is_a_protocol_error(stand_in: StandIn) -> None:
    with pytest.raises(ProtocolError, match="bad redirect"):
        async with gpud_client.connect(stand_in.address, timeout=5):
            pass

"""The redirect (a process-per-device front's answer to hello): its round trip and every check of its fields."""

from __future__ import annotations

from typing import Any

import pytest

import gpud_protocol as proto
from gpud_protocol import ProtocolViolation
from gpud_protocol.redirect import MAX_ADDRESS_LEN

LIMITS = proto.DEFAULT_LIMITS


def _decoded(frame: bytes, *payload: bytes) -> proto.Redirect:
    header, frames = proto.decode_server_message([frame, *payload], LIMITS)
    assert header["t"] == "redirect"
    return proto.decode_redirect(header, frames, LIMITS)


def test_a_redirect_round_trips() -> None:
    frame = proto.encode_redirect("ipc:///run/gpud/gpud.sock.dev1", 1)
    assert _decoded(frame) == proto.Redirect("ipc:///run/gpud/gpud.sock.dev1", 1)


def _raw(**fields: Any) -> bytes:
    return proto.pack({"t": "redirect", "address": "ipc:///tmp/x.sock", "device": 0, **fields})


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"address": None}, "ipc:// address"),
        ({"address": 5}, "ipc:// address"),
        ({"address": ["ipc:///tmp/x"]}, "ipc:// address"),
        ({"address": "tcp://10.0.0.1:5555"}, "ipc:// address"),
        ({"address": "ipc://"}, "no path"),
        ({"address": "ipc:///tmp/a\x00b"}, "no path"),
        ({"address": "ipc:///" + "a" * MAX_ADDRESS_LEN}, "ipc:// address"),
        ({"device": None}, "device index"),
        ({"device": -1}, "device index"),
        ({"device": LIMITS.max_devices}, "device index"),
        ({"device": True}, "device index"),
        ({"device": 1.0}, "device index"),
        ({"device": "1"}, "device index"),
    ],
)
def test_a_bad_redirect_is_refused(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ProtocolViolation, match=match):
        _decoded(_raw(**fields))


def test_a_redirect_carries_no_frames() -> None:
    with pytest.raises(ProtocolViolation, match="no frames"):
        _decoded(_raw(), b"payload")


def test_the_longest_ipc_path_passes() -> None:
    address = "ipc://" + "/" + "a" * (MAX_ADDRESS_LEN - 7)
    assert len(address) == MAX_ADDRESS_LEN
    assert _decoded(_raw(address=address)).address == address

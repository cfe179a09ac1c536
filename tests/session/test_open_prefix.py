"""`open_prefix` in process on the fake backend: handles past the protocol's largest are refused.

The i-th match opens as handle `handle + i`; a range that passed `max_handle` opened handles that no
later op could name (the codec refuses them), not even a free, so they stayed until the session ended.
"""

from __future__ import annotations

from typing import Any

from runtime.test_runtime import make

import gpud_protocol as proto
from gpud.session.session import Session
from gpud.session.tensors import Handle
from session.test_graph_build import Daemon, Settings

MAX = proto.DEFAULT_LIMITS.max_handle


def _batch(*ops: Any) -> proto.Batch:
    return proto.Batch(list(ops), (), [], 0, False)


async def test_open_prefix_refuses_handles_past_max_handle() -> None:
    rt, _ = make()
    daemon = Daemon(rt)
    replies: list[dict[str, object]] = []
    session = Session(
        "s1",
        "t",
        lambda f: replies.append(proto.decode_server_message(f, proto.DEFAULT_LIMITS)[0]),
        daemon,
        Settings(),
        0,
    )
    session.receive(
        _batch(
            proto.Alloc(1, 1, "float32", (4,), 0),
            proto.Alloc(2, 2, "float32", (4,), 0),
            proto.Publish(3, 1, "p/a", "ro"),
            proto.Publish(4, 2, "p/b", "ro"),
        )
    )
    session.receive(_batch(proto.OpenPrefix(5, MAX, "p/")))
    await rt.synchronize()
    assert replies and replies[-1]["ok"] is False, replies
    err: list[object] = replies[-1]["err"]  # type: ignore[assignment]
    code, message, seq, op = err
    assert (code, seq, op) == (proto.ErrorCode.INVALID_ARGUMENT, 5, "open_prefix"), replies[-1]
    assert str(MAX) in str(message) and "nothing was opened" in str(message)
    assert not any(h >= MAX for h in session.handles)
    session.receive(_batch(proto.OpenPrefix(6, MAX - 1, "p/")))  # the last handle is MAX: allowed
    await rt.synchronize()
    assert replies[-1]["ok"] is True and isinstance(session.handles[MAX], Handle), replies[-1]
    session.close()
    daemon.residents.clear()
    await rt.close()

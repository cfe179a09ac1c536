"""Many resident tensors at once: `gpu.open_prefix(prefix)` and `gpu.residents(prefix)`, one round
trip each, seeing exactly what `gpu.open(name)` would open (every published name, in its mode)."""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING, NamedTuple

import gpud_protocol as proto
from gpud_client.dtypes import host_dtype
from gpud_client.errors import InvalidArgument
from gpud_client.tensor import Tensor

if TYPE_CHECKING:
    from gpud_client.client_base import ClientBase

PER_REPLY = proto.RESIDENTS_PER_REPLY  # names one open_prefix opens, or one residents() lists, at most
_NAME = re.compile(r"[A-Za-z0-9_.:/-]*")


class Resident(NamedTuple):
    """A published tensor, as `gpu.residents()` lists it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    mode: str  # "ro" | "rw": how other sessions open it
    nbytes: int
    device: int


def check_name(name: str, limit: int, op: str, what: str = "name", *, empty: bool = False) -> None:
    """Refuse at the call what the daemon would refuse: 1-`limit` of [A-Za-z0-9_.:/-] (0 for a prefix)."""
    if not isinstance(name, str) or len(name) > limit or not _NAME.fullmatch(name) or not (name or empty):
        shown = repr(name[:80]) if isinstance(name, str) else type(name).__name__
        raise InvalidArgument(
            f"{what}: {shown} is not a resident name ({'0' if empty else '1'}-{limit} of [A-Za-z0-9_.:/-])", op=op
        )


async def open_prefix(client: ClientBase, prefix: str) -> dict[str, Tensor]:
    check_name(prefix, client.limits.max_name_len, "open_prefix", "prefix", empty=True)
    first = next(client._handles)
    client._handles = itertools.count(first + PER_REPLY)  # the daemon numbers the handles from `first`
    seq = client._next_seq()
    client._queue(proto.OpenPrefix(seq, first, prefix), request=seq)
    header, _ = await client._connection.request(seq)
    opened = {}
    for name, handle, dtype, shape, mode, device in header["tensors"]:
        tensor = Tensor(client, int(handle), host_dtype(dtype), tuple(shape), int(device), mode)
        opened[name[len(prefix) :]] = tensor
    return opened


async def residents(client: ClientBase, prefix: str = "", after: str = "") -> list[Resident]:
    check_name(prefix, client.limits.max_name_len, "residents", "prefix", empty=True)
    check_name(after, client.limits.max_name_len, "residents", "after", empty=True)
    seq = client._next_seq()
    client._queue(proto.ListResidents(seq, prefix, after), request=seq)
    header, _ = await client._connection.request(seq)
    return [
        Resident(name, dtype, tuple(shape), mode, int(nbytes), int(device))
        for name, dtype, shape, mode, nbytes, device in header["residents"]
    ]

"""`gpu.load_safetensors`: a checkpoint into resident tensors, streamed from a memory map.

Each tensor is allocated once and filled part by part (`UploadPart`), each part a chunk of the map
converted to the tensor's dtype: the client never holds a copy of the file, nor of a whole tensor,
and waits for the daemon every `FLUSH_BYTES` so that at most that much is in flight. Nothing is
published until every tensor is uploaded; a failure anywhere frees what the call made and
unpublishes what it published, then raises, naming the tensor.
"""

from __future__ import annotations

import asyncio
import bisect
import os
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from gpud_client.dtypes import is_bfloat16
from gpud_client.errors import DaemonLost, GpudError, InvalidArgument, SessionLost
from gpud_client.loaders.safetensors import FLOAT_TARGETS, Entry, FormatError, chunks, read_header
from gpud_client.residents import check_name
from gpud_client.uploads import PartSender, part_bytes, queue_part
from gpud_protocol.limits import DTYPE_SIZES
from gpud_protocol.schema import RESIDENT_MODES

if TYPE_CHECKING:
    from collections.abc import Sequence

    import gpud_protocol as proto
    from gpud_client.tensor import Tensor

OP = "load_safetensors"
CHUNK_BYTES = 16 << 20
FLUSH_BYTES = 128 << 20


class LoadingClient(PartSender, Protocol):
    """What the loader needs of the client (gpud_client.client.Client)."""

    @property
    def limits(self) -> proto.Limits: ...

    @property
    def _last_seq(self) -> int: ...

    async def flush(self) -> None: ...

    def empty(self, shape: int | Sequence[int], dtype: Any = "float32", *, device: int | None = None) -> Tensor: ...

    def publish(self, tensor: Tensor, name: str, mode: str = "ro") -> None: ...

    def unpublish(self, name: str) -> None: ...


async def load_safetensors(
    client: LoadingClient,
    path: str | os.PathLike[str],
    prefix: str = "",
    dtype: Any = None,
    mode: str = "ro",
    *,
    device: int | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> dict[str, Tensor]:
    target = _target(dtype)
    if mode not in RESIDENT_MODES:
        raise InvalidArgument(f"mode must be one of {RESIDENT_MODES}, not {mode!r}", op=OP)
    if not isinstance(chunk_bytes, int) or chunk_bytes < 4:
        raise InvalidArgument(f"chunk_bytes must be an int of at least 4, not {chunk_bytes!r}", op=OP)
    size = part_bytes(client.limits, chunk_bytes)
    with open(path, "rb") as file:  # the header and the data are read from one file, whatever the path names later
        try:
            entries = read_header(file, client.limits.max_ndim)
        except FormatError as exc:
            raise InvalidArgument(f"{path}: {exc}", op=OP) from None
        data = np.memmap(file, np.uint8, mode="r") if any(e.nbytes for e in entries) else None
    for entry in entries:
        check_name(prefix + entry.name, client.limits.max_name_len, OP, f"{path}: tensor {entry.name[:80]!r}")
        nbytes = entry.elements * DTYPE_SIZES[entry.loads_as(target)]
        if nbytes > client.limits.max_tensor_bytes:
            raise InvalidArgument(
                f"{path}: tensor {entry.name!r} loads as {nbytes} bytes, more than the daemon's "
                f"{client.limits.max_tensor_bytes} per tensor",
                op=OP,
            )
    await client.flush()  # an earlier failure of the session is raised now, not taken for one of ours
    loader = _Loader(client, path, entries)
    try:
        await loader.upload(data, target, size, device)
        await loader.publish(prefix, mode)
    except GpudError as exc:
        await loader.undo(exc)
        raise loader.named(exc) from exc
    except BaseException:  # cancelled: give back what was made, without waiting
        loader.free()
        raise
    return loader.tensors


def _target(dtype: Any) -> str | None:
    if dtype is None:
        return None
    try:
        name = "bfloat16" if is_bfloat16(dtype) else str(np.dtype(dtype).name)
    except TypeError:
        name = str(dtype)
    if name not in FLOAT_TARGETS:
        raise InvalidArgument(f"dtype= converts floating-point tensors to one of {FLOAT_TARGETS}, not {dtype!r}", op=OP)
    return name


class _Loader:
    def __init__(self, client: LoadingClient, path: str | os.PathLike[str], entries: list[Entry]) -> None:
        self.client = client
        self.path = path
        self.entries = entries
        self.tensors: dict[str, Tensor] = {}
        self._firsts: list[int] = []  # the first seq of each tensor's ops, in order
        self._names: list[str] = []
        self._publishes: dict[int, str] = {}  # seq of each publish -> the full name
        self._published: dict[int, str] = {}  # those not unpublished yet

    async def upload(self, data: np.memmap[Any, Any] | None, target: str | None, size: int, device: int | None) -> None:
        client = self.client
        end = max((e.start + e.nbytes for e in self.entries), default=0)
        if data is not None and data.size < end:
            raise InvalidArgument(f"{self.path}: the file is shorter than its header says (changed since?)", op=OP)
        pending = 0
        for entry in self.entries:
            self._firsts.append(client._last_seq + 1)
            self._names.append(entry.name)
            loaded = entry.loads_as(target)
            tensor = self.tensors[entry.name] = client.empty(entry.shape, loaded, device=device)
            if data is None or not entry.nbytes:
                continue
            for offset, chunk in chunks(data, entry, loaded, size):
                queue_part(client, tensor, offset, chunk)
                pending += len(chunk)
                if pending >= FLUSH_BYTES:  # the daemon copied what it executed: bounded memory here
                    await client.flush()
                    pending = 0
        await client.flush()

    async def publish(self, prefix: str, mode: str) -> None:
        client = self.client
        for name, tensor in self.tensors.items():
            client.publish(tensor, prefix + name, mode)
            self._publishes[client._last_seq] = self._published[client._last_seq] = prefix + name
        if errors := await _drain(client):
            failed = {error.seq for error in errors}
            for seq, name in self._published.items():
                if seq not in failed:
                    client.unpublish(name)
            self._published.clear()
            raise errors[0]

    async def undo(self, first: GpudError) -> None:
        """After `first`: the failures still to come are this call's (each op after a failed one may
        fail too), so they are read here, not left to the caller's next request."""
        if isinstance(first, DaemonLost | SessionLost):
            return  # the session is gone, and what it held with it
        self.free()
        await asyncio.shield(_drain(self.client))

    def free(self) -> None:
        for name in self._published.values():
            self.client.unpublish(name)
        self._published.clear()
        for tensor in self.tensors.values():
            tensor.free()

    def named(self, exc: GpudError) -> GpudError:
        """`exc` naming the call, the file and the tensor whose op failed."""
        where = str(self.path)
        if exc.seq in self._publishes:
            where += f": publishing {self._publishes[exc.seq]!r}"
        elif exc.seq is not None and (index := bisect.bisect_right(self._firsts, exc.seq) - 1) >= 0:
            where += f": tensor {self._names[index]!r}"
        message = f"{where}: {exc.op or 'an op'} failed: {exc.message} (nothing of this load was kept)"
        return type(exc)(message, seq=exc.seq, op=OP)


async def _drain(client: LoadingClient, bound: int = 1 << 20) -> list[GpudError]:
    """Await flushes until one succeeds: each failure not yet reported comes back once, in order."""
    errors: list[GpudError] = []
    for _ in range(bound):
        try:
            await client.flush()
            return errors
        except (DaemonLost, SessionLost):
            raise
        except GpudError as exc:
            errors.append(exc)
    return errors

"""What every call of the client API uses: the connection, sequence numbers and handles, the op
queue, argument encoding, the session's info and the plain requests (sync, flush, stats)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

import gpud_protocol as proto
from gpud_client import packing
from gpud_client.dtypes import HostDType, host_dtype
from gpud_client.errors import GpudError, InvalidArgument, OutOfMemory
from gpud_client.geometries import dense_geometry
from gpud_client.liveness import Connection
from gpud_client.memo import Memo
from gpud_client.pool import Key, Origin, Pool, default_bytes
from gpud_client.scope import Scope
from gpud_client.tensor import Tensor, output
from gpud_client.traces import Trace
from gpud_client.values import F32, I32, TENSOR, U32, Scalar
from gpud_protocol.ops import TensorInfo
from gpud_protocol.wire import pack

# An op output's (device, dtype name, shape) -> what every output of a step repeats: its host dtype, its bytes,
# its Alloc's packed dtype, shape and device, the key itself (for its origins to share), its strides and info
Kind = tuple[HostDType, int, bytes, Key, tuple[tuple[int, ...], TensorInfo]]
_outputs: Memo[Key, Kind] = Memo(4096)
# what every output's Alloc and every op's dispatch packs, as globals of this module (no attribute of another's)
_pack_fast, _ALLOC, _DISPATCH, _TENSOR_ARG = packing.pack_fast, packing.ALLOC, packing.DISPATCH, packing.TENSOR_ARG
_new_tuple = tuple.__new__


def _output_kind(key: Key) -> Kind:
    device, dtype, shape = key
    nbytes = math.prod(shape) * proto.DTYPE_SIZES[dtype]
    return host_dtype(dtype), nbytes, packing.alloc_tail(dtype, shape, device), key, dense_geometry(dtype, shape)


class ClientBase:
    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._seqs = itertools.count(1)
        self._handles = itertools.count(1)
        self._dispatches = proto.DispatchEncoder()
        self._scopes: dict[Any, list[Scope]] = {}  # the open scopes of each task, innermost last
        self._pool = Pool(default_bytes(connection.welcome.get("memory_quota")))  # freed op outputs (gpud_client.pool)
        self._allocs = 0  # Alloc messages sent
        self._frees = 0  # Free messages sent
        connection.on_failure = self._on_failure

    # ------------------------------------------------------------------ info

    @property
    def address(self) -> str:
        return self._connection.address

    @property
    def welcome(self) -> dict[str, Any]:
        return self._connection.welcome

    @property
    def limits(self) -> proto.Limits:
        return self._connection.limits

    @property
    def backend(self) -> str:
        return str(self.welcome.get("backend", ""))

    @property
    def session_id(self) -> str:
        return str(self.welcome.get("session", ""))

    @property
    def devices(self) -> list[dict[str, Any]]:
        """What the daemon serves, one dict per device (index, name, memory...)."""
        return list(self.welcome.get("devices", []))

    @property
    def device(self) -> int:
        """This session's default device (chosen at connect, or the least loaded one)."""
        return int(self.welcome.get("device", 0))

    @property
    def ring(self) -> bool:
        """This session uses the shared-memory fast path (`connect(ring=True)`)."""
        return self._connection.ring is not None

    @property
    def last_trace(self) -> Trace | None:
        return self._connection.last_trace

    @property
    def _last_seq(self) -> int:
        """The sequence number of the op queued last (tests use it to check which op an error names)."""
        return self._seq_last

    # ------------------------------------------------------------------ requests

    async def sync(self) -> None:
        """Wait until the device has finished all work this session queued."""
        await self._simple_request(proto.Sync)

    async def flush(self) -> None:
        """Send queued ops and return once the daemon executed them (no wait for the GPU)."""
        await self._simple_request(proto.FlushOp)

    async def stats(self) -> dict[str, Any]:
        header = await self._simple_request(proto.Stats)
        stats: dict[str, Any] = header["stats"]
        return stats

    async def _simple_request(self, op: type[Any]) -> dict[str, Any]:
        seq = self._next_seq()
        self._queue(op(seq), request=seq)
        header, _ = await self._connection.request(seq)
        return header

    def upload(self, tensor: Tensor, array: Any) -> None:
        """Queue a host-to-device copy of `array` into `tensor` (gpud_client.client.Client's)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ plumbing

    def _next_seq(self) -> int:
        seq = self._seq_last = next(self._seqs)
        return seq

    def _handle_of(self, tensor: Tensor) -> int:
        """The handle of `tensor`'s memory (a view's base's), checked to be usable here."""
        if not isinstance(tensor, Tensor):
            raise InvalidArgument(f"expected a gpud Tensor, got {type(tensor).__name__}")
        if tensor._client is not self or tensor.freed:
            raise InvalidArgument(f"{tensor!r} is freed (or a view of a freed tensor) or belongs to another connection")
        return tensor.handle

    def _ref_of(self, tensor: Tensor) -> int | proto.TensorView:
        """How a tensor operand travels: its handle, or a view's `TensorView`."""
        self._handle_of(tensor)
        return tensor.ref

    def _arg(self, value: Any) -> tuple[int, int | float | proto.TensorView]:
        if isinstance(value, Tensor):
            return (TENSOR, self._ref_of(value))
        if isinstance(value, Scalar):
            return (value.kind, value.value)
        if isinstance(value, bool):
            raise InvalidArgument("bool is not a kernel argument; pass i32(int(flag))")
        if isinstance(value, float | np.floating):
            return (F32, float(value))
        if isinstance(value, np.unsignedinteger):
            return (U32, int(value))
        if isinstance(value, int | np.integer):
            return (I32, int(value))
        raise InvalidArgument(f"cannot pass {type(value).__name__} to a kernel")

    def _queue(self, op: proto.Op, request: int | None = None) -> None:
        self._queue_packed(proto.encode_op(op), request)

    def _queue_packed(self, body: bytes, request: int | None = None) -> None:
        connection = self._connection
        if connection.lost is not None:
            raise connection.lost
        if connection.queue.add(body, request):
            connection.send_batch()

    def _new(self, shape: tuple[int, ...], dtype: str, device: int | None, host: HostDType | None = None) -> Tensor:
        """A new tensor, without the checks of `empty`: `dtype` is a supported dtype's name and `device`
        one of the daemon's (None: the session's default) — the op library's outputs. `host`: the
        tensor's `.dtype` (default: the one `dtype` names)."""
        where = self.device if device is None else device
        handle = next(self._handles)
        seq = self._seq_last = next(self._seqs)
        self._queue_packed(packing.alloc(seq, handle, dtype, shape, where))
        self._allocs += 1
        return Tensor(self, handle, host_dtype(dtype) if host is None else host, shape, where, dtype_name=dtype)

    # ------------------------------------------------------------------ the pool of op outputs

    def _output(self, shape: tuple[int, ...], dtype: str, device: int | None) -> Tensor:
        """An op-library call's output: a pooled handle of exactly this device, dtype and shape, else a
        new tensor (`_new`). Either way freeing it pools it (gpud_client.pool)."""
        where = self.device if device is None else device
        pool = self._pool
        if pool.dropped:
            self._collect()
        key = (where, dtype, shape)
        kind = _outputs.get(key) or _outputs.keep(key, _output_kind(key))
        got = pool.take(kind[3])  # the key the pool holds: found by identity
        if got is None:  # `_new`'s Alloc (its dtype, shape and device packed once, in `kind`)
            handle = next(self._handles)
            seq = self._seq_last = next(self._seqs)
            packed = _pack_fast(handle)
            connection = self._connection  # `_queue_packed`, inlined
            if connection.lost is not None:
                raise connection.lost
            if connection.queue.add(b"".join((_ALLOC, _pack_fast(seq), packed, kind[2])), None):
                connection.send_batch()
            self._allocs += 1
            # Origin(...) without the call of its Python __new__
            origin = _new_tuple(Origin, (kind[3], seq, kind[1], (TENSOR, handle), _TENSOR_ARG + packed))
        else:
            handle, origin = got
        return output(self, handle, kind[0], shape, where, dtype, origin, kind[4])

    def _release(self, handle: int, origin: Origin | None) -> None:
        """The memory of a freed tensor: pooled when it is an op output, else (or when it does not fit) freed."""
        if origin is not None and self._connection.lost is None:
            evicted = self._pool.put(handle, origin)
            if evicted is None:  # its allocation was refused: no handle to free
                return
            for h in evicted:  # `handle` among them when it does not fit
                self._free_handle(h)
            return
        self._free_handle(handle)

    def _free_handle(self, handle: int) -> None:
        self._queue_packed(packing.free(self._next_seq(), handle))
        self._frees += 1

    def _hold(self, tensor: Tensor) -> None:
        """The daemon will hold `tensor`'s memory past the ops queued so far (published, or recorded into a
        replay graph): never pool it."""
        tensor.base._origin = None

    def _collect(self) -> None:
        """Pool the op outputs Python dropped unfreed (`Tensor.__del__`)."""
        dropped = self._pool.dropped
        while dropped:
            handle, origin = dropped.popleft()
            if self._connection.lost is None:  # else the session, and its handles, are gone
                self._release(handle, origin)

    def trim(self) -> int:
        """Free every pooled op output now (queued like `t.free()`: the daemon takes them off the session's
        memory in op order, before anything queued later); the bytes released."""
        self._collect()
        released = self._pool.nbytes
        for handle in self._pool.clear():
            self._free_handle(handle)
        return released

    def set_pool_limits(self, max_bytes: int, max_entries: int) -> None:
        """Bound the pool of freed op outputs (default a quarter of the session's memory quota, at
        least 1 GiB, and 1,024 tensors; 0 turns pooling off), freeing what no longer fits, the least
        recently pooled first."""
        if max_bytes < 0 or max_entries < 0:
            raise InvalidArgument(f"pool limits are not negative: {max_bytes} bytes, {max_entries} entries")
        for handle in self._pool.limit(int(max_bytes), int(max_entries)):
            self._free_handle(handle)

    def pool_stats(self) -> dict[str, int]:
        """The pool of freed op outputs: entries and bytes held, hits and misses of op-library outputs,
        evictions; and the Alloc and Free messages this client sent (every tensor's)."""
        self._collect()
        pool = self._pool
        return {
            "entries": len(pool),
            "bytes": pool.nbytes,
            "hits": pool.hits,
            "misses": pool.misses,
            "evictions": pool.evictions,
            "allocs": self._allocs,
            "frees": self._frees,
        }

    def _on_failure(self, seq: int, op: str, error: GpudError) -> None:
        """A failed op, reported by the daemon (before the caller sees it): a refused allocation's handle
        is never pooled; on OutOfMemory the pool is released first, so that a retry is not refused for
        memory the pool held."""
        if op == "alloc":
            self._pool.failed(seq)
        if isinstance(error, OutOfMemory) and self._connection.lost is None:
            self.trim()

    def _queue_launch(
        self, kernel: bytes, head: bytes, tail: bytes, tensors: Sequence[Any], made: bytes, op: str
    ) -> None:
        """Queue a dispatch of `kernel` (its handle, packed) whose grid and argument count are packed in
        `head`, and its scalar arguments (and writes) in `tail` (gpud_client.packing); `tensors` are its
        tensor arguments, then `made` (packed: an output just made, the last tensor argument, if any).
        The dispatch is the op-library call `op`: its failure names it (`Rpc.name_op`)."""
        parts = [_DISPATCH, b"", kernel, head]
        for t in tensors:
            if type(t) is Tensor and t._client is self and not t._freed and not (t._base and t._base._freed):
                parts.append(t._packed)
            else:  # refused here (freed, of another connection, not a tensor), or a Tensor subclass
                parts.append(pack(self._arg(t)))
        parts.append(made)
        parts.append(tail)
        seq = self._seq_last = next(self._seqs)
        parts[1] = _pack_fast(seq)
        connection = self._connection  # `_queue_packed`, inlined: every op's dispatch comes here
        if connection.lost is not None:
            raise connection.lost
        if connection.queue.add(b"".join(parts), None):
            connection.send_batch()
        connection.name_op(seq, op)

    _seq_last = 0

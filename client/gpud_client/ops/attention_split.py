"""Attention with the keys split over workgroups (attention_<q>_<kv> then attention_combine): every
backend's kernel for a decode step against a KV cache, and for what no one-pass kernel takes."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

from gpud_client.dtypes import dtype_name
from gpud_client.errors import InvalidArgument
from gpud_client.ops.base import Launch, OpsBase, info_of, of_rows, signed
from gpud_client.scope import disown
from gpud_protocol import LruCache
from gpud_protocol.ops import OpError, TensorInfo, grid_1d
from gpud_protocol.ops.attention import (
    DTYPES,
    MAX_LOOP,
    MAX_SPLITS,
    OUT_DTYPES,
    SHORT,
    TILE,
    attention_rows,
    key_mask_mode,
    mask_mode,
    mixes_halves,
)
from gpud_protocol.ops.attention_cluster import cluster_grid, cluster_kernel

if TYPE_CHECKING:
    from gpud_client.client_base import ClientBase
    from gpud_client.tensor import Tensor

SPLIT_TARGET = 1024  # workgroups an attention aims for when it splits the keys: enough for a big GPU
MAX_AUTO_SPLITS = 64
SCRATCH_KEPT = 8  # attention scratch tensors kept (one per shape and device); past it the least recent is freed

ScratchKey = tuple[tuple[int, ...], str, int]


class SplitPlan(NamedTuple):
    """A split attention's call, checked: its output's and its scratch's shapes, and its two dispatches;
    combine None: one dispatch into the output, the splits merged in a cluster (`attention_cluster`)."""

    shape: tuple[int, ...]
    dtype: str  # the output's
    part: tuple[int, ...]
    first: Launch
    combine: Launch | None


class SplitAttentionOps(OpsBase):
    def __init__(self, client: ClientBase) -> None:
        super().__init__(client)
        # Reused across calls: the daemon runs one client's ops on a device in order, so the next call's
        # writes come after this call's reads. A fresh tensor per call would be a new handle every step.
        self._scratches: LruCache[ScratchKey, Tensor] = LruCache(SCRATCH_KEPT, lambda _key, t: t.free())
        # the scratch `_scratch` returned last, by its key: the cache's most recent entry (a hit needs no reordering)
        self._last_scratch_key: ScratchKey | None = None
        self._last_scratch: Tensor | None = None

    def _scratch(self, shape: tuple[int, ...], dtype: str, device: int) -> Tensor:
        key = (shape, dtype, device)
        tensor = self._last_scratch
        if key == self._last_scratch_key and tensor is not None and not tensor._freed:
            return tensor  # the most recent scratch again (every layer's attention): already the cache's newest
        tensor = self._scratches.get(key)
        if tensor is None or tensor._freed:  # (a tensor of its own memory: no base to be freed)
            tensor = self._client._new(tuple(int(d) for d in shape), dtype, device)  # `gpu.empty`, unchecked
            disown(self._client, tensor)  # kept across calls: a scope freeing it would make one per call
            self._scratches.put(key, tensor)
        self._last_scratch_key, self._last_scratch = key, tensor
        return tensor

    def _attention(
        self,
        op: str,
        q: Any,
        k: Any,
        v: Any,
        pos: Any,
        mask: Any,
        causal: bool,
        scale: float | None,
        splits: int | None,
        out: Any,
        graph: Any,
        key_mask: Any = None,
    ) -> Any:
        infos: tuple[TensorInfo | None, ...]
        try:  # `info_of` of each operand (None: not given), inlined
            infos = (
                q.info,
                k.info,
                v.info,
                None if pos is None else pos.info,
                None if mask is None else mask.info,
                None if key_mask is None else key_mask.info,
                None if out is None else out.info,
            )
        except AttributeError:
            infos = tuple([None if t is None else info_of(t) for t in (q, k, v, pos, mask, key_mask, out)])
        per_row = of_rows(graph)
        key = (op, *infos, bool(causal), signed(scale), per_row, splits)
        try:  # `_plan`'s lookup, inlined
            plan: SplitPlan | None = self._plans.get(key)
        except TypeError:
            plan = None
        if plan is None:
            plan = self._plan(
                key, self._plan_attention, op, q, k, v, pos, mask, causal, scale, splits, out, key_mask, per_row
            )
        return self._split(plan, q, k, v, pos, mask if key_mask is None else key_mask, out, graph)

    def _split(self, plan: SplitPlan, q: Any, k: Any, v: Any, pos: Any, mask: Any, out: Any, graph: Any) -> Any:
        """Run a split attention's plan: its first dispatch into the scratch, then the combine into the
        output. `mask`: the additive mask or the key mask, whichever was given."""
        tensors = [q, k, v, q if pos is None else pos, q if mask is None else mask]  # q stands in: not read
        if plan.combine is None:  # one launch: no scratch
            result = self._out(out, plan.shape, plan.dtype, q, graph)
            self._launch(plan.first, [*tensors, result], graph, fresh=out is None)
            return result
        if graph is not None:
            part = graph.empty(plan.part, "float32")
        else:
            part = self._scratch(plan.part, "float32", int(q.device))
            if out is None:  # a new output: `_execute`'s way, both dispatches queued here
                client = self._client
                result = client._output(plan.shape, plan.dtype, q.device)
                first, combine = plan.first, plan.combine
                kernels = self._packed_kernels
                # the first writes part, this client's scratch (no input); the combine reads part and writes the
                # output just made: neither is a tensor of the caller's to check (`_queue_dispatch`, inlined)
                kernel = kernels.get(first.name) or self._packed_kernel(first.name)
                client._queue_launch(kernel, first.head, first.tail, tensors, part._packed, first.op)
                kernel = kernels.get(combine.name) or self._packed_kernel(combine.name)
                made = part._packed + result._packed
                client._queue_launch(kernel, combine.head, combine.tail, (), made, combine.op)
                return result
        result = self._out(out, plan.shape, plan.dtype, q, graph)
        self._launch(plan.first, [*tensors, part], graph, fresh=True)  # part: this client's scratch, no input
        self._launch(plan.combine, [part, result], graph, fresh=out is None)
        return result

    def _plan_attention(
        self,
        op: str,
        q: Any,
        k: Any,
        v: Any,
        pos: Any,
        mask: Any,
        causal: bool,
        scale: float | None,
        splits: int | None,
        out: Any,
        key_mask: Any,
        per_row: bool = False,
    ) -> SplitPlan:
        qd, kd = dtype_name(q), dtype_name(k)
        if qd not in DTYPES or kd not in DTYPES:
            raise InvalidArgument(f"{op}: float32, float16 or bfloat16 q, k and v, not {qd} and {kd}")
        if mixes_halves(qd, kd):
            raise InvalidArgument(
                f"{op}: q is {qd} and k, v {kd}, which no kernel mixes (nor torch); cast one to the other's "
                f"dtype first, e.g. gpu.ops.cast(q, '{kd}')",
                op=op,
            )
        if (op == "attention" and len(q.shape) != 4) or len(k.shape) != 4:
            raise InvalidArgument(f"{op}: q is {list(q.shape)} and k {list(k.shape)}: see the shapes in the docs")
        try:
            batch, steps, heads, dim = attention_rows(TensorInfo(qd, tuple(q.shape)))
            mode = (
                0
                if mask is None
                else mask_mode(TensorInfo(dtype_name(mask), tuple(mask.shape)), batch, steps, k.shape[1])
            )
            if key_mask is not None:
                mode, mask = key_mask_mode(tensor_info(key_mask), batch, k.shape[1]), key_mask
        except OpError as exc:
            raise InvalidArgument(f"{op}: {exc}") from None
        keys, kv_heads = k.shape[1], k.shape[2]
        shape = tuple(q.shape)
        if min(*shape, *k.shape) < 1:
            raise InvalidArgument(f"{op}: an empty dimension in q {list(shape)} or k {list(k.shape)}")
        rows = batch * steps * heads
        if splits is None:  # in a graph of rows, by a row's own shape: the sums' order is the row's alone
            tiles, filled = -(-keys // TILE), steps * heads if per_row else rows
            splits = max(1, min(tiles, MAX_AUTO_SPLITS, -(-SPLIT_TARGET // filled)), -(-tiles // MAX_LOOP))
        elif not 1 <= splits <= MAX_SPLITS:
            raise InvalidArgument(f"{op}: splits {splits} is not in 1 .. {MAX_SPLITS}")
        if scale is None:
            scale = 1.0 / math.sqrt(dim)
        part = TensorInfo("float32", (*shape[:-1], splits, dim + 2))  # per row and split: max, sum, D weighted sums
        dtype = out_dtype(op, q, out)
        _check_out(op, out, dtype, shape)
        result = TensorInfo(dtype, shape) if out is None else out
        sizes = [batch, steps, keys, heads, kv_heads, dim, splits, int(causal), mode, int(pos is not None)]
        tensors = [q, k, v, q if pos is None else pos, q if mask is None else mask]
        clustered = cluster_kernel(splits, rows, qd, kd, dtype) if self._clusters(q, splits) else None
        if clustered is not None:  # the splits merged in a cluster: the same bits, one launch
            first = self._check(clustered, cluster_grid(rows, splits), [*tensors, result], [*sizes, scale])
            return SplitPlan(shape, dtype, part.shape, first, None)
        tensors.append(part)
        first = self._check(f"attention_{SHORT[qd]}_{SHORT[kd]}", grid_1d(rows * splits, 1), tensors, [*sizes, scale])
        n = math.prod(shape)
        combine = self._check(f"attention_combine_{SHORT[dtype]}", grid_1d(n), [part, result], [n, dim, splits])
        return SplitPlan(shape, dtype, part.shape, first, combine)

    def _clusters(self, like: Any, splits: int) -> bool:
        """Whether the device of `like` runs attention_cluster's kernels at `splits`: a CUDA device, and
        for clusters of more than one block compute capability 9.0 or later."""
        if self._client.backend != "cuda":
            return False
        if splits == 1:
            return True
        return tuple(int(p) for p in self._capability(like).split(".") if p.isdigit()) >= (9, 0)

    def _result(self, op: str, q: Any, shape: tuple[int, ...], out: Any, graph: Any) -> Any:
        """attention's output: `out` (checked), else a new tensor of q's dtype."""
        dtype = out_dtype(op, q, out)
        _check_out(op, out, dtype, shape)
        return self._out(out, shape, dtype, q, graph)


def _check_out(op: str, out: Any, dtype: str, shape: tuple[int, ...]) -> None:
    if out is not None and tuple(out.shape) != shape:
        raise InvalidArgument(f"{op}: out is {dtype}{list(out.shape)}, not {dtype}{list(shape)}", op=op)


def out_dtype(op: str, q: Any, out: Any) -> str:
    """The dtype attention writes: out's, else q's (as torch's SDPA). InvalidArgument past OUT_DTYPES."""
    dtype = dtype_name(q if out is None else out)
    if dtype not in OUT_DTYPES:
        raise InvalidArgument(f"{op}: out is {dtype}; attention writes float32, float16 or bfloat16", op=op)
    return dtype


def tensor_info(t: Any) -> TensorInfo:
    return TensorInfo(dtype_name(t), tuple(int(n) for n in t.shape))

"""Attention ops for decoder-only transformers: embedding, rotary, kv_append, attention_decode (one
step against a KV cache) and attention (full sequence: prefill, encoders).

Positions are a device tensor `pos` (B,) int32 (element (b, t) of a step is at position pos[b] + t),
never a scalar: record a decode step once into a replay graph with `pos` as a graph input, and replay
it per token.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpud_client.dtypes import name_of
from gpud_client.errors import InvalidArgument
from gpud_client.ops.base import OpsBase, dtype_name, same_memory
from gpud_client.scope import disown
from gpud_protocol import ArgKind, LruCache
from gpud_protocol.ops import OpError, TensorInfo, grid_1d
from gpud_protocol.ops.attention import (
    DTYPES,
    ID_MODES,
    MAX_LOOP,
    MAX_SPLITS,
    OUT_DTYPES,
    SHORT,
    STORED,
    STYLES,
    TILE,
    attention_rows,
    flash_applies,
    flash_grid,
    flash_name,
    key_mask_mode,
    mask_mode,
    mixes_halves,
    rotary_freq,
)
from gpud_protocol.ops.attention_cpu import cpu_applies, cpu_grid
from gpud_protocol.ops.attention_tiled import tiled_applies, tiled_grid, tiled_width

if TYPE_CHECKING:
    from gpud_client.client import Client
    from gpud_client.tensor import Tensor

SPLIT_TARGET = 1024  # workgroups an attention aims for when it splits the keys: enough for a big GPU
MAX_AUTO_SPLITS = 64
SCRATCH_KEPT = 8  # attention scratch tensors kept (one per shape and device); past it the least recent is freed

ScratchKey = tuple[tuple[int, ...], str, int]


class AttentionOps(OpsBase):
    def __init__(self, client: Client) -> None:
        super().__init__(client)
        # Reused across calls: the daemon runs one client's ops on a device in order, so the next call's
        # writes come after this call's reads. A fresh tensor per call would be a new handle every step.
        self._scratches: LruCache[ScratchKey, Tensor] = LruCache(SCRATCH_KEPT, lambda _key, t: t.free())

    def _scratch(self, shape: tuple[int, ...], dtype: str, device: int) -> Tensor:
        key = (shape, dtype, device)
        tensor = self._scratches.get(key)
        if tensor is None or tensor.freed:
            tensor = self._client.empty(shape, dtype, device=device)
            disown(self._client, tensor)  # kept across calls: a scope freeing it would make one per call
            self._scratches.put(key, tensor)
        return tensor

    def embedding(self, ids: Any, table: Any, *, dtype: str = "float32", out: Any = None, graph: Any = None) -> Any:
        """table[ids]: ids (...) int32, uint32, int64 or uint64 (a tokenizer's int64 ids as they are), table
        (V, D) float32, float16 or bfloat16 -> (..., D) in `dtype` (any of the three). An id outside
        0 .. V-1 (negative, or past the table) gives a row of zeros."""
        td, od, ids_dtype = dtype_name(table), name_of(dtype), dtype_name(ids)
        if ids_dtype not in ID_MODES:
            raise InvalidArgument(f"embedding: ids are {ids_dtype}, not int32, uint32, int64 or uint64", op="embedding")
        if td not in STORED or od not in STORED:
            raise InvalidArgument(f"embedding: a table and dtype of {list(STORED)}, not {td} -> {od}")
        if len(table.shape) != 2:
            raise InvalidArgument(f"embedding: the table is {list(table.shape)}, not (V, D)")
        rows, dim = tuple(table.shape)
        shape = (*tuple(ids.shape), dim)
        result = self._out(out, shape, od, table, graph)
        n = math.prod(shape)
        scalars = [n, dim, rows, ID_MODES[ids_dtype]]
        self._run(f"embedding_{SHORT[td]}_{SHORT[od]}", grid_1d(n), [ids, table, result], scalars, graph)
        return result

    def rotary(
        self,
        x: Any,
        pos: Any,
        *,
        style: str = "neox",
        base: float = 10000.0,
        out: Any = None,
        graph: Any = None,
    ) -> Any:
        """Rotary position embedding of x (B, T, H, D) (float32, float16 or bfloat16, D even): element (b, t)
        is at position pos[b] + t (pos (B,) int32). style "neox" rotates the pairs (j, j + D/2)
        (HF Llama, Qwen), "gptj" the pairs (2j, 2j+1); pair j turns by position * base^(-2j/D).
        Returns a new tensor, or `out`; `out=x` rotates x in place (a kernel that binds x read-write
        only: allowed on every backend), except a graph input while pos is an input too (a graph's
        inputs share one buffer)."""
        dtype = dtype_name(x)
        if dtype not in STORED:
            raise InvalidArgument(f"rotary: x is {dtype}, not one of {list(STORED)}")
        if style not in STYLES:
            raise InvalidArgument(f"rotary: style is one of {sorted(STYLES)}, not {style!r}")
        if not (math.isfinite(base) and base > 0):
            raise InvalidArgument(f"rotary: base {base} is not a positive number")
        if len(x.shape) != 4 or x.shape[3] % 2 or x.shape[3] == 0:
            raise InvalidArgument(f"rotary: x is {list(x.shape)}, not (B, T, H, D) with D even")
        _batch, steps, heads, dim = tuple(x.shape)
        hi, lo = rotary_freq(float(base), dim)
        pairs = math.prod(x.shape) // 2
        scalars = [pairs, steps, heads, dim, STYLES[style], hi, lo]
        if out is not None and same_memory(out, x):
            if _graph_input(x) and _graph_input(pos):
                raise InvalidArgument(
                    "rotary: in place on a graph input, with pos another input: a graph's inputs share one "
                    "buffer, which WebGPU cannot bind read-write and read-only in one dispatch; rotate into a "
                    "new tensor (out=None)"
                )
            self._run(f"rotary_inplace_{SHORT[dtype]}", grid_1d(pairs), [x, pos], scalars, graph)
            return out
        result = self._out(out, tuple(x.shape), dtype, x, graph)
        self._run(f"rotary_{SHORT[dtype]}", grid_1d(pairs), [x, pos, result], scalars, graph)
        return result

    def kv_append(self, cache: Any, x: Any, pos: Any, *, graph: Any = None) -> None:
        """cache[b, pos[b] + t] = x[b, t] (cast to the cache's dtype when stored): cache (B, L, H, D)
        and x (B, T, H, D), float32, float16 or bfloat16 each; pos (B,) int32. A position outside 0 .. L-1
        is dropped; nothing else of the cache is touched."""
        cd, xd = dtype_name(cache), dtype_name(x)
        if cd not in STORED or xd not in STORED:
            raise InvalidArgument(f"kv_append: a cache and x of {list(STORED)}, not {cd} and {xd}")
        if len(x.shape) != 4 or len(cache.shape) != 4:
            raise InvalidArgument(f"kv_append: x {list(x.shape)} and the cache {list(cache.shape)} must be 4-D")
        n = math.prod(x.shape)
        sizes = [n, x.shape[1], cache.shape[1], x.shape[2] * x.shape[3]]
        self._run(f"kv_append_{SHORT[cd]}_{SHORT[xd]}", grid_1d(n), [x, pos, cache], sizes, graph)

    def attention_decode(
        self,
        q: Any,
        k_cache: Any,
        v_cache: Any,
        pos: Any,
        *,
        scale: float | None = None,
        splits: int | None = None,
        out: Any = None,
        graph: Any = None,
    ) -> Any:
        """One decode step: q (B, Hq, D) against caches (B, L, Hkv, D) (Hq % Hkv == 0; query head h
        reads KV head h // (Hq / Hkv)), attending over cache positions 0 .. pos[b] (the new token's
        keys appended before); pos (B,) int32. A pos[b] past L - 1 attends over the whole cache, a
        negative one over nothing (zeros). q float32, float16 or bfloat16, caches too (both alike; not
        float16 with bfloat16), D <= 256; scale defaults to 1/sqrt(D). Returns (B, Hq, D) in q's dtype,
        or writes `out` (float32, float16 or bfloat16).
        q may also be (B, T, Hq, D): a chunk of T new tokens, query t seeing positions 0 .. pos[b] + t.
        `splits`: how many workgroups share a row's keys (default: enough to fill a GPU)."""
        return self._attention("attention_decode", q, k_cache, v_cache, pos, None, False, scale, splits, out, graph)

    def attention(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        causal: bool = False,
        mask: Any = None,
        key_mask: Any = None,
        scale: float | None = None,
        splits: int | None = None,
        out: Any = None,
        graph: Any = None,
    ) -> Any:
        """Full-sequence attention: q (B, T, Hq, D), k and v (B, S, Hkv, D) (GQA as in
        attention_decode). causal: query t sees the keys s <= t + (S - T). mask: an additive float32
        mask (T, S) for every batch row (leading dims of 1 allowed), or one per batch row (B, T, S)
        or (B, 1, T, S); a value <= -1e30 (-inf, float32's minimum) hides its key. key_mask: a
        padding mask (B, S) (uint8, int32, int64 or float32), nonzero where a key takes part
        (Hugging Face's attention_mask); not together with mask. A query that sees no key gives
        zeros. q, k, v: float32, float16 or bfloat16 (k and v alike; not float16 with bfloat16). Returns
        (B, T, Hq, D) in q's dtype (as torch's SDPA), or writes `out` (float32, float16 or bfloat16).
        On CUDA, float16 (or bfloat16) q, k and v with D 32, 64 or 128 and no additive mask run the flash
        kernel (tensor cores, one pass; `splits` does not apply): P is rounded to q's dtype as flash
        attention does, so results are within about 1e-3 of exact for float16 (2^-8 of |v| for bfloat16),
        not 1e-5. On WebGPU, D up to 256 runs one pass
        in which blocks of query rows share tiles of keys (attention_tiled), unless `splits` is given or
        a few query rows face many keys (then, as elsewhere, the keys are split over workgroups)."""
        if mask is not None and key_mask is not None:
            raise InvalidArgument("attention: pass mask or key_mask, not both (fold the key mask into the mask)")
        backend = self._client.backend
        if mask is None and backend == "cuda" and _flash_fits(q, k, v, key_mask, out):
            grid = flash_grid(*(int(n) for n in q.shape[:3]))
            name = flash_name(int(q.shape[-1]), dtype_name(q), _out_dtype("attention", q, out))
            return self._one_pass(name, grid, q, k, v, key_mask, bool(causal), scale, out, graph)
        if backend == "webgpu" and splits is None and _tiled_fits(q, k, v, out):
            grid = tiled_grid(*(int(n) for n in q.shape))
            dtypes = "_".join(SHORT[d] for d in (dtype_name(q), dtype_name(k), _out_dtype("attention", q, out)))
            name = f"attention_tiled_d{tiled_width(int(q.shape[-1]))}_{dtypes}"
            if self._software(q) and _cpu_fits(q, k, v, out, mask is not None):  # lavapipe: no barriers
                batch, steps, heads, dim = (int(n) for n in q.shape)
                name, grid = f"attention_cpu_d{dim}_{dtypes}", cpu_grid(batch, steps, heads)
            masks = mask if key_mask is None else key_mask
            return self._one_pass(name, grid, q, k, v, masks, bool(causal), scale, out, graph, key_mask is None)
        return self._attention("attention", q, k, v, None, mask, bool(causal), scale, splits, out, graph, key_mask)

    def _one_pass(
        self,
        name: str,
        grid: tuple[int, int, int],
        q: Any,
        k: Any,
        v: Any,
        mask: Any,
        causal: bool,
        scale: float | None,
        out: Any,
        graph: Any,
        additive: bool = False,
    ) -> Any:
        """A one-pass kernel (q, k, v, mask, out): `mask` a key mask (B, S), or an additive one if `additive`."""
        batch, steps, heads, dim = (int(n) for n in q.shape)
        shape = (batch, steps, heads, dim)
        mode = 0
        if mask is not None:
            try:
                info, keys = _tensor_info(mask), int(k.shape[1])
                mode = mask_mode(info, batch, steps, keys) if additive else key_mask_mode(info, batch, keys)
            except OpError as exc:
                raise InvalidArgument(f"attention: {exc}") from None
        result = self._result("attention", q, shape, out, graph)
        sizes = [batch, steps, int(k.shape[1]), heads, int(k.shape[2]), dim, int(causal), mode]
        scalars = [*sizes, 1.0 / math.sqrt(dim) if scale is None else scale]
        tensors = [q, k, v, q if mask is None else mask, result]  # q stands in for no mask: not read
        self._run(name, grid, tensors, scalars, graph)
        return result

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
                mode, mask = key_mask_mode(_tensor_info(key_mask), batch, k.shape[1]), key_mask
        except OpError as exc:
            raise InvalidArgument(f"{op}: {exc}") from None
        keys, kv_heads = k.shape[1], k.shape[2]
        shape = tuple(q.shape)
        if min(*shape, *k.shape) < 1:
            raise InvalidArgument(f"{op}: an empty dimension in q {list(shape)} or k {list(k.shape)}")
        rows = batch * steps * heads
        if splits is None:
            tiles = -(-keys // TILE)
            splits = max(1, min(tiles, MAX_AUTO_SPLITS, -(-SPLIT_TARGET // rows)), -(-tiles // MAX_LOOP))
        elif not 1 <= splits <= MAX_SPLITS:
            raise InvalidArgument(f"{op}: splits {splits} is not in 1 .. {MAX_SPLITS}")
        if scale is None:
            scale = 1.0 / math.sqrt(dim)
        part_shape = (*shape[:-1], splits, dim + 2)  # per row and split: max, sum, D weighted sums
        if graph is not None:
            part = graph.empty(part_shape, "float32")
        else:
            part = self._scratch(part_shape, "float32", int(q.device))
        result = self._result(op, q, shape, out, graph)
        sizes = [batch, steps, keys, heads, kv_heads, dim, splits, int(causal), mode, int(pos is not None)]
        tensors = [q, k, v, q if pos is None else pos, q if mask is None else mask, part]  # q stands in: not read
        self._run(f"attention_{SHORT[qd]}_{SHORT[kd]}", grid_1d(rows * splits, 1), tensors, [*sizes, scale], graph)
        n = math.prod(shape)
        combine = f"attention_combine_{SHORT[dtype_name(result)]}"
        self._run(combine, grid_1d(n), [part, result], [n, dim, splits], graph)
        return result

    def _result(self, op: str, q: Any, shape: tuple[int, ...], out: Any, graph: Any) -> Any:
        """attention's output: `out` (checked), else a new tensor of q's dtype."""
        dtype = _out_dtype(op, q, out)
        if out is not None and tuple(out.shape) != shape:
            raise InvalidArgument(f"{op}: out is {dtype}{list(out.shape)}, not {dtype}{list(shape)}", op=op)
        return self._out(out, shape, dtype, q, graph)


def _out_dtype(op: str, q: Any, out: Any) -> str:
    """The dtype attention writes: out's, else q's (as torch's SDPA). InvalidArgument past OUT_DTYPES."""
    dtype = dtype_name(q if out is None else out)
    if dtype not in OUT_DTYPES:
        raise InvalidArgument(f"{op}: out is {dtype}; attention writes float32, float16 or bfloat16", op=op)
    return dtype


def _tensor_info(t: Any) -> TensorInfo:
    return TensorInfo(dtype_name(t), tuple(int(n) for n in t.shape))


def _flash_fits(q: Any, k: Any, v: Any, key_mask: Any, out: Any) -> bool:
    """Whether the flash kernel computes this attention into `out` (CUDA; checked there against its spec)."""
    mask = None if key_mask is None else _tensor_info(key_mask)
    return flash_applies(_tensor_info(q), _tensor_info(k), dtype_name(v), mask, dtype_name(q if out is None else out))


def _tiled_fits(q: Any, k: Any, v: Any, out: Any) -> bool:
    """Whether attention_tiled computes this attention into `out` (WebGPU; checked there against its spec)."""
    return tiled_applies(_tensor_info(q), _tensor_info(k), dtype_name(v), dtype_name(q if out is None else out))


def _cpu_fits(q: Any, k: Any, v: Any, out: Any, additive: bool) -> bool:
    """Whether attention_cpu computes this attention (a software adapter's; checked there against its spec)."""
    out_dtype = dtype_name(q if out is None else out)
    return cpu_applies(_tensor_info(q), _tensor_info(k), dtype_name(v), out_dtype, additive)


def _graph_input(t: Any) -> bool:
    return hasattr(t, "graph") and getattr(t, "kind", None) == ArgKind.INPUT

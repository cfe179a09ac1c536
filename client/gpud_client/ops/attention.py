"""Attention ops: attention_decode (one step against a KV cache) and attention (full sequence:
prefill, encoders). A full attention runs a one-pass kernel where one takes it (CUDA's flash kernel,
WebGPU's tiled one, a software adapter's CPU one), else the split one (gpud_client.ops.attention_split).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from gpud_client.dtypes import dtype_name
from gpud_client.errors import InvalidArgument
from gpud_client.ops.attention_split import SplitAttentionOps, SplitPlan, out_dtype, tensor_info
from gpud_client.ops.base import of_rows, signed
from gpud_protocol.ops import OpError
from gpud_protocol.ops.attention import SHORT, key_mask_mode, mask_mode
from gpud_protocol.ops.attention_cpu import cpu_applies, cpu_grid
from gpud_protocol.ops.attention_flash import flash_applies, flash_grid, flash_name
from gpud_protocol.ops.attention_tiled import tiled_applies, tiled_grid, tiled_width


class OnePassPlan(NamedTuple):
    """A full attention that a one-pass kernel computes: the kernel and its grid, and on WebGPU the CPU
    kernel's where that one takes the call too (run where q lives on a software adapter: lavapipe)."""

    name: str
    grid: tuple[int, int, int]
    cpu: tuple[str, tuple[int, int, int]] | None


class AttentionOps(SplitAttentionOps):
    # the last full attention's key and plan (a SplitPlan or a OnePassPlan): the same signature again (every
    # layer's) is one comparison
    _last_attention: tuple[Any, Any] = (None, None)

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
        `splits`: how many workgroups share a row's keys (default: enough to fill a GPU; in a graph of
        rows, enough for one row's heads, so that a row's sums run in one order in every instance)."""
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
        padding mask (B, S) (bool, uint8, int32, int64 or float32), nonzero where a key takes part
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
        masks = mask if key_mask is None else key_mask
        key: tuple[Any, ...] | None = None
        if (scale is None or type(scale) is float) and (splits is None or type(splits) is int):
            try:  # the call's kernels, kept by its operands' infos and parameters (`_attention`'s key)
                key = (
                    "attention",
                    q.info,
                    k.info,
                    v.info,
                    None,
                    None if mask is None else mask.info,
                    None if key_mask is None else key_mask.info,
                    None if out is None else out.info,
                    bool(causal),
                    scale if scale is None else signed(scale),
                    of_rows(graph),
                    splits,
                )
                last = self._last_attention
                if key == last[0]:  # the last call's signature again (every layer's): no hash of the key
                    plan = last[1]
                else:
                    plan = self._plans.get(key)
                    if plan is not None:
                        self._last_attention = (key, plan)
            except (AttributeError, TypeError):  # a recording's operand, an unhashable parameter: the long way
                key = plan = None
            if type(plan) is SplitPlan:  # the split kernels: no one-pass kernel takes this call
                return self._split(plan, q, k, v, None, masks, out, graph)
            if plan is not None:  # a one-pass kernel's
                name, grid = plan.cpu if plan.cpu is not None and self._software(q) else (plan.name, plan.grid)
                return self._one_pass(name, grid, q, k, v, masks, bool(causal), scale, out, graph, key_mask is None)
        backend = self._client.backend
        if mask is None and backend == "cuda" and _flash_fits(q, k, v, key_mask, out):
            grid = flash_grid(*(int(n) for n in q.shape[:3]))
            name = flash_name(int(q.shape[-1]), dtype_name(q), out_dtype("attention", q, out))
            one_pass = OnePassPlan(name, grid, None)  # (masks: the key mask if any, so not `additive`)
        elif backend == "webgpu" and splits is None and _tiled_fits(q, k, v, out):
            grid = tiled_grid(*(int(n) for n in q.shape))
            dtypes = "_".join(SHORT[d] for d in (dtype_name(q), dtype_name(k), out_dtype("attention", q, out)))
            name = f"attention_tiled_d{tiled_width(int(q.shape[-1]))}_{dtypes}"
            cpu = None
            if _cpu_fits(q, k, v, out, mask is not None):  # on lavapipe (no barriers), where q lives there
                batch, steps, heads, dim = (int(n) for n in q.shape)
                cpu = (f"attention_cpu_d{dim}_{dtypes}", cpu_grid(batch, steps, heads))
            one_pass = OnePassPlan(name, grid, cpu)
        else:
            return self._attention("attention", q, k, v, None, mask, bool(causal), scale, splits, out, graph, key_mask)
        if key is not None:
            self._plans.keep(key, one_pass)
        if one_pass.cpu is not None and self._software(q):
            name, grid = one_pass.cpu
        return self._one_pass(name, grid, q, k, v, masks, bool(causal), scale, out, graph, key_mask is None)

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
                info, keys = tensor_info(mask), int(k.shape[1])
                mode = mask_mode(info, batch, steps, keys) if additive else key_mask_mode(info, batch, keys)
            except OpError as exc:
                raise InvalidArgument(f"attention: {exc}") from None
        result = self._result("attention", q, shape, out, graph)
        sizes = [batch, steps, int(k.shape[1]), heads, int(k.shape[2]), dim, int(causal), mode]
        scalars = [*sizes, 1.0 / math.sqrt(dim) if scale is None else scale]
        tensors = [q, k, v, q if mask is None else mask, result]  # q stands in for no mask: not read
        self._run(name, grid, tensors, scalars, graph)
        return result


def _flash_fits(q: Any, k: Any, v: Any, key_mask: Any, out: Any) -> bool:
    """Whether the flash kernel computes this attention into `out` (CUDA; checked there against its spec)."""
    mask = None if key_mask is None else tensor_info(key_mask)
    return flash_applies(tensor_info(q), tensor_info(k), dtype_name(v), mask, dtype_name(q if out is None else out))


def _tiled_fits(q: Any, k: Any, v: Any, out: Any) -> bool:
    """Whether attention_tiled computes this attention into `out` (WebGPU; checked there against its spec)."""
    return tiled_applies(tensor_info(q), tensor_info(k), dtype_name(v), dtype_name(q if out is None else out))


def _cpu_fits(q: Any, k: Any, v: Any, out: Any, additive: bool) -> bool:
    """Whether attention_cpu computes this attention (a software adapter's; checked there against its spec)."""
    written = dtype_name(q if out is None else out)
    return cpu_applies(tensor_info(q), tensor_info(k), dtype_name(v), written, additive)

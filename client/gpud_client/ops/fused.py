"""Fused decode ops: a decoder layer's residual add and norm, its gated activation, and the split,
rotation and caching of its q/k/v, each one launch instead of two to four (gpud_protocol.ops.fused).

A step that uses them computes q, k and v with one matmul (the three weights stacked, rows q then k
then v) and gate and up with another (gate then up): see `gpud.testing.transformer`.
"""

from __future__ import annotations

import math
from typing import Any

from gpud_client.dtypes import dtype_name
from gpud_client.errors import InvalidArgument
from gpud_client.ops.base import OpsBase
from gpud_protocol.ops import OpError, grid_1d
from gpud_protocol.ops.attention import STYLES, rotary_freq
from gpud_protocol.ops.fused import DTYPES, SHORT, per_word, rotary_kv_shapes
from gpud_protocol.ops.reduce import rows_and_length


class FusedOps(OpsBase):
    def add_rmsnorm(
        self,
        x: Any,
        r: Any,
        weight: Any,
        eps: float = 1e-6,
        *,
        out: Any = None,
        sum_out: Any = None,
        graph: Any = None,
    ) -> tuple[Any, Any]:
        """(x + r, rmsnorm(x + r) * weight): the residual stream's sum (stored in x's dtype, and
        normalised as stored) and its norm, in one launch. x and r of one shape and dtype (float32,
        float16 or bfloat16), weight (L,) of any of the three; the last axis even for 16-bit x."""
        xd, wd = dtype_name(x), dtype_name(weight)
        if xd not in DTYPES or wd not in DTYPES or dtype_name(r) != xd:
            raise InvalidArgument(
                f"x and r of one dtype of {list(DTYPES)}, weight of any: not {xd}, {dtype_name(r)}, {wd}",
                op="add_rmsnorm",
            )
        if tuple(r.shape) != tuple(x.shape):
            raise InvalidArgument(f"x is {list(x.shape)} and r {list(r.shape)}: not one shape", op="add_rmsnorm")
        if not (isinstance(eps, int | float) and math.isfinite(eps) and eps >= 0):
            raise InvalidArgument(f"eps must be finite and >= 0, not {eps!r}", op="add_rmsnorm")
        try:
            rows, length = rows_and_length(tuple(x.shape))
        except OpError as exc:
            raise InvalidArgument(str(exc), op="add_rmsnorm") from None
        shape = tuple(x.shape)
        total = self._out(sum_out, shape, xd, x, graph)
        normed = self._out(out, shape, xd, x, graph)
        grid = grid_1d(rows, 1)
        self._run(
            f"add_rmsnorm_{SHORT[xd]}_{SHORT[wd]}",
            grid,
            [x, r, weight, total, normed],
            [rows, length, float(eps)],
            graph,
        )
        return total, normed

    def silu_and_mul(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        """silu(x[..., :W]) * x[..., W:] for x (..., 2W) (vLLM's silu_and_mul: gate and up from one
        matmul), float32, float16 or bfloat16 -> (..., W) of x's dtype; W even for 16-bit x."""
        dtype = dtype_name(x)
        if dtype not in DTYPES:
            raise InvalidArgument(f"x is {dtype}, not one of {list(DTYPES)}", op="silu_and_mul")
        if not x.shape or x.shape[-1] % 2:
            raise InvalidArgument(f"x is {list(x.shape)}: its last axis is not even (gate, then up)", op="silu_and_mul")
        shape = (*tuple(x.shape[:-1]), x.shape[-1] // 2)
        result = self._out(out, shape, dtype, x, graph)
        n = math.prod(shape)
        self._run(f"silu_and_mul_{SHORT[dtype]}", grid_1d(n // per_word(dtype)), [x, result], [n, shape[-1]], graph)
        return result

    def rotary_kv_append(
        self,
        qkv: Any,
        k_cache: Any,
        v_cache: Any,
        pos: Any,
        *,
        heads: int,
        kv_heads: int,
        style: str = "neox",
        base: float = 10000.0,
        out: Any = None,
        graph: Any = None,
    ) -> Any:
        """The output of one q/k/v matmul, qkv (B, T, (heads + 2 kv_heads) * D) or (B, (...) * D) for
        one step, split: its query heads rotated (`rotary`) into q, returned (B, T, heads, D) or
        (B, heads, D); its key heads rotated into k_cache and its value heads into v_cache at position
        pos[b] + t (`kv_append`: caches (B, L, kv_heads, D), a position outside 0 .. L-1 dropped).
        D a multiple of 4; qkv float32, float16 or bfloat16, the caches one of the three."""
        xd, cd = dtype_name(qkv), dtype_name(k_cache)
        if xd not in DTYPES or cd not in DTYPES or dtype_name(v_cache) != cd:
            raise InvalidArgument(
                f"qkv of {list(DTYPES)} and both caches of one of them, not {xd}, {cd} and {dtype_name(v_cache)}",
                op="rotary_kv_append",
            )
        if style not in STYLES:
            raise InvalidArgument(f"style is one of {sorted(STYLES)}, not {style!r}", op="rotary_kv_append")
        if not (math.isfinite(base) and base > 0):
            raise InvalidArgument(f"base {base} is not a positive number", op="rotary_kv_append")
        try:
            _batch, steps, dim, qshape = rotary_kv_shapes(tuple(qkv.shape), int(heads), int(kv_heads))
        except OpError as exc:
            raise InvalidArgument(str(exc), op="rotary_kv_append") from None
        if len(k_cache.shape) != 4:
            raise InvalidArgument(f"k_cache is {list(k_cache.shape)}, not (B, L, Hkv, D)", op="rotary_kv_append")
        q = self._out(out, qshape, xd, qkv, graph)
        hi, lo = rotary_freq(float(base), dim)
        n = math.prod(qkv.shape) // 4
        scalars = [n, steps, heads, kv_heads, dim, k_cache.shape[1], STYLES[style], hi, lo]
        name = f"rotary_kv_append_{SHORT[cd]}_{SHORT[xd]}"
        self._run(name, grid_1d(n), [qkv, pos, q, k_cache, v_cache], scalars, graph)
        return q

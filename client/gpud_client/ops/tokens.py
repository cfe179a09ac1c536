"""Token ops for decoder-only transformers: embedding, rotary and kv_append.

Positions are a device tensor `pos` (B,) int32 (element (b, t) of a step is at position pos[b] + t),
never a scalar: record a decode step once into a replay graph with `pos` as a graph input, and replay
it per token.
"""

from __future__ import annotations

import math
from typing import Any

from gpud_client.dtypes import dtype_name, name_of
from gpud_client.errors import InvalidArgument
from gpud_client.ops.base import OpsBase, same_memory
from gpud_protocol import ArgKind
from gpud_protocol.ops import grid_1d
from gpud_protocol.ops.attention import ID_MODES, SHORT, STORED, STYLES, rotary_freq


class TokenOps(OpsBase):
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


def _graph_input(t: Any) -> bool:
    return hasattr(t, "graph") and getattr(t, "kind", None) == ArgKind.INPUT

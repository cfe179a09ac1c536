"""attention_tiled: full attention in one pass on WebGPU, query rows sharing tiles of keys.

attention_tiled_d<W>_<q>_<kv>_<out>(q, k, v, mask, out; b, t, s, hq, hkv, d, causal, mask_mode, scale), for a
    head dim D <= W (W in TILED_HEAD_DIMS): q (B, T, Hq, D), k and v (B, S, Hkv, D) with Hq % Hkv == 0 (query
    head h reads KV head h // (Hq / Hkv)), out (B, T, Hq, D), dtypes (<q>, <kv>: k and v alike, <out>) of
    TILED_DTYPES: any mix of float32 and float16, and of float32 and bfloat16 with out float32 or bfloat16
    (the split kernel takes the other outputs). causal, the additive mask (mask_mode 1, 2) and the key mask
    (mask_mode 3 to 6) as attention_<q>_<kv> (gpud_protocol.ops.attention); a mask value <= -1e30 or a zero
    in the key mask hides its key, whose k and v then never reach the result (NaN there is harmless); a query
    that sees no key gives zeros. mask is read only when mask_mode says so: otherwise any tensor may stand
    in for it.
    One workgroup of TILED_THREADS threads per (block of `tiled_rows` query rows, head, batch row): grid
    `tiled_grid`. Each row is held by W / 32 threads, and the keys go by in tiles of `tiled_keys` that
    the block's rows share in workgroup memory, so short sequences (an encoder's 62 keys) keep every
    thread busy, unlike the split kernel's one workgroup per query row. Lavapipe cuts a shader's loop
    nest after MAX_LOOP iterations: `tiled_loop` bounds the kernel's, and the rule refuses a call past
    it (`tiled_applies` sends those to the split kernel).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpud_protocol.ops import MAX_GROUPS, KernelSpec, TensorInfo, need
from gpud_protocol.ops.attention import (
    FAMILY,
    KEY_MASK_MODES,
    MAX_LOOP,
    SHORT,
    TILE,
    key_mask_mode,
    mask_mode,
)

TILED_HEAD_DIMS = (32, 64, 128, 256)  # W of the entry points: 1, 2, 4 or 8 threads per query row
TILED_THREADS = 64  # threads per workgroup
TILED_SLICE = 32  # dims of a row per thread
FEW_ROWS = 16  # fewer query rows than this over more than FEW_ROWS_KEYS keys: the split kernel
FEW_ROWS_KEYS = 4 * TILE  # (it spreads long key ranges over many workgroups)
_HALF = ("float32", "float16")
_BF16_PAIRS = (("float32", "bfloat16"), ("bfloat16", "float32"), ("bfloat16", "bfloat16"))
TILED_DTYPES = (  # (q, kv, out) of the entry points
    *((q, kv, o) for q in _HALF for kv in _HALF for o in _HALF),
    *((q, kv, o) for q, kv in _BF16_PAIRS for o in ("float32", "bfloat16")),
)


def tiled_width(dim: int) -> int:
    """The entry point's W for head dim `dim`: the smallest of TILED_HEAD_DIMS that holds it."""
    for width in TILED_HEAD_DIMS:
        if dim <= width:
            return width
    raise ValueError(f"head dim {dim} past {TILED_HEAD_DIMS[-1]}")


def tiled_rows(width: int) -> int:
    """Query rows per workgroup."""
    return TILED_THREADS * TILED_SLICE // width


def tiled_keys(width: int) -> int:
    """Keys per tile."""
    return TILED_SLICE * TILED_SLICE // width


def tiled_loop(keys: int, width: int) -> int:
    """Lavapipe's count of the kernel's loop iterations over `keys` keys (an upper bound: per tile, its
    own iteration, the tile's loads and the loops over its keys, each one more than its keys, the
    partial sums' loop only with several threads per row)."""
    per_tile = tiled_keys(width)
    tiles = -(-keys // per_tile)
    return tiles * (8 + (per_tile + 1) * (2 + (width > TILED_SLICE)))


def tiled_grid(batch: int, steps: int, heads: int, dim: int) -> tuple[int, int, int]:
    """The grid: (blocks of query rows, Hq, B)."""
    return (-(-steps // tiled_rows(tiled_width(dim))), heads, batch)


def tiled_applies(q: TensorInfo, k: TensorInfo, v_dtype: str, out_dtype: str | None = None) -> bool:
    """Whether attention_tiled computes attention of these into out of `out_dtype` (None: q's dtype), else
    the split kernel (attention_<q>_<kv>) does: dtypes it takes (TILED_DTYPES), a head dim up to 256, a
    loop nest within lavapipe's budget, a grid within WebGPU's, and not a few query rows over many keys."""
    if (q.dtype, k.dtype, out_dtype or q.dtype) not in TILED_DTYPES or v_dtype != k.dtype:
        return False
    if len(q.shape) != 4 or len(k.shape) != 4 or not 1 <= q.shape[-1] <= TILED_HEAD_DIMS[-1]:
        return False
    batch, steps, heads, dim = q.shape
    keys = k.shape[1]
    width = tiled_width(dim)
    return (
        min(batch, steps, heads, keys) >= 1
        and tiled_loop(keys, width) <= MAX_LOOP
        and max(tiled_grid(batch, steps, heads, dim)) <= MAX_GROUPS
        and (steps >= FEW_ROWS or keys <= FEW_ROWS_KEYS)
    )


def _tiled(width: int, q_dtype: str, kv_dtype: str, out_dtype: str) -> KernelSpec:
    def check(tensors: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        q, k, v, mask, out = tensors
        b, t, keys, hq, hkv, d, causal, mode, scale = s
        need(q.dtype == q_dtype, f"q is {q.dtype}, not {q_dtype}")
        need(k.dtype == kv_dtype and v.dtype == kv_dtype, f"k and v are {k.dtype} and {v.dtype}, not {kv_dtype}")
        need(len(q.shape) == 4 and len(k.shape) == 4, f"q {list(q.shape)} and k {list(k.shape)} are not 4-D")
        need(k.shape == v.shape, f"k {list(k.shape)} and v {list(v.shape)} differ")
        batch, steps, heads, dim = q.shape
        need(min(*q.shape, *k.shape) >= 1, "an empty dimension")
        need(k.shape[0] == batch and k.shape[3] == dim, f"k {list(k.shape)} does not match q {list(q.shape)} in B or D")
        need(dim <= width, f"the head dim {dim} is past {width}, this kernel's")
        need(heads % k.shape[2] == 0, f"{heads} query heads do not divide into {k.shape[2]} KV heads")
        sizes = (batch, steps, k.shape[1], heads, k.shape[2], dim)
        need((b, t, keys, hq, hkv, d) == sizes, "the sizes passed do not match the tensors")
        need(
            out.dtype == out_dtype and out.shape == q.shape,
            f"out is {out.dtype}{list(out.shape)}, not {out_dtype}{list(q.shape)}",
        )
        need(causal in (0, 1), "causal is 0 or 1")
        if mode in KEY_MASK_MODES.values():
            need(key_mask_mode(mask, batch, k.shape[1]) == mode, "the mask mode passed does not match the key mask")
        elif mode in (1, 2):
            need(mask_mode(mask, batch, steps, k.shape[1]) == mode, "the mask mode passed does not match the mask")
        else:
            need(mode == 0, f"unknown mask mode {mode}")
        need(
            tiled_loop(k.shape[1], width) <= MAX_LOOP,
            f"{k.shape[1]} keys: past the loop budget of this kernel (the split kernel takes them)",
        )
        need(math.isfinite(scale), "the scale is not finite")

    name = f"attention_tiled_d{width}_{SHORT[q_dtype]}_{SHORT[kv_dtype]}_{SHORT[out_dtype]}"
    scalars = (*((n, "u32") for n in ("b", "t", "s", "hq", "hkv", "d", "causal", "mask_mode")), ("scale", "f32"))
    tensors = ("q", "k", "v", "mask", "out")
    return KernelSpec(name, FAMILY, "attention", tensors, (4,), scalars, check, block=TILED_THREADS)


BACKENDS = ("webgpu",)  # the backends whose sources have these kernels

SPECS = [_tiled(w, a, b, o) for w in TILED_HEAD_DIMS for a, b, o in TILED_DTYPES]

"""Attention ops for decoder-only transformers: embedding lookup, rotary position embedding, KV-cache
append, and attention (full sequence, or one step against a KV cache). Positions come from a device
tensor `pos` (B,) int32, never from a scalar, so a decode step can be recorded once into a replay
graph and replayed per token with a fresh `pos`.

embedding_<table>_<out>(ids, table, out; n, d, v, ids_mode): out[..., c] = table[ids[...], c]; an id
    outside 0 .. V-1 gives zeros (never read outside the table). ids int32, uint32, int64 or uint64
    (ids_mode: ID_MODES; a 64-bit id is read as two 32-bit words, the low one first: a high word other
    than 0 is an id outside the table), table (V, D).
rotary_<dtype>(x, pos, out; n, t, h, d, style, freq_hi, freq_lo), and rotary_inplace_<dtype>(x, pos;
    ...) which rotates x itself (WebGPU cannot bind one buffer read-only and read-write at once):
    x (B, T, H, D), element (b, t) at position pos[b] + t; n = the number of pairs (x.size / 2);
    style 0 "neox" (pairs (j, j + D/2)), 1 "gptj" (pairs (2j, 2j+1)); pair j turns by
    position * base^(-2j/D), with freq_hi + freq_lo = 2 log2(base) / D (`rotary_freq`).
kv_append_<cache>_<x>(x, pos, cache; n, t, l, hd): cache[b, pos[b] + t] = x[b, t], cast when stored;
    a position outside 0 .. L-1 is dropped. x (B, T, H, D), cache (B, L, H, D); n = x.size, hd = H*D.
attention_<q>_<kv>(q, k, v, pos, mask, part; b, t, s, hq, hkv, d, splits, causal, mask_mode,
    use_pos, scale): the first half of attention, one workgroup per (query row, split of the keys):
    part[..., split, :] = (m, l, acc[D]), the split's running maximum, sum of exp(score - m) and
    sum of exp(score - m) * v, for (<q>, <kv>) in PAIRS. q (B, T, Hq, D), or (B, Hq, D) for T = 1; k and
    v (B, S, Hkv, D) with Hq % Hkv == 0 (query head h reads KV head h // (Hq / Hkv)); part
    (q.shape[:-1]) + (splits, D+2) float32. Query (b, t) sees keys s < S with s <= pos[b] + t
    (use_pos), s <= t + S - T (causal), and adds mask[b or 0, t, s] to the score (mask_mode 2 or 1). A
    mask value <= -1e30 (-inf, float32's minimum) hides its key. pos and mask are read only when
    use_pos / mask_mode say so: otherwise any tensor may stand in for them.
    mask_mode 3 to 6: `mask` is a key mask (B, S) instead (`key_mask_mode`: uint8, int32, float32, int64),
    nonzero where a key takes part (Hugging Face's attention_mask).
attention_combine_<out>(part, out; n, d, splits): out[..., c] = the splits merged and normalised, in
    float32, float16 or bfloat16 (OUT_DTYPES); a row that sees no key gives zeros.
attention_flash_d<D>_<out>: CUDA's one-pass full attention on the tensor cores, in
    gpud_protocol.ops.attention_flash.
attention_tiled_d<W>_<q>_<kv>_<out>: WebGPU's one-pass full attention, in gpud_protocol.ops.attention_tiled.

Float16 and bfloat16 are read into float32 and rounded once when stored (bfloat16 to nearest even);
attention accumulates in float32, and writes float32, float16 or bfloat16 (OUT_DTYPES: the client's
default is q's dtype, as torch's SDPA). q and k, v mix float32 with either 16-bit dtype, never float16
with bfloat16 (PAIRS: torch refuses that mix too; cast one). embedding, rotary and kv_append take every
dtype of STORED, in any mix (a cast when stored).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, TensorInfo, need

FAMILY = "attention"
DTYPES = ("float32", "float16", "bfloat16")  # attention's q, k and v
OUT_DTYPES = DTYPES  # attention's output
STORED = DTYPES  # embedding, rotary and kv_append


def mixes_halves(a: str, b: str) -> bool:
    """float16 with bfloat16: no attention kernel takes the mix (torch refuses it too); cast one."""
    return {a, b} == {"float16", "bfloat16"}


PAIRS = tuple((q, kv) for q in DTYPES for kv in DTYPES if not mixes_halves(q, kv))  # (q, kv) with kernels
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
STYLES = {"neox": 0, "gptj": 1}
TILE = 256  # keys per tile of the attention kernel (its workgroup size)
MAX_HEAD_DIM = 256  # attention's D: one query row per workgroup of 256 threads
MAX_SPLITS = 1024
FREQ_BITS = 12  # significant bits of freq_hi: j * freq_hi is exact for j < 2^12 (D <= 8192)
MAX_ROTARY_DIM = 8192
HIDDEN = -1e30  # a mask value at or below this hides its key
KEY_MASK_MODES = {"uint8": 3, "bool": 3, "int32": 4, "float32": 5, "int64": 6}  # a key mask's mask_mode by dtype
ID_MODES = {"int32": 0, "uint32": 1, "int64": 2, "uint64": 3}  # embedding's ids_mode, by the ids' dtype
MAX_LOOP = 65_535  # iterations of one shader loop (lavapipe cuts longer loops there)


def tiles_per_split(keys: int, splits: int) -> int:
    """The tiles of TILE keys one workgroup of attention loops over."""
    tiles = -(-keys // TILE)
    return -(-tiles // splits)


def rotary_freq(base: float, head_dim: int) -> tuple[float, float]:
    """2 log2(base) / D as (hi, lo): hi has FREQ_BITS significant bits, lo the float32 rest."""
    freq = 2.0 * math.log2(base) / head_dim
    if freq == 0.0:
        return 0.0, 0.0
    mantissa, exponent = math.frexp(freq)
    hi = math.ldexp(round(mantissa * (1 << FREQ_BITS)), exponent - FREQ_BITS)
    lo = struct.unpack("f", struct.pack("f", freq - hi))[0]
    return hi, float(lo)


def u32s(*names: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, "u32") for n in names)


def _positions(pos: TensorInfo, batch: int) -> None:
    need(pos.dtype == "int32", f"pos is {pos.dtype}, not int32")
    need(pos.shape == (batch,), f"pos is {list(pos.shape)}, not [{batch}] (one position per batch row)")


def _embedding(table_dtype: str, out_dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        ids, table, out = t
        n, d, v, ids_mode = s
        need(ids.dtype in ID_MODES, f"ids are {ids.dtype}, not int32, uint32, int64 or uint64")
        need(ids_mode == ID_MODES[ids.dtype], f"ids_mode {ids_mode} is not that of {ids.dtype} ids")
        need(table.dtype == table_dtype, f"the table is {table.dtype}, not {table_dtype}")
        need(out.dtype == out_dtype, f"out is {out.dtype}, not {out_dtype}")
        need(len(table.shape) == 2, f"the table is {list(table.shape)}, not (V, D)")
        rows, dim = table.shape
        need(rows >= 1 and dim >= 1, f"the table is {list(table.shape)}: empty")
        want = (*ids.shape, dim)
        need(out.shape == want, f"out is {list(out.shape)}, not {list(want)}")
        need((n, d, v) == (out.size, dim, rows), "the sizes passed do not match the tensors")

    name = f"embedding_{SHORT[table_dtype]}_{SHORT[out_dtype]}"
    scalars = u32s("n", "d", "v", "ids_mode")
    return KernelSpec(name, FAMILY, "embedding", ("ids", "table", "out"), (2,), scalars, check)


def _rotary_shapes(x: TensorInfo, pos: TensorInfo, s: Sequence[int | float], dtype: str) -> None:
    n, t, h, d, style, freq_hi, freq_lo = s
    need(x.dtype == dtype, f"x is {x.dtype}, not {dtype}")
    need(len(x.shape) == 4, f"x is {list(x.shape)}, not (B, T, H, D)")
    batch, steps, heads, dim = x.shape
    need(dim % 2 == 0 and 2 <= dim <= MAX_ROTARY_DIM, f"the head dim {dim} is not even (or past {MAX_ROTARY_DIM})")
    _positions(pos, batch)
    need((n, t, h, d) == (x.size // 2, steps, heads, dim), "the sizes passed do not match the tensors")
    need(style in STYLES.values(), f"unknown rotary style {style}")
    need(math.isfinite(freq_hi) and math.isfinite(freq_lo), "the frequency is not finite")


ROTARY_SCALARS = (*u32s("n", "t", "h", "d", "style"), ("freq_hi", "f32"), ("freq_lo", "f32"))


def _rotary(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, pos, out = t
        _rotary_shapes(x, pos, s, dtype)
        need(
            (out.dtype, out.shape) == (x.dtype, x.shape),
            f"out is {out.dtype}{list(out.shape)}, x is {x.dtype}{list(x.shape)}",
        )

    name = f"rotary_{SHORT[dtype]}"
    return KernelSpec(name, FAMILY, "rotary", ("x", "pos", "out"), (2,), ROTARY_SCALARS, check)


def _rotary_inplace(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, pos = t
        _rotary_shapes(x, pos, s, dtype)

    name = f"rotary_inplace_{SHORT[dtype]}"
    return KernelSpec(name, FAMILY, "rotary", ("x", "pos"), (0,), ROTARY_SCALARS, check)


def _kv_append(cache_dtype: str, x_dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, pos, cache = t
        n, steps, length, hd = s
        need(x.dtype == x_dtype, f"x is {x.dtype}, not {x_dtype}")
        need(cache.dtype == cache_dtype, f"the cache is {cache.dtype}, not {cache_dtype}")
        need(len(x.shape) == 4 and len(cache.shape) == 4, "x (B, T, H, D) and the cache (B, L, H, D) are 4-D")
        same = (x.shape[0], *x.shape[2:]) == (cache.shape[0], *cache.shape[2:])
        need(same, f"x {list(x.shape)} and the cache {list(cache.shape)} differ in B, H or D")
        _positions(pos, x.shape[0])
        need(
            (n, steps, length, hd) == (x.size, x.shape[1], cache.shape[1], x.shape[2] * x.shape[3]),
            "the sizes passed do not match the tensors",
        )

    name = f"kv_append_{SHORT[cache_dtype]}_{SHORT[x_dtype]}"
    return KernelSpec(name, FAMILY, "kv_append", ("x", "pos", "cache"), (2,), u32s("n", "t", "l", "hd"), check)


def mask_mode(mask: TensorInfo, batch: int, steps: int, keys: int) -> int:
    """1: one (T, S) mask for every batch row (leading dims all 1); 2: one per batch row ((B, T, S)
    or (B, 1, T, S)). Raises OpError for anything else."""
    need(mask.dtype == "float32", f"the mask is {mask.dtype}, not float32")
    shape = mask.shape
    need(len(shape) >= 2 and shape[-2:] == (steps, keys), f"the mask is {list(shape)}: it must end ({steps}, {keys})")
    lead = shape[:-2]
    if math.prod(lead) == 1:
        return 1
    need(
        lead in ((batch,), (batch, 1)),
        f"the mask is {list(shape)}: leading dims must be all 1, ({batch},) or ({batch}, 1)",
    )
    return 2


def key_mask_mode(mask: TensorInfo, batch: int, keys: int) -> int:
    """The mask_mode of a key mask (B, S): nonzero where key s of batch row b takes part."""
    need(mask.dtype in KEY_MASK_MODES, f"the key mask is {mask.dtype}, not one of {list(KEY_MASK_MODES)}")
    need(mask.shape == (batch, keys), f"the key mask is {list(mask.shape)}, not [{batch}, {keys}] (B, S)")
    return KEY_MASK_MODES[mask.dtype]


def any_mask(mask: TensorInfo, mode: int, batch: int, steps: int, keys: int) -> None:
    if mode in KEY_MASK_MODES.values():
        need(key_mask_mode(mask, batch, keys) == mode, "the mask mode passed does not match the key mask")
    elif mode:
        need(mask_mode(mask, batch, steps, keys) == mode, "the mask mode passed does not match the mask")


ATTENTION_SCALARS = (
    *u32s("b", "t", "s", "hq", "hkv", "d", "splits", "causal", "mask_mode", "use_pos"),
    ("scale", "f32"),
)


def attention_rows(q: TensorInfo) -> tuple[int, int, int, int]:
    """(B, T, Hq, D) of a query tensor (B, T, Hq, D) or (B, Hq, D)."""
    need(len(q.shape) in (3, 4), f"q is {list(q.shape)}, not (B, T, Hq, D) or (B, Hq, D)")
    if len(q.shape) == 3:
        return q.shape[0], 1, q.shape[1], q.shape[2]
    b, t, h, d = q.shape
    return b, t, h, d


def _attention(q_dtype: str, kv_dtype: str) -> KernelSpec:
    def check(tensors: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        q, k, v, pos, mask, part = tensors
        b, t, keys, hq, hkv, d, splits, causal, mode, use_pos, scale = s
        need(q.dtype == q_dtype, f"q is {q.dtype}, not {q_dtype}")
        need(k.dtype == kv_dtype and v.dtype == kv_dtype, f"k and v are {k.dtype} and {v.dtype}, not {kv_dtype}")
        batch, steps, heads, dim = attention_rows(q)
        need(len(k.shape) == 4, f"k is {list(k.shape)}, not (B, S, Hkv, D)")
        need(k.shape == v.shape, f"k {list(k.shape)} and v {list(v.shape)} differ")
        need(min(batch, steps, heads, *k.shape) >= 1, "an empty dimension")
        need(k.shape[0] == batch and k.shape[3] == dim, f"k {list(k.shape)} does not match q {list(q.shape)} in B or D")
        need(dim <= MAX_HEAD_DIM, f"the head dim {dim} is past {MAX_HEAD_DIM}")
        need(heads % k.shape[2] == 0, f"{heads} query heads do not divide into {k.shape[2]} KV heads")
        sizes = (batch, steps, k.shape[1], heads, k.shape[2], dim)
        need((b, t, keys, hq, hkv, d) == sizes, "the sizes passed do not match the tensors")
        need(1 <= splits <= MAX_SPLITS, f"splits {splits} is not in 1 .. {MAX_SPLITS}")
        need(tiles_per_split(k.shape[1], int(splits)) <= MAX_LOOP, f"{k.shape[1]} keys need more than {splits} splits")
        need(part.dtype == "float32", f"part is {part.dtype}, not float32")
        want = (*q.shape[:-1], splits, dim + 2)
        need(part.shape == want, f"part is {list(part.shape)}, not {list(want)}")
        need(causal in (0, 1) and use_pos in (0, 1), "causal and use_pos are 0 or 1")
        if use_pos:
            _positions(pos, batch)
        need(mode in (0, 1, 2, *KEY_MASK_MODES.values()), f"unknown mask mode {mode}")
        any_mask(mask, int(mode), batch, steps, k.shape[1])
        need(math.isfinite(scale), "the scale is not finite")

    name = f"attention_{SHORT[q_dtype]}_{SHORT[kv_dtype]}"
    tensors = ("q", "k", "v", "pos", "mask", "part")
    return KernelSpec(name, FAMILY, "attention", tensors, (5,), ATTENTION_SCALARS, check)


def _combine(out_dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        part, out = t
        n, d, splits = s
        need(part.dtype == "float32", f"part is {part.dtype}, not float32")
        need(out.dtype == out_dtype, f"out is {out.dtype}, not {out_dtype}")
        need(len(part.shape) >= 3, f"part is {list(part.shape)}, not (..., splits, D + 2)")
        dim = part.shape[-1] - 2
        need(dim >= 1 and 1 <= part.shape[-2] <= MAX_SPLITS, f"part is {list(part.shape)}")
        want = (*part.shape[:-2], dim)
        need(out.shape == want, f"out is {list(out.shape)}, not {list(want)}")
        need((n, d, splits) == (out.size, dim, part.shape[-2]), "the sizes passed do not match the tensors")

    name = f"attention_combine_{SHORT[out_dtype]}"
    return KernelSpec(name, FAMILY, "attention", ("part", "out"), (1,), u32s("n", "d", "splits"), check)


SPECS = [
    *(_embedding(a, b) for a in STORED for b in STORED),
    *(_rotary(d) for d in STORED),
    *(_rotary_inplace(d) for d in STORED),
    *(_kv_append(a, b) for a in STORED for b in STORED),
    *(_attention(a, b) for a, b in PAIRS),
    *(_combine(o) for o in OUT_DTYPES),
]

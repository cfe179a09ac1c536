"""Fused decode kernels: what a decoder layer's step did in two to four launches, in one
(family fused: gpud/ops/fused.cu and fused.wgsl).

add_rmsnorm_<x>_<w>(x, r, weight, sum, out; rows, length, eps): sum = x + r, rounded to x's dtype, and
    out = rmsnorm(sum) * weight (`rmsnorm`'s rule, over the stored sum): a residual add and the next
    norm. x, r, sum and out (..., length) of one dtype, weight (length,); one workgroup per row.
silu_and_mul_<x>(x, out; n, width): out = silu(x[..., :width]) * x[..., width:] (vLLM's silu_and_mul:
    the gate and up projections computed by one matmul into (..., 2 * width)); n = out.size.
rotary_kv_append_<cache>_<x>(qkv, pos, q, k_cache, v_cache; n, t, hq, hkv, d, l, style, freq_hi,
    freq_lo): the output of one q/k/v matmul, qkv (B, T, (Hq + 2 Hkv) * D) or (B, (Hq + 2 Hkv) * D)
    for T = 1, split, rotated and stored: q (B, T, Hq, D), or (B, Hq, D) for T = 1, is its first Hq
    heads rotated (`rotary`'s rule and arithmetic); the next Hkv heads, rotated, go to k_cache and the
    last Hkv, as they are, to v_cache at position pos[b] + t (`kv_append`'s rule: caches (B, L, Hkv, D),
    a position outside 0 .. L-1 dropped). n = qkv.size / 4: a thread takes four elements (two pairs).

A thread writes whole 4-byte words (one float32, two 16-bit elements), so WebGPU needs no atomics:
16-bit rows have an even length (add_rmsnorm, silu_and_mul's width) and D is a multiple of 4.
Arithmetic is float32, each stored value rounded once (bfloat16 to nearest even).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, TensorInfo, need
from gpud_protocol.ops.attention import MAX_ROTARY_DIM, STORED, STYLES, u32s
from gpud_protocol.ops.reduce import rows_and_length

FAMILY = "fused"
DTYPES = STORED  # float32, float16, bfloat16
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def per_word(dtype: str) -> int:
    """Elements of `dtype` in one 4-byte word."""
    return 1 if dtype == "float32" else 2


def _even(dtype: str, length: int, what: str) -> None:
    need(per_word(dtype) == 1 or length % 2 == 0, f"{what} is {length}: odd, which {dtype} rows cannot be here")


def _add_rmsnorm(dtype: str, wdtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, r, weight, total, out = t
        rows, length, eps = s
        for name, info in (("x", x), ("r", r), ("sum", total), ("out", out)):
            need(info.dtype == dtype, f"{name} is {info.dtype}, this kernel takes {dtype}")
            need(info.shape == x.shape, f"{name} is {list(info.shape)}, x is {list(x.shape)}")
        need(weight.dtype == wdtype, f"weight is {weight.dtype}, this kernel takes {wdtype}")
        need(
            len(x.shape) >= 1 and weight.shape == (x.shape[-1],),
            f"weight is {list(weight.shape)}, not [{x.shape[-1:]}]",
        )
        need((rows, length) == rows_and_length(x.shape), "rows and length do not match x")
        need(length >= 1, "x has rows of no elements")
        _even(dtype, int(length), "the row length")
        need(math.isfinite(eps) and eps >= 0, f"eps {eps} is not finite and >= 0")

    name = f"add_rmsnorm_{SHORT[dtype]}_{SHORT[wdtype]}"
    scalars = (("rows", "u32"), ("length", "u32"), ("eps", "f32"))
    return KernelSpec(name, FAMILY, "add_rmsnorm", ("x", "r", "weight", "sum", "out"), (3, 4), scalars, check)


def _silu_and_mul(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        n, width = s
        need(x.dtype == dtype and out.dtype == dtype, f"x and out are {x.dtype} and {out.dtype}, not {dtype}")
        need(len(x.shape) >= 1 and x.shape[-1] % 2 == 0, f"x is {list(x.shape)}: its last axis is not even")
        want = (*x.shape[:-1], x.shape[-1] // 2)
        need(out.shape == want, f"out is {list(out.shape)}, not {list(want)}")
        need((n, width) == (out.size, want[-1]), "n and width do not match the tensors")
        _even(dtype, int(width), "the half width")

    return KernelSpec(
        f"silu_and_mul_{SHORT[dtype]}", FAMILY, "silu_and_mul", ("x", "out"), (1,), u32s("n", "width"), check
    )


def rotary_kv_shapes(qkv: tuple[int, ...], hq: int, hkv: int) -> tuple[int, int, int, tuple[int, ...]]:
    """(B, T, D, q's shape) of a qkv of `hq` query and `hkv` KV heads; OpError if it cannot be one."""
    need(len(qkv) in (2, 3), f"qkv is {list(qkv)}, not (B, T, (Hq + 2 Hkv) * D) or (B, (Hq + 2 Hkv) * D)")
    need(hq >= 1 and hkv >= 1 and hq % hkv == 0, f"{hq} query heads do not group over {hkv} KV heads")
    heads = hq + 2 * hkv
    need(qkv[-1] % heads == 0, f"qkv's last axis, {qkv[-1]}, is not {heads} heads")
    d = qkv[-1] // heads
    need(d % 4 == 0 and 4 <= d <= MAX_ROTARY_DIM, f"the head dim {d} is not a multiple of 4 (or past {MAX_ROTARY_DIM})")
    batch, steps = (qkv[0], 1) if len(qkv) == 2 else (qkv[0], qkv[1])
    q = (batch, hq, d) if len(qkv) == 2 else (batch, steps, hq, d)
    return batch, steps, d, q


def _rotary_kv_append(cdtype: str, dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        qkv, pos, q, k_cache, v_cache = t
        n, steps, hq, hkv, d, length, style, freq_hi, freq_lo = s
        need(qkv.dtype == dtype and q.dtype == dtype, f"qkv and q are {qkv.dtype} and {q.dtype}, not {dtype}")
        need(k_cache.dtype == cdtype and v_cache.dtype == cdtype, f"the caches are not {cdtype}")
        batch, tt, dim, qshape = rotary_kv_shapes(qkv.shape, int(hq), int(hkv))
        need(q.shape == qshape, f"q is {list(q.shape)}, not {list(qshape)}")
        need(
            pos.dtype == "int32" and pos.shape == (batch,), f"pos is {pos.dtype} {list(pos.shape)}, not int32 [{batch}]"
        )
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            want = (batch, cache.shape[1] if len(cache.shape) == 4 else -1, hkv, dim)
            need(cache.shape == want, f"{name} is {list(cache.shape)}, not (B, L, Hkv, D) = [{batch}, L, {hkv}, {dim}]")
        need(k_cache.shape == v_cache.shape, "the caches differ in shape")
        need((n, steps, d, length) == (qkv.size // 4, tt, dim, k_cache.shape[1]), "the sizes passed do not match")
        need(style in STYLES.values(), f"unknown rotary style {style}")
        need(math.isfinite(freq_hi) and math.isfinite(freq_lo), "the frequency is not finite")

    scalars = (*u32s("n", "t", "hq", "hkv", "d", "l", "style"), ("freq_hi", "f32"), ("freq_lo", "f32"))
    tensors = ("qkv", "pos", "q", "k_cache", "v_cache")
    name = f"rotary_kv_append_{SHORT[cdtype]}_{SHORT[dtype]}"
    return KernelSpec(name, FAMILY, "rotary_kv_append", tensors, (2, 3, 4), scalars, check)


SPECS = [
    *(_add_rmsnorm(d, w) for d in DTYPES for w in DTYPES),
    *(_silu_and_mul(d) for d in DTYPES),
    *(_rotary_kv_append(c, d) for c in DTYPES for d in DTYPES),
]

"""attention_flash: full attention in one pass on CUDA's tensor cores (no WGSL twin).

attention_flash_d<D>_<out> and attention_flash_d<D>_bf16_<out> (`flash_name`) (q, k, v, key_mask, out; b, t,
    s, hq, hkv, d, causal, mask_mode, scale): q (B, T, Hq, D), k and v (B, S, Hkv, D), all float16 (the
    first form) or all bfloat16 (the second), D in FLASH_HEAD_DIMS; out (B, T, Hq, D) float32 or q's dtype
    (<out>; FLASH_DTYPES). causal and the key mask (mask_mode 0, or 3 to 6 with key_mask (B, S); at most
    FLASH_MASKED_KEYS keys) as attention_<q>_<kv> (gpud_protocol.ops.attention); a query that sees no key
    gives zeros. P is rounded to q's dtype before P V, as flash attention does: results within about 1e-3
    of float64 for float16, 2^-8 of the weighted mean of |v| for bfloat16. Grid `flash_grid` (one block of
    FLASH_BLOCK threads per 64 query rows of a (batch, head)); tensors 16-byte aligned (gpud's allocations
    and graph arenas are).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, TensorInfo, need
from gpud_protocol.ops.attention import FAMILY, KEY_MASK_MODES, SHORT, any_mask, u32s

FLASH_HEAD_DIMS = (32, 64, 128)
FLASH_DTYPES = {"float16": ("float32", "float16"), "bfloat16": ("float32", "bfloat16")}  # q, k, v -> outs
FLASH_ROWS = 64  # query rows per block of the flash kernel
FLASH_BLOCK = 128  # its threads per block
FLASH_MASKED_KEYS = 16_384  # the most keys of a flash attention with a key mask (one bit each in shared memory)


def flash_grid(batch: int, steps: int, heads: int) -> tuple[int, int, int]:
    """The flash kernel's grid: (64-row tiles of the queries, Hq, B)."""
    return (-(-steps // FLASH_ROWS), heads, batch)


def flash_name(dim: int, dtype: str, out_dtype: str) -> str:
    """The flash kernel for head dim `dim`, q, k and v of `dtype`, out of `out_dtype`."""
    inputs = "" if dtype == "float16" else f"_{SHORT[dtype]}"
    return f"attention_flash_d{dim}{inputs}_{SHORT[out_dtype]}"


def flash_applies(
    q: TensorInfo, k: TensorInfo, v_dtype: str, key_mask: TensorInfo | None, out_dtype: str | None = None
) -> bool:
    """Whether attention_flash computes attention of these (CUDA only; no additive mask, no pos), into
    out of `out_dtype` (None: q's dtype)."""
    return (
        q.dtype == k.dtype == v_dtype
        and (out_dtype or q.dtype) in FLASH_DTYPES.get(q.dtype, ())
        and len(q.shape) == len(k.shape) == 4
        and q.shape[-1] in FLASH_HEAD_DIMS
        and (key_mask is None or k.shape[1] <= FLASH_MASKED_KEYS)
    )


def _flash(dim: int, dtype: str, out_dtype: str) -> KernelSpec:
    def check(tensors: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        q, k, v, key_mask, out = tensors
        b, t, keys, hq, hkv, d, causal, mode, scale = s
        need(q.dtype == k.dtype == v.dtype == dtype, f"q, k and v are {q.dtype}, {k.dtype}, {v.dtype}: not {dtype}")
        need(len(q.shape) == 4 and len(k.shape) == 4, f"q {list(q.shape)} and k {list(k.shape)} are not 4-D")
        need(k.shape == v.shape, f"k {list(k.shape)} and v {list(v.shape)} differ")
        batch, steps, heads, qdim = q.shape
        need(min(*q.shape, *k.shape) >= 1, "an empty dimension")
        need(
            (k.shape[0], k.shape[3]) == (batch, dim) and qdim == dim,
            f"q {list(q.shape)}, k {list(k.shape)}: D != {dim}",
        )
        need(heads % k.shape[2] == 0, f"{heads} query heads do not divide into {k.shape[2]} KV heads")
        need(
            (b, t, keys, hq, hkv, d) == (batch, steps, k.shape[1], heads, k.shape[2], dim),
            "the sizes passed do not match the tensors",
        )
        need(
            out.dtype == out_dtype and out.shape == q.shape,
            f"out is {out.dtype}{list(out.shape)}, not {out_dtype}{list(q.shape)}",
        )
        need(causal in (0, 1), "causal is 0 or 1")
        need(mode in (0, *KEY_MASK_MODES.values()), f"mask mode {mode}: the flash kernel takes a key mask only")
        if mode:
            need(keys <= FLASH_MASKED_KEYS, f"{keys} keys with a key mask: past {FLASH_MASKED_KEYS}")
        any_mask(key_mask, int(mode), batch, steps, k.shape[1])
        need(math.isfinite(scale), "the scale is not finite")

    name = flash_name(dim, dtype, out_dtype)
    scalars = (*u32s("b", "t", "s", "hq", "hkv", "d", "causal", "mask_mode"), ("scale", "f32"))
    tensors = ("q", "k", "v", "key_mask", "out")
    return KernelSpec(name, FAMILY, "attention", tensors, (4,), scalars, check, block=FLASH_BLOCK)


BACKENDS = ("cuda",)  # the backends whose sources have these kernels

SPECS = [_flash(d, i, o) for i, outs in FLASH_DTYPES.items() for d in FLASH_HEAD_DIMS for o in outs]

"""ew_binary16 and ew_unary16: ew_binary's and ew_unary's arithmetic, 16 bytes of each tensor a thread (CUDA).

Same tensors, scalars and rule as ew_binary and ew_unary (gpud_protocol.ops.elementwise), restricted by
`binary16_applies` / `unary16_applies`: x (and y) and out of one float dtype (float32, float16 or
bfloat16), nothing broadcast (both masks 0), n elements of a multiple of 16 bytes, and every tensor
starting on 16 bytes. A thread loads one 16-byte word of each operand and stores one of out (8 halves or
4 floats), with the generic kernels' conversions and arithmetic: the same bits. Grid:
grid_1d(n * size / 16). CUDA only: the generic kernels write one 4-byte word a thread, and a GELU over
MiniLM's FFN activations (15,360 x 1,536 float16) took 106 us on an H100 there, about 0.9 TB/s
(Nsight Compute, h100/session6/ncu-embed-tma.csv). The client picks these wherever a call fits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, TensorInfo, need
from gpud_protocol.ops.dtypes import DTYPES
from gpud_protocol.ops.elementwise import SPECS as GENERIC

FLOAT_SIZES = {DTYPES[name].code: DTYPES[name].size for name in ("float32", "float16", "bfloat16")}
VECTOR = 16  # bytes of each tensor a thread


def _fits(n: int, codes: Sequence[int], offsets: Sequence[int]) -> bool:
    size = FLOAT_SIZES.get(codes[0], 0)
    return bool(
        size
        and all(code == codes[0] for code in codes)
        and n * size % VECTOR == 0
        and all(offset * size % VECTOR == 0 for offset in offsets)
    )


def binary16_applies(n: int, masks: Sequence[int], codes: Sequence[int], offsets: Sequence[int]) -> bool:
    """Whether ew_binary16 takes a call of ew_binary: n, the layout's masks (x_bcast, y_bcast), the dtype
    codes of x, y and out, and their offsets (elements into their tensors)."""
    return not any(masks) and _fits(n, codes, offsets)


def unary16_applies(n: int, codes: Sequence[int], offsets: Sequence[int]) -> bool:
    """Whether ew_unary16 takes a call of ew_unary: n, the dtype codes of x and out, and their offsets."""
    return _fits(n, codes, offsets)


def words(n: int, code: int) -> int:
    """The threads of a call: its 16-byte words."""
    return n * FLOAT_SIZES[code] // VECTOR


def _binary16(generic: KernelSpec) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        generic.check(t, s)
        n, masks, codes = int(s[0]), [int(m) for m in s[-5:-3]], [int(c) for c in s[-3:]]
        need(
            binary16_applies(n, masks, codes, [info.offset for info in t]),
            f"takes x, y and out of one float dtype, nothing broadcast, n elements of a multiple of {VECTOR} "
            f"bytes and tensors starting on {VECTOR} bytes (n {n}, masks {masks}, dtype codes {codes})",
        )

    return dataclasses.replace(generic, name="ew_binary16", check=check)


def _unary16(generic: KernelSpec) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        generic.check(t, s)
        n, codes = int(s[0]), [int(c) for c in s[-2:]]
        need(
            unary16_applies(n, codes, [info.offset for info in t]),
            f"takes x and out of one float dtype, n elements of a multiple of {VECTOR} bytes and tensors "
            f"starting on {VECTOR} bytes (n {n}, dtype codes {codes})",
        )

    return dataclasses.replace(generic, name="ew_unary16", check=check)


_GENERIC = {spec.name: spec for spec in GENERIC}
BACKENDS = ("cuda",)  # the backends whose sources have these kernels

SPECS = [_binary16(_GENERIC["ew_binary"]), _unary16(_GENERIC["ew_unary"])]

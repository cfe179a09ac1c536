"""ew_binary4 and ew_unary4: ew_binary's and ew_unary's arithmetic, four float elements a thread (WebGPU).

Same tensors, scalars and rule as ew_binary and ew_unary (gpud_protocol.ops.elementwise), restricted by
`binary4_applies` / `unary4_applies`: every operand and the output a float dtype (float32, float16,
bfloat16), n a multiple of 4; for ew_binary4 also at most two merged broadcast axes, the inner one a
multiple of 4 elements, and operands whose bytes are a multiple of WORD (they bind as arrays of 8-byte
words: bytes past the last whole one are out of reach). Grid:
grid_1d(n / 4). The WGSL kernels decide dtypes per element without integer paths: on lavapipe, which
runs every side of every branch, the generic kernels spend ~20x longer on the same floats (measured:
gpud/ops/elementwise.wgsl says more). WebGPU only (the CUDA sources have none): the client picks them on
the webgpu backend wherever a call fits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, TensorInfo, need
from gpud_protocol.ops.dtypes import DTYPES
from gpud_protocol.ops.elementwise import SPECS as GENERIC

FLOAT_SIZES = {DTYPES[name].code: DTYPES[name].size for name in ("float32", "float16", "bfloat16")}
WIDTH = 4  # elements a thread
WORD = 8  # bytes of an operand's words (array<vec2<u32>>)


def binary4_applies(n: int, rank: int, dims: Sequence[int], codes: Sequence[int], counts: Sequence[int]) -> bool:
    """Whether ew_binary4 takes a call of ew_binary with these scalars: n, the layout's rank and dims
    (d0..), and the dtype codes of x, y and out; `counts`: the elements of x and y."""
    return (
        n % WIDTH == 0
        and 1 <= rank <= 2
        and dims[rank - 1] % WIDTH == 0
        and all(code in FLOAT_SIZES for code in codes)
        and all(count * FLOAT_SIZES[code] % WORD == 0 for count, code in zip(counts, codes, strict=False))
    )


def unary4_applies(n: int, codes: Sequence[int]) -> bool:
    """Whether ew_unary4 takes a call of ew_unary: n and the dtype codes of x and out."""
    return n % WIDTH == 0 and all(code in FLOAT_SIZES for code in codes)


def _binary4(generic: KernelSpec) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        generic.check(t, s)
        n, rank, dims, codes = int(s[0]), int(s[2]), [int(d) for d in s[3:9]], [int(c) for c in s[-3:]]
        need(
            binary4_applies(n, rank, dims, codes, [t[0].size, t[1].size]),
            f"takes floats, n a multiple of {WIDTH}, at most 2 merged axes, the inner one a multiple of {WIDTH}, "
            f"and operands of a multiple of {WORD} bytes (n {n}, rank {rank}, dims {dims[:rank]})",
        )

    return dataclasses.replace(generic, name="ew_binary4", check=check)


def _unary4(generic: KernelSpec) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        generic.check(t, s)
        n, codes = int(s[0]), [int(c) for c in s[-2:]]
        need(unary4_applies(n, codes), f"takes floats and n a multiple of {WIDTH} (n {n})")

    return dataclasses.replace(generic, name="ew_unary4", check=check)


_GENERIC = {spec.name: spec for spec in GENERIC}
BACKENDS = ("webgpu",)  # the backends whose sources have these kernels

SPECS = [_binary4(_GENERIC["ew_binary"]), _unary4(_GENERIC["ew_unary"])]

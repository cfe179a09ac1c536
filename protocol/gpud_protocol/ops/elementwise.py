"""Elementwise ops: binary with broadcasting over leading axes, unary functions, casts.

binary_<dtype>(x, y, out; n, nx, ny, op): out[i] = x[i % nx] (op) y[i % ny], op 0 add 1 sub 2 mul 3 div
4 silu_mul (silu(x) * y: the gated MLP of Llama-style models).
unary_<dtype>(x, out; n, op, a): op 0 a*x, 1 exp, 2 rsqrt, 3 silu, 4 gelu (erf), 5 gelu (tanh), 6 tanh.
cast_f32_f16 / cast_f16_f32(x, out; n). Float16 is computed in float32 and rounded once when stored.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, TensorInfo, broadcast_shape, need, same_dtype

BINARY_OPS = {"add": 0, "sub": 1, "mul": 2, "div": 3, "silu_mul": 4}
UNARY_OPS = {"scale": 0, "exp": 1, "rsqrt": 2, "silu": 3, "gelu": 4, "gelu_tanh": 5, "tanh": 6}
DTYPES = ("float32", "float16")
SHORT = {"float32": "f32", "float16": "f16"}


def _binary(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, y, out = t
        n, nx, ny, op = s
        need(same_dtype(t, (dtype,)) == dtype, f"expects {dtype}")
        shape = broadcast_shape(x.shape, y.shape)
        need(out.shape == shape, f"out is {list(out.shape)}, the broadcast shape is {list(shape)}")
        need((n, nx, ny) == (out.size, x.size, y.size), "the sizes passed do not match the tensors")
        need(op in BINARY_OPS.values(), f"unknown binary op {op}")

    name = f"binary_{SHORT[dtype]}"
    scalars, codes = _U32S("n", "nx", "ny", "op"), _codes(BINARY_OPS)
    return KernelSpec(name, "elementwise", "binary", ("x", "y", "out"), (2,), scalars, check, op_codes=codes)


def _unary(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        n, op, _a = s
        same_dtype(t, (dtype,))
        need(x.shape == out.shape, f"out is {list(out.shape)}, x is {list(x.shape)}")
        need(n == x.size, "the size passed does not match the tensors")
        need(op in UNARY_OPS.values(), f"unknown unary op {op}")

    scalars = (("n", "u32"), ("op", "u32"), ("a", "f32"))
    codes = tuple(name.removesuffix("_tanh") for name in _codes(UNARY_OPS))  # gelu(approximate="tanh") is gelu
    name = f"unary_{SHORT[dtype]}"
    return KernelSpec(name, "elementwise", "unary", ("x", "out"), (1,), scalars, check, op_codes=codes)


def _cast(src: str, dst: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        need((x.dtype, out.dtype) == (src, dst), f"casts {src} to {dst}, got {x.dtype} to {out.dtype}")
        need(x.shape == out.shape, f"out is {list(out.shape)}, x is {list(x.shape)}")
        need(s[0] == x.size, "the size passed does not match the tensors")

    name = f"cast_{SHORT[src]}_{SHORT[dst]}"
    return KernelSpec(name, "elementwise", "cast", ("x", "out"), (1,), (("n", "u32"),), check)


def _U32S(*names: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, "u32") for n in names)


def _codes(ops: dict[str, int]) -> tuple[str, ...]:
    """The op names of a table of op codes, by code."""
    return tuple(sorted(ops, key=ops.__getitem__))


SPECS = [
    *(_binary(d) for d in DTYPES),
    *(_unary(d) for d in DTYPES),
    _cast("float32", "float16"),
    _cast("float16", "float32"),
]

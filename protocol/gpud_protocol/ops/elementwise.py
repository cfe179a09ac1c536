"""Elementwise ops: binary and `where` with numpy broadcasting, unary functions, casts.

One kernel per kind serves every dtype and mix of dtypes: each tensor's dtype is a scalar (its code
in gpud_protocol.ops.dtypes), and a thread writes one 4-byte word of the output (4 int8, 2 float16,
1 float32; one 8-byte element), so narrow outputs need no atomics. Arithmetic is float32; every float
output is rounded once, to nearest even, when stored.

ew_binary(x, y, out; n, op, rank, d0..d5, x_bcast, y_bcast, x_dtype, y_dtype, out_dtype):
    out = x (op) y, op 0 add 1 sub 2 mul 3 div 4 silu_mul (silu(x) * y) 5 maximum 6 minimum
    (both propagate NaN) 16 power (numpy's float32 power: C99 powf, its special values included);
    7 to 12 numpy's comparisons and 13 to 15 its logical ops (a bool out). Broadcasting: rank, d0..d5
    and the masks (gpud_protocol.ops.broadcast).
ew_where(cond, x, y, out; n, rank, d0..d5, cond_bcast, x_bcast, y_bcast, cond_dtype, x_dtype, y_dtype,
    out_dtype): out = x where cond is nonzero, else y; cond of any dtype (NaN is nonzero).
ew_unary(x, out; n, op, a, b, x_dtype, out_dtype): op 0 a*x, 1 exp, 2 rsqrt, 3 silu, 4 gelu (erf),
    5 gelu (tanh), 6 tanh, 7 clamp to [a, b] (NaN stays NaN).
ew_cast(x, out; n, x_dtype, out_dtype): between any two dtypes of the table. Float to integer truncates
    toward zero and saturates at the integer's range (NaN gives 0); integer to integer keeps the low
    bits (wraps), as numpy's astype; 64-bit integers to float are rounded to nearest even.
x, y and out of the arithmetic kernels are floats (FLOATS); out's dtype may be any of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, TensorInfo, need
from gpud_protocol.ops.broadcast import DIMS, broadcast_layout
from gpud_protocol.ops.dtypes import DTYPES, FLOATS

# numpy's comparisons: float operands, a bool out (1 or 0; false wherever NaN is, but not_equal)
COMPARISONS = {"greater": 7, "greater_equal": 8, "less": 9, "less_equal": 10, "equal": 11, "not_equal": 12}
# numpy's logical ops: operands of any dtype (nonzero is true, NaN too), a bool out
LOGICAL = {"logical_and": 13, "logical_or": 14, "logical_xor": 15}
BOOL_OUT = {**COMPARISONS, **LOGICAL}
BINARY_OPS = {
    **{"add": 0, "sub": 1, "mul": 2, "div": 3, "silu_mul": 4, "maximum": 5, "minimum": 6},
    **BOOL_OUT,
    "power": 16,
}
UNARY_OPS = {
    **{"scale": 0, "exp": 1, "rsqrt": 2, "silu": 3, "gelu": 4, "gelu_tanh": 5, "tanh": 6, "clamp": 7},
    **{"sqrt": 8, "log": 9, "abs": 10, "sigmoid": 11},
}
FAMILY = "elementwise"
CAST_TO_BOOL = "a cast to bool is not supported: make the mask on the host, or keep it numeric (nonzero is true)"


def _u32s(*names: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, "u32") for n in names)


def _codes(ops: dict[str, int]) -> tuple[str, ...]:
    """The op names of a table of op codes, by code."""
    return tuple(sorted(ops, key=ops.__getitem__))


def _dtypes(names: Sequence[str], tensors: Sequence[TensorInfo], codes: Sequence[int | float]) -> None:
    """Each tensor's dtype code is the one its dtype has."""
    for name, tensor, code in zip(names, tensors, codes, strict=True):
        need(tensor.dtype in DTYPES, f"{name} is {tensor.dtype}, which the elementwise kernels do not take")
        want = DTYPES[tensor.dtype].code
        need(code == want, f"{name}_dtype is {code}, {name} is {tensor.dtype} (code {want})")


def _floats(names: Sequence[str], tensors: Sequence[TensorInfo]) -> None:
    for name, tensor in zip(names, tensors, strict=True):
        need(tensor.dtype in FLOATS, f"{name} is {tensor.dtype}, not one of {list(FLOATS)}")


def _broadcast(t: Sequence[TensorInfo], n: int | float, passed: Sequence[int | float]) -> None:
    """The operands (all of t but the last) broadcast to out (the last), and the layout passed is theirs."""
    *operands, out = t
    want = broadcast_layout(out.shape, *(o.shape for o in operands))
    need(n == out.size, f"n is {n}, out has {out.size} elements")
    given = list(passed)
    need(given == want.scalars(), f"the broadcast layout (rank, d0..d5, masks) {given} is not {want.scalars()}")


def _binary() -> KernelSpec:
    names = ("x", "y", "out")

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        n, op, *rest = s
        if op not in LOGICAL.values():
            _floats(names[:2], t[:2])
        if op in BOOL_OUT.values():
            need(t[2].dtype == "bool", f"out is {t[2].dtype}: a comparison or logical op writes bool")
        else:
            _floats(names[2:], t[2:])
        _dtypes(names, t, rest[-3:])
        _broadcast(t, n, rest[:-3])
        need(op in BINARY_OPS.values(), f"unknown binary op {op}")

    scalars = _u32s("n", "op", "rank", *DIMS, "x_bcast", "y_bcast", "x_dtype", "y_dtype", "out_dtype")
    return KernelSpec("ew_binary", FAMILY, "binary", names, (2,), scalars, check, op_codes=_codes(BINARY_OPS))


def _where() -> KernelSpec:
    names = ("cond", "x", "y", "out")

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        n, *rest = s
        _floats(names[1:], t[1:])
        _dtypes(names, t, rest[-4:])
        _broadcast(t, n, rest[:-4])

    bcast = ("cond_bcast", "x_bcast", "y_bcast")
    scalars = _u32s("n", "rank", *DIMS, *bcast, "cond_dtype", "x_dtype", "y_dtype", "out_dtype")
    return KernelSpec("ew_where", FAMILY, "where", names, (3,), scalars, check)


def _unary() -> KernelSpec:
    names = ("x", "out")

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        n, op, a, b, *codes = s
        _floats(names, t)
        _dtypes(names, t, codes)
        need(x.shape == out.shape, f"out is {list(out.shape)}, x is {list(x.shape)}")
        need(n == x.size, f"n is {n}, x has {x.size} elements")
        need(op in UNARY_OPS.values(), f"unknown unary op {op}")
        need(not (math.isnan(a) or math.isnan(b)), "the scalars a and b may not be NaN")

    scalars = (("n", "u32"), ("op", "u32"), ("a", "f32"), ("b", "f32"), *_u32s("x_dtype", "out_dtype"))
    codes = tuple(name.removesuffix("_tanh") for name in _codes(UNARY_OPS))  # gelu(approximate="tanh") is gelu
    return KernelSpec("ew_unary", FAMILY, "unary", names, (1,), scalars, check, op_codes=codes)


def _cast() -> KernelSpec:
    names = ("x", "out")

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        n, *codes = s
        _dtypes(names, t, codes)
        need(out.dtype != "bool", CAST_TO_BOOL)
        need(x.shape == out.shape, f"out is {list(out.shape)}, x is {list(x.shape)}")
        need(n == x.size, f"n is {n}, x has {x.size} elements")

    return KernelSpec("ew_cast", FAMILY, "cast", names, (1,), _u32s("n", "x_dtype", "out_dtype"), check)


SPECS = [_binary(), _where(), _unary(), _cast()]

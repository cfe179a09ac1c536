"""Reductions and normalizations over the last axis of x (shape (..., length), float32, float16 or
bfloat16).

One workgroup (CUDA block) of 256 threads per row, grid folded into y past 65,535 rows (the kernels
compute their row as group.x + group.y * groups.x); the threads stride over the row, then a tree in
workgroup memory combines them. Everything accumulates in float32; float16 and bfloat16 are rounded
once when stored (to nearest even).

reduce_<x>(x, out; rows, length, op): out[r] (float32) = sum (op 0), mean (1), max (2) of row r.
argmax_<x>(x, out; rows, length): out[r] (int32) = the first index of row r's maximum (NaN-free rows);
    on CUDA a block of 1,024 threads per row.
    The out of both is x's leading axes, or x's shape with the last axis 1 (numpy's keepdims).
softmax_<x>(x, out; rows, length): max-subtracted softmax of each row, out like x.
softmax_mask_<x>(x, mask, out; rows, length, mask_rows): softmax of x + mask, the float32 mask's row
    r % mask_rows added to row r (mask broadcasts over x's leading axes); a row all -inf gives zeros.
rmsnorm_<x>_<w>(x, weight, out; rows, length, eps): x / sqrt(mean(x^2) + eps) * weight.
layernorm_<x>_<w>(x, weight, bias, out; rows, length, eps): (x - mean) / sqrt(var + eps) * weight + bias,
    the variance from a second pass over x - mean.
normalize_<x>(x, out; rows, length, eps): x / max(sqrt(sum(x^2)), eps) (torch.nn.functional.normalize).
<x> and <w> are f32, f16 or bf16: x's dtype, and that of weight and bias (which may differ from x's).

`length` is at most MAX_LENGTH (65,535 * 256): no thread's loop runs more than 65,535 iterations,
the most lavapipe runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpud_protocol.ops import BLOCK, KernelSpec, TensorInfo, need

DTYPES = ("float32", "float16", "bfloat16")
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
REDUCE_OPS = {"sum": 0, "mean": 1, "max": 2}
MAX_LENGTH = 65_535 * BLOCK  # a thread strides over a row: length / 256 iterations at most
ARGMAX_BLOCK = 1024  # CUDA: argmax reads a row with 4x the threads (an LM head's logits, every token)
FAMILY = "reduce"


def _U32S(*names: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, "u32") for n in names)


def rows_and_length(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, length) of x: the product of the leading axes, and the last axis."""
    need(len(shape) >= 1, "x must have at least one axis (the one reduced)")
    length = shape[-1]
    need(length >= 1, "the last axis of x is empty")
    need(length <= MAX_LENGTH, f"the last axis of x is {length} long; at most {MAX_LENGTH} is supported")
    rows = math.prod(shape[:-1])
    need(rows >= 1, f"x {list(shape)} has no rows")
    return rows, length


def mask_rows(mask: tuple[int, ...], x: tuple[int, ...]) -> int:
    """The rows of an additive mask that broadcasts over x's leading axes: its shape, leading 1s
    dropped, ends x's shape (numpy broadcasting whose result is x's shape)."""
    need(len(mask) >= 1 and len(mask) <= len(x), f"mask {list(mask)} does not broadcast to x {list(x)}")
    trimmed = list(mask)
    while len(trimmed) > 1 and trimmed[0] == 1:
        trimmed.pop(0)
    tail = tuple(x[len(x) - len(trimmed) :])
    need(tuple(trimmed) == tail, f"mask {list(mask)} does not broadcast to x {list(x)} (its shape must end x's)")
    return math.prod(trimmed[:-1])


def _check_x(x: TensorInfo, dtype: str, rows: int | float, length: int | float) -> None:
    need(x.dtype == dtype, f"x is {x.dtype}, this kernel takes {dtype}")
    want = rows_and_length(x.shape)
    need((rows, length) == want, f"rows and length passed ({rows}, {length}) do not match x {list(x.shape)}: {want}")


def _check_reduced(x: TensorInfo, out: TensorInfo) -> None:
    """out is x's leading axes, or x's shape with the last axis 1 (numpy's keepdims: the same elements)."""
    lead = x.shape[:-1]
    need(out.shape in (lead, (*lead, 1)), f"out is {list(out.shape)}, x's leading axes are {list(lead)}")


def _reduce(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        rows, length, op = s
        _check_x(x, dtype, rows, length)
        need(out.dtype == "float32", f"out is {out.dtype}, the reduction is float32")
        _check_reduced(x, out)
        need(op in REDUCE_OPS.values(), f"unknown reduction {op}")

    name = f"reduce_{SHORT[dtype]}"
    codes = tuple(sorted(REDUCE_OPS, key=REDUCE_OPS.__getitem__))
    return KernelSpec(name, FAMILY, "reduce", ("x", "out"), (1,), _U32S("rows", "length", "op"), check, op_codes=codes)


def _argmax(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        rows, length = s
        _check_x(x, dtype, rows, length)
        need(out.dtype == "int32", f"out is {out.dtype}, argmax is int32")
        _check_reduced(x, out)

    name = f"argmax_{SHORT[dtype]}"
    return KernelSpec(name, FAMILY, "argmax", ("x", "out"), (1,), _U32S("rows", "length"), check, block=ARGMAX_BLOCK)


def _like_x(x: TensorInfo, out: TensorInfo) -> None:
    need(out.dtype == x.dtype, f"out is {out.dtype}, x is {x.dtype}")
    need(out.shape == x.shape, f"out is {list(out.shape)}, x is {list(x.shape)}")


def _softmax(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        rows, length = s
        _check_x(x, dtype, rows, length)
        _like_x(x, out)

    name = f"softmax_{SHORT[dtype]}"
    return KernelSpec(name, FAMILY, "softmax", ("x", "out"), (1,), _U32S("rows", "length"), check)


def _softmax_mask(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, mask, out = t
        rows, length, mrows = s
        _check_x(x, dtype, rows, length)
        _like_x(x, out)
        need(mask.dtype == "float32", f"mask is {mask.dtype}, masks are float32")
        want = mask_rows(mask.shape, x.shape)
        need(mrows == want, f"mask_rows passed ({mrows}) does not match mask {list(mask.shape)}: {want}")

    name = f"softmax_mask_{SHORT[dtype]}"
    scalars = _U32S("rows", "length", "mask_rows")
    return KernelSpec(name, FAMILY, "softmax", ("x", "mask", "out"), (2,), scalars, check)


def _check_eps(eps: int | float) -> None:
    need(isinstance(eps, float | int) and math.isfinite(eps) and eps >= 0, f"eps must be finite and >= 0, not {eps}")


def _norm(op: str, dtype: str, wdtype: str) -> KernelSpec:
    params = ("weight",) if op == "rmsnorm" else ("weight", "bias")

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, *affine, out = t
        rows, length, eps = s
        _check_x(x, dtype, rows, length)
        _like_x(x, out)
        for pname, p in zip(params, affine, strict=True):
            need(p.dtype == wdtype, f"{pname} is {p.dtype}, this kernel takes {wdtype}")
            need(p.shape == (x.shape[-1],), f"{pname} is {list(p.shape)}, x's last axis is {x.shape[-1]}")
        _check_eps(eps)

    name = f"{op}_{SHORT[dtype]}_{SHORT[wdtype]}"
    tensors = ("x", *params, "out")
    scalars = (("rows", "u32"), ("length", "u32"), ("eps", "f32"))
    return KernelSpec(name, FAMILY, op, tensors, (len(tensors) - 1,), scalars, check)


def _normalize(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        rows, length, eps = s
        _check_x(x, dtype, rows, length)
        _like_x(x, out)
        _check_eps(eps)

    scalars = (("rows", "u32"), ("length", "u32"), ("eps", "f32"))
    return KernelSpec(f"normalize_{SHORT[dtype]}", FAMILY, "normalize", ("x", "out"), (1,), scalars, check)


SPECS = [
    *(_reduce(d) for d in DTYPES),
    *(_argmax(d) for d in DTYPES),
    *(_softmax(d) for d in DTYPES),
    *(_softmax_mask(d) for d in DTYPES),
    *(_norm(op, d, w) for op in ("rmsnorm", "layernorm") for d in DTYPES for w in DTYPES),
    *(_normalize(d) for d in DTYPES),
]

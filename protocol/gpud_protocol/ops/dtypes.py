"""The dtypes of the elementwise kernels, as one table.

The elementwise kernels take each tensor's dtype as a scalar (its `code` here) and read and write
through 4-byte words, so one kernel serves every dtype and every mix: adding a dtype is an entry
here plus a case in the kernels' load and store (gpud/ops/elementwise.*), not new kernels.
Codes are part of the kernels' interface: never renumber one.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Kind = Literal["float", "int", "uint"]


class DType(NamedTuple):
    code: int  # the value the kernels switch on
    size: int  # bytes per element
    kind: Kind


DTYPES: dict[str, DType] = {
    "float32": DType(0, 4, "float"),
    "float16": DType(1, 2, "float"),
    "int32": DType(2, 4, "int"),
    "uint32": DType(3, 4, "uint"),
    "int8": DType(4, 1, "int"),
    "uint8": DType(5, 1, "uint"),
    "int16": DType(6, 2, "int"),
    "uint16": DType(7, 2, "uint"),
    "int64": DType(8, 8, "int"),
    "uint64": DType(9, 8, "uint"),
    "bfloat16": DType(10, 2, "float"),  # the top 16 bits of a float32; numpy has no such dtype
    # numpy's bool, one byte of 0 or 1: the kernels read it as uint8 (a cond, a mask, a cast's source);
    # none writes it (the cast's rule refuses it as a target: truncating 2.5 would store 2).
    "bool": DType(5, 1, "uint"),
}
FLOATS = tuple(name for name, d in DTYPES.items() if d.kind == "float")  # what arithmetic takes
WIDEST = "float32"  # holds every other float dtype exactly: the result of mixing two


def result_dtype(*dtypes: str) -> str:
    """numpy's and torch's promotion among FLOATS: one dtype stays, a mix is the wider one. Every mix
    is float32 (float16 with bfloat16 too, as in torch)."""
    return dtypes[0] if all(d == dtypes[0] for d in dtypes) else WIDEST


def per_thread(dtype: str) -> int:
    """Output elements per thread: one 4-byte word of them (one element of 8 bytes)."""
    return max(1, 4 // DTYPES[dtype].size)


def threads(n: int, out_dtype: str) -> int:
    """Threads of an elementwise kernel writing `n` elements of `out_dtype`."""
    per = per_thread(out_dtype)
    return -(-n // per)

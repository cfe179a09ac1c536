"""numpy.matmul's shapes in the forms the matmul kernels take (`numpy_forms`), for gpud_client.ops.matmul."""

from __future__ import annotations

import math

from gpud_protocol.ops import OpError
from gpud_protocol.ops.broadcast import broadcast_shapes


def numpy_forms(
    xs: tuple[int, ...], ws: tuple[int, ...], wt: bool
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """numpy.matmul of x and w in the forms the kernels take: (x's form, w's form, the product's
    form, numpy's shape of the product). A 1-D x is one row and a 1-D w one column, their axis
    dropped from the product; batch axes broadcast where one side's are all ones or both sides' are
    the same (then they fold into one). OpError names what else numpy would broadcast."""
    if not xs or not ws:
        raise OpError(f"x is {list(xs)} and w {list(ws)}: no 0-d operand (numpy's rule too)")
    x2 = (1, *xs) if len(xs) == 1 else xs
    w2 = ((1, *ws) if wt else (*ws, 1)) if len(ws) == 1 else ws
    xb, wb = x2[:-2], w2[:-2]
    try:
        batch = broadcast_shapes(xb, wb)
    except OpError:
        raise OpError(f"batch axes {list(xb)} of x and {list(wb)} of w do not broadcast") from None
    m, k = x2[-2:]
    n = w2[-2] if wt else w2[-1]
    shape = (*batch, *((m,) if len(xs) > 1 else ()), *((n,) if len(ws) > 1 else ()))
    x_rows, w_mats = math.prod(xb), math.prod(wb)
    if x_rows == w_mats == 1:
        return (m, k), w2[-2:], (m, n), shape
    if w_mats == 1:  # one weight matrix: x's batches are more rows
        return (x_rows, m, k), w2[-2:], (x_rows, m, n), shape
    if x_rows == 1:  # one x for every weight matrix
        return (m, k), (w_mats, *w2[-2:]), (w_mats, m, n), shape
    if (1,) * (len(batch) - len(xb)) + xb != (1,) * (len(batch) - len(wb)) + wb:
        raise OpError(
            f"batch axes {list(xb)} of x and {list(wb)} of w: gpud broadcasts batch axes where one side's "
            "are all ones or both sides' are the same (make the other side's copies with gpu.ops.contiguous)"
        )
    return (x_rows, m, k), (w_mats, *w2[-2:]), (x_rows, m, n), shape

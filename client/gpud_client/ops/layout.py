"""Layout: `contiguous`, a view's elements copied into dense memory by a kernel (any view, any dtype)."""

from __future__ import annotations

import math
from typing import Any

from gpud_client.dtypes import dtype_name
from gpud_client.errors import InvalidArgument
from gpud_client.ops.base import OpsBase, _info
from gpud_protocol.ops import OpError, layout_problem
from gpud_protocol.ops.layout import geometry, grid, kernel_name


class LayoutOps(OpsBase):
    def contiguous(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        """x's elements, in row-major order, in dense memory: what every op takes. A transposed,
        permuted or narrowed view (`Tensor.transpose`...) is copied by a kernel into a new tensor (or
        `out`); a tensor every kernel takes as it is (dense, at an offset of a multiple of 256 bytes)
        is returned itself, unless `out` is given."""
        info = _info(x)
        if out is None and layout_problem(info, "x") is None:
            return x
        dtype = dtype_name(x)
        result = self._out(out, tuple(x.shape), dtype, x, graph)
        n = math.prod(x.shape)
        if n == 0:
            return result
        try:
            view = geometry(info)
        except OpError as exc:
            raise InvalidArgument(str(exc), op="contiguous") from None
        self._run(kernel_name(dtype), grid(n, dtype), [x, result], [n, *view], graph)
        return result

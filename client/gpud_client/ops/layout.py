"""Layout: `contiguous`, a view's elements copied into dense memory by a kernel (any view, any dtype)."""

from __future__ import annotations

import math
from typing import Any

from gpud_client.errors import InvalidArgument
from gpud_client.ops.base import OpsBase, Planned, info_of
from gpud_protocol.ops import OpError, TensorInfo, layout_problem
from gpud_protocol.ops.layout import geometry, grid, kernel_name

AS_IT_IS = Planned((), "", None)  # the plan of `contiguous` of a tensor every kernel takes, without out=: x itself


class LayoutOps(OpsBase):
    def contiguous(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        """x's elements, in row-major order, in dense memory: what every op takes. A transposed,
        permuted or narrowed view (`Tensor.transpose`...) is copied by a kernel into a new tensor (or
        `out`); a tensor every kernel takes as it is (dense, at an offset of a multiple of 256 bytes)
        is returned itself, unless `out` is given."""
        info = info_of(x)
        key = ("contiguous", info, None if out is None else info_of(out))
        try:  # `_plan`'s lookup, inlined
            plan = self._plans.get(key)
        except TypeError:
            plan = None
        if plan is None:
            plan = self._plan(key, self._plan_contiguous, x, info, out)
        if plan is AS_IT_IS:
            return x
        return self._execute(plan, [x], out, x, graph)

    def _plan_contiguous(self, x: Any, info: TensorInfo, out: Any) -> Planned:
        if out is None and layout_problem(info, "x") is None:
            return AS_IT_IS
        dtype, shape = info.dtype, tuple(x.shape)
        n = math.prod(shape)
        if n == 0:
            return Planned(shape, dtype, None)
        try:
            view = geometry(info)
        except OpError as exc:
            raise InvalidArgument(str(exc), op="contiguous") from None
        result = TensorInfo(dtype, shape) if out is None else out
        return Planned(shape, dtype, self._check(kernel_name(dtype), grid(n, dtype), [x, result], [n, *view]))

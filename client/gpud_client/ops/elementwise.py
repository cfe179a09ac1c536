"""Elementwise ops: add, sub, mul, div, silu_mul (numpy-style broadcasting over leading axes), scale, exp,
rsqrt, silu, gelu (exact erf form, or tanh), tanh, and casts between float32 and float16."""

from __future__ import annotations

import math
from typing import Any

from gpud_client.errors import InvalidArgument
from gpud_client.ops.base import OpsBase, dtype_name
from gpud_protocol.ops import OpError, broadcast_shape, grid_1d
from gpud_protocol.ops.elementwise import BINARY_OPS, SHORT, UNARY_OPS


class ElementwiseOps(OpsBase):
    def add(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        return self._binary("add", x, y, out, graph)

    def sub(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        return self._binary("sub", x, y, out, graph)

    def mul(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        return self._binary("mul", x, y, out, graph)

    def div(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        return self._binary("div", x, y, out, graph)

    def silu_mul(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        """silu(x) * y, in one pass (the gate of a SwiGLU MLP)."""
        return self._binary("silu_mul", x, y, out, graph)

    def scale(self, x: Any, a: float, *, out: Any = None, graph: Any = None) -> Any:
        return self._unary("scale", x, out, graph, a)

    def exp(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        return self._unary("exp", x, out, graph)

    def rsqrt(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        return self._unary("rsqrt", x, out, graph)

    def silu(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        return self._unary("silu", x, out, graph)

    def gelu(self, x: Any, *, approximate: str = "none", out: Any = None, graph: Any = None) -> Any:
        """GELU: the exact erf form, or approximate="tanh"."""
        if approximate not in ("none", "tanh"):
            raise InvalidArgument(f"gelu: approximate is 'none' or 'tanh', not {approximate!r}")
        return self._unary("gelu" if approximate == "none" else "gelu_tanh", x, out, graph)

    def tanh(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        return self._unary("tanh", x, out, graph)

    def cast(self, x: Any, dtype: str, *, out: Any = None, graph: Any = None) -> Any:
        """float32 <-> float16 (rounded to nearest even)."""
        src, dst = dtype_name(x), str(dtype)
        if (src, dst) not in (("float32", "float16"), ("float16", "float32")):
            raise InvalidArgument(f"cast: float32 <-> float16 only, not {src} -> {dst}")
        shape = tuple(x.shape)
        result = self._out(out, shape, dst, x, graph)
        n = math.prod(shape)
        self._run(f"cast_{SHORT[src]}_{SHORT[dst]}", grid_1d(n), [x, result], [n], graph)
        return result

    def _binary(self, op: str, x: Any, y: Any, out: Any, graph: Any) -> Any:
        dtype = dtype_name(x)
        if dtype not in SHORT:
            raise InvalidArgument(f"{op}: float32 or float16 tensors, not {dtype}")
        try:
            shape = broadcast_shape(tuple(x.shape), tuple(y.shape))
        except OpError as exc:
            raise InvalidArgument(f"{op}: {exc}") from None
        result = self._out(out, shape, dtype, x, graph)
        n, nx, ny = math.prod(shape), math.prod(x.shape), math.prod(y.shape)
        self._run(f"binary_{SHORT[dtype]}", grid_1d(n), [x, y, result], [n, nx, ny, BINARY_OPS[op]], graph)
        return result

    def _unary(self, op: str, x: Any, out: Any, graph: Any, a: float = 0.0) -> Any:
        dtype = dtype_name(x)
        if dtype not in SHORT:
            raise InvalidArgument(f"{op}: float32 or float16 tensors, not {dtype}")
        shape = tuple(x.shape)
        result = self._out(out, shape, dtype, x, graph)
        n = math.prod(shape)
        self._run(f"unary_{SHORT[dtype]}", grid_1d(n), [x, result], [n, UNARY_OPS[op], float(a)], graph)
        return result

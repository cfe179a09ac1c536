"""Python's operators on tensors, as numpy's and torch's: `x + y`, `2.0 * x`, `x ** 2`, `x @ w`, `-x`, `x > 0`,
each the op of `gpu.ops` of that name (numbers as weak scalars; a recording's tensors record into
their graph). `==` and `!=` stay identity (tensors are kept in sets and dicts): use `ops.equal`. numpy
arrays defer to these (`__array_ufunc__ = None`), so `host + x` is the op's clear refusal of host
memory rather than an array of objects."""

from __future__ import annotations

from typing import Any


class Operators:
    __slots__ = ()
    __array_ufunc__ = None

    def _ops(self) -> Any:
        """gpu.ops of the client this tensor belongs to."""
        raise NotImplementedError

    def _call(self, op: str, *operands: Any) -> Any:
        graph = None
        for o in operands:  # a recording's tensor records the op (a session's tensor has graph None)
            if (graph := getattr(o, "graph", None)) is not None:
                break
        return getattr(self._ops(), op)(*operands, graph=graph)

    def _call2(self, op: str, x: Any, y: Any) -> Any:
        """`_call` of two operands (every binary operator: `x + y`, `s * 0.5`), without its loop."""
        graph = getattr(x, "graph", None)
        if graph is None:
            graph = getattr(y, "graph", None)
            if graph is None:  # a session's tensors: the call without the keyword
                return getattr(self._ops(), op)(x, y)
        return getattr(self._ops(), op)(x, y, graph=graph)

    def __add__(self, other: Any) -> Any:
        return self._call2("add", self, other)

    def __radd__(self, other: Any) -> Any:
        return self._call2("add", other, self)

    def __sub__(self, other: Any) -> Any:
        return self._call2("sub", self, other)

    def __rsub__(self, other: Any) -> Any:
        return self._call2("sub", other, self)

    def __mul__(self, other: Any) -> Any:
        return self._call2("mul", self, other)

    def __rmul__(self, other: Any) -> Any:
        return self._call2("mul", other, self)

    def __truediv__(self, other: Any) -> Any:
        return self._call2("div", self, other)

    def __rtruediv__(self, other: Any) -> Any:
        return self._call2("div", other, self)

    def __pow__(self, other: Any) -> Any:
        return self._call2("power", self, other)

    def __rpow__(self, other: Any) -> Any:
        return self._call2("power", other, self)

    def __matmul__(self, other: Any) -> Any:
        return self._call2("matmul", self, other)

    def __rmatmul__(self, other: Any) -> Any:
        return self._call2("matmul", other, self)

    def __neg__(self) -> Any:
        return self._call("negative", self)

    def __abs__(self) -> Any:
        return self._call("abs", self)

    def __gt__(self, other: Any) -> Any:
        return self._call2("greater", self, other)

    def __ge__(self, other: Any) -> Any:
        return self._call2("greater_equal", self, other)

    def __lt__(self, other: Any) -> Any:
        return self._call2("less", self, other)

    def __le__(self, other: Any) -> Any:
        return self._call2("less_equal", self, other)

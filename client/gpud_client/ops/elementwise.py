"""Elementwise ops, with numpy's and torch's names and semantics: add, sub, mul, div, silu_mul, maximum,
minimum, power and where broadcast as numpy does; scale, exp, rsqrt, silu, gelu (exact erf form, or tanh), tanh,
clamp; cast between any two dtypes of the daemon's elementwise table (gpud_protocol.ops.dtypes).

Float dtypes (float32, float16, bfloat16) mix: two different ones give float32 unless `out=` gives
another float dtype. Everything is computed in float32 and rounded once when stored. On WebGPU, float
calls over a multiple of 4 elements (and broadcasting over at most two merged axes, the inner one a
multiple of 4) run ew_binary4 / ew_unary4, four elements a thread (gpud_protocol.ops.elementwise4); on
CUDA, calls of one float dtype without broadcasting run ew_binary16 / ew_unary16, 16 bytes of each
tensor a thread (gpud_protocol.ops.elementwise16)."""

from __future__ import annotations

import math
from typing import Any

from gpud_client.dtypes import dtype_name, name_of
from gpud_client.errors import InvalidArgument
from gpud_client.operands import foreign
from gpud_client.ops.base import OpsBase, Planned, info_of, signed
from gpud_protocol.ops import OpError, TensorInfo, grid_1d
from gpud_protocol.ops.broadcast import broadcast_layout, broadcast_shapes
from gpud_protocol.ops.dtypes import DTYPES, FLOATS, result_dtype, threads
from gpud_protocol.ops.elementwise import BINARY_OPS, BOOL_OUT, CAST_TO_BOOL, LOGICAL, UNARY_OPS
from gpud_protocol.ops.elementwise4 import WIDTH, binary4_applies, unary4_applies
from gpud_protocol.ops.elementwise16 import binary16_applies, unary16_applies, words

UNKNOWN = 2**32 - 1  # the code of a dtype outside the table: the op's check refuses it by name


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

    def greater(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        """x > y elementwise, broadcast, as bool (numpy.greater; false where either is NaN)."""
        return self._binary("greater", x, y, out, graph)

    def greater_equal(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        return self._binary("greater_equal", x, y, out, graph)

    def less(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        return self._binary("less", x, y, out, graph)

    def less_equal(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        return self._binary("less_equal", x, y, out, graph)

    def equal(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        return self._binary("equal", x, y, out, graph)

    def not_equal(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        """x != y as bool (numpy.not_equal: true where either is NaN)."""
        return self._binary("not_equal", x, y, out, graph)

    def logical_and(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        """numpy.logical_and of operands of any dtype (nonzero is true, NaN too), as bool."""
        return self._binary("logical_and", x, y, out, graph)

    def logical_or(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        return self._binary("logical_or", x, y, out, graph)

    def logical_xor(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        return self._binary("logical_xor", x, y, out, graph)

    def logical_not(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        """numpy.logical_not, as bool: x == 0 (NaN is true, so its not is false)."""
        return self._binary("logical_xor", x, True, out, graph)

    def maximum(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        """The larger of x and y, elementwise; NaN if either is NaN (numpy.maximum, torch.maximum)."""
        return self._binary("maximum", x, y, out, graph)

    def minimum(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        """The smaller of x and y, elementwise; NaN if either is NaN (numpy.minimum, torch.minimum)."""
        return self._binary("minimum", x, y, out, graph)

    def power(self, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        """x to the power y, elementwise (numpy.power of floats, torch.pow): C99 powf's special values
        (x ** 0 is 1 and 1 ** y is 1, NaN or not; a negative x to a non-integer y is NaN)."""
        return self._binary("power", x, y, out, graph)

    def where(self, cond: Any, x: Any, y: Any, *, out: Any = None, graph: Any = None) -> Any:
        """x where cond is nonzero, else y (numpy.where, torch.where), the three broadcast together.
        cond may be of any dtype, bool included (a float is tested by value: NaN is nonzero); x and y
        are floats."""
        if foreign(x) or foreign(y):  # numbers as 0-d tensors of the other's dtype
            x, y = self._constants.operands(x, y, graph=graph)
        operands = {"cond": cond, "x": x, "y": y}
        self._check_dtypes("where", {"x": x, "y": y})
        dtypes = [dtype_name(t) for t in operands.values()]
        shape = self._broadcast("where", *operands.values())
        result = self._out(out, shape, result_dtype(*dtypes[1:]), x, graph)
        lay = self._layout("where", result, *operands.values())
        n = math.prod(result.shape)
        codes = [_code(d) for d in (*dtypes, dtype_name(result))]
        scalars = [n, *lay, *codes]
        self._run("ew_where", grid_1d(threads(n, _table_dtype(result))), [cond, x, y, result], scalars, graph)
        return result

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
            raise InvalidArgument(f"approximate is 'none' or 'tanh', not {approximate!r}", op="gelu")
        return self._unary("gelu" if approximate == "none" else "gelu_tanh", x, out, graph)

    def tanh(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        return self._unary("tanh", x, out, graph)

    def sqrt(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        """numpy.sqrt: NaN below zero, -0.0 kept."""
        return self._unary("sqrt", x, out, graph)

    def log(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        """numpy.log: -inf at zero, NaN below it."""
        return self._unary("log", x, out, graph)

    def abs(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        """numpy.abs: the sign bit cleared (NaN stays NaN)."""
        return self._unary("abs", x, out, graph)

    def sigmoid(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        """torch.sigmoid: 1 / (1 + exp(-x))."""
        return self._unary("sigmoid", x, out, graph)

    def negative(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        """numpy.negative: -x (scale by -1, exact)."""
        return self._unary("scale", x, out, graph, -1.0)

    def clamp(
        self, x: Any, min: float | None = None, max: float | None = None, *, out: Any = None, graph: Any = None
    ) -> Any:
        """torch.clamp with scalar bounds: min(max(x, min), max) (so max wins where min > max); NaN stays
        NaN. At least one bound."""
        if min is None and max is None:
            raise InvalidArgument("at least one of min and max must be given", op="clamp")
        lo, hi = _bound("min", min, -math.inf), _bound("max", max, math.inf)
        return self._unary("clamp", x, out, graph, lo, hi)

    def cast(self, x: Any, dtype: Any, *, out: Any = None, graph: Any = None) -> Any:
        """x as `dtype` (numpy's astype): floats round to nearest even; float to integer truncates toward
        zero and saturates at the integer's range (NaN gives 0); integer to integer keeps the low bits."""
        src, dst = dtype_name(x), name_of(dtype)
        for what, name in (("x", src), ("the target dtype", dst)):
            if name not in DTYPES:
                raise InvalidArgument(f"{what} is {name}; cast takes {list(DTYPES)}", op="cast")
        if dst == "bool":
            raise InvalidArgument(CAST_TO_BOOL, op="cast")
        if out is not None and dtype_name(out) != dst:
            raise InvalidArgument(f"out is {dtype_name(out)}, the cast is to {dst}", op="cast")
        result = self._out(out, tuple(x.shape), dst, x, graph)
        n = math.prod(x.shape)
        codes = [_code(src), _code(dst)]
        self._run("ew_cast", grid_1d(threads(n, _table_dtype(result))), [x, result], [n, *codes], graph)
        return result

    def _binary(self, op: str, x: Any, y: Any, out: Any, graph: Any) -> Any:
        xi, yi = getattr(x, "info", None), getattr(y, "info", None)  # a session's or a recording's tensors
        if xi is None or yi is None:  # a number among them (a 0-d tensor then), or a TensorInfo
            x, y = self._constants.pair(x, y, graph)
            xi, yi = info_of(x), info_of(y)
        key = ("_binary", op, xi, yi, None if out is None else info_of(out))
        try:  # `_plan`'s lookup, inlined
            plan = self._plans.get(key)
        except TypeError:
            plan = None
        if plan is None:
            plan = self._plan(key, self._plan_binary, op, x, y, out)
        return self._execute(plan, [x, y], out, x, graph)

    def _plan_binary(self, op: str, x: Any, y: Any, out: Any) -> Planned:
        if op not in LOGICAL:
            self._check_dtypes(op, {"x": x, "y": y})
        dtypes = [dtype_name(x), dtype_name(y)]
        shape = self._broadcast(op, x, y)
        produced = "bool" if op in BOOL_OUT else result_dtype(*dtypes)
        result = TensorInfo(produced, shape) if out is None else out
        lay = self._layout(op, result, x, y)
        n = math.prod(result.shape)
        codes = [_code(d) for d in (*dtypes, dtype_name(result))]
        scalars = [n, BINARY_OPS[op], *lay, *codes]
        counts = [math.prod(x.shape), math.prod(y.shape)]
        backend = self._client.backend
        if backend == "webgpu" and binary4_applies(n, lay[0], lay[1:], codes, counts):
            name, grid = "ew_binary4", grid_1d(n // WIDTH)
        elif backend == "cuda" and binary16_applies(n, lay[-2:], codes, [_offset(x), _offset(y), _offset(result)]):
            name, grid = "ew_binary16", grid_1d(words(n, codes[0]))
        else:
            name, grid = "ew_binary", grid_1d(threads(n, _table_dtype(result)))
        return Planned(shape, dtype_name(result), self._check(name, grid, [x, y, result], scalars))

    def _unary(self, op: str, x: Any, out: Any, graph: Any, a: float = 0.0, b: float = 0.0) -> Any:
        a, b = float(a), float(b)
        key = ("_unary", op, info_of(x), None if out is None else info_of(out), signed(a), signed(b))
        try:  # `_plan`'s lookup, inlined
            plan = self._plans.get(key)
        except TypeError:
            plan = None
        if plan is None:
            plan = self._plan(key, self._plan_unary, op, x, out, a, b)
        return self._execute(plan, [x], out, x, graph)

    def _plan_unary(self, op: str, x: Any, out: Any, a: float, b: float) -> Planned:
        name = "gelu" if op == "gelu_tanh" else op
        self._check_dtypes(name, {"x": x})
        result = TensorInfo(dtype_name(x), tuple(x.shape)) if out is None else out
        n = math.prod(x.shape)
        codes = [_code(dtype_name(x)), _code(dtype_name(result))]
        scalars = [n, UNARY_OPS[op], a, b, *codes]
        if self._client.backend == "webgpu" and unary4_applies(n, codes):
            name, grid = "ew_unary4", grid_1d(n // WIDTH)
        elif self._client.backend == "cuda" and unary16_applies(n, codes, [_offset(x), _offset(result)]):
            name, grid = "ew_unary16", grid_1d(words(n, codes[0]))
        else:
            name, grid = "ew_unary", grid_1d(threads(n, _table_dtype(result)))
        return Planned(tuple(x.shape), dtype_name(result), self._check(name, grid, [x, result], scalars))

    def _check_dtypes(self, op: str, tensors: dict[str, Any]) -> None:
        for name, tensor in tensors.items():
            if dtype_name(tensor) not in FLOATS:
                raise InvalidArgument(f"{name} is {dtype_name(tensor)}, not one of {list(FLOATS)}", op=op)

    def _broadcast(self, op: str, *tensors: Any) -> tuple[int, ...]:
        try:
            return broadcast_shapes(*(tuple(t.shape) for t in tensors))
        except OpError as exc:
            raise InvalidArgument(str(exc), op=op) from None

    def _layout(self, op: str, result: Any, *operands: Any) -> list[int]:
        """The broadcast layout of the operands into `result` (its shape: numpy's, or that of out=)."""
        try:
            return broadcast_layout(tuple(result.shape), *(tuple(t.shape) for t in operands)).scalars()
        except OpError as exc:
            raise InvalidArgument(str(exc), op=op) from None


def _bound(name: str, value: Any, default: float) -> float:
    if value is None:
        return default
    try:
        bound = float(value)
    except (TypeError, ValueError):
        bound = math.nan
    if math.isnan(bound):
        raise InvalidArgument(f"{name} must be a number (not NaN), not {value!r}", op="clamp")
    return bound


def _offset(tensor: Any) -> int:
    """Elements into its tensor (a view's offset; 0 for a tensor, a new output's info or a recording's)."""
    return int(getattr(tensor, "offset", 0))


def _code(dtype: str) -> int:
    entry = DTYPES.get(dtype)
    return UNKNOWN if entry is None else entry.code


def _table_dtype(tensor: Any) -> str:
    """The tensor's dtype if the table has it (else any: the op's check refuses it before it runs)."""
    name = dtype_name(tensor)
    return name if name in DTYPES else "float32"

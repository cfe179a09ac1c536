"""Numbers as operands (`ops.add(x, 1.0)`, `ops.where(m, x, 0.0)`), as numpy and torch take them: a
number becomes a 0-d tensor of the other operand's float dtype (a weak scalar: float16 x + 1.0 stays
float16) on its device, uploaded once and kept for the next call with that number (bounded, the
least recently used freed one at a time), the client's own rather than any scope's. In a recording,
a 0-d tensor of the graph's, written by a recorded upload (nothing of the session's to outlive)."""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from gpud_client.dtypes import float32_to_bits
from gpud_client.operands import foreign, not_a_tensor
from gpud_client.scope import disown
from gpud_client.tensor import Tensor
from gpud_protocol.ops.dtypes import FLOATS

if TYPE_CHECKING:
    from gpud_client.client_base import ClientBase

KEPT = 64  # numbers kept as tensors, per client
NUMBERS = (int, float, bool, np.integer, np.floating, np.bool_)
_PLAIN = {float, int}  # the numbers `Constants.pair` takes without `operands`' general path


class Constants:
    def __init__(self, client: ClientBase) -> None:
        self._client = client
        # by (dtype, device, number), the least recently used first: past KEPT it is freed (LruCache's order,
        # without its method calls: `x * 0.5` asks every step)
        self._kept: OrderedDict[tuple[str, int, Any], Tensor] = OrderedDict()
        self._recorded: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], Any]] = weakref.WeakKeyDictionary()

    def operands(self, *values: Any, graph: Any = None) -> list[Any]:
        """`values` with each number as a tensor like the first operand that is no number; a value
        that is neither (a numpy array, a list) is refused naming the op and the argument."""
        like = None
        for v in values:
            if not isinstance(v, NUMBERS):
                like = v
                break
        out = []
        for v in values:
            if isinstance(v, NUMBERS) and like is not None:
                try:
                    out.append(self.of(v, like, graph))
                except OverflowError:  # an int past every float
                    raise not_a_tensor(v) from None
            elif foreign(v):
                raise not_a_tensor(v)
            else:
                out.append(v)
        return out

    def pair(self, x: Any, y: Any, graph: Any) -> tuple[Any, Any] | list[Any]:
        """`operands(x, y)`, for a session's tensor and a Python number (`x * 0.5`) without its loops."""
        try:
            if type(x) is Tensor and type(y) in _PLAIN:
                return x, self.of(y, x, graph)
            if type(y) is Tensor and type(x) in _PLAIN:
                return self.of(x, y, graph), y
        except OverflowError:  # an int past every float
            raise not_a_tensor(y if type(x) is Tensor else x) from None
        return self.operands(x, y, graph=graph)

    def of(self, value: Any, like: Any, graph: Any = None) -> Any:
        """`value` as a 0-d tensor of `like`'s float dtype (else float32), on `like`'s device."""
        name: str | None
        device: int | None
        if type(like) is Tensor:  # a session's tensor: its own attributes
            name, device = like.dtype_name, like.device
        else:
            name, device = getattr(like, "dtype_name", None), getattr(like, "device", None)
        dtype = name if name in FLOATS else "float32"
        if graph is not None:
            return self._recorded_constant(float(value), dtype, graph)
        where = self._client.device if device is None else int(device)
        # the number itself, but for zeros (-0.0 equals 0.0) and NaN (equal to nothing): their bits
        key = (dtype, where, value if value == value and value else float(value).hex())
        kept = self._kept
        tensor = kept.get(key)
        if tensor is not None and not tensor._freed:  # (a tensor of its own: `freed` is `_freed`)
            kept.move_to_end(key)
            return tensor
        client: Any = self._client
        host = float(value) if dtype == "bfloat16" else np.asarray(value, dtype)
        tensor = client.tensor(host, dtype="bfloat16" if dtype == "bfloat16" else None, device=where)
        disown(client, tensor)
        kept[key] = tensor
        kept.move_to_end(key)
        while len(kept) > KEPT:
            kept.popitem(last=False)[1].free()
        return tensor

    def _recorded_constant(self, value: float, dtype: str, graph: Any) -> Any:
        made = self._recorded.setdefault(graph, {})
        key = (dtype, value.hex())
        if key not in made:
            data = float32_to_bits(np.asarray(value, np.float32)) if dtype == "bfloat16" else np.asarray(value, dtype)
            made[key] = graph.empty((), dtype)
            graph.upload(made[key], data)
        return made[key]

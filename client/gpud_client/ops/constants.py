"""Numbers as operands (`ops.add(x, 1.0)`, `ops.where(m, x, 0.0)`), as numpy and torch take them: a
number becomes a 0-d tensor of the other operand's float dtype (a weak scalar: float16 x + 1.0 stays
float16) on its device, uploaded once and kept for the next call with that number (bounded, the
least recently used freed one at a time), the client's own rather than any scope's. In a recording,
a 0-d tensor of the graph's, written by a recorded upload (nothing of the session's to outlive)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from gpud_client.dtypes import float32_to_bits
from gpud_client.operands import foreign, not_a_tensor
from gpud_client.scope import disown
from gpud_protocol import LruCache
from gpud_protocol.ops.dtypes import FLOATS

if TYPE_CHECKING:
    from gpud_client.client_base import ClientBase
    from gpud_client.tensor import Tensor

KEPT = 64  # numbers kept as tensors, per client
NUMBERS = (int, float, bool, np.integer, np.floating, np.bool_)


class Constants:
    def __init__(self, client: ClientBase) -> None:
        self._client = client
        self._kept: LruCache[tuple[str, int, Any], Tensor] = LruCache(KEPT, lambda _key, t: t.free())
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

    def of(self, value: Any, like: Any, graph: Any = None) -> Any:
        """`value` as a 0-d tensor of `like`'s float dtype (else float32), on `like`'s device."""
        dtype = like.dtype_name if getattr(like, "dtype_name", None) in FLOATS else "float32"
        if graph is not None:
            return self._recorded_constant(float(value), dtype, graph)
        device = getattr(like, "device", None)
        where = self._client.device if device is None else int(device)
        # the number itself, but for zeros (-0.0 equals 0.0) and NaN (equal to nothing): their bits
        key = (dtype, where, value if value == value and value else float(value).hex())
        tensor = self._kept.get(key)
        if tensor is None or tensor.freed:
            client: Any = self._client
            host = float(value) if dtype == "bfloat16" else np.asarray(value, dtype)
            tensor = client.tensor(host, dtype="bfloat16" if dtype == "bfloat16" else None, device=where)
            disown(client, tensor)
            self._kept.put(key, tensor)
        return tensor

    def _recorded_constant(self, value: float, dtype: str, graph: Any) -> Any:
        made = self._recorded.setdefault(graph, {})
        key = (dtype, value.hex())
        if key not in made:
            data = float32_to_bits(np.asarray(value, np.float32)) if dtype == "bfloat16" else np.asarray(value, dtype)
            made[key] = graph.empty((), dtype)
            graph.upload(made[key], data)
        return made[key]

"""The values of a replay graph's recording: its tensors (inputs, bound tensors, intermediates and
views) and its scalars, and the checks that recording and replaying share."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import gpud_protocol as proto
from gpud_client.dtypes import HostDType, host_dtype, name_of
from gpud_client.errors import InvalidArgument
from gpud_client.indexing import indexed
from gpud_client.operators import Operators
from gpud_client.reshapes import Reshapes
from gpud_protocol import ArgKind
from gpud_protocol.ops import TensorInfo

KIND_WORDS = {ArgKind.INPUT: "input", ArgKind.BIND: "bound tensor", ArgKind.TEMP: "intermediate", ArgKind.VIEW: "view"}


class Recorder(Protocol):
    """What a recording's values need of their recorder (gpud_client.graphs.Graph)."""

    name: str

    def view(self, tensor: Any, shape: int | Sequence[Any]) -> GraphTensor: ...


class GraphTensor(Operators, Reshapes):
    """A tensor of a recording: an input, a bound tensor or an intermediate."""

    def __init__(self, graph: Recorder, kind: int, index: int, dtype: HostDType, shape: tuple[int, ...]) -> None:
        self.graph = graph
        self.kind = kind
        self.index = index
        self.dtype = dtype
        self.dtype_name = name_of(dtype)
        self.shape = shape
        self.info = TensorInfo(self.dtype_name, shape)  # what the op library's rules see: dense
        self.base: Any = self  # the tensor whose memory this is (of the graph, or a session's)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def T(self) -> GraphTensor:
        """Itself for 0 or 1 dimensions; a transpose otherwise, which a recording cannot make."""
        if len(self.shape) > 1:
            raise self._no_strides("transpose")
        return self

    def __getitem__(self, key: Any) -> GraphTensor:
        """Indexing that a reshape makes (`None`, `...`, whole slices, integers on axes of size 1)."""
        (shape, _strides, _offset), reshape = indexed(self.shape, proto.contiguous_strides(self.shape), 0, key)
        if not reshape:
            raise self._no_strides("indexing")
        return self.reshape(shape)

    def _ops(self) -> Any:
        return self.graph._client.ops  # type: ignore[attr-defined]  # gpud_client.graphs.Graph's

    def reshape(self, *shape: int | Sequence[int]) -> GraphTensor:
        """The same memory with another shape (-1: inferred), as in `Tensor.reshape`."""
        return self.graph.view(self, shape)

    def transpose(self, *_args: Any) -> GraphTensor:
        raise self._no_strides("transpose")

    def permute(self, *_args: Any) -> GraphTensor:
        raise self._no_strides("permute")

    def narrow(self, *_args: Any) -> GraphTensor:
        raise self._no_strides("narrow")

    def _no_strides(self, op: str) -> InvalidArgument:
        return InvalidArgument(
            f"graph {self.graph.name!r}: a recording's tensors take reshapes only ({op} views are not "
            "recorded: graph views carry no strides)",
            op=op,
        )

    def __repr__(self) -> str:
        what = KIND_WORDS[ArgKind(self.kind)]
        return f"<graph {self.graph.name!r} {what} #{self.index} {self.dtype}{list(self.shape)}>"


class GraphScalar:
    def __init__(self, graph: Recorder, index: int, kind: int) -> None:
        self.graph = graph
        self.index = index
        self.kind = kind


def whole_view(what: str, tensor: Any) -> None:
    """Graphs name buffers: they take a session view only where it is its whole tensor (a reshape)."""
    if not tensor._whole:
        raise InvalidArgument(
            f"{what}: {tensor!r} is a transposed or narrowed view; graphs take whole tensors and their "
            "reshapes: call gpu.ops.contiguous() on it first (outside the recording)"
        )


def dims_of(shape: int | Sequence[int]) -> tuple[int, ...]:
    return (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)


def graph_dtype(dtype: Any) -> HostDType:
    np_dtype = host_dtype(dtype)
    if np_dtype.name not in proto.DTYPE_SIZES:
        raise InvalidArgument(f"dtype {np_dtype} is not supported: use one of {sorted(proto.DTYPE_SIZES)}")
    return np_dtype

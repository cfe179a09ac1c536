"""A replay graph's recording, as a client builds it (`BuildGraph`) and the daemon checks it (`graph_fields`)."""

from __future__ import annotations

from typing import NamedTuple

from gpud_protocol.arg_kinds import Arg


class GraphTensor(NamedTuple):
    """An input (uploaded per replay) or a bound tensor (chosen per replay) of a graph."""

    name: str
    dtype: str
    shape: tuple[int, ...]


class GraphScalar(NamedTuple):
    name: str
    kind: int  # ArgKind.F32 | I32 | U32


class GraphDispatch(NamedTuple):
    kernel: int
    grid: tuple[int, int, int]
    args: tuple[Arg, ...]  # kinds TENSOR (a session tensor), INPUT, BIND, TEMP, SCALAR, or a fixed scalar
    writes: tuple[int, ...] | None


class GraphCopy(NamedTuple):
    src: Arg  # (kind, index or handle) of a tensor
    dst: Arg


class GraphUpload(NamedTuple):
    """Recorded data (a payload frame of the building message), copied into `dst` at this point of every replay."""

    frame: int
    dst: Arg


class GraphOutput(NamedTuple):
    name: str
    ref: Arg


class GraphDef(NamedTuple):
    """A recorded step. On the wire a map of these keys, each a list (`client_encode`, `graph_fields`)."""

    inputs: tuple[GraphTensor, ...]
    scalars: tuple[GraphScalar, ...]
    binds: tuple[GraphTensor, ...]
    temps: tuple[tuple[str, tuple[int, ...]], ...]  # (dtype, shape) of each intermediate
    steps: tuple[GraphDispatch | GraphCopy | GraphUpload, ...]
    outputs: tuple[GraphOutput, ...]
    views: tuple[tuple[Arg, tuple[int, ...]], ...] = ()  # (tensor, shape): the same memory, another shape
    # Row-independent: every input and output has the same leading (row) axis, each row computed from
    # its own rows alone; the daemon may then merge concurrent replays into one launch.
    rows: bool = False
    # (output, input) names: in a multi-step replay the output of each step becomes that input of the next
    feeds: tuple[tuple[str, str], ...] = ()
    # A slot graph (rows=True and slots > 0): each session replays one row, placed at the row of its own
    # slot; `state` names the session tensors whose leading axis is per slot (`slots` long), which the
    # steps see through views of their first rows; padding rows take `pads` (input name, value), else 0.
    slots: int = 0
    state: tuple[Arg, ...] = ()
    pads: tuple[tuple[str, int | float], ...] = ()

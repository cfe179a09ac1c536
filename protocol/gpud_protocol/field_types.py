"""The types of an op's fields: each is annotated with the kind of field it is (`Field`), and the daemon
checks each kind the same way wherever it appears (`daemon_decode`, from the ops' annotations)."""

from __future__ import annotations

import enum
from typing import Annotated, NamedTuple

from gpud_protocol.arg_kinds import DispatchArg
from gpud_protocol.graph_def import GraphDef
from gpud_protocol.views import TensorView

RESIDENT_MODES = ("ro", "rw")


class Field(enum.Enum):
    """What a field holds; the codec checks each kind the same way wherever it appears."""

    HANDLE = "handle"
    DTYPE = "dtype"
    SHAPE = "shape"
    DEVICE = "device"
    FRAME = "frame"
    NBYTES = "nbytes"
    SOURCE = "source"
    ENTRY = "entry"
    OPTIONS = "options"
    GRID = "grid"
    ARGS = "args"
    WRITES = "writes"
    NAME = "name"
    MODE = "mode"
    GRAPH = "graph"
    FRAME_OR_NONE = "frame_or_none"
    SHAPES = "shapes"
    VALUES = "values"
    TENSOR = "tensor"
    TENSORS = "tensors"
    PREFIX = "prefix"
    STEPS = "steps"
    FLAG = "flag"


class KernelOptions(NamedTuple):
    """On the wire a map with any of these keys."""

    block: tuple[int, int, int] | None = None  # CUDA threads per block
    flags: tuple[str, ...] = ()  # compiler flags (CUDA only, whitelisted)
    writes: tuple[int, ...] | None = None  # tensor-argument positions the kernel writes, declared
    shared: int = 0  # CUDA dynamic shared memory per block, bytes (extern __shared__)


Handle = Annotated[int, Field.HANDLE]  # 1 .. max_handle, chosen by the client
DType = Annotated[str, Field.DTYPE]  # a key of DTYPE_SIZES
Shape = Annotated[tuple[int, ...], Field.SHAPE]
Device = Annotated[int, Field.DEVICE]  # index into the welcome's device list
FrameIndex = Annotated[int, Field.FRAME]  # index of a payload frame of this message
NBytes = Annotated[int, Field.NBYTES]
Source = Annotated[str, Field.SOURCE]
Entry = Annotated[str, Field.ENTRY]
Options = Annotated[KernelOptions, Field.OPTIONS]
Grid = Annotated[tuple[int, int, int], Field.GRID]
Args = Annotated[tuple[DispatchArg, ...], Field.ARGS]
Operand = Annotated[int | TensorView, Field.TENSOR]  # a tensor: its handle, or a view of it (`views`)
Operands = Annotated[tuple[int | TensorView, ...], Field.TENSORS]
Writes = Annotated[tuple[int, ...] | None, Field.WRITES]  # tensor-argument positions; None: the kernel's own
Name = Annotated[str, Field.NAME]  # 1..max_name_len of [A-Za-z0-9_.:/-]
Mode = Annotated[str, Field.MODE]  # one of RESIDENT_MODES
Prefix = Annotated[str, Field.PREFIX]  # 0..max_name_len of [A-Za-z0-9_.:/-]: the start of resident names
Graph = Annotated[GraphDef, Field.GRAPH]
FrameOrNone = Annotated[int, Field.FRAME_OR_NONE]  # a payload frame index, or -1: none
Shapes = Annotated[tuple[tuple[int, ...], ...], Field.SHAPES]
Values = Annotated[tuple[int | float, ...], Field.VALUES]
Steps = Annotated[int, Field.STEPS]  # 1 .. max_replay_steps
Flag = Annotated[bool, Field.FLAG]  # true or false, nothing else

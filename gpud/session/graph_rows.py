"""What a built instance's rows and feeds must be: the rows of a row-independent graph (one leading
axis on every input and output), each input's padding row, and the (output, input) pairs a
multi-step replay feeds."""

from __future__ import annotations

import numpy as np

import gpud_protocol as proto
from gpud.session.graphs import Instance
from gpud_protocol.errors import InvalidArgument


def rows_of(name: str, graph: proto.GraphDef, instance: Instance) -> int:
    """The rows of a row-independent graph's instance: the leading axis every input and output shares."""
    if graph.binds:
        raise InvalidArgument(
            f"graph {name!r} is row-independent (rows=True): it binds no tensors (a merged launch would "
            "share one session's tensor among all)"
        )
    parts = [*instance.inputs, *instance.outputs]
    leading = {part.shape[0] if part.shape else 0 for part in parts}
    if not instance.inputs or not instance.outputs or len(leading) != 1 or 0 in leading:
        shapes = ", ".join(f"{p.name} {list(p.shape)}" for p in parts) or "none"
        raise InvalidArgument(
            f"graph {name!r} is row-independent (rows=True): its inputs and outputs need one leading axis "
            f"of at least one row, the same for all (got {shapes})"
        )
    return leading.pop()


def pads_of(name: str, graph: proto.GraphDef, instance: Instance) -> list[bytes]:
    """One padding row of each input: its pad value (`GraphDef.pads`, else 0) in the input's dtype."""
    values = dict(graph.pads)
    rows = []
    for part in instance.inputs:
        count = part.nbytes // instance.rows // proto.DTYPE_SIZES[part.dtype]
        value = values.get(part.name, 0)
        try:
            rows.append(pad_row(part.dtype, value, count))
        except (ValueError, OverflowError):
            what = f"input {part.name!r} ({part.dtype})"
            raise InvalidArgument(f"graph {name!r}: {what} cannot pad with {value!r}") from None
    return rows


def pad_row(dtype: str, value: int | float, count: int) -> bytes:
    if dtype == "bfloat16":
        bits = np.array([value], np.float32).view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return np.full(count, rounded[0], np.uint16).tobytes()
    kind = np.dtype(dtype)
    if kind.kind in "iu" and (type(value) is not int or not np.iinfo(kind).min <= value <= np.iinfo(kind).max):
        raise ValueError(value)
    return np.full(count, value, kind).tobytes()


def feeds_of(name: str, graph: proto.GraphDef, instance: Instance) -> list[tuple[int, int]]:
    """The positions of each (output, input) a multi-step replay feeds, checked to be of one dtype and size."""
    outputs = {part.name: index for index, part in enumerate(instance.outputs)}
    inputs = {part.name: index for index, part in enumerate(instance.inputs)}
    feeds = []
    for output, target in graph.feeds:
        src, dst = instance.outputs[outputs[output]], instance.inputs[inputs[target]]
        if (src.dtype, src.nbytes) != (dst.dtype, dst.nbytes):
            raise InvalidArgument(
                f"graph {name!r} feeds output {output!r} ({src.dtype}{list(src.shape)}) into input {target!r} "
                f"({dst.dtype}{list(dst.shape)}): they need one dtype and as many elements"
            )
        feeds.append((outputs[output], inputs[target]))
    return feeds

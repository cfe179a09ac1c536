"""What a tensor's geometry makes, kept for every tensor made alike (gpud_client.tensor): its strides and
the info the op library's rules see, and a view's reference as the daemon is told it, packed. Each a pure
function of its key, in a bounded memo (gpud_client.memo): a step's tensors repeat the same few."""

from __future__ import annotations

import gpud_protocol as proto
from gpud_client.memo import Memo
from gpud_client.values import TENSOR
from gpud_protocol.ops import TensorInfo
from gpud_protocol.wire import pack

Geometry = tuple[str, tuple[int, ...], int, tuple[int, ...] | None]  # dtype name, shape, offset, strides (None: dense)
# A tensor's geometry -> (its strides, what the op library's rules see): made once, as every step's repeat
kept_geometries: Memo[Geometry, tuple[tuple[int, ...], TensorInfo]] = Memo(8192)
ViewKey = tuple[int, str, int, tuple[int, ...], tuple[int, ...]]  # base's handle, dtype name, offset, shape, strides
Wire = tuple[int, int | proto.TensorView]  # a dispatch argument: (TENSOR, ref)
# A view's key -> its info, ref, ref as a dispatch argument, and that packed (`.T` and reshapes, every step)
kept_views: Memo[ViewKey, tuple[TensorInfo, proto.TensorView, Wire, bytes]] = Memo(8192)
ViewOf = tuple[TensorInfo, proto.TensorView, Wire, bytes]  # what `kept_views` keeps of a view
# A tensor's view key -> its `.T`'s shape, strides and what `kept_views` keeps of it (`q @ k.T` every step: one
# lookup, not the transpose's geometry and then the view's)
kept_transposes: Memo[ViewKey, tuple[tuple[int, ...], tuple[int, ...], ViewOf]] = Memo(8192)


def strides_and_info(geometry: Geometry) -> tuple[tuple[int, ...], TensorInfo]:
    name, shape, offset, strides = geometry
    if strides is None:
        strides = proto.contiguous_strides(shape)
    # dtype, shape, offset, and strides unless dense
    return strides, TensorInfo(name, shape, offset, None if proto.is_contiguous(shape, strides) else strides)


def view_of(key: ViewKey) -> tuple[TensorInfo, proto.TensorView, Wire, bytes]:
    handle, name, offset, shape, strides = key
    _strides, info = strides_and_info((name, shape, offset, strides))
    ref = proto.TensorView(handle, offset, shape, strides)
    wire = (TENSOR, ref)
    return info, ref, wire, pack(wire)


def dense_geometry(name: str, shape: tuple[int, ...]) -> tuple[tuple[int, ...], TensorInfo]:
    """The strides and info of a dense tensor of its own memory (as `Tensor.__init__` finds them)."""
    geometry = (name, shape, 0, None)
    return kept_geometries.get(geometry) or kept_geometries.keep(geometry, strides_and_info(geometry))

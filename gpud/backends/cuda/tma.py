"""Tensor maps for the library's TMA kernels (family matmul_tma, gpud/ops/matmul_tma.cu: matmul_tma and
split-K's matmul_tmak): such a kernel takes x and w as two 128-byte CUtensorMap parameters in place of
their pointers. The dispatch carries pointers like any other; `pack` (gpud.backends.cuda.launch) encodes
the maps from them and the sizes, as the family's contract says (gpud_protocol.ops.matmul_tma), keeping
each launch's maps by what they depend on. A TMA launch's parameter bytes are the two maps, then an
8-byte slot per other argument; `TmaLayout.offsets` is where cuLaunchKernel finds each parameter in them.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, NamedTuple

from gpud_protocol.errors import InvalidArgument
from gpud_protocol.ops.matmul_tma import BOX_K, TMA_TILES
from gpud_protocol.ops.matmul_tmak import TMAK_TILES

MAP_BYTES = 128  # sizeof(CUtensorMap), 64-byte aligned where the driver writes it
MAPS = 2  # x's and w's, the first two parameters
# cuda.h's CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion and
# CUtensorMapFloatOOBfill values (the same in CUDA 12 and 13)
_DATA_TYPES = {"f16": 6, "bf16": 9}
_INTERLEAVE_NONE, _SWIZZLE_128B, _L2_256B, _OOB_ZEROS = 0, 3, 3, 0


class TmaLayout(NamedTuple):
    """What a TMA entry point's maps are: the element type and the rows of x's and w's boxes."""

    data_type: int
    box_x: int
    box_w: int

    def offsets(self, count: int) -> list[int]:
        """Byte offsets of `count` parameters in a launch's bytes: the maps, then 8-byte slots."""
        return [MAP_BYTES * i for i in range(MAPS)] + [MAP_BYTES * MAPS + 8 * i for i in range(count - MAPS)]


def layout(entry: str) -> TmaLayout | None:
    """The layout of a matmul_tma entry point (`matmul_tma128x128_f16_f16`, split-K's
    `matmul_tmak4_128x128_f16_f16`), None for any other."""
    tile = TMA_TILES.get(entry) or TMAK_TILES.get(entry)
    if tile is None:
        return None
    return TmaLayout(_DATA_TYPES[entry.rsplit("_", 1)[1]], tile.bm, tile.bn)


@functools.cache
def _encode_tiled() -> Any:
    """The driver's cuTensorMapEncodeTiled through ctypes: cuda-bindings' CUtensorMap lives inside a
    Python object, 16-byte aligned, where the driver writes the map only 64-byte aligned."""
    fn = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    u32, u64 = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64, u64, u32, u32]
    fn.argtypes += [ctypes.c_int] * 4
    return fn


def encode(address: int, rows: int, k: int, box_rows: int, data_type: int) -> bytes:
    """The map of the (rows, k) row-major matrix of 2-byte elements at `address`, read in boxes of BOX_K
    x box_rows through the 128-byte swizzle, zeros outside the matrix."""
    buffer = (ctypes.c_uint8 * (2 * MAP_BYTES))()
    aligned = (ctypes.addressof(buffer) + 63) & ~63
    status = _encode_tiled()(
        aligned,
        data_type,
        2,
        address,
        (ctypes.c_uint64 * 2)(k, rows),
        (ctypes.c_uint64 * 1)(2 * k),  # the row stride in bytes (dimension 0 is dense)
        (ctypes.c_uint32 * 2)(BOX_K, box_rows),
        (ctypes.c_uint32 * 2)(1, 1),
        _INTERLEAVE_NONE,
        _SWIZZLE_128B,
        _L2_256B,
        _OOB_ZEROS,
    )
    if status:
        raise InvalidArgument(f"the driver refused a tensor map of {rows} x {k} at {address:#x} (CUresult {status})")
    return ctypes.string_at(aligned, MAP_BYTES)

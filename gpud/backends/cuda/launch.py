"""Launches: `Launch` is what `Program.native` holds on CUDA; `pack` checks a dispatch against it
and packs it into `(module_id, function, gx, gy, gz, bx, by, bz, shared, params)`, the form `graph` issues
and keys its graphs by. `params` holds one 8-byte slot per argument (a pointer, or a 4-byte scalar
and padding), copied into the launch parameter slots right before `cuLaunchKernel`; a TMA kernel's
(gpud.backends.cuda.tma) starts with its two tensor maps instead of x's and w's pointers.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from typing import Any

from gpud.backends.base import Arg, Buffer
from gpud.backends.cuda import tma
from gpud.backends.cuda.driver import E, check, cu, error
from gpud_protocol import SCALAR_FORMATS, SCALAR_NAMES
from gpud_protocol.errors import CompileError, InvalidArgument
from gpud_protocol.lru import LruCache
from gpud_protocol.ops.matmul_tma import tma_rows

# Each argument takes an 8-byte slot: a tensor's pointer (kind None), or a scalar's 4 bytes then padding.
_PACK: dict[int | None, str] = {None: "Q", **{kind: fmt + "4x" for kind, fmt in SCALAR_FORMATS.items()}}
_KIND_NAMES: dict[int | None, str] = {None: "a tensor", **{kind: name for kind, name in SCALAR_NAMES.items()}}
FORMATS_KEPT = 64  # argument-kind signatures per kernel whose struct format is kept
MAPS_KEPT = 256  # tensor maps per TMA kernel (by pointer and sizes): a model's operands


@dataclasses.dataclass(eq=False)
class Launch:
    module_id: int
    function: Any
    block: tuple[int, int, int]
    shared: int  # dynamic shared memory per block, bytes
    sizes: tuple[int, ...] | None  # parameter sizes from the driver; None: unknown
    nparams: int | None  # from the driver, else from the source; None: unknown
    # argument kinds -> struct format; the least recently used goes when full
    formats: LruCache[tuple[Any, ...], str] = dataclasses.field(default_factory=lambda: LruCache(FORMATS_KEPT))
    tma: tma.TmaLayout | None = None  # a TMA kernel: x and w go as tensor maps
    cluster: int = 1  # blocks a cluster along x (`__cluster_dims__`): the grid's x must be a multiple
    # (address, rows, k, box rows) -> an encoded map; the least recently used goes when full
    maps: LruCache[tuple[int, int, int, int], bytes] = dataclasses.field(default_factory=lambda: LruCache(MAPS_KEPT))


def parameter_sizes(function: Any, limit: int) -> tuple[int, ...] | None:
    """Each parameter's size from the driver (CUDA >= 12.4); None where it cannot tell."""
    sizes: list[int] = []
    try:
        for index in range(limit + 1):
            status, _offset, size = cu.cuFuncGetParamInfo(function, index)
            if status == E.CUDA_ERROR_INVALID_VALUE:  # past the last parameter
                return tuple(sizes)
            if status:
                return None
            sizes.append(size)
    except Exception:  # bindings or driver without cuFuncGetParamInfo
        return None
    return None  # more parameters than a dispatch may pass: let the count check say so


def make_launch(
    module_id: int,
    module: Any,
    entry: str,
    block: tuple[int, int, int],
    max_block: tuple[int, int, int],
    max_args: int,
    parameters: Sequence[str] | None,
    shared: int = 0,
    layout: tma.TmaLayout | None = None,
) -> Launch:
    """The entry's function in the loaded module, with the block checked against it; `layout`: a TMA
    kernel of the library (its maps' layout)."""
    status, function = cu.cuModuleGetFunction(module, entry.encode())
    if status:
        raise CompileError(
            f"no kernel named {entry!r} in the compiled module ({error(status)}); declare it "
            f'extern "C" __global__ so that its name is not mangled'
        )
    threads = block[0] * block[1] * block[2]
    attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
    most = int(check(cu.cuFuncGetAttribute(attribute, function)))
    if threads > most or any(not 1 <= d <= limit for d, limit in zip(block, max_block, strict=True)):
        raise InvalidArgument(
            f"block {tuple(block)} does not fit {entry}: at most {most} threads and {max_block} per dimension"
        )
    if shared:  # past 48 KB a kernel must ask for it; the driver refuses more than the device has
        attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        (status,) = cu.cuFuncSetAttribute(function, attribute, shared)
        if status:
            raise InvalidArgument(f"{entry} cannot have {shared} bytes of dynamic shared memory: {error(status)}")
    sizes = parameter_sizes(function, max_args)
    nparams = len(sizes) if sizes is not None else None if parameters is None else len(parameters)
    return Launch(module_id, function, block, shared, sizes, nparams, tma=layout, cluster=cluster_width(function))


def cluster_width(function: Any) -> int:
    """The cluster width a kernel was compiled for (`__cluster_dims__`), 1 where none or unknown."""
    attribute = getattr(cu.CUfunction_attribute, "CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH", None)
    if attribute is None:
        return 1
    status, width = cu.cuFuncGetAttribute(attribute, function)
    return max(1, int(width)) if not status else 1


def pack(launch: Launch, entry: str, grid: tuple[int, int, int], args: Sequence[Arg], max_args: int) -> tuple[Any, ...]:
    if grid[0] % launch.cluster:  # the launch would fail, and with it the submission of every session in it
        raise InvalidArgument(
            f"{entry} runs in clusters of {launch.cluster} blocks: the grid's x must be a multiple of "
            f"{launch.cluster}, not {grid[0]}"
        )
    kinds: list[Any] = []
    values: list[Any] = []
    for arg in args:
        if type(arg) is Buffer:
            kinds.append(None)
            values.append(arg.native + arg.offset)
        else:  # a scalar: (ArgKind, value)
            kinds.append(arg[0])  # type: ignore[index]
            values.append(arg[1])  # type: ignore[index]
    signature = tuple(kinds)
    fmt = launch.formats.get(signature) or _format(launch, entry, signature, max_args)
    try:
        params = struct.pack(fmt, *values)
    except (struct.error, OverflowError) as exc:
        raise InvalidArgument(f"bad argument for {entry}: {exc}") from None
    if launch.tma is not None:  # the op's rule checked the pointers and sizes the maps are made of
        params = _maps(launch, launch.tma, values) + params[8 * tma.MAPS :]
    return (launch.module_id, launch.function, *grid, *launch.block, launch.shared, params)


def _maps(launch: Launch, layout: tma.TmaLayout, values: list[Any]) -> bytes:
    """x's and w's tensor maps, from their pointers and the scalars (batch, m, n, k, x_stride, w_stride)."""
    x, w, _bias, _out, batch, m, n, k, x_stride, w_stride = values[:10]
    rows_x, rows_w = tma_rows(batch, m, n, k, x_stride, w_stride)
    maps = b""
    for key in ((x, rows_x, k, layout.box_x), (w, rows_w, k, layout.box_w)):
        encoded = launch.maps.get(key)
        if encoded is None:
            encoded = tma.encode(*key, layout.data_type)
            launch.maps.put(key, encoded)
        maps += encoded
    return maps


def _format(launch: Launch, entry: str, signature: tuple[Any, ...], max_args: int) -> str:
    """The struct format that packs arguments of these kinds, after checking them against the kernel."""
    if launch.nparams is not None and len(signature) != launch.nparams:
        raise InvalidArgument(f"kernel {entry} takes {launch.nparams} arguments, {len(signature)} given")
    if len(signature) > max_args:
        raise InvalidArgument(f"at most {max_args} arguments")
    for index, kind in enumerate(signature):
        if kind not in _PACK:
            raise InvalidArgument(f"argument {index} of {entry} has an unknown kind {kind!r}")
        want = 4 if kind is not None else tma.MAP_BYTES if launch.tma is not None and index < tma.MAPS else 8
        if launch.sizes is not None and launch.sizes[index] != want:
            raise InvalidArgument(
                f"argument {index} of {entry} is {_KIND_NAMES[kind]} ({want} bytes) "
                f"but the parameter takes {launch.sizes[index]} bytes"
            )
    fmt = "<" + "".join(_PACK[kind] for kind in signature)
    launch.formats.put(signature, fmt)
    return fmt

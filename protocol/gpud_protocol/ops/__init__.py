"""The interface of the built-in op library, defined once for the client and the daemon.

Each kernel of the library has a `KernelSpec`: its tensor arguments (which it writes), its scalars,
and `check`, the rule its arguments' dtypes, shapes and scalars must follow. The client uses the
specs to allocate outputs and compute grids (gpud_client.ops); the daemon checks every dispatch of
a built-in kernel against the same rule before encoding it, so a bad call is a typed error naming
the op even from a client that skips the library's own checks. The kernels' sources, one `.cu` and
one `.wgsl` per family, ship with the daemon (gpud/ops); a client registers one by its name with
the source `gpud:<name>`.

Families: `elementwise`, and the modules listed in `FAMILIES`. The elementwise kernels take every
dtype of `dtypes.DTYPES` through one kernel per kind, and broadcast as numpy does (`broadcast`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from gpud_protocol.limits import DTYPE_SIZES
from gpud_protocol.views import VIEW_ALIGN, contiguous_strides, is_contiguous

PREFIX = "gpud:"  # a kernel source naming a built-in kernel: "gpud:<name>"
BLOCK = 256  # threads per workgroup (WGSL @workgroup_size) and per block (CUDA) for 1-D kernels
MAX_GROUPS = 65535  # workgroups per grid dimension that every adapter allows


class TensorInfo(NamedTuple):
    dtype: str
    shape: tuple[int, ...]
    offset: int = 0  # a view's: in elements from its tensor's start
    strides: tuple[int, ...] | None = None  # a view's, in elements; None: contiguous (row-major)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def steps(self) -> tuple[int, ...]:
        """The strides, contiguous ones where none were given."""
        return contiguous_strides(self.shape) if self.strides is None else self.strides


class OpError(ValueError):
    """Arguments that break an op's rule; the message names the mismatch."""


Check = Callable[[Sequence[TensorInfo], Sequence[int | float]], None]


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    name: str  # the kernel's entry point in its family's sources
    family: str  # gpud/ops/<family>.cu and .wgsl
    op: str  # the op it implements, as errors name it
    tensors: tuple[str, ...]  # argument names, in order
    writes: tuple[int, ...]  # positions (among tensors) it writes
    scalars: tuple[tuple[str, str], ...]  # (name, "f32" | "i32" | "u32"), after the tensors
    check: Check
    block: int = BLOCK  # CUDA threads per block
    op_codes: tuple[str, ...] = ()  # a kernel of several ops: the op of each value of its scalar "op"
    # positions (among tensors) the kernel reads through an offset and strides among its scalars (any
    # view; its tensor is bound whole). Every other tensor must be dense: see `layout_problem`.
    strided: tuple[int, ...] = ()
    shared: int = 0  # CUDA dynamic shared memory per block, bytes
    # positions (among tensors) the kernel reads before it waits for the kernel before it in a graph
    # (gpud/ops/pdl.cu): the daemon takes read-only tensors only there, which no kernel writes meanwhile
    early: tuple[int, ...] = ()

    def verify(self, infos: Sequence[TensorInfo], scalars: Sequence[int | float]) -> None:
        """The layout rule (a dense tensor wherever the kernel takes no strides), then the op's own."""
        for position, info in enumerate(infos[: len(self.tensors)]):
            if position not in self.strided and (problem := layout_problem(info, self.tensors[position])):
                raise OpError(problem)
        self.check(infos, scalars)

    def op_name(self, scalars: Sequence[int | float]) -> str:
        """The op a user called to run this kernel with `scalars` ("add" for ew_binary with op 0)."""
        if not self.op_codes:
            return self.op
        names = [name for name, _kind in self.scalars]
        if "op" in names and names.index("op") < len(scalars):
            code = scalars[names.index("op")]
            if isinstance(code, int) and 0 <= code < len(self.op_codes):
                return self.op_codes[code]
        return self.op


def layout_problem(info: TensorInfo, name: str) -> str | None:
    """Why a kernel that indexes `name` densely cannot take it, or None. A contiguous view at an offset
    is bound at that offset (no copy) when the offset is a multiple of VIEW_ALIGN bytes (WebGPU's
    binding rule, applied on every backend alike)."""
    if info.strides is not None and not is_contiguous(info.shape, info.strides):
        return f"{name} is a non-contiguous view; call gpu.ops.contiguous({name}) first"
    byte = info.offset * DTYPE_SIZES.get(info.dtype, 1)
    if byte % VIEW_ALIGN:
        return (
            f"{name} is a view starting at byte {byte} of its tensor, not a multiple of {VIEW_ALIGN}, where "
            f"a kernel can be given it; call gpu.ops.contiguous({name}) first"
        )
    return None


def grid_1d(threads: int, block: int = BLOCK) -> tuple[int, int, int]:
    """A grid of at least `threads` threads in workgroups of `block`, folded into y past 65,535 groups
    (kernels compute their index as gid.x + gid.y * num_workgroups.x * block)."""
    groups = max(1, -(-threads // block))
    if groups <= MAX_GROUPS:
        return (groups, 1, 1)
    return (MAX_GROUPS, -(-groups // MAX_GROUPS), 1)


def need(condition: bool, message: str) -> None:
    if not condition:
        raise OpError(message)


def same_dtype(infos: Sequence[TensorInfo], dtypes: Sequence[str]) -> str:
    dtype = infos[0].dtype
    need(dtype in dtypes, f"dtype {dtype} is not one of {list(dtypes)}")
    for info in infos[1:]:
        need(info.dtype == dtype, f"dtypes differ: {dtype} and {info.dtype}")
    return dtype


def suffix(short: tuple[int, ...], long: tuple[int, ...]) -> bool:
    """`short` broadcasts over the leading axes of `long` (numpy-style: it is a trailing part of it)."""
    return len(short) <= len(long) and tuple(long[len(long) - len(short) :]) == tuple(short)


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy's broadcast shape of `a` and `b` (gpud_protocol.ops.broadcast)."""
    from gpud_protocol.ops.broadcast import broadcast_shapes

    return broadcast_shapes(a, b)


BACKENDS = ("cuda", "webgpu")  # a family module's kernels, unless it names its own BACKENDS


def _registry() -> dict[str, KernelSpec]:
    from gpud_protocol.ops import FAMILIES

    specs: dict[str, KernelSpec] = {}
    for module in FAMILIES:
        for spec in module.SPECS:
            assert spec.name not in specs, spec.name
            specs[spec.name] = spec
    return specs


def _backends() -> dict[str, tuple[str, ...]]:
    from gpud_protocol.ops import FAMILIES

    return {spec.name: tuple(getattr(module, "BACKENDS", BACKENDS)) for module in FAMILIES for spec in module.SPECS}


from gpud_protocol.ops import (  # noqa: E402  (the families use the helpers above)
    attention,
    attention_cluster,
    attention_cpu,
    attention_flash,
    attention_tiled,
    elementwise,
    elementwise4,
    elementwise16,
    fused,
    layout,
    matmul,
    matmul_nk,
    matmul_tma,
    matmul_tmak,
    matmul_wg,
    matvec_norm,
    matvec_ro,
    matvec_sx,
    matvec_tc,
    reduce,
    reduce_axis,
    reduce_warp,
    rows,
)

FAMILIES = [
    elementwise,
    elementwise4,
    elementwise16,
    matmul,
    matmul_nk,
    matmul_tma,
    matmul_tmak,
    matmul_wg,
    matvec_norm,
    matvec_ro,
    matvec_sx,
    matvec_tc,
    reduce,
    attention,
    attention_cluster,
    attention_flash,
    attention_tiled,
    attention_cpu,
    layout,
    reduce_axis,
    reduce_warp,
    rows,
    fused,
]
KERNELS: dict[str, KernelSpec] = _registry()
# Whose sources have each kernel: its module's BACKENDS, else both (the daemon refuses the others by name)
KERNEL_BACKENDS: dict[str, tuple[str, ...]] = _backends()


def spec_of(source: str) -> KernelSpec | None:
    """The spec a kernel source names (`gpud:<name>`), or None for a user's own kernel."""
    if not source.startswith(PREFIX):
        return None
    return KERNELS.get(source[len(PREFIX) :])


__all__ = [
    "BLOCK",
    "KERNELS",
    "KERNEL_BACKENDS",
    "PREFIX",
    "KernelSpec",
    "OpError",
    "TensorInfo",
    "broadcast_shape",
    "grid_1d",
    "layout_problem",
    "need",
    "same_dtype",
    "spec_of",
    "suffix",
]

"""prefetch: start tensors on their way into the GPU's L2 cache (CUDA only; gpud/ops/prefetch.cu).

`prefetch_l2(a, b, c, d; na, nb, nc, nd)`: the first na bytes of a, nb of b, and so on, requested into
L2 with `cp.async.bulk.prefetch.L2` (sm_90 and later; on older GPUs nothing). A hint: it writes
nothing and changes no value, and the kernel issues it before it waits for the kernel before it, so
in a graph with programmatic edges the bytes stream in while earlier kernels still run. A decode
step uses it for the weights of a layer's later products (gpud.testing.transformer). Blocks of 32
threads, grid `prefetch_grid`: block (x, y) asks for slice x of SLICE bytes of tensor y (a
multiprocessor's copy engine serves one block's request, at a few hundred GB/s: one block for it all
would hold the step up). An unused slot repeats a tensor with 0 bytes. The op asks for at most
PREFETCH_MAX bytes of each (more would evict what the first bytes brought).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpud_protocol.limits import DTYPE_SIZES
from gpud_protocol.ops import KernelSpec, TensorInfo, need

SLOTS = 4  # tensors per launch
SLICE = 128 << 10  # PREFETCH_SLICE in gpud/ops/prefetch.cu
PREFETCH_MAX = 24 << 20
BLOCK = 32
BACKENDS = ("cuda",)


def prefetch_grid(sizes: Sequence[int]) -> tuple[int, int, int]:
    """Slices of the largest, by the slots."""
    return (max(1, -(-max(sizes) // SLICE)), SLOTS, 1)


def _check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
    for name, info, count in zip("abcd", t, s, strict=True):
        nbytes = info.size * DTYPE_SIZES[info.dtype]
        need(0 <= int(count) <= nbytes, f"{name}: {count} bytes asked of a tensor of {nbytes}")


_SCALARS = tuple((f"n{c}", "u32") for c in "abcd")
SPECS = [KernelSpec("prefetch_l2", "prefetch", "prefetch", ("a", "b", "c", "d"), (), _SCALARS, _check, block=BLOCK)]

"""prefetch: start tensors on their way into the GPU's L2 cache (CUDA only; gpud/ops/prefetch.cu).

`prefetch_l2(a, b, c, d; na, nb, nc, nd)`: the first na bytes of a, nb of b, and so on, requested into
L2 with `cp.async.bulk.prefetch.L2` (sm_90 and later; on older GPUs nothing). A hint: it writes
nothing and changes no value, and the kernel issues it before it waits for the kernel before it, so
in a graph with programmatic edges the bytes stream in while earlier kernels still run. A decode
step uses it for the weights of a layer's later products (gpud.testing.transformer). Grid (1, 1, 1);
an unused slot repeats a tensor with 0 bytes. At most PREFETCH_MAX bytes of each are fetched (the
kernel's cap: more would evict what the first bytes brought).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpud_protocol.limits import DTYPE_SIZES
from gpud_protocol.ops import KernelSpec, TensorInfo, need

SLOTS = 4  # tensors per launch
PREFETCH_MAX = 24 << 20  # GPUD_PREFETCH_MAX in gpud/ops/pdl.cu
BACKENDS = ("cuda",)


def _check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
    for name, info, count in zip("abcd", t, s, strict=True):
        nbytes = info.size * DTYPE_SIZES[info.dtype]
        need(0 <= int(count) <= nbytes, f"{name}: {count} bytes asked of a tensor of {nbytes}")


_SCALARS = tuple((f"n{c}", "u32") for c in "abcd")
SPECS = [KernelSpec("prefetch_l2", "prefetch", "prefetch", ("a", "b", "c", "d"), (), _SCALARS, _check)]

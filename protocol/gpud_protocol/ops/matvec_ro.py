"""matvec and matvec_norm of a read-only weight, its first part loaded early (CUDA only; in
gpud/ops/matmul.cu).

`matvec_ro_f32_<w>` takes matvec_f32_<w>'s tensors, scalars, grid and rule, and `matvec_norm_ro_f32_<w>_<nw>`
matvec_norm's. Where a CUDA graph launches them while the kernel before is still running (a programmatic
edge, gpud/ops/pdl.cu), each block loads its first weights before it waits for that kernel, so they
stream in while it finishes; the bits are those of matvec and matvec_norm. The weight (`w`, in `early`)
must be read-only, a resident published "ro": no kernel can write it while it is read before the wait,
and the daemon refuses any other tensor there.
"""

from __future__ import annotations

import dataclasses

from gpud_protocol.ops import KernelSpec
from gpud_protocol.ops.matmul import SPECS as MATMUL_SPECS
from gpud_protocol.ops.matvec_norm import SPECS as NORM_SPECS

W_DTYPES = ("float32", "float16", "bfloat16")  # of matvec_ro_f32_<w>: float32 rows, as decode's
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def _early(spec: KernelSpec, kind: str) -> KernelSpec:
    return dataclasses.replace(
        spec, name=f"{kind}_ro_{spec.name.removeprefix(f'{kind}_')}", early=(spec.tensors.index("w"),)
    )


BACKENDS = ("cuda",)  # the backends whose sources have these kernels

_MATVEC = {f"matvec_f32_{SHORT[w]}" for w in W_DTYPES}
SPECS = [_early(spec, "matvec") for spec in MATMUL_SPECS if spec.name in _MATVEC] + [
    _early(spec, "matvec_norm") for spec in NORM_SPECS
]
# the kernel of each with a read-only w: matvec_f32_<w> -> matvec_ro_f32_<w>, matvec_norm_... -> matvec_norm_ro_...
EARLY = {spec.name.replace("_ro_", "_", 1): spec.name for spec in SPECS}

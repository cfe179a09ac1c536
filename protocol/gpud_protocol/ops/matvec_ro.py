"""matvec and matvec_norm of a read-only weight, its first part loaded early (CUDA only; in
gpud/ops/matmul.cu).

`matvec_ro_f32_<w>` takes matvec_f32_<w>'s tensors, scalars, grid and rule, and `matvec_norm_ro_f32_<w>_<nw>`
matvec_norm's. Where a CUDA graph launches them while the kernel before is still running (a programmatic
edge, gpud/ops/pdl.cu), each block loads its first weights before it waits for that kernel, so they
stream in while it finishes; the bits are those of matvec and matvec_norm. The weight (`w`, in `early`)
must be one that no kernel can write while it is read before the wait: the daemon takes these kernels in
a recorded graph only, with a weight the recording session holds read-only (a resident it opened
read-only) that no step of the graph writes, and refuses anything else (gpud/session/graph_record.py).
"""

from __future__ import annotations

import dataclasses

from gpud_protocol.ops import KernelSpec
from gpud_protocol.ops.matmul import DTYPES, SHORT
from gpud_protocol.ops.matmul import SPECS as MATMUL_SPECS
from gpud_protocol.ops.matvec_norm import SPECS as NORM_SPECS


def _early(spec: KernelSpec, kind: str) -> KernelSpec:
    return dataclasses.replace(
        spec, name=f"{kind}_ro_{spec.name.removeprefix(f'{kind}_')}", early=(spec.tensors.index("w"),)
    )


BACKENDS = ("cuda",)  # the backends whose sources have these kernels

_MATVEC = {f"matvec_f32_{SHORT[w]}" for w in DTYPES}  # float32 rows (decode's) by any weight
SPECS = [_early(spec, "matvec") for spec in MATMUL_SPECS if spec.name in _MATVEC] + [
    _early(spec, "matvec_norm") for spec in NORM_SPECS
]
# the kernel of each with a read-only w: matvec_f32_<w> -> matvec_ro_f32_<w>, matvec_norm_... -> matvec_norm_ro_...
EARLY = {spec.name.replace("_ro_", "_", 1): spec.name for spec in SPECS}

"""The built-in op library from the client: `gpu.ops.add(x, y)`, `gpu.ops.matmul(x, w)`, ...

Every op checks its arguments here with the same rule the daemon applies again
(`gpud_protocol.ops`), allocates its output unless given `out=`, and queues one dispatch of a kernel
shipped with the daemon: like `gpu.dispatch`, no round trip, and recordable into replay graphs
(pass a `gpu.graph(...)` recorder as `graph=`). A kernel is registered with the daemon on first use,
in the same message as the first dispatch that uses it.
"""

from __future__ import annotations

from gpud_client.ops.attention import AttentionOps
from gpud_client.ops.base import OpsBase
from gpud_client.ops.elementwise import ElementwiseOps
from gpud_client.ops.fused import FusedOps
from gpud_client.ops.joining import JoinOps
from gpud_client.ops.layout import LayoutOps
from gpud_client.ops.matmul import MatmulOps
from gpud_client.ops.norm_matmul import NormMatmulOps
from gpud_client.ops.norms import NormOps
from gpud_client.ops.reduce import ReduceOps
from gpud_client.ops.stats import StatsOps
from gpud_client.ops.tokens import TokenOps


class Ops(
    MatmulOps,  # before ElementwiseOps, its base
    ElementwiseOps,
    ReduceOps,
    NormOps,
    StatsOps,
    TokenOps,
    FusedOps,
    NormMatmulOps,
    AttentionOps,
    LayoutOps,
    JoinOps,
    OpsBase,
):
    """`gpu.ops`: one method per op, grouped by family."""


__all__ = ["Ops"]

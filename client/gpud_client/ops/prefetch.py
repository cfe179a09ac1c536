"""prefetch: a hint that tensors are read soon (gpud_protocol.ops.prefetch)."""

from __future__ import annotations

from typing import Any

from gpud_client.errors import InvalidArgument
from gpud_client.operands import foreign
from gpud_client.ops.base import OpsBase
from gpud_protocol.ops.prefetch import PREFETCH_MAX, SLOTS, prefetch_grid


class PrefetchOps(OpsBase):
    def prefetch(self, *tensors: Any, graph: Any = None) -> None:
        """Start `tensors` (the weights of products a few ops ahead) on their way into the GPU's L2
        cache, from where those products then read them. Queued (or recorded) like any op and ordered
        after the ops before it; it writes nothing and changes no value. On CUDA (sm_90 and later) the
        bytes stream in while the ops before it still run (in a replay graph); elsewhere it does
        nothing. At most 24 MiB of each tensor is fetched."""
        for tensor in tensors:
            if foreign(tensor):
                raise InvalidArgument(f"prefetch takes tensors, not {type(tensor).__name__}", op="prefetch")
        if self._client.backend != "cuda" or not tensors:
            return
        for first in range(0, len(tensors), SLOTS):
            group = list(tensors[first : first + SLOTS])
            sizes = [min(int(t.nbytes), PREFETCH_MAX) for t in group]
            group += [group[0]] * (SLOTS - len(group))
            sizes += [0] * (SLOTS - len(sizes))
            self._run("prefetch_l2", prefetch_grid(sizes), group, sizes, graph)

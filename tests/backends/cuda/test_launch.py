"""The struct formats a CUDA kernel keeps per argument-kind signature: bounded, the least recently used
one evicted when full (never all of them). Needs cuda-python (for the module's import), no GPU."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

pytest.importorskip("cuda.bindings", reason="the cuda backend's launch module needs cuda-python")

from gpud.backends.cuda.launch import FORMATS_KEPT, Launch, _format, pack
from gpud_protocol import ArgKind
from gpud_protocol.errors import InvalidArgument

pytestmark = pytest.mark.cuda


def test_a_full_format_cache_evicts_one_signature() -> None:
    """Regression: a kernel's 65th signature cleared the formats of the other 64."""
    launch = Launch(1, None, (64, 1, 1), 0, None, None)
    kinds = [None, ArgKind.F32, ArgKind.I32, ArgKind.U32]
    signatures = list(itertools.product(kinds, repeat=4))[: FORMATS_KEPT + 1]
    for signature in signatures[:FORMATS_KEPT]:
        _format(launch, "k", signature, 32)
    assert launch.formats.get(signatures[0]) == "<Q" + "Q" * 3  # now the most recent
    _format(launch, "k", signatures[FORMATS_KEPT], 32)
    assert len(launch.formats) == FORMATS_KEPT and launch.formats.evictions == 1
    assert signatures[0] in launch.formats and signatures[1] not in launch.formats


def test_a_cluster_kernel_takes_whole_clusters_only() -> None:
    """A split-K matmul runs in clusters: a grid that is no multiple would fail at launch, failing the
    submission of every session in it; it is refused at the dispatch instead."""
    launch = Launch(1, None, (384, 1, 1), 0, None, None, cluster=4)
    args: list[Any] = [(ArgKind.U32, 1)]
    assert pack(launch, "matmul_tmak4_128x128_f16_f16", (8, 1, 2), args, 32)[2:5] == (8, 1, 2)
    with pytest.raises(InvalidArgument, match="clusters of 4 blocks: the grid's x must be a multiple of 4, not 6"):
        pack(launch, "matmul_tmak4_128x128_f16_f16", (6, 1, 1), args, 32)

"""The struct formats a CUDA kernel keeps per argument-kind signature: bounded, the least recently used
one evicted when full (never all of them). Needs cuda-python (for the module's import), no GPU."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("cuda.bindings", reason="the cuda backend's launch module needs cuda-python")

from gpud.backends.cuda.launch import FORMATS_KEPT, Launch, _format
from gpud_protocol import ArgKind

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

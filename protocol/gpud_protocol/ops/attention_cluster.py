"""Attention split over the keys in one launch: the splits of a row merged in a cluster (CUDA only; in
gpud/ops/attention.cu).

`attention_s<S>_<q>_<kv>(q, k, v, pos, mask, out; attention's scalars)` for S in CLUSTER_SPLITS:
attention_<q>_<kv> with splits = S, the S blocks of a row one thread block cluster (S 1: one block),
each split's maximum, sum and weighted sums kept in its shared memory and merged by the cluster's block
of rank 0 as attention_combine merges them (the same sums in the same order) into out, of q's dtype and
shape: the bits of attention_<q>_<kv> then attention_combine, in one launch and without their scratch.
Grid: cluster_grid, a block per (row, split) along x (a multiple of S: whole clusters), at most
MAX_GROUPS blocks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from gpud_protocol.ops import MAX_GROUPS, KernelSpec, TensorInfo, need
from gpud_protocol.ops.attention import PAIRS, SHORT
from gpud_protocol.ops.attention import SPECS as ATTENTION_SPECS

CLUSTER_SPLITS = (1, 2, 4, 8)  # 8: the most blocks a cluster takes without opting in
_SPLIT = {spec.name: spec for spec in ATTENTION_SPECS}


def cluster_kernel(splits: int, rows: int, q_dtype: str, kv_dtype: str, out_dtype: str) -> str | None:
    """The one-launch kernel for `rows` rows in `splits` splits, or None where it does not apply (another
    output dtype than q's, a split count no cluster takes, more blocks than a grid's x)."""
    if out_dtype != q_dtype or splits not in CLUSTER_SPLITS or rows * splits > MAX_GROUPS:
        return None
    return f"attention_s{splits}_{SHORT[q_dtype]}_{SHORT[kv_dtype]}"


def cluster_grid(rows: int, splits: int) -> tuple[int, int, int]:
    return (rows * splits, 1, 1)


def _spec(splits: int, q_dtype: str, kv_dtype: str) -> KernelSpec:
    split = _SPLIT[f"attention_{SHORT[q_dtype]}_{SHORT[kv_dtype]}"]

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        q, k, v, pos, mask, out = t
        need(s[6] == splits, f"splits is {splits} for this kernel, not {s[6]}")
        split.check([q, k, v, pos, mask, TensorInfo("float32", (*q.shape[:-1], splits, q.shape[-1] + 2))], s)
        need(out.dtype == q.dtype and out.shape == q.shape, f"out is {out.dtype} {list(out.shape)}, not q's")
        rows = math.prod(q.shape[:-1])
        need(rows * splits <= MAX_GROUPS, f"{rows} rows in {splits} splits: more than {MAX_GROUPS} blocks")

    name = f"attention_s{splits}_{SHORT[q_dtype]}_{SHORT[kv_dtype]}"
    return dataclasses.replace(split, name=name, tensors=("q", "k", "v", "pos", "mask", "out"), check=check)


BACKENDS = ("cuda",)  # the backends whose sources have these kernels

SPECS = [_spec(s, q, kv) for s in CLUSTER_SPLITS for q, kv in PAIRS]

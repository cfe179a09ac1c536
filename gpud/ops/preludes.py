"""Shared helpers added to a family's source (the daemon allows no includes): after it in WGSL (its
`enable` directives come first, and module-scope declarations may be used before they appear), before
it in CUDA C (declared before use). Standard library only: scripts/check-cuda-compile.py reads this
file without gpud's dependencies."""

from __future__ import annotations

CUDA_FAMILIES = (
    "attention", "elementwise", "fused", "layout", "matmul", "matmul_tc", "matmul_tma", "matmul_wg", "matvec_tc",
    "reduce", "reduce_axis",
)  # fmt: skip
_CUDA: dict[str, tuple[str, ...]] = {
    "matmul_tc": ("cp_async", "products"),
    # wgmma.cu uses products.cu's u64; matmul_tma takes cp_async.cu's smem_u32 only (TMA fills its stages),
    # tma.cu's mbarriers, copies and loops (its unsplit and split-K kernels share them), and cluster.cu's
    # barrier and distributed shared memory (attention's splits of a row in one cluster too)
    "matmul_tma": ("activation", "cp_async", "products", "wgmma", "tma", "cluster"),
    "matmul_wg": ("activation", "cp_async", "products", "wgmma"),
    "matvec_tc": ("products",),
    "attention": ("rotary", "cp_async", "cluster"),
    "elementwise": ("activation", "nan"),
    "fused": ("halves", "load_store", "rotary", "block_sum"),
    "matmul": ("block_sum",),
    "reduce": ("halves", "load_store", "nan"),
    "reduce_axis": ("halves", "nan"),
}
TABLE: dict[tuple[str, str], tuple[str, ...]] = {
    ("matmul", "webgpu"): ("bf16",),
    **{(family, "webgpu"): ("bf16", "nan") for family in ("reduce", "reduce_axis")},
    ("elementwise", "webgpu"): ("nan", "power"),
    **{(family, "webgpu"): ("bf16", "rotary") for family in ("attention", "fused")},
    # every CUDA entry point starts with gpud_wait_prior() (pdl.cu)
    **{(family, "cuda"): ("pdl", *_CUDA.get(family, ())) for family in CUDA_FAMILIES},
}
NAMES = frozenset(name for names in TABLE.values() for name in names)  # sources that are no family

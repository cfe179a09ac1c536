"""Shared helpers added to a family's source (the daemon allows no includes): after it in WGSL (its
`enable` directives come first, and module-scope declarations may be used before they appear), before
it in CUDA C (declared before use). Standard library only: scripts/check-cuda-compile.py reads this
file without gpud's dependencies."""

from __future__ import annotations

TABLE: dict[tuple[str, str], tuple[str, ...]] = {
    **{(family, "webgpu"): ("bf16",) for family in ("matmul", "reduce", "reduce_axis")},
    **{(family, "webgpu"): ("bf16", "rotary") for family in ("attention", "fused")},
    **{(family, "cuda"): ("cp_async", "products") for family in ("matmul_tc", "matmul_wg")},
    ("attention", "cuda"): ("rotary",),
    ("fused", "cuda"): ("halves", "load_store", "rotary"),
    ("reduce", "cuda"): ("halves", "load_store"),
    ("reduce_axis", "cuda"): ("halves",),
}
NAMES = frozenset(name for names in TABLE.values() for name in names)  # sources that are no family

"""matvec_tc_harness's device side: the launch rules of gpud/ops/matvec_tc.cu and of the old matvec
(checked against gpud_protocol where it imports), NVRTC builds of both families with their preludes,
their entry points as gemm_device.Kernel objects, and 16-bit weight patterns. Run through the harness,
which puts this module and gemm_device in sys.modules by path (benchmarks/cuda.py would shadow
cuda-python)."""

from __future__ import annotations

import importlib
import importlib.util
import multiprocessing
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

if "gemm_device" not in sys.modules:  # spawned compile workers find it registered and unpickle from it
    _spec = importlib.util.spec_from_file_location("gemm_device", Path(__file__).resolve().parent / "gemm_device.py")
    assert _spec is not None and _spec.loader is not None
    sys.modules["gemm_device"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["gemm_device"])
gd = sys.modules["gemm_device"]

Array = npt.NDArray[Any]
OPS = gd.ROOT / "gpud" / "ops"
SOURCES = {  # each family after its preludes (gpud/ops/preludes.py), and the entry points it must have
    ("variants.cu", "pdl.cu", "products.cu", "matvec_tc.cu"): [
        *(f"matvec_tc{r}{w}_f32_{t}" for t in ("f16", "bf16") for w in ("", "w4", "w16") for r in (8, 16, 32, 64)),
        "matvec_tc8w16u2_f32_f16",  # GPUD_MATVEC_TC_VARIANTS
    ],
    ("pdl.cu", "block_sum.cu", "matmul.cu"): [
        "matvec_f32_f16",
        "matvec_f32_bf16",
        "matvec_sx_f32_f16",
        "matvec_sx_f32_bf16",
    ],
}
SHORT = {"float16": "f16", "bfloat16": "bf16"}
POISON = 0x7FC0DEAD  # a NaN no kernel writes: out's elements before the kernel and the guard after it

# Launch rules, from gpud_protocol.ops.matvec_tc (TF_ROWS, TF_COLUMNS, tf_kernel, tf_grid) and .matmul
# (fold, threads_per_row, matvec_grid, matvec_groups) and .matvec_sx (sx_grid); compared with the
# protocol's where it imports.
TF_ROWS = (8, 16, 32, 64)
TF_COLUMNS = 16
FEW_COLUMNS = 2048  # weights of at most these N: 16 warps, wider ones 4


def fold(groups: int, batch: int) -> tuple[int, int, int]:
    return (groups, 1, batch) if groups <= gd.MAX_GROUPS else (gd.MAX_GROUPS, -(-groups // gd.MAX_GROUPS), batch)


def tc_name(m: int, n: int, t: str) -> str:
    return f"matvec_tc{next(r for r in TF_ROWS if m <= r)}{'w16' if n <= FEW_COLUMNS else 'w4'}_f32_{t}"


def tc_grid(rows: int, batch: int, n: int) -> tuple[int, int, int]:
    return fold(-(-n // TF_COLUMNS), batch)


def threads_per_row(k: int) -> int:
    t = 32
    while t < 256 and t * 32 < k:
        t *= 2
    return t


def mv_grid(batch: int, n: int, k: int) -> tuple[int, int, int]:
    return fold(-(-n // (256 // threads_per_row(k))), batch)


def sx_grid(batch: int, n: int, k: int, m: int) -> tuple[int, int, int]:
    """matvec's blocks with each thread taking 4 rows of w (2 past 4 rows of x)."""
    return fold(-(-n // (256 // threads_per_row(k) * (4 if m <= 4 else 2))), batch)


def mv_group(m: int) -> int | None:
    """Rows per launch group of the old matvec (grid z); the client stops at 32 rows (MATVEC_GROUPED)."""
    return m if m <= 8 else next((r for r in range(8, 3, -1) if m % r == 0), None)


def check_protocol() -> None:
    """The rules above against gpud_protocol's (asserts), where the package imports (it needs msgpack)."""
    sys.path.insert(0, str(gd.ROOT / "protocol"))
    try:
        tf = importlib.import_module("gpud_protocol.ops.matvec_tc")
        mm = importlib.import_module("gpud_protocol.ops.matmul")
        sx = importlib.import_module("gpud_protocol.ops.matvec_sx")
    except Exception as exc:
        print(f"gpud_protocol does not import ({exc!r}): launch rules not compared with it")
        return
    assert tf.TF_ROWS == TF_ROWS and tf.TF_COLUMNS == TF_COLUMNS and tf.FEW_COLUMNS == FEW_COLUMNS
    for m in range(1, 65):
        for dtype, t in SHORT.items():
            for n in (896, 9728):
                assert tf.tf_kernel(m, n, "float32", dtype, True, "9.0") == tc_name(m, n, t), m
        if 8 < m <= mm.MATVEC_GROUPED:  # where the client groups rows for matvec
            plan, group = mm.matvec_groups(mm.Plan((m, 96), 1, m, 96, 64, 0, 0)), mv_group(m)
            assert (plan and (plan.batch, plan.m, plan.x_stride)) == (group and (m // group, group, group * 64)), m
    for n, k in ((1, 3), (33, 70), (896, 896), (896, 4864), (151936, 896), (10**6, 8000)):
        assert mm.matvec_grid(3, n, k, True) == mv_grid(3, n, k), (n, k)
        for m in range(1, 9):
            assert sx.sx_grid(3, n, k, m) == sx_grid(3, n, k, m), (n, k, m)
        for r in TF_ROWS:
            assert tf.tf_grid(f"matvec_tc{r}_f32_f16", 3, n) == tc_grid(r, 3, n), (r, n)


def compile_images(arch: str) -> list[bytes]:
    variants = "#define GPUD_MATVEC_TC_VARIANTS\n"  # the source's measurement-only entry points
    texts = [
        "".join(variants if name == "variants.cu" else (OPS / name).read_text() for name in files) for files in SOURCES
    ]
    context = multiprocessing.get_context("spawn")  # NVRTC holds the GIL; the workers never touch CUDA
    with ProcessPoolExecutor(max_workers=len(texts), mp_context=context) as pool:
        images = list(pool.map(gd.compile_cubin, texts, [arch] * len(texts)))
    for image, names in zip(images, SOURCES.values(), strict=True):
        assert all(name.encode() in image for name in names), names
    return images


def build(dev: Any) -> dict[str, Any]:
    """Every entry point of SOURCES as a gemm_device.Kernel (bm: its most rows, bn: columns per block)."""
    cu, attr, kernels = dev.cu, dev.cu.CUfunction_attribute, {}
    for image, names in zip(compile_images(dev.arch), SOURCES.values(), strict=True):
        module = gd._check(cu.cuModuleLoadData(image))
        dev.modules.append(module)
        for name in names:
            fn = gd._check(cu.cuModuleGetFunction(module, name.encode()))
            resources = [
                gd._check(cu.cuFuncGetAttribute(getattr(attr, f"CU_FUNC_ATTRIBUTE_{a}"), fn))
                for a in ("NUM_REGS", "LOCAL_SIZE_BYTES", "SHARED_SIZE_BYTES")
            ]
            shape = re.match(r"matvec_tc(\d+)(?:w(\d+))?", name)
            rows = int(shape[1]) if shape else 8
            threads = 32 * int(shape[2]) if shape and shape[2] else 256
            kernels[name] = gd.Kernel(name, rows, TF_COLUMNS if shape else 0, threads, fn, *resources)
    return kernels


def weight_bits(values: Array, dtype: str) -> Array:
    """`values` rounded to float16 or bfloat16 (nearest even), as int16 bits (a dtype torch takes)."""
    if dtype == "float16":
        return values.astype(np.float16).view(np.int16)
    u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).view(np.int16)


def weight_values(bits: Array, dtype: str) -> Array:
    if dtype == "float16":
        return bits.view(np.float16).astype(np.float64)
    return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def poisoned(torch: Any, size: int) -> Any:
    return torch.full((size,), POISON, dtype=torch.int32, device="cuda")

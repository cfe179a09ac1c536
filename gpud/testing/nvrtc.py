"""The op library's CUDA sources compiled with NVRTC on a machine without a GPU (NVRTC needs none):
each family builds for sm_90a (and sm_80 where it runs there), and every kernel its specs name is an
entry point of the PTX. The test suite runs it wherever the `nvidia-cuda-nvrtc-cu12` wheel is
installed (the `test` extra), so a CUDA kernel that does not compile never waits for a device run.

    python -m gpud.testing.nvrtc [family ...]     (NVRTC_LIB=path/to/libnvrtc.so.12 to pick one)

scripts/check-cuda-compile.py makes the same builds and reports what each kernel costs (registers,
spills, tensor-core instructions in its SASS): a tool for kernel work, not a test.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
import sys
from importlib import resources
from pathlib import Path

from gpud_protocol.ops import FAMILIES, KERNELS

SM_90A_ONLY = frozenset({"matmul_tma", "matmul_wg"})  # wgmma


@functools.cache
def library() -> ctypes.CDLL | None:
    """libnvrtc: NVRTC_LIB, else the nvidia-cuda-nvrtc-cu12 wheel's; None where neither is."""
    path = os.environ.get("NVRTC_LIB")
    if not path:
        spec = importlib.util.find_spec("nvidia.cuda_nvrtc") if importlib.util.find_spec("nvidia") else None
        if spec is None or not spec.submodule_search_locations:
            return None
        path = str(Path(next(iter(spec.submodule_search_locations))) / "lib" / "libnvrtc.so.12")
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


def families() -> list[str]:
    from gpud import ops

    return sorted(
        p.name[:-3]
        for p in resources.files(ops).iterdir()
        if p.name.endswith(".cu") and p.name[:-3] not in ops.PRELUDES
    )


def compile_ptx(lib: ctypes.CDLL, source: str, arch: str) -> tuple[str | None, str]:
    """(the PTX, or None if NVRTC failed; its log)."""
    program = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"kernel.cu", 0, None, None):
        return None, "nvrtcCreateProgram failed"
    try:
        options = (ctypes.c_char_p * 1)(f"--gpu-architecture={arch}".encode())
        status = lib.nvrtcCompileProgram(program, 1, options)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(program, log)
        if status:
            return None, log.value.decode(errors="replace")
        lib.nvrtcGetPTXSize(program, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(program, ptx)
        return ptx.value.decode(errors="replace"), log.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def problems(lib: ctypes.CDLL, family: str, arch: str) -> list[str]:
    """What is wrong with the family's CUDA source for `arch`: NVRTC's errors, or entry points its specs
    name that the PTX lacks."""
    from gpud import ops

    ptx, log = compile_ptx(lib, ops.source(family, "cuda"), arch)
    if ptx is None:
        return [f"{family} ({arch}) does not compile:\n{log}"]
    bodies = dict(re.findall(r"\.entry\s+(\w+)\s*\((.*?)(?=\.entry\s|\Z)", ptx, re.S))
    missing = [
        f"{family} ({arch}): no entry point {spec.name}"
        for module in FAMILIES
        if "cuda" in getattr(module, "BACKENDS", ("cuda", "webgpu"))
        for spec in module.SPECS
        if spec.family == family and spec.name not in bodies
    ]
    if not arch.startswith("sm_90"):
        return missing
    return missing + [
        f"{family} ({arch}): {name} reads memory before gpud_wait_prior()"
        for name, body in bodies.items()
        if not _waits_first(body, name in KERNELS and bool(KERNELS[name].early))
    ]


def _waits_first(body: str, early: bool = False) -> bool:
    """Whether the entry waits for the kernel before it (griddepcontrol.wait) before any load or store
    other than of its parameters: what makes a programmatic graph edge into it safe. A kernel that reads
    a read-only tensor early (KernelSpec.early: matvec_ro) may stream it first: before its wait it makes
    streaming loads (ld.global.cs, its weight's) and no other access."""
    wait = body.find("griddepcontrol.wait")
    before = re.findall(r"\b(?:ld|st|cp\.async|atom|red)\.(?!param)[\w.:]*", body[: max(wait, 0)])
    return wait >= 0 and all(early and access.startswith("ld.global.cs") for access in before)


def main(names: list[str]) -> int:
    lib = library()
    if lib is None:
        print("no libnvrtc: pip install nvidia-cuda-nvrtc-cu12, or set NVRTC_LIB", file=sys.stderr)
        return 2
    found = []
    for family in names or families():
        for arch in ("sm_90a",) if family in SM_90A_ONLY else ("sm_90a", "sm_80"):
            found += (wrong := problems(lib, family, arch))
            print(f"{family:12} {arch}: {'FAILED' if wrong else 'ok'}")
    print("\n".join(found))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

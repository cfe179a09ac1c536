"""The built-in op library: one `.cu` and one `.wgsl` source per family, shipped with the daemon.

The interface of each kernel (arguments, what it writes, the rule its arguments follow) is defined
once in `gpud_protocol.ops`; a session registers one with the source `gpud:<name>` and the daemon
compiles the family's source for the device on first use (shared by every session, like any kernel).
"""

from __future__ import annotations

import functools
from importlib import resources

from gpud.ops import preludes
from gpud_protocol import KernelOptions
from gpud_protocol.ops import KernelSpec

_SUFFIX = {"cuda": ".cu", "webgpu": ".wgsl"}
PRELUDES = preludes.NAMES  # sources that are no family: see gpud.ops.preludes


@functools.cache
def source(family: str, backend: str) -> str:
    """The family's source for `backend` (package data)."""
    suffix = _SUFFIX.get(backend)
    if suffix is None:
        raise LookupError(f"the op library has no {backend} sources")
    path = resources.files(__name__).joinpath(family + suffix)
    if not path.is_file():  # a family of one backend (matmul_tc: CUDA's tensor cores)
        raise LookupError(f"the op library's {family} kernels have no {backend} version")
    shared = "".join(
        resources.files(__name__).joinpath(name + suffix).read_text()
        for name in preludes.TABLE.get((family, backend), ())
    )
    return shared + path.read_text() if backend == "cuda" else path.read_text() + shared


def waits_for_prior(source: str) -> bool:
    """Whether `source` is one of the library's CUDA sources, whose every entry point waits for the
    kernel before it first (pdl.cu): a CUDA graph may start it while that kernel finishes."""
    return source in _cuda_sources()


@functools.cache
def _cuda_sources() -> frozenset[str]:
    return frozenset(source(family, "cuda") for family in preludes.CUDA_FAMILIES)


def options(spec: KernelSpec, backend: str) -> KernelOptions:
    """A built-in kernel's options: on CUDA its block and dynamic shared memory (WGSL kernels set
    their workgroup size in the source)."""
    if backend != "cuda":
        return KernelOptions()
    return KernelOptions((spec.block, 1, 1), shared=spec.shared)

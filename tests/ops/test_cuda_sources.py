"""Every CUDA family of the op library compiles with NVRTC for Hopper (sm_90a), and every kernel its
specs name is an entry point of the PTX: checked here, without a GPU (`gpud.testing.nvrtc`; skipped
where the nvidia-cuda-nvrtc-cu12 wheel of the `test` extra is missing)."""

from __future__ import annotations

import pytest

from gpud.testing import nvrtc


@pytest.mark.parametrize("family", nvrtc.families())
def test_the_family_compiles_and_has_every_kernel_of_its_specs(family: str) -> None:
    lib = nvrtc.library()
    if lib is None:
        pytest.skip("no libnvrtc (pip install nvidia-cuda-nvrtc-cu12)")
    assert nvrtc.problems(lib, family, "sm_90a") == []


def test_a_source_that_does_not_compile_is_reported_with_the_log() -> None:
    lib = nvrtc.library()
    if lib is None:
        pytest.skip("no libnvrtc (pip install nvidia-cuda-nvrtc-cu12)")
    ptx, log = nvrtc.compile_ptx(lib, 'extern "C" __global__ void k(float* x) { x[0] = y; }', "sm_90a")
    assert ptx is None and "identifier" in log and '"y"' in log

"""`gpud` on the command line: what it refuses in one line before it starts anything."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("which", ["decode", "embed", "ops", "soak"])
def test_a_bench_of_the_op_library_refuses_the_fake_backend_in_one_line(which: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpud", "bench", which, "--backend", "fake"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"gpud: gpud bench {which} runs the op library, which the fake backend lacks (--backend cuda or webgpu)"
    )

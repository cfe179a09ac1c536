"""What the webgpu backend knows of a kernel: writes from a parse of the WGSL, checked scalars,
bounded packers, and the warning about lavapipe's loop limit."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import gpud_client
from gpud.backends.webgpu.dispatch import scalar_struct
from gpud.testing.spawn import answers
from gpud_client import PermissionDenied

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# Valid WGSL that writes binding 1; the old regex missed each of these spellings.
_BODY = """
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&w)) { w[gid.x] = x[gid.x] * 2.0; }
}
"""
_WRITERS = {
    "suffix-u": "@group(0) @binding(0) var<storage, read> x: array<f32>;\n"
    "@group(0) @binding(1u) var<storage, read_write> w: array<f32>;",
    "hex": "@group(0) @binding(0) var<storage, read> x: array<f32>;\n"
    "@group(0) @binding(0x1) var<storage, read_write> w: array<f32>;",
    "trailing-comma": "@group(0) @binding(0) var<storage, read> x: array<f32>;\n"
    "@group(0) @binding(1,) var<storage, read_write> w: array<f32>;",
    "const": "const ONE: u32 = 1u;\n@group(0) @binding(0) var<storage, read> x: array<f32>;\n"
    "@group(0) @binding(ONE) var<storage, read_write> w: array<f32>;",
    "line-comment": "@group(0) @binding(0) var<storage, read> x: array<f32>;\n"
    "@group(0) @binding(1) // weights; scaled in place\nvar<storage, read_write> w: array<f32>;",
    "block-comment": "@group(0) @binding(0) var<storage, read> x: array<f32>;\n"
    "@group(0) @binding(1) /* a; b */ var<storage, read_write> w: array<f32>;",
}


@pytest.mark.parametrize("spelling", sorted(_WRITERS))
async def test_read_only_residents_cannot_be_written_through_valid_wgsl(address: str, spelling: str) -> None:
    """Regression: each spelling let another session overwrite a read-only resident."""
    name = f"test/ro-{spelling}-{uuid.uuid4().hex[:8]}"
    weights = np.arange(64, dtype=np.float32)
    async with gpud_client.connect(address) as owner, gpud_client.connect(address) as other:
        if owner.backend != "webgpu":
            pytest.skip("WGSL only")
        owner.publish(owner.tensor(weights), name, "ro")
        await owner.sync()
        w = await other.open(name)
        k = await other.kernel(_WRITERS[spelling] + _BODY, "main")
        assert k.writes == (1,), f"{spelling}: the daemon did not see the write"
        other.dispatch(k, 1, [other.tensor(np.ones(64, np.float32)), w])
        with pytest.raises(PermissionDenied):
            await other.sync()
        np.testing.assert_array_equal(await w.numpy(), weights)
        owner.unpublish(name)


def test_scalar_packers_are_bounded() -> None:
    """Regression: one packer per scalar signature, kept forever (167 MiB for 100,000 signatures)."""
    scalar_struct.cache_clear()
    for i in range(2000):
        kinds = tuple(1 + ((i >> b) & 1) for b in range(11))
        scalar_struct(kinds)
    info = scalar_struct.cache_info()
    assert info.maxsize == 256 and info.currsize <= 256


def test_the_daemon_warns_about_lavapipe_at_start(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/gpud.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpud", "serve", "--address", address, "--backend", "webgpu"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not answers(address, 0.5):
            assert proc.poll() is None and time.monotonic() < deadline
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    if "software" not in err and "lavapipe" not in err:
        pytest.skip("not on a software adapter")
    assert "65,535" in err

"""The compute-pass calls that go straight into wgpu-native do what wgpu-py's methods do."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

wgpu = pytest.importorskip("wgpu")

from gpud.backends.webgpu import pass_calls  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SHADER = """
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * 256u + gid.x;
    if (i < arrayLength(&out)) { out[i] = i * 3u + 1u; }
}
"""


def _run(calls: tuple[Any, Any, Any]) -> np.ndarray:
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if adapter is None:
        pytest.skip("no WebGPU adapter")
    device = adapter.request_device_sync()
    pipeline = device.create_compute_pipeline(
        layout="auto", compute={"module": device.create_shader_module(code=SHADER), "entry_point": "main"}
    )
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
    buffer = device.create_buffer(size=4 * 512, usage=usage)
    group = device.create_bind_group(
        layout=pipeline.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buffer}}]
    )
    set_pipeline, set_bind_group, dispatch = calls
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    set_pipeline(compute, pipeline)
    set_bind_group(compute, group)
    dispatch(compute, 4, 2, 1)  # 256 x 2 invocations, one element each
    compute.end()
    device.queue.submit([encoder.finish()])
    return np.frombuffer(device.queue.read_buffer(buffer), np.uint32)


def test_the_direct_calls_write_what_the_public_methods_write() -> None:
    direct = pass_calls.calls()
    assert direct[0].__qualname__.startswith("_direct")  # wgpu-py as this expects it: the fast path is on
    got, want = _run(direct), _run(pass_calls._public())
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, np.arange(512, dtype=np.uint32) * 3 + 1)

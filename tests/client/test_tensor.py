"""Tensors as the client sees them: zero-filled on every backend, never silently turned into numpy."""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client


async def test_new_tensors_are_zero_filled_on_every_backend(gpu: gpud_client.Client) -> None:
    """Regression: empty() was zeroed on webgpu but uninitialised on cuda."""
    for _ in range(3):  # reuse freed memory: it must not show through
        t = gpu.tensor(np.full(1 << 16, 7.0, np.float32))
        await t.numpy()
        t.free()
        fresh = gpu.empty(1 << 16)
        np.testing.assert_array_equal(await fresh.numpy(), np.zeros(1 << 16, np.float32))
        zeros = gpu.zeros((4, 5), "int32")
        np.testing.assert_array_equal(await zeros.numpy(), np.zeros((4, 5), np.int32))
        fresh.free()


async def test_numpy_asarray_of_a_tensor_points_at_numpy(gpu: gpud_client.Client) -> None:
    """Regression: np.asarray(tensor) returned an object array."""
    t = gpu.empty(4)
    with pytest.raises(TypeError, match=r"await tensor\.numpy\(\)"):
        np.asarray(t)
    with pytest.raises(TypeError):
        np.array([t])


async def test_an_array_of_python_objects_is_refused(gpu: gpud_client.Client) -> None:
    with pytest.raises(gpud_client.InvalidArgument):
        gpu.tensor(np.array([object()]))

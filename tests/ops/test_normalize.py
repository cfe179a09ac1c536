"""gpu.ops.normalize (torch.nn.functional.normalize, p=2 over the last axis) against numpy in float64:
x / max(||x||, eps), rows of zeros (x / eps: zeros), an eps above the norm, lengths from 1 to past what
one thread of a workgroup walks in one step, more rows than 65,535 (the grid folds), poisoned outputs."""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument

TOL = {"float32": 1e-6, "float16": 1e-3}  # relative to max(|ref|, 2^-14): float16 stores it rounded


def reference(a: np.ndarray, eps: float) -> np.ndarray:
    a64 = a.astype(np.float64)
    norm = np.maximum(np.sqrt((a64**2).sum(-1, keepdims=True)), eps)
    result: np.ndarray = a64 / norm
    return result


@pytest.mark.parametrize("dtype", ["float32", "float16"])
async def test_normalize_is_torchs(gpu: gpud_client.Client, dtype: str) -> None:
    rng = np.random.default_rng()
    for shape, eps in (((1,), 1e-12), ((3, 7), 1e-12), ((2, 5, 384), 1e-12), ((2, 70_000), 1e-12),
                       ((65_537, 3), 1e-12), ((4, 9), 10.0)):  # fmt: skip
        a = rng.standard_normal(shape).astype(dtype)
        if len(shape) > 1:
            a[..., 1, :] = 0  # a row of zeros: zeros, not NaN
        out = gpu.tensor(np.full(shape, np.nan, dtype))
        gpu.ops.normalize(gpu.tensor(a), eps, out=out)
        got, ref = (await out.numpy()).astype(np.float64), reference(a, eps)
        assert not np.isnan(got).any()
        assert np.all(np.abs(got - ref) <= TOL[dtype] * np.maximum(np.abs(ref), 2.0**-14)), (shape, eps)
    made = gpu.ops.normalize(gpu.tensor(a))
    assert (np.dtype(made.dtype).name, tuple(made.shape)) == (dtype, a.shape)


async def test_normalize_errors_name_the_op(gpu: gpud_client.Client) -> None:
    with pytest.raises(InvalidArgument, match="x is int32") as info:
        gpu.ops.normalize(gpu.tensor(np.ones((2, 3), np.int32)))
    assert info.value.op == "normalize"
    with pytest.raises(InvalidArgument, match="eps must be finite and >= 0") as info:
        gpu.ops.normalize(gpu.tensor(np.ones((2, 3), np.float32)), -1.0)
    assert info.value.op == "normalize"

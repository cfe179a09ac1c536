"""ew_binary16 and ew_unary16, CUDA's elementwise kernels of 16 bytes a thread: on a GPU, every float dtype
and op gives the generic kernels' bits exactly (the same conversions and arithmetic), including NaN and
the edges of a multiple of 16 bytes; which calls the client sends to them; and the rule, without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_protocol.ops import KERNEL_BACKENDS, KERNELS, OpError, TensorInfo, grid_1d
from gpud_protocol.ops.broadcast import broadcast_layout
from gpud_protocol.ops.dtypes import DTYPES
from gpud_protocol.ops.elementwise import BINARY_OPS, UNARY_OPS
from gpud_protocol.ops.elementwise16 import binary16_applies, unary16_applies, words
from ops.test_elementwise import BINARY, UNARY
from ops.test_elementwise4 import draw, tensor

FLOATS = ["float32", "float16", "bfloat16"]
CODE = {name: DTYPES[name].code for name in FLOATS}


def cuda_only(gpu: gpud_client.Client) -> None:
    if gpu.backend != "cuda":
        pytest.skip("ew_binary16 and ew_unary16 are CUDA's")


async def generic_bits(
    gpu: gpud_client.Client, name: str, tensors: list[gpud_client.Tensor], scalars: list[float]
) -> bytes:
    """The same call through the generic kernel (one 4-byte word a thread), read back as bytes."""
    out = tensors[-1]
    n = int(scalars[0])
    itemsize = np.dtype(np.float32).itemsize if out.dtype_name == "float32" else 2
    grid = grid_1d(-(-n * itemsize // 4) if itemsize == 2 else n)
    gpu.ops._run(name, grid, tensors, scalars, None)
    return (await out.numpy()).tobytes()


@pytest.mark.parametrize("dtype", FLOATS)
async def test_every_op_gives_the_generic_kernels_bits(gpu: gpud_client.Client, dtype: str) -> None:
    cuda_only(gpu)
    rng = np.random.default_rng()
    n = 4096 + 64  # past one block, a multiple of 16 bytes in every dtype
    x, y = draw(rng, (n,), dtype), draw(rng, (n,), dtype)
    x[:3], y[5] = [np.nan, np.inf, -0.0], -np.inf
    tx, ty = tensor(gpu, x, dtype), tensor(gpu, y, dtype)
    code = CODE[dtype]
    lay = broadcast_layout((n,), (n,), (n,)).scalars()
    for op in [name for name in BINARY if name in BINARY_OPS and BINARY_OPS[name] < 7] + ["power"]:
        scalars: list[float] = [n, BINARY_OPS[op], *lay, code, code, code]
        fast = tensor(gpu, np.full(n, np.nan, np.float32), dtype)
        gpu.ops._run("ew_binary16", grid_1d(words(n, code)), [tx, ty, fast], scalars, None)
        slow = tensor(gpu, np.full(n, 7.0, np.float32), dtype)
        assert (await fast.numpy()).tobytes() == await generic_bits(gpu, "ew_binary", [tx, ty, slow], scalars), op
    for op in [name for name in UNARY if name in UNARY_OPS]:  # negative is scale by -1
        a = abs(x) if op in ("rsqrt", "sqrt", "log") else x
        ta = tensor(gpu, a, dtype)
        scalars = [n, UNARY_OPS[op], 0.5, 2.0, code, code]
        fast = tensor(gpu, np.full(n, np.nan, np.float32), dtype)
        gpu.ops._run("ew_unary16", grid_1d(words(n, code)), [ta, fast], scalars, None)
        slow = tensor(gpu, np.full(n, 7.0, np.float32), dtype)
        assert (await fast.numpy()).tobytes() == await generic_bits(gpu, "ew_unary", [ta, slow], scalars), op


async def test_the_client_sends_dense_same_dtype_calls_there(gpu: gpud_client.Client) -> None:
    cuda_only(gpu)
    rng = np.random.default_rng()
    x, y = draw(rng, (64, 384), "float16"), draw(rng, (64, 384), "float16")
    tx, ty = tensor(gpu, x, "float16"), tensor(gpu, y, "float16")
    got = await gpu.ops.gelu(tx + ty).numpy()
    assert {"ew_binary16", "ew_unary16"} <= set(gpu.ops._kernels)
    assert got.shape == (64, 384) and not np.isnan(got.astype(np.float32)).any()
    before = set(gpu.ops._kernels)
    await (tx + tensor(gpu, y[0], "float16")).numpy()  # broadcast: the generic kernel
    assert set(gpu.ops._kernels) - before == {"ew_binary"}


def test_which_calls_apply() -> None:
    f16, f32, bf16 = CODE["float16"], CODE["float32"], CODE["bfloat16"]
    assert binary16_applies(8, [0, 0], [f16] * 3, [0, 0, 0])
    assert binary16_applies(4, [0, 0], [f32] * 3, [0, 4, 8])
    assert not binary16_applies(4, [0, 0], [f16] * 3, [0, 0, 0])  # 8 bytes
    assert not binary16_applies(8, [1, 0], [f16] * 3, [0, 0, 0])  # broadcast
    assert not binary16_applies(8, [0, 0], [f16, f16, f32], [0, 0, 0])  # mixed dtypes
    assert not binary16_applies(8, [0, 0], [f16] * 3, [0, 4, 0])  # y starts 8 bytes in
    assert unary16_applies(16, [bf16, bf16], [0, 128])
    assert not unary16_applies(16, [DTYPES["int32"].code] * 2, [0, 0])
    assert words(4096, f16) == 512 and words(4096, f32) == 1024


def test_the_daemon_checks_the_dispatches() -> None:
    f16 = TensorInfo("float16", (64,))
    lay = broadcast_layout((64,), (64,), (64,)).scalars()
    code = CODE["float16"]
    KERNELS["ew_binary16"].verify([f16, f16, f16], [64, 0, *lay, code, code, code])
    KERNELS["ew_unary16"].verify([f16, f16], [64, 4, 0.0, 0.0, code, code])
    with pytest.raises(OpError, match="takes x, y and out of one float dtype"):  # verify's view rule asks more
        KERNELS["ew_binary16"].check([f16, f16._replace(offset=4), f16], [64, 0, *lay, code, code, code])
    f32 = TensorInfo("float32", (64,))
    with pytest.raises(OpError, match="takes x and out of one float dtype"):
        KERNELS["ew_unary16"].verify([f16, f32], [64, 4, 0.0, 0.0, code, CODE["float32"]])
    odd = TensorInfo("float16", (12,))
    with pytest.raises(OpError, match=r"n 12"):
        KERNELS["ew_unary16"].verify([odd, odd], [12, 4, 0.0, 0.0, code, code])


async def test_webgpu_refuses_the_cuda_kernels_by_name(gpu: gpud_client.Client) -> None:
    """A CUDA-only kernel of a family both backends have (elementwise, reduce): registered raw on WebGPU it
    is refused saying so, not compiled into a pipeline whose entry point is missing."""
    if gpu.backend == "cuda":
        pytest.skip("the CUDA backend has them")
    for name in ("ew_binary16", "layernorm_warp_f16_f16", "add_layernorm_warp_f32_f32"):
        assert KERNEL_BACKENDS[name] == ("cuda",)
        gpu.ops._kernel(name)  # not awaited: its error comes with a request after it
        with pytest.raises(gpud_client.InvalidArgument, match=f"{name} is the op library's kernel for cuda only"):
            await gpu.sync()
            await gpu.sync()
    assert KERNEL_BACKENDS["ew_binary"] == ("cuda", "webgpu")

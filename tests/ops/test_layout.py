"""Views without copies, and `gpu.ops.contiguous`, against numpy on every backend.

`contiguous` moves bits: its results must equal numpy's exactly, for every element size (8, 16, 32
and 64 bits), through transposed, permuted, narrowed and reshaped views of odd shapes, into poisoned
outputs. Every other op takes dense tensors: a narrow along the first axis at an aligned offset
without a copy, anything else with a clear error from the client and, for clients that skip the
client's checks, from the daemon.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument, u32
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.layout import geometry
from gpud_protocol.views import MAX_RANK

DTYPES = ["uint8", "int16", "float16", "float32", "int32", "float64", "int64"]
SHAPE = (5, 7, 3)  # odd sizes: a view's elements end inside a 32-bit word

View = Callable[[Any], Any]  # the same view of a gpud Tensor or a numpy array
VIEWS: dict[str, tuple[View, View]] = {
    "transpose": (lambda t: t.transpose(0, 2), lambda a: a.transpose(2, 1, 0)),
    "transpose-negative": (lambda t: t.transpose(-1, -2), lambda a: a.swapaxes(-1, -2)),
    "permute": (lambda t: t.permute(1, 2, 0), lambda a: a.transpose(1, 2, 0)),
    "narrow-middle": (lambda t: t.narrow(1, 2, 4), lambda a: a[:, 2:6]),
    "narrow-last-odd": (lambda t: t.narrow(2, 1, 1), lambda a: a[:, :, 1:2]),
    "narrow-first": (lambda t: t.narrow(0, 1, 3), lambda a: a[1:4]),  # contiguous, at an odd offset
    "narrow-then-transpose": (lambda t: t.narrow(0, -3, 2).transpose(0, 1), lambda a: a[-3:-1].swapaxes(0, 1)),
    "transpose-then-narrow": (lambda t: t.transpose(0, 1).narrow(0, 3, 3), lambda a: a.swapaxes(0, 1)[3:6]),
    "reshape-of-narrow": (lambda t: t.narrow(1, 0, 6).reshape(5, 2, 9), lambda a: a[:, :6].reshape(5, 2, 9)),
    "empty": (lambda t: t.narrow(1, 3, 0), lambda a: a[:, 3:3]),
}


def values(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Distinct values of `dtype` (bit patterns that an exact copy must keep)."""
    rng = np.random.default_rng()
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def poisoned(gpu: gpud_client.Client, shape: tuple[int, ...], dtype: str) -> gpud_client.Tensor:
    sentinel = np.frombuffer(b"\xa5" * np.dtype(dtype).itemsize, dtype)[0]
    return gpu.tensor(np.full(shape, sentinel, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
async def test_contiguous_copies_every_view_exactly(gpu: gpud_client.Client, dtype: str) -> None:
    a = values(SHAPE, dtype)
    t = gpu.tensor(a)
    for name, (view, ref_view) in VIEWS.items():
        v, ref = view(t), ref_view(a)
        assert v.shape == ref.shape and v.base is t, name
        np.testing.assert_array_equal(await v.numpy(), ref, err_msg=f"readback of {name}")
        out = poisoned(gpu, ref.shape, dtype)
        assert gpu.ops.contiguous(v, out=out) is out
        np.testing.assert_array_equal(await out.numpy(), ref, err_msg=name)
    assert (await gpu.stats())["session"]["handles"] <= 2 + len(VIEWS)  # views minted none: t and the outputs


@pytest.mark.parametrize("dtype", ["uint8", "float16"])
async def test_contiguous_keeps_the_bytes_after_its_last_element(gpu: gpud_client.Client, dtype: str) -> None:
    """The WGSL kernels write 32-bit words: where out ends inside one, its other bytes are a neighbour's."""
    itemsize = np.dtype(dtype).itemsize
    start = 256 // itemsize  # out: a dense view at an aligned offset of a larger tensor, ending mid-word
    big = values((start + 64,), dtype)
    backing = gpu.tensor(big)
    a = values((3, 5), dtype)
    out = backing.narrow(0, start, 15).reshape(5, 3)
    gpu.ops.contiguous(gpu.tensor(a).transpose(0, 1), out=out)
    want = big.copy()
    want[start : start + 15] = a.T.reshape(-1)
    np.testing.assert_array_equal(await backing.numpy(), want)


async def test_contiguous_returns_a_tensor_every_kernel_takes_as_it_is(gpu: gpud_client.Client) -> None:
    t = gpu.tensor(np.arange(8 * 64, dtype=np.float32).reshape(8, 64))
    assert gpu.ops.contiguous(t) is t
    aligned = t.narrow(0, 2, 3)  # 512 bytes in: bound there, no copy
    assert gpu.ops.contiguous(aligned) is aligned
    odd = t.narrow(1, 0, 63).narrow(0, 0, 1).reshape(63)  # contiguous at offset 0
    assert gpu.ops.contiguous(odd) is odd
    shifted = t.reshape(-1).narrow(0, 5, 10)  # contiguous, 20 bytes in: copied
    copy = gpu.ops.contiguous(shifted)
    assert copy is not shifted and not copy.is_view
    np.testing.assert_array_equal(await copy.numpy(), np.arange(5, 15, dtype=np.float32))


async def test_ops_take_a_narrow_of_the_first_axis_without_a_copy(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    x, w = rng.standard_normal((8, 64)).astype(np.float32), rng.standard_normal((64, 5)).astype(np.float32)
    tx = gpu.tensor(x)
    rows = tx.narrow(0, 3, 4)  # 768 bytes in: a multiple of 256
    got = await gpu.ops.matmul(rows, gpu.tensor(w)).numpy()
    np.testing.assert_allclose(got, x[3:7].astype(np.float64) @ w, rtol=1e-5, atol=1e-5)
    doubled = gpu.ops.scale(rows, 2.0)
    np.testing.assert_array_equal(await doubled.numpy(), 2 * x[3:7])
    out = gpu.tensor(np.full((8, 64), np.nan, np.float32))
    gpu.ops.scale(gpu.tensor(x[:2]), 3.0, out=out.narrow(0, 4, 2))  # written through an aligned view
    want = np.full((8, 64), np.nan, np.float32)
    want[4:6] = 3 * x[:2]
    np.testing.assert_array_equal(await out.numpy(), want)


async def test_ops_that_need_dense_tensors_say_so_in_the_client_and_in_the_daemon(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.ones((6, 5), np.float32))
    w = gpu.tensor(np.ones((6, 5), np.float32))
    with pytest.raises(InvalidArgument, match=r"^matmul: x is a non-contiguous view; call gpu\.ops\.contiguous\(x\)"):
        gpu.ops.matmul(x.transpose(0, 1), w)
    with pytest.raises(InvalidArgument, match=r"matmul: x is a view starting at byte 20 .*gpu\.ops\.contiguous\(x\)"):
        gpu.ops.matmul(x.narrow(0, 1, 5), w.transpose(0, 1))
    with pytest.raises(InvalidArgument, match=r"rmsnorm: x is a non-contiguous view"):
        gpu.ops.rmsnorm(x.transpose(0, 1), gpu.tensor(np.ones(6, np.float32)))
    with pytest.raises(InvalidArgument, match=r"softmax: out is a non-contiguous view"):
        gpu.ops.softmax(x, out=gpu.empty((5, 6)).transpose(0, 1))
    # A client that skips the library's checks: the daemon applies the same rule to the dispatch.
    out = gpu.empty((5,))
    gpu.dispatch(gpu.ops._kernel("reduce_f32"), 5, [x.transpose(0, 1), out, u32(5), u32(6), u32(0)])
    with pytest.raises(InvalidArgument, match=r"x is a non-contiguous view; call gpu\.ops\.contiguous\(x\)"):
        await out.numpy()
    shifted = x.reshape(-1).narrow(0, 1, 25).reshape(5, 5)
    gpu.dispatch(gpu.ops._kernel("reduce_f32"), 5, [shifted, out, u32(5), u32(5), u32(0)])
    with pytest.raises(InvalidArgument, match="not a multiple of 256"):
        await out.numpy()
    np.testing.assert_array_equal(await gpu.ops.sum(gpu.ops.contiguous(x.transpose(0, 1))).numpy(), np.full(5, 6.0))


async def test_kernels_of_ones_own_take_dense_views_only(gpu: gpud_client.Client) -> None:
    from support import scale

    k = await scale(gpu)  # y = a * x, one element per thread
    t = gpu.tensor(np.arange(128, dtype=np.float32).reshape(2, 64))
    out = gpu.empty(64)
    gpu.dispatch(k, 1, [t.narrow(0, 1, 1).reshape(64), out, 2.0])  # 256 bytes in: bound at that offset
    np.testing.assert_array_equal(await out.numpy(), 2 * np.arange(64, 128, dtype=np.float32))
    for view, message in [
        (t.transpose(0, 1), "non-contiguous"),
        (t.reshape(-1).narrow(0, 3, 64), "byte 12"),
    ]:
        gpu.dispatch(k, 1, [view, out, 2.0])
        with pytest.raises(InvalidArgument, match=f"tensor argument 0 .*{message}"):
            await out.numpy()


def test_the_rule_of_contiguous_bounds_what_it_reads() -> None:
    """Checked without a device: the view passed must be x's exactly (the kernel reads x's tensor through it)."""
    spec = KERNELS["contiguous_b32"]
    x = TensorInfo("float32", (4, 3), 2, (1, 4))  # a transposed view, two elements in
    out = TensorInfo("float32", (4, 3))
    good = [12, *geometry(x)]
    assert good[1:] == [2, 1, 1, 1, 1, 4, 3, 0, 0, 0, 0, 1, 4]
    spec.verify([x, out], good)
    for bad in ([13, *good[1:]], [12, 3, *good[2:]], [12, *good[1:-1], 5]):
        with pytest.raises(OpError, match="passed"):
            spec.verify([x, out], bad)
    with pytest.raises(OpError, match="float16"):
        spec.verify([x, TensorInfo("float16", (4, 3))], good)
    with pytest.raises(OpError, match="out is a non-contiguous view"):
        spec.verify([x, TensorInfo("float32", (4, 3), 0, (1, 4))], good)
    many = TensorInfo("uint8", (2,) * (MAX_RANK + 1), 0, tuple(3 ** (i + 1) for i in reversed(range(MAX_RANK + 1))))
    with pytest.raises(OpError, match=f"at most {MAX_RANK}"):
        geometry(many)


@pytest.mark.parametrize("family", ["layout", "reduce", "reduce_axis"])
def test_the_wgsl_kernels_declare_what_their_specs_say(family: str) -> None:
    """Each entry's bindings (`<entry>_<tensor>`, in order, read-only but the written ones) and its
    uniform's members (the spec's scalars, names and kinds, in order): the daemon packs the scalars by
    the spec, the kernel reads them by its struct."""
    from gpud.backends.webgpu.wgsl.model import Member
    from gpud.backends.webgpu.wgsl.reflect import reflect
    from gpud.ops import source
    from gpud_protocol.ops import FAMILIES

    r = reflect(source(family, "webgpu"))
    assert r.exact, r.problems
    specs = [  # the specs of modules WebGPU has (reduce_warp's are CUDA's alone)
        spec
        for module in FAMILIES
        if "webgpu" in getattr(module, "BACKENDS", ("cuda", "webgpu"))
        for spec in module.SPECS
        if spec.family == family
    ]
    assert specs
    for spec in specs:
        mine = [b for b in r.bindings if b.name.startswith(spec.name + "_")]
        assert [b.name for b in mine] == [f"{spec.name}_{t}" for t in spec.tensors] + [f"{spec.name}_p"]
        assert [b.binding for b in mine] == list(range(len(spec.tensors) + 1))
        for position, binding in enumerate(mine[:-1]):
            assert binding.access == ("read_write" if position in spec.writes else "read"), binding
        assert r.uniform_members(0, len(spec.tensors)) is not None
        members = r.structs[mine[-1].type]
        assert members == tuple(Member(name, kind) for name, kind in spec.scalars), spec.name

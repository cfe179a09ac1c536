"""numpy's basic indexing and `.T` on device tensors (gpud_client.indexing): views made with no copy
and no message, whose elements read back as numpy's `a[key]`, and which the ops that read strided
views (contiguous, the reductions) take as they are; fancy indexing and negative steps refused naming
"indexing"; a recording's tensors index only where a reshape does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument

KEYS: list[Any] = [
    0,
    -1,
    2,
    np.int64(1),
    np.int32(-2),
    (1, 2),
    (-1, -1, -1),
    (1, 2, 3),
    slice(None),
    slice(1, 3),
    slice(None, None, 2),
    slice(1, None, 2),
    slice(-2, None),
    slice(5, 1),
    slice(-100, 100),
    (slice(None), 1),
    (slice(None), slice(None), 0),
    (slice(None), slice(1, 4, 2)),
    (Ellipsis, 1),
    (Ellipsis, slice(None, None, 3)),
    (0, Ellipsis, -1),
    (None,),
    (Ellipsis, None),
    (None, 1, None, slice(None), None),
    (slice(None), None, slice(1, None, 2), -1),
    (np.int64(2), slice(np.int64(1), None)),
    (Ellipsis,),
    (),
    (slice(None), slice(0, 0)),
]


def rows(shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    return (np.arange(np.prod(shape)) - 7).reshape(shape).astype(dtype)


async def test_indexing_reads_back_as_numpys_and_sends_nothing(gpu: gpud_client.Client) -> None:
    a = rows((3, 4, 5))
    t = gpu.tensor(a)
    await gpu.sync()
    for key in KEYS:
        seq = gpu._last_seq
        v = t[key]
        assert gpu._last_seq == seq, key  # no message
        assert v.base is t and v.shape == a[key].shape and v.ndim == a[key].ndim and v.size == a[key].size, key
        np.testing.assert_array_equal(await v.numpy(), a[key], f"key {key}")
    v = t[1:, ::2][0, 1]  # a view of a view
    np.testing.assert_array_equal(await v.numpy(), a[1:, ::2][0, 1])
    tv, at = t.transpose(0, 2), a.transpose(2, 1, 0)  # indexing a strided view (5, 4, 3)
    for key in KEYS:
        try:
            want = at[key]
        except IndexError:
            with pytest.raises(IndexError, match="out of bounds"):
                tv[key]
            continue
        np.testing.assert_array_equal(await tv[key].numpy(), want, f"transposed, key {key}")


@pytest.mark.parametrize("dtype", ["float16", "int8", "int64"])
async def test_indexing_views_of_narrow_dtypes(gpu: gpud_client.Client, dtype: str) -> None:
    a = rows((4, 6), dtype)
    t = gpu.tensor(a)
    keys: list[Any] = [1, -1, (slice(None), 3), (slice(1, None, 2), slice(None, None, 3)), (Ellipsis, 5), (2, 5)]
    for key in keys:
        np.testing.assert_array_equal(await t[key].numpy(), a[key], f"key {key}")


async def test_ops_that_read_strides_take_indexed_views(gpu: gpud_client.Client) -> None:
    a = np.random.default_rng().standard_normal((6, 8, 10)).astype(np.float32)
    t = gpu.tensor(a)
    keys: list[Any] = [
        (slice(None), slice(1, 7, 2)),
        (Ellipsis, slice(None, None, 3)),
        (1, slice(None), slice(2, 9)),
        -1,
    ]
    for key in keys:
        np.testing.assert_array_equal(await gpu.ops.contiguous(t[key]).numpy(), a[key], f"key {key}")
        got = await gpu.ops.sum(t[key], axis=0).numpy()
        np.testing.assert_allclose(got, a[key].astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-5)
    logits = gpu.tensor(a[0])
    last = logits[-1]  # picoGPT's logits[-1]: a contiguous row, any op takes it where aligned
    np.testing.assert_array_equal(await gpu.ops.argmax(last[None]).numpy(), [a[0][-1].argmax()])
    written = gpu.empty((4, 64))  # rows of 256 bytes: a row's view is bound where it starts
    gpu.ops.scale(gpu.tensor(np.ones((2, 64), np.float32)), 3.0, out=written[2:])  # written through the view
    np.testing.assert_array_equal(await written.numpy(), np.repeat([0.0, 3.0], 2)[:, None] * np.ones(64))


async def test_transpose_ndim_and_size_are_numpys(gpu: gpud_client.Client) -> None:
    for shape in [(), (5,), (3, 4), (2, 3, 4)]:
        a = rows(shape)
        t = gpu.tensor(a)
        assert t.T.shape == a.T.shape and t.ndim == a.ndim and t.size == a.size
        np.testing.assert_array_equal(await t.T.numpy(), a.T)
    q, k = (np.random.default_rng(i).standard_normal((5, 8)).astype(np.float32) for i in range(2))
    got = await (gpu.tensor(q) @ gpu.tensor(k).T).numpy()  # picoGPT's q @ k.T: matmul reads k.T in place
    np.testing.assert_allclose(got, q @ k.T, rtol=1e-5, atol=1e-5)


async def test_what_makes_no_view_is_refused(gpu: gpud_client.Client) -> None:
    t = gpu.tensor(rows((3, 4)))
    fancy: list[Any] = [
        ([0, 2], "a list of indices"),
        (np.array([0, 2]), "a numpy array of indices"),
        (range(2), "a range of indices"),
        (np.array([True, False, True]), "a boolean mask"),
        (True, "a boolean"),
        ((slice(None), [1, 2]), "a list of indices"),
        (gpu.tensor(np.array([0, 1], np.int32)), "a tensor of indices"),
        (gpu.tensor(np.array([True, False, True])), "a boolean mask tensor"),
    ]
    for key, what in fancy:
        with pytest.raises(InvalidArgument, match=rf"{what}.*fancy.*gpu\.ops\.embedding\(ids, table\)") as info:
            t[key]
        assert info.value.op == "indexing"
    for step, why in [(-1, r"no negative strides.*host copy \(\(await t.numpy\(\)\)\[::-1\]\)"), (0, "cannot be zero")]:
        with pytest.raises(InvalidArgument, match=rf"step {step}: .*{why}") as info:
            t[::step]
        assert info.value.op == "indexing"
    for key, message in [
        (3, "index 3 is out of bounds for axis 0 with size 3"),
        (-4, "index -4 is out of bounds for axis 0 with size 3"),
        ((0, 4), "index 4 is out of bounds for axis 1 with size 4"),
        ((0, 0, 0), "too many indices for tensor: tensor is 2-dimensional, but 3 were indexed"),
        ((Ellipsis, 0, Ellipsis), "single ellipsis"),
        (1.0, "only integers, slices"),
        ("a", "only integers, slices"),
    ]:
        with pytest.raises(IndexError, match=message):
            t[key]
    t.free()
    with pytest.raises(InvalidArgument, match="freed"):
        t[0]


async def test_a_recordings_tensors_index_where_a_reshape_does(gpu: gpud_client.Client) -> None:
    x = np.random.default_rng().standard_normal((1, 4, 6)).astype(np.float32)
    g = gpu.graph("index")
    v = g.input("v", (1, 4, 6), "float32")
    assert v.ndim == 3 and v.size == 24
    assert v[0].shape == (4, 6) and v[..., None].shape == (1, 4, 6, 1) and v[:, :4, None].shape == (1, 4, 1, 6)
    row = g.input("row", 6, "float32")
    assert row.T is row
    g.output("a", gpu.ops.mul(v[0], row[None], graph=g))
    g.output("b", gpu.ops.sum(v[None, ..., 0:6], axis=-1, graph=g))
    step = await g.build()
    r = np.arange(6, dtype=np.float32)
    got = await step.replay(v=x, row=r)
    np.testing.assert_allclose(got["a"], x[0] * r[None], rtol=1e-6)
    np.testing.assert_allclose(got["b"], x[None, ..., 0:6].sum(-1), rtol=1e-5, atol=1e-5)
    g2 = gpu.graph("index-refused")
    w = g2.input("w", (3, 4), "float32")
    for key in [0, -1, (slice(None), 1), slice(1, 3), slice(None, None, 2)]:
        with pytest.raises(InvalidArgument, match="reshapes only") as info:
            w[key]
        assert info.value.op == "indexing"
    with pytest.raises(InvalidArgument, match="reshapes only") as info:
        _ = w.T
    assert info.value.op == "transpose"
    with pytest.raises(InvalidArgument, match="fancy") as info:
        w[[0, 1]]


async def test_a_tensor_iterates_as_numpy_iterates_an_array(gpu: gpud_client.Client) -> None:
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    t = gpu.tensor(a)
    rows = list(t)
    assert [row.shape for row in rows] == [(2,)] * 3
    for row, want in zip(rows, a, strict=True):
        np.testing.assert_array_equal(await row.numpy(), want)
    with pytest.raises(TypeError, match="0-d"):
        list(t[0, 0])
    t.free()


async def test_torchs_shape_views_are_reshapes(gpu: gpud_client.Client) -> None:
    """view, flatten, unsqueeze and squeeze as torch's: views of a session's tensor and of a recording's."""
    a = np.arange(6, dtype=np.float32).reshape(1, 3, 1, 2)
    t = gpu.tensor(a)
    assert t.view(3, 2).shape == (3, 2) and t.view(-1).shape == (6,) and t.flatten().shape == (6,)
    assert t.unsqueeze(0).shape == (1, 1, 3, 1, 2) and t.unsqueeze(-1).shape == (1, 3, 1, 2, 1)
    assert t.squeeze().shape == (3, 2) and t.squeeze(2).shape == (1, 3, 2) and t.squeeze(1).shape == a.shape
    assert t.squeeze((0, -2)).shape == (3, 2)
    np.testing.assert_array_equal(await t.unsqueeze(2).numpy(), np.expand_dims(a, 2))
    np.testing.assert_array_equal(await t.squeeze().numpy(), np.squeeze(a))
    one = t[0, 0, 0, :1].squeeze()
    assert one.shape == () and float(await one.numpy()) == 0.0
    with pytest.raises(InvalidArgument, match="out of range"):
        t.unsqueeze(5)
    with pytest.raises(InvalidArgument, match="out of range"):
        t.squeeze(4)
    with pytest.raises(InvalidArgument, match="contiguous"):
        t.squeeze().T.flatten()  # a transpose's elements are not one run: torch's flatten would copy
    g = gpu.graph("torch-shape-views")
    x = g.input("x", (3, 2), "float32")
    g.output("y", gpu.ops.add(x.unsqueeze(0).flatten().view(3, 2), 1.0, graph=g))
    step = await g.build()
    np.testing.assert_array_equal((await step.replay(x=a.reshape(3, 2)))["y"], a.reshape(3, 2) + 1)
    step.free()
    t.free()

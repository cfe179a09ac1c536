"""The geometry of numpy's basic indexing (gpud_client.indexing), without a GPU: for many keys on
tensors and strided views of them, the view's shape and elements are numpy's `a[key]`, its offset and
strides those numpy's view has (but where an axis has one element), and the daemon takes it (the
codec's bounds and `gpud.session.tensors.view_of`); numpy's IndexErrors are raised where numpy raises
them, and what makes no view is refused naming "indexing"."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import gpud_protocol as proto
from gpud.session.tensors import Handle, Tensor, view_of
from gpud_client import InvalidArgument
from gpud_client.indexing import indexed
from gpud_protocol.fields import check_view


def geometry_of(a: np.ndarray, base: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(shape, strides, offset) of numpy view `a` of `base` (1-D), in elements."""
    size = base.itemsize
    offset = (a.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // size
    return a.shape, tuple(s // size for s in a.strides), offset


def elements(base: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> np.ndarray:
    if math.prod(shape) == 0:
        return np.zeros(shape, base.dtype)
    return as_strided(base[offset:], shape, tuple(s * base.itemsize for s in strides), writeable=False)


def random_key(rng: np.random.Generator, ndim: int) -> Any:
    items: list[Any] = []
    for _ in range(int(rng.integers(0, ndim + 2))):
        r = rng.random()
        if r < 0.35:
            items.append(int(rng.integers(-4, 4)) if rng.random() < 0.7 else np.int64(rng.integers(-3, 3)))
        elif r < 0.75:
            parts = [None if rng.random() < 0.3 else int(rng.integers(-6, 7)) for _ in range(2)]
            step = None if rng.random() < 0.4 else int(rng.integers(1, 4))
            items.append(slice(parts[0], parts[1], step))
        elif r < 0.9:
            items.append(None)
        elif Ellipsis not in items:
            items.append(Ellipsis)
    return items[0] if len(items) == 1 and rng.random() < 0.5 else tuple(items)


def daemon_takes(shape: tuple[int, ...], strides: tuple[int, ...], offset: int, base_elements: int) -> None:
    view = proto.TensorView(1, offset, shape, strides)
    assert check_view(tuple(view), proto.DEFAULT_LIMITS) == view
    tensor = Tensor(cast(Any, SimpleNamespace(device=0)), "float32", (base_elements,))  # a buffer, as it is described
    view_of(Handle(tensor, True, (base_elements,)), view)  # raises what the daemon would refuse


@pytest.mark.parametrize("seed", range(4))
def test_random_keys_are_numpys_views(seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = np.arange(2 * 3 * 4 * 5, dtype=np.float32)
    tensors = [
        base.reshape(2, 3, 4, 5),
        base.reshape(2, 3, 4, 5).transpose(3, 1, 0, 2),
        base.reshape(6, 20)[1:5, 2::3],
        base.reshape(120)[7:31],
        base.reshape(2, 60)[:, 5],
        base[3:4].reshape(()),
    ]
    checked = 0
    for a in tensors:
        shape, strides, offset = geometry_of(a, base)
        for _ in range(300):
            key = random_key(rng, a.ndim)
            try:
                want = a[key]
            except IndexError:
                with pytest.raises(IndexError):
                    indexed(shape, strides, offset, key)
                continue
            (got_shape, got_strides, got_offset), _ = indexed(shape, strides, offset, key)
            assert got_shape == want.shape, (a.shape, key)
            np.testing.assert_array_equal(elements(base, got_shape, got_strides, got_offset), want, f"key {key}")
            if not isinstance(want, np.ndarray):  # numpy's scalar, a copy: its 0-d view instead
                want = a[(*(key if isinstance(key, tuple) else (key,)), Ellipsis)]
            if want.size:
                _, want_strides, want_offset = geometry_of(want, base)
                assert got_offset == want_offset, key
                assert [s for s, d in zip(got_strides, got_shape, strict=True) if d > 1] == [
                    s for s, d in zip(want_strides, got_shape, strict=True) if d > 1
                ], key
            daemon_takes(got_shape, got_strides, got_offset, base.size)
            checked += 1
    assert checked > 1000


def test_what_a_reshape_could_make_is_told_apart() -> None:
    shape, strides = (1, 4, 6), proto.contiguous_strides((1, 4, 6))
    reshapes: list[Any] = [None, (Ellipsis, None), (slice(None), slice(0, 4)), 0, (-1, ..., slice(-6, None)), (), ...]
    for key in reshapes:
        assert indexed(shape, strides, 0, key)[1], key
    others: list[Any] = [(0, 1), (slice(None), 1), (slice(None), slice(0, 3)), (..., slice(None, None, 2)), (0, -1)]
    for key in others:
        assert not indexed(shape, strides, 0, key)[1], key


def test_empty_views_stay_inside_their_tensor() -> None:
    shape, strides = (3, 0, 4), (4, 4, 1)  # a tensor of no elements: an index may not move its offset
    for key in [(2, slice(None), 3), (Ellipsis, 3), (-1,), (slice(1, None), slice(None), 0)]:
        (got_shape, got_strides, offset), _ = indexed(shape, strides, 0, key)
        assert offset == 0 and got_shape == np.zeros(shape)[key].shape
        daemon_takes(got_shape, got_strides, offset, 0)
    (got_shape, _, offset), _ = indexed((5, 4), (4, 1), 4, (slice(3, 3), 2))
    assert got_shape == (0,) and offset == 4


def test_a_stride_past_the_axis_is_not_kept() -> None:
    """A slice of one element keeps its axis' stride, not stride * step (which the codec bounds)."""
    (shape, strides, offset), _ = indexed((5, 4), (4, 1), 0, (slice(2, None, 10**15), slice(None, None, 3)))
    assert shape == (1, 2) and strides == (4, 3) and offset == 8


def test_what_makes_no_view_is_refused() -> None:
    shape, strides = (3, 4), (4, 1)
    for key in [[0, 1], np.array([0, 1]), range(2), np.array([True, False, True]), True, np.bool_(False), (0, [1])]:
        with pytest.raises(InvalidArgument, match=r"fancy indexing.*gpu\.ops\.embedding\(ids, table\)") as info:
            indexed(shape, strides, 0, key)
        assert info.value.op == "indexing"
    for step in (-1, 0, -3):
        with pytest.raises(InvalidArgument, match=f"step {step}") as info:
            indexed(shape, strides, 0, slice(None, None, step))
        assert info.value.op == "indexing"
    assert indexed(shape, strides, 0, np.array(2))[0] == ((4,), (1,), 8)  # a 0-d integer array is an integer
    wrong: list[Any] = [1.0, "0", np.float32(1), (..., ...), (0, 0, 0), 3, (0, -5)]
    for key in wrong:
        with pytest.raises(IndexError):
            np.zeros(shape)[key]
        with pytest.raises(IndexError):
            indexed(shape, strides, 0, key)

"""concatenate and stack as numpy's (gpud_client.ops.joining): every dtype (1- and 2-byte elements
whose ranges fall inside 4-byte words joined through a wider dtype, exactly), any axis, empty pieces,
out=, views as pieces; refused naming the op: no tensor, dtypes or shapes that differ, a recording."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument

DTYPES = ["float32", "float16", "bfloat16", "int8", "uint16", "int64", "bool"]
CASES = [
    (0, [(2, 3, 5), (1, 3, 5), (4, 3, 5)]),
    (1, [(2, 1, 5), (2, 3, 5)]),
    (-1, [(2, 3, 1), (2, 3, 3), (2, 3, 2)]),
    (2, [(2, 3, 0), (2, 3, 4)]),
]


def draw(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype == "bfloat16":
        return rng.integers(-8, 8, shape).astype(np.float32)  # exact in bfloat16
    return (rng.standard_normal(shape) * 3).astype(dtype)


def upload(gpu: gpud_client.Client, a: np.ndarray, dtype: str) -> Any:
    return gpu.tensor(a, dtype="bfloat16") if dtype == "bfloat16" else gpu.tensor(a)


@pytest.mark.parametrize("dtype", DTYPES)
async def test_concatenate_and_stack_are_numpys(gpu: gpud_client.Client, dtype: str) -> None:
    rng = np.random.default_rng()
    for axis, shapes in CASES:
        arrays = [draw(rng, s, dtype) for s in shapes]
        got = await gpu.ops.concatenate([upload(gpu, a, dtype) for a in arrays], axis=axis).numpy()
        np.testing.assert_array_equal(got, np.concatenate(arrays, axis=axis), f"axis {axis}")
    same = [draw(rng, (2, 3), dtype) for _ in range(3)]
    for axis in (0, 1, 2, -1):
        got = await gpu.ops.stack([upload(gpu, a, dtype) for a in same], axis=axis).numpy()
        np.testing.assert_array_equal(got, np.stack(same, axis=axis), f"stack axis {axis}")


async def test_views_and_out(gpu: gpud_client.Client) -> None:
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = gpu.tensor(a)
    out = gpu.tensor(np.full((4, 9), np.nan, np.float32))
    assert gpu.ops.concatenate([t.transpose(0, 1).transpose(0, 1), t.narrow(1, 1, 3)], axis=1, out=out) is out
    np.testing.assert_array_equal(await out.numpy(), np.concatenate([a, a[:, 1:4]], axis=1))


async def test_what_does_not_join_is_refused_naming_the_op(gpu: gpud_client.Client) -> None:
    x = gpu.empty((2, 3))
    g = gpu.graph("join")
    v = g.input("v", (2, 3), "float32")
    cases: list[tuple[Any, str, str]] = [
        (lambda: gpu.ops.concatenate([]), "concatenate", "needs at least one tensor"),
        (lambda: gpu.ops.concatenate([x, gpu.empty((2, 4))]), "concatenate", r"\[2, 4\] differ outside axis 0"),
        (lambda: gpu.ops.concatenate([x, gpu.empty((2, 3), "float16")]), "concatenate", "float32 and float16"),
        (lambda: gpu.ops.concatenate([x, np.ones((2, 3))]), "concatenate", "a numpy array"),
        (lambda: gpu.ops.concatenate([x, x], axis=2), "concatenate", "out of range"),
        (lambda: gpu.ops.concatenate([x, x], out=gpu.empty((4, 4))), "concatenate", r"the result float32 \[4, 3\]"),
        (lambda: gpu.ops.concatenate([v, v], graph=g), "concatenate", "not recorded into graphs"),
        (lambda: gpu.ops.stack([x, gpu.empty((3, 2))]), "stack", "shapes differ"),
    ]
    for call, op, message in cases:
        with pytest.raises(InvalidArgument, match=message) as info:
            call()
        assert info.value.op == op


async def test_split_is_numpys_as_views(gpu: gpud_client.Client) -> None:
    a = np.arange(6 * 4 * 9, dtype=np.float32).reshape(6, 4, 9)
    t = gpu.tensor(a)
    await gpu.sync()
    cases: list[tuple[Any, int]] = [
        (3, 0),
        (2, 1),
        (3, -1),
        (1, 2),
        ([2, 5], 0),
        ([1, 1, 3], 1),
        ([-3, 10], 2),
        ([4, 2], 0),
        (np.array([2, 7]), -1),
        ([], 0),
        (np.int64(3), -1),
    ]
    for sections, axis in cases:
        seq = gpu._last_seq
        parts = gpu.ops.split(t, sections, axis=axis)
        assert gpu._last_seq == seq and all(p.base is t for p in parts)  # views: no message
        want = np.split(a, sections, axis=axis)
        assert len(parts) == len(want), (sections, axis)
        for got, w in zip(parts, want, strict=True):
            np.testing.assert_array_equal(await got.numpy(), w, f"split {sections} axis {axis}")
    # picoGPT's q, k, v = np.split(x, 3, axis=-1) of a strided view, then an op that reads strides
    _q, k, _v = gpu.ops.split(t.transpose(0, 1), 3, axis=-1)
    np.testing.assert_array_equal(await gpu.ops.contiguous(k).numpy(), np.split(a.transpose(1, 0, 2), 3, -1)[1])
    refused: list[tuple[Any, str]] = [(4, "does not split into 4 equal parts"), (0, "at least 1"), (2.5, "integer")]
    for sections, message in refused:
        with pytest.raises(InvalidArgument, match=message) as info:
            gpu.ops.split(t, sections)
        assert info.value.op == "split"
    with pytest.raises(InvalidArgument, match="out of range") as info:
        gpu.ops.split(t, 2, axis=3)
    assert info.value.op == "split"
    with pytest.raises(InvalidArgument, match="numpy array") as info:
        gpu.ops.split(a, 2)
    assert info.value.op == "split"
    g = gpu.graph("split")
    with pytest.raises(InvalidArgument, match="reshapes only") as info:
        gpu.ops.split(g.input("x", (6, 4), "float32"), 2)
    assert info.value.op == "split"


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
async def test_hstack_and_vstack_are_numpys(gpu: gpud_client.Client, dtype: str) -> None:
    rng = np.random.default_rng()
    groups: list[list[tuple[int, ...]]] = [
        [(3,), (5,), (1,)],
        [(2, 3), (2, 1), (2, 4)],
        [(2, 3, 4), (2, 1, 4)],
        [(), ()],
    ]
    for shapes in groups:
        arrays = [draw(rng, s, dtype) for s in shapes]
        got = await gpu.ops.hstack([upload(gpu, x, dtype) for x in arrays]).numpy()
        np.testing.assert_array_equal(got, np.hstack(arrays), f"hstack {shapes}")
    rows: list[list[tuple[int, ...]]] = [[(3,), (3,), (3,)], [(2, 3), (1, 3), (3,)], [(1, 2, 3), (2, 2, 3)], [(), ()]]
    for shapes in rows:
        arrays = [draw(rng, s, dtype) for s in shapes]
        got = await gpu.ops.vstack([upload(gpu, x, dtype) for x in arrays]).numpy()
        np.testing.assert_array_equal(got, np.vstack(arrays), f"vstack {shapes}")
    # picoGPT's np.hstack(heads) of (T, D/H) heads: views of one tensor as pieces
    heads = draw(rng, (4, 5, 8), dtype)
    t = upload(gpu, heads, dtype)
    got = await gpu.ops.hstack([t[h] for h in range(4)]).numpy()
    np.testing.assert_array_equal(got, np.hstack(list(heads)))


async def test_hstack_and_vstack_refusals_name_them(gpu: gpud_client.Client) -> None:
    x = gpu.empty((2, 3))
    for op in ("hstack", "vstack"):
        call = getattr(gpu.ops, op)
        for pieces, message in [([], "at least one tensor"), ([x, gpu.empty((2, 3), "float16")], "cast them")]:
            with pytest.raises(InvalidArgument, match=message) as info:
                call(pieces)
            assert info.value.op == op
    with pytest.raises(InvalidArgument, match="differ outside axis 1") as info:
        gpu.ops.hstack([x, gpu.empty((3, 3))])
    assert info.value.op == "hstack"
    with pytest.raises(InvalidArgument, match="differ outside axis 0") as info:
        gpu.ops.vstack([x, gpu.empty(4)])
    assert info.value.op == "vstack"
    with pytest.raises(InvalidArgument, match="numpy array") as info:
        gpu.ops.vstack([x, np.ones((1, 3))])
    assert info.value.op == "vstack"

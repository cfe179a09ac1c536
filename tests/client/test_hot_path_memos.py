"""The memos and fast constructors of the eager hot path (issue #17): an op output and a view made without
`Tensor.__init__` are `Tensor(...)` slot for slot; what is kept (an output's kind, a view's packed
reference, whether a view is its base transposed, `contiguous` of a tensor every kernel takes) is kept by
everything it depends on, so another dtype, shape, stride, offset or base is never answered from an
earlier call; each memo is bounded."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import client_base, geometries, tensor
from gpud_client.memo import Memo
from gpud_client.ops import layout, matmul
from gpud_client.pool import Origin
from gpud_client.tensor import Tensor
from gpud_client.values import TENSOR
from gpud_protocol.wire import pack

SLOTS = [s for s in Tensor.__slots__ if s != "__weakref__"]


def slots(t: Tensor) -> dict[str, Any]:
    return {s: getattr(t, s) for s in SLOTS}


async def test_outputs_and_views_are_tensors_slot_for_slot(gpu: gpud_client.Client) -> None:
    async with gpu.scope() as scope:
        made = gpu.ops.add(gpu.tensor(np.ones((4, 6), np.float16)), 1.0)  # an op output (`ClientBase._output`)
        assert made._origin is not None and made._origin.wire == (TENSOR, made.handle)
        twin = Tensor(gpu, made.handle, made.dtype, made.shape, made.device, dtype_name="float16", origin=made._origin)
        assert slots(made) == slots(twin)
        twin.freed = True  # not the scope's to free: it names made's handle
        assert made._packed == pack((TENSOR, made.handle)) and made._wire == (TENSOR, made.handle)
        for view in (made.T, made.reshape(2, 12), made[1:3], made.reshape(2, 12).T[::2]):  # `Tensor._view`
            base = view.base
            fields = (base.handle, view.dtype, view.shape, view.device, view.mode, base, view.offset, view.strides)
            assert slots(view) == slots(Tensor(gpu, *fields, view.dtype_name))
            assert view._packed == pack(view._wire) and view in scope._made.values()
        plain = Tensor(
            gpu, made.handle, made.dtype, made.shape, made.device, origin=Origin((0, "float16", (4, 6)), 1, 48)
        )
        assert plain._wire == (TENSOR, made.handle) and plain._packed == pack(plain._wire)  # an origin without them
        plain.freed = True  # not the scope's to free: it names made's handle


async def test_a_pooled_handle_keeps_its_packed_reference(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.arange(8, dtype=np.float32))
    async with gpu.scope():
        first = gpu.ops.add(x, x)
        handle, origin = first.handle, first._origin
    async with gpu.scope():
        again = gpu.ops.add(x, x)  # the pooled handle
        assert again.handle == handle and again._origin is origin
        assert again._packed == pack((TENSOR, handle)) and again._wire == (TENSOR, handle)
        np.testing.assert_array_equal(await again.numpy(), 2 * np.arange(8, dtype=np.float32))
    x.free()


async def test_q_at_k_t_reads_k_in_place_only_where_k_t_is_k_transposed(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng(0)
    q, k, tall = (rng.standard_normal(s).astype(np.float32) for s in ((5, 3), (4, 3), (6, 3)))
    tq, tk, ttall = gpu.tensor(q), gpu.tensor(k), gpu.tensor(tall)
    async with gpu.scope():
        assert matmul._swapped_back(tk.T) is tk
        narrowed = ttall[:4].T  # k.T's shape, strides and offset, of another base: not that base transposed
        assert (narrowed.shape, narrowed.strides, narrowed.offset) == (tk.T.shape, tk.T.strides, tk.T.offset)
        assert matmul._swapped_back(narrowed) is not ttall
        for got, want in ((tq @ tk.T, q @ k.T), (tq @ narrowed, q @ tall[:4].T), (tq @ tk.T, q @ k.T)):
            np.testing.assert_allclose(await got.numpy(), want, rtol=1e-5, atol=1e-6)
        half = gpu.tensor(k.astype(np.float16))  # the same geometry, another dtype: another plan
        np.testing.assert_allclose(await (gpu.tensor(q.astype(np.float16)) @ half.T).numpy(), q @ k.T, atol=0.05)
    for t in (tq, tk, ttall, half):
        t.free()


async def test_contiguous_returns_a_tensor_itself_only_where_every_kernel_takes_it(gpu: gpud_client.Client) -> None:
    data = np.arange(2 * 64 + 1, dtype=np.float32)
    t = gpu.tensor(data)
    async with gpu.scope():
        aligned, unaligned = t[:64], t[1:65]  # the same shape and strides, at another offset
        assert gpu.ops.contiguous(aligned) is aligned and gpu.ops.contiguous(aligned) is aligned
        copied = gpu.ops.contiguous(unaligned)
        assert copied is not unaligned and copied.base is copied
        np.testing.assert_array_equal(await copied.numpy(), data[1:65])
        assert gpu.ops.contiguous(aligned, out=gpu.empty(64)) is not aligned  # out= given: always copied
        assert ("contiguous", aligned.info, None) in gpu.ops._plans
        assert gpu.ops._plans[("contiguous", aligned.info, None)] is layout.AS_IT_IS
    t.free()


async def test_numbers_as_operands_take_the_fast_path_and_its_refusals(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.arange(4, dtype=np.float16))
    async with gpu.scope():
        for got, want in ((x * 0.5, np.arange(4) * 0.5), (2 - x, 2 - np.arange(4)), (x + 3, np.arange(4) + 3.0)):
            assert got.dtype_name == "float16"
            np.testing.assert_array_equal(await got.numpy(), want.astype(np.float16))
        kept = gpu.ops._constants.of(0.5, x)
        kept.free()  # a freed number is made again, never dispatched freed
        np.testing.assert_array_equal(await (x * 0.5).numpy(), (np.arange(4) * 0.5).astype(np.float16))
        with pytest.raises(gpud_client.InvalidArgument, match="integer of") as huge:
            gpu.ops.mul(x, 10**400)
        assert huge.value.op == "mul"
    x.free()


async def test_the_hot_paths_memos_are_bounded_and_right_past_their_bound(
    gpu: gpud_client.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    memos = (client_base._outputs, geometries.kept_views, geometries.kept_transposes, geometries.kept_geometries)
    for memo in (*memos, matmul._swaps):
        assert isinstance(memo, Memo) and memo.capacity <= 8192
    small: dict[str, Memo[Any, Any]] = {"outputs": Memo(4), "views": Memo(4), "transposes": Memo(4), "swaps": Memo(4)}
    monkeypatch.setattr(client_base, "_outputs", small["outputs"])
    monkeypatch.setattr(tensor, "kept_views", small["views"])  # as gpud_client.tensor took it from geometries
    monkeypatch.setattr(tensor, "kept_transposes", small["transposes"])
    monkeypatch.setattr(matmul, "_swaps", small["swaps"])
    rng = np.random.default_rng(1)
    async with gpu.scope():
        for n in range(2, 12):  # ten shapes: at most 4 of each kept, every answer its own shape's
            q, k = rng.standard_normal((n, 3)).astype(np.float32), rng.standard_normal((n + 1, 3)).astype(np.float32)
            tq, tk = gpu.tensor(q), gpu.tensor(k)
            assert matmul._swapped_back(tk.T) is tk
            got = tq @ tk.T
            assert got.shape == (n, n + 1) and got.info.shape == (n, n + 1)
            np.testing.assert_allclose(await got.numpy(), q @ k.T, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(await tk.T.numpy(), k.T)
            assert all(len(memo) <= 4 for memo in small.values())


def _attention(q: Any, k: Any, v: Any, key_mask: Any) -> Any:
    """numpy's attention of q (B, T, H, D) over k, v (B, S, H, D), keys where key_mask (B, S) is nonzero."""
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(key_mask[:, None, None, :] != 0, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bhts,bshd->bthd", weights / weights.sum(-1, keepdims=True), v)


async def test_split_attention_queues_both_dispatches_from_its_kept_plan(gpu: gpud_client.Client) -> None:
    """A new output takes `_execute`'s way for both dispatches (the scratch kept across calls, not the scope's);
    `out=` the checked one; either way the same numbers, and a failure of either names `attention`."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 3, 2, 8)).astype(np.float32) for _ in range(3))
    key_mask = np.array([[1, 1, 0], [1, 0, 1]], np.int64)
    want = _attention(q, k, v, key_mask)
    tq, tk, tv, tm = (gpu.tensor(a) for a in (q, k, v, key_mask))
    scratches = []
    for _ in range(2):  # planned, then kept
        async with gpu.scope():
            # 16 splits: the split kernels on every backend (no cluster takes 16 blocks: attention_cluster)
            got = gpu.ops.attention(tq, tk, tv, key_mask=tm, splits=16)
            names = list(gpu._connection._op_names.values())[-2:]
            assert names == ["attention", "attention"]
            scratches.append(next(iter(gpu.ops._scratches._items.values())))
            into = gpu.empty((2, 3, 2, 8))
            assert gpu.ops.attention(tq, tk, tv, key_mask=tm, splits=16, out=into) is into
            for result in (got, into):
                np.testing.assert_allclose(await result.numpy(), want, rtol=1e-5, atol=1e-5)
        assert got.freed and not scratches[-1].freed  # the client's scratch outlives the scope
    assert scratches[0] is scratches[1]
    assert sum(type(plan).__name__ == "SplitPlan" for plan in gpu.ops._plans.values()) == 2  # one per out=
    with pytest.raises(gpud_client.InvalidArgument, match="attention"):
        gpu.ops.attention(tq, tk, tv, key_mask=tm, splits=16, out=gpu.empty((2, 3, 2, 4)))
    for t in (tq, tk, tv, tm):
        t.free()


async def test_full_attention_keeps_its_kernels_per_signature_and_checks_its_tensors_every_call(
    gpu: gpud_client.Client,
) -> None:
    """`attention` keeps what it decided per signature (a one-pass kernel's plan, or the split kernels'); a call
    like an earlier one, or like the last, takes it: the same numbers, and a freed operand still refused."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 3, 2, 8)).astype(np.float32) for _ in range(3))
    key_mask = np.array([[1, 1, 0], [1, 0, 1]], np.int64)
    want = _attention(q, k, v, key_mask)
    tq, tk, tv, tm = (gpu.tensor(a) for a in (q, k, v, key_mask))
    other = gpu.tensor(np.zeros((2, 5, 2, 8), np.float32))  # another signature between the calls
    async with gpu.scope():
        for splits in (None, 2, None, 2, 2):
            got = gpu.ops.attention(tq, tk, tv, key_mask=tm, splits=splits)
            gpu.ops.attention(other, other, other, splits=splits)
            np.testing.assert_allclose(await got.numpy(), want, rtol=1e-5, atol=1e-5)
    kinds = {key[-1]: type(plan).__name__ for key, plan in gpu.ops._plans.items() if key[:2] == ("attention", tq.info)}
    assert kinds[2] == "SplitPlan"  # splits given: the split kernels everywhere
    assert kinds[None] == ("OnePassPlan" if gpu.backend == "webgpu" else "SplitPlan")  # (CUDA's flash: not float32)
    freed = gpu.tensor(k)
    freed.free()
    for splits in (None, 2):
        with pytest.raises(gpud_client.InvalidArgument, match="freed"):
            gpu.ops.attention(tq, freed, tv, key_mask=tm, splits=splits)
    for t in (tq, tk, tv, tm, other):
        t.free()

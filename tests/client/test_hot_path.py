"""The client's eager hot path (issue #17): an op-library call like an earlier one is checked once (its
plan kept by its operands' infos), dtype names are read from the tensor, ops are packed byte for byte as
the generic encoder packs them, and an eager forward sends one message and waits for one reply. What
depends on the tensors themselves (freed, read-only, an output that is also an input) is still checked
at every call. No timing is asserted (benchmarks/client_ops.py measures it)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest

import gpud_client
import gpud_protocol as proto
from gpud.testing.bert import CONFIGS, Encoder, random_weights
from gpud_client import dtypes, packing
from gpud_client.memo import Memo
from gpud_client.ops import base
from gpud_protocol.ops import KERNELS, KernelSpec, grid_1d
from gpud_protocol.ops.dtypes import DTYPES, threads
from gpud_protocol.ops.elementwise import UNARY_OPS
from gpud_protocol.wire import pack


def queued_ops(gpu: gpud_client.Client) -> bytes:
    return bytes(gpu._connection.queue._packed)


async def test_a_repeated_call_is_checked_once(gpu: gpud_client.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    verified: list[str] = []
    verify = KernelSpec.verify

    def counted(spec: KernelSpec, *args: Any) -> None:
        verified.append(spec.name)
        verify(spec, *args)

    monkeypatch.setattr(KernelSpec, "verify", counted)
    x = gpu.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    w = gpu.tensor(np.ones((5, 4), np.float32))
    async with gpu.scope():
        g = gpu.ops.sum(w, axis=1)
        for _ in range(5):
            y = gpu.ops.add(x, x)
            h = gpu.ops.matmul(y, w, transpose_w=True)
            gpu.ops.gelu(gpu.ops.layernorm(h, g, g))
        assert len(verified) == len(set(verified)) == 5  # each kernel's rule ran once
        want = 2 * np.arange(12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_array_equal(await y.numpy(), want)
        np.testing.assert_allclose(await h.numpy(), want @ np.ones((4, 5), np.float32), rtol=1e-5)
    x.free()
    w.free()


async def test_dtype_names_come_from_the_tensor(gpu: gpud_client.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    x = gpu.tensor(np.ones(8, np.float16))
    assert x.dtype_name == "float16" and x.reshape(2, 4).dtype_name == "float16"
    async with gpu.scope():
        gpu.ops.add(x, x)  # planned
        gpu.ops.exp(x)
        names: list[Any] = []

        def name_of(dtype: Any) -> str:
            names.append(dtype)
            return "float16"

        monkeypatch.setattr(dtypes, "name_of", name_of)
        for _ in range(3):
            gpu.ops.add(x, x)
            gpu.ops.exp(x)
        assert names == []
        np.testing.assert_array_equal(await gpu.ops.add(x, x).numpy(), np.full(8, 2, np.float16))
    x.free()


async def test_ops_are_packed_as_the_generic_encoder_packs_them(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.ones((2, 8), np.float32))
    view = x.reshape(16)
    warm = gpu.ops.scale(view, 1.0)  # registers the kernel (a request of its own, between alloc and dispatch)
    assert not warm.freed  # kept: freed, its memory would serve the next output (no alloc to compare)
    for i in range(2):  # planned (a new output), then kept (the output freed before serves: no alloc)
        before = len(queued_ops(gpu))
        y = gpu.ops.scale(view, -0.0)  # a view and a negative zero among the arguments
        packed = queued_ops(gpu)[before:]
        alloc = proto.encode_op(proto.Alloc(gpu._last_seq - 1, y.handle, "float32", (16,), y.device))
        values: list[Any] = [16, UNARY_OPS["scale"], -0.0, 0.0, DTYPES["float32"].code, DTYPES["float32"].code]
        name, grid = "ew_unary", grid_1d(threads(16, "float32"))
        if gpu.backend == "webgpu":  # four floats a thread (gpud_protocol.ops.elementwise4)
            name, grid = "ew_unary4", grid_1d(16 // 4)
        if gpu.backend == "cuda":  # 16 bytes a thread (gpud_protocol.ops.elementwise16)
            name, grid = "ew_unary16", grid_1d(16 * 4 // 16)
        kinds = [kind for _name, kind in KERNELS[name].scalars]
        scalars = tuple(tuple(base.scalar_of(kind, v)) for kind, v in zip(kinds, values, strict=True))
        kernel = gpu.ops._kernels[name].handle
        dispatch = proto.DispatchEncoder().encode(gpu._last_seq, kernel, grid, (view._wire, y._wire, *scalars), None)
        assert packed == (alloc if i == 0 else b"") + dispatch
        y.free()
    assert packing.free(7, 9) == proto.encode_op(proto.Free(7, 9))
    for n in (0, 15, 16, 65535, 65536):
        assert packing.array_header(n) + pack(None) * n == pack([None] * n)
    x.free()


async def test_a_kept_plan_still_checks_the_tensors_of_each_call(gpu: gpud_client.Client) -> None:
    x, y, z = (gpu.tensor(np.full(4, v, np.float32)) for v in (1, 2, 0))
    gpu.ops.add(x, y, out=z)  # kept for (float32[4], float32[4], out float32[4])
    with pytest.raises(gpud_client.InvalidArgument, match="out is also an input") as inplace:
        gpu.ops.add(z, y, out=z)  # the same infos
    assert inplace.value.op == "add"
    z.mode = "ro"
    with pytest.raises(gpud_client.PermissionDenied, match="read-only") as readonly:
        gpu.ops.add(x, y, out=z)
    assert readonly.value.op == "add" and readonly.value.seq is None
    z.mode = "rw"
    np.testing.assert_array_equal(await z.numpy(), np.full(4, 3, np.float32))
    y.free()
    with pytest.raises(gpud_client.InvalidArgument, match="freed"):
        gpu.ops.add(x, y, out=z)
    x.free()
    z.free()


async def test_negative_zero_is_not_zero_to_the_kept_plans(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.ones(4, np.float32))
    async with gpu.scope():
        positive, negative = gpu.ops.scale(x, 0.0), gpu.ops.scale(x, -0.0)
        assert not np.signbit(await positive.numpy()).any()
        assert np.signbit(await negative.numpy()).all()
    x.free()


async def test_an_eager_forward_is_one_message_and_one_round_trip(
    gpu: gpud_client.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = CONFIGS["tiny"]
    weights = {name: gpu.tensor(a) for name, a in random_weights(config, 1).items()}
    encoder = Encoder(gpu, config, weights)
    ids, mask = np.array([[5, 6, 7, 0], [8, 9, 0, 0]]), np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    first = await encoder.embed(ids, mask)  # registers the kernels (requests nobody waits for)
    await gpu.sync()
    handles = (await gpu.stats())["session"]["handles"]
    connection = gpu._connection
    sent: list[int] = []
    waited: list[int] = []
    send, request = connection._sock.send_multipart, connection.request

    def counted_send(frames: list[Any], *args: Any, **kwargs: Any) -> Any:
        sent.append(len(frames))
        return send(frames, *args, **kwargs)

    async def counted_request(seq: int) -> Any:
        waited.append(seq)
        return await request(seq)

    monkeypatch.setattr(connection._sock, "send_multipart", counted_send)
    monkeypatch.setattr(connection, "request", counted_request)
    for _ in range(2):
        np.testing.assert_array_equal(await encoder.embed(ids, mask), first)
    assert len(sent) == 2 and len(waited) == 2  # per forward: one message, one reply awaited (the readback)
    monkeypatch.undo()
    await gpu.sync()
    assert (await gpu.stats())["session"]["handles"] == handles  # the scope freed every intermediate
    encoder.free()
    for tensor in weights.values():
        tensor.free()


def test_the_memo_drops_its_oldest_entry_one_at_a_time() -> None:
    memo: Memo[int, str] = Memo(3)
    for key in range(5):
        assert memo.keep(key, str(key)) == str(key)
    assert list(memo) == [2, 3, 4]
    memo.keep(3, "again")  # a key it holds: nothing dropped
    assert dict(memo) == {2: "2", 3: "again", 4: "4"}
    with pytest.raises(ValueError):
        Memo(0)


def test_keys_tell_negative_zero_apart_and_take_anything() -> None:
    assert base.exact([0, 1.5, 0.0, -0.0, np.float32(-0.0)]) == (0, 1.5, (0.0, 1.0), (-0.0, -1.0), (0.0, -1.0))
    assert base.exact([0.0]) != base.exact([-0.0]) and base.signed(-0.0) != base.signed(0.0)
    array = np.zeros(3)
    assert base.signed(array) is array and base.signed("x") == "x"  # refused later, by the op's own check
    assert base.signed(None) is None and base.exact([None, 0.0]) == (None, (0.0, 1.0))  # a default: no exception


def test_graph_runs_are_packed_as_the_generic_encoder_packs_them() -> None:
    view = proto.TensorView(7, 12, (2, 6), (6, 1))
    for op in (
        proto.Replay(5, 3, 0, ((16, 16), (16, 16), (16,)), (), ()),
        proto.Replay(2**40, 3, -1, (), (1.5, -2, 7), (9, view)),
        proto.Launch(6, 4, 2, ((3,),), (0.0,), (view,)),
        proto.ReplaySteps(8, 4, 1, ((1, 4),), (-0.0, 3), (11,), 16),
        proto.ReplaySteps(9, 4, -1, ((1, 4),), (), (), 2, chain=True),
    ):
        assert packing.graph_run(op) == proto.encode_op(op)


async def test_a_dropped_tensor_goes_at_once(gpu: gpud_client.Client) -> None:
    """No tensor refers to itself: one dropped is gone then, not at the garbage collector's next pass
    (which every eager step's tensors would otherwise wait for, and pay)."""
    t = gpu.empty(4)
    view = t.reshape(2, 2)
    assert view.base is t and t.base is t and not view.freed
    refs = [weakref.ref(t), weakref.ref(view)]
    t.free()
    assert view.freed
    gc.disable()
    try:
        del t, view
        assert [r() for r in refs] == [None, None]
    finally:
        gc.enable()


async def test_uploads_past_the_frame_limit_go_in_several_messages(gpu: gpud_client.Client) -> None:
    count = gpu.limits.max_frames + 10  # one frame each: the queue sends a batch at the limit
    await gpu.sync()
    batches = gpu._connection.queue.number
    async with gpu.scope():
        tensors = [gpu.tensor(np.full(2, i, np.float32)) for i in range(count)]
        assert gpu._connection.queue.number == batches + 1  # the first batch went when its frames were full
        assert [float((await t.numpy())[0]) for t in (tensors[0], tensors[-2], tensors[-1])] == [
            0,
            count - 2,
            count - 1,
        ]

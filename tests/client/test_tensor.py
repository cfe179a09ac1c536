"""Tensors as the client sees them: zero-filled on every backend, never silently turned into numpy."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import gpud_client
from gpud_protocol import ArgKind


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


async def test_a_reshape_is_a_view_of_the_same_memory(gpu: gpud_client.Client) -> None:
    data = np.arange(12, dtype=np.float32)
    t = gpu.tensor(data.reshape(3, 4))
    v = t.reshape(2, -1)
    assert v.shape == (2, 6) and t.reshape((12,)).shape == (12,)
    np.testing.assert_array_equal(await v.numpy(), data.reshape(2, 6))
    with pytest.raises(gpud_client.InvalidArgument, match="in place"):
        gpu.ops.scale(v, 2.0, out=t)
    gpu.ops.scale(gpu.tensor(data.reshape(2, 6)), 2.0, out=v)  # written through the view, seen through the tensor
    np.testing.assert_array_equal(await t.numpy(), 2 * data.reshape(3, 4))
    other = gpu.empty((2, 6))
    gpu.copy(v, other)  # shapes are the views'
    np.testing.assert_array_equal(await other.numpy(), 2 * data.reshape(2, 6))
    t.free()  # a view lives as long as its base
    assert v.freed
    with pytest.raises(gpud_client.InvalidArgument, match="freed"):
        await v.numpy()
    with pytest.raises(gpud_client.InvalidArgument, match="freed"):
        v.reshape(12)


async def test_views_of_views_uploads_copies_and_the_free_of_a_view(gpu: gpud_client.Client) -> None:
    data = np.arange(24, dtype=np.float32)
    t = gpu.empty((4, 6))
    vv = t.reshape(2, 12).reshape(3, 2, 4)  # a view of a view: of t's memory
    assert vv.base is t and vv.handle == t.handle and vv.is_view and not t.is_view
    vv.upload(data.reshape(3, 2, 4))
    np.testing.assert_array_equal(await t.numpy(), data.reshape(4, 6))
    flat = gpu.empty(24)
    gpu.copy(vv, flat.reshape(3, 2, 4))  # both ends views
    np.testing.assert_array_equal(await flat.numpy(), data)
    seq = gpu._last_seq
    vv.free()  # the client's alone: no message, t and its other views stay
    assert gpu._last_seq == seq and vv.freed and not t.freed
    with pytest.raises(gpud_client.InvalidArgument, match="freed"):
        gpu.copy(vv, flat.reshape(3, 2, 4))
    np.testing.assert_array_equal(await t.reshape(24).numpy(), data)
    stats = await gpu.stats()
    assert stats["session"]["handles"] == 2  # t and flat


async def test_a_view_the_daemon_cannot_take_is_refused_against_the_op(gpu: gpud_client.Client) -> None:
    """Views come from the client; the daemon checks them as hostile input against the base's size."""
    import gpud_protocol as proto

    t, src = gpu.empty((3, 4)), gpu.tensor(np.ones(12, np.float32))
    cases = {  # message: (the view, whether a readback of it fails too)
        "reaches past its 12 elements": (proto.TensorView(t.handle, 0, (13,), (1,)), True),
        "reaches past its 12 elements ": (proto.TensorView(t.handle, 2, (2, 3, 2), (6, 1, 3)), True),  # by a stride
        "out is a non-contiguous view": (proto.TensorView(t.handle, 0, (12,), (0,)), False),
        "out is a view starting at byte 16": (proto.TensorView(t.handle, 4, (8,), (1,)), False),
        "unknown tensor handle": (proto.TensorView(999_999, 0, (12,), (1,)), True),
    }
    for message, (forged, unreadable) in cases.items():
        v = t.reshape(12)
        v.ref = forged  # past the client's check
        v._wire = (int(ArgKind.TENSOR), forged)
        gpu.ops.scale(src, 2.0, out=v)
        seq = gpu._last_seq
        with pytest.raises(gpud_client.GpudError, match=message.strip()) as info:
            await gpu.sync()
        assert info.value.seq == seq  # the dispatch of the op
        if unreadable:
            with pytest.raises(gpud_client.GpudError, match=message.strip()):
                await v.numpy()


async def test_reshapes_are_checked_in_the_client_and_in_the_daemon(gpu: gpud_client.Client) -> None:
    import gpud_protocol as proto

    t = gpu.empty((3, 4))
    for bad in [(5,), (-1, -1), (5, -1), (-2, -6)]:
        with pytest.raises(gpud_client.InvalidArgument, match="reshape"):
            t.reshape(bad)
    handle = next(gpu._handles)
    gpu._queue(proto.Reshape(gpu._next_seq(), handle, t.handle, (5,)))  # past the client's check
    with pytest.raises(gpud_client.InvalidArgument, match="element counts") as info:
        await t.numpy()
    assert info.value.op == "reshape"


async def test_a_reshaped_handle_keeps_the_resident_mode_and_is_not_published(gpu: gpud_client.Client) -> None:
    name = f"reshape-ro-{id(gpu)}"
    t = gpu.tensor(np.ones((2, 3), np.float32))
    with pytest.raises(gpud_client.InvalidArgument, match="reshaped"):
        gpu.publish(t.reshape(6), name)
        await t.numpy()
    gpu.publish(t, name, mode="ro")
    await gpu.sync()
    async with gpud_client.connect(gpu.address) as other:
        ro = (await other.open(name)).reshape(6)
        assert ro.mode == "ro"
        with pytest.raises(gpud_client.PermissionDenied):  # from the client's check, else the daemon's
            other.ops.scale(other.empty(6), 3.0, out=ro)
            await ro.numpy()
    gpu.unpublish(name)


async def test_graph_views_reshape_inputs_intermediates_and_bound_tensors(gpu: gpud_client.Client) -> None:
    g = gpu.graph("views")
    x = g.input("x", (12,), "float32")
    cache = g.bind("cache", (3, 4), "float32")
    h = gpu.ops.scale(x.reshape(3, 4), 2.0, graph=g)
    total = gpu.ops.add(h, cache, graph=g)
    g.copy(total, cache.reshape(12).reshape(3, 4))  # a view of a view
    g.output("flat", h.reshape(-1))
    step = await g.build()
    a = np.arange(12, dtype=np.float32)
    mine = gpu.tensor(np.ones((4, 3), np.float32)).reshape(3, 4)  # a session view, bound
    got = await step.replay(x=a, cache=mine)
    assert got["flat"].shape == (12,)
    np.testing.assert_array_equal(got["flat"], 2 * a)
    np.testing.assert_array_equal(await mine.numpy(), 1 + 2 * a.reshape(3, 4))
    g2 = gpu.graph("bad-view")
    y = g2.input("y", (4,), "float32")
    g2._views.append(((int(ArgKind.INPUT), 0), (5,)))  # past the client's check
    g2.output("v", gpud_client.GraphTensor(g2, int(ArgKind.VIEW), 0, y.dtype, (5,)))
    with pytest.raises(gpud_client.InvalidArgument, match="view"):
        await g2.build()


async def test_views_of_one_memory_are_the_same_memory_to_the_ops(gpu: gpud_client.Client) -> None:
    from gpud_client.ops.base import same_memory

    t = gpu.empty((2, 6))
    assert same_memory(t.reshape(12), t.reshape(3, 4)) and not same_memory(t, gpu.empty((2, 6)))
    g = gpu.graph("same-memory")
    temp = g.empty((1, 1, 2, 4))
    assert same_memory(temp.reshape(8).reshape(1, 1, 2, 4), temp)  # a view of a recording's tensor
    assert not same_memory(temp, g.empty((1, 1, 2, 4)))
    with pytest.raises(gpud_client.InvalidArgument, match="in place"):
        gpu.ops.scale(temp, 2.0, out=temp.reshape(8).reshape(1, 1, 2, 4), graph=g)


async def test_reshapes_mint_no_daemon_handles(gpu: gpud_client.Client) -> None:
    """Regression: each reshape minted a daemon handle, never freed: 3,000 reshapes grew the session
    from 2 handles to 3,002 (and every dispatch through a fresh view missed every cache)."""
    data = np.arange(4, dtype=np.float32)
    x, y = gpu.tensor(data), gpu.empty((2, 2))
    gpu.ops.add(x.reshape(4), x.reshape(4), out=y.reshape(4))  # registers the kernel (a handle of its own)
    before = (await gpu.stats())["session"]["handles"]
    minted = next(gpu._handles)
    for _ in range(3000):
        v = x.reshape(2, 2)
        gpu.ops.add(v, v, out=y)
    np.testing.assert_array_equal(await y.numpy(), 2 * data.reshape(2, 2))
    assert (await gpu.stats())["session"]["handles"] == before == 2
    assert next(gpu._handles) == minted + 1


async def test_a_session_view_in_a_recording_is_a_view_of_its_tensor(gpu: gpud_client.Client) -> None:
    data = np.arange(12, dtype=np.float32)
    t = gpu.tensor(data)
    g = gpu.graph("session-view")
    doubled = gpu.ops.scale(t.reshape(3, 4), 2.0, graph=g)  # a fixed tensor of the graph, seen (3, 4)
    g.output("y", gpu.ops.add(doubled, t.reshape(3, 4), graph=g))  # the same view again: one graph view
    assert len(g._views) == 1
    step = await g.build()
    np.testing.assert_array_equal((await step.replay())["y"], 3 * data.reshape(3, 4))
    stats = await gpu.stats()
    assert stats["session"]["handles"] == 1


async def test_transpose_permute_and_narrow_are_views_read_back_as_numpy_sees_them(gpu: gpud_client.Client) -> None:
    """Views made in the client (no message, no handle); a readback sends the bytes the view spans and
    the client picks its elements, whatever the offset (float16 at odd element offsets included)."""
    for dtype in ("float32", "float16", "uint8", "int64"):
        a = np.arange(4 * 5 * 3).astype(dtype).reshape(4, 5, 3)
        t = gpu.tensor(a)
        seq = gpu._last_seq
        views = [
            (t.transpose(0, 2), a.transpose(2, 1, 0)),
            (t.transpose(-1, 1), a.swapaxes(-1, 1)),
            (t.permute(2, 0, 1), a.transpose(2, 0, 1)),
            (t.permute((1, 2, 0)), a.transpose(1, 2, 0)),
            (t.narrow(0, 1, 2), a[1:3]),
            (t.narrow(1, -2, 2), a[:, -2:]),
            (t.narrow(2, 1, 1).narrow(1, 3, 1), a[:, 3:4, 1:2]),
            (t.transpose(0, 1).narrow(0, 1, 3).transpose(1, 2), a.swapaxes(0, 1)[1:4].swapaxes(1, 2)),
            (t.narrow(0, 3, 1).reshape(15), a[3].reshape(15)),
            (t.narrow(1, 0, 0), a[:, :0]),
        ]
        assert gpu._last_seq == seq  # nothing queued
        for view, ref in views:
            assert view.base is t and view.handle == t.handle and view.shape == ref.shape
            assert view.strides == tuple(s // a.itemsize for s in ref.strides) or ref.size == 0
            got = await view.numpy()
            assert got.dtype == ref.dtype
            np.testing.assert_array_equal(got, ref)
    assert (await gpu.stats())["session"]["handles"] == 4


async def test_a_reshape_of_a_non_contiguous_view_takes_contiguous_first(gpu: gpud_client.Client) -> None:
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = gpu.tensor(a)
    tt = t.transpose(0, 1)
    with pytest.raises(gpud_client.InvalidArgument, match=r"^reshape: .*gpu\.ops\.contiguous\(t\) first"):
        tt.reshape(24)
    # where the strides allow it, as torch's view: a split or a merge of dimensions that chain
    np.testing.assert_array_equal(await tt.reshape(3, 2, 4).numpy(), a.T.reshape(3, 2, 4))
    narrow = t.narrow(1, 1, 4)  # rows of 4 out of 6
    np.testing.assert_array_equal(await narrow.reshape(4, 2, 2).numpy(), a[:, 1:5].reshape(4, 2, 2))
    with pytest.raises(gpud_client.InvalidArgument, match="without a copy"):
        narrow.reshape(16)
    np.testing.assert_array_equal(await gpu.ops.contiguous(narrow).reshape(16).numpy(), a[:, 1:5].reshape(16))
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: t.transpose(0, 2), "^transpose: axis 2 is out of range"),
        (lambda: t.permute(0, 0), r"^permute: \[0, 0\] is not a permutation"),
        (lambda: t.permute(1), "^permute:"),
        (lambda: t.narrow(0, 2, 3), r"^narrow: \[2, 2 \+ 3\) is not inside dimension 0 of size 4"),
        (lambda: t.narrow(0, -5, 1), "^narrow:"),
        (lambda: t.narrow(2, 0, 1), "^narrow: axis 2"),
    ]
    for bad, message in cases:
        with pytest.raises(gpud_client.InvalidArgument, match=message):
            bad()


async def test_uploads_and_copies_take_contiguous_views(gpu: gpud_client.Client) -> None:
    a = np.zeros((4, 6), np.float16)
    t = gpu.tensor(a)
    rows = np.arange(12, dtype=np.float16).reshape(2, 6)
    t.narrow(0, 1, 2).upload(rows)  # bytes [12, 36): whole 4-byte words
    a[1:3] = rows
    np.testing.assert_array_equal(await t.numpy(), a)
    gpu.copy(t.narrow(0, 1, 1), t.narrow(0, 3, 1))  # two parts of one tensor: WebGPU refuses
    with pytest.raises(gpud_client.InvalidArgument, match="same memory"):
        await t.numpy()
    other = gpu.tensor(np.full((2, 6), 9, np.float16))
    gpu.copy(t.narrow(0, 1, 2), other)
    np.testing.assert_array_equal(await other.numpy(), rows)
    gpu.copy(other.narrow(0, 1, 1), t.narrow(0, 0, 1))
    a[0] = rows[1]
    np.testing.assert_array_equal(await t.numpy(), a)
    odd = t.reshape(-1).narrow(0, 3, 2)  # starts 6 bytes in: a word copy would write a neighbour
    calls: list[Callable[[], None]] = [
        lambda: odd.upload(np.ones(2, np.float16)),
        lambda: gpu.copy(other.reshape(-1).narrow(0, 0, 2), odd),
    ]
    for call in calls:
        with pytest.raises(gpud_client.InvalidArgument, match="multiples of 4 bytes"):
            call()
    with pytest.raises(gpud_client.InvalidArgument, match=r"non-contiguous view: call gpu\.ops\.contiguous"):
        t.transpose(0, 1).upload(np.ones((6, 4), np.float16))
    t.reshape(-1).narrow(0, 20, 4).upload(np.full(4, 5, np.float16))  # ends at the tensor's end
    a.reshape(-1)[20:] = 5
    np.testing.assert_array_equal(await t.numpy(), a)


async def test_the_daemon_refuses_uploads_into_views_it_cannot_write_exactly(gpu: gpud_client.Client) -> None:
    import gpud_protocol as proto

    t = gpu.tensor(np.zeros(8, np.float16))
    for forged, message in [
        (proto.TensorView(t.handle, 1, (2,), (1,)), "multiples of 4 bytes"),
        (proto.TensorView(t.handle, 0, (2, 2), (1, 2)), "non-contiguous"),
    ]:
        frame = gpu._connection.queue.add_frame(bytes(8))
        gpu._queue(proto.Upload(gpu._next_seq(), forged, frame or 0, 8))  # past the client's check
        with pytest.raises(gpud_client.InvalidArgument, match=message):
            await t.numpy()
    np.testing.assert_array_equal(await t.numpy(), np.zeros(8, np.float16))


async def test_graphs_take_whole_tensors_and_reshapes_and_refuse_other_views(gpu: gpud_client.Client) -> None:
    """A graph names buffers (its views carry no strides): the client refuses other views clearly, and
    the daemon refuses a bound view that is not its whole tensor."""
    import gpud_protocol as proto

    t = gpu.tensor(np.ones((4, 6), np.float32))
    g = gpu.graph("strided-views")
    x = g.input("x", (4, 6), "float32")
    with pytest.raises(gpud_client.InvalidArgument, match=r"transposed or narrowed view.*gpu\.ops\.contiguous"):
        gpu.ops.add(x, t.narrow(0, 0, 2).reshape(12).narrow(0, 0, 6).reshape(1, 6), graph=g)
    for op, args in (("transpose", (0, 1)), ("permute", (1, 0)), ("narrow", (0, 1, 1))):
        with pytest.raises(gpud_client.InvalidArgument, match=f"^{op}: graph 'strided-views'.*reshapes only"):
            getattr(x, op)(*args)
    cache = g.bind("cache", (2, 6), "float32")
    g.output("y", gpu.ops.add(x, t.reshape(4, 6), graph=g))  # a reshape: its whole tensor
    g.output("c", gpu.ops.scale(cache, 2.0, graph=g))
    step = await g.build()
    ones = np.ones((4, 6), np.float32)
    got = await step.replay(x=ones, cache=gpu.tensor(np.ones(12, np.float32)).reshape(2, 6))
    np.testing.assert_array_equal(got["y"], 2 * ones)
    with pytest.raises(gpud_client.InvalidArgument, match=r"bound tensor 'cache'.*transposed or narrowed"):
        await step.replay(x=ones, cache=t.narrow(0, 2, 2))
    launch = step._op(proto.Launch, gpu._next_seq(), {"x": ones, "cache": gpu.empty((2, 6))})
    forged = proto.TensorView(t.handle, 12, (2, 6), (6, 1))  # past the client's check: the daemon refuses
    gpu._queue(launch._replace(binds=(forged,)))
    with pytest.raises(gpud_client.InvalidArgument, match=r"bound tensor 'cache'.*transposed or narrowed"):
        await gpu.sync()

"""A replay's client side (gpud_client.steps): the input frame packed in one copy at the daemon's aligned
offsets, the message packed without the generic encoder, the outputs unpacked from the reply; what a
replay is given checked as before (unknown, missing, another dtype)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import steps
from gpud_client.dtypes import bfloat16, float32_to_bits
from gpud_client.steps import ALIGN, packed_inputs


def aligned_layout(each: list[list[np.ndarray[Any, Any]]]) -> bytes:
    """The frame as the daemon reads it: each input at the next multiple of ALIGN, steps packed alike."""
    offsets, total = [], 0
    for array in each[0]:
        offsets.append(total)
        total += -(-array.nbytes // ALIGN) * ALIGN
    frame = bytearray(total * len(each))
    for k, arrays in enumerate(each):
        for array, offset in zip(arrays, offsets, strict=True):
            frame[k * total + offset : k * total + offset + array.nbytes] = array.tobytes()
    return bytes(frame)


def test_inputs_are_packed_at_aligned_offsets_in_one_copy() -> None:
    rng = np.random.default_rng(0)
    one: list[np.ndarray[Any, Any]] = [
        rng.integers(0, 1000, (16, 16)).astype(np.int64),  # 2,048 bytes: aligned
        np.ones((3, 5), np.float32),  # 60 bytes: padded
        np.zeros(0, np.int32),  # empty: takes no room
        np.array(7, np.uint8),  # a 0-d array
        rng.standard_normal((2, 3, 4)).astype(np.float16),
    ]
    assert packed_inputs([one]) == aligned_layout([one])
    later = [a.copy() + 1 if a.dtype != np.uint8 else a for a in one]
    assert packed_inputs([one, later, one]) == aligned_layout([one, later, one])
    assert packed_inputs([[np.zeros(ALIGN, np.uint8)]]) == bytes(ALIGN)


def test_outputs_are_unpacked_by_the_replys_layout() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.array([[1, 0, 2]], np.uint8)  # a bool output: any nonzero byte is True
    c = np.array([1.5, -2.0], np.float32)
    layout = [["a", "float32", [3, 4], 0], ["b", "bool", [1, 3], 256], ["c", "bfloat16", [2], 512]]
    step = bytearray(768)
    step[0:48], step[256:259], step[512:516] = a.tobytes(), b.tobytes(), float32_to_bits(c).tobytes()
    for steps_n in (1, 3):
        data = memoryview(bytes(step) * steps_n)
        outs = steps._outputs({"outputs": layout}, data, steps_n)
        assert len(outs) == steps_n
        for out in outs:
            np.testing.assert_array_equal(out["a"], a)
            np.testing.assert_array_equal(out["b"], b != 0)
            np.testing.assert_array_equal(out["c"], c)
            assert out["a"].flags.writeable
            out["a"][0, 0] = 99  # a copy of its own: the reply's buffer is not written
        assert np.frombuffer(data, np.float32, 1)[0] == 0.0
    assembled = np.frombuffer(bytes(step), np.uint8).copy()  # a reply assembled from parts: an array
    np.testing.assert_array_equal(steps._outputs({"outputs": layout}, assembled, 1)[0]["a"], a)
    empty = steps._outputs({"outputs": [["e", "float32", [0, 4], 0]]}, None, 1)[0]["e"]
    assert empty.shape == (0, 4) and empty.dtype == np.float32


def test_host_inputs_are_taken_as_given_or_refused() -> None:
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    assert steps.host_input("g", "ids", "int64", ids) is ids  # no copy of C-ordered data
    fortran = np.asfortranarray(ids)
    assert steps.host_input("g", "ids", "int64", fortran).flags.c_contiguous
    with pytest.raises(gpud_client.InvalidArgument, match="input 'ids' is int64, got int32"):
        steps.host_input("g", "ids", "int64", ids.astype(np.int32))
    bits = steps.host_input("g", "w", "bfloat16", np.array([1.0, -2.5], np.float32))
    np.testing.assert_array_equal(bits, float32_to_bits(np.array([1.0, -2.5], np.float32)))
    with pytest.raises(gpud_client.InvalidArgument, match="input 'w' is bfloat16"):
        steps.host_input("g", "w", bfloat16.name, np.array([1, 2], np.int64))


async def test_a_replay_of_odd_sized_inputs_and_its_refusals(gpu: gpud_client.Client) -> None:
    g = gpu.graph("odd-inputs")
    x = g.input("x", (3, 5), "float32")  # 60 bytes: the next input starts at 256
    y = g.input("y", (15,), "float32")
    g.output("sum", gpu.ops.add(x, y.reshape(3, 5), graph=g))
    g.output("twice", gpu.ops.scale(y, 2.0, graph=g))
    step = await g.build()
    rng = np.random.default_rng(1)
    for _ in range(2):
        xs, ys = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal(15).astype(np.float32)
        got = await step.replay(x=xs, y=ys)
        np.testing.assert_array_equal(got["sum"], xs + ys.reshape(3, 5))
        np.testing.assert_array_equal(got["twice"], 2 * ys)
    with pytest.raises(gpud_client.InvalidArgument, match=r"has no input, scalar or bound tensor \['z'\]"):
        await step.replay(x=xs, y=ys, z=1)
    with pytest.raises(gpud_client.InvalidArgument, match=r"needs \['y'\]"):
        await step.replay(x=xs)
    with pytest.raises(gpud_client.InvalidArgument, match="input 'y' is float32, got float64"):
        await step.replay(x=xs, y=ys.astype(np.float64))
    step.launch(x=xs, y=ys)  # queued like a dispatch: the same message but its kind
    await gpu.sync()
    step.free()

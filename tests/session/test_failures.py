"""Every failed op reaches its client, once, in order, typed and naming the op."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from rawpeer import RawPeer
from support import assert_close, axpb, check_well_behaved, last_seq

import gpud_client
from gpud_client import InvalidArgument, NotFound, u32
from gpud_protocol import ErrorCode, Opcode


async def test_a_second_failure_is_not_dropped(gpu: gpud_client.Client) -> None:
    """Regression: after a failed alloc, a dispatch missing its scalar failed silently and the
    next readback returned stale data with no error."""
    k = await axpb(gpu)
    x, y = gpu.tensor(np.ones(64, np.float32)), gpu.empty(64)
    gpu.empty((-1,))
    alloc_seq = last_seq(gpu)
    gpu.dispatch(k, 1, [x, y, 2.0, 1.0])  # n is missing
    dispatch_seq = last_seq(gpu)
    with pytest.raises(InvalidArgument) as first:
        await y.numpy()
    assert (first.value.op, first.value.seq) == ("alloc", alloc_seq)
    with pytest.raises(InvalidArgument) as second:
        await y.numpy()
    assert (second.value.op, second.value.seq) == ("dispatch", dispatch_seq)
    np.testing.assert_array_equal(await y.numpy(), np.zeros(64, np.float32))
    await check_well_behaved(gpu, k)


async def test_an_out_of_range_scalar_fails_its_op_and_the_batch_goes_on(gpu: gpud_client.Client) -> None:
    """Regression: an f32 of 1e300 gave an unattributed INTERNAL error, the readback was never
    answered and the upload after it was silently skipped."""
    k = await axpb(gpu)
    x, y = gpu.tensor(np.ones(64, np.float32)), gpu.empty(64)
    gpu.dispatch(k, 1, [x, y, 1e300, 1.0, u32(64)])
    bad = last_seq(gpu)
    fresh = np.arange(64, dtype=np.float32)
    x.upload(fresh)
    with pytest.raises(InvalidArgument, match="32-bit float") as info:
        await x.numpy()
    assert (info.value.op, info.value.seq) == ("dispatch", bad)
    np.testing.assert_array_equal(await x.numpy(), fresh)  # the upload ran


async def test_many_failures_are_kept_and_counted(gpu: gpud_client.Client) -> None:
    ghost = gpud_client.Tensor(gpu, 9_000_000, np.dtype("float32"), (4,), 0)
    for _ in range(100):
        ghost.free()  # each a NotFound
        ghost.freed = False
    seen = 0
    text = ""
    while True:
        try:
            await gpu.stats()
            break
        except NotFound as exc:
            seen += 1
            text = str(exc)
    assert seen == 64  # the session's bound: the last one kept counts the rest
    assert "36 later failed ops" in text


async def test_deep_nesting_is_an_invalid_argument_against_the_op(raw: RawPeer, gpu: gpud_client.Client) -> None:
    """Regression: a list nested ~1000 deep gave INTERNAL with a RecursionError."""
    await raw.hello()
    nested: Any = 1
    for _ in range(1000):
        nested = [nested]
    bad, rb = raw.next_seq(), raw.next_seq()
    await raw.batch([[Opcode.ALLOC, 1, 1, "float32", [4], 0], [Opcode.DISPATCH, bad, 1, nested, [], None]])
    await raw.batch([[Opcode.READBACK, rb, 1]])
    code, message, failed_seq, op = await raw.failed(rb)
    assert (code, failed_seq, op) == (ErrorCode.INVALID_ARGUMENT, bad, "dispatch"), message
    await check_well_behaved(gpu)


async def test_registering_one_kernel_again_and_again_costs_nothing(raw: RawPeer, gpu: gpud_client.Client) -> None:
    """Regression: 1,024 registrations of one source ran out of the session's kernel slots."""
    await raw.hello()
    k = await axpb(gpu)
    source, entry = _source_of(gpu)
    seqs = [raw.next_seq() for _ in range(1100)]
    options: dict[str, Any] = {"block": [64, 1, 1]} if gpu.backend == "cuda" else {}
    for start in range(0, len(seqs), 100):
        ops = [[Opcode.KERNEL, s, 10_000 + s, source, entry, options] for s in seqs[start : start + 100]]
        await raw.batch(ops)
    handles = {(await raw.reply(s))[0]["handle"] for s in seqs}
    assert len(handles) == 1
    assert k.handle >= 1


def _source_of(gpu: gpud_client.Client) -> tuple[str, str]:
    from gpud.testing import workloads

    source, _ = workloads.axpb_source(gpu.backend)
    return source, "axpb"


async def test_a_request_that_fails_itself_is_answered_and_not_repeated(gpu: gpud_client.Client) -> None:
    ghost = gpud_client.Tensor(gpu, 9_100_000, np.dtype("float32"), (4,), 0)
    with pytest.raises(NotFound) as info:
        await ghost.numpy()
    assert info.value.op == "readback"
    x = gpu.tensor(np.full(4, 7.0, np.float32))
    assert_close(await x.numpy(), np.full(4, 7.0, np.float32))

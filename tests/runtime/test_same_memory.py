"""The runtime's last line: a copy within one buffer fails that op, never the shared submission.

WebGPU refuses a command buffer holding a copy whose source and destination are one buffer (the
fake device refuses its submission the same way); the session and the graph code check first,
and the runtime refuses what still gets through before it is encoded (issue 14 §2.1).
"""

from __future__ import annotations

import numpy as np
import pytest

from gpud.backends.base import CopyStep
from gpud_protocol.errors import InvalidArgument
from runtime.test_runtime import Owner, drive, make, read


async def test_a_copy_within_one_buffer_fails_alone() -> None:
    rt, lost = make()
    owner, bystander = Owner(), Owner()
    data = np.arange(64, dtype=np.float32).tobytes()
    theirs = rt.alloc(len(data))
    await drive(rt.upload(theirs, memoryview(data), bystander))  # pending, in the same command buffer
    mine = rt.alloc(256)
    with pytest.raises(InvalidArgument, match="same memory"):
        rt.copy(rt.view(mine, 0, 128), rt.view(mine, 128, 128), owner)  # disjoint ranges: still one buffer
    rt.copy(mine, mine, owner)  # onto itself: nothing to do, nothing encoded
    rt.copy(rt.view(mine, 0, 128), rt.view(mine, 0, 128), owner)
    with pytest.raises(InvalidArgument, match="same memory"):
        rt.instantiate([CopyStep(mine, 0, mine, 128, 128)])
    assert await read(rt, theirs, bystander) == data
    assert not owner.lost and not bystander.lost and not lost and rt.ledger.stats()["failed_submissions"] == 0
    await rt.close()

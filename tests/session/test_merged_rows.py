"""The rows of a merged launch (gpud.session.merged_rows): each replay's rows packed at its first row of
every step, the padding rows taking each input's pad; the runs of rows the replays take."""

from __future__ import annotations

import numpy as np

from gpud.session.graphs import Instance, Part
from gpud.session.merged_rows import pack_rows, runs


def instance(rows: int, pad: int = 0) -> Instance:
    """Inputs ids (rows,) int32 and pos (rows,) int32 padded with `pad`, packed one after the other."""
    ids = Part("ids", "int32", (rows,), 0, 4 * rows)
    pos = Part("pos", "int32", (rows,), 4 * rows, 4 * rows)
    pads = [bytes(4), np.int32(pad).tobytes()]
    return Instance(
        (ids.shape, pos.shape),
        [ids, pos],
        8 * rows,
        [],
        [],
        0,
        (),
        frozenset(),
        (),
        [],
        [],
        [],
        [],
        rows=rows,
        pads=pads,
    )


def test_each_replay_at_its_rows_of_every_step_and_padding_elsewhere() -> None:
    four, one, two = instance(4, pad=-1), instance(1), instance(2)
    steps = 3
    mine = np.array([[10, 100], [11, 101], [12, 102]], np.int32)  # (steps, ids + pos) of a 1-row replay
    theirs = np.array([[[20, 21], [200, 201]], [[22, 23], [202, 203]], [[24, 25], [204, 205]]], np.int32)
    packed = pack_rows(four, [(one, memoryview(mine.tobytes()), 2), (two, memoryview(theirs.tobytes()), 0)], steps)
    got = np.frombuffer(packed, np.int32).reshape(steps, 2, 4)
    for k in range(steps):
        np.testing.assert_array_equal(got[k, 0], [*theirs[k, 0], mine[k, 0], 0])  # ids: pad 0
        np.testing.assert_array_equal(got[k, 1], [*theirs[k, 1], mine[k, 1], -1])  # pos: pad -1


def test_a_replay_without_inputs_leaves_its_rows_padded() -> None:
    packed = pack_rows(instance(2, pad=7), [(instance(1), None, 1)], 1)
    np.testing.assert_array_equal(np.frombuffer(packed, np.int32), [0, 0, 7, 7])


def test_runs_join_consecutive_rows_in_order() -> None:
    assert runs([(4, 5), (0, 2), (2, 3), (7, 9)]) == [(0, 3), (4, 5), (7, 9)]
    assert runs([]) == []

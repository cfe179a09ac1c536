"""The rows of a merged launch: its packed inputs, each replay's rows placed from its first row (the
other rows taking each input's pad), step after step for a multi-step launch; and the runs of rows
the replays take."""

from __future__ import annotations

from collections.abc import Sequence

from gpud.session.graphs import Instance


def pack_rows(instance: Instance, places: Sequence[tuple[Instance, memoryview | None, int]], steps: int) -> bytearray:
    """`instance`'s packed inputs for `steps` steps: each (own instance, packed inputs, first row) of
    `places` at its rows of every step (its inputs hold `steps` steps of its own instance's), the rest
    padded."""
    rows, size = instance.rows, instance.input_bytes
    merged = bytearray(steps * size)
    for k in range(steps):
        for whole, pad in zip(instance.inputs, instance.pads, strict=True):
            if any(pad):  # zeros already
                merged[k * size + whole.offset : k * size + whole.offset + whole.nbytes] = pad * rows
    for own_instance, data, at in places:
        if data is None:
            continue
        own_size = own_instance.input_bytes
        for k in range(steps):
            for whole, own in zip(instance.inputs, own_instance.inputs, strict=True):
                row = whole.nbytes // rows
                place, first = k * size + whole.offset + at * row, k * own_size + own.offset
                merged[place : place + own.nbytes] = data[first : first + own.nbytes]
    return merged


def runs(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The rows of `spans` ([first, end) each) as sorted runs of consecutive rows."""
    out: list[tuple[int, int]] = []
    for first, end in sorted(spans):
        if out and out[-1][1] == first:
            out[-1] = (out[-1][0], end)
        else:
            out.append((first, end))
    return out

"""Greedy generation through a `Decoder` or a `shared_decoder.SharedDecoder`, in any of the modes of
`gpud.testing.transformer`: the prompt one token at a time, then the greedy tokens, a window of them
per message in the windowed modes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import numpy as np

from gpud.testing.transformer import WINDOW, WINDOWED, Decoder, Output


class Stepper(Protocol):
    """What `generate` drives: a `Decoder`, or `shared_decoder.SharedDecoder`."""

    async def step(self, ids: np.ndarray[Any, Any], pos: np.ndarray[Any, Any], mode: str) -> Output: ...

    async def steps(self, ids: np.ndarray[Any, Any], pos: np.ndarray[Any, Any], n: int) -> list[Output]: ...


async def generate(
    decoder: Stepper,
    prompt: np.ndarray[Any, Any],
    tokens: int,
    mode: str,
    start: int = 0,
    on_step: Callable[[], None] | None = None,
) -> tuple[np.ndarray[Any, Any], list[np.ndarray[Any, Any]]]:
    """Feed `prompt` (B, P) one token at a time, then `tokens` greedy ones; (B, tokens) ids and the
    logits of every step (when the decoder reads them). `on_step` is called after each step. In
    the windowed modes the greedy tokens come `WINDOW` to a message; in `window` mode a decoder that
    reads no logits launches the prompt's steps without reading them back (they go with the first
    window), and sends each window before the one before it is read (`_pipelined`)."""
    batch, length = prompt.shape
    pos = np.full(batch, start, np.int32)
    ids = prompt[:, 0].astype(np.int32)
    out: list[np.ndarray[Any, Any]] = []
    logits: list[np.ndarray[Any, Any]] = []

    def stepped(got: Output) -> None:
        if on_step is not None:
            on_step()
        if got.logits is not None:
            logits.append(got.logits)

    own = decoder if mode == "window" and isinstance(decoder, Decoder) and tokens > 0 else None  # pipelined
    quiet = own if own is not None and not own.with_logits else None  # its prompt launched, not read
    if quiet is not None and quiet._step is None:
        await quiet._graph()
    for step in range(length - 1):  # the prompt, one token at a time
        if quiet is not None:
            quiet.launch(ids, pos)
            if on_step is not None:
                on_step()
        else:
            stepped(await decoder.step(ids, pos, mode))
        pos = pos + 1
        ids = prompt[:, step + 1].astype(np.int32)
    if own is not None:
        return await _pipelined(own, ids, pos, tokens, stepped, out), logits
    while len(out) < tokens:
        n = min(WINDOW, tokens - len(out)) if mode in WINDOWED else 1
        gots = await decoder.steps(ids, pos, n) if n > 1 else [await decoder.step(ids, pos, mode)]
        for got in gots:
            stepped(got)
            out.append(got.next.astype(np.int32))
        pos = pos + n
        ids = out[-1]
    return np.stack(out, axis=1), logits


async def _pipelined(
    decoder: Decoder,
    ids: np.ndarray[Any, Any],
    pos: np.ndarray[Any, Any],
    tokens: int,
    stepped: Callable[[Output], None],
    out: list[np.ndarray[Any, Any]],
) -> np.ndarray[Any, Any]:
    """`window` mode's tokens: each window sent before the one before it is read, chained on the device."""
    sizes = [min(WINDOW, tokens - start) for start in range(0, tokens, WINDOW)]
    if decoder._step is None:
        await decoder._graph()
    sent: Awaitable[list[Output]] | None = decoder.send_steps(ids, pos, sizes[0])
    for i, n in enumerate(sizes):
        later = decoder.send_steps(None, pos + n, sizes[i + 1]) if i + 1 < len(sizes) else None
        try:
            assert sent is not None
            for got in await sent:
                stepped(got)
                out.append(got.next.astype(np.int32))
        except BaseException:
            if isinstance(later, Coroutine):
                later.close()
            raise
        pos = pos + n
        sent = later
    return np.stack(out, axis=1)

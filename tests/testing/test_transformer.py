"""The decode workload against its numpy float64 reference, in every mode, on every backend:
weights published by one session and opened by another, the step graph published and opened,
KV caches per session. The reference is fed the tokens gpud chose (teacher forcing), so every
step's logits are compared, and every chosen token must be the reference's argmax (or tie with it
within LOGIT_TOL)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid

import numpy as np
import pytest

import gpud_client
from gpud.testing.generation import generate
from gpud.testing.reference import LOGIT_TOL, greedy_mismatch, reference_logits
from gpud.testing.shared_decoder import SharedDecoder
from gpud.testing.transformer import MODES, SHARED, Decoder
from gpud.testing.transformer_weights import CONFIGS, Weights, weights

CONFIG = CONFIGS["tiny"]
SEED = 7
PROMPT = np.array([[3, 141, 59], [26, 5, 35]], np.int32)  # two sequences, decoded together
TOKENS = 16


def check(prompt: np.ndarray, tokens: np.ndarray, logits: list[np.ndarray] | None) -> None:
    params = weights(CONFIG, SEED)
    for row, (fed, chosen) in enumerate(zip(prompt, tokens, strict=True)):
        want = reference_logits(CONFIG, params, fed.tolist(), chosen.tolist())
        assert not greedy_mismatch(chosen.tolist(), want[len(fed) - 1 :]), greedy_mismatch(chosen, want[len(fed) - 1 :])
        if logits is not None:
            assert len(logits) == len(want)
            for step, (got, ref) in enumerate(zip(logits, want, strict=True)):
                error = np.max(np.abs(got[row] - ref)) / np.max(np.abs(ref))
                assert error < LOGIT_TOL, f"sequence {row}, step {step}: logits off by {error:.2g} of the largest"
    assert len({tuple(t) for t in tokens.tolist()}) > 1 or len(set(tokens[0].tolist())) > 1, "a degenerate run"


async def unpublish(gpu: gpud_client.Client, weights: Weights, prefix: str) -> None:
    """The weights `Weights.publish` made under `prefix`: unpublished and freed, and the daemon synced."""
    for name in Weights.names(CONFIG, prefix):
        gpu.unpublish(name)
    for tensor in weights.t.values():
        tensor.free()
    await gpu.sync()


@pytest.mark.parametrize("mode", [mode for mode in MODES if mode not in SHARED])
async def test_decode_matches_the_reference_with_shared_weights(gpu: gpud_client.Client, mode: str) -> None:
    prefix = f"tiny-{uuid.uuid4().hex[:8]}/"
    published = await Weights.publish(gpu, CONFIG, SEED, prefix)
    async with gpud_client.connect(gpu.address) as other:  # decodes with the weights it opened
        shared = await Weights.open(other, CONFIG, prefix)
        decoder = Decoder(other, CONFIG, shared, batch=len(PROMPT), logits=True, graph_name=prefix + "step")
        tokens, logits = await generate(decoder, PROMPT, TOKENS, mode)
        decoder.free()
        if mode in ("graph", "window"):
            other.unpublish_graph(decoder.graph_name)
    check(PROMPT, tokens, logits)
    await unpublish(gpu, published, prefix)


async def test_window_mode_sends_each_window_before_the_last_answered(gpu: gpud_client.Client) -> None:
    """29 tokens in window mode: a window of 16, then one of 13 sent before the first is read, chained
    on the device from its last token; the same bits as stepping the graph a message per token. A
    decoder that reads no logits launches the prompt's steps unread: the same tokens."""
    prefix = f"tiny-{uuid.uuid4().hex[:8]}/"
    published = await Weights.publish(gpu, CONFIG, SEED, prefix)
    runs = {}
    for mode in ("graph", "window"):
        decoder = Decoder(gpu, CONFIG, published, batch=len(PROMPT), logits=True, graph_name=f"{prefix}{mode}")
        runs[mode] = await generate(decoder, PROMPT, CONFIG.max_len - PROMPT.shape[1], mode)
        decoder.free()
        gpu.unpublish_graph(decoder.graph_name)
    (tokens, logits), (window_tokens, window_logits) = runs["graph"], runs["window"]
    np.testing.assert_array_equal(window_tokens, tokens)
    for got, want in zip(window_logits, logits, strict=True):
        np.testing.assert_array_equal(got, want)
    check(PROMPT, window_tokens, window_logits)
    quiet = Decoder(gpu, CONFIG, published, batch=len(PROMPT), graph_name=f"{prefix}quiet")  # reads no logits:
    quiet_tokens, _ = await generate(quiet, PROMPT, CONFIG.max_len - PROMPT.shape[1], "window")  # prompt launched
    np.testing.assert_array_equal(quiet_tokens, tokens)
    quiet.free()
    gpu.unpublish_graph(quiet.graph_name)
    await unpublish(gpu, published, prefix)


async def merged_runs(
    gpu: gpud_client.Client, prefix: str, prompts: np.ndarray, mode: str = "merged"
) -> tuple[list[tuple[np.ndarray, list[np.ndarray]]], dict[str, int]]:
    """A session per prompt row, stepping at once through the shared slot graph (built and published
    by the first, opened by the others) in `mode` (a step or a window of them per message): each one's
    (tokens, logits), and the device's stats."""
    async with contextlib.AsyncExitStack() as stack:
        others = [await stack.enter_async_context(gpud_client.connect(gpu.address)) for _ in prompts]
        decoders = [
            SharedDecoder(other, CONFIG, await Weights.open(other, CONFIG, prefix), logits=True, graph_name=prefix)
            for other in others
        ]
        await decoders[0]._graph()
        runs = await asyncio.gather(
            *(generate(decoder, prompts[i : i + 1], TOKENS, mode) for i, decoder in enumerate(decoders))
        )
        stats = (await gpu.stats())["device"]
        for decoder in decoders:
            decoder.free()
        others[0].unpublish_graph(decoders[0].graph_name)
    return list(runs), stats


@pytest.mark.parametrize("mode", SHARED)
async def test_merged_sessions_each_decode_their_own_sequence_as_the_reference(
    gpu: gpud_client.Client, mode: str
) -> None:
    """`merged` and `merged-window` modes: a session per sequence, one shared step graph with a KV slot
    each, stepping (or a window of steps at a time) at once."""
    prefix = f"tiny-{uuid.uuid4().hex[:8]}/"
    published = await Weights.publish(gpu, CONFIG, SEED, prefix)
    runs, stats = await merged_runs(gpu, prefix, PROMPT, mode)
    tokens = np.concatenate([run[0] for run in runs])
    logits = [np.concatenate(step) for step in zip(*(run[1] for run in runs), strict=True)]
    check(PROMPT, tokens, logits)
    assert stats.get("merged_launches", 0) + stats.get("row_launches", 0) > 0
    await unpublish(gpu, published, prefix)


async def test_merged_rows_get_the_bits_each_sequence_gets_alone(gpu: gpud_client.Client) -> None:
    """Four sessions stepping together through the shared slot graph, a step or a window of steps per
    message: every logit equals, bit for bit, that sequence decoded by a session alone through the same
    graph (its 1-row instance: every op of the step computes a row as it would alone, matmul's groups of
    rows included), and, within matmul's tolerance with the same tokens, that sequence decoded through
    its own step graph (on CUDA a graph of rows takes its float32 rows by 16-bit weights on the tensor
    cores, matvec_tc; elsewhere the same bits)."""
    prompts = np.array([[3, 141, 59], [26, 5, 35], [8, 97, 9], [32, 38, 4]], np.int32)
    prefix = f"tiny-{uuid.uuid4().hex[:8]}/"
    published = await Weights.publish(gpu, CONFIG, SEED, prefix)
    runs, stats = await merged_runs(gpu, prefix, prompts)
    windows, _ = await merged_runs(gpu, prefix, prompts, "merged-window")  # a window's steps: the same bits
    for (tokens, logits), (window_tokens, window_logits) in zip(runs, windows, strict=True):
        np.testing.assert_array_equal(window_tokens, tokens)
        for got, want in zip(window_logits, logits, strict=True):
            np.testing.assert_array_equal(got, want)
    own = Decoder(gpu, CONFIG, published, batch=1, logits=True, graph_name=prefix + "alone")
    for i, (tokens, logits) in enumerate(runs):  # each run writes the caches before it reads them
        [(solo_tokens, solo_logits)], _ = await merged_runs(gpu, prefix, prompts[i : i + 1])
        np.testing.assert_array_equal(tokens, solo_tokens)
        for step, (got, want) in enumerate(zip(logits, solo_logits, strict=True)):
            np.testing.assert_array_equal(got, want, err_msg=f"sequence {i}, step {step}")
        want_tokens, want_logits = await generate(own, prompts[i : i + 1], TOKENS, "graph")
        np.testing.assert_array_equal(tokens, want_tokens)
        for step, (got, want) in enumerate(zip(logits, want_logits, strict=True)):
            if gpu.backend == "cuda":
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * float(np.abs(want).max()))
            else:
                np.testing.assert_array_equal(got, want, err_msg=f"sequence {i}, step {step}")
    own.free()
    gpu.unpublish_graph(own.graph_name)
    assert stats.get("merged_launches", 0) > 0
    await unpublish(gpu, published, prefix)


async def test_a_published_step_graph_serves_another_session_with_its_own_caches(gpu: gpud_client.Client) -> None:
    prefix = f"tiny-{uuid.uuid4().hex[:8]}/"
    params = await Weights.publish(gpu, CONFIG, SEED, prefix)
    first = Decoder(gpu, CONFIG, params, batch=1, graph_name=prefix + "step")
    one, _ = await generate(first, PROMPT[:1], TOKENS, "graph")
    async with gpud_client.connect(gpu.address) as other:
        second = Decoder(other, CONFIG, await Weights.open(other, CONFIG, prefix), batch=1, graph_name=prefix + "step")
        two, _ = await generate(second, PROMPT[1:], TOKENS, "graph")
        stats = await other.stats()
        second.free()
    third = Decoder(gpu, CONFIG, params, batch=1, graph_name=prefix + "step")
    again, _ = await generate(third, PROMPT[:1], TOKENS, "graph")
    check(PROMPT, np.concatenate([one, two]), None)
    np.testing.assert_array_equal(again, one)  # fresh caches: the same tokens again
    assert stats["session"]["graphs"] == 1  # opened, not built
    for decoder in (first, third):
        decoder.free()
    gpu.unpublish_graph(first.graph_name)
    await unpublish(gpu, params, prefix)


@pytest.mark.parametrize("mode", ["coalesced", "dispatch"])
async def test_decode_steps_mint_no_handles(gpu: gpud_client.Client, mode: str) -> None:
    """Regression: every step made 5 reshape handles (never freed) and every attention a scratch tensor:
    699 handles after 125 steps, and a long-running client hit the session's handle limit."""
    prefix = f"tiny-{uuid.uuid4().hex[:8]}/"
    params = await Weights.publish(gpu, CONFIG, SEED, prefix)
    decoder = Decoder(gpu, CONFIG, params, batch=1, graph_name=prefix + "step")
    ids = PROMPT[:1, 0]
    handles, minted = [], []
    for step in range(6):
        got = await decoder.step(ids, np.array([step], np.int32), mode)
        ids = got.next
        handles.append((await gpu.stats())["session"]["handles"])
        minted.append(next(gpu._handles))
    assert len(set(handles)) == 1, handles
    assert [b - a for a, b in itertools.pairwise(minted)] == [1] * 5  # only these next() calls
    decoder.free()
    await unpublish(gpu, params, prefix)

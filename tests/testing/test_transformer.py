"""The decode workload against its numpy float64 reference, in every mode, on every backend:
weights published by one session and opened by another, the step graph published and opened,
KV caches per session."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

import gpud_client
from gpud.testing.transformer import CONFIGS, MODES, Decoder, Reference, Weights, generate, weights

CONFIG = CONFIGS["tiny"]
SEED = 7
PROMPT = np.array([[3, 141, 59], [26, 5, 35]], np.int32)  # two sequences, decoded together
TOKENS = 6
LOGITS_TOL = 2e-2  # float16 weights and caches both ways: the difference is float32 rounding


def reference_run(prompt: np.ndarray, tokens: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per sequence: the greedy tokens and the logits of every step."""
    params = weights(CONFIG, SEED)
    all_tokens, all_logits = [], []
    for row in prompt:
        ref = Reference(CONFIG, params)
        logits, out = [], []
        ids = list(row)
        for step in range(len(row) - 1 + tokens):
            step_logits = ref.step(int(ids[step]))
            logits.append(step_logits)
            if step + 1 >= len(row):
                ids.append(int(np.argmax(step_logits)))
                out.append(ids[-1])
        all_tokens.append(out)
        all_logits.append(np.stack(logits))
    return np.array(all_tokens), [np.stack([lg[s] for lg in all_logits]) for s in range(len(all_logits[0]))]


@pytest.fixture(scope="module")
def expected() -> tuple[np.ndarray, list[np.ndarray]]:
    return reference_run(PROMPT, TOKENS)


@pytest.mark.parametrize("mode", MODES)
async def test_decode_matches_the_reference_with_shared_weights(
    gpu: gpud_client.Client, mode: str, expected: tuple[np.ndarray, list[np.ndarray]]
) -> None:
    prefix = f"tiny-{uuid.uuid4().hex[:8]}/"
    published = await Weights.publish(gpu, CONFIG, SEED, prefix)
    async with gpud_client.connect(gpu.address) as other:  # decodes with the weights it opened
        shared = await Weights.open(other, CONFIG, prefix)
        decoder = Decoder(other, CONFIG, shared, batch=len(PROMPT), logits=True, graph_name=prefix + "step")
        tokens, logits = await generate(decoder, PROMPT, TOKENS, mode)
        decoder.free()
        if mode == "graph":
            other.unpublish_graph(decoder.graph_name)
    want_tokens, want_logits = expected
    assert len(logits) == len(want_logits)
    for got, want in zip(logits, want_logits, strict=True):
        scale = np.maximum(1.0, np.abs(want))
        assert np.max(np.abs(got - want) / scale) < LOGITS_TOL
    np.testing.assert_array_equal(tokens, want_tokens)
    for name in Weights.names(CONFIG, prefix):
        gpu.unpublish(name)
    for tensor in published.t.values():
        tensor.free()
    await gpu.sync()


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
    want, _ = reference_run(PROMPT, TOKENS)
    np.testing.assert_array_equal(np.concatenate([one, two]), want)
    np.testing.assert_array_equal(again, one)  # fresh caches: the same tokens again
    assert stats["session"]["graphs"] == 1  # opened, not built
    for decoder in (first, third):
        decoder.free()
    gpu.unpublish_graph(first.graph_name)
    for name in Weights.names(CONFIG, prefix):
        gpu.unpublish(name)
    for tensor in params.t.values():
        tensor.free()
    await gpu.sync()

"""picoGPT's GPT-2, a numpy program nobody here wrote, ported to gpud as its user would
(`gpud.testing.picogpt`): the logits and the greedy tokens of its own numpy code (float64), on a small
GPT-2 of random weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import gpud_client
from gpud.testing import picogpt, picogpt_reference

# picoGPT's own functions, untyped as their author wrote them
reference_gpt2: Callable[..., Any] = picogpt_reference.gpt2

N_HEAD = 4
N_VOCAB = 96
SHAPE = (N_VOCAB, 32, 64, 2)  # n_vocab, n_ctx, n_embd, n_layer
PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46]
TOL = 2e-4  # of the logits' largest magnitude: float32 on the device against float64 (lavapipe: 4e-7)


async def test_the_port_computes_picogpts_logits(gpu: gpud_client.Client) -> None:
    params = picogpt.random_params(*SHAPE, seed=0)
    want = reference_gpt2(PROMPT, **params, n_head=N_HEAD)
    ids = gpu.tensor(np.asarray(PROMPT, np.int32))
    got = await picogpt.gpt2(gpu, ids, **picogpt.to_device(gpu, params), n_head=N_HEAD).numpy()
    assert got.shape == want.shape == (len(PROMPT), N_VOCAB)
    assert np.abs(got - want).max() <= TOL * np.abs(want).max(), np.abs(got - want).max()


async def test_the_port_generates_picogpts_greedy_tokens(gpu: gpud_client.Client) -> None:
    """Each token gpud picks is the reference's argmax, or ties with it within the tolerance."""
    params = picogpt.random_params(*SHAPE, seed=0)
    generated = await picogpt.generate(gpu, list(PROMPT), picogpt.to_device(gpu, params), N_HEAD, 8)
    assert len(generated) == 8 and len(set(generated)) > 4  # a model that does not just repeat a token
    sequence = list(PROMPT)
    for token in generated:
        logits = reference_gpt2(sequence, **params, n_head=N_HEAD)[-1]
        assert logits[token] >= logits.max() - TOL * np.abs(logits).max(), (token, int(np.argmax(logits)))
        sequence.append(token)

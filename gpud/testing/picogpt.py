"""picoGPT's GPT-2 (`gpud.testing.picogpt_reference`, numpy) ported to gpud as its user would port it:
`np.` becomes `gpu.ops.`, the weights go to the device once, and numpy's operators, indexing, `.T`,
`split`, `hstack`, `var` and broadcasting work on device tensors as they did on arrays.

Three differences, each where numpy's semantics and the device's meet:
- q, k and v are `split` views with a gap between rows; the op library's matmul reads dense rows, so
  the port copies each head once with `ops.contiguous` (numpy would not need to).
- the ids and the causal mask are made on the host with numpy and uploaded (`gpu.tensor`): `wte[ids]`
  of a list of ints is numpy's fancy indexing, which on the device is `ops.embedding(ids, wte)`.
- reading the next token waits for the device: `int(await next_id.numpy())`.

Temporaries are not freed by hand: an op's output that Python drops goes back to the client's pool.

    params = to_device(gpu, numpy_params)
    ids = await generate(gpu, [15496, 11], params, n_head=12, n_tokens_to_generate=8)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import gpud_client

Params = dict[str, Any]


def gelu(ops: Any, x: Any) -> Any:
    return 0.5 * x * (1 + ops.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def softmax(ops: Any, x: Any) -> Any:
    exp_x = ops.exp(x - ops.max(x, axis=-1, keepdims=True))
    return exp_x / ops.sum(exp_x, axis=-1, keepdims=True)


def layer_norm(ops: Any, x: Any, g: Any, b: Any, eps: float = 1e-5) -> Any:
    mean = ops.mean(x, axis=-1, keepdims=True)
    variance = ops.var(x, axis=-1, keepdims=True)
    x = (x - mean) / ops.sqrt(variance + eps)  # normalize x to have mean=0 and var=1 over last axis
    return g * x + b  # scale and offset with gamma/beta params


def linear(x: Any, w: Any, b: Any) -> Any:  # [m, in], [in, out], [out] -> [m, out]
    return x @ w + b


def ffn(ops: Any, x: Any, c_fc: Params, c_proj: Params) -> Any:  # [n_seq, n_embd] -> [n_seq, n_embd]
    a = gelu(ops, linear(x, **c_fc))  # [n_seq, n_embd] -> [n_seq, 4*n_embd]
    return linear(a, **c_proj)  # [n_seq, 4*n_embd] -> [n_seq, n_embd]


def attention(ops: Any, q: Any, k: Any, v: Any, mask: Any) -> Any:  # [n_q, d_k], [n_k, d_k], [n_k, d_v], [n_q, n_k]
    return softmax(ops, q @ k.T / math.sqrt(q.shape[-1]) + mask) @ v


def mha(gpu: gpud_client.Client, x: Any, c_attn: Params, c_proj: Params, n_head: int) -> Any:
    ops = gpu.ops
    x = linear(x, **c_attn)  # [n_seq, n_embd] -> [n_seq, 3*n_embd]
    qkv = ops.split(x, 3, axis=-1)  # [n_seq, 3*n_embd] -> [3, n_seq, n_embd]
    # [3, n_seq, n_embd] -> [3, n_head, n_seq, n_embd/n_head]; each head copied dense (matmul reads rows)
    qkv_heads = [[ops.contiguous(head) for head in ops.split(t, n_head, axis=-1)] for t in qkv]
    # causal mask to hide future inputs from being attended to: made on the host, as numpy made it
    causal_mask = gpu.tensor((1 - np.tri(x.shape[0], dtype=np.float32)) * -1e10)  # [n_seq, n_seq]
    out_heads = [attention(ops, q, k, v, causal_mask) for q, k, v in zip(*qkv_heads, strict=True)]
    x = ops.hstack(out_heads)  # [n_head, n_seq, n_embd/n_head] -> [n_seq, n_embd]
    return linear(x, **c_proj)  # [n_seq, n_embd] -> [n_seq, n_embd]


def transformer_block(
    gpu: gpud_client.Client, x: Any, mlp: Params, attn: Params, ln_1: Params, ln_2: Params, n_head: int
) -> Any:
    ops = gpu.ops
    x = x + mha(gpu, layer_norm(ops, x, **ln_1), **attn, n_head=n_head)  # multi-head causal self attention
    return x + ffn(ops, layer_norm(ops, x, **ln_2), **mlp)  # position-wise feed forward network


def gpt2(
    gpu: gpud_client.Client, inputs: Any, wte: Any, wpe: Any, blocks: list[Params], ln_f: Params, n_head: int
) -> Any:  # inputs: [n_seq] int32 on the device -> [n_seq, n_vocab]
    ops = gpu.ops
    x = ops.embedding(inputs, wte) + wpe[: inputs.shape[0]]  # token + positional embeddings
    for block in blocks:
        x = transformer_block(gpu, x, **block, n_head=n_head)
    x = layer_norm(ops, x, **ln_f)
    return x @ wte.T  # [n_seq, n_embd] -> [n_seq, n_vocab]


async def generate(
    gpu: gpud_client.Client, inputs: list[int], params: Params, n_head: int, n_tokens_to_generate: int
) -> list[int]:
    for _ in range(n_tokens_to_generate):  # auto-regressive decode loop
        logits = gpt2(gpu, gpu.tensor(np.asarray(inputs, np.int32)), **params, n_head=n_head)
        next_id = gpu.ops.argmax(logits[-1])  # greedy sampling
        inputs.append(int(await next_id.numpy()))  # the one wait for the device per token
    return inputs[len(inputs) - n_tokens_to_generate :]


def to_device(gpu: gpud_client.Client, params: Any) -> Any:
    """picoGPT's nested parameters (dicts and lists of arrays) with every array uploaded as float32."""
    if isinstance(params, dict):
        return {key: to_device(gpu, value) for key, value in params.items()}
    if isinstance(params, list):
        return [to_device(gpu, value) for value in params]
    return gpu.tensor(np.asarray(params, np.float32))


def random_params(
    n_vocab: int, n_ctx: int, n_embd: int, n_layer: int, seed: int, dtype: type[np.floating[Any]] = np.float64
) -> Params:
    """Random parameters of GPT-2's shapes, as `dtype` arrays (float32: picoGPT's own, and half the
    memory of float64 at the released shapes)."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray[Any, Any]:
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)

    def dense(n_in: int, n_out: int) -> Params:
        return {"w": normal(n_in, n_out) * 0.1, "b": normal(n_out) * 0.02}

    def norm() -> Params:
        return {"g": 1 + normal(n_embd) * 0.1, "b": normal(n_embd) * 0.1}

    blocks = [
        {
            "mlp": {"c_fc": dense(n_embd, 4 * n_embd), "c_proj": dense(4 * n_embd, n_embd)},
            "attn": {"c_attn": dense(n_embd, 3 * n_embd), "c_proj": dense(n_embd, n_embd)},
            "ln_1": norm(),
            "ln_2": norm(),
        }
        for _ in range(n_layer)
    ]
    return {
        "wte": normal(n_vocab, n_embd) * 0.1,
        "wpe": normal(n_ctx, n_embd),  # large enough that a random model does not repeat one token
        "blocks": blocks,
        "ln_f": norm(),
    }

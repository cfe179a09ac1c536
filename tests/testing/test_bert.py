"""The BERT sentence encoder (gpud.testing.bert) against its numpy float64 reference, on a tiny random
BERT of the same code: weights loaded from a safetensors file into residents by one session and opened
by another, eager and replay-graph forwards, a batch padded to its longest row (no tokenizer or model
package needed)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import Daemon, stopped, until_together

import gpud_client
from gpud.testing import bert, minilm
from gpud.testing.bert import CONFIGS, MODES, Encoder, random_weights
from gpud.testing.bert_reference import EMBEDDING_TOL, reference_embeddings

CONFIG = CONFIGS["tiny"]
SEED = 3
LENGTHS = [7, 3, 1]  # three rows padded to 7: keys and pooled tokens past a row's length must not count


def batch() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(11)
    ids = rng.integers(1, CONFIG.vocab, (len(LENGTHS), max(LENGTHS)), dtype=np.int32)
    mask = (np.arange(max(LENGTHS))[None, :] < np.array(LENGTHS)[:, None]).astype(np.int32)
    ids[mask == 0] = 0  # padding, as a tokenizer writes it
    return ids, mask


async def embed_with_shared_weights(
    gpu: gpud_client.Client, path: Path, mode: str, ids: np.ndarray[Any, Any], mask: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(the batch's embeddings, row 0's embedded alone) from a second session over the loaded weights."""
    prefix = f"bert-{uuid.uuid4().hex[:8]}/"
    loaded = await gpu.load_safetensors(path, prefix=prefix)
    async with gpud_client.connect(gpu.address) as other:
        encoder = Encoder(other, CONFIG, await other.open_prefix(prefix), graph_prefix=prefix)
        got = await encoder.embed(ids, mask, mode)
        alone = await encoder.embed(ids[:1, : LENGTHS[0]], mask[:1, : LENGTHS[0]], mode)
        encoder.free()
        for length in {ids.shape[1], LENGTHS[0]} if mode == "merged" else ():
            other.unpublish_graph(f"{prefix}bert-rows-s{length}")
    for name, tensor in loaded.items():
        gpu.unpublish(prefix + name)
        tensor.free()
    await gpu.sync()
    return got, alone


@pytest.mark.parametrize("mode", MODES)
async def test_the_encoder_matches_the_reference_on_a_padded_batch(
    gpu: gpud_client.Client, tmp_path: Path, mode: str
) -> None:
    weights = random_weights(CONFIG, SEED)
    path = tmp_path / "model.safetensors"
    minilm.write_safetensors(path, weights)
    ids, mask = batch()
    got, alone = await embed_with_shared_weights(gpu, path, mode, ids, mask)
    want = reference_embeddings(CONFIG, weights, ids, mask)
    assert got.shape == (len(LENGTHS), CONFIG.hidden) and got.dtype == np.float32
    assert np.abs(got - want).max() < EMBEDDING_TOL, np.abs(got - want).max()
    np.testing.assert_allclose(alone[0], got[0], atol=EMBEDDING_TOL)  # padding changed nothing
    assert np.abs(want[1] - want[2]).max() > 0.1  # the rows differ: the check has teeth


async def test_float16_weights_run_in_float16_within_its_rounding(gpu: gpud_client.Client, tmp_path: Path) -> None:
    weights = random_weights(CONFIG, SEED, np.float16)
    path = tmp_path / "model.safetensors"
    minilm.write_safetensors(path, weights)
    ids, mask = batch()
    got, _alone = await embed_with_shared_weights(gpu, path, "eager", ids, mask)
    want = reference_embeddings(CONFIG, weights, ids, mask)
    assert np.abs(got - want).max() < 5e-3, np.abs(got - want).max()  # measured 3e-4 (webgpu)
    assert np.min(np.sum(got * want, axis=1)) > 0.999  # cosine


async def test_an_encoder_keeps_a_bounded_number_of_replay_graphs(
    gpu: gpud_client.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bert, "GRAPHS_KEPT", 2)
    weights = {name: gpu.tensor(value) for name, value in random_weights(CONFIG, SEED).items()}
    encoder = Encoder(gpu, CONFIG, weights)
    ids, mask = batch()
    for length in (7, 6, 5, 7):  # the fourth shape was the least recent of three: rebuilt
        got = await encoder.embed(ids[:, :length], mask[:, :length], "replay")
    assert (await gpu.stats())["session"]["graphs"] == 2
    want = reference_embeddings(CONFIG, random_weights(CONFIG, SEED), ids, mask)
    assert np.abs(got - want).max() < EMBEDDING_TOL
    encoder.free()
    for tensor in weights.values():
        tensor.free()
    assert (await gpu.stats())["session"]["graphs"] == 0


async def test_float16_weights_and_int64_ids_need_no_cast(gpu: gpud_client.Client) -> None:
    """Regression: the encoder cast every attention's output to float16 (attention wrote float32 only) and
    the ids to int32 on the host (embedding took int32 only). Now a tokenizer's int64 ids go as they are,
    attention writes q's float16, and the forward queues no cast."""
    weights = random_weights(CONFIG, SEED, np.float16)
    tensors = {name: gpu.tensor(value) for name, value in weights.items()}
    encoder = Encoder(gpu, CONFIG, tensors)
    ids, mask = batch()
    got = await encoder.embed(ids.astype(np.int64), mask.astype(np.int64))
    assert np.abs(got - reference_embeddings(CONFIG, weights, ids, mask)).max() < 5e-3
    kernels = set(gpu.ops._kernels)
    assert "ew_cast" not in kernels, kernels
    attention = {"webgpu": "attention_tiled_d32_f16_f16_f16", "cuda": "attention_flash_d32_f16"}[gpu.backend]
    if gpu.devices[gpu.device].get("software"):  # lavapipe: the one-pass kernel written for CPUs
        attention = "attention_cpu_d32_f16_f16_f16"
    assert attention in kernels and "embedding_f16_f16" in kernels, kernels
    encoder.free()
    for tensor in tensors.values():
        tensor.free()


async def test_sessions_embedding_at_once_share_one_launch(daemon: Daemon, tmp_path: Path) -> None:
    """`merged` mode from three sessions sent together (the daemon stopped meanwhile): one launch of the
    8-row instance carries their 2 + 2 + 2 sentences, each session's rows as the reference's."""
    weights = random_weights(CONFIG, SEED)
    path = tmp_path / "model.safetensors"
    minilm.write_safetensors(path, weights)
    ids, mask = batch()
    prefix = f"bert-{uuid.uuid4().hex[:8]}/"
    async with contextlib.AsyncExitStack() as stack:
        gpus = [await stack.enter_async_context(gpud_client.connect(daemon.address)) for _ in range(3)]
        loaded = await gpus[0].load_safetensors(path, prefix=prefix)
        encoders = [Encoder(gpu, CONFIG, await gpu.open_prefix(prefix), graph_prefix=prefix) for gpu in gpus]
        for encoder in encoders:  # built once, opened by the others; every instance's kernels compiled
            await encoder.embed(ids[:2], mask[:2], "merged")
        rows = [(ids[i : i + 2], mask[i : i + 2]) for i in (0, 1, 2)]

        async def round_() -> bool:
            before = (await gpus[0].stats())["device"].get("merged_launches", 0)
            with stopped(daemon):
                tasks = [asyncio.create_task(e.embed(i, m, "merged")) for e, (i, m) in zip(encoders, rows, strict=True)]
                await asyncio.sleep(1.0)
            outs = await asyncio.wait_for(asyncio.gather(*tasks), 60)
            after = (await gpus[0].stats())["device"].get("merged_launches", 0)
            for out, (i, m) in zip(outs, rows, strict=True):
                want = reference_embeddings(CONFIG, weights, i, m)
                assert np.abs(out - want).max() < EMBEDDING_TOL, np.abs(out - want).max()
            return bool(after - before == 1)

        await until_together(round_, "three sessions' sentences in one launch")
        for encoder in encoders:
            encoder.free()
        gpus[0].unpublish_graph(f"{prefix}bert-rows-s{ids.shape[1]}")
        for name, tensor in loaded.items():
            gpus[0].unpublish(prefix + name)
            tensor.free()
        await gpus[0].sync()

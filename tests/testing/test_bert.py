"""The BERT sentence encoder (gpud.testing.bert) against its numpy float64 reference, on a tiny random
BERT of the same code: weights loaded from a safetensors file into residents by one session and opened
by another, eager and replay-graph forwards, a batch padded to its longest row. Also the model files'
preparation and the padding of tokenized rows (no tokenizer or model package needed)."""

from __future__ import annotations

import json
import uuid
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

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
        encoder = Encoder(other, CONFIG, await other.open_prefix(prefix))
        got = await encoder.embed(ids, mask, mode)
        alone = await encoder.embed(ids[:1, : LENGTHS[0]], mask[:1, : LENGTHS[0]], mode)
        encoder.free()
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


def test_prepare_keeps_the_encoders_tensors_in_float16(tmp_path: Path) -> None:
    weights = random_weights(CONFIG, SEED)
    folder = tmp_path / "model"
    folder.mkdir()
    minilm.write_safetensors(folder / "model.safetensors", {**weights, "pooler.dense.weight": np.ones((4, 4), "f4")})
    (folder / "tokenizer.json").write_text("{}")
    (folder / "config.json").write_text(json.dumps({"hidden_size": CONFIG.hidden}))
    package = tmp_path / "model.zip"
    with zipfile.ZipFile(package, "w") as zf:
        for name in minilm.FILES:
            zf.write(folder / name, name)
    dest = minilm.prepare(tmp_path / "out", package, config=CONFIG)
    got = minilm.read_safetensors(dest / "model.safetensors")
    assert set(got) == set(weights)
    for name, value in weights.items():
        assert got[name].dtype == np.float16
        np.testing.assert_array_equal(got[name], value.astype(np.float16))
    assert minilm.weights_dir(dest) == dest
    with pytest.raises(minilm.MissingModel, match="prepare-embed-weights"):
        minilm.weights_dir(tmp_path)


class Encoding:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class Tokenizer:
    def encode_batch(self, sentences: list[str]) -> list[Encoding]:
        return [Encoding([101, *range(1000, 1000 + len(s.split())), 102]) for s in sentences]


def test_rows_are_padded_to_the_longest_of_the_batch() -> None:
    ids, mask = minilm.tokenize(Tokenizer(), ["one two three", "one"])
    assert ids.dtype == mask.dtype == np.int32
    np.testing.assert_array_equal(ids, [[101, 1000, 1001, 1002, 102], [101, 1000, 102, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])


def test_the_stored_reference_is_sentence_transformers_unit_embeddings() -> None:
    stored = minilm.stored_reference()
    assert stored.embeddings.shape == (len(stored.sentences), CONFIGS["all-minilm-l6-v2"].hidden)
    np.testing.assert_allclose(np.linalg.norm(stored.embeddings, axis=1), 1.0, atol=2e-3)
    assert stored.ids.shape[0] == len(stored.sentences) and np.all(stored.ids[:, 0] == 101)  # [CLS] first

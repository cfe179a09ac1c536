"""`gpud demo embed`: all-MiniLM-L6-v2 embedding sentences through a daemon from K processes, checked.

The weights are loaded once into read-only residents; K client processes open them and embed a share
of the demo's sentences each, eagerly and through a replay graph. Every embedding is checked against
sentence-transformers' own, computed once and stored in the repository
(gpud/testing/data/minilm-reference.npz); then each sentence's nearest neighbour is printed.
Needs the tokenizer and the model's weights (`minilm.INSTALL` says how to install them).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np

import gpud_client
from gpud.testing import minilm
from gpud.testing.bert import MODES
from gpud.testing.demo import daemon_for
from gpud.testing.embedding import Batch, new_prefix, publish, run_processes, unpublish

EMBED_TOL = 5e-3  # max |gpud - sentence-transformers| per element of a unit embedding (float16 weights)
COSINE_MIN = 0.999
TIE = 2e-3  # a neighbour this close to sentence-transformers' nearest (by its cosine) is a tie, not an error


def _shares(ids: np.ndarray[Any, Any], mask: np.ndarray[Any, Any], k: int) -> list[tuple[list[int], Batch]]:
    """Round-robin rows per process, each batch padded to its own longest row."""
    out = []
    for i in range(min(k, len(ids))):
        rows = list(range(i, len(ids), k))
        length = int(mask[rows].sum(axis=1).max())
        out.append((rows, Batch(ids[rows, :length], mask[rows, :length])))
    return out


def _device(address: str) -> tuple[str, str]:
    async def hello() -> tuple[str, str]:
        async with gpud_client.connect(address) as gpu:
            return gpu.backend, str(gpu.welcome["devices"][gpu.device].get("name", "?"))

    return asyncio.run(hello())


def run_embed_demo(backend: str, clients: int = 3, weights: Path | None = None) -> int:
    try:
        folder = minilm.weights_dir(weights)
        tokenizer = minilm.load_tokenizer(folder)
    except minilm.MissingModel as exc:
        print(f"gpud demo embed: {exc}", file=sys.stderr)
        return 2
    reference = minilm.stored_reference()
    sentences = reference.sentences
    ids, mask = minilm.tokenize(tokenizer, sentences)
    width = min(ids.shape[1], reference.ids.shape[1])
    if not np.array_equal(ids[:, :width], reference.ids[:, :width]):
        print("gpud demo embed: the tokenizer's ids differ from sentence-transformers' stored ones", file=sys.stderr)
        return 1
    shares = _shares(ids, mask, clients)
    with daemon_for(backend) as address:
        backend, name = _device(address)
        print(
            f"{backend} device {name}: all-MiniLM-L6-v2 (6 layers, hidden 384), {len(sentences)} sentences "
            f"of {int(mask.sum(1).min())}-{int(mask.sum(1).max())} tokens, {len(shares)} client processes"
        )
        prefix = new_prefix()
        published = asyncio.run(publish(address, folder, prefix))
        print(
            f"weights loaded once into read-only residents in {published['upload_s']:.1f} s "
            f"({published['weights_memory'] / 2**20:.0f} MiB on the device); the processes open them by name"
        )
        try:
            results = run_processes(address, prefix, [[batch] for _rows, batch in shares], MODES, reps=1)
        finally:
            asyncio.run(unpublish(address, prefix))
    got = {mode: np.zeros_like(reference.embeddings) for mode in MODES}
    for (rows, batch), (seconds, out) in zip(shares, results, strict=True):
        for mode in MODES:
            got[mode][rows] = out[(0, mode)]
        times = ", ".join(f"{mode} {1e3 * seconds[(0, mode)][0]:.0f} ms" for mode in MODES)
        print(f"  process with {len(rows)} sentences ({batch.ids.shape[1]} tokens padded): {times}")
    failed = _check(got, reference.embeddings)
    _neighbours(sentences, got["replay"], reference.embeddings)
    if failed:
        print(failed)
        return 1
    worst = max(float(np.abs(g - reference.embeddings).max()) for g in got.values())
    cosine = min(float(np.sum(g * reference.embeddings, axis=1).min()) for g in got.values())
    print(
        f"all match: every embedding, {', '.join(MODES)}, within {worst:.1e} of sentence-transformers' "
        f"(cosine >= {cosine:.5f}), and every nearest neighbour is sentence-transformers' own"
    )
    return 0


def _check(got: dict[str, np.ndarray[Any, Any]], want: np.ndarray[Any, Any]) -> str:
    for mode, embeddings in got.items():
        error = float(np.abs(embeddings - want).max())
        cosine = float(np.sum(embeddings * want, axis=1).min())
        if error > EMBED_TOL or cosine < COSINE_MIN:
            return f"{mode}: off sentence-transformers' embeddings by {error:.2g} (cosine {cosine:.5f})"
    if wrong := _wrong_neighbours(got["replay"], want):
        return f"nearest neighbours of sentences {wrong} are not sentence-transformers' (nor within {TIE} of them)"
    return ""


def _wrong_neighbours(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> list[int]:
    """Rows whose nearest neighbour by `got` is not the one by `want`, nor as near by `want` within TIE."""
    similarity = want @ want.T
    best = _nearest(want)
    rows = range(len(got))
    return [i for i, j in zip(rows, _nearest(got), strict=True) if similarity[i, j] < similarity[i, best[i]] - TIE]


def _nearest(embeddings: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    similarity = embeddings @ embeddings.T
    np.fill_diagonal(similarity, -np.inf)
    return np.asarray(similarity.argmax(axis=1))


def _neighbours(sentences: list[str], embeddings: np.ndarray[Any, Any], reference: np.ndarray[Any, Any]) -> None:
    print("\nnearest neighbours (cosine similarity of gpud's embeddings):")
    wrong = _wrong_neighbours(embeddings, reference)
    for i, j in enumerate(_nearest(embeddings)):
        mark = "   (not sentence-transformers' nearest)" if i in wrong else ""
        print(f"  {sentences[i]!r:<72} -> {sentences[j]!r} {float(embeddings[i] @ embeddings[j]):.2f}{mark}")
    print()

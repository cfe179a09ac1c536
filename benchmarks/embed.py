"""`gpud bench embed`: all-MiniLM-L6-v2 sentence embeddings through gpud against transformers in process.

In one process run, per batch of N sentences (--sentences, default 16,64,256; each padded to its
longest row, the rows' real lengths otherwise): gpud eager and through a replay graph (a client in
this process), gpud with K client processes replaying at once (--clients, default 4; their
aggregate rate shown as milliseconds per batch), and, on cuda, transformers' BertModel in this
process on the same float16 weights, eager and as a CUDA graph. Printed: milliseconds per batch and
the ratios; every way's embeddings are checked against each other and the first 16 sentences
against sentence-transformers' own (stored in the repository).

The weights: --weights DIR with model.safetensors and tokenizer.json (scripts/prepare-embed-weights.sh
makes it, float16, 45 MB: carry it to a machine that cannot download), else the installed package.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import gpud_client
from benchmarks import write_json
from gpud.backends import resolve
from gpud.testing import minilm
from gpud.testing.bert import CONFIGS, MODES, Encoder
from gpud.testing.embed_demo import EMBED_TOL
from gpud.testing.embedding import MODEL, Batch, embed_all, new_prefix, publish, run_processes, unpublish
from gpud.testing.spawn import daemon

CORPUS = Path(__file__).with_name("embed_sentences.txt")  # sentences of gpud's docs, after the demo's 16
AGREE_TOL = 1e-3  # between gpud's ways (the same kernels); torch's and sentence-transformers': EMBED_TOL


def _clients(value: str) -> int:
    if value == "1,2,4,8":  # the bench parser's default, made for `bench clients`
        return 4
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"gpud bench embed: --clients takes one number (K), not {value!r}")
    return int(value)


def _batches(tokenizer: Any, sizes: list[int]) -> dict[int, Batch]:
    corpus = minilm.stored_reference().sentences + CORPUS.read_text().splitlines()
    return {n: Batch(*minilm.tokenize(tokenizer, [corpus[i % len(corpus)] for i in range(n)])) for n in sizes}


async def _in_process(address: str, prefix: str, batches: list[Batch], quick: bool) -> Any:
    """(the device, timed repetitions, seconds, embeddings, replay stages, whether it had a ring) of a
    client in this process."""
    async with gpud_client.connect(address) as gpu:
        device = gpu.welcome["devices"][gpu.device]
        software = bool(device.get("software"))  # seconds a batch: a few runs
        reps = (1 if quick else 2) if software else (3 if quick else 20)
        encoder = Encoder(gpu, CONFIGS[MODEL], await gpu.open_prefix(prefix), graph_prefix=prefix)
        seconds, out = await embed_all(encoder, batches, MODES, reps, lambda: None)
        stages = [await _replay_stages(gpu, encoder, batch) for batch in batches] if gpu.last_trace else []
        encoder.free()
        return device, reps, seconds, out, stages, gpu.ring


async def _replay_stages(gpu: gpud_client.Client, encoder: Encoder, batch: Batch, reps: int = 30) -> dict[str, float]:
    """Where a replay's time goes (a daemon started with --trace: GPUD_DAEMON_ARGS=--trace): the client's
    work before the request leaves, each stage of the round trip, and the client's after it (medians, µs)."""
    traces, before, after = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        await encoder.embed(batch.ids, batch.mask, "replay")
        t1 = time.perf_counter()
        trace = gpu.last_trace
        assert trace is not None
        traces.append(trace)
        before.append(trace.sent - t0)
        after.append(t1 - trace.resumed)
    stages = {"client_before_send": 1e6 * statistics.median(before)}
    stages.update(gpud_client.Trace.median_stages_us(traces))
    stages["client_after_resume"] = 1e6 * statistics.median(after)
    return stages


def _torch_rows(weights: Path, batches: list[Batch], reps: int, results: dict[str, Any]) -> dict[str, Any]:
    """transformers' BertModel (float16, cuda) eager and CUDA-graphed: per batch, seconds and embeddings."""

    import torch
    import transformers

    from benchmarks import embed_torch

    model = embed_torch.load(weights)
    results["torch"] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attention": model.config._attn_implementation,
    }
    rows: dict[str, Any] = {}
    for name, make in (("torch_eager", embed_torch.eager), ("torch_cuda_graph", embed_torch.graphed)):
        embed = make(model)
        seconds, out = [], []
        try:
            for batch in batches:
                out.append(embed(batch.ids, batch.mask))  # warm-up (and the capture)
                times = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    embed(batch.ids, batch.mask)
                    times.append(time.perf_counter() - t0)
                seconds.append(times)
        except Exception as exc:  # one way failing (a capture, say) leaves the other's figures
            results.setdefault("torch_failed", {})[name] = repr(exc)
            print(f"{name} failed: {exc!r}")
            continue
        rows[name] = (seconds, out)
    return rows


def _ms(times: list[float]) -> float:
    return 1e3 * statistics.median(times)


def main(args: argparse.Namespace) -> int:
    backend = resolve(args.backend)
    try:
        weights = minilm.weights_dir(getattr(args, "weights", None))
        tokenizer = minilm.load_tokenizer(weights)
    except minilm.MissingModel as exc:
        print(f"gpud bench embed: {exc}", file=sys.stderr)
        return 2
    sizes = [int(n) for n in str(getattr(args, "sentences", "16,64,256")).split(",")]
    k = _clients(str(args.clients))
    batches = _batches(tokenizer, sizes)
    prefix = new_prefix()
    with daemon(backend) as (address, _proc):
        published = asyncio.run(publish(address, weights, prefix))
        shapes = ", ".join(f"{n}x{batch.ids.shape[1]}" for n, batch in batches.items())
        print(f"weights loaded in {published['upload_s']:.1f} s; batches (sentences x tokens) {shapes}; K={k}")
        try:
            in_process = _in_process(address, prefix, list(batches.values()), args.quick)
            device, reps, seconds, out, stages, ring = asyncio.run(in_process)
            processes = run_processes(address, prefix, [list(batches.values())] * k, ("replay",), reps)
            merged = run_processes(address, prefix, [list(batches.values())] * k, ("merged",), reps)
        finally:
            asyncio.run(unpublish(address, prefix))
    results: dict[str, Any] = {
        "benchmark": "embed",
        "backend": backend,
        "device": device.get("name"),
        "model": "all-MiniLM-L6-v2",
        "weights_dtype": "float16",
        "processes": k,
        "ring": ring,  # the clients' shared-memory ring (GPUD_RING=1), else ZeroMQ alone
        **published,
        "sizes": [],
    }
    torch_rows: dict[str, Any] = {}
    if backend == "cuda":
        try:
            torch_rows = _torch_rows(weights, list(batches.values()), reps, results)
        except Exception as exc:  # torch or transformers missing or failing: say so
            results["torch_skipped"] = repr(exc)
            print(f"torch skipped: {exc!r}")
    reference = minilm.stored_reference().embeddings
    failures = []
    for i, (n, batch) in enumerate(batches.items()):
        row: dict[str, Any] = {"sentences": n, "length": int(batch.ids.shape[1]), "tokens": int(batch.mask.sum())}
        row["gpud_eager_ms"] = _ms(seconds[(i, "eager")])
        row["gpud_replay_ms"] = _ms(seconds[(i, "replay")])
        if stages:
            row["gpud_replay_stages_us"] = stages[i]
            print(f"{n} sentences, replay stages (µs): " + ", ".join(f"{k} {v:.0f}" for k, v in stages[i].items()))
        wall = max(sum(p_seconds[(i, "replay")]) for p_seconds, _out in processes)
        row[f"gpud_{k}_processes_ms"] = 1e3 * wall / (k * reps)  # per batch, all processes together
        row[f"gpud_{k}_processes_sentences_per_s"] = k * reps * n / wall
        row[f"gpud_{k}_processes_each_ms"] = [_ms(p_seconds[(i, "replay")]) for p_seconds, _out in processes]
        row["gpud_merged_ms"] = _ms(seconds[(i, "merged")])
        wall = max(sum(p_seconds[(i, "merged")]) for p_seconds, _out in merged)
        row[f"gpud_{k}_processes_merged_ms"] = 1e3 * wall / (k * reps)  # their batches launched together
        embeddings = {"gpud eager": out[(i, "eager")], "gpud replay": out[(i, "replay")]}
        embeddings["gpud merged"] = out[(i, "merged")]
        embeddings.update({f"gpud process {j}": p_out[(i, "replay")] for j, (_s, p_out) in enumerate(processes)})
        embeddings.update({f"gpud merged process {j}": p_out[(i, "merged")] for j, (_s, p_out) in enumerate(merged)})
        for name, (t_seconds, t_out) in torch_rows.items():
            row[f"{name}_ms"] = _ms(t_seconds[i])
            embeddings[name] = t_out[i]
        failures += _check(n, embeddings, row, reference)
        results["sizes"].append(row)
    _report(results, k, backend, reps)
    results["failures"] = failures
    write_json(args.json, results)
    for failure in failures:
        print(f"MISMATCH {failure}")
    return 1 if failures else 0


def _check(n: int, embeddings: dict[str, np.ndarray[Any, Any]], row: dict[str, Any], reference: Any) -> list[str]:
    """Each way's largest difference from gpud eager (kept in `row`), and gpud eager's from
    sentence-transformers' on the first 16 sentences: what is off, if anything."""
    failures = []
    first = embeddings["gpud eager"]
    rows = min(n, len(reference))
    errors = {"gpud eager vs sentence-transformers": float(np.abs(first[:rows] - reference[:rows]).max())}
    errors.update({f"{name} vs gpud eager": float(np.abs(got - first).max()) for name, got in embeddings.items()})
    row["max_abs_differences"] = errors
    for what, error in errors.items():
        tol = AGREE_TOL if what.startswith("gpud") and "sentence" not in what else EMBED_TOL
        if error > tol:
            failures.append(f"{n} sentences: {what} differ by {error:.2g} (tolerance {tol:g})")
    return failures


def _report(results: dict[str, Any], k: int, backend: str, reps: int) -> None:
    ways = [("gpud_eager", "gpud eager"), ("gpud_replay", "gpud replay"), (f"gpud_{k}_processes", f"gpud K={k}")]
    ways += [(f"gpud_{k}_processes_merged", f"merged K={k}")]
    ways += [("torch_eager", "torch eager"), ("torch_cuda_graph", "torch graph")]
    ways = [(key, label) for key, label in ways if f"{key}_ms" in results["sizes"][0]]
    print(
        f"\nall-MiniLM-L6-v2, float16 weights, {backend} ({results['device']}): ms per batch, median of {reps} "
        f"(K={k}: {k} processes replaying at once, each its own graph or all one merged graph; wall time / batches)"
    )
    print(f"{'sentences':>9} {'tokens':>10} " + " ".join(f"{label:>12}" for _key, label in ways))
    for row in results["sizes"]:
        shape = f"{row['sentences']}x{row['length']}"
        print(f"{row['sentences']:>9} {shape:>10} " + " ".join(f"{row[f'{key}_ms']:12.2f}" for key, _label in ways))
    pairs = [
        ("gpud_eager", "torch_eager"),
        ("gpud_replay", "torch_cuda_graph"),
        (f"gpud_{k}_processes", "torch_cuda_graph"),
        (f"gpud_{k}_processes_merged", "torch_cuda_graph"),
    ]
    pairs = [(ours, theirs) for ours, theirs in pairs if f"{theirs}_ms" in results["sizes"][0]]
    if not pairs:
        return
    print("\nratios (gpud / torch; above 1: gpud slower)")
    for row in results["sizes"]:
        ratios = {f"{ours} / {theirs}": row[f"{ours}_ms"] / row[f"{theirs}_ms"] for ours, theirs in pairs}
        row["ratios"] = ratios
        print(f"{row['sentences']:>9} " + "   ".join(f"{name} {value:5.2f}" for name, value in ratios.items()))

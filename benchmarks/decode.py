"""`gpud bench decode`: greedy decoding of a transformer (gpud.testing.transformer) through gpud.

Per mode (dispatch, coalesced, graph) and per K client processes (--clients): tokens per second of
all clients together, each decoding its own sequence with its own KV caches, all sharing one
published copy of the weights (and, in graph mode, one published step graph). On cuda the same
model runs in this process in PyTorch, eager and as a CUDA graph (float16, static KV cache): the
same work without a daemon. Every client's tokens are checked against a single-client run of the
same mode, and the modes against each other.

`--devices all` (or a list): the clients spread round-robin over the devices, with a copy of the
weights on each; `--process-per-device` runs that daemon as a worker process per device, each copy
published (and each client served) by its device's worker.

The model is Qwen2.5-0.5B's shape on a GPU and `small` on a software rasteriser (--model to choose).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from typing import Any

import numpy as np

from benchmarks import write_json
from benchmarks.plot import svg
from gpud.backends import resolve
from gpud.testing.decoding import (
    PROMPT,
    new_prefix,
    prompt,
    publish,
    reference_mismatch,
    run_clients,
    unpublish,
)
from gpud.testing.spawn import daemon
from gpud.testing.transformer import MODES
from gpud.testing.transformer_weights import CONFIGS, Config, weights
from gpud_client.status import device_count

# ------------------------------------------------------------------------------- PyTorch in process


def _torch_model(config: Config) -> tuple[Any, Any]:
    """(eager step, CUDA-graph step): each takes (ids, pos) int arrays and returns the argmax ids."""
    import torch

    dev = torch.device("cuda")
    c = config
    w = {name: torch.from_numpy(value).to(dev) for name, value in weights(c, 0).items()}
    kc = [torch.zeros(1, c.max_len, c.kv_heads, c.head_dim, dtype=torch.float16, device=dev) for _ in range(c.layers)]
    vc = [torch.zeros_like(t) for t in kc]
    half = c.head_dim // 2
    inv = torch.tensor(c.rope_base, dtype=torch.float32) ** (-torch.arange(half, dtype=torch.float32) * 2 / c.head_dim)
    inv = inv.to(dev)
    positions = torch.arange(c.max_len, device=dev)
    group = c.heads // c.kv_heads

    def rms(x: Any, weight_: Any) -> Any:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + c.eps)).half() * weight_

    def rope(x: Any, pos: Any) -> Any:
        angle = pos.float()[:, None, None] * inv  # (1, 1, half)
        cos, sin = angle.cos().half(), angle.sin().half()
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def step(ids: Any, pos: Any) -> Any:
        x = w["embed"][ids]  # (1, hidden)
        visible = (positions <= pos[0])[None, None, :]  # (1, 1, L)
        for i in range(c.layers):
            p = f"layer{i}."
            h = rms(x, w[p + "norm1"])
            qkv = torch.nn.functional.linear(h, w[p + "qkv"], w[p + "qkv_bias"])  # q, k, v stacked, as vLLM's
            q, k, v = qkv.split([c.heads * c.head_dim, c.kv_width, c.kv_width], dim=-1)
            q, k, v = (
                q.view(1, c.heads, c.head_dim),
                k.view(1, c.kv_heads, c.head_dim),
                v.view(1, c.kv_heads, c.head_dim),
            )
            q, k = rope(q, pos), rope(k, pos)
            kc[i].index_copy_(1, pos, k[:, None])
            vc[i].index_copy_(1, pos, v[:, None])
            keys = kc[i].repeat_interleave(group, dim=2).transpose(1, 2)  # (1, H, L, D)
            values = vc[i].repeat_interleave(group, dim=2).transpose(1, 2)
            scores = (keys @ q[..., None]).squeeze(-1) / c.head_dim**0.5  # (1, H, L)
            scores = scores.float().masked_fill(~visible, float("-inf")).softmax(-1).half()
            attn = (scores[:, :, None, :] @ values).reshape(1, -1)
            x = x + torch.nn.functional.linear(attn, w[p + "o"])
            h = rms(x, w[p + "norm2"])
            gate, up = torch.nn.functional.linear(h, w[p + "gate_up"]).chunk(2, dim=-1)
            x = x + torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w[p + "down"])
        logits = torch.nn.functional.linear(rms(x, w["norm"]), w["embed"])
        return logits.argmax(-1)

    def eager(ids: np.ndarray[Any, Any], pos: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        with torch.no_grad():
            out = step(torch.from_numpy(ids).to(dev), torch.from_numpy(pos).long().to(dev))
            return np.asarray(out.cpu().numpy(), np.int32)

    static_ids = torch.zeros(1, dtype=torch.long, device=dev)
    static_pos = torch.zeros(1, dtype=torch.long, device=dev)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(3):
            step(static_ids, static_pos)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_out = step(static_ids, static_pos)

    def graphed(ids: np.ndarray[Any, Any], pos: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        static_ids.copy_(torch.from_numpy(ids))
        static_pos.copy_(torch.from_numpy(pos))
        graph.replay()
        return np.asarray(static_out.cpu().numpy(), np.int32)

    return eager, graphed


def _torch_rates(config: Config, tokens: int) -> dict[str, Any]:
    eager, graphed = _torch_model(config)
    rows: dict[str, Any] = {}
    for name, step in (("torch_eager", eager), ("torch_cuda_graph", graphed)):
        ids = prompt(0, config)[0]
        token = np.array([ids[0]], np.int32)
        out: list[int] = []
        t0 = time.perf_counter()
        for i in range(PROMPT - 1 + tokens):
            nxt = step(token, np.array([i], np.int32))
            token = np.array([ids[i + 1]], np.int32) if i + 1 < PROMPT else nxt
            if i + 1 >= PROMPT:
                out.append(int(nxt[0]))
        seconds = time.perf_counter() - t0
        rows[name] = {"tokens_per_s": (PROMPT - 1 + tokens) / seconds, "tokens": out}
    return rows


def main(args: argparse.Namespace) -> int:
    backend = resolve(args.backend)
    model = getattr(args, "model", None) or ("qwen2.5-0.5b" if backend == "cuda" else "small")
    config = CONFIGS[model]
    tokens = min(8 if args.quick else 64, config.max_len - PROMPT)  # the model's positions bound them (tiny: 32)
    counts = [int(k) for k in str(args.clients).split(",")]
    results: dict[str, Any] = {
        "benchmark": "decode",
        "backend": backend,
        "model": model,
        "config": dataclasses.asdict(config),
        "parameters": config.parameters(),
        "tokens_per_client": tokens,
        "prompt": PROMPT,
        "modes": {},
    }
    prefix = new_prefix()
    spread = getattr(args, "devices", "0")
    per_device = bool(getattr(args, "process_per_device", False))
    extra = ("--trace", "--devices", spread, *(("--process-per-device",) if per_device else ()))
    with daemon(backend, extra_args=extra) as (address, _proc):
        devices = device_count(address)
        results["process_per_device"] = per_device and devices > 1  # one device: served as without it
        published = asyncio.run(publish(address, model, prefix, devices=devices))
        results.update(published)
        layout = ", a process per device" if results["process_per_device"] else ""
        print(
            f"{model}: {config.parameters() / 1e6:.0f}M parameters, published in {published['upload_s']:.1f} s"
            + (f" (a copy on each of {devices} devices{layout}; clients spread round-robin)" if devices > 1 else "")
        )
        for mode in getattr(args, "modes", None) or MODES:
            rows = []
            for k in counts:
                row = run_clients(address, model, prefix, mode, k, tokens, devices=devices)
                rows.append(row)
                each = row["per_client_tokens_per_s"]
                print(
                    f"{mode:>9} K={k:<2} {row['tokens_per_s']:8.1f} tokens/s together, "
                    f"{min(each):8.1f} .. {max(each):8.1f} per client"
                )
                if row["stages_median_us"]:
                    stages = ", ".join(f"{k} {v:.0f}" for k, v in row["stages_median_us"].items())
                    print(f"          client 0's step, median us: {stages}")
            results["modes"][mode] = rows
        asyncio.run(unpublish(address, model, prefix, devices))
    firsts = {mode: rows[0]["tokens"][0] for mode, rows in results["modes"].items()}
    results["modes_agree"] = len({tuple(t) for t in firsts.values()}) <= 1  # every mode is exact
    chosen = next(iter(firsts.values()))[:16]
    results["reference_mismatch"] = reference_mismatch(model, chosen)
    verdict = results["reference_mismatch"] or "match"
    print(f"client 0's first {len(chosen)} tokens against the numpy reference: {verdict}")
    if backend == "cuda":
        try:
            results.update(_torch_rates(config, tokens))
            for name in ("torch_eager", "torch_cuda_graph"):
                print(f"{name:>17} {results[name]['tokens_per_s']:8.1f} tokens/s (one sequence, in process)")
        except Exception as exc:  # torch missing or failing: say so
            results["torch_skipped"] = repr(exc)
    write_json(args.json, results)
    plot = getattr(args, "plot", None)
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        plot.write_text(svg(results))
        print(f"wrote {plot}")
    if not results["modes_agree"] or results["reference_mismatch"]:
        print(f"the modes disagree on the first client's tokens: {firsts}")
        return 1
    return 0

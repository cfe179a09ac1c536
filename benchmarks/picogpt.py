"""picoGPT's GPT-2 forward, one numpy program three ways side by side in one run: numpy on the CPU
(picoGPT itself, `gpud.testing.picogpt_reference`), gpud eager (its port, `gpud.testing.picogpt`,
through a daemon) and torch eager (the same code with `np.` made `torch.`, on cuda where torch has one).

    python -m benchmarks.picogpt [--backend auto] [--shape small|124M] [--prompt 32] [--reps 5] [--json FILE]

A step is what a greedy decode pays per token without a KV cache, as picoGPT decodes: the forward over
the prompt, the argmax of the last row, and the id read back. Printed per way: milliseconds per step
(median of `reps`), and for gpud the client's share (queueing the ops, before the readback waits) and
the ops a step queues. Weights are random float32 at GPT-2's shapes (`124M`: 12 layers of 768, 12
heads, a 50,257-token vocabulary); the logits of the three ways are compared against numpy's.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import gpud_client
from benchmarks import write_json
from gpud.backends import resolve
from gpud.testing import picogpt, picogpt_reference
from gpud.testing.spawn import daemon

SHAPES = {  # n_vocab, n_ctx, n_embd, n_layer, n_head
    "small": (96, 64, 64, 2, 4),
    "124M": (50257, 1024, 768, 12, 12),
}
numpy_gpt2: Callable[..., Any] = picogpt_reference.gpt2  # untyped, as its author wrote it


def _torch_way(params: Any, n_head: int) -> tuple[Callable[[list[int]], Any], str] | None:
    """picoGPT's forward with `np.` made `torch.` (np.split's sections are torch.chunk's), on cuda if
    torch has it, else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    dev = torch.device("cuda")

    def to(p: Any) -> Any:
        if isinstance(p, dict):
            return {k: to(v) for k, v in p.items()}
        if isinstance(p, list):
            return [to(v) for v in p]
        return torch.from_numpy(np.asarray(p, np.float32)).to(dev)

    w = to(params)

    def layer_norm(x: Any, g: Any, b: Any, eps: float = 1e-5) -> Any:
        mean = torch.mean(x, dim=-1, keepdim=True)
        variance = torch.var(x, dim=-1, keepdim=True, unbiased=False)
        return g * ((x - mean) / torch.sqrt(variance + eps)) + b

    def softmax(x: Any) -> Any:
        exp_x = torch.exp(x - torch.amax(x, dim=-1, keepdim=True))
        return exp_x / torch.sum(exp_x, dim=-1, keepdim=True)

    def gelu(x: Any) -> Any:
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    def mha(x: Any, c_attn: Any, c_proj: Any) -> Any:
        x = x @ c_attn["w"] + c_attn["b"]
        heads = [torch.chunk(t, n_head, dim=-1) for t in torch.chunk(x, 3, dim=-1)]
        mask = (1 - torch.tril(torch.ones(x.shape[0], x.shape[0], device=dev))) * -1e10
        out = [softmax(q @ k.T / math.sqrt(q.shape[-1]) + mask) @ v for q, k, v in zip(*heads, strict=True)]
        return torch.hstack(out) @ c_proj["w"] + c_proj["b"]

    def forward(ids: list[int]) -> Any:
        with torch.inference_mode():
            x = w["wte"][torch.tensor(ids, device=dev)] + w["wpe"][: len(ids)]
            for block in w["blocks"]:
                x = x + mha(layer_norm(x, **block["ln_1"]), **block["attn"])
                mlp = block["mlp"]
                a = gelu(layer_norm(x, **block["ln_2"]) @ mlp["c_fc"]["w"] + mlp["c_fc"]["b"])
                x = x + a @ mlp["c_proj"]["w"] + mlp["c_proj"]["b"]
            logits = layer_norm(x, **w["ln_f"]) @ w["wte"].T
            int(torch.argmax(logits[-1]).item())
            return logits

    return forward, torch.cuda.get_device_name()


async def _gpud(address: str, params: Any, ids: list[int], n_head: int, reps: int) -> dict[str, Any]:
    async with gpud_client.connect(address) as gpu:
        weights = picogpt.to_device(gpu, params)
        await gpu.sync()
        queued: list[float] = []
        total: list[float] = []
        logits: Any = None
        for rep in range(reps + 2):  # two warm-ups: kernels compiled, pools filled
            before = (await gpu.stats())["device"].get("dispatches", 0)
            t0 = time.perf_counter()
            out = picogpt.gpt2(gpu, gpu.tensor(np.asarray(ids, np.int32)), **weights, n_head=n_head)
            next_id = gpu.ops.argmax(out[-1])
            t1 = time.perf_counter()
            int(await next_id.numpy())
            t2 = time.perf_counter()
            if rep >= 2:
                queued.append(t1 - t0)
                total.append(t2 - t0)
            ops = (await gpu.stats())["device"].get("dispatches", 0) - before
            if rep == reps + 1:
                logits = await out.numpy()
        return {
            "step_ms": [t * 1e3 for t in total],
            "client_ms": [t * 1e3 for t in queued],
            "ops_per_step": ops,
            "logits": logits,
            "device": str(gpu.devices[gpu.device].get("name", "?")),
        }


def _timed(fn: Callable[[], Any], reps: int) -> tuple[list[float], Any]:
    out = fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples, out


def main(args: argparse.Namespace) -> int:
    n_vocab, n_ctx, n_embd, n_layer, n_head = SHAPES[args.shape]
    params = picogpt.random_params(n_vocab, n_ctx, n_embd, n_layer, seed=0, dtype=np.float32)
    ids = [int(i) for i in np.random.default_rng(1).integers(0, n_vocab, args.prompt)]
    backend = resolve(args.backend)

    def numpy_step() -> Any:
        logits = numpy_gpt2(ids, **params, n_head=n_head)
        int(np.argmax(logits[-1]))
        return logits

    numpy_ms, want = _timed(numpy_step, max(1, args.reps // 2))
    with daemon(backend) as (address, _proc):
        got = asyncio.run(_gpud(address, params, ids, n_head, args.reps))
    scale = float(np.abs(want).max())
    ways: dict[str, Any] = {
        "numpy (CPU)": {"step_ms": numpy_ms},
        f"gpud eager ({backend})": {k: got[k] for k in ("step_ms", "client_ms", "ops_per_step")},
    }
    ways[f"gpud eager ({backend})"]["max_abs_difference"] = float(np.abs(got["logits"] - want).max())
    torch_way = _torch_way(params, n_head)
    if torch_way is not None:
        forward, _name = torch_way
        torch_ms, logits = _timed(lambda: forward(ids), args.reps)
        ways["torch eager (cuda)"] = {
            "step_ms": torch_ms,
            "max_abs_difference": float(np.abs(logits.cpu().numpy() - want).max()),
        }
    print(f"picoGPT {args.shape} (random float32 weights), prompt {args.prompt}, gpud on {backend} ({got['device']})")
    base = statistics.median(ways[f"gpud eager ({backend})"]["step_ms"])
    for name, way in ways.items():
        median = statistics.median(way["step_ms"])
        extra = ""
        if "client_ms" in way:
            extra = f", client {statistics.median(way['client_ms']):.2f} ms for {way['ops_per_step']} ops"
        if "max_abs_difference" in way:
            extra += f", logits within {way['max_abs_difference'] / scale:.1e} of numpy's largest"
        print(f"  {name:<22} {median:9.2f} ms a step ({median / base:5.2f}x gpud's time){extra}")
    write_json(
        args.json,
        {
            "benchmark": "picogpt",
            "shape": args.shape,
            "prompt": args.prompt,
            "backend": backend,
            "device": got["device"],
            "ways": ways,
        },
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--shape", choices=list(SHAPES), default="small")
    parser.add_argument("--prompt", type=int, default=32, help="tokens a step runs the forward over")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here as JSON")
    raise SystemExit(main(parser.parse_args()))

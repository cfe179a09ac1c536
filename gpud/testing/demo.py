"""`gpud demo`: a transformer decoding through a real daemon, K client processes at once, checked.

The weights (Qwen2.5-0.5B's shapes on a GPU, a smaller configuration of the same model on a software
rasteriser) are uploaded once and published; K client processes open them, keep their own KV
caches and decode greedily, in each mode: one submission per op, coalesced, and a replay graph per
step. Client 0's tokens are checked against a numpy float64 reference of the same model, and every
client's tokens must agree across the modes. Printed: tokens/s per client and per mode, and the
device memory (the weights held once however many clients decode).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
from collections.abc import Iterator
from typing import Any

import gpud_client
from gpud.testing.decoding import (
    PROMPT,
    new_prefix,
    publish,
    reference_mismatch,
    run_clients,
    unpublish,
)
from gpud.testing.spawn import answers, daemon
from gpud.testing.transformer import MODES
from gpud.testing.transformer_weights import CONFIGS
from gpud_client import default_address
from gpud_client.status import memory_in_use


@contextlib.contextmanager
def daemon_for(backend: str) -> Iterator[str]:
    """The running gpud at the default address (backend auto), else one started for the demo."""
    address = default_address()
    if backend == "auto" and answers(address):
        print(f"using the gpud already running at {address}")
        yield address
        return
    print(f"starting a gpud (backend {backend}) for this demo ...")
    with daemon(backend) as (address, _proc):
        yield address


class Bars:
    """One progress bar per client, redrawn in place on a terminal; a line per client elsewhere."""

    def __init__(self, label: str, clients: int) -> None:
        self.label, self.done = label, [0] * clients
        self.tty = sys.stderr.isatty()
        self.total = 1
        if self.tty:
            sys.stderr.write("\n" * clients)

    def __call__(self, client: int, done: int, total: int) -> None:
        self.done[client], self.total = done, total
        if self.tty:
            width = 32
            lines = []
            for i, d in enumerate(self.done):
                filled = width * d // total
                lines.append(f"  {self.label:>9} client {i}: [{'#' * filled}{'.' * (width - filled)}] {d}/{total}")
            sys.stderr.write(f"\x1b[{len(self.done)}F" + "\n".join(f"{line}\x1b[K" for line in lines) + "\n")
            sys.stderr.flush()
        elif done == total:
            sys.stderr.write(f"  {self.label:>9} client {client}: {done} steps\n")


def _model_for(address: str, model: str) -> tuple[str, str, dict[str, Any]]:
    async def hello() -> tuple[str, dict[str, Any]]:
        async with gpud_client.connect(address) as gpu:
            return gpu.backend, dict(gpu.welcome["devices"][gpu.device])

    backend, device = asyncio.run(hello())
    if model == "auto":
        model = "small" if device.get("software") else "qwen2.5-0.5b"
    return model, backend, device


def run_demo(backend: str, clients: int = 3, tokens: int = 16, model: str = "auto") -> int:
    with daemon_for(backend) as address:
        model, backend, device = _model_for(address, model)
        config = CONFIGS[model]
        print(
            f"{backend} device {device.get('name', '?')}: model {model!r}, {config.parameters() / 1e6:.0f}M float16 "
            f"parameters, {clients} clients, {PROMPT} prompt tokens + {tokens} greedy ones each"
        )
        weight_bytes = 2 * config.parameters()
        prefix = new_prefix()
        published = asyncio.run(publish(address, model, prefix))
        print(
            f"weights uploaded and published once in {published['upload_s']:.1f} s: "
            f"{published['weights_memory'] / 2**20:.0f} MiB on the device ({weight_bytes / 2**20:.0f} MiB of weights)"
        )
        rows: dict[str, dict[str, Any]] = {}
        try:
            for mode in MODES:
                rows[mode] = run_clients(address, model, prefix, mode, clients, tokens, Bars(mode, clients))
        finally:
            asyncio.run(unpublish(address, model, prefix))
        baseline = memory_in_use(address)
    print("numpy float64 reference of client 0 ...", flush=True)
    failed = _check(rows, model)
    _report(rows, clients, published["weights_memory"], baseline)
    if failed:
        print(failed)
        return 1
    print(
        f"all match: client 0's {tokens} greedy tokens are the numpy reference's, and every client's tokens are "
        "the same in every mode (merged ones too: a row among others is summed as alone)"
    )
    return 0


def _check(rows: dict[str, dict[str, Any]], model: str) -> str:
    """Client 0's tokens against the reference fed the same tokens; every client across the modes."""
    first = rows[MODES[0]]["tokens"]
    for mode, row in rows.items():
        if row["tokens"] != first:
            return f"{mode}: the clients' tokens differ from the {MODES[0]} mode's"
    mismatch = reference_mismatch(model, first[0])
    return f"client 0 against the numpy reference: {mismatch}" if mismatch else ""


def _report(rows: dict[str, dict[str, Any]], clients: int, weights_memory: int, baseline: int) -> None:
    print(f"\n{'mode':>10} {'tokens/s per client (min / median / max)':>42} {'all clients':>12} {'vs dispatch':>12}")
    base = rows["dispatch"]["tokens_per_s"]
    for mode, row in rows.items():
        each = row["per_client_tokens_per_s"]
        spread = f"{min(each):8.1f} / {statistics.median(each):8.1f} / {max(each):8.1f}"
        print(f"{mode:>10} {spread:>42} {row['tokens_per_s']:12.1f} {row['tokens_per_s'] / base:11.1f}x")
    peak = max(row["peak_memory"] for row in rows.values())
    print(
        f"\ndevice memory: {peak / 2**20:.0f} MiB at most while {clients} clients decoded "
        f"(the weights, {weights_memory / 2**20:.0f} MiB, held once; each client's KV caches and activations "
        f"besides); {baseline / 2**20:.0f} MiB once they left and the weights were unpublished"
    )

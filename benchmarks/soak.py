"""`gpud bench soak`: K clients for a long time against one daemon; its resources must stay flat.

Each client process (benchmarks.soak_client) loops at random over decoding in every mode, op-library
batches, replays of a small graph and residents published, unpublished and opened by the others;
every result is checked. A supervisor kills a random client with SIGKILL about once a minute and
starts a replacement, which reconnects. Every --sample-s seconds it samples the daemon
(benchmarks.soak_samples). At the end the clients stop, the run's names are unpublished, and the
daemon must be back to nothing held: no memory, buffers, sessions, residents or graphs.

    gpud bench soak --backend webgpu --clients 4 --minutes 30 --json soak.json --plot soak.svg

The run fails (exit 1) on any client error (those of killed clients' sessions are expected and not
seen: a killed client says nothing), on an ERROR or a traceback in the daemon's log, on a daemon that
exits, or on anything left held at the end. The series' slopes are reported, not judged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import platform
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import gpud_client
from benchmarks import write_json
from benchmarks.soak_client import ACTIVITIES, Spec
from benchmarks.soak_plot import svg
from benchmarks.soak_run import Supervisor
from benchmarks.soak_samples import SERIES, sample, summary
from gpud.backends import resolve
from gpud.service import admin
from gpud.testing.decoding import PROMPT, new_prefix, prompt, publish, reference_mismatch, unpublish
from gpud.testing.generation import generate
from gpud.testing.spawn import daemon
from gpud.testing.transformer import MODES, Decoder
from gpud.testing.transformer_weights import CONFIGS, Weights

DEFAULT_CLIENTS = 4
PROMPTS = 3  # distinct prompts the clients decode; their tokens come from the baseline
SETTLE_S = 60.0  # the longest the daemon may take to release everything once the clients are gone


async def _baseline(address: str, model: str, prefix: str, tokens: int) -> tuple[dict[int, list[int]], float]:
    """Each prompt's greedy tokens (coalesced), the graph mode's for prompt 0 (this publishes the step
    graph); both must agree, and prompt 0's must be the numpy reference's. Also the daemon's lease."""
    config = CONFIGS[model]
    async with gpud_client.connect(address) as gpu:
        decoder = Decoder(gpu, config, await Weights.open(gpu, config, prefix), graph_name=prefix + "step")
        expected = {}
        for seed in range(PROMPTS):
            out, _ = await generate(decoder, prompt(seed, config), tokens, "coalesced")
            expected[seed] = out[0].tolist()
        graphed, _ = await generate(decoder, prompt(0, config), tokens, "graph")
        decoder.free()
        lease = float(gpu.welcome["lease_s"])
    if graphed[0].tolist() != expected[0]:
        raise RuntimeError(f"baseline: graph mode decoded {graphed[0].tolist()}, coalesced {expected[0]}")
    if mismatch := reference_mismatch(model, expected[0]):
        raise RuntimeError(f"baseline: prompt 0 against the numpy reference: {mismatch}")
    return expected, lease


def _wait_until(address: str, done: Any, timeout: float) -> dict[str, Any]:
    """Poll the daemon's status until `done(status)`; the last status."""
    deadline = time.monotonic() + timeout
    while True:
        status = admin.query(address, 10.0)
        if done(status) or time.monotonic() > deadline:
            return status
        time.sleep(0.5)


def _held(status: dict[str, Any]) -> dict[str, int]:
    """What the daemon still holds (all zero once everything is released)."""
    devices = status["devices"]
    return {
        "memory_in_use": sum(d["memory_in_use"] for d in devices),
        "live_buffers": sum(d["live_buffers"] for d in devices),
        "sessions": status["session_count"],
        "residents": status["resident_count"],
        "published_graphs": status["graph_count"],
    }


def _daemon_log(address: str) -> dict[str, Any]:
    """ERROR and WARNING lines and tracebacks of the daemon's log (gpud.testing.spawn puts it beside the socket)."""
    path = Path(address.removeprefix("ipc://")).parent / "daemon.log"
    if not address.startswith("ipc://") or not path.exists():
        return {"read": False}
    lines = path.read_text(errors="replace").splitlines()
    errors = [line for line in lines if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback")]
    warnings = [line for line in lines if " WARNING " in line]
    return {"read": True, "lines": len(lines), "errors": errors[:50], "error_count": len(errors),
            "warnings": warnings[:50], "warning_count": len(warnings)}  # fmt: skip


def _clients_arg(value: str) -> int:
    if value == "1,2,4,8":  # the bench parser's default, made for `bench clients`
        return DEFAULT_CLIENTS
    if not value.isdigit():
        raise SystemExit(f"gpud bench soak: --clients takes one number (K), not {value!r}")
    return int(value)


def main(args: argparse.Namespace) -> int:
    backend = resolve(args.backend)
    model = getattr(args, "model", None) or ("qwen2.5-0.5b" if backend == "cuda" else "small")
    minutes = 0.5 if args.quick else float(getattr(args, "minutes", 30.0))
    sample_s = float(getattr(args, "sample_s", 10.0))
    k = _clients_arg(str(args.clients))
    activities = tuple(getattr(args, "activities", None) or ACTIVITIES)
    modes = tuple(getattr(args, "modes", None) or MODES)
    if not set(activities) <= set(ACTIVITIES) or not set(modes) <= set(MODES):
        raise SystemExit(f"gpud bench soak: --activities are some of {ACTIVITIES}, --modes some of {MODES}")
    config = CONFIGS[model]
    tokens = min(8, config.max_len - PROMPT)
    prefix = new_prefix().replace("decode/", "soak/")
    results: dict[str, Any] = {
        "benchmark": "soak",
        "host": platform.node(),
        "backend": backend,
        "model": model,
        "config": dataclasses.asdict(config),
        "clients": k,
        "minutes": minutes,
        "sample_s": sample_s,
        "tokens_per_decode": tokens,
        "activities_mixed": activities,
        "decode_modes": modes,
        "series": {name: {"unit": unit, "what": what} for name, (unit, what) in SERIES.items()},
    }
    failures: list[str] = []
    with daemon(backend) as (address, proc):
        results["daemon_pid"] = proc.pid
        results.update(asyncio.run(publish(address, model, prefix)))
        expected, lease = asyncio.run(_baseline(address, model, prefix, tokens))
        print(f"soak: {backend}, {model}, K={k}, {minutes:g} min, a sample every {sample_s:g} s; baseline decoded")
        samples = [sample(proc.pid, address, 0.0, None)]
        spec = Spec(address, model, prefix, 0, k, 0, tokens, expected, activities, modes)
        supervisor = Supervisor(spec, minutes * 60)
        supervisor.run(lambda t: samples.append(sample(proc.pid, address, t, samples[-1])), sample_s, proc)
        results.update(supervisor.report())
        failures += supervisor.failures()
        if proc.poll() is None:
            idle = _wait_until(address, lambda s: s["session_count"] == 0, 4 * lease + SETTLE_S)
            results["after_clients"] = _held(idle)
            results["after_clients_sample"] = sample(proc.pid, address, supervisor.elapsed(), samples[-1])
            asyncio.run(unpublish(address, model, prefix))
            end = _wait_until(address, lambda s: not any(_held(s).values()), SETTLE_S)
            results["end_state"] = _held(end)
            if any(results["end_state"].values()):
                failures.append(f"the daemon still holds {results['end_state']} with every client gone")
            proc.send_signal(signal.SIGTERM)  # and read its log once it exited: its shutdown is part of it
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            if proc.returncode != 0:
                failures.append(f"the daemon's shutdown: exit status {proc.returncode}")
        else:
            failures.append(f"the daemon exited during the soak (status {proc.returncode})")
        results["daemon_log"] = _daemon_log(address)
        if results["daemon_log"].get("error_count"):
            failures.append(f"{results['daemon_log']['error_count']} ERROR line(s) or traceback(s) in the daemon's log")
    results["samples"] = samples
    results["summary"] = summary(samples)
    results["failures"] = failures
    results["passed"] = not failures
    _print_summary(results)
    write_json(args.json, results)
    plot = getattr(args, "plot", None)
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        plot.write_text(svg(results))
        print(f"wrote {plot}")
    return 0 if not failures else 1


def _print_summary(results: dict[str, Any]) -> None:
    print(f"\n{'series':<20} {'first':>14} {'last':>14} {'max':>14} {'slope/h (2nd half)':>20}")
    for name, row in results["summary"].items():
        cells = " ".join(f"{row[key]:>14.6g}" for key in ("first", "last", "max"))
        print(f"{name:<20} {cells} {row['slope_per_hour_second_half']:>20.6g}")
    print(f"activities: {results['activities']}")
    print(f"kills {results['kills']}, reconnects {results['reconnects']}, expected: {results['expected']}")
    for failure in results["failures"]:
        print(f"FAILED: {failure}")
    print("passed" if results["passed"] else "soak FAILED")

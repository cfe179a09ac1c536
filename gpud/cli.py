"""Command line: `gpud serve`, `gpud demo`, `gpud bench webgpu|cuda`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from gpud import __version__
from gpud.backends import BACKENDS
from gpud.config import Config


def _serve(args: argparse.Namespace) -> int:
    from gpud.server import AddressInUse, main_loop

    config = Config.load(
        args.config,
        address=args.address,
        backend=args.backend,
        insecure_tcp=args.insecure_tcp or None,
        curve_secret_key=args.curve_secret_key,
        flush_deadline_ms=args.flush_deadline_ms,
        max_dispatches_per_flush=args.max_dispatches_per_flush,
        lease_s=args.lease,
        event_loop=args.event_loop,
        trace=args.trace,
        busy_poll_us=args.busy_poll_us,
    )
    try:
        if args.profile is not None:
            import cProfile

            with cProfile.Profile() as profile:
                try:
                    return main_loop(config)
                finally:
                    profile.dump_stats(args.profile)
        return main_loop(config)
    except (AddressInUse, ValueError, OSError) as exc:
        logging.getLogger("gpud").error("%s", exc)
        return 2


def _demo(args: argparse.Namespace) -> int:
    from gpud.demo import run_demo

    return asyncio.run(run_demo(args.backend, args.steps, args.chain, args.size))


def _bench(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(f"gpud.bench.{args.which}")
    code: int = module.main(args)
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpud", description="gpud: share one GPU between many Python processes")
    parser.add_argument("--version", action="version", version=f"gpud {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the daemon")
    serve.add_argument("--address", help="ipc:// or tcp:// endpoint (default: GPUD_ADDRESS or the runtime dir)")
    serve.add_argument("--backend", choices=BACKENDS, help="default: auto (cuda if a CUDA device exists)")
    serve.add_argument("--config", type=Path, help="TOML file with a [gpud] table")
    serve.add_argument("--flush-deadline-ms", type=float, help="submit pending work after this long")
    serve.add_argument("--max-dispatches-per-flush", type=int, help="submit once this many dispatches are pending")
    serve.add_argument("--lease", type=float, help="seconds without a heartbeat before a session is ended")
    serve.add_argument("--event-loop", choices=("auto", "asyncio", "uvloop"), help="default: uvloop when installed")
    serve.add_argument("--busy-poll-us", type=float, help="poll for the next message this long before sleeping")
    serve.add_argument("--trace", action="store_true", default=None, help="stamp readback replies with daemon times")
    serve.add_argument("--profile", type=Path, help="write cProfile statistics here at exit (performance work)")
    serve.add_argument("--curve-secret-key", help="CURVE certificate file (zmq.auth) for tcp://")
    serve.add_argument("--insecure-tcp", action="store_true", help="allow tcp:// without CURVE (testing only)")
    serve.set_defaults(func=_serve)

    demo = sub.add_parser("demo", help="run a real client workload through a daemon and verify it")
    demo.add_argument("--backend", choices=BACKENDS, default="auto")
    demo.add_argument("--steps", type=int, default=50)
    demo.add_argument("--chain", type=int, default=100, help="dependent dispatches per step")
    demo.add_argument("--size", type=int, default=4096, help="elements per tensor")
    demo.set_defaults(func=_demo)

    bench = sub.add_parser("bench", help="benchmarks: gpud against in-process launches")
    bench.add_argument("which", choices=("webgpu", "cuda", "clients", "transport"))
    bench.add_argument("--json", type=Path, help="write the results here")
    bench.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    bench.add_argument("--backend", choices=BACKENDS, default="auto", help="clients, transport: the daemon's backend")
    bench.add_argument("--clients", default="1,2,4,8", help="clients: comma-separated process counts")
    bench.add_argument("--seconds", type=float, default=5.0, help="clients: measuring time per count")
    bench.set_defaults(func=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    code: int = args.func(args)
    return code

"""Command line: `gpud serve`, `gpud demo`, `gpud bench ...`.

Every setting of `serve` is a flag generated from `gpud.service.config.Config`; a configuration
or start-up problem is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import sys
from pathlib import Path

from gpud import __version__
from gpud.backends import BACKENDS

EXIT_CONFIG = 2
BENCHMARKS = ("webgpu", "cuda", "clients", "transport", "replay")


def _fail(message: str) -> int:
    print(f"gpud: {message}", file=sys.stderr)
    return EXIT_CONFIG


def _serve(args: argparse.Namespace) -> int:
    from gpud.backends import BackendUnavailable
    from gpud.service.config import Config, ConfigError, check, overrides_from_args
    from gpud.service.lifecycle import AddressInUse, run_loop
    from gpud.service.server import Server

    try:
        if args.check_config:
            if args.config is None:
                return _fail("--check-config needs --config FILE")
            print(check(args.config))
            return 0
        config = Config.load(args.config, **overrides_from_args(args))
    except ConfigError as exc:
        return _fail(str(exc))
    try:
        if args.profile is not None:
            import cProfile

            with cProfile.Profile() as profile:
                try:
                    return run_loop(Server(config).serve(), config.event_loop)
                finally:
                    profile.dump_stats(args.profile)
        return run_loop(Server(config).serve(), config.event_loop)
    except (AddressInUse, BackendUnavailable, ValueError, OSError, ImportError) as exc:
        return _fail(str(exc))


def _demo(args: argparse.Namespace) -> int:
    from gpud.testing.demo import run_demo

    return asyncio.run(run_demo(args.backend, args.steps, args.chain, args.size))


def _bench(args: argparse.Namespace) -> int:
    # The benchmarks live in the repository's benchmarks/ folder, not in the installed daemon.
    root = Path(__file__).resolve().parents[2]
    if not (root / "benchmarks" / "__init__.py").exists():
        return _fail("gpud bench runs from a checkout of the gpud repository (benchmarks/ is not installed)")
    sys.path.insert(0, str(root))
    module = importlib.import_module(f"benchmarks.{args.which}")
    code: int = module.main(args)
    return code


def build_parser() -> argparse.ArgumentParser:
    from gpud.service.config import add_arguments

    parser = argparse.ArgumentParser(prog="gpud", description="gpud: share the GPUs of a host between many processes")
    parser.add_argument("--version", action="version", version=f"gpud {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the daemon")
    serve.add_argument("--config", type=Path, help="TOML file with a [gpud] table (default: none)")
    serve.add_argument("--check-config", action="store_true", help="validate --config FILE and exit")
    serve.add_argument("--profile", type=Path, help="write cProfile statistics here at exit (performance work)")
    add_arguments(serve)
    serve.set_defaults(func=_serve)

    demo = sub.add_parser("demo", help="run a real client workload through a daemon and verify it")
    demo.add_argument("--backend", choices=BACKENDS, default="auto")
    demo.add_argument("--steps", type=int, default=50)
    demo.add_argument("--chain", type=int, default=100, help="dependent dispatches per step")
    demo.add_argument("--size", type=int, default=4096, help="elements per tensor")
    demo.set_defaults(func=_demo)

    bench = sub.add_parser("bench", help="benchmarks: gpud against in-process launches (from a checkout)")
    bench.add_argument("which", choices=BENCHMARKS)
    bench.add_argument("--json", type=Path, help="write the results here")
    bench.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    bench.add_argument("--backend", choices=BACKENDS, default="auto", help="clients, transport: the daemon's backend")
    bench.add_argument("--clients", default="1,2,4,8", help="clients: comma-separated process counts")
    bench.add_argument("--seconds", type=float, default=5.0, help="clients: measuring time per count")
    bench.add_argument("--devices", default="0", help="clients: the daemon's devices (all, or 0,1)")
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

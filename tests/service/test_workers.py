"""A process-per-device front's workers, without starting any: their sockets, their settings (the front's,
through the same validation as a config file) and which one is the least loaded."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gpud.service import workers
from gpud.service.config import Config
from gpud.service.workers import Worker


def test_a_worker_gets_the_fronts_settings_but_its_own_socket_and_device() -> None:
    config = Config.load(
        None,
        address="ipc:///tmp/gpud-test/gpud.sock",
        devices=[0, 2],
        process_per_device=True,
        lease_s=2.5,
        cache_dir=Path("/tmp/gpud-test/cache"),
        metrics_address="127.0.0.1:9464",
    )
    planned = workers.plan(config, [0, 2])
    assert [(w.number, w.ordinal, w.address) for w in planned] == [
        (0, 0, "ipc:///tmp/gpud-test/gpud.sock.dev0"),
        (1, 2, "ipc:///tmp/gpud-test/gpud.sock.dev1"),
    ]
    got = Config.from_values(workers.settings(config, planned[1]), "test")
    expected = dataclasses.replace(config, address=planned[1].address, devices=[2], metrics_address="")
    assert got == expected


def test_the_least_loaded_worker_counts_the_clients_sent_since_its_last_status() -> None:
    a, b = Worker(0, 0, "ipc:///a"), Worker(1, 1, "ipc:///b")
    a.status = {"session_count": 1, "devices": [{"memory_in_use": 0}]}
    b.status = {"session_count": 1, "devices": [{"memory_in_use": 4096}]}
    assert min([a, b], key=Worker.load) is a  # equal sessions: less memory in use
    a.redirects = 1  # sent there after its status was asked for
    assert min([a, b], key=Worker.load) is b
    a.counted = 1  # a later status counts it
    assert min([a, b], key=Worker.load) is a

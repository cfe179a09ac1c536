"""Operating the daemon: `gpud status`, `gpud stats`, the Prometheus endpoint, journald logs, the config file."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from support import axpb, run_axpb

import gpud_client
from gpud import __version__ as gpud_version
from gpud.service import admin, config, metrics
from gpud.service.logs import JournalFormatter
from gpud.testing import spawn

TENANT = textwrap.dedent(
    """
    import asyncio, sys
    import numpy as np
    import gpud_client

    async def main(address):
        async with gpud_client.connect(address, device=1) as gpu:
            w = gpu.tensor(np.ones(1024, dtype=np.float32))  # 4 KiB
            gpu.publish(w, "tenant/weights")
            await gpu.sync()
            print("ready", flush=True)
            await asyncio.to_thread(sys.stdin.readline)

    asyncio.run(main(sys.argv[1]))
    """
)


def _gpud(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpud", *args], capture_output=True, text=True, timeout=60, env=env)


async def test_status_lists_devices_sessions_residents_and_health(tmp_path: Path) -> None:
    script = tmp_path / "tenant-a.py"
    script.write_text(TENANT)
    with spawn.daemon("fake") as (address, proc):
        tenant = await asyncio.create_subprocess_exec(
            sys.executable, str(script), address, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        assert tenant.stdin is not None and tenant.stdout is not None
        try:
            with anyio.fail_after(30):
                assert (await tenant.stdout.readline()).strip() == b"ready"
            result = await asyncio.to_thread(_gpud, "status", "--address", address, "--json")
            assert result.returncode == 0, result.stderr
            status = json.loads(result.stdout)
            assert status["version"] == gpud_version
            assert status["backend"] == "fake" and status["state"] == "serving" and status["pid"] == proc.pid
            assert status["health"] == {"healthy": True, "problems": [], "stall_s": 30.0}
            assert [d["index"] for d in status["devices"]] == [0, 1]
            assert status["gil_switch_us"] == 500.0  # two devices: each one's threads get the GIL back sooner
            assert status["devices"][1]["memory_in_use"] == 4096
            assert status["devices"][1]["memory_total"] == 1 << 30
            (session,) = status["sessions"]
            assert session["client"] == "tenant-a.py" and session["pid"] == tenant.pid
            assert session["device"] == 1 and session["memory_bytes"] == 4096 and session["handles"] == 1
            (resident,) = status["residents"]
            assert resident["name"] == "tenant/weights" and resident["nbytes"] == 4096 and resident["device"] == 1
            assert resident["mode"] == "ro" and resident["publisher"] == f"tenant-a.py (pid {tenant.pid})"
            assert status["graph_count"] == 0 and status["graphs"] == []

            text = (await asyncio.to_thread(_gpud, "status", "--address", address)).stdout
            assert "health: healthy" in text and "tenant-a.py (pid" in text and "tenant/weights" in text
            assert re.search(r"\[1\] fake device 1 \(fake\): memory 4\.0 KiB of 1\.0 GiB in use", text), text
        finally:
            tenant.stdin.write(b"\n")
            await tenant.wait()


async def test_stats_counts_ops_flushes_pools_and_readback_latency() -> None:
    with spawn.daemon("fake") as (address, _proc):
        async with gpud_client.connect(address, device=0) as gpu:
            k = await axpb(gpu)
            x, y = gpu.tensor(np.arange(512, dtype=np.float32)), gpu.empty(512)
            for _ in range(5):
                run_axpb(gpu, k, x, y, 2.0, 1.0)
                await y.numpy()
        status = await asyncio.to_thread(admin.query, address)
        counters = status["counters"]
        assert counters["ops"] >= 13 and counters["batches"] >= 5 and counters["sessions_opened"] >= 1
        device = status["devices"][0]
        c = device["counters"]
        assert c["dispatches"] == 5 and c["flushes"] >= 5 and c["completed"] == c["submitted"]
        assert c["download_staging_misses"] >= 1 and c["download_staging_hits"] >= 3
        assert c["kernel_cache_misses"] >= 1 and c["kernel_cache_evictions"] == 0
        assert set(device["readback_latency_s"]) == {"0.5", "0.9", "0.99"}
        assert 0 < device["readback_latency_s"]["0.5"] < 5
        result = await asyncio.to_thread(_gpud, "stats", "--address", address)
        assert result.returncode == 0, result.stderr
        assert "dispatches 5" in result.stdout and "readback latency" in result.stdout and "p50 " in result.stdout
        assert "downloads " in result.stdout and "kernel cache:" in result.stdout


async def test_one_device_gets_the_gil_switch_interval_too() -> None:
    # A loop thread polling the rings holds the GIL; wgpu's poll thread and the completion threads
    # report only once they get it back, so one device needs the short interval as several do.
    with spawn.daemon("fake", extra_args=("--devices", "0", "--gil-switch-us", "250")) as (address, _proc):
        status = await asyncio.to_thread(admin.query, address)
    assert len(status["devices"]) == 1 and status["gil_switch_us"] == 250.0


def test_status_of_nothing_is_one_line_and_exit_1(tmp_path: Path) -> None:
    result = _gpud("status", "--address", f"ipc://{tmp_path}/none.sock")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "no daemon at" in result.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_the_prometheus_endpoint_serves_counters_and_device_gauges() -> None:
    port = _free_port()
    with spawn.daemon("fake", extra_args=("--metrics-address", f"127.0.0.1:{port}")) as (_address, _proc):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = response.read().decode()
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
    samples = _parse(text)
    assert samples[("gpud_up", ())] == 1 and samples[("gpud_ops_total", ())] == 0
    assert samples[("gpud_device_memory_total_bytes", (("device", "1"),))] == 1 << 30
    assert samples[("gpud_device_staging_misses_total", (("device", "0"), ("pool", "upload")))] == 0
    assert "# TYPE gpud_device_flushes_total counter" in text


def test_a_metrics_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _gpud(
            "serve", "--no-config", "--backend", "fake", "--address", f"ipc://{tmp_path}/g.sock",
            "--metrics-address", f"127.0.0.1:{port}",
        )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"gpud: metrics_address 127.0.0.1:{port}: ")


def _parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    parser = pytest.importorskip("prometheus_client.parser")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in parser.text_string_to_metric_families(text)
        for sample in family.samples
    }


def _snapshot() -> dict[str, Any]:
    device = {
        "index": 0,
        "memory_in_use": 4096,
        "memory_total": 1 << 30,
        "in_flight": 1,
        "stalled_s": 0.25,
        "counters": {"dispatches": 7, "upload_staging_hits": 3},
        "readback_latency_s": {"0.5": 0.001, "0.99": 0.01},
    }
    return {
        "version": "0.1.0",
        "backend": 'fa"ke',
        "state": "serving",
        "uptime_s": 12.5,
        "health": {"healthy": False},
        "devices": [device],
        "session_count": 2,
        "resident_count": 0,
        "residents": [],
        "graph_count": 0,
        "counters": {"ops": 42},
    }


def test_the_builtin_renderer_writes_what_prometheus_parses() -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    text = metrics.render_builtin(metrics.families(_snapshot())).decode()
    parsed = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in parser.text_string_to_metric_families(text)
        for s in f.samples
    }
    assert parsed[("gpud_ops_total", ())] == 42
    assert parsed[("gpud_healthy", ())] == 0 and parsed[("gpud_sessions", ())] == 2
    assert parsed[("gpud_info", (("backend", 'fa"ke'), ("version", "0.1.0")))] == 1
    assert parsed[("gpud_device_dispatches_total", (("device", "0"),))] == 7
    assert parsed[("gpud_device_staging_hits_total", (("device", "0"), ("pool", "upload")))] == 3
    assert parsed[("gpud_device_readback_latency_seconds", (("device", "0"), ("quantile", "0.99")))] == 0.01
    # prometheus-client renders the same samples
    other = metrics.render_prometheus_client(metrics.families(_snapshot())).decode()
    reparsed = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in parser.text_string_to_metric_families(other)
        for s in f.samples
    }
    assert reparsed == parsed


def test_journal_formatter_uses_priority_prefixes_and_no_time() -> None:
    import logging

    formatter = JournalFormatter("%(name)s: %(message)s")
    for level, prefix in (
        (logging.ERROR, "<3>"),
        (logging.WARNING, "<4>"),
        (logging.INFO, "<6>"),
        (logging.DEBUG, "<7>"),
    ):
        record = logging.LogRecord("gpud.x", level, __file__, 1, "one\ntwo", None, None)
        assert formatter.format(record) == f"{prefix}gpud.x: one\n{prefix}two"


async def test_under_journald_lines_have_priorities_and_sessions_are_logged(tmp_path: Path) -> None:
    log_path = tmp_path / "journal.txt"
    listener = spawn.NotifyListener(tmp_path / "notify.sock")
    try:
        with open(log_path, "w") as log:
            st = os.fstat(log.fileno())
            env = {**os.environ, "NOTIFY_SOCKET": str(listener.path), "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
            address = f"ipc://{tmp_path}/g.sock"
            cmd = [sys.executable, "-m", "gpud", "serve", "--no-config", "--backend", "fake", "--address", address]
            proc = subprocess.Popen(cmd, stderr=log, stdout=subprocess.DEVNULL, env=env)
        try:
            await asyncio.to_thread(listener.wait_for, "READY", 60.0, proc)
            async with gpud_client.connect(address):
                pass
            for _ in range(200):  # the bye is handled after the client has gone: wait for its line
                if "ended after" in log_path.read_text():
                    break
                await asyncio.sleep(0.05)
        finally:
            proc.terminate()
            await asyncio.to_thread(proc.wait, 20)
    finally:
        listener.close()
    lines = log_path.read_text().splitlines()
    assert lines and all(re.match(r"<[0-7]>", line) for line in lines), lines
    assert not any(re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", line) for line in lines), "journald adds the time"
    text = "\n".join(lines)
    name = Path(sys.argv[0]).name
    assert re.search(
        rf"^<6>gpud\.service\.registry: session \w+ opened by {re.escape(name)} \(pid {os.getpid()}\)", text, re.M
    )
    assert re.search(
        rf"^<6>gpud\.service\.registry: session \w+ of {re.escape(name)} \(pid {os.getpid()}\) ended after", text, re.M
    )
    assert re.search(r"^<6>gpud\.service\.server: gpud .* serving ipc://", text, re.M)


def test_the_system_config_is_read_by_root_and_under_systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gpud.toml"
    monkeypatch.setattr(config, "SYSTEM_CONFIG", path)
    assert config.default_config_path({}, 0) is None  # absent
    path.write_text("[gpud]\nlease_s = 2.0\n")
    assert config.default_config_path({}, 0) == path
    assert config.default_config_path({"INVOCATION_ID": "abc"}, 1000) == path
    assert config.default_config_path({}, 1000) is None


def test_check_config(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text("[gpud]\nlease_s = 2.0\n[gpud.limits]\nmax_args = 16\n")
    result = _gpud("serve", "--check-config", "--config", str(good))
    assert (
        result.returncode == 0 and "valid; sets 2 of" in result.stdout and "lease_s, limits.max_args" in result.stdout
    )
    bad = tmp_path / "bad.toml"
    bad.write_text("[gpud]\nlease_s = true\n")
    result = _gpud("serve", "--check-config", "--config", str(bad))
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "lease_s: expected a number" in result.stderr and "Traceback" not in result.stderr
    shipped = Path(__file__).resolve().parents[2] / "systemd" / "gpud.toml"
    assert _gpud("serve", "--check-config", "--config", str(shipped)).returncode == 0


def test_a_flag_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gpud.toml"
    path.write_text("[gpud]\nlease_s = 2.0\nhealth_stall_s = 9.0\n")
    loaded = config.Config.load(path, lease_s=3.0)  # as `gpud serve --config FILE --lease-s 3`
    assert loaded.lease_s == 3.0 and loaded.health_stall_s == 9.0


async def test_webgpu_devices_count_bind_group_hits_and_misses() -> None:
    with spawn.daemon("webgpu", extra_args=("--devices", "0")) as (address, _proc):
        async with gpud_client.connect(address) as gpu:
            k = await axpb(gpu)
            x, y = gpu.tensor(np.arange(64, dtype=np.float32)), gpu.empty(64)
            for _ in range(3):
                run_axpb(gpu, k, x, y, 2.0, 1.0)
                await y.numpy()
        counters = (await asyncio.to_thread(admin.query, address))["devices"][0]["counters"]
    assert counters["bind_group_misses"] >= 1 and counters["bind_group_hits"] >= 1
    assert counters["bind_group_evictions"] == 0

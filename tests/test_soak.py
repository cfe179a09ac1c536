"""`gpud bench soak`: a short run end to end on lavapipe, and its summary and plot on made-up samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import benchmark

ROOT = Path(__file__).resolve().parents[1]
ACTIVITIES = {"decode", "ops", "replay", "publish", "open"}


def test_a_short_soak_kills_clients_checks_everything_and_leaves_nothing_held(tmp_path: Path) -> None:
    """Two clients for 6 s (a kill every 1.5 to 4.5 s), the tiny model: every check passes, the killed
    clients' replacements connect, and once the run's names are unpublished the daemon holds nothing."""
    out, plot = tmp_path / "soak.json", tmp_path / "soak.svg"
    cmd = [sys.executable, "-m", "gpud", "bench", "soak", "--backend", "webgpu", "--clients", "2", "--config", "tiny"]
    cmd += ["--minutes", "0.1", "--sample-s", "1.5", "--json", str(out), "--plot", str(plot)]
    # A short lease: the killed clients' sessions end sooner, and the run with them.
    env = {**os.environ, "GPUD_CACHE_DIR": str(tmp_path / "cache"), "GPUD_DAEMON_ARGS": "--lease 2"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    results = json.loads(out.read_text())
    assert results["passed"] and not results["errors"] and not results["failures"]
    assert results["model"] == "tiny" and results["clients"] == 2
    assert set(results["activities"]) == ACTIVITIES
    assert results["kills"] >= 1
    assert results["end_state"] == dict.fromkeys(results["end_state"], 0)
    assert len(results["samples"]) >= 4
    assert {"rss_bytes", "fds", "threads", "memory_in_use", "live_buffers", "handles"} <= set(results["summary"])
    assert plot.read_text().startswith("<svg")


def test_summary_gives_the_slope_per_hour_of_the_second_half() -> None:
    """Flat, then growing by 2 per second from the middle on: the second half's slope is 7,200 per hour."""
    samples = [{"t_s": float(t), "fds": 10.0 if t < 50 else 10.0 + 2 * (t - 50)} for t in range(0, 101, 10)]
    summary = benchmark("soak_samples").summary
    row = summary(samples)["fds"]
    assert row["first"] == 10.0 and row["last"] == 110.0 and row["max"] == 110.0 and row["min"] == 10.0
    assert row["slope_per_hour_second_half"] == pytest.approx(7200.0)
    assert "rss_bytes" not in summary(samples)  # not sampled: not summarised


def test_the_plot_draws_a_panel_per_sampled_series_and_marks_the_kills() -> None:
    samples = [{"t_s": float(t), "rss_bytes": 1e8, "sessions": 3.0} for t in range(0, 60, 10)]
    series = benchmark("soak_samples").SERIES
    results = {
        "backend": "webgpu",
        "model": "tiny",
        "clients": 3,
        "passed": True,
        "series": {name: {"unit": unit, "what": what} for name, (unit, what) in series.items()},
        "samples": samples,
        "kill_log": [{"t_s": 25.0, "slot": 1, "generation": 0}],
    }
    drawing = benchmark("soak_plot").svg(results)
    assert drawing.count("<polyline") == 2
    assert "rss_bytes: last 95.37 MiB" in drawing and "sessions: last 3" in drawing
    assert drawing.count('stroke="#d6604d"') == 2  # the kill, in each panel

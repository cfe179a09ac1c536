"""`gpud demo` end to end: it starts a daemon of its own and checks its results against numpy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_demo_starts_its_own_daemon_and_matches_numpy(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "GPUD_ADDRESS": f"ipc://{tmp_path}/no-daemon-here.sock",  # nothing answers: the demo starts one
        "GPUD_CACHE_DIR": str(tmp_path / "cache"),
        "XDG_RUNTIME_DIR": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, "-m", "gpud", "demo", "--clients", "1", "--tokens", "2", "--model", "tiny"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "all match" in result.stdout, output
    assert not (tmp_path / "no-daemon-here.sock").exists()

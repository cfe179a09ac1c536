"""What the cuda backend needs at run time, and what the daemon says when it is missing.

cuda-python's bindings do not bring NVRTC; without it `--backend cuda` is one line and exit 2, and
`--backend auto` says in its log why it serves webgpu instead. A stand-in `cuda.bindings` package
(a driver that reports one device, an NVRTC that cannot load) plays the machine that has the
bindings but lacks the NVRTC wheel.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpud.testing import spawn

DRIVER = """
class CUresult:
    CUDA_SUCCESS = 0

def cuInit(flags):
    return (0,)

def cuDeviceGetCount():
    return (0, 1)
"""

NVRTC = """
def nvrtcVersion():
    raise RuntimeError("Failed to dlopen libnvrtc.so.12")
"""


def _bindings_without_nvrtc(root: Path) -> dict[str, str]:
    package = root / "cuda" / "bindings"
    package.mkdir(parents=True)
    (root / "cuda" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "driver.py").write_text(DRIVER)
    (package / "nvrtc.py").write_text(NVRTC)
    return {**os.environ, "PYTHONPATH": str(root)}


def test_cuda_without_nvrtc_is_one_line_naming_it(tmp_path: Path) -> None:
    env = _bindings_without_nvrtc(tmp_path / "site")
    cmd = [sys.executable, "-m", "gpud", "serve", "--no-config", "--address", f"ipc://{tmp_path}/g.sock"]
    result = subprocess.run([*cmd, "--backend", "cuda"], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("gpud: the cuda backend cannot run: NVRTC is missing")
    assert "libnvrtc.so.12" in line and "nvidia-cuda-nvrtc" in line


def test_auto_says_why_it_serves_webgpu(tmp_path: Path) -> None:
    pytest.importorskip("wgpu")
    env = _bindings_without_nvrtc(tmp_path / "site")
    with spawn.daemon("auto", env={"PYTHONPATH": env["PYTHONPATH"]}) as (address, proc):
        assert spawn.answers(address)
        proc.terminate()
        proc.wait(30)
        log = Path(address.removeprefix("ipc://")).with_name("daemon.log").read_text()
    assert "backend auto: using webgpu because the cuda backend cannot run: NVRTC is missing" in log, log


def test_a_daemon_without_xdg_runtime_dir_logs_no_driver_complaint() -> None:
    """Regression: started as root without XDG_RUNTIME_DIR, the daemon's log began with Mesa's
    "error: XDG_RUNTIME_DIR is invalid or not set in the environment." four times."""
    pytest.importorskip("wgpu")
    with spawn.daemon("webgpu", env={"XDG_RUNTIME_DIR": None}) as (address, proc):
        assert spawn.answers(address)
        proc.terminate()
        proc.wait(30)
        log = Path(address.removeprefix("ipc://")).with_name("daemon.log").read_text()
    assert "XDG_RUNTIME_DIR" not in log, log


def _shell_function(name: str, path_prefix: Path | None = None) -> int:
    """Run one function of scripts/dev on its own (no set-up happens)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "dev"
    text = script.read_text()
    start = text.index(f"{name}() {{")
    body = text[start : text.index("\n}\n", start) + 3]
    env = {**os.environ, "PATH": f"{path_prefix}:{os.environ['PATH']}" if path_prefix else os.environ["PATH"]}
    return subprocess.run(["bash", "-c", f"set -euo pipefail\n{body}\n{name}"], env=env, timeout=30).returncode


def test_scripts_dev_finds_an_nvidia_gpu_by_nvidia_smi(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    assert _shell_function("have_nvidia_gpu", fake) == 0
    if not (Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia").exists()):
        smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
        assert _shell_function("have_nvidia_gpu", fake) != 0  # no GPU: no cuda extra

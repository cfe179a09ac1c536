"""The client must install and import without the GPU packages."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_client_and_protocol_depend_on_no_gpu_package() -> None:
    for project in ("client", "protocol"):
        meta = tomllib.loads((ROOT / project / "pyproject.toml").read_text())["project"]
        deps = " ".join(meta["dependencies"]).lower()
        assert "wgpu" not in deps and "cuda" not in deps, (project, deps)


def test_importing_the_client_loads_no_gpu_module() -> None:
    code = (
        "import sys, gpud_client; bad = {'wgpu', 'cuda', 'gpud'} & {m.split('.')[0] for m in sys.modules}; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "set()"


# ------------------------------------------------------------------ licenses, wheels, installing the client

PROJECTS = {"gpud": ROOT, "gpud-client": ROOT / "client", "gpud-protocol": ROOT / "protocol"}
IGNORE = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".venv", "*.pyc")


def test_every_package_is_apache_2_with_the_full_license_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.strip().startswith("Apache License") and "END OF TERMS AND CONDITIONS" in text and len(text) > 10_000
    for name, folder in PROJECTS.items():
        meta = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"], name
        assert (folder / "LICENSE").read_text() == text, name


def test_the_cuda_extra_pairs_bindings_and_nvrtc_of_one_cuda_major() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["cuda"] == ["cuda-bindings>=12.6,<13", "nvidia-cuda-nvrtc-cu12>=12.6,<13"]
    assert extras["cuda13"] == ["cuda-bindings>=13,<14", "nvidia-cuda-nvrtc>=13,<14"]
    assert any(dep.startswith("prometheus-client") for dep in extras["metrics"])


def _staged(tmp: Path, name: str) -> Path:
    """A copy of a project (never build in the shared checkout: build/ and egg-info would race)."""
    folder = PROJECTS[name]
    target = tmp / name
    if name == "gpud":
        target.mkdir()
        for item in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copy(folder / item, target / item)
        shutil.copytree(folder / "gpud", target / "gpud", ignore=IGNORE)
    else:
        shutil.copytree(folder, target, ignore=IGNORE)
    return target


def test_the_three_wheels_build_offline_with_licenses_and_the_op_sources(tmp_path: Path) -> None:
    pytest.importorskip("build")
    out = tmp_path / "dist"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "build",
                "--wheel",
                "--no-isolation",
                "--outdir",
                str(out),
                str(_staged(tmp_path, n)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for n in PROJECTS
    ]
    for proc in procs:
        output, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, output[-3000:]
    wheels = {p.name.split("-")[0]: p for p in out.glob("*.whl")}
    assert set(wheels) == {"gpud", "gpud_client", "gpud_protocol"}
    for wheel in wheels.values():
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
            assert "License-Expression: Apache-2.0" in meta, wheel.name
            assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), wheel.name
    with zipfile.ZipFile(wheels["gpud"]) as z:
        inside = set(z.namelist())
    ops = [p.name for p in (ROOT / "gpud" / "ops").iterdir() if p.suffix in (".cu", ".wgsl")]
    assert ops and {f"gpud/ops/{name}" for name in ops} <= inside
    assert "gpud/testing/data/minilm-reference.npz" in inside  # `gpud demo embed` checks against it
    assert "gpud/service/units.py" in inside and not any(n.startswith(("tests/", "benchmarks/")) for n in inside)


def _fresh_venv(tmp: Path) -> Path:
    """A venv without network access to anything: the client's third-party dependencies (and
    setuptools, to build) come from this environment through a .pth file, gpud's own packages do not."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    deps = tmp / "deps"
    deps.mkdir()
    for name in ("msgpack", "pyzmq", "anyio", "idna", "sniffio", "numpy", "typing_extensions", "setuptools"):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        base = Path(str(dist.locate_file("")))
        for top in {Path(str(f)).parts[0] for f in dist.files or ()}:
            if not top.startswith("..") and not (deps / top).exists() and (base / top).exists():
                (deps / top).symlink_to(base / top)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "_deps.pth").write_text(f"{deps}\n")
    return python


def test_pip_install_protocol_and_client_in_one_command_in_a_fresh_venv(tmp_path: Path) -> None:
    """The documented install of the client alone: `pip install ./protocol ./client` (gpud-protocol is
    not on PyPI; one pip command resolves the client's dependency from the folder beside it)."""
    python = _fresh_venv(tmp_path)
    protocol, client = _staged(tmp_path, "gpud-protocol"), _staged(tmp_path, "gpud-client")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index", "--no-build-isolation"]
    alone = subprocess.run([*pip, str(client)], capture_output=True, text=True, timeout=120)
    assert alone.returncode != 0 and "gpud-protocol==0.1.0" in alone.stderr
    both = subprocess.run([*pip, str(protocol), str(client)], capture_output=True, text=True, timeout=120)
    assert both.returncode == 0, both.stderr[-3000:]
    code = "import gpud_client, gpud_protocol, sys; print(gpud_client.__file__); print('gpud' in sys.modules)"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    where, imported_daemon = out.splitlines()
    assert where.startswith(str(tmp_path / "venv")) and imported_daemon == "False"

"""The client must install and import without the GPU packages."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

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

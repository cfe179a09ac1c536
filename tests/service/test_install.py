"""`gpud install-service`: the documented one-command install, idempotent, with --dry-run and --root."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpud.service import install, units
from gpud.service.config_example import render_defaults

EXEC = Path("/opt/gpud/.venv/bin/gpud")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpud", "install-service", *args], capture_output=True, text=True, timeout=60
    )


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    result = _cli("--root", str(tmp_path), "--prefix", "/opt/gpud", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert list(tmp_path.iterdir()) == []
    out = result.stdout
    for relative in (*units.PLACES.values(), install.CONFIG):
        assert f"would write {tmp_path / relative} (new)" in out
    if shutil.which("systemd-sysusers"):
        assert f"would run: systemd-sysusers --root={tmp_path} {tmp_path}/etc/sysusers.d/gpud.conf" in out
    assert "systemctl" not in out  # another root: never the running system's systemd


def test_install_into_a_root_then_again_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    result = _cli("--root", str(tmp_path), "--prefix", "/opt/gpud")
    assert result.returncode == 0, result.stdout + result.stderr
    unit = (tmp_path / "etc/systemd/system/gpud.service").read_text()
    assert "\nExecStart=/opt/gpud/.venv/bin/gpud serve\n" in unit
    assert unit == units.render(EXEC)["gpud.service"]
    assert (tmp_path / "etc/systemd/system/gpud-nvidia-uvm.service").exists()
    assert (tmp_path / "etc/sysusers.d/gpud.conf").read_text() == units.SYSUSERS
    assert (tmp_path / "etc/tmpfiles.d/gpud.conf").read_text() == units.TMPFILES
    assert (tmp_path / "etc/gpud/gpud.toml").read_text() == render_defaults()
    assert stat.S_IMODE((tmp_path / "etc/systemd/system/gpud.service").stat().st_mode) == 0o644
    if shutil.which("systemd-sysusers"):  # ran with --root: the user and group exist in that root only
        assert any(line.startswith("gpud:") for line in (tmp_path / "etc/passwd").read_text().splitlines())
        group = (tmp_path / "etc/group").read_text()
        assert any(line.startswith("gpud:") for line in group.splitlines())
        assert any(line.startswith("render:") and "gpud" in line for line in group.splitlines())
    if shutil.which("systemd-tmpfiles") and shutil.which("systemd-sysusers"):
        run = tmp_path / "run" / "gpud"
        assert run.is_dir() and stat.S_IMODE(run.stat().st_mode) == 0o750

    config = tmp_path / "etc/gpud/gpud.toml"
    config.write_text("[gpud]\nlease_s = 2.0\n")  # the operator's edit
    again = _cli("--root", str(tmp_path), "--prefix", "/opt/gpud")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "wrote" not in again.stdout and f"unchanged {tmp_path}/etc/systemd/system/gpud.service" in again.stdout
    assert config.read_text() == "[gpud]\nlease_s = 2.0\n" and "never overwritten" in again.stdout

    moved = _cli("--root", str(tmp_path), "--exec", "/usr/local/bin/gpud")  # a new ExecStart: rewritten
    assert f"wrote {tmp_path}/etc/systemd/system/gpud.service (changed)" in moved.stdout
    assert "\nExecStart=/usr/local/bin/gpud serve\n" in (tmp_path / "etc/systemd/system/gpud.service").read_text()


def test_the_live_system_plan_reloads_systemd_and_can_enable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a run as root on a real host would do (planned, not applied)."""
    have = {"systemd-sysusers", "systemd-tmpfiles", "systemctl"}
    plan = install.plan(Path("/"), EXEC, enable=True, which=lambda n: n if n in have else None, systemd_running=True)
    commands = [" ".join(c) for c in plan.commands]
    assert commands == [
        "systemd-sysusers /etc/sysusers.d/gpud.conf",
        "systemd-tmpfiles --create /etc/tmpfiles.d/gpud.conf",
        "systemctl daemon-reload",
        "systemctl enable --now gpud.service",
    ]
    bare = install.plan(Path("/"), EXEC, which=lambda n: None, systemd_running=False)
    assert bare.commands == [] and any("systemd-sysusers" in note for note in bare.notes)
    shadow = install.plan(Path("/"), EXEC, which=lambda n: n if n in ("groupadd", "useradd") else None)
    assert any("useradd --system" in " ".join(c) for c in shadow.commands)


def test_a_home_directory_install_is_warned_about(tmp_path: Path) -> None:
    home_exec = Path("/home/alice/gpud/.venv/bin/gpud")
    plan = install.plan(tmp_path, home_exec, which=lambda n: None)
    assert any("does not exist" in note for note in plan.notes)
    with pytest.raises(ValueError, match="absolute path without spaces"):
        install.plan(tmp_path, Path("/opt/my gpud/bin/gpud"))

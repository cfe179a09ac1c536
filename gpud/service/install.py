"""`gpud install-service`: install gpud as a systemd service, idempotently.

It writes the unit files, the sysusers.d and tmpfiles.d snippets and (only if absent)
/etc/gpud/gpud.toml, then runs `systemd-sysusers`, `systemd-tmpfiles --create` and
`systemctl daemon-reload` where they exist (`--enable` also `systemctl enable --now gpud`). Run it
again after an upgrade: unchanged files are left alone, and the config file is never overwritten.
`--dry-run` prints what it would do; `--root DIR` installs into another root (a package's staging
directory, an image, a test), where the tools run with `--root` and systemctl is not called.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpud.service import units
from gpud.service.config_example import render_defaults

CONFIG = "etc/gpud/gpud.toml"


@dataclass
class Plan:
    root: Path
    gpud_exec: Path
    writes: list[tuple[Path, str, str]] = field(default_factory=list)  # (path, content, "new" | "changed")
    unchanged: list[Path] = field(default_factory=list)
    commands: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def default_exec(prefix: Path | None) -> Path:
    """`PREFIX/.venv/bin/gpud`, else the gpud script of the running installation."""
    if prefix is not None:
        return prefix / ".venv" / "bin" / "gpud"
    beside = Path(sys.executable).parent / "gpud"
    if beside.exists():
        return beside.absolute()
    found = shutil.which("gpud")
    return Path(found).absolute() if found else beside.absolute()


def _readme(gpud_exec: Path) -> Path | None:
    """The README of the checkout the daemon runs from (PREFIX/README.md), if there is one."""
    if gpud_exec.parent.name == "bin" and gpud_exec.parent.parent.name == ".venv":
        candidate = gpud_exec.parent.parent.parent / "README.md"
        return candidate if candidate.exists() else None
    return None


def plan(
    root: Path = Path("/"),
    gpud_exec: Path | None = None,
    enable: bool = False,
    which: Callable[[str], str | None] = shutil.which,
    systemd_running: bool | None = None,
) -> Plan:
    gpud_exec = gpud_exec or default_exec(None)
    result = Plan(root, gpud_exec)
    readme = _readme(gpud_exec)
    files = units.render(gpud_exec, readme)
    for name, relative in units.PLACES.items():
        _want(result, root / relative, files[name])
    config = root / CONFIG
    if config.exists():
        result.notes.append(f"kept {config} (never overwritten; `gpud serve --check-config` checks it)")
    else:
        result.writes.append((config, render_defaults(), "new"))
    _check_exec(result, gpud_exec)

    live = root.resolve() == Path("/")
    sysusers = root / units.PLACES["gpud.sysusers"]
    tmpfiles = root / units.PLACES["gpud.tmpfiles"]
    prefix = [] if live else [f"--root={root}"]
    if which("systemd-sysusers"):
        result.commands.append(["systemd-sysusers", *prefix, str(sysusers)])
    elif live and which("groupadd") and which("useradd"):
        result.commands += _useradd()
    else:
        result.notes.append("no systemd-sysusers: create the gpud user and group yourself")
    if which("systemd-tmpfiles"):
        result.commands.append(["systemd-tmpfiles", *prefix, "--create", str(tmpfiles)])
    else:
        result.notes.append("no systemd-tmpfiles: the unit's RuntimeDirectory= makes /run/gpud when it starts")
    if systemd_running is None:
        systemd_running = Path("/run/systemd/system").is_dir()
    if live and which("systemctl") and systemd_running:
        result.commands.append(["systemctl", "daemon-reload"])
        if enable:
            result.commands.append(["systemctl", "enable", "--now", "gpud.service"])
    elif live:
        result.notes.append("systemd is not running here: no daemon-reload (start gpud with `gpud serve` instead)")
    if not enable and live:
        result.notes.append("next: systemctl enable --now gpud; let users in: usermod -aG gpud NAME")
    return result


def _want(result: Plan, path: Path, content: str) -> None:
    try:
        current = path.read_text()
    except FileNotFoundError:
        result.writes.append((path, content, "new"))
        return
    if current == content:
        result.unchanged.append(path)
    else:
        result.writes.append((path, content, "changed"))


def _useradd() -> list[list[str]]:
    """Where sysusers is missing: the same user and group with shadow-utils (skipped if they exist)."""
    nologin = "/usr/sbin/nologin" if Path("/usr/sbin/nologin").exists() else "/bin/false"
    return [
        ["sh", "-c", "getent group gpud >/dev/null || groupadd --system gpud"],
        [
            "sh",
            "-c",
            "getent passwd gpud >/dev/null || useradd --system --gid gpud --groups video "
            f"--home-dir /var/lib/gpud --no-create-home --shell {nologin} gpud",
        ],
    ]


def _check_exec(result: Plan, gpud_exec: Path) -> None:
    if not gpud_exec.exists():
        result.notes.append(f"warning: {gpud_exec} does not exist yet; the unit's ExecStart= names it")
        return
    for path in (gpud_exec, Path(os.path.realpath(sys.executable))):
        if str(path).startswith(("/home/", "/root/", "/run/user/")):
            result.notes.append(
                f"warning: {path} is under a home directory, which ProtectHome=yes hides from the service: "
                "install gpud under /opt (e.g. a checkout at /opt/gpud with its .venv)"
            )


def describe(p: Plan) -> list[str]:
    lines = [f"would write {path} ({how})" for path, _, how in p.writes]
    lines += [f"unchanged {path}" for path in p.unchanged]
    lines += ["would run: " + " ".join(command) for command in p.commands]
    return lines + p.notes


def apply(p: Plan, out: Callable[[str], None] = print) -> int:
    """Write the files and run the commands; 0, or the exit status of the first command that failed."""
    for path, content, how in p.writes:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".gpud-new")
        tmp.write_text(content)
        tmp.chmod(0o644)
        tmp.replace(path)
        out(f"wrote {path} ({how})")
    for path in p.unchanged:
        out(f"unchanged {path}")
    for command in p.commands:
        out("running: " + " ".join(command))
        result = subprocess.run(command, check=False)
        if result.returncode != 0:
            out(f"gpud: `{' '.join(command)}` failed with exit status {result.returncode}")
            return result.returncode
    for note in p.notes:
        out(note)
    return 0

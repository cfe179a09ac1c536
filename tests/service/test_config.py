"""gpud.service.config: one definition of the settings gives file validation, flags and the shipped file."""

from __future__ import annotations

import argparse
import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from gpud.service.config import Config, ConfigError, check
from gpud.service.config_example import LIMITS_HELP, render_defaults
from gpud.service.config_flags import add_arguments, overrides_from_args
from gpud_protocol import Limits

SHIPPED = Path(__file__).resolve().parents[2] / "systemd" / "gpud.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpud.toml"
    path.write_text(text)
    return path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpud serve")
    add_arguments(p)
    return p


def test_defaults_are_valid() -> None:
    defaults = Config()
    values = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(Config)}
    assert Config.from_values(values) == defaults
    assert Config.load(None) == defaults


def test_shipped_file_is_render_defaults() -> None:
    assert SHIPPED.read_text() == render_defaults(), "regenerate systemd/gpud.toml from render_defaults()"


def test_shipped_file_loads_to_the_defaults() -> None:
    assert Config.load(SHIPPED) == Config()


def test_rendered_file_names_every_setting_and_limit() -> None:
    text = render_defaults()
    table = tomllib.loads(text)["gpud"]
    assert set(table) | {"address", "cache_dir"} == {f.name for f in dataclasses.fields(Config)}
    assert set(table["limits"]) == {f.name for f in dataclasses.fields(Limits)}
    assert '# address = "ipc:///run/gpud/gpud.sock"' in text and '# cache_dir = "/var/cache/gpud"' in text


def test_every_setting_and_limit_has_help() -> None:
    for f in dataclasses.fields(Config):
        assert f.metadata["help"], f.name
        assert f.metadata["section"], f.name
    assert set(LIMITS_HELP) == {f.name for f in dataclasses.fields(Limits)}


def test_unknown_key_suggests_the_closest(tmp_path: Path) -> None:
    path = write(tmp_path, "[gpud]\nflush_deadline = 3\n")
    with pytest.raises(
        ConfigError, match=r'unknown key "flush_deadline" in \[gpud\] \(did you mean "flush_deadline_ms"'
    ):
        Config.load(path)


def test_key_outside_the_gpud_table(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match='"lease_s" is outside the'):
        Config.load(write(tmp_path, "lease_s = 2.0\n[gpud]\n"))
    with pytest.raises(ConfigError, match=r'unknown key "gpu".*did you mean "gpud"'):
        Config.load(write(tmp_path, "[gpu]\nlease_s = 2.0\n"))


def test_unknown_limits_key(tmp_path: Path) -> None:
    path = write(tmp_path, "[gpud.limits]\nmax_frame = 8\n")
    with pytest.raises(ConfigError, match=r'"max_frame" in \[gpud.limits\] \(did you mean "max_frames"'):
        Config.load(path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('lease_s = "five"', 'lease_s: expected a number, got the string "five"'),
        ("max_sessions = true", "max_sessions: expected an integer, got the boolean true"),
        ("lease_s = false", "lease_s: expected a number, got the boolean false"),
        ("max_sessions = [1]", r"max_sessions: expected an integer, got the list \[1\]"),
        ("max_sessions = 1.5", "max_sessions: expected an integer, got the number 1.5"),
        ("trace = 1", r"trace: expected a boolean \(true or false\), got the integer 1"),
        ("graph_cache_size = -1", "graph_cache_size: expected an integer >= 0, got -1"),
        ("session_window = 0", "session_window: expected an integer >= 1, got 0"),
        ("cache_dir = 3", "cache_dir: expected a path, got the integer 3"),
        ("limits = 3", r"limits: expected a \[gpud.limits\] table, got the integer 3"),
    ],
)
def test_wrong_types(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, f"[gpud]\n{line}\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: {message}$"):
        Config.load(path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("lease_s = 1e9", "lease_s: expected a number from 0.1 to 3600, got 1000000000"),
        ("flush_deadline_ms = 0", "flush_deadline_ms: expected a number > 0 and <= 10000, got 0"),
        ("busy_poll_us = nan", "busy_poll_us: expected a finite number, got nan"),
        ("health_stall_s = inf", "health_stall_s: expected a finite number, got inf"),
        ("staging_pool_bytes = 1000", r"expected an integer >= 1048576 \(1 MiB\), got 1000"),
        ("max_dispatches_per_flush = 1_000_000", "expected an integer from 1 to 65536, got 1000000"),
        ('backend = "cdua"', 'backend: expected one of auto | cuda | webgpu | fake, got the string "cdua"'),
        ('address = "tpc://host:1"', "address: expected an ipc:// or tcp:// endpoint"),
        ('metrics_address = "9100"', 'metrics_address: expected "" or "host:port"'),
        ('cache_dir = ""', "cache_dir: expected a non-empty path"),
    ],
)
def test_absurd_values(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config.load(write(tmp_path, f"[gpud]\n{line}\n"))


@pytest.mark.parametrize("line", ["max_frames = true", "max_frames = 0", 'max_frames = "8"'])
def test_bad_limits(tmp_path: Path, line: str) -> None:
    with pytest.raises(ConfigError, match=r"limits\.max_frames: expected an integer"):
        Config.load(write(tmp_path, f"[gpud.limits]\n{line}\n"))


def test_conversions(tmp_path: Path) -> None:
    config = Config.load(write(tmp_path, '[gpud]\nlease_s = 2\ncache_dir = "/tmp/k"\n[gpud.limits]\nmax_frames = 8\n'))
    assert config.lease_s == 2.0 and isinstance(config.lease_s, float)
    assert config.cache_dir == Path("/tmp/k")
    assert config.limits == Limits(max_frames=8)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=f"^cannot read config file {re.escape(str(tmp_path / 'nope.toml'))}: No such file"
    ):
        Config.load(tmp_path / "nope.toml")


def test_invalid_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[gpud]\nlease_s = \n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: invalid TOML: .*line 2"):
        Config.load(path)


def test_overrides_win_over_the_file_and_are_validated(tmp_path: Path) -> None:
    path = write(tmp_path, "[gpud]\nlease_s = 9.0\n[gpud.limits]\nmax_frames = 8\n")
    assert Config.load(path, lease_s=2.0).lease_s == 2.0
    assert Config.load(path, lease_s=None).lease_s == 9.0
    assert Config.load(path, limits={"max_ndim": 4}).limits == Limits(max_frames=8, max_ndim=4)
    with pytest.raises(ConfigError, match=r"^command line: lease_s: expected a number from 0\.1 to 3600, got -1$"):
        Config.load(path, lease_s=-1)
    with pytest.raises(ConfigError, match='unknown key "leese_s"'):
        Config.load(path, leese_s=1.0)


@pytest.mark.parametrize(("value", "expected"), [("all", "all"), ([0, 1], [0, 1]), ([3], [3])])
def test_devices_accepted(value: object, expected: object) -> None:
    assert Config.from_values({"devices": value}).devices == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "non-empty list"),
        ([-1], "got the integer -1"),
        ([0, 0], r"distinct device indices, got \[0, 0\]"),
        ([True], "got the boolean true"),
        ("some", 'expected "all" or a non-empty list of device indices, got the string "some"'),
        (0, "got the integer 0"),
    ],
)
def test_devices_refused(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=f"devices: .*{message}"):
        Config.from_values({"devices": value})


def test_flags_parse_and_override() -> None:
    args = parser().parse_args(["--lease-s", "2", "--no-trace", "--devices", "0,1", "--cache-dir", "/tmp/c"])
    overrides = overrides_from_args(args)
    assert overrides == {"lease_s": 2.0, "trace": False, "devices": [0, 1], "cache_dir": Path("/tmp/c")}
    config = Config.load(None, **overrides)
    assert (config.lease_s, config.trace, config.devices) == (2.0, False, [0, 1])
    assert overrides_from_args(parser().parse_args([])) == {}


def test_every_cli_setting_has_a_flag() -> None:
    text = parser().format_help()
    for f in dataclasses.fields(Config):
        assert (f"--{f.name.replace('_', '-')}" in text) == (f.name != "limits"), f.name
    assert "--no-insecure-tcp" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lease-s", "five"], 'argument --lease-s: expected a number, got "five"'),
        (["--lease-s", "0"], "argument --lease-s: expected a number from 0.1 to 3600, got 0"),
        (["--max-sessions", "1.5"], 'argument --max-sessions: expected an integer, got "1.5"'),
        (["--devices", "0,x"], 'argument --devices: expected "all" or comma-separated device indices'),
        (["--devices", "1,1"], "argument --devices: expected distinct device indices"),
        (["--backend", "cdua"], "argument --backend: expected one of auto"),
        (["--busy-poll-us", "nan"], "argument --busy-poll-us: expected a finite number"),
    ],
)
def test_bad_flag_value_exits_with_status_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_check_summary(tmp_path: Path) -> None:
    path = write(tmp_path, '[gpud]\nlease_s = 2.0\nbackend = "webgpu"\n[gpud.limits]\nmax_frames = 8\n')
    summary = check(path)
    assert summary.startswith(f"{path}: valid; sets 3 of ") and "lease_s, backend, limits.max_frames" in summary
    assert "\n" not in summary
    assert "sets 0 of" in check(write(tmp_path, ""))
    with pytest.raises(ConfigError, match="lease_s"):
        check(write(tmp_path, "[gpud]\nlease_s = 0\n"))

"""The shipped config file documents every default: it must load and match the code."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from gpud.config import Config

SHIPPED = Path(__file__).resolve().parents[1] / "systemd" / "gpud.toml"


def test_shipped_config_loads_and_matches_defaults() -> None:
    loaded = Config.load(SHIPPED)
    defaults = Config()
    for key in tomllib.loads(SHIPPED.read_text())["gpud"]:
        assert getattr(loaded, key) == getattr(defaults, key), key


def test_shipped_config_names_every_tunable() -> None:
    documented = set(tomllib.loads(SHIPPED.read_text())["gpud"])
    per_host = {"address", "cache_dir", "insecure_tcp", "curve_secret_key"}  # set by the unit or flags
    assert {f.name for f in dataclasses.fields(Config)} - per_host <= documented


def test_unknown_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "gpud.toml"
    path.write_text("[gpud]\nflush_deadline = 3\n")
    with pytest.raises(ValueError, match="flush_deadline"):
        Config.load(path)


def test_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gpud.toml"
    path.write_text("[gpud]\nlease_s = 9.0\n")
    assert Config.load(path, lease_s=2.0).lease_s == 2.0
    assert Config.load(path, lease_s=None).lease_s == 9.0

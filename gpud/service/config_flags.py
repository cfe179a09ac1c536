"""The flags of `gpud serve`: one `--kebab-case` flag per setting of `Config`, checked as the file's values are."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpud.service.config import config_fields
from gpud.service.setting import EXPECTED, MS, US, B, S, check_value, size_text, toml_text

_METAVARS = {US: "US", MS: "MS", S: "SECONDS", B: "BYTES"}


def _from_text(tp: Any, text: str) -> Any:
    try:
        if tp in (int, float):
            return tp(text)
        return text if tp in (str, Path) or text == "all" else [int(part) for part in text.split(",")]
    except ValueError:
        what = EXPECTED.get(tp, '"all" or comma-separated device indices such as 0,2')
        raise ValueError(f"expected {what}, got {json.dumps(text)}") from None


def _flag_type(tp: Any, meta: Mapping[str, Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return check_value(tp, meta, _from_text(tp, text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One `--kebab-case` flag per setting (bools as --x/--no-x), default None: only given flags override."""
    groups: dict[str, Any] = {}
    for name, (field, tp) in config_fields().items():
        meta = field.metadata
        if not meta["cli"]:
            continue
        section = meta["section"]
        group = groups.get(section) or groups.setdefault(section, parser.add_argument_group(f"settings: {section}"))
        value: Any = field.default
        default = meta["default_doc"] or (size_text(value) if meta["unit"] == B else toml_text(value))
        unit = f"{meta['unit']}, " if meta["unit"] else ""
        text = f"{meta['help']} ({unit}default: {default})".replace("%", "%%")
        flag = "--" + name.replace("_", "-")
        if tp is bool:
            group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=text)
            continue
        choices = meta["choices"] and "{" + ",".join(meta["choices"]) + "}"
        metavar = meta["metavar"] or choices or _METAVARS.get(meta["unit"]) or {int: "N", float: "X"}.get(tp, "TEXT")
        group.add_argument(flag, dest=name, type=_flag_type(tp, meta), default=None, metavar=metavar, help=text)


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags (those not given are None on the namespace and left out)."""
    names = [name for name, (field, _) in config_fields().items() if field.metadata["cli"]]
    return {name: value for name in names if (value := getattr(args, name, None)) is not None}

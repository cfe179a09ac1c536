"""One setting: how a `Config` field declares it (`setting`: help text, section, bounds, choices, unit),
how a value is checked against that declaration, and how values are written in messages and in TOML."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
US, MS, S, B, RATE = "microseconds", "milliseconds", "seconds", "bytes", "per second"  # units

KINDS = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}
EXPECTED = {bool: "a boolean (true or false)", int: "an integer", float: "a number", str: "a string", Path: "a path"}
_ACCEPTS: dict[Any, Any] = {bool: bool, int: int, float: int | float, str: str, Path: str | os.PathLike}


def setting(
    default: Any = None,
    help: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    section: str = "service",
    min: float | None = None,
    above: float | None = None,
    max: float | None = None,
    choices: tuple[str, ...] | None = None,
    cli: bool = True,
    unit: str | None = None,
    metavar: str | None = None,
    check: Callable[[Any], Any] | None = None,
    example: Any = None,
    default_doc: str | None = None,
) -> Any:
    """A `Config` field; `example`, `default_doc`: a machine-dependent default (rendered commented out)."""
    meta: dict[str, Any] = {"help": help, "section": section, "min": min, "above": above, "max": max, "cli": cli}
    meta |= {"choices": choices, "unit": unit, "metavar": metavar, "check": check}
    meta |= {"example": example, "default_doc": default_doc}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def check_value(tp: Any, meta: Mapping[str, Any], value: Any) -> Any:
    """The validated (and converted) value, or ValueError saying what was expected and what was found."""
    if tp in EXPECTED:
        if isinstance(value, bool) != (tp is bool) or not isinstance(value, _ACCEPTS[tp]):  # a bool is no number
            raise ValueError(f"expected {EXPECTED[tp]}, got {describe(value)}")
        if tp is Path and value == "":
            raise ValueError('expected a non-empty path, got the string ""')
        value = tp(value) if tp in (float, Path) else value
        if tp is float and not math.isfinite(value):
            raise ValueError(f"expected a finite number, got {value!r}")
        lo, above, hi = meta.get("min"), meta.get("above"), meta.get("max")
        if (lo is not None and value < lo) or (above is not None and value <= above) or (hi is not None and value > hi):
            raise ValueError(f"expected {EXPECTED[tp]} {range_text(meta)}, got {number_text(value)}")
        if (choices := meta.get("choices")) and value not in choices:
            raise ValueError(f"expected one of {' | '.join(choices)}, got {describe(value)}")
    extra: Callable[[Any], Any] | None = meta.get("check")
    return value if extra is None else extra(value)


def toml_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    return json.dumps(str(value))


def describe(value: Any) -> str:
    """A value as found, for error messages: `the string "five"`, `the boolean true`, `the list [1, 2]`."""
    if isinstance(value, list | tuple):
        text = toml_text(value) if all(isinstance(v, bool | int | float | str) for v in value) else "[...]"
    elif isinstance(value, bool | int | float | str):
        text = toml_text(value)
    else:
        return "a table" if isinstance(value, Mapping) else f"a {type(value).__name__}"
    kind = KINDS.get(type(value), "list")
    return f"the {kind} {text if len(text) <= 40 else text[:37] + '...'}"


def number_text(x: float, unit: str | None = None) -> str:
    text = str(int(x)) if float(x).is_integer() else repr(x)
    return f"{text} ({size_text(int(x))})" if unit == B and x >= KiB else text


def size_text(n: int) -> str:
    for step, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= step and n % step == 0:
            return f"{n // step} {name}"
    return f"{n} bytes"


def range_text(meta: Mapping[str, Any]) -> str:
    lo, above, hi, unit = meta.get("min"), meta.get("above"), meta.get("max"), meta.get("unit")
    if lo is not None and hi is not None:
        return f"from {number_text(lo, unit)} to {number_text(hi, unit)}"
    if lo is not None:
        parts = [f">= {number_text(lo, unit)}"]
    else:
        parts = [f"> {number_text(above, unit)}"] if above is not None else []
    return " and ".join(parts + ([f"<= {number_text(hi, unit)}"] if hi is not None else []))

"""Draw `gpud bench soak`'s JSON as an SVG: one small panel per series against minutes (no plotting package).

    python -m benchmarks.soak_plot soak.json soak.svg

Each panel's y axis starts at 0, so a flat line looks flat; red ticks at the bottom mark the kills.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from benchmarks.plot import _text

COLUMNS, PANEL_W, PANEL_H, PAD_X, PAD_TOP, PAD_BOTTOM, TITLE_H = 4, 240, 150, 56, 30, 26, 44


def _nice(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten that is at least `value`."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return float(next(step * power for step in (1, 2, 5, 10) if step * power >= value))


def _label(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / 2**20:.4g} MiB"
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.2g}"


def _panel(x0: float, y0: float, name: str, unit: str, points: list[tuple[float, float]], t_max: float,
           kills: list[float]) -> list[str]:  # fmt: skip
    width, height = PANEL_W - PAD_X - 10, PANEL_H - PAD_TOP - PAD_BOTTOM
    step = 2**20 if unit == "bytes" else 1  # bytes: a round number of MiB at the top
    top = _nice(max(v for _, v in points) * 1.05 / step) * step
    left, bottom = x0 + PAD_X, y0 + PAD_TOP + height

    def xy(t: float, v: float) -> str:
        return f"{left + width * t / t_max:.1f},{bottom - height * v / top:.1f}"

    out = [
        _text(left, y0 + 16, 12, f"{name}: last {_label(points[-1][1], unit)}", anchor="start"),
        f'<rect x="{left}" y="{y0 + PAD_TOP}" width="{width}" height="{height}" fill="none" stroke="#ccc"/>',
        _text(left - 4, y0 + PAD_TOP + 8, 10, _label(top, unit), anchor="end"),
        _text(left - 4, bottom, 10, "0", anchor="end"),
        _text(left + width, bottom + 14, 10, f"{t_max / 60:.1f} min", anchor="end"),
    ]
    for t in kills:
        x = left + width * t / t_max
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom - 6}" stroke="#d6604d"/>')
    path = " ".join(xy(t, v) for t, v in points)
    out.append(f'<polyline points="{path}" fill="none" stroke="#08519c" stroke-width="1.5"/>')
    return out


def svg(results: dict[str, Any]) -> str:
    samples = results["samples"]
    units = {name: meta["unit"] for name, meta in results["series"].items()}
    present = [name for name in units if any(name in s for s in samples)]
    t_max = max(1.0, max(s["t_s"] for s in samples))
    kills = [k["t_s"] for k in results.get("kill_log", [])]
    rows = math.ceil(len(present) / COLUMNS)
    width, height = COLUMNS * PANEL_W + 20, TITLE_H + rows * PANEL_H
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">']
    verdict = "passed" if results.get("passed") else "FAILED"
    title = (
        f"gpud soak on {results['backend']} ({results.get('host', '')}): {results['model']}, K={results['clients']} "
        f"clients, {results.get('seconds', t_max) / 60:.1f} min, {results.get('kills', 0)} kills: {verdict}"
    )
    out.append(_text(10, 24, 15, title, anchor="start"))
    for i, name in enumerate(present):
        points = [(float(s["t_s"]), float(s[name])) for s in samples if name in s]
        x0, y0 = 10 + (i % COLUMNS) * PANEL_W, TITLE_H + (i // COLUMNS) * PANEL_H
        out += _panel(x0, y0, name, units[name], points, t_max, kills)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    source, target = Path(sys.argv[1]), Path(sys.argv[2])
    target.write_text(svg(json.loads(source.read_text())))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()

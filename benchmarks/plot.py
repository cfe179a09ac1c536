"""Draw `gpud bench decode`'s JSON as an SVG bar chart (no plotting package needed).

    python -m benchmarks.plot benchmarks/results/h100/session2/bench-decode-cuda.json docs/decode-h100.svg
    gpud bench decode --clients 1,4,8,16,32 --json run.json --plot run.svg    (the same, at the end of a run)

Bars: tokens/s of all clients together, per mode and client count (log scale); lines: PyTorch in
process (one sequence), where the run measured it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 760, 380, 70, 60, 40
COLOURS = {1: "#c6dbef", 2: "#9ecae1", 4: "#6baed6", 8: "#4292c6", 16: "#2171b5", 32: "#08519c", 64: "#08306b"}


def _text(x: float, y: float, size: int, body: str, anchor: str = "middle", fill: str = "#000") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{fill}">{body}</text>'


def svg(results: dict[str, Any]) -> str:
    modes = results["modes"]
    values = [row["tokens_per_s"] for rows in modes.values() for row in rows]
    lines = {name: results[name]["tokens_per_s"] for name in ("torch_eager", "torch_cuda_graph") if name in results}
    top = 10 ** math.ceil(math.log10(max([*values, *lines.values()])))
    low = 10 ** math.floor(math.log10(min([*values, *lines.values()])))

    def y(value: float) -> float:
        span = math.log10(top) - math.log10(low)
        return TOP + (HEIGHT - TOP - BOTTOM) * (1 - (math.log10(value) - math.log10(low)) / span)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif">']
    title = f"{results['model']} decode through gpud on {results['backend']} ({results.get('host', '')})"
    out.append(_text(LEFT, 22, 15, f"{title}: tokens/s, all clients together", anchor="start"))
    decade = low
    while decade <= top:
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - 20}" y1="{y(decade):.1f}" y2="{y(decade):.1f}" stroke="#ddd"/>')
        out.append(_text(LEFT - 8, y(decade) + 4, 11, f"{decade:g}", anchor="end"))
        decade *= 10
    group = (WIDTH - LEFT - 40) / len(modes)
    for i, (mode, rows) in enumerate(modes.items()):
        bar = group / (len(rows) + 1)
        for j, row in enumerate(rows):
            x = LEFT + i * group + (j + 0.5) * bar
            top_y = y(row["tokens_per_s"])
            colour = COLOURS.get(row["clients"], "#6baed6")
            height = HEIGHT - BOTTOM - top_y
            out.append(
                f'<rect x="{x:.1f}" y="{top_y:.1f}" width="{bar * 0.9:.1f}" height="{height:.1f}" fill="{colour}"/>'
            )
            label = f"{row['tokens_per_s']:.0f}"
            out.append(
                f'<text x="{x + bar * 0.45:.1f}" y="{top_y - 4:.1f}" font-size="10" text-anchor="middle">{label}</text>'
            )
            out.append(
                f'<text x="{x + bar * 0.45:.1f}" y="{HEIGHT - BOTTOM + 14}" font-size="10" '
                f'text-anchor="middle">K={row["clients"]}</text>'
            )
        centre = LEFT + i * group + group * len(rows) / (len(rows) + 1) / 2
        out.append(_text(centre, HEIGHT - BOTTOM + 32, 13, mode))
    for name, value in lines.items():
        dash = "6,4" if "eager" in name else "2,2"
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - 20}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#d6604d" '
            f'stroke-dasharray="{dash}"/>'
        )
        label = f"{name.replace('_', ' ')} in process: {value:.0f}"
        out.append(_text(WIDTH - 24, y(value) - 4, 11, label, anchor="end", fill="#b2182b"))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    source, target = Path(sys.argv[1]), Path(sys.argv[2])
    target.write_text(svg(json.loads(source.read_text())))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()

"""Charts drawn on the server as SVG: no script, no library, nothing fetched.

``line_chart`` draws series of numbers over the same runs (x: the runs in time order), a
line and a point per value, with a grid, the y scale and each point's value in its
tooltip. Every text in it is escaped here (names and labels may be task kinds an operator
typed); styling is by class (console.css), so the page's CSP needs no inline style.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 760, 240
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 14, 28


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[float | None]
    kind: str  # actual | counted | expected | limit: a class of console.css
    points: bool = True


def _scale(top: float) -> float:
    """A round top of the y axis at or above ``top`` (1, 2, 2.5 or 5 times a power of 10)."""
    if top <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(top))
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= top * (1 - 1e-9):
            return step * magnitude
    return 10 * magnitude


def _number(value: float) -> str:
    if value == int(value) and abs(value) >= 1:
        return f"{int(value):,}"
    return f"{value:.4g}"


def line_chart(title: str, labels: Sequence[str], series: Sequence[Series], unit: str = "") -> str:
    """An SVG chart of ``series`` over ``labels`` (one per run, oldest first)."""
    count = max([len(labels), *(len(s.values) for s in series)])
    known = [v for s in series for v in s.values if v is not None]
    top = _scale(max(known) * 1.05 if known else 1.0)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(index: int) -> float:
        return LEFT + (plot_w * (index + 0.5) / count if count else 0)

    def y(value: float) -> float:
        return TOP + plot_h * (1 - value / top)

    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img"'
        f' aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
    ]
    for step in range(5):
        value = top * step / 4
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}"'
            f' y2="{y(value):.1f}"/>'
            f'<text class="axis" x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">'
            f"{escape(_number(value) + unit)}</text>"
        )
    if labels:
        parts.append(
            f'<text class="axis" x="{LEFT}" y="{HEIGHT - 8}">{escape(labels[0])}</text>'
            f'<text class="axis" x="{WIDTH - RIGHT}" y="{HEIGHT - 8}" text-anchor="end">'
            f"{escape(labels[-1])}</text>"
        )
    for line in series:
        parts.append(f'<g class="series {escape(line.kind)}" data-series="{escape(line.name)}">')
        run: list[str] = []
        for index, maybe in enumerate(line.values):
            if maybe is None:
                parts.extend(_polyline(run))
                run = []
                continue
            value = maybe
            run.append(f"{x(index):.1f},{y(value):.1f}")
            if line.points:
                label = labels[index] if index < len(labels) else ""
                parts.append(
                    f'<circle cx="{x(index):.1f}" cy="{y(value):.1f}" r="3">'
                    f"<title>{escape(f'{line.name} {label}: {_number(value)}{unit}')}</title>"
                    "</circle>"
                )
        parts.extend(_polyline(run))
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _polyline(points: list[str]) -> list[str]:
    if len(points) < 2:
        return []
    return [f'<polyline points="{" ".join(points)}"/>']


def legend(series: Sequence[Series]) -> list[tuple[str, str]]:
    """(name, class) of each series, for the legend under a chart."""
    return [(s.name, s.kind) for s in series]

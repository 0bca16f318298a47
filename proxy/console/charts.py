"""Charts drawn on the server as SVG, in the page itself: no script, no chart service, nothing
fetched. Presentation attributes only (the Content-Security-Policy allows no inline style)."""

from __future__ import annotations

import math
from dataclasses import dataclass

WIDTH, HEIGHT = 960, 220
_LEFT, _BOTTOM, _TOP = 64, 28, 12


@dataclass(slots=True, frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str  # under the bar (some of them, when there are many)
    title: str  # shown on hover
    shown_label: bool


@dataclass(slots=True, frozen=True)
class Chart:
    bars: list[Bar]
    ticks: list[tuple[float, str]]  # y, the value written beside it
    width: int = WIDTH
    height: int = HEIGHT


def bars(points: list[tuple[str, float]], unit: str = "") -> Chart:
    """Vertical bars, one a point (label, value), on a scale from zero to a round top."""
    top = _round_top(max((value for _, value in points), default=0.0))
    plot_w, plot_h = WIDTH - _LEFT - 8, HEIGHT - _BOTTOM - _TOP
    step = plot_w / max(1, len(points))
    every = max(1, len(points) // 12)  # at most a dozen labels under the bars
    shown = []
    for i, (label, value) in enumerate(points):
        height = 0.0 if top == 0 else plot_h * max(0.0, value) / top
        shown.append(
            Bar(
                round(_LEFT + i * step + step * 0.15, 2),
                round(_TOP + plot_h - height, 2),
                round(step * 0.7, 2),
                round(height, 2),
                label,
                f"{label}: {_number(value)}{unit}",
                i % every == 0,
            )
        )
    ticks = [(round(_TOP + plot_h - plot_h * k / 4, 2), _tick(top * k / 4) + unit) for k in range(5)]
    return Chart(shown, ticks)


def _round_top(value: float) -> float:
    if value <= 0:
        return 1.0
    scale = 10.0 ** math.floor(math.log10(value))
    for factor in (1, 2, 2.5, 5, 10):
        if value <= factor * scale:
            return factor * scale
    return value


def _tick(value: float) -> str:
    """A scale's value: as many digits as tell the ticks apart (a quarter of a round top)."""
    return "0" if value == 0 else f"{value:,.0f}" if value >= 1000 else f"{value:.10f}".rstrip("0").rstrip(".")


def _number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:,.2f}".rstrip("0").rstrip(".")
    return f"{value:.4f}".rstrip("0").rstrip(".")

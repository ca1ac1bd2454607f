"""Charts as inline SVG strings, drawn from plain numbers. Pure; no JavaScript, no library.

Every chart is an ``<svg role="img">`` with a ``<title>`` (what a screen reader says) and
``data-*`` attributes carrying the raw numbers, so a test can read what is drawn. Text is
escaped here; the templates insert the result as markup.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#2563eb", "#f59e0b", "#10b981", "#8b5cf6", "#ef4444", "#0ea5e9", "#64748b")
_FONT = 'font-family="system-ui, sans-serif" font-size="12"'


def nice_max(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten that is >= ``value`` (> 0)."""
    if value <= 0:
        return 1.0
    exponent = math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        candidate = step * 10**exponent
        if candidate >= value * (1 - 1e-12):
            return float(candidate)
    return float(10 ** (exponent + 1))


def _ticks(top: float) -> list[float]:
    """Round gridlines for a ``nice_max`` top: 2 -> 0 .5 1 1.5 2; 2.5, 5 or 1 -> fifths."""
    if top <= 0:
        return [0.0]
    leading = round(top / 10 ** math.floor(math.log10(top)), 6)
    count = 4 if leading == 2 else 5
    return [top * i / count for i in range(count + 1)]


def _a(value: object) -> str:
    return escape(str(value), quote=True)


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    text: str  # what is written at the end of the bar


def bars(title: str, rows: Sequence[Bar], *, width: int = 640,
         fmt: Callable[[float], str] = lambda v: f"{v:g}", color: str = PALETTE[0]) -> str:
    """A horizontal bar chart, one row per bar, labelled on the left, value on the right."""
    row_h, label_w, right_w, top = 26, 140, 90, 28
    plot_w = width - label_w - right_w
    height = top + row_h * max(1, len(rows)) + 22
    peak = nice_max(max((r.value for r in rows), default=0))
    out = [f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="100%" '
           f'preserveAspectRatio="xMinYMin meet" data-chart="bars" {_FONT}>',
           f"<title>{escape(title)}</title>",
           f'<text x="0" y="16" font-weight="600">{escape(title)}</text>']
    out += _grid(label_w, top, plot_w, row_h * max(1, len(rows)), peak, fmt)
    for i, row in enumerate(rows):
        y = top + i * row_h
        w = plot_w * (row.value / peak) if peak else 0
        out.append(f'<g data-label="{_a(row.label)}" data-value="{_a(row.value)}">'
                   f'<text x="{label_w - 8}" y="{y + 17}" text-anchor="end">'
                   f"{escape(row.label)}</text>"
                   f'<rect x="{label_w}" y="{y + 5}" width="{w:.1f}" height="{row_h - 10}" '
                   f'rx="3" fill="{color}"><title>{escape(row.label)}: {escape(row.text)}'
                   f"</title></rect>"
                   f'<text x="{label_w + w + 6:.1f}" y="{y + 17}">{escape(row.text)}</text></g>')
    if not rows:
        out.append(f'<text x="{label_w}" y="{top + 17}" fill="#64748b">no data</text>')
    out.append("</svg>")
    return "".join(out)


@dataclass(frozen=True)
class Stack:
    label: str
    parts: tuple[float, ...]
    text: str


def stacked_bars(title: str, series: Sequence[str], rows: Sequence[Stack], *,
                 width: int = 640, fmt: Callable[[float], str] = lambda v: f"{v:g}") -> str:
    """Horizontal stacked bars (one colour per series) with a legend."""
    row_h, label_w, right_w, top = 26, 140, 100, 48
    plot_w = width - label_w - right_w
    height = top + row_h * max(1, len(rows)) + 22
    peak = nice_max(max((sum(r.parts) for r in rows), default=0))
    out = [f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="100%" '
           f'preserveAspectRatio="xMinYMin meet" data-chart="stacked" {_FONT}>',
           f"<title>{escape(title)}</title>",
           f'<text x="0" y="16" font-weight="600">{escape(title)}</text>']
    x = label_w
    for i, name in enumerate(series):
        out.append(f'<rect x="{x}" y="24" width="10" height="10" fill="{PALETTE[i]}"/>'
                   f'<text x="{x + 14}" y="33">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    out += _grid(label_w, top, plot_w, row_h * max(1, len(rows)), peak, fmt)
    for i, row in enumerate(rows):
        y = top + i * row_h
        out.append(f'<g data-label="{_a(row.label)}" data-total="{_a(sum(row.parts))}">'
                   f'<text x="{label_w - 8}" y="{y + 17}" text-anchor="end">'
                   f"{escape(row.label)}</text>")
        x0 = float(label_w)
        for j, part in enumerate(row.parts):
            w = plot_w * (part / peak) if peak else 0
            out.append(f'<rect x="{x0:.1f}" y="{y + 5}" width="{w:.1f}" height="{row_h - 10}" '
                       f'fill="{PALETTE[j % len(PALETTE)]}"><title>{escape(row.label)} '
                       f"{escape(series[j])}: {escape(fmt(part))}</title></rect>")
            x0 += w
        out.append(f'<text x="{x0 + 6:.1f}" y="{y + 17}">{escape(row.text)}</text></g>')
    out.append("</svg>")
    return "".join(out)


@dataclass(frozen=True)
class Distribution:
    """One profile's samples of one timing, with the percentiles to mark."""

    label: str
    values: tuple[float, ...]
    p50: float | None
    p95: float | None


def distributions(title: str, rows: Sequence[Distribution], *, width: int = 640,
                  fmt: Callable[[float], str] = lambda v: f"{v:g}") -> str:
    """One strip per row: every sample as a faint tick, a bar up to p50, a mark at p95."""
    row_h, label_w, right_w, top = 34, 140, 150, 42
    plot_w = width - label_w - right_w
    height = top + row_h * max(1, len(rows)) + 22
    peak = nice_max(max((max(r.values) for r in rows if r.values), default=0))
    out = [f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="100%" '
           f'preserveAspectRatio="xMinYMin meet" data-chart="distribution" {_FONT}>',
           f"<title>{escape(title)}</title>",
           f'<text x="0" y="16" font-weight="600">{escape(title)}</text>',
           f'<rect x="{label_w}" y="24" width="18" height="8" fill="{PALETTE[0]}" '
           f'opacity="0.35"/><text x="{label_w + 22}" y="32">p50</text>'
           f'<rect x="{label_w + 56}" y="22" width="3" height="12" fill="{PALETTE[4]}"/>'
           f'<text x="{label_w + 63}" y="32">p95</text>'
           f'<rect x="{label_w + 100}" y="22" width="1.5" height="12" fill="{PALETTE[0]}"/>'
           f'<text x="{label_w + 106}" y="32">one workspace</text>']
    out += _grid(label_w, top, plot_w, row_h * max(1, len(rows)), peak, fmt)
    for i, row in enumerate(rows):
        y = top + i * row_h

        def at(v: float) -> float:
            return label_w + (plot_w * v / peak if peak else 0)

        p50 = "" if row.p50 is None else row.p50
        p95 = "" if row.p95 is None else row.p95
        out.append(f'<g data-label="{_a(row.label)}" data-n="{len(row.values)}" '
                   f'data-p50="{_a(p50)}" data-p95="{_a(p95)}">'
                   f'<text x="{label_w - 8}" y="{y + 21}" text-anchor="end">'
                   f"{escape(row.label)}</text>")
        if row.p50 is not None:
            out.append(f'<rect x="{label_w}" y="{y + 8}" width="{at(row.p50) - label_w:.1f}" '
                       f'height="{row_h - 16}" fill="{PALETTE[0]}" opacity="0.35">'
                       f"<title>{escape(row.label)} p50 {escape(fmt(row.p50))}</title></rect>")
        for v in row.values:
            out.append(f'<rect x="{at(v) - 0.75:.1f}" y="{y + 6}" width="1.5" '
                       f'height="{row_h - 12}" fill="{PALETTE[0]}" opacity="0.5"/>')
        if row.p95 is not None:
            out.append(f'<rect x="{at(row.p95) - 1.5:.1f}" y="{y + 3}" width="3" '
                       f'height="{row_h - 6}" fill="{PALETTE[4]}">'
                       f"<title>{escape(row.label)} p95 {escape(fmt(row.p95))}</title></rect>")
        summary = ("no samples" if row.p50 is None or row.p95 is None
                   else f"p50 {fmt(row.p50)} · p95 {fmt(row.p95)}")
        out.append(f'<text x="{label_w + plot_w + 8}" y="{y + 21}">{escape(summary)}</text>'
                   "</g>")
    out.append("</svg>")
    return "".join(out)


def _grid(x: int, y: int, w: int, h: int, peak: float,
          fmt: Callable[[float], str]) -> list[str]:
    parts = []
    for tick in _ticks(peak):
        tx = x + (w * tick / peak if peak else 0)
        parts.append(f'<line x1="{tx:.1f}" y1="{y}" x2="{tx:.1f}" y2="{y + h}" '
                     'stroke="#e2e8f0"/>'
                     f'<text x="{tx:.1f}" y="{y + h + 14}" text-anchor="middle" '
                     f'fill="#64748b" font-size="10">{escape(fmt(tick))}</text>')
    return parts

# -*- coding: utf-8 -*-
# Copyright: gpufleet.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small, dependency-free line chart as inline SVG, for the self-contained HTML reports.

``line_chart`` draws one polyline per series over a numeric x axis (times as epoch seconds, or
stage indexes with their own tick labels), with vertical annotation lines (what changed), red
markers (flagged drops) and a legend. The output is one ``<svg>`` element with no external
reference (no fonts, scripts or images), so the page works offline and in a headless browser.
"""

from __future__ import annotations

import html
from typing import Any, Sequence

PALETTE = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#1b7c83", "#d1242f", "#57606a")


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    mag = 10 ** len(str(int(value))) / 10
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * mag:
            return step * mag
    return 10 * mag


def _fmt(v: float) -> str:
    return f"{v / 1000:.1f}k" if abs(v) >= 10000 else f"{v:.0f}" if abs(v) >= 10 else f"{v:.2g}"


def line_chart(series: Sequence[dict[str, Any]], title: str = "", y_label: str = "output tok/s",
               x_ticks: Sequence[tuple[float, str]] | None = None, annotations: Sequence[dict[str, Any]] = (),
               markers: Sequence[dict[str, Any]] = (), width: int = 760, height: int = 320,
               chart_id: str = "chart") -> str:
    """SVG text. ``series``: ``[{name, points: [(x, y), ...]}]``; ``annotations``: ``[{x, text}]``;
    ``markers``: ``[{x, y, text}]``; ``x_ticks``: ``[(x, label)]`` (default: the points' x values)."""
    left, right, top, bottom = 64, 16, 28 if title else 12, 56
    pw, ph = width - left - right, height - top - bottom
    xs = [p[0] for s in series for p in s["points"]] + [a["x"] for a in annotations]
    ys = [p[1] for s in series for p in s["points"] if p[1] is not None]
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    ymax = _nice_max(max(ys) * 1.05 if ys else 1.0)

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y / ymax) * ph

    esc = html.escape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" id="{esc(chart_id)}" class="gpufleet-chart" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title or y_label)}" '
           'font-family="sans-serif" font-size="11">']
    if title:
        out.append(f'<text x="{left}" y="16" font-size="13" font-weight="600">{esc(title)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fff" stroke="#d0d7de"/>')
    for i in range(5):
        y = ymax * i / 4
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#eaeef2"/>')
        out.append(f'<text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end" fill="#57606a">{_fmt(y)}</text>')
    out.append(f'<text x="14" y="{top + ph / 2:.0f}" transform="rotate(-90 14 {top + ph / 2:.0f})" '
               f'text-anchor="middle" fill="#57606a">{esc(y_label)}</text>')
    ticks = list(x_ticks) if x_ticks is not None else sorted({(p[0], str(p[0])) for s in series for p in s["points"]})
    step = max(1, len(ticks) // 10)
    for i, (x, label) in enumerate(ticks):
        if i % step:
            continue
        out.append(f'<text x="{sx(x):.1f}" y="{top + ph + 16}" text-anchor="middle" fill="#57606a">{esc(label)}</text>')
    for a in annotations:
        x = sx(a["x"])
        out.append(f'<line class="annotation" x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" stroke="#bf8700" '
                   f'stroke-dasharray="4 3"><title>{esc(a["text"])}</title></line>')
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        pts = [(sx(x), sy(y)) for x, y in s["points"] if y is not None]
        if pts:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            out.append(f'<polyline class="series" data-name="{esc(s["name"])}" fill="none" stroke="{color}" '
                       f'stroke-width="2" points="{path}"/>')
        for (x, y), (_x, yv) in zip(pts, [p for p in s["points"] if p[1] is not None]):
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"><title>{esc(s["name"])}: '
                       f'{yv:.1f}</title></circle>')
        lx = left + 8 + (i % 4) * 170
        ly = top + ph + 32 + (i // 4) * 14
        out.append(f'<rect x="{lx}" y="{ly - 8}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{lx + 14}" y="{ly + 1}">{esc(s["name"])}</text>')
    for m in markers:
        x, y = sx(m["x"]), sy(m["y"])
        out.append(f'<circle class="drop" cx="{x:.1f}" cy="{y:.1f}" r="7" fill="none" stroke="#cf222e" '
                   f'stroke-width="2"><title>{esc(m["text"])}</title></circle>')
    out.append("</svg>")
    return "".join(out)

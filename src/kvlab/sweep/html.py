"""A self-contained interactive page of a sweep's panels: inline SVG drawn here, a few lines of inline script
for hovering (the value under the pointer) and for hiding a strategy by clicking its legend entry. No outside
request of any kind: no CDN, no font, no image."""

from __future__ import annotations

import html
import json
from pathlib import Path

from kvlab.sweep.plots import Panel

WIDTH, HEIGHT = 460, 320
LEFT, RIGHT, TOP, BOTTOM = 58, 14, 30, 44

SCRIPT = """
const tip = document.getElementById('tip');
document.querySelectorAll('[data-tip]').forEach(el => {
  el.addEventListener('mousemove', e => {
    tip.textContent = el.dataset.tip; tip.style.display = 'block';
    tip.style.left = (e.pageX + 12) + 'px'; tip.style.top = (e.pageY + 12) + 'px';
  });
  el.addEventListener('mouseleave', () => { tip.style.display = 'none'; });
});
document.querySelectorAll('.legend-item').forEach(item => {
  item.addEventListener('click', () => {
    const hidden = item.classList.toggle('off');
    document.querySelectorAll('[data-series="' + item.dataset.series + '"]').forEach(el => {
      if (!el.classList.contains('legend-item')) el.style.display = hidden ? 'none' : '';
    });
  });
});
"""

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
.panels { display: grid; grid-template-columns: repeat(auto-fill, 460px); gap: 16px; max-width: 1412px; }
.note { fill: #a00000; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
.legend-item { cursor: pointer; user-select: none; } .legend-item.off { opacity: 0.35; }
#tip { position: absolute; display: none; background: #fff; border: 1px solid #999; padding: 3px 6px;
       font-size: 12px; pointer-events: none; white-space: pre; }
"""


def _ticks(top: float, num: int = 5) -> list[float]:
    import math

    if top <= 0:
        return [0.0]
    step = 10 ** math.floor(math.log10(top / num))
    for factor in (1, 2, 2.5, 5, 10):
        if top / (step * factor) <= num:
            step *= factor
            break
    return [i * step for i in range(int(top / step + 1e-9) + 1)]


def _log_ticks(bottom: float, top: float) -> list[float]:
    """Powers of ten from ``bottom`` to ``top``."""
    import math

    return [10.0 ** e for e in range(math.ceil(math.log10(bottom) - 1e-9), math.floor(math.log10(top) + 1e-9) + 1)]


def _svg(panel: Panel, ymax: float | None) -> str:
    import math

    xs = [x for s in panel.series for x in s.xs] + list(panel.marks.values())
    ys = [y for s in panel.series for y in s.ys] + [u for u in panel.upper if u is not None]
    if panel.threshold is not None:
        ys.append(panel.threshold)
    bars = panel.kind == "bar"
    x_top = len(panel.series) if bars else max(xs) * 1.05
    y_top = ymax if ymax is not None else (max(ys) * 1.08 if ys and max(ys) > 0 else 1.0)
    positive = [y for y in ys if y > 0]
    ylog = panel.ylog and bool(positive)
    y_bottom = min(positive) / 1.5 if ylog else 0.0
    if ylog and ymax is None:
        y_top = max(positive) * 1.5
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + w * ((x + 0.5) if bars else x) / x_top

    def sy(y: float) -> float:
        if ylog:
            y = min(max(y, y_bottom), y_top)
            return TOP + h * (1 - math.log(y / y_bottom) / math.log(y_top / y_bottom))
        return TOP + h * (1 - min(y, y_top) / y_top)

    out = [f'<svg width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img">',
           f'<text x="{WIDTH / 2}" y="16" text-anchor="middle">{html.escape(panel.title)}</text>',
           f'<line x1="{LEFT}" y1="{TOP + h}" x2="{LEFT + w}" y2="{TOP + h}" stroke="#333"/>',
           f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + h}" stroke="#333"/>']
    for t in (_log_ticks(y_bottom, y_top) if ylog else _ticks(y_top)):
        out.append(f'<line x1="{LEFT}" y1="{sy(t):.1f}" x2="{LEFT + w}" y2="{sy(t):.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 5}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    if not bars:
        for t in _ticks(x_top):
            out.append(f'<text x="{sx(t):.1f}" y="{TOP + h + 15}" text-anchor="middle">{t:g}</text>')
    out.append(f'<text x="{LEFT + w / 2}" y="{HEIGHT - 6}" text-anchor="middle">{html.escape(panel.xlabel)}</text>'
               f'<text transform="translate(13,{TOP + h / 2}) rotate(-90)" text-anchor="middle">'
               f'{html.escape(panel.ylabel)}</text>')
    for i, s in enumerate(panel.series):
        label = html.escape(s.label)
        if bars:
            x0, top = sx(i) - w / x_top * 0.35, sy(s.ys[0])
            tip = f"{s.label}: {s.ys[0]:.4g} req/s" + (f" (fails at {panel.upper[i]:.4g})" if panel.upper[i] else "")
            out.append(f'<rect data-series="{label}" data-tip="{html.escape(tip)}" x="{x0:.1f}" y="{top:.1f}" '
                       f'width="{w / x_top * 0.7:.1f}" height="{TOP + h - top:.1f}" fill="{s.colour}"/>'
                       f'<text x="{sx(i):.1f}" y="{TOP + h + 15}" text-anchor="middle">{label}</text>')
            continue
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(s.xs, s.ys))
        out.append(f'<polyline data-series="{label}" points="{points}" fill="none" stroke="{s.colour}" '
                   f'stroke-width="2"/>')
        for x, y in zip(s.xs, s.ys):
            tip = html.escape(f"{s.label}\nrate {x:g} req/s\n{panel.ylabel}: {y:.4g}")
            out.append(f'<circle data-series="{label}" data-tip="{tip}" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" '
                       f'fill="{s.colour}"/>')
    out.extend(_marks(panel, sx, sy, TOP, TOP + h, LEFT, LEFT + w, bars))
    if not bars:
        for i, s in enumerate(panel.series):
            y = TOP + 8 + 15 * i
            out.append(f'<g class="legend-item" data-series="{html.escape(s.label)}"><rect x="{LEFT + 10}" '
                       f'y="{y - 8}" width="10" height="10" fill="{s.colour}"/><text x="{LEFT + 25}" y="{y + 1}">'
                       f'{html.escape(s.label)}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


def _marks(panel: Panel, sx, sy, top: float, bottom: float, left: float, right: float, bars: bool) -> list[str]:
    """The threshold (a dashed line across), the marks (a dotted line up, in the series' colour) and the notes."""
    out = []
    if panel.threshold is not None:
        y = sy(panel.threshold)
        out.append(f'<line class="threshold" x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#666" '
                   f'stroke-dasharray="6,4"/><text x="{left + 4}" y="{y - 4:.1f}" fill="#666">'
                   f'{html.escape(panel.threshold_text)}</text>')
    for label, x in ({} if bars else panel.marks).items():
        colour, name = panel.mark_colour(label), html.escape(label)
        series = f' data-series="{name}"' if any(s.label == label for s in panel.series) else ""
        out.append(f'<line class="mark"{series} data-tip="{html.escape(f"{label}: {x:.4g}")}" x1="{sx(x):.1f}" '
                   f'y1="{top}" x2="{sx(x):.1f}" y2="{bottom}" stroke="{colour}" stroke-dasharray="2,3" '
                   f'stroke-width="2"/>')
    for i, note in enumerate(panel.notes):
        out.append(f'<text class="note" x="{right - 4}" y="{bottom - 8 - 14 * (len(panel.notes) - 1 - i)}" '
                   f'text-anchor="end">{html.escape(note)}</text>')
    return out


def write_html(path: Path, sections: list[tuple[str, list[Panel], float | None]], *, title: str,
               data: dict | None = None, subtitle: str = "") -> Path:
    """``sections``: (heading, panels, y-axis top or None) each. ``data`` is embedded as JSON for a reader
    who wants the numbers; ``subtitle`` (a setup) is a paragraph under the title."""
    body = [f"<h1>{html.escape(title)}</h1>"] + ([f"<p>{html.escape(subtitle)}</p>"] if subtitle else [])
    for heading, panels, ymax in sections:
        body.append(f"<h2>{html.escape(heading)}</h2>")
        body.append('<div class="panels">' + "".join(_svg(p, ymax) for p in panels) + "</div>")
    payload = "" if data is None else (
        '<script type="application/json" id="data">' + json.dumps(data).replace("</", "<\\/") + "</script>")
    page = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>{''.join(body)}<div id=\"tip\"></div>{payload}"
            f"<script>{SCRIPT}</script></body></html>\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    return path

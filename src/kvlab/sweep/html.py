"""A self-contained interactive page of a sweep's panels: inline SVG drawn here, a few lines of inline script
for hovering (the value under the pointer) and for hiding a strategy by clicking its legend entry. No outside
request of any kind: no CDN, no font, no image."""

from __future__ import annotations

import html
import json
from pathlib import Path

from kvlab.sweep.plots import BAR_GROUP_WIDTH, LOWER_BOUND_TEXT, Panel, bar_layout

WIDTH, HEIGHT = 460, 320
LEFT, RIGHT, TOP, BOTTOM = 58, 14, 30, 44
DASHES = {"-": "", "--": "7,4", "-.": "7,3,2,3", ":": "2,3"}  # matplotlib line styles

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
.note { fill: #a00000; } svg text.under, svg text.value { font-size: 10px; }
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


def _svg(panel: Panel, ymax: float | None, key: str = "") -> str:
    return _bar_svg(panel, ymax, key) if panel.kind == "bar" else _line_svg(panel, ymax)


def _line_svg(panel: Panel, ymax: float | None) -> str:
    import math

    xs = [x for s in panel.series for x in s.xs] + list(panel.marks.values())
    ys = [y for s in panel.series for y in s.ys]
    if panel.threshold is not None:
        ys.append(panel.threshold)
    x_top = max(xs) * 1.05
    y_top = ymax if ymax is not None else (max(ys) * 1.08 if ys and max(ys) > 0 else 1.0)
    positive = [y for y in ys if y > 0]
    ylog = panel.ylog and bool(positive)
    y_bottom = min(positive) / 1.5 if ylog else 0.0
    if ylog and ymax is None:
        y_top = max(positive) * 1.5
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + w * x / x_top

    def sy(y: float) -> float:
        if ylog:
            y = min(max(y, y_bottom), y_top)
            return TOP + h * (1 - math.log(y / y_bottom) / math.log(y_top / y_bottom))
        return TOP + h * (1 - min(y, y_top) / y_top)

    legend = _line_legend(panel, HEIGHT + 4)
    out = _frame(panel, HEIGHT + 15 * len(legend) + (8 if legend else 0), w, h, sy,
                 _log_ticks(y_bottom, y_top) if ylog else _ticks(y_top))
    for t in _ticks(x_top):
        out.append(f'<text x="{sx(t):.1f}" y="{TOP + h + 15}" text-anchor="middle">{t:g}</text>')
    out.append(f'<text x="{LEFT + w / 2}" y="{HEIGHT - 6}" text-anchor="middle">{html.escape(panel.xlabel)}</text>')
    for s in panel.series:
        label = html.escape(s.label)
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(s.xs, s.ys))
        dashed = f' stroke-dasharray="{_dashes(s.linestyle)}"' if _dashes(s.linestyle) else ""
        out.append(f'<polyline data-series="{label}" points="{points}" fill="none" stroke="{s.colour}" '
                   f'stroke-width="2"{dashed}/>')
        for j, (x, y) in enumerate(zip(s.xs, s.ys)):
            tip = html.escape(s.tips[j] if j < len(s.tips) else f"{s.label}\nrate {x:g} req/s\n{panel.ylabel}: {y:.4g}")
            out.append(f'<circle data-series="{label}" data-tip="{tip}" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" '
                       f'fill="{s.colour}"/>')
    out.extend(_marks(panel, sx, sy, TOP, TOP + h, LEFT, LEFT + w, False))
    out.extend(legend)
    out.append("</svg>")
    return "\n".join(out)


def _dashes(linestyle) -> str:
    """A matplotlib line style as an svg stroke-dasharray ("" for a solid line)."""
    return DASHES.get(linestyle, "") if isinstance(linestyle, str) else "8,2,2,2"


def _line_legend(panel: Panel, y: float) -> list[str]:
    """Under the plot, one entry a line (outside the data): each series with its mark's value (click anywhere on
    the entry to hide it: a transparent box under it takes the click), each mark no series has, and the threshold."""
    out = []
    for s in panel.series:
        dashed = f' stroke-dasharray="{_dashes(s.linestyle)}"' if _dashes(s.linestyle) else ""
        text = panel.series_text(s)
        out.append(f'<g class="legend-item" data-series="{html.escape(s.label)}">'
                   f'<rect x="{LEFT}" y="{y - 3}" width="{26 + _text_px(text):.0f}" height="14" fill="transparent"/>'
                   f'<line x1="{LEFT}" y1="{y + 4}" x2="{LEFT + 20}" y2="{y + 4}" stroke="{s.colour}" '
                   f'stroke-width="2"{dashed}/><text x="{LEFT + 26}" y="{y + 8}">{html.escape(text)}</text></g>')
        y += 15
    names = {s.label for s in panel.series}
    others = [(panel.mark_text(label), "2,3") for label in panel.marks if label not in names]
    for text, dashes in others + ([(panel.threshold_text, "6,4")] if panel.threshold is not None else []):
        out.append(f'<g><line x1="{LEFT}" y1="{y + 4}" x2="{LEFT + 20}" y2="{y + 4}" stroke="#666" stroke-width="2" '
                   f'stroke-dasharray="{dashes}"/><text x="{LEFT + 26}" y="{y + 8}">{html.escape(text)}</text></g>')
        y += 15
    return out


def _frame(panel: Panel, height: float, w: float, h: float, sy, ticks: list[float]) -> list[str]:
    """The svg's opening, the panel's title, its axes, the y ticks with their grid lines and the axis labels."""
    out = [f'<svg width="{WIDTH}" height="{height:.0f}" viewBox="0 0 {WIDTH} {height:.0f}" role="img">',
           f'<text x="{WIDTH / 2}" y="16" text-anchor="middle">{html.escape(panel.title)}</text>',
           f'<line x1="{LEFT}" y1="{TOP + h}" x2="{LEFT + w}" y2="{TOP + h}" stroke="#333"/>',
           f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + h}" stroke="#333"/>']
    for t in ticks:
        out.append(f'<line x1="{LEFT}" y1="{sy(t):.1f}" x2="{LEFT + w}" y2="{sy(t):.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 5}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    out.append(f'<text transform="translate(13,{TOP + h / 2}) rotate(-90)" text-anchor="middle">'
               f'{html.escape(panel.ylabel)}</text>')
    return out


def _text_px(text: str, size: float = 11) -> float:
    """About how wide ``text`` is in the page's sans-serif font (0.56 em a character)."""
    return 0.56 * size * len(text)


def _bar_svg(panel: Panel, ymax: float | None, key: str) -> str:
    """Bars as the PNG has them (kvlab.sweep.plots.bar_layout): the strategies side by side in each group, a
    whisker to the bracket's failing end, the value above (≥ and hatched for a lower bound); under the bars the
    strategy (one group) or what limited each (named groups, then the group's name); a legend to click."""
    bars = bar_layout(panel)
    num_groups = max(1, len(panel.groups))
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    tops = [b.top for b in bars] + ([panel.threshold] if panel.threshold is not None else [])
    y_top = ymax if ymax is not None else (max(tops) * 1.15 if tops and max(tops) > 0 else 1.0)
    spacing = w / num_groups * BAR_GROUP_WIDTH / max(1, len(panel.series))
    under = [b.caption for b in bars] if panel.groups else [panel.series[b.series].label for b in bars]
    upright = any(_text_px(t, 10) > 0.9 * spacing for t in under)
    under_h = ((max(_text_px(t, 10) for t in under) if upright else 10) + 6) if any(under) else 0
    second = not panel.groups and any(b.caption for b in bars)  # (one group: the caption under the name)
    rows_y = TOP + h + 6 + under_h + 12 * second
    xlabel_y = rows_y + (16 if panel.groups else 0) + 12
    legend, legend_h = _rows(_bar_legend(panel, bars, f"hatch{key}"), xlabel_y + 20)
    height = xlabel_y + 10 + legend_h

    def sx(x: float) -> float:
        return LEFT + w * (x + 0.5) / num_groups

    def sy(y: float) -> float:
        return TOP + h * (1 - min(y, y_top) / y_top)

    out = _frame(panel, height, w, h, sy, _ticks(y_top))
    hatch = f"hatch{key}"
    out.append(f'<defs><pattern id="{hatch}" width="6" height="6" patternUnits="userSpaceOnUse" '
               'patternTransform="rotate(45)"><rect width="2.5" height="6" fill="#fff" fill-opacity="0.75"/>'
               "</pattern></defs>")
    for b, name in zip(bars, under):
        s = panel.series[b.series]
        label, x0, width, y = html.escape(s.label), sx(b.x - b.width * 0.46), w * b.width * 0.92 / num_groups, sy(b.value)
        tip = html.escape(b.tip or f"{s.label}: {b.text}" + (f" (fails at {b.upper:.4g})" if b.upper else ""))
        box = f'x="{x0:.1f}" y="{y:.1f}" width="{width:.1f}" height="{TOP + h - y:.1f}"'
        out.append(f'<rect class="bar" data-series="{label}" data-tip="{tip}" {box} fill="{s.colour}"/>')
        if b.lower_bound:
            out.append(f'<rect class="hatch" data-series="{label}" data-tip="{tip}" {box} fill="url(#{hatch})"/>')
        if b.upper is not None:
            cx, cap = sx(b.x), w * b.width * 0.15 / num_groups
            out.append(f'<path data-series="{label}" d="M{cx:.1f},{y:.1f}V{sy(b.upper):.1f}M{cx - cap:.1f},'
                       f'{sy(b.upper):.1f}H{cx + cap:.1f}" stroke="#000" fill="none"/>')
        out.append(_upright_or_not(sx(b.x), sy(b.top) - 4, b.text, _text_px(b.text, 10) > 0.9 * spacing,
                                   f'class="value" data-series="{label}"', "start"))
        if name:
            out.append(_upright_or_not(sx(b.x), TOP + h + (4 if upright else 14), name, upright, 'class="under"',
                                       "end"))
        if second and b.caption:
            out.append(f'<text class="under" x="{sx(b.x):.1f}" y="{TOP + h + 14 + under_h:.0f}" '
                       f'text-anchor="middle">{html.escape(b.caption)}</text>')
    for g, group in enumerate(panel.groups):
        out.append(f'<text class="group" x="{sx(g):.1f}" y="{rows_y + 10:.0f}" text-anchor="middle">'
                   f'{html.escape(group)}</text>')
    out.append(f'<text x="{LEFT + w / 2}" y="{xlabel_y:.0f}" text-anchor="middle">{html.escape(panel.xlabel)}</text>')
    out.extend(legend)
    out.extend(_marks(panel, sx, sy, TOP, TOP + h, LEFT, LEFT + w, True))
    out.append("</svg>")
    return "\n".join(out)


def _upright_or_not(x: float, y: float, text: str, upright: bool, attributes: str, upright_anchor: str) -> str:
    """Text centred at x, level; or standing from (x, y), when level it would run into its neighbours."""
    if upright:
        return (f'<text {attributes} transform="translate({x + 3.5:.1f},{y:.1f}) rotate(-90)" '
                f'text-anchor="{upright_anchor}">{html.escape(text)}</text>')
    return f'<text {attributes} x="{x:.1f}" y="{y:.1f}" text-anchor="middle">{html.escape(text)}</text>'


def _bar_legend(panel: Panel, bars, hatch: str) -> list[tuple[float, str]]:
    """A colour per strategy (click to hide its bars) and the hatch of a lower bound, as (width, svg at the
    origin) each, for _rows to lay out."""
    entries = []
    for s in panel.series if panel.groups else []:
        entries.append((14 + _text_px(s.label), f'<g class="legend-item" data-series="{html.escape(s.label)}"><rect y="-10" '
                        f'width="{14 + _text_px(s.label):.0f}" height="13" fill="transparent"/><rect '
                        f'y="-9" width="10" height="10" fill="{s.colour}"/><text x="14">{html.escape(s.label)}</text></g>'))
    if any(b.lower_bound for b in bars):
        entries.append((14 + _text_px(LOWER_BOUND_TEXT), f'<g><rect y="-9" width="10" height="10" fill="#999"/><rect '
                        f'y="-9" width="10" height="10" fill="url(#{hatch})"/><text x="14">'
                        f"{html.escape(LOWER_BOUND_TEXT)}</text></g>"))
    return entries


def _rows(entries: list[tuple[float, str]], y: float, row_height: float = 16) -> tuple[list[str], float]:
    """The entries left to right from LEFT, a new row where the next would pass the panel's right edge; and the
    height they take."""
    out, x, rows = [], float(LEFT), 1
    for width, entry in entries:
        if x > LEFT and x + width > WIDTH - RIGHT:
            x, y, rows = float(LEFT), y + row_height, rows + 1
        out.append(f'<g transform="translate({x:.1f},{y:.1f})">{entry}</g>')
        x += width + 12
    return out, rows * row_height if entries else 0.0


def _marks(panel: Panel, sx, sy, top: float, bottom: float, left: float, right: float, bars: bool) -> list[str]:
    """The threshold (a dashed line across), the marks (a dotted line up, in the series' colour, its value in the
    legend and under the pointer) and the notes."""
    out = []
    if panel.threshold is not None:
        y = sy(panel.threshold)
        out.append(f'<line class="threshold" x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#666" '
                   f'stroke-dasharray="6,4"/>')
        if bars:  # (a line panel's legend names it)
            out.append(f'<text x="{left + 4}" y="{y - 4:.1f}" fill="#666">{html.escape(panel.threshold_text)}</text>')
    for label, x in ({} if bars else panel.marks).items():
        colour, name = panel.mark_colour(label), html.escape(label)
        series = f' data-series="{name}"' if any(s.label == label for s in panel.series) else ""
        out.append(f'<line class="mark"{series} data-tip="{html.escape(panel.mark_text(label))}" x1="{sx(x):.1f}" '
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
    for i, (heading, panels, ymax) in enumerate(sections):
        body.append(f"<h2>{html.escape(heading)}</h2>")
        body.append('<div class="panels">' + "".join(_svg(p, ymax, f"{i}-{j}") for j, p in enumerate(panels))
                    + "</div>")
    payload = "" if data is None else (
        '<script type="application/json" id="data">' + json.dumps(data).replace("</", "<\\/") + "</script>")
    page = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>{''.join(body)}<div id=\"tip\"></div>{payload}"
            f"<script>{SCRIPT}</script></body></html>\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    return path

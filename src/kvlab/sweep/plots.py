"""A sweep's pictures: latency against rate per strategy (the vLLM paper's Figure 12 layout) and capacity bars.

``latency_panels`` and ``capacity_panels`` turn stored rows and searches into plain series; ``write_png`` draws
them with matplotlib and kvlab.sweep.html as a self-contained interactive page. One panel per combination of
the options that vary besides the strategy, the rate and the seed (the paper: one panel per model and dataset).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from kvlab.report.plots import LINE_COLOURS

CURVE_OPTIONS = ("strategy", "rate", "seed")  # along a panel's curves, not between panels
DEFAULT_METRIC = "normalized_latency_s_per_token_mean"
METRIC_LABELS = {"normalized_latency_s_per_token_mean": "normalized latency (s/token)"}


@dataclass(frozen=True, slots=True)
class Series:
    label: str  # the strategy
    xs: list[float]
    ys: list[float]
    colour: str


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    kind: str = "line"  # line: latency against rate · bar: capacity per strategy
    upper: list[float | None] = field(default_factory=list)  # bars: the bracket's failing end


def panel_titles(points: list[dict[str, Any]], skip: tuple[str, ...] = CURVE_OPTIONS) -> list[str]:
    """Each point's panel: the options that vary between the points (besides ``skip``), as name=value."""
    varying = [name for name in points[0] if name not in skip and len({repr(p.get(name)) for p in points}) > 1]
    return [", ".join(f"{name}={p[name]}" for name in varying) for p in points]


def _colours(labels: list[str]) -> dict[str, str]:
    return {label: LINE_COLOURS[i % len(LINE_COLOURS)] for i, label in enumerate(dict.fromkeys(labels))}


def latency_panels(rows: list[dict[str, Any]], option_names: list[str], metric: str = DEFAULT_METRIC) -> list[Panel]:
    """Mean of ``metric`` over seeds at each rate, one series per strategy, one panel per other combination."""
    rows = [r for r in rows if r["status"] == "ok" and r.get(metric) is not None and r.get("rate") is not None]
    if not rows:
        return []
    titles = panel_titles([{n: r[n] for n in option_names} for r in rows])
    colours = _colours([r["strategy"] for r in rows])
    grouped: dict[str, dict[str, dict[float, list[float]]]] = {}
    for title, row in zip(titles, rows):
        grouped.setdefault(title, {}).setdefault(row["strategy"], {}).setdefault(row["rate"], []).append(row[metric])
    panels = []
    for title, by_strategy in grouped.items():
        series = [Series(s, sorted(v), [fmean(v[x]) for x in sorted(v)], colours[s]) for s, v in by_strategy.items()]
        panels.append(Panel(title, "request rate (req/s)", METRIC_LABELS.get(metric, metric), series))
    return panels


def capacity_panels(configurations: list[dict[str, Any]], searches) -> list[Panel]:
    """One bar per configuration (its capacity, with the bracket's failing end), grouped like the curves."""
    titles = panel_titles(configurations, skip=("strategy", "rate"))
    colours = _colours([c["strategy"] for c in configurations])
    grouped: dict[str, list[tuple[str, float, float | None]]] = {}
    for title, config, search in zip(titles, configurations, searches):
        grouped.setdefault(title, []).append((config["strategy"], search.capacity, search.hi))
    panels = []
    for title, bars in grouped.items():
        series = [Series(label, [float(i)], [capacity], colours[label]) for i, (label, capacity, _) in enumerate(bars)]
        panels.append(Panel(title, "strategy", "capacity (req/s)", series, kind="bar", upper=[hi for *_, hi in bars]))
    return panels


def write_png(panels: list[Panel], path: Path, *, title: str, ymax: float | None = None) -> Path:
    """All panels side by side in one PNG (the paper's Figure 12 is a row of such panels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 0.6, 3.8), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        if panel.kind == "bar":
            _bars(ax, panel)
        else:
            for s in panel.series:
                ax.plot(s.xs, s.ys, marker="o", markersize=3.5, color=s.colour, label=s.label)
            ax.set_xlim(left=0)
            top = ymax if ymax is not None else max(y for s in panel.series for y in s.ys) * 1.05
            ax.set_ylim(0, top)
            ax.legend(fontsize=8)
        ax.set_title(panel.title or title, fontsize=9)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _bars(ax, panel: Panel) -> None:
    names = [s.label for s in panel.series]
    heights = [s.ys[0] for s in panel.series]
    ax.bar(names, heights, color=[s.colour for s in panel.series])
    for i, (height, hi) in enumerate(zip(heights, panel.upper)):
        if hi is not None:  # the capacity lies in [height, hi)
            ax.plot([i, i], [height, hi], color="black", linewidth=1)
        ax.text(i, height, f"{height:.3g}", ha="center", va="bottom", fontsize=8)
    ax.tick_params(axis="x", labelsize=8, rotation=15)

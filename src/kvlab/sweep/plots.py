"""A sweep's pictures: latency against rate per strategy (the vLLM paper's Figure 12 layout) and capacity bars.

``latency_panels`` and ``capacity_panels`` turn stored rows and searches into plain series; ``write_png`` draws
them with matplotlib and kvlab.sweep.html as a self-contained interactive page. One panel per combination of
the options that vary besides the strategy, the rate and the seed (the paper: one panel per model and dataset),
laid out in a grid at most three panels wide.
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
MAX_COLUMNS = 3  # panels per row of a figure
PANEL_SIZE = (4.6, 3.6)  # inches per panel (width, height)
MARK_GREY = "#666666"


@dataclass(frozen=True, slots=True)
class Series:
    label: str  # the strategy
    xs: list[float]
    ys: list[float]
    colour: str


@dataclass(frozen=True, slots=True)
class Panel:
    """One panel: its series, and optional marks a reader needs to judge them.

    ``threshold`` is a horizontal dashed line (an SLO's target, a paper's axis end) labelled ``threshold_label``;
    ``marks`` maps a label to an x: a vertical line there, in the colour of the series of that label (each
    strategy's capacity) or grey for a label no series has; ``notes`` are lines of text printed in the panel
    (a point beyond a paper's axis); ``ylog`` draws the y axis on a log scale (latency climbing by orders of
    magnitude). Bar panels draw the threshold and the notes, not the marks (their x is a strategy, not a rate)."""

    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    kind: str = "line"  # line: latency against rate · bar: capacity per strategy
    upper: list[float | None] = field(default_factory=list)  # bars: the bracket's failing end
    threshold: float | None = None
    threshold_label: str = ""
    marks: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    ylog: bool = False

    @property
    def threshold_text(self) -> str:
        return self.threshold_label or ("" if self.threshold is None else f"threshold {self.threshold:g}")

    def mark_colour(self, label: str) -> str:
        return next((s.colour for s in self.series if s.label == label), MARK_GREY)


def grid_shape(num_panels: int, max_columns: int = MAX_COLUMNS) -> tuple[int, int]:
    """(rows, columns) of a grid holding ``num_panels``: at most ``max_columns`` wide, as many rows as needed."""
    columns = max(1, min(max_columns, num_panels))
    return -(-max(1, num_panels) // columns), columns


def shared_labels(panels: list[Panel]) -> list[str] | None:
    """The series labels every line panel shares, in order, when there is more than one panel and they are the
    same everywhere: then one legend for the figure reads better than one per panel."""
    if len(panels) < 2 or any(p.kind != "line" for p in panels):
        return None
    labels = [[s.label for s in p.series] for p in panels]
    return labels[0] if all(set(other) == set(labels[0]) for other in labels) else None


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


def write_png(panels: list[Panel], path: Path, *, title: str, ymax: float | None = None,
              description: str = "") -> Path:
    """The panels in a grid (at most three a row) in one PNG; ``description`` (the setup) printed under the
    title and kept in the file's Description field."""
    import textwrap

    if description:
        title += "\n" + "\n".join(textwrap.wrap(description, 70 * grid_shape(len(panels))[1]))
    fig = build_figure(panels, title=title, ymax=ymax)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, metadata={"Description": description} if description else None)
    return path


def build_figure(panels: list[Panel], *, title: str, ymax: float | None = None):
    """A matplotlib Figure of the panels in a grid (no pyplot state: nothing to close), one shared legend under
    the panels when they share their series."""
    from matplotlib.figure import Figure

    rows, columns = grid_shape(len(panels))
    shared = shared_labels(panels)
    fig = Figure(figsize=(PANEL_SIZE[0] * columns + 0.4, PANEL_SIZE[1] * rows + (0.9 if shared else 0.5)),
                 layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax, panel in zip(axes, panels):
        if panel.kind == "bar":
            _bars(ax, panel)
        else:
            _lines(ax, panel, ymax, legend=shared is None)
        _decorate(ax, panel)
        ax.set_title(panel.title or title, fontsize=9)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    if shared:
        handles = {h.get_label(): h for h in axes[0].get_lines()}
        fig.legend([handles[label] for label in shared], shared, loc="outside lower center", ncol=len(shared),
                   fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    return fig


def _lines(ax, panel: Panel, ymax: float | None, *, legend: bool) -> None:
    for s in panel.series:
        ax.plot(s.xs, s.ys, marker="o", markersize=3.5, color=s.colour, label=s.label)
    ax.set_xlim(left=0)
    values = [y for s in panel.series for y in s.ys] + ([panel.threshold] if panel.threshold is not None else [])
    if panel.ylog:  # (matplotlib's own limits: a log axis has no zero)
        ax.set_yscale("log")
        if ymax is not None:
            ax.set_ylim(top=ymax)
    else:
        ax.set_ylim(0, ymax if ymax is not None else (max(values, default=0.0) * 1.05 or 1.0))
    for label, x in panel.marks.items():
        ax.axvline(x, color=panel.mark_colour(label), linestyle=":", linewidth=1.2, label=f"_mark {label}",
                   gid=f"mark:{label}")
        ax.annotate(f"{label} {x:.3g}", (x, 1), xycoords=("data", "axes fraction"), xytext=(2, -2),
                    textcoords="offset points", rotation=90, va="top", ha="left", fontsize=7,
                    color=panel.mark_colour(label))
    if legend:
        ax.legend(fontsize=8)


def _decorate(ax, panel: Panel) -> None:
    """The threshold and the notes, on any kind of panel."""
    if panel.threshold is not None:
        ax.axhline(panel.threshold, color=MARK_GREY, linestyle="--", linewidth=1, label="_threshold",
                   gid="threshold")
        ax.annotate(panel.threshold_text, (0, panel.threshold), xycoords=("axes fraction", "data"),
                    xytext=(3, 2), textcoords="offset points", fontsize=7, color=MARK_GREY)
    if panel.notes:
        ax.text(0.03, 0.97, "\n".join(panel.notes), transform=ax.transAxes, ha="left", va="top", fontsize=7,
                color="#a00000", bbox={"facecolor": "white", "edgecolor": "#a00000", "alpha": 0.85, "pad": 3},
                gid="notes")


def _bars(ax, panel: Panel) -> None:
    names = [s.label for s in panel.series]
    heights = [s.ys[0] for s in panel.series]
    ax.bar(names, heights, color=[s.colour for s in panel.series])
    for i, (height, hi) in enumerate(zip(heights, panel.upper)):
        if hi is not None:  # the capacity lies in [height, hi)
            ax.plot([i, i], [height, hi], color="black", linewidth=1)
        ax.text(i, height, f"{height:.3g}", ha="center", va="bottom", fontsize=8)
    ax.tick_params(axis="x", labelsize=8, rotation=15)


def slo_panels(configurations: list[dict[str, Any]], searches, labels: list[str], slo) -> list[Panel]:
    """The target's own metric (its first term's statistic, or goodput's attainment) at every rate each search
    tried, one series per configuration (``labels``), the target's threshold drawn and each answer marked; one
    panel per combination of the other options that vary."""
    titles = panel_titles(configurations, skip=("strategy", "rate", "cost", "num_requests"))
    colours = _colours(labels)
    term = slo.terms[0]
    if slo.goodput is None:
        ylabel, threshold, scale = f"{term.text.split('<')[0]} (s)", term.limit_s, 1.0
    else:
        ylabel, threshold, scale = "share of requests meeting every term", slo.goodput, 1.0
    grouped: dict[str, list[Series]] = {}
    marks: dict[str, dict[str, float]] = {}
    for title, label, search in zip(titles, labels, searches):
        probes = sorted((rate, value) for rate, value, _ in search.probes if value is not None
                        and value == value and value != float("inf"))
        if not probes:
            continue
        grouped.setdefault(title, []).append(Series(label, [r for r, _ in probes], [v * scale for _, v in probes],
                                                    colours[label]))
        if search.lo:
            marks.setdefault(title, {})[label] = search.lo
    label = (f"target {term.limit_s:g} s" if slo.goodput is None else f"goodput {slo.goodput:.0%}")
    return [Panel(title, "request rate (req/s)", ylabel, series, threshold=threshold, threshold_label=label,
                  marks=marks.get(title, {}), ylog=slo.goodput is None) for title, series in grouped.items()]

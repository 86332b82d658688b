"""A sweep's pictures: latency against rate per strategy (the vLLM paper's Figure 12 layout) and capacity bars.

``latency_panels``, ``capacity_panels`` and ``slo_panels`` turn stored rows and searches into plain series;
``write_png`` draws them with matplotlib and kvlab.sweep.html as a self-contained interactive page. One panel per
combination of the options that vary besides those along a panel (the paper: one panel per model and dataset),
laid out in a grid at most three panels wide. Capacity bars stand side by side per strategy in groups (one per
cost profile); every legend and caption sits outside the data, and every title is wrapped to the figure's width.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from kvlab.report.plots import LINE_COLOURS
from kvlab.sweep.capacity import mark_text, rate_text

CURVE_OPTIONS = ("strategy", "rate", "seed")  # along a panel's curves, not between panels
CAPACITY_OPTIONS = ("strategy", "rate")  # along a capacity panel's bars, not between panels
DEFAULT_METRIC = "normalized_latency_s_per_token_mean"
METRIC_LABELS = {"normalized_latency_s_per_token_mean": "normalized latency (s/token)"}
GROUP_LABELS = {"cost": "cost profile"}
MAX_COLUMNS = 3  # panels per row of a figure
PANEL_SIZE = (4.6, 3.6)  # inches per panel (width, height), axes with their ticks, labels and title
BAR_INCHES = 0.55  # a bar panel's width per bar, at least: room for the value and the caption of each
BAR_GROUP_WIDTH = 0.8  # of the space between two groups' centres, the share their bars fill
SHARE_Y_WITHIN = 3.0  # bar panels share one y scale unless one's tallest bar is this many times another's
LINE_STYLES = ("-", "--", "-.", (0, (5, 1, 1, 1, 1, 1)))  # a second cost profile's curves dashed, ...
MARK_GREY = "#666666"
HATCH = "///"
TITLE_SIZE, TEXT_SIZE, SMALL_SIZE = 10.0, 8.0, 7.0  # points
LOWER_BOUND_TEXT = "hatched: not certified (≥ a lower bound; ? too short to load the engine)"


@dataclass(frozen=True, slots=True)
class Series:
    """One strategy's points. A line panel draws ``xs`` against ``ys``; a bar panel draws a bar per value, in the
    group ``panel.groups[int(x)]``, with the optional per-bar fields below (each, when given, one per value)."""

    label: str  # the strategy
    xs: list[float]
    ys: list[float]
    colour: str
    linestyle: Any = "-"  # lines: a matplotlib line style (a second cost profile's curves dashed)
    upper: list[float | None] = field(default_factory=list)  # bars: the bracket's failing end (value in [y, upper))
    lower_bound: list[str] = field(default_factory=list)  # bars: Search.mark: ≥ or ? (hatched), "" certified
    captions: list[str] = field(default_factory=list)  # bars: a word under the bar (what limited the answer)
    tips: list[str] = field(default_factory=list)  # the page's hover text of each point, when more than its value


@dataclass(frozen=True, slots=True)
class Panel:
    """One panel: its series, and optional marks a reader needs to judge them.

    ``threshold`` is a horizontal dashed line (an SLO's target, a paper's axis end) labelled ``threshold_label``;
    ``marks`` maps a label to an x: a vertical dotted line there, in the colour of the series of that label (each
    strategy's capacity) or grey for a label no series has, its value in the legend (after ``mark_name``, e.g.
    "vllm: capacity 2.25"); ``notes`` are lines of text printed in the panel (a point beyond a paper's axis);
    ``ylog`` draws the y axis on a log scale (latency climbing by orders of magnitude). Bar panels draw the
    threshold and the notes, not the marks (their x is a strategy, not a rate): their bars stand side by side in
    ``groups`` (each series' xs index them; none: one bar per series, named under it). ``upper``: the bracket's
    failing end of each one-bar series (Series.upper for several bars each)."""

    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    kind: str = "line"  # line: latency against rate · bar: capacity per strategy
    upper: list[float | None] = field(default_factory=list)  # bars: one per series (one bar each)
    threshold: float | None = None
    threshold_label: str = ""
    marks: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    ylog: bool = False
    groups: list[str] = field(default_factory=list)  # bars: the groups along x, e.g. the cost profiles
    mark_name: str = ""  # what a mark's value is, in the legend: "capacity"

    @property
    def threshold_text(self) -> str:
        return self.threshold_label or ("" if self.threshold is None else f"threshold {self.threshold:g}")

    def mark_colour(self, label: str) -> str:
        return next((s.colour for s in self.series if s.label == label), MARK_GREY)

    def mark_text(self, label: str) -> str:
        """A mark's legend text: "vllm: capacity 2.25"."""
        return f"{label}: {self.mark_name + ' ' if self.mark_name else ''}{rate_text(self.marks[label])}"

    def series_text(self, series: Series) -> str:
        """A series' legend text, with its mark's value when it has one."""
        return self.mark_text(series.label) if series.label in self.marks else series.label


@dataclass(frozen=True, slots=True)
class Bar:
    """Where one bar of a bar panel stands (x in group units: group g's bars are centred on g) and what it says."""

    series: int  # index into the panel's series
    group: int
    x: float
    width: float
    value: float
    upper: float | None
    lower_bound: str  # Search.mark: "≥" a lower bound, "?" too short to load the engine, "" certified
    caption: str
    tip: str

    @property
    def text(self) -> str:
        return mark_text(self.lower_bound, rate_text(self.value))

    @property
    def top(self) -> float:
        return max(self.value, self.upper or 0.0)


def bar_layout(panel: Panel) -> list[Bar]:
    """Each bar of a bar panel, left to right: the series side by side (in the same place in every group, so that
    a missing bar leaves a gap rather than shifting its neighbours), groups one unit apart."""
    width = BAR_GROUP_WIDTH / max(1, len(panel.series))
    bars = []
    for i, s in enumerate(panel.series):
        values = list(zip(s.xs, s.ys)) if panel.groups else list(zip([0.0], s.ys[:1]))
        for j, (x, y) in enumerate(values):
            group = int(x) if panel.groups else 0
            upper = s.upper[j] if j < len(s.upper) else (panel.upper[i] if i < len(panel.upper) else None)
            bars.append(Bar(i, group, group + (i - (len(panel.series) - 1) / 2) * width, width, y, upper,
                            s.lower_bound[j] if j < len(s.lower_bound) else "", s.captions[j] if j < len(s.captions) else "",
                            s.tips[j] if j < len(s.tips) else ""))
    return sorted(bars, key=lambda b: b.x)


def grid_shape(num_panels: int, max_columns: int = MAX_COLUMNS) -> tuple[int, int]:
    """(rows, columns) of a grid holding ``num_panels``: at most ``max_columns`` wide, as many rows as needed."""
    columns = max(1, min(max_columns, num_panels))
    return -(-max(1, num_panels) // columns), columns


def shared_labels(panels: list[Panel]) -> list[str] | None:
    """The legend every line panel shares, when they all have the same one: then one legend for the figure,
    under the panels, reads better than one per panel."""
    if not panels or any(p.kind != "line" for p in panels):
        return None
    texts = [[text for _, text in _legend_entries(p)] for p in panels]
    return texts[0] if all(t == texts[0] for t in texts) else None


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


def capacity_panels(configurations: list[dict[str, Any]], searches, *, group_by: str = "cost",
                    skip: tuple[str, ...] = CAPACITY_OPTIONS) -> list[Panel]:
    """A bar per configuration: its capacity (kvlab.sweep.capacity.Search), the bracket's failing end as a
    whisker, a lower bound hatched and marked ≥, what limited it (latency, throughput) under it. The strategies
    stand side by side in groups of ``group_by``'s values (when it has several); one panel per combination of the
    other options that vary (besides ``skip``)."""
    titles = panel_titles(configurations, skip=(*skip, group_by))
    groups = list(dict.fromkeys(str(c.get(group_by)) for c in configurations))
    named = len(groups) > 1
    colours = _colours([c["strategy"] for c in configurations])
    grouped: dict[str, dict[str, list[tuple[int, Any]]]] = {}
    for title, config, search in zip(titles, configurations, searches):
        group = groups.index(str(config.get(group_by)))
        grouped.setdefault(title, {}).setdefault(config["strategy"], []).append((group, search))
    words = {_limit_word(s) for s in searches}
    along = GROUP_LABELS.get(group_by, group_by) if named else "strategy"
    if len(words) == 1:  # (the same everywhere: said once, not under every bar)
        xlabel, captioned = along + (f" (every answer limited by {next(iter(words))})" if any(words) else ""), False
    else:
        xlabel, captioned = along + " (under each bar: what limited it)", True
    return [Panel(title, xlabel, "capacity (req/s)",
                  [_bar_series(label, colours[label], found, groups if named else [], captioned)
                   for label, found in bars.items()], kind="bar", groups=groups if named else [])
            for title, bars in grouped.items()]


def _bar_series(label: str, colour: str, found: list[tuple[int, Any]], groups: list[str], captioned: bool) -> Series:
    return Series(label, [float(g) for g, _ in found], [s.capacity for _, s in found], colour,
                  upper=[s.hi for _, s in found], lower_bound=[s.mark for _, s in found],
                  captions=[_limit_word(s) for _, s in found] if captioned else [],
                  tips=[_capacity_tip(label + (f" under {groups[g]}" if groups else ""), s) for g, s in found])


def _limit_word(search) -> str:
    """What stopped the answer going higher, in a word: latency, throughput, refusals (Search.limited_by)."""
    if search.error:
        return "failed"
    return (search.limited_by or "").split(":")[0]


def _capacity_tip(name: str, search) -> str:
    if search.error:
        return f"{name}: failed: {search.error}"
    lines = [f"{name}: {mark_text(search.mark, rate_text(search.capacity))} req/s"
             + ("" if search.hi is None else f" (fails at {search.hi:.4g})")]
    if search.limited_by:
        lines.append(f"limited by {search.limited_by}")
    if search.uncertified:
        lines.append(f"not certified: {search.uncertified}")
    return "\n".join(lines)


def slo_panels(configurations: list[dict[str, Any]], searches, labels: list[str], slo) -> list[Panel]:
    """Each term of the target (its statistic at every rate each search tried; goodput: the attainment), one series
    per configuration (``labels``: a colour per strategy, a line style per cost profile), the term's threshold drawn
    and each answer marked; one panel per term and per combination of the other options that vary. The binding
    term (the one a search's lowest failing rate missed) says so in its panel's title."""
    titles = panel_titles(configurations, skip=("strategy", "rate", "cost", "num_requests"))
    colours = _colours([c["strategy"] for c in configurations])
    styles = {cost: LINE_STYLES[i % len(LINE_STYLES)]
              for i, cost in enumerate(dict.fromkeys(str(c.get("cost")) for c in configurations))}
    if slo.goodput is None:
        terms = [(t.text, f"{t.text.split('<')[0]} (s)", t.limit_s, f"target {t.limit_s:g} s") for t in slo.terms]
    else:
        terms = [("", "share of requests meeting every term", slo.goodput, f"goodput {slo.goodput:.0%}")]
    binding = {text for search in searches for text, *_ in terms if text and _missed_at_hi(search, text)}
    panels = []
    for text, ylabel, threshold, threshold_label in terms:
        grouped: dict[str, list[Series]] = {}
        marks: dict[str, dict[str, float]] = {}
        for title, config, label, search in zip(titles, configurations, labels, searches):
            # (a probe recorded without each term's value: its one value is the first term's, Slo.value)
            probes = sorted((rate, value) for (rate, first, _), verdict in zip(search.probes, search.verdicts)
                            if (value := verdict.values.get(text, first if text == terms[0][0] else None) if text
                                else verdict.attainment) is not None and value == value and value != float("inf"))
            if not probes:
                continue
            grouped.setdefault(title, []).append(Series(label, [r for r, _ in probes], [v for _, v in probes],
                                                        colours[config["strategy"]], styles[str(config.get("cost"))]))
            if search.lo:
                marks.setdefault(title, {})[label] = search.lo
        name = text + (" (binding)" if text in binding else "") if len(terms) > 1 else ""  # (one: the figure's title)
        panels += [Panel(" · ".join(p for p in (title, name) if p), "request rate (req/s)", ylabel, series,
                         threshold=threshold, threshold_label=threshold_label, marks=marks.get(title, {}),
                         ylog=slo.goodput is None, mark_name="capacity")
                   for title, series in grouped.items()]
    return panels


def _missed_at_hi(search, text: str) -> bool:
    """Whether the search's lowest failing rate missed the term ``text`` (kvlab.sweep.slo: "missed TERM (value)")."""
    return any(rate == search.hi and not held and f"missed {text} (" in verdict.reason
               for (rate, _, held), verdict in zip(search.probes, search.verdicts))


def write_png(panels: list[Panel], path: Path, *, title: str, ymax: float | None = None,
              description: str = "") -> Path:
    """The panels in a grid (at most three a row) in one PNG; ``description`` (the setup) printed under the
    title and kept in the file's Description field."""
    fig = build_figure(panels, title=title, ymax=ymax, description=description)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, metadata={"Description": description} if description else None)
    return path


def text_width(text: str, size: float) -> float:
    """The width in points of ``text`` (its longest line) in matplotlib's default font at ``size`` points."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import text_to_path

    font = FontProperties(size=size)
    return max(text_to_path.get_text_width_height_descent(line, font, ismath=False)[0] for line in text.split("\n"))


def wrap(text: str, width_pt: float, size: float) -> str:
    """``text`` broken at spaces into lines at most ``width_pt`` wide (a single longer word stays whole)."""
    lines = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            trial = f"{line} {word}" if line else word
            if line and text_width(trial, size) > width_pt:
                lines.append(line)
                line = word
            else:
                line = trial
        lines.append(line)
    return "\n".join(lines)


def _panel_width(panels: list[Panel]) -> float:
    """Inches per panel: the default, wider when a bar panel has many bars."""
    most_bars = max((len(bar_layout(p)) for p in panels if p.kind == "bar"), default=0)
    return max(PANEL_SIZE[0], 0.9 + BAR_INCHES * most_bars)


def build_figure(panels: list[Panel], *, title: str, ymax: float | None = None, description: str = ""):
    """A matplotlib Figure of the panels in a grid (no pyplot state: nothing to close). The title and the
    ``description`` wrapped to the figure's width above; each legend outside the data: one under the panels
    when they share it (bars: always, a colour per strategy), else one under each panel."""
    from matplotlib.figure import Figure

    rows, columns = grid_shape(len(panels))
    panel_width = _panel_width(panels)
    width = panel_width * columns + 0.4
    heading = wrap(title, width * 72 - 24, TITLE_SIZE)
    if description:
        heading += "\n" + wrap(description, width * 72 - 24, TITLE_SIZE)
    shared = shared_labels(panels)
    figure_legend = _bar_legend(panels) if shared is None else _line_legend(panels[0])
    legend_rows = _legend_rows([text for _, text in figure_legend], width * 72 - 24)
    below = [0.0 if shared is not None else _below_inches(p, panel_width) for p in panels]
    extra = sum(max(below[r * columns:(r + 1) * columns], default=0.0) for r in range(rows))
    height = (PANEL_SIZE[1] * rows + extra + (heading.count("\n") + 1) * TITLE_SIZE * 1.3 / 72
              + (legend_rows * 0.2 + 0.1 if figure_legend else 0.0))
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    tops = _bar_tops(panels, panel_width)
    for ax, panel, top in zip(axes, panels, tops):
        if panel.kind == "bar":
            _bars(ax, panel, top, panel_width)
        else:
            _lines(ax, panel, ymax)
            if shared is None:
                _panel_legend(ax, panel, panel_width)
        _decorate(ax, panel)
        if panel.title:
            ax.set_title(wrap(panel.title, panel_width * 72 - 60, TEXT_SIZE + 1), fontsize=TEXT_SIZE + 1)
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3, axis="y" if panel.kind == "bar" else "both")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    if figure_legend:
        handles, texts = zip(*figure_legend)
        fig.legend(handles, texts, loc="outside lower center", fontsize=TEXT_SIZE, frameon=False,
                   ncol=-(-len(texts) // legend_rows))
    fig.suptitle(heading, fontsize=TITLE_SIZE)
    return fig


def _legend_rows(texts: list[str], width_pt: float, size: float = TEXT_SIZE) -> int:
    """Rows of a legend of ``texts`` laid out as many to a row as fit ``width_pt`` (matplotlib's spacing:
    a 2-em handle, 0.8 em before the text, 2 em between columns)."""
    if not texts:
        return 0
    entry = max(text_width(t, size) for t in texts) + 4.8 * size
    columns = max(1, min(len(texts), int(width_pt // entry)))
    return -(-len(texts) // columns)


def _below_inches(panel: Panel, panel_width: float) -> float:
    """The height a panel's own legend (lines) or its second row of names (bars) takes under it."""
    if panel.kind == "bar":
        if panel.groups:
            return (_caption_pad(panel, panel_width) + TEXT_SIZE - 6) / 72
        return TEXT_SIZE * 1.2 / 72 if any(b.caption for b in bar_layout(panel)) else 0.0
    return _legend_rows([text for _, text in _legend_entries(panel)], panel_width * 72) * 0.19 + 0.1


def _legend_entries(panel: Panel) -> list[tuple[dict[str, Any], str]]:
    """A line panel's legend: (line properties, text) of each series (with its mark's value), each mark no
    series has, and the threshold."""
    entries = [({"color": s.colour, "linestyle": s.linestyle, "marker": "o", "markersize": 3.5}, panel.series_text(s))
               for s in panel.series]
    names = {s.label for s in panel.series}
    entries += [({"color": MARK_GREY, "linestyle": ":"}, panel.mark_text(label)) for label in panel.marks
                if label not in names]
    if panel.threshold is not None:
        entries.append(({"color": MARK_GREY, "linestyle": "--", "linewidth": 1}, panel.threshold_text))
    return entries


def _line_legend(panel: Panel) -> list[tuple[Any, str]]:
    from matplotlib.lines import Line2D

    return [(Line2D([], [], **props), text) for props, text in _legend_entries(panel)]


def _bar_legend(panels: list[Panel]) -> list[tuple[Any, str]]:
    """Bars' legend: a colour per strategy (when the bars stand in named groups) and the hatch of a lower bound."""
    from matplotlib.patches import Patch

    bar_panels = [p for p in panels if p.kind == "bar"]
    colours = {s.label: s.colour for p in bar_panels if p.groups for s in p.series}
    entries: list[tuple[Any, str]] = [(Patch(color=c), label) for label, c in colours.items()]
    if any(b.lower_bound for p in bar_panels for b in bar_layout(p)):
        entries.append((Patch(facecolor="white", edgecolor=MARK_GREY, hatch=HATCH), LOWER_BOUND_TEXT))
    return entries


def _panel_legend(ax, panel: Panel, panel_width: float) -> None:
    """A line panel's own legend, under its x axis label (outside the data: it never hides a curve)."""
    from matplotlib.transforms import ScaledTranslation

    handles, texts = zip(*_line_legend(panel)) if panel.series or panel.marks else ((), ())
    if not texts:
        return
    rows = _legend_rows(list(texts), panel_width * 72)
    under = ax.transAxes + ScaledTranslation(0, -30 / 72, ax.figure.dpi_scale_trans)  # (the ticks and x label)
    ax.legend(handles, texts, loc="upper center", bbox_to_anchor=(0.5, 0), bbox_transform=under, frameon=False,
              fontsize=TEXT_SIZE, ncol=-(-len(texts) // rows))


def _lines(ax, panel: Panel, ymax: float | None) -> None:
    for s in panel.series:
        ax.plot(s.xs, s.ys, marker="o", markersize=3.5, color=s.colour, linestyle=s.linestyle,
                label=panel.series_text(s))
    ax.set_xlim(left=0)
    ax.set_xlabel(panel.xlabel)
    values = [y for s in panel.series for y in s.ys] + ([panel.threshold] if panel.threshold is not None else [])
    if panel.ylog:  # (matplotlib's own limits: a log axis has no zero)
        ax.set_yscale("log")
        if ymax is not None:
            ax.set_ylim(top=ymax)
    else:
        ax.set_ylim(0, ymax if ymax is not None else (max(values, default=0.0) * 1.05 or 1.0))
    for label, x in panel.marks.items():  # (their values are in the legend: no text at the line to overprint)
        ax.axvline(x, color=panel.mark_colour(label), linestyle=":", linewidth=1.2, label=f"_mark {label}",
                   gid=f"mark:{label}")


def _decorate(ax, panel: Panel) -> None:
    """The threshold (labelled on bar panels; a line panel's legend names it) and the notes, on any panel."""
    if panel.threshold is not None:
        ax.axhline(panel.threshold, color=MARK_GREY, linestyle="--", linewidth=1, label="_threshold",
                   gid="threshold")
        if panel.kind == "bar":
            ax.annotate(panel.threshold_text, (0, panel.threshold), xycoords=("axes fraction", "data"),
                        xytext=(3, 2), textcoords="offset points", fontsize=SMALL_SIZE, color=MARK_GREY)
    if panel.notes:
        ax.text(0.03, 0.97, "\n".join(panel.notes), transform=ax.transAxes, ha="left", va="top", fontsize=SMALL_SIZE,
                color="#a00000", bbox={"facecolor": "white", "edgecolor": "#a00000", "alpha": 0.85, "pad": 3},
                gid="notes")


def _bar_spacing_pt(panel: Panel, panel_width: float) -> float:
    """Points between two neighbouring bars' centres (the axes about 0.9 inch narrower than the panel)."""
    num_groups = max(1, len(panel.groups))
    return (panel_width - 0.9) * 72 / num_groups * BAR_GROUP_WIDTH / max(1, len(panel.series))


def _rotated(texts: list[str], panel: Panel, panel_width: float, size: float) -> bool:
    """Whether texts centred on each bar must stand upright to miss their neighbours."""
    return bool(texts) and max(text_width(t, size) for t in texts) > 0.9 * _bar_spacing_pt(panel, panel_width)


def _caption_pad(panel: Panel, panel_width: float) -> float:
    """Points from the x axis down to a group's name: past its bars' captions, upright when they are wide."""
    captions = [b.caption for b in bar_layout(panel)]
    if not any(captions):
        return 3.0
    upright = _rotated(captions, panel, panel_width, SMALL_SIZE)
    return (max(text_width(c, SMALL_SIZE) for c in captions) if upright else SMALL_SIZE + 2) + 6


def _bar_tops(panels: list[Panel], panel_width: float) -> list[float | None]:
    """Each bar panel's y axis top: room above every bar for its value, the same for all of them (one scale to
    compare on) unless their bars differ by more than SHARE_Y_WITHIN times."""
    tops: list[float | None] = []
    for p in panels:
        bars = bar_layout(p) if p.kind == "bar" else []
        if not bars:
            tops.append(None)
            continue
        high = max([b.top for b in bars] + ([p.threshold] if p.threshold is not None else [])) or 1.0
        texts = [b.text for b in bars]
        label = max(text_width(t, SMALL_SIZE) for t in texts) if _rotated(texts, p, panel_width, SMALL_SIZE) else 9.0
        axes_pt = (PANEL_SIZE[1] - 1.1) * 72
        tops.append(high / max(0.5, 1 - (label + 6) / axes_pt))
    drawn = [t for t in tops if t is not None]
    if drawn and max(drawn) <= SHARE_Y_WITHIN * min(drawn):
        return [None if t is None else max(drawn) for t in tops]
    return tops


def _bars(ax, panel: Panel, top: float | None, panel_width: float) -> None:
    """Each bar with its bracket (a whisker up to the failing rate) and its value above; under it, the strategy
    (bars in one group) or what limited it (bars in named groups, the group's name under those)."""
    bars = bar_layout(panel)
    for b in bars:
        s = panel.series[b.series]
        ax.bar(b.x, b.value, b.width * 0.92, color=s.colour, hatch=HATCH if b.lower_bound else None,
               edgecolor="white", linewidth=0, gid=f"bar:{s.label}:{b.group}")
        if b.upper is not None:  # the capacity lies in [value, upper)
            ax.plot([b.x, b.x], [b.value, b.upper], color="black", linewidth=1)
            ax.plot([b.x - b.width * 0.15, b.x + b.width * 0.15], [b.upper, b.upper], color="black", linewidth=1)
    texts = [b.text for b in bars]
    upright = _rotated(texts, panel, panel_width, SMALL_SIZE)
    for b, text in zip(bars, texts):
        ax.annotate(text, (b.x, b.top), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                    fontsize=SMALL_SIZE, rotation=90 if upright else 0, gid=f"value:{panel.series[b.series].label}")
    if top is not None:
        ax.set_ylim(0, top)
    ax.set_xlim(-0.5, max(1, len(panel.groups)) - 0.5)
    ax.xaxis.remove_overlapping_locs = False  # (a group's name sits under its middle bar)
    captions = [b.caption for b in bars]
    if not panel.groups:
        names = [panel.series[b.series].label + (f"\n{b.caption}" if b.caption else "") for b in bars]
        ax.set_xticks([b.x for b in bars], names, fontsize=TEXT_SIZE)
        ax.set_xlabel(panel.xlabel)
        return
    upright = _rotated(captions, panel, panel_width, SMALL_SIZE)
    ax.set_xticks([b.x for b in bars], captions, fontsize=SMALL_SIZE, rotation=90 if upright else 0)
    ax.set_xticks(range(len(panel.groups)), panel.groups, minor=True, fontsize=TEXT_SIZE)
    ax.tick_params(axis="x", which="minor", length=0, pad=_caption_pad(panel, panel_width))
    ax.tick_params(axis="x", which="major", length=2 if any(captions) else 0)
    ax.set_xlabel(panel.xlabel)

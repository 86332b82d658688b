"""The fewest-replicas answer drawn: p99 TTFT against the replica count, one line per search (`kvlab capacity
--replicas auto`'s replicas.png)."""

from __future__ import annotations

from typing import Any


def replicas_figure(entries: list[dict[str, Any]], slo, description: str = ""):
    """p99 TTFT against the replica count, one line per search, each answer marked (a matplotlib Figure, the setup
    in ``description`` under its title); the x axis has whole counts only."""
    from matplotlib.ticker import MaxNLocator

    from kvlab.report.plots import LINE_COLOURS
    from kvlab.sweep.plots import Panel, Series, build_figure

    several = len({e["cost"] for e in entries}) > 1

    def label(e: dict[str, Any]) -> str:
        return f"{e['strategy']} · {e['router']}" + (f" · {e['cost']}" if several else "")

    series = []
    for i, e in enumerate(entries):
        points = [(r["replicas"], r["ttft_p99_s"]) for r in e["runs"] if r["ttft_p99_s"] is not None]
        series.append(Series(label(e), [float(n) for n, _ in points], [v for _, v in points],
                             LINE_COLOURS[i % len(LINE_COLOURS)]))
    ttft = next((t for t in slo.terms if t.metric == "ttft_s"), None)
    marks = {label(e): float(e["replicas"]) for e in entries if e["replicas"]}
    panel = Panel(slo.describe, "replicas", "p99 TTFT, measured window (s)", series,
                  threshold=None if ttft is None else ttft.limit_s,
                  threshold_label="" if ttft is None else f"target {ttft.limit_s:g} s", marks=marks, ylog=True,
                  mark_name="fewest replicas")
    fig = build_figure([panel], title="p99 TTFT against the replica count", description=description)
    for ax in fig.axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig

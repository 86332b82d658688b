"""A sweep's plots: PNGs, and an HTML page that works offline (no request leaves the page), shows the value
under the pointer and hides a strategy when its legend entry is clicked; `kvlab paper fig12` end to end."""

from __future__ import annotations

import json
import shutil
import tempfile
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    from kvlab.cli import main

    out = tmp_path_factory.mktemp("plots")
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", "--strategy", "vllm,orca-oracle,orca-max", "--rate", "0.5,1,1.5,2", "--seed", "0,1",
              "-n", "200", "--workers", "2", "--out", str(out), "--json"])
    assert exit_info.value.code in (0, None)
    return out


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_the_page_is_self_contained(sweep_dir):
    text = (sweep_dir / "sweep.html").read_text()
    parser = _Tags()
    parser.feed(text)
    tags = parser.tags
    assert not [t for t, a in tags if "src" in a or "href" in a]  # no script, style, image or font from anywhere
    assert "http:" not in text and "https:" not in text and "@import" not in text
    assert sum(t == "svg" for t, _ in tags) == 1
    # one marker per (strategy, rate): the seeds averaged
    assert sum(t == "circle" for t, _ in tags) == 3 * 4
    assert (sweep_dir / "latency.png").read_bytes()[:8] == PNG_MAGIC


@contextmanager
def _browser_page(path: Path):
    """The page at ``path`` in headless Chromium, every request that is not for a local file refused (and
    counted: none may be made)."""
    if not CHROMIUM.exists():
        pytest.fail("the browser tests need Debian's Chromium: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    outside: list[str] = []
    user_data_dir = tempfile.mkdtemp(prefix="kvlab-chromium-")
    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                user_data_dir, executable_path=str(CHROMIUM), headless=True,
                args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                      "--disable-background-networking", "--disable-component-update"])

            def route(r):
                if r.request.url.startswith("file://"):
                    r.continue_()
                else:
                    outside.append(r.request.url)
                    r.abort()

            context.route("**/*", route)
            page = context.new_page()
            page.goto(path.as_uri())
            yield page
            context.close()
    finally:
        shutil.rmtree(user_data_dir, ignore_errors=True)
    assert outside == []


@pytest.mark.browser
def test_the_page_hovers_and_toggles_in_a_browser_without_network(sweep_dir):
    with _browser_page(sweep_dir / "sweep.html") as page:
        circle = page.locator('circle[data-series="orca-max"]').first
        circle.hover()
        tip = page.locator("#tip")
        assert tip.is_visible() and "orca-max" in tip.inner_text() and "rate 0.5 req/s" in tip.inner_text()
        line = page.locator('polyline[data-series="vllm"]')
        assert line.is_visible()
        page.locator('.legend-item[data-series="vllm"]').click()
        assert not line.is_visible()
        assert page.locator('polyline[data-series="orca-max"]').is_visible()
        page.locator('.legend-item[data-series="vllm"]').click()
        assert line.is_visible()


@pytest.mark.browser
def test_the_capacity_page_tells_what_limited_a_bar_and_hides_a_strategy(tmp_path):
    from kvlab.sweep.html import write_html
    from kvlab.sweep.plots import capacity_panels

    configurations, searches = _two_by_two()
    path = write_html(tmp_path / "c.html", [("Capacity", capacity_panels(configurations, searches, skip=SCALED),
                                             None)], title="t")
    with _browser_page(path) as page:
        page.locator('rect.bar[data-series="vllm"]').nth(1).hover()
        tip = page.locator("#tip").inner_text()
        assert "vllm under paper-2023: 1.31 req/s (fails at 1.37)" in tip and "limited by throughput" in tip
        bars = page.locator('rect.bar[data-series="orca-max"]')
        assert bars.nth(0).is_visible() and bars.nth(1).is_visible()
        page.locator('.legend-item[data-series="orca-max"]').click()
        assert not bars.nth(0).is_visible() and not bars.nth(1).is_visible()
        assert page.locator('rect.bar[data-series="vllm"]').nth(0).is_visible()


def test_paper_fig12(kvlab, tmp_path):
    r = kvlab("paper", "fig12", "--duration", "300", "--workers", "2", "--out", tmp_path, "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert data["setup"]["cost"] == "paper-2023" and data["setup"]["model"] == "opt-13b"
    caps = data["capacities"]  # ShareGPT, the panel the paper's ranges are about
    assert caps["vllm-paper"] > caps["orca-oracle"] > caps["orca-pow2"] > caps["orca-max"] > 0
    assert caps["vllm-paper"] <= 2.0  # on the paper-era clock, inside Figure 12a's 0-2 req/s axis
    ratios = data["ratios"]
    assert set(ratios) == {"vllm_vs_orca_oracle", "vllm_vs_orca_pow2", "vllm_vs_orca_max"}
    assert ratios["vllm_vs_orca_oracle"] == pytest.approx(caps["vllm-paper"] / caps["orca-oracle"])
    assert 1.7 <= ratios["vllm_vs_orca_oracle"] <= 2.7 and 2.7 <= ratios["vllm_vs_orca_max"] <= 8.0
    for workload in ("paper-sharegpt", "paper-alpaca"):
        for search in data["workloads"][workload]["searches"].values():
            lo, hi = search["bracket"]
            assert hi / lo - 1 <= data["setup"]["rtol"] and search["num_simulations"] == len(search["probes"])
    for name in ("fig12.png", "fig12_capacity.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
    assert json.loads((tmp_path / "fig12.json").read_text())["ratios"] == ratios
    r = kvlab("paper", "fig12", "--duration", "300", "--workers", "2", "--out", tmp_path)
    assert r.exit_code == 0 and "Orca (Oracle)" in r.stdout and "inside" in r.stdout
    words = " ".join(r.stdout.split())
    assert f"{data['num_points']} points" in words and "Computed 0 simulations now" in words  # resumed from --out


def _panels(num: int, **extra):
    from kvlab.sweep.plots import Panel, Series

    series = [Series("vllm", [1.0, 2.0, 3.0], [0.05, 0.08, 1.5], "#0072B2"),
              Series("orca-max", [1.0, 2.0, 3.0], [0.06, 0.9, 4.0], "#D55E00")]
    return [Panel(f"panel {i}", "request rate (req/s)", "normalized latency (s/token)", series, **extra)
            for i in range(num)]


def test_nine_panels_make_a_grid_not_a_row(tmp_path):
    from PIL import Image

    from kvlab.sweep.plots import grid_shape, write_png

    assert grid_shape(9) == (3, 3) and grid_shape(4) == (2, 3) and grid_shape(1) == (1, 1)
    width, height = Image.open(write_png(_panels(9), tmp_path / "nine.png", title="nine")).size
    assert width < 2 * height * 1.5 and width <= 1800  # three panels a row, three rows: not 5040 x 456


def test_threshold_and_marks_are_drawn():
    from kvlab.sweep.plots import build_figure

    panels = _panels(2, threshold=0.1, threshold_label="SLO 0.1 s", marks={"vllm": 2.4, "orca-max": 1.3},
                     notes=["vllm 49.7 req/s: beyond the paper's axis (0-30 req/s)"], ylog=True)
    fig = build_figure(panels, title="t")
    ax = fig.axes[0]
    by_gid = {line.get_gid(): line for line in ax.get_lines() if line.get_gid()}
    assert list(by_gid["threshold"].get_ydata()) == [0.1, 0.1] and by_gid["threshold"].get_linestyle() == "--"
    assert by_gid["mark:vllm"].get_xdata()[0] == 2.4 and by_gid["mark:vllm"].get_color() == "#0072B2"
    assert by_gid["mark:orca-max"].get_color() == "#D55E00"
    assert ax.get_yscale() == "log"
    assert any("beyond the paper's axis" in t.get_text() for t in ax.texts)
    assert len(fig.legends) == 1  # the panels share their series: one legend, the marks' values and the SLO in it
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["vllm: 2.4", "orca-max: 1.3", "SLO 0.1 s"]


def test_the_page_draws_threshold_marks_and_notes(tmp_path):
    from kvlab.sweep.html import write_html

    text = write_html(tmp_path / "p.html", [("h", _panels(2, threshold=0.1, threshold_label="SLO 0.1 s",
                                                           marks={"vllm": 2.4}, notes=["beyond"]), None)],
                      title="t").read_text()
    assert text.count('class="threshold"') == 2 and text.count('class="mark"') == 2 and "SLO 0.1 s" in text
    assert text.count('class="note"') == 2


def test_fig12_flags_a_capacity_beyond_the_papers_axis():
    from kvlab.cli.paper import _flag_beyond_axis
    from kvlab.paper import beyond_axis_note
    from kvlab.sweep.plots import Panel, Series

    assert beyond_axis_note("paper-alpaca", "vllm-paper", 29.5) is None
    note = beyond_axis_note("paper-alpaca", "vllm-paper", 49.7)
    assert note == "vLLM 49.7 req/s: beyond the paper's axis (0-30 req/s)"
    data = {"workloads": {"paper-alpaca": {"paper_axis_rps": [0.0, 30.0], "beyond_paper_axis": {"vllm-paper": note},
                                           "capacities": {"vllm-paper": 49.7}}}}
    bar = Panel("workload=paper-alpaca", "strategy", "capacity (req/s)", [Series("vllm-paper", [0.0], [49.7], "#000")],
                kind="bar", upper=[50.6])
    curve = Panel("workload=paper-alpaca", "rate", "latency", [Series("vllm-paper", [10.0, 50.0], [0.05, 0.2], "#000")])
    flagged_bar, flagged_curve = _flag_beyond_axis([bar, curve], data)
    assert flagged_bar.threshold == 30.0 and flagged_bar.notes == [note]
    assert flagged_curve.marks["vllm-paper"] == 49.7 and flagged_curve.notes == [note]


def test_paper_fig18b_short_run(kvlab, tmp_path):
    r = kvlab("paper", "fig18b", "--block-sizes", "4,16,256", "--duration", "60", "--workers", "1", "--out", tmp_path,
              "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    rows = {(row["workload"], row["block_size"]): row for row in data["rows"]}
    assert set(rows) == {(w, b) for w in ("paper-sharegpt", "paper-alpaca") for b in (4, 16, 256)}
    assert rows["paper-alpaca", 16]["paper_best"] == [16, 32]
    assert rows["paper-sharegpt", 16]["paper_best"] == [16, 32, 64, 128]
    # Alpaca's short requests lose most to 256-token blocks (memory), and 16 is among kvlab's best
    assert rows["paper-alpaca", 256]["normalized_latency_s_per_token"] > rows["paper-alpaca", 16][
        "normalized_latency_s_per_token"]
    assert 16 in rows["paper-alpaca", 16]["kvlab_best"]
    assert any("no per-block kernel term" in n for n in data["notes"])
    assert any("--block-size 4" in n for n in data["notes"])
    assert (tmp_path / "fig18b.png").read_bytes()[:8] == PNG_MAGIC


def _search(lo: float, hi: float | None, reason: str = "missed p99_ttft<2s (2.41 s)"):
    """A finished capacity search: ``lo`` held (its run loaded the engine), ``hi`` failed for ``reason``."""
    from kvlab.sweep.capacity import Search
    from kvlab.sweep.slo import Verdict

    search = Search(start_rate=lo)
    search.record(lo, 1.0, True, window={"loaded": True, "num_arrived": 500, "num_seats": 256})
    if hi is not None:
        search.record(hi, 3.0, False, Verdict(False, {}, None, reason))
    return search


def _two_by_two(model: str = "opt-13b", scale: float = 1.0):
    """vllm and orca-max under two cost profiles, num_requests scaled per strategy (as kvlab capacity does);
    orca-max under paper-2023 only a lower bound (no rate tried failed), vllm under it limited by throughput."""
    configurations = [{"strategy": strategy, "model": model, "cost": cost, "num_requests": n, "rate": None}
                      for strategy, n in (("vllm", 1000), ("orca-max", 600)) for cost in ("roofline", "paper-2023")]
    searches = [_search(2.25 * scale, 2.31 * scale), _search(1.31 * scale, 1.37 * scale, "overloaded (served 91%)"),
                _search(0.344 * scale, 0.359 * scale), _search(0.16 * scale, None)]
    return configurations, searches


SCALED = ("strategy", "rate", "num_requests")  # kvlab capacity's panels when it chose the request counts


def _drawn(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _bars_of(ax):
    return sorted((p for p in ax.patches if (p.get_gid() or "").startswith("bar:")), key=lambda p: p.get_x())


def test_capacity_bars_stand_side_by_side_grouped_by_cost_profile():
    from kvlab.sweep.plots import build_figure, capacity_panels

    configurations, searches = _two_by_two()
    (panel,) = capacity_panels(configurations, searches, skip=SCALED)  # one panel: not one per profile × -n
    assert panel.groups == ["roofline", "paper-2023"] and [s.label for s in panel.series] == ["vllm", "orca-max"]
    fig = build_figure([panel], title="Capacity under p99_ttft<2s")
    _drawn(fig)
    (ax,) = [a for a in fig.axes if a.get_visible()]
    bars = _bars_of(ax)
    assert [b.get_gid() for b in bars] == ["bar:vllm:0", "bar:orca-max:0", "bar:vllm:1", "bar:orca-max:1"]
    assert [round(b.get_height(), 3) for b in bars] == [2.25, 0.344, 1.31, 0.16]
    assert bars[0].get_facecolor() == bars[2].get_facecolor() != bars[1].get_facecolor()  # a colour per strategy
    gap_within, gap_between = (bars[i + 1].get_x() - bars[i].get_x() - bars[i].get_width() for i in (0, 1))
    assert gap_between > 3 * gap_within  # two groups, not four evenly spaced bars
    assert [t.get_text() for t in ax.get_xticklabels(minor=True)] == ["roofline", "paper-2023"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["latency", "latency", "throughput", ""]  # what limited each
    assert "what limited it" in ax.get_xlabel()
    values = [t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("value:")]
    assert values == ["2.25", "0.344", "1.31", "≥ 0.16"]  # the lower bound marked ≥ ...
    assert [b.get_hatch() for b in bars] == [None, None, None, "///"]  # ... and hatched
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["vllm", "orca-max", "hatched: not certified (≥ a lower bound; ? too short to load the engine)"]
    whiskers = [line for line in ax.get_lines() if list(line.get_xdata())[0] == list(line.get_xdata())[1]]
    assert sorted(tuple(line.get_ydata()) for line in whiskers) == sorted(
        [(0.344, 0.359), (1.31, 1.37), (2.25, 2.31)])  # the bracket [held, failed) of each certified answer
    assert ax.get_ylim()[1] > 2.31  # room above the tallest whisker for its value


def test_the_same_limit_everywhere_is_said_once():
    from kvlab.sweep.plots import capacity_panels

    configurations, searches = _two_by_two()
    searches[1], searches[3] = _search(1.31, 1.37), _search(0.16, 0.17)
    (panel,) = capacity_panels(configurations, searches, skip=SCALED)
    assert panel.xlabel == "cost profile (every answer limited by latency)"
    assert not any(s.captions for s in panel.series)


def test_capacity_panels_only_for_what_the_user_varied_on_one_y_scale():
    from kvlab.sweep.plots import build_figure, capacity_panels

    first, first_searches = _two_by_two("opt-13b")
    second, second_searches = _two_by_two("llama-2-7b", scale=1.5)
    panels = capacity_panels(first + second, first_searches + second_searches, skip=SCALED)
    assert [p.title for p in panels] == ["model=opt-13b", "model=llama-2-7b"]
    fig = build_figure(panels, title="t")
    left, right = [a for a in fig.axes if a.get_visible()]
    assert left.get_ylim() == right.get_ylim()  # one scale to compare them on
    # Scales far apart (the vLLM paper's ShareGPT and Alpaca panels): each its own, short bars stay readable
    far, far_searches = _two_by_two("llama-2-7b", scale=20.0)
    left, right = [a for a in build_figure(capacity_panels(first + far, first_searches + far_searches, skip=SCALED),
                                           title="t").axes if a.get_visible()]
    assert right.get_ylim()[1] > 10 * left.get_ylim()[1]
    # -n given by the user with several values: a panel each
    assert len(capacity_panels(first, first_searches)) == 2


LONG = ("opt-13b on 1× A100-40GB · KV cache: 869 blocks of 16 tokens · scheduler: max_num_seqs 256, "
        "max_num_batched_tokens 2,048, max_model_len 2,048, chunked prefill on · workload: paper-sharegpt, poisson "
        "arrivals at the searched rate, 1,000 requests, seed 0 · cost profile: roofline")


@pytest.mark.parametrize("num_panels", [1, 2, 3, 5])
def test_the_title_and_setup_fit_inside_the_figure(num_panels):
    from kvlab.sweep.plots import build_figure

    title = "Capacity under 90% of requests with p99_ttft<2s,p99_tpot<100ms,p50_e2e<10s"
    fig = build_figure(_panels(num_panels), title=title, description=LONG)
    renderer = _drawn(fig)
    (heading,) = [t for t in fig.texts if t.get_text().startswith("Capacity under")]
    box, page = heading.get_window_extent(renderer), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    assert " ".join(heading.get_text().split()) == f"{title} {LONG}"  # wrapped, nothing dropped
    for ax in fig.axes:  # the panels and their legends inside too
        extent = ax.get_tightbbox(renderer)
        assert not ax.get_visible() or (page.x0 <= extent.x0 + 1 and extent.x1 <= page.x1 + 1)


def test_an_untitled_panel_does_not_repeat_the_figure_title():
    from dataclasses import replace

    from kvlab.sweep.plots import build_figure

    fig = build_figure([replace(_panels(1)[0], title="")], title="The target's metric", description="setup")
    _drawn(fig)
    shown = [t.get_text() for t in fig.texts] + [ax.get_title() for ax in fig.axes]
    assert sum("The target's metric" in text for text in shown) == 1


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_close_marks_are_named_in_the_legend_without_overprinting():
    from kvlab.sweep.plots import build_figure, slo_panels
    from kvlab.sweep.slo import parse_slo

    configurations, searches = _two_by_two()
    for s, rates in zip(searches, ([1.0, 2.0], [0.5, 1.0], [0.2, 0.3], [0.1, 0.15])):
        for rate in rates:
            s.record(rate, 0.5 if rate < s.capacity else 5.0, rate < s.capacity)
    labels = [f"{c['strategy']} · {c['cost']}" for c in configurations]
    (panel,) = slo_panels(configurations, searches, labels, parse_slo("p99_ttft<2s"))
    assert panel.title == "" and panel.marks["orca-max · paper-2023"] == 0.16
    fig = build_figure([panel], title="The target's metric at the rates the searches tried", description=LONG)
    renderer = _drawn(fig)
    (ax,) = fig.axes
    assert not [t for t in ax.texts if t.get_rotation()]  # no text standing at the lines
    assert {line.get_gid() for line in ax.get_lines()} >= {f"mark:{label}" for label in labels}
    legend = ax.get_legend() or fig.legends[0]
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == ["vllm · roofline: capacity 2.25", "vllm · paper-2023: capacity 1.31",
                     "orca-max · roofline: capacity 0.344", "orca-max · paper-2023: capacity 0.16", "target 2 s"]
    boxes = [t.get_window_extent(renderer) for t in legend.get_texts()]
    assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert not _overlap(legend.get_window_extent(renderer), ax.get_window_extent(renderer))  # outside the data
    styles = {line.get_label(): line.get_linestyle() for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert styles["vllm · roofline: capacity 2.25"] == "-" and styles["vllm · paper-2023: capacity 1.31"] == "--"


def test_the_page_groups_the_bars_as_the_png_does(tmp_path):
    from kvlab.sweep.html import write_html
    from kvlab.sweep.plots import capacity_panels

    configurations, searches = _two_by_two()
    panels = capacity_panels(configurations, searches, skip=SCALED)
    text = write_html(tmp_path / "c.html", [("Capacity", panels, None)], title="t").read_text()
    parser = _Tags()
    parser.feed(text)
    bars = [a for t, a in parser.tags if t == "rect" and a.get("class") == "bar"]
    assert [b["data-series"] for b in bars] == ["vllm", "orca-max", "vllm", "orca-max"]
    assert sorted(float(b["x"]) for b in bars) == [float(b["x"]) for b in bars]  # left to right
    assert "limited by throughput: overloaded (served 91%) at 1.37 req/s" in bars[2]["data-tip"]
    assert "not certified: no rate tried failed" in bars[3]["data-tip"]
    assert sum(a.get("class") == "hatch" for _, a in parser.tags) == 1 and "≥ 0.16" in text
    assert [a["data-series"] for t, a in parser.tags if a.get("class") == "legend-item"] == ["vllm", "orca-max"]
    assert ">roofline</text>" in text and ">paper-2023</text>" in text and ">throughput</text>" in text

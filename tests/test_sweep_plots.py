"""A sweep's plots: PNGs, and an HTML page that works offline (no request leaves the page), shows the value
under the pointer and hides a strategy when its legend entry is clicked; `kvlab paper fig12` end to end."""

from __future__ import annotations

import json
import shutil
import tempfile
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


@pytest.mark.browser
def test_the_page_hovers_and_toggles_in_a_browser_without_network(sweep_dir):
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
            page.goto((sweep_dir / "sweep.html").as_uri())
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
            context.close()
    finally:
        shutil.rmtree(user_data_dir, ignore_errors=True)
    assert outside == []


def test_paper_fig12(kvlab, tmp_path):
    r = kvlab("paper", "fig12", "--duration", "300", "--workers", "2", "--out", tmp_path, "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert data["setup"]["cost"] == "paper-2023" and data["setup"]["model"] == "opt-13b"
    caps = data["capacities"]  # ShareGPT, the panel the paper's ranges are about
    assert caps["vllm"] > caps["orca-oracle"] > caps["orca-pow2"] > caps["orca-max"] > 0
    assert caps["vllm"] <= 2.0  # on the paper-era clock, inside Figure 12a's 0-2 req/s axis
    ratios = data["ratios"]
    assert set(ratios) == {"vllm_vs_orca_oracle", "vllm_vs_orca_pow2", "vllm_vs_orca_max"}
    assert ratios["vllm_vs_orca_oracle"] == pytest.approx(caps["vllm"] / caps["orca-oracle"])
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
    assert "0 simulations computed" in r.stdout  # resumed from the store in --out


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
    assert any("SLO 0.1 s" in t.get_text() for t in ax.texts)
    assert len(fig.legends) == 1  # the panels share their series: one legend


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

    assert beyond_axis_note("paper-alpaca", "vllm", 29.5) is None
    note = beyond_axis_note("paper-alpaca", "vllm", 49.7)
    assert note == "vLLM 49.7 req/s: beyond the paper's axis (0-30 req/s)"
    data = {"workloads": {"paper-alpaca": {"paper_axis_rps": [0.0, 30.0], "beyond_paper_axis": {"vllm": note},
                                           "capacities": {"vllm": 49.7}}}}
    bar = Panel("workload=paper-alpaca", "strategy", "capacity (req/s)", [Series("vllm", [0.0], [49.7], "#000")],
                kind="bar", upper=[50.6])
    curve = Panel("workload=paper-alpaca", "rate", "latency", [Series("vllm", [10.0, 50.0], [0.05, 0.2], "#000")])
    flagged_bar, flagged_curve = _flag_beyond_axis([bar, curve], data)
    assert flagged_bar.threshold == 30.0 and flagged_bar.notes == [note]
    assert flagged_curve.marks["vllm"] == 49.7 and flagged_curve.notes == [note]


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

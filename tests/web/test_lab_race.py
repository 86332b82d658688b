"""The race in a real browser, and the --html export opened from disk with the network off."""

from __future__ import annotations

import pytest
from labpage import set_form

RACE = {"rate": "4", "num_requests": "40", "seed": "2", "workload": "paper-sharegpt"}
CLI = ["race", "--workload", "paper-sharegpt", "--rate", "4", "--num-requests", "40", "--seed", "2", "--json"]

# The finish table's columns and the `kvlab race --json` field each one shows.
COLUMNS = {
    "num_finished": lambda s: s["num_finished"],
    "finish_time": lambda s: s["makespan_s"],
    "throughput_rps": lambda s: s["throughput_rps"],
    "throughput_tps": lambda s: s["throughput_tps"],
    "token_share": lambda s: s["memory_shares"]["token"],
    "mean_batch_size": lambda s: s["mean_batch_size"],
    "preemptions": lambda s: s["preemptions"],
    "recomputed_tokens": lambda s: s["recomputed_tokens"],
    # The median, as `kvlab race` prints its "lat." column (the table once gave the mean under the same name).
    "normalized_latency_p50": lambda s: s["normalized_latency_s_per_token"]["p50"],
}


def finish_table(page, section: str = "#race") -> dict[str, dict[str, float]]:
    return page.evaluate(
        """sel => { const out = {};
        for (const row of document.querySelectorAll(`${sel} table.summary tr[data-strategy]`)) {
            const cells = {};
            for (const td of row.querySelectorAll('td[data-key]')) cells[td.dataset.key] = Number(td.dataset.value);
            out[row.dataset.strategy] = cells; }
        return out; }""",
        section,
    )


def assert_agrees(table: dict, expected: list[dict]):
    assert list(table) == [s["name"] for s in expected]
    for s in expected:
        for key, field in COLUMNS.items():
            assert table[s["name"]][key] == pytest.approx(field(s), rel=1e-12, abs=1e-12), (s["name"], key)


def set_race(page, **values):
    set_form(page, "race", **values)


def test_race_to_the_finish_agrees_with_kvlab_race_json(lab, kvlab):
    expected = kvlab(*CLI).json()["strategies"]
    page = lab.page
    set_race(page, **RACE)
    # Watch it for a moment, then jump to the end: how the clock was advanced must not change the results.
    page.click('#race-transport [data-act="play"]')
    page.wait_for_function("Number(document.querySelector('#race [data-field=clock]').dataset.value) > 3")
    page.click('#race-transport [data-act="play"]')
    lab.screenshot("race-running", "#race")
    page.click('#race-transport [data-act="finish"]')
    page.wait_for_selector("#race-finish:not([hidden])")
    table = finish_table(page)
    assert_agrees(table, expected)
    winner = max(expected, key=lambda s: s["throughput_rps"])["name"]
    verdict = page.inner_text("#race-finish .verdict")
    assert verdict.startswith(f"{winner} served the most")
    assert page.get_attribute("#race .panel.winner", "data-strategy") == winner
    # Live counters under each grid end on the same totals.
    for s in expected:
        panel = f'#race .panel[data-strategy="{s["name"]}"]'
        assert float(page.get_attribute(f'{panel} [data-counter="num_finished"]', "data-value")) == s["num_finished"]
        assert float(page.get_attribute(f'{panel} [data-counter="num_preemptions"]', "data-value")) == s["preemptions"]
        # Each lane keeps its time-averaged summary on screen, and says when it served its last request.
        average = float(page.get_attribute(f'{panel} [data-counter="token_share"]', "data-average"))
        assert average == pytest.approx(s["memory_shares"]["token"], rel=1e-12)
        assert page.inner_text(f'{panel} [data-field="finish-time"]') == f"done at {s['makespan_s']:.1f} s"
        assert f"all {s['num_finished']} served in {s['makespan_s']:.1f} s" in page.inner_text(f"{panel} .ended")
    # The finish line: requests finished over time, one line per strategy, each ending at its finish time.
    legend = page.inner_text("#race-chart .chart-legend")
    for s in expected:
        assert f"{s['name']} (all served at {s['makespan_s']:.1f} s)" in legend
    lab.screenshot("race-finish", "#race")


def test_lanes_are_named_in_the_words_the_page_defines(lab):
    """The lesson's four lanes say their batching and memory as section 2's buttons define them (continuous or
    static batching, reserve the max or pages); no term the page never defines ("iteration-level")."""
    page = lab.page
    subtitles = page.evaluate("Array.from(document.querySelectorAll('#race .panel h3 .desc')).map(e => e.textContent)")
    assert subtitles == ["static batching, reserve the max", "continuous batching, reserve the max",
                         "static batching, pages", "continuous batching, pages (= vLLM)"]
    assert page.inner_text("#grid .panel h3 .desc") == "continuous batching, reserve the max"
    text = page.inner_text("body")
    assert "iteration-level" not in text and "request-level" not in text


def test_html_export_replays_from_disk_with_the_network_off(open_page, tmp_path, kvlab):
    expected = kvlab(*CLI).json()
    from kvlab.config import resolve
    from kvlab.web.export import write_race_html
    from kvlab.workload import load_workload

    config = resolve(model="opt-13b", gpu="a100-40gb")
    workload = load_workload("paper-sharegpt", num_requests=40, rate=4.0, seed=2)
    path = write_race_html(tmp_path / "race.html", config, workload, [s["name"] for s in expected["strategies"]])
    text = path.read_text()
    assert "http://" not in text and "https://" not in text and "src=" not in text  # nothing to fetch

    # Every request the page makes goes through Playwright's routing (conftest.PageProbe): anything but the file
    # itself (file://, data:, blob:) is refused and recorded. The browser's own offline flag is not relied on:
    # navigator.onLine stays true on some Chromium builds.
    probe = open_page(path.as_uri())
    page = probe.page
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=30_000)
    # Its intro names the patterns in its legend's words (it once called "striped" what the legend calls
    # cross-hatched).
    intro = page.inner_text('#race [data-field="pattern-words"]')
    for cls in ("legend-token", "legend-reserved", "legend-internal", "legend-free"):
        assert page.inner_text(f"#race-legend .{cls}") in intro
    assert "striped: reserved for tokens still to come" in intro and "pale" not in intro
    # Its legend names the eviction flash too, with no link to a section 5 the export does not have.
    assert page.inner_text("#race-legend .legend-evicted").startswith("flashing black: evicted")
    assert page.locator("#race-legend .legend-evicted a").count() == 0
    page.locator("body").click(position={"x": 5, "y": 5})
    page.select_option('#race-transport [data-act="speed"]', "100")
    page.keyboard.press("Space")
    page.wait_for_function("window.kvlab.players.race.playing")
    page.wait_for_function("Number(document.querySelector('#race [data-field=clock]').dataset.value) > 2")
    probe.screenshot("export-replaying", "#race")
    page.wait_for_selector("#race-finish:not([hidden])", timeout=60_000)
    assert_agrees(finish_table(page), expected["strategies"])
    probe.screenshot("export-finish")
    # Step back to the start and forward one frame at a time with the keyboard.
    page.click('#race-transport [data-act="reset"]')
    page.locator("body").click(position={"x": 5, "y": 5})
    page.keyboard.press("ArrowRight")
    page.wait_for_function("document.querySelector('#race').dataset.seq === '1'")
    assert probe.foreign_requests == []
    assert all(url.startswith(("file://", "data:", "blob:")) for url in requested), requested
    assert probe.errors == []
    # The guard is live: a fetch from this page to anywhere would have been caught and refused.
    refused = page.evaluate("fetch('https://example.invalid/x').then(() => 'fetched', () => 'refused')")
    assert refused == "refused" and probe.foreign_requests == ["https://example.invalid/x"]


def test_html_export_says_why_section_7_is_absent_and_names_the_command_that_draws_it(open_page, tmp_path, kvlab,
                                                                                     monkeypatch):
    """The export replays frames; section 7's curves are runs of the engine made when asked. The page says so, and
    the command it names, run as written, draws them for the race's setup (capacity.html, offline)."""
    import shlex

    from kvlab.config import resolve
    from kvlab.web.export import write_race_html
    from kvlab.workload import load_workload

    config = resolve(model="opt-13b", gpu="a100-40gb", workload="paper-sharegpt", num_requests=40, rate=4.0, seed=2)
    workload = load_workload("paper-sharegpt", num_requests=40, rate=4.0, seed=2)
    path = write_race_html(tmp_path / "race.html", config, workload, ["continuous+max", "continuous+paged"])
    page = open_page(path.as_uri()).page
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=30_000)
    said = page.inner_text("#export-absent")
    assert "section 7" in said and "is not in it" in said
    command = page.inner_text("#export-absent code")
    argv = shlex.split(command)
    assert argv[:2] == ["kvlab", "capacity"]
    assert argv[argv.index("-n") + 1] == "40" and argv[argv.index("--seed") + 1] == "2"
    monkeypatch.chdir(tmp_path)
    out = kvlab(*argv[1:], "--workers", "1")
    assert out.exit_code == 0, out.stderr
    assert (tmp_path / "kvlab-rates" / "capacity.html").is_file()

"""Section 7: each system's normalized latency against the rate, and its breaking point, as the engine finds them.

The breaking points are compared with `kvlab capacity`'s for the same setup, run here; the numbers at a picked
rate with the engine's own run of that rate. Nothing is pinned: the default workload and cost profiles may change,
and the page must follow them."""

from __future__ import annotations

import pytest

from kvlab.web.rates import RateLab, RateSetup, evictions_rate, lesson_rate

READY_S = 240  # the page's capacity searches, on a shared two-core machine


@pytest.fixture
def rates_lab(lab):
    lab.page.wait_for_function("document.querySelector('#rates').dataset.ready === '1' && "
                               "document.querySelector('#rates').dataset.state === 'ok' && "
                               "document.querySelector('#rates').dataset.curves === '1'", timeout=READY_S * 1000)
    return lab


def found(page) -> dict:
    return page.evaluate("window.kvlab.rates.found")


def test_the_breaking_points_are_kvlab_capacitys(rates_lab, kvlab, tmp_path):
    page = rates_lab.page
    f = found(page)
    s = f["setup"]
    systems = [x["name"] for x in f["systems"]]
    out = kvlab("capacity", "--strategy", ",".join(systems), "--model", s["model"], "--gpu", s["gpu"],
                "--workload", s["workload"], "-n", s["num_requests"], "--seed", s["seed"], "--block-size",
                s["block_size"], "--cost", s["cost"], "--workers", "1", "--out", tmp_path / "sweep", "--json")
    assert out.exit_code == 0, out.stderr
    cli = {c["strategy"]: c for c in out.json()["capacities"]}
    assert f["slo"] == out.json()["slo"]
    for x in f["systems"]:
        assert x["capacity_rps"] == cli[x["name"]]["capacity_rps"], x["name"]
        assert x["limited_by"] == cli[x["name"]]["limited_by"]
        assert [p["rate"] for p in x["points"]] == sorted(p["rate"] for p in cli[x["name"]]["probes"])
    # Each is named on the page with its rate (the legend) and drawn after a sweep.
    legend = page.inner_text("#rates-chart .chart-legend")
    for x in f["systems"]:
        assert f"{x['paper_name']}, " in legend and f"breaks at {x['capacity_text']} req/s" in legend
    # The setup named on the page is the command above.
    assert f"kvlab capacity --strategy {','.join(systems)} --model {s['model']}" in page.inner_text("#rates")
    # ... searched as it searches them, on its two samples (trial 54, finding 4: the lab searched the first alone); a
    # breaking point that is no answer or a lower bound with capacity's reason (trial 53, finding 2)
    words = " ".join(page.inner_text("#rates").split())
    assert "The breaking points are those of kvlab capacity" in words
    assert f["samples_note"] in words and "is the lower of the two" in words
    for x in f["systems"]:
        if x["uncertified_reason"]:
            assert f"{x['paper_name']}: " in words and x["uncertified_reason"] in words
    # They differ, as in the paper: reserving the max breaks first, pages last.
    caps = {(x["batching"], x["allocator"]): x["capacity_rps"] for x in f["systems"]}
    assert caps[("continuous", "max")] < caps[("continuous", "paged")]
    rates_lab.screenshot("rates", "#rates")


def test_a_picked_rate_is_run_by_the_engine_and_the_figures_above_follow(rates_lab):
    page = rates_lab.page
    f = found(page)
    assert f["lesson_rate"] is not None
    # A rate between where reserving the max breaks and the lesson's (the figure's own): pages keep up there too.
    reserve = next(x for x in f["systems"] if (x["batching"], x["allocator"]) == ("continuous", "max"))
    rate = round((reserve["capacity_rps"] + f["lesson_rate"]) / 2, 2)
    old = page.get_attribute("#hero", "data-session")
    page.evaluate("r => { const i = document.querySelector('#rate-range'); i.value = String(r); "
                  "i.dispatchEvent(new Event('input')); i.dispatchEvent(new Event('change')); }", rate)
    page.wait_for_function("r => document.querySelector('#rates').dataset.state === 'ok' && "
                           "Number(document.querySelector('#rates').dataset.rate) === r", arg=rate, timeout=120_000)
    s = f["setup"]
    engine = RateLab().at(RateSetup(**s), rate)
    rows = page.evaluate("""() => Array.from(document.querySelectorAll('#rates-at tr[data-system]')).map(tr =>
        [tr.dataset.system, Number(tr.querySelector('[data-key=value]').dataset.value),
         tr.querySelector('[data-key=held]').dataset.value === '1'])""")
    assert rows == [[x["name"], x["value"], x["held"]] for x in engine["systems"]]
    # At the lesson's rate pages keep up and reserving the max does not.
    held = {x["allocator"]: row[2] for x, row in zip(f["systems"], rows) if x["batching"] == "continuous"}
    assert held["paged"] and not held["max"]
    # The first figure runs again at that rate, to its headline's moment; the grid's and race's settings follow.
    page.wait_for_function("([old, r]) => { const h = window.kvlab.players.hero; return h.meta && "
                           "document.querySelector('#hero').dataset.session !== old && h.meta.setup.rate === r && "
                           "h.t >= 60 && !h.drawPending; }", arg=[old, rate], timeout=120_000)
    for form in ("#grid-form", "#race-form"):
        assert float(page.eval_on_selector(form, "f => f.elements.rate.value")) == rate
    note = page.inner_text("#hero-rate")
    assert f"At {rate:g} req/s pages keep up and reserving the max does not" in note
    # and the lesson's own rate is one press away again.
    assert page.inner_text('#hero-rate [data-act="lesson-rate"]') == (
        f"watch at {f['lesson_rate']:g} req/s, where pages keep up and reserving the max does not")


def test_the_page_opens_at_the_rates_the_engine_gives_its_lessons(rates_lab):
    """The first figure opens at a rate where pages keep up and reserving the max does not (kvlab.web.rates.
    lesson_rate, from the breaking points the test above holds to `kvlab capacity`'s), and says so; section 5 runs
    pages at their own breaking point, where they run out on purpose, and says that too."""
    page = rates_lab.page
    f = found(page)
    by = {(x["batching"], x["allocator"]): x for x in f["systems"]}
    paged, reserve = by[("continuous", "paged")], by[("continuous", "max")]
    rate = lesson_rate(f["systems"])
    assert rate is not None and f["lesson_rate"] == rate
    assert reserve["capacity_rps"] < rate < paged["capacity_rps"]
    assert page.evaluate("window.kvlab.players.hero.meta.setup.rate") == rate
    note = page.inner_text("#hero-rate")
    assert f"The figure runs at {rate:g} req/s, halfway between where its two caches break" in note
    assert f"pages keep up to {paged['capacity_text']} req/s, reserving the max to {reserve['capacity_text']}" in note
    assert not page.is_visible('#hero-rate [data-act="lesson-rate"]')  # (it is the rate the figure runs at)
    # The first screen waited for those two caches' searches only (RateFigure.opening), and they are section 7's.
    opening = page.evaluate("window.kvlab.rates.opening()")
    assert [x["name"] for x in opening["systems"]] == page.evaluate("window.kvlab.catalog.rate_systems.opening")
    assert opening["systems"] == [x for x in f["systems"] if x["name"] in {paged["name"], reserve["name"]}]
    assert (opening["lesson_rate"], opening["evictions"]) == (f["lesson_rate"], f["evictions"])
    ev = f["evictions"]
    assert ev["rate"] == evictions_rate(f["systems"]) == paged["capacity_rps"] and ev["num_preemptions"] > 0
    assert page.evaluate("window.kvlab.players.evictions.meta.setup.rate") == ev["rate"]
    said = page.inner_text("#evictions")
    assert f"at {ev['rate']:g} conversations a second: pages' breaking point" in said
    assert f"the engine evicts conversations {ev['num_preemptions']:,} times there" in said


@pytest.mark.parametrize("typed, words", [
    ("0", "requests/s (rate) 0 is out of range: 0.01 to "),
    ("-1", "requests/s (rate) -1 is out of range: 0.01 to "),
    ("abc", 'requests/s (rate) "abc" is not a number'),
    ("100", "the chart: past"),
])
def test_a_bad_rate_is_one_line_beside_the_control(rates_lab, typed, words):
    page = rates_lab.page
    asked = []
    page.on("request", lambda r: asked.append(r.url) if "/api/rates/at" in r.url else None)
    page.fill("#rate-input", typed)
    page.dispatch_event("#rate-input", "change")
    page.wait_for_selector("#rates-error:not([hidden])")
    assert words in page.inner_text("#rates-error")
    assert page.get_attribute("#rate-input", "aria-invalid") == "true"
    assert asked == []  # refused in the page: nothing sent
    f = found(page)
    page.fill("#rate-input", str(f["systems"][0]["capacity_rps"]))
    page.dispatch_event("#rate-input", "change")
    page.wait_for_selector("#rates-error", state="hidden", timeout=60_000)


def test_the_sweep_names_each_breaking_point_as_it_passes(rates_lab):
    page = rates_lab.page
    page.click('#rates [data-act="sweep"]')
    page.wait_for_function("document.querySelector('#rates').dataset.sweeping === '1'")
    page.wait_for_function("document.querySelector('#rates').dataset.sweeping === ''", timeout=30_000)
    assert page.evaluate("window.kvlab.rates.frames") > 0


@pytest.mark.parametrize("width, height", [(1440, 900), (390, 844)])
def test_section_7_fits_a_desktop_and_a_phone(lab_at, width, height):
    from labpage import overflowing

    probe = lab_at(width, height)
    page = probe.page
    page.locator("#rates").scroll_into_view_if_needed()
    page.wait_for_function("document.querySelector('#rates').dataset.curves === '1' && "
                           "document.querySelector('#rates').dataset.state === 'ok'", timeout=READY_S * 1000)
    assert overflowing(page) == []
    page.evaluate("document.querySelector('#rates').scrollIntoView({block: 'start'})")
    page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    probe.screenshot(f"rates-{width}", full_page=False)


def test_each_rate_on_the_chart_stands_under_its_tick(rates_lab):
    """The rate axis has a tick per labelled rate and each label is centred under it, so a breaking point's dot is
    read against the number below it (the labels once ended at their rate, with no tick: a dot at 0.625 stood over
    the space between "0.80" and "1.00" on a phone)."""
    page = rates_lab.page
    got = page.evaluate("""() => {
        const r = window.kvlab.rates, L = r.layout, ctx = r.canvas.getContext('2d');
        const X = v => L.left + (L.right - L.left) * v / L.axis;
        const inked = (x0, y0, w, h) => { const d = ctx.getImageData(x0, y0, w, h).data, cols = [];
            for (let i = 3; i < d.length; i += 4) if (d[i] > 0) cols.push(x0 + ((i - 3) / 4) % w);
            return cols; };
        return [1, 2, 3].map(k => { const x = Math.round(X(L.axis * k / 4));
            const tick = inked(x - 1, L.bottom + 2, 3, 2).length > 0;
            const label = inked(x - 40, L.bottom + 9, 80, 12);
            return {x, tick, centre: label.length ? (Math.min(...label) + Math.max(...label)) / 2 : null}; }); }""")
    for t in got:
        assert t["tick"], got
        assert t["centre"] is not None and abs(t["centre"] - t["x"]) <= 3, got


def test_the_rate_has_one_range_and_a_refused_rate_dims_the_table(rates_lab):
    """The slider, the box and the server state one range for the rate, the least rate a run takes to the chart's
    end: the slider cannot go below it (it once went to 0, which the server refused as "0.01 to 100" while the box
    said "0.01 to 4"), and a refused rate dims the table and its verdict, the last rate's numbers."""
    page = rates_lab.page
    f = found(page)
    # (Its legend names each system's memory once: "Orca (Max) (reserve the max)" read twice bracketed.)
    legend = page.inner_text("#rates-chart .chart-legend")
    assert ") (" not in legend and "((" not in legend and "))" not in legend, legend
    lo = page.evaluate("window.kvlab.catalog.limits.min_rate")
    assert float(page.get_attribute("#rate-range", "min")) == lo
    assert float(page.get_attribute("#rate-input", "data-min")) == lo
    assert float(page.get_attribute("#rate-input", "data-max")) == f["axis_rps"] == \
        float(page.get_attribute("#rate-range", "max"))
    page.evaluate("() => { const i = document.querySelector('#rate-range'); i.value = '0'; "
                  "i.dispatchEvent(new Event('input')); i.dispatchEvent(new Event('change')); }")
    page.wait_for_function("r => document.querySelector('#rates').dataset.state === 'ok' && "
                           "Number(document.querySelector('#rates').dataset.rate) === r", arg=lo, timeout=120_000)
    assert page.is_hidden("#rates-error")
    opacity = lambda sel: float(page.eval_on_selector(sel, "e => getComputedStyle(e).opacity"))  # noqa: E731
    assert opacity("#rates-at") == 1
    page.fill("#rate-input", "0")
    page.dispatch_event("#rate-input", "change")
    page.wait_for_selector("#rates-error:not([hidden])")
    said = page.inner_text("#rates-error")
    assert f"requests/s (rate) 0 is out of range: {lo:g} to {f['axis_rps']:g}" in said
    # The server states the same range for the same value.
    server = page.evaluate("u => fetch(u, {headers: {'X-Kvlab-Refusals': 'in-body'}}).then(r => r.json())",
                           "api/rates/at?rate=0")
    assert f"out of range: {lo:g} to {f['axis_rps']:g}" in server["error"]
    assert opacity("#rates-at") < 0.5 and opacity("#rates-verdict") < 0.5


def test_a_rate_typed_while_the_search_runs_wins_over_the_opening_rate(browser_context, lab_url):
    """A rate typed into section 7's box before its breaking points are found is the one run once they are (it was
    overwritten with the opening rate, without a word). The search's answer is held back by intercepting it."""
    from conftest import PageProbe

    page = browser_context.new_page()
    probe = PageProbe(page, lab_url + "/")
    held = []
    asks = lambda url: "/api/rates?" in url  # noqa: E731
    page.route(asks, lambda route: held.append(route))
    try:
        page.goto(lab_url + "/")
        page.wait_for_function("document.querySelector('#rate-input') !== null")
        page.wait_for_timeout(500)
        page.locator("#rates").scroll_into_view_if_needed()
        page.fill("#rate-input", "2")
        page.dispatch_event("#rate-input", "change")
        page.wait_for_timeout(300)
        assert page.input_value("#rate-input") == "2"
        page.unroute(asks)
        for route in held:
            route.continue_()
        page.wait_for_function("document.body.dataset.ready === '1'", timeout=READY_S * 1000)
        page.wait_for_function("document.querySelector('#rates').dataset.ready === '1' && "
                               "document.querySelector('#rates').dataset.state === 'ok'", timeout=READY_S * 1000)
        assert page.input_value("#rate-input") == "2"
        assert float(page.get_attribute("#rates", "data-rate")) == 2
        assert page.evaluate("window.kvlab.rates.picked") == 2
        assert probe.errors == [] and probe.foreign_requests == []
    finally:
        page.close()


def test_the_sections_workers_run_below_the_servers_priority_one_per_core_up_to_one_per_system():
    import os

    from kvlab.web.rates import NICENESS

    pool = RateLab()._runner().pool
    try:
        assert pool.num_workers == min(len(RateLab.systems()), os.cpu_count() or 1)
        niceness = {pool.executor.submit(os.nice, 0).result() for _ in range(4 * pool.num_workers)}
        assert niceness == {min(19, os.nice(0) + NICENESS)}  # (every worker, each lowered once)
    finally:
        pool.close()


def test_the_first_screens_two_searches_come_first_and_section_7_searches_only_the_other_two():
    """The first screen asks for the breaking points of the two caches its opening rates are read from
    (RateLab.opening_systems: reserving the max and pages); section 7 later asks for all four. The two are the
    same as in an answer for all four searched at once, and the later request runs none of their simulations
    again: the two requests together run as many as the four searched at once."""
    from kvlab.web.params import parse_rate_setup
    from kvlab.web.rates import PAGES, RESERVE_MAX

    setup = parse_rate_setup({})
    opening_systems = RateLab.opening_systems()
    at_once, first = RateLab(), RateLab()
    try:
        whole = at_once.breaking_points(setup)
        opening = first.breaking_points(setup, opening_systems)
        opening_runs = first.runner.num_computed
        later = first.breaking_points(setup)
        assert first.runner.num_computed == at_once.runner.num_computed > opening_runs
    finally:
        for lab in (at_once, first):
            lab.runner.pool.close()
    assert {(x["batching"], x["allocator"]) for x in opening["systems"]} == {RESERVE_MAX, PAGES}
    assert opening["systems"] == [x for x in whole["systems"] if x["name"] in opening_systems]
    assert (opening["lesson_rate"], opening["evictions"]) == (whole["lesson_rate"], whole["evictions"])
    assert opening["lesson_rate"] is not None and opening["evictions"] is not None
    assert later == whole


def test_kvlab_lab_begins_with_the_first_screens_two_searches():
    """`kvlab lab` searches as it starts (kvlab.web.serve.warm_rates): the first screen's two first, given as soon
    as they are found, then section 7's other two."""
    from types import SimpleNamespace

    from kvlab.web.params import parse_rate_setup
    from kvlab.web.serve import warm_rates
    from kvlab.web.server import create_app

    app = create_app(allowed_hosts=["testserver"])
    rates, setup = app.state.rates, parse_rate_setup({})
    try:
        warm_rates(SimpleNamespace(config=SimpleNamespace(app=app)))
        assert list(rates.searched) == [(setup, RateLab.opening_systems()), (setup, RateLab.systems())]
    finally:
        rates.runner.pool.close()

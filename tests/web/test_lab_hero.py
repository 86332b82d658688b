"""The lab teaches: the figure leads the first screen at 1440×900 and 390×844, its headline is reached within 10 s
at the default speed (in the simulated time the page reports), reserved-but-empty reads apart from free in grey,
no text is clipped, and every number the page shows is the engine's for the frame it shows."""

from __future__ import annotations

import io

import pytest
from labpage import seek, set_form

from kvlab.web.params import parse_run_spec
from kvlab.web.server import build_race

VIEWPORTS = [(390, 844), (1440, 900)]
HERO_HOLD = 60.0  # lab.js: where the first figure stops and says what it showed
DEFAULT_SPEED = 10.0  # lab.js / index.html: the first figure's speed on arrival
HERO = {"kind": "race", "strategies": ["continuous+max", "continuous+paged"]}  # on the defaults


def wait_for_headline(page):
    page.wait_for_function("document.querySelector('#hero-headline').dataset.final === '1' && "
                           "!window.kvlab.players.hero.playing && !window.kvlab.players.hero.textDue",
                           timeout=180_000)


def clipped(page) -> list[str]:
    """Text that does not fit its box: an element cut by an ancestor that hides its overflow (not one that
    scrolls), or holding more text than its own box shows. Empty when every word is readable."""
    return page.evaluate("""() => {
        const out = [];
        const hides = e => ['hidden', 'clip'].includes(getComputedStyle(e).overflowX) ||
                           ['hidden', 'clip'].includes(getComputedStyle(e).overflowY);
        for (const e of document.body.querySelectorAll('*')) {
            const own = Array.from(e.childNodes).some(n => n.nodeType === 3 && n.textContent.trim());
            if (!own || e.closest('[hidden], .sr-only, .tooltip, script, template')) continue;
            const r = e.getBoundingClientRect();
            if (r.width === 0 && r.height === 0) continue;
            if (hides(e) && (e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1))
                out.push(`${e.tagName.toLowerCase()}.${e.className}: ${e.textContent.trim().slice(0, 40)}`);
            for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
                if (!hides(a)) continue;
                const b = a.getBoundingClientRect();
                if (r.left < b.left - 1 || r.right > b.right + 1 || r.top < b.top - 1 || r.bottom > b.bottom + 1)
                    out.push(`${e.tagName.toLowerCase()}.${e.className} cut by ${a.tagName.toLowerCase()}` +
                             `.${a.className}: ${e.textContent.trim().slice(0, 40)}`);
                break;
            }
        }
        return out.slice(0, 10); }""")


def luminance(rgb) -> float:
    """WCAG 2 relative luminance of an sRGB colour."""
    def lin(c):
        c /= 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (lin(v) for v in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: float, b: float) -> float:
    return (max(a, b) + 0.05) / (min(a, b) + 0.05)


def square_of(blocks, kind: str) -> int:
    """A block wholly in one state: "reserved" (held, no token in it: reserved or never to be used) or "free"."""
    bs = blocks["blockSize"]
    for b in range(blocks["n"]):
        held = blocks["reserved"][b] + blocks["internal"][b]
        if kind == "reserved" and blocks["owner"][b] >= 0 and blocks["token"][b] == 0 and held == bs:
            return b
        if kind == "free" and blocks["owner"][b] < 0 and blocks["token"][b] + held + blocks["overhead"][b] == 0:
            return b
    raise AssertionError(f"no {kind} block on the grid")


def hero_blocks(page, lane: int) -> dict:
    return page.evaluate("""lane => { const v = window.kvlab.players.hero.views[lane];
        return {n: v.n, blockSize: v.blockSize, owner: Array.from(v.owner), token: Array.from(v.token),
                reserved: Array.from(v.reserved), internal: Array.from(v.internal), overhead: Array.from(v.overhead),
                rects: Array.from({length: v.n}, (_, b) => v.blockRect(b))}; }""", lane)


def grey_contrast_of_reserved_and_free(page, lane: int) -> dict:
    """From a screenshot of the grid (as the reader's screen shows it, turned to grey): the contrast of a
    reserved-but-empty square's marks, and of the whole square, against a free square."""
    from PIL import Image

    blocks = hero_blocks(page, lane)
    canvas = page.locator("#hero canvas.grid").nth(lane)
    shot = Image.open(io.BytesIO(canvas.screenshot())).convert("RGB")
    scale = shot.width / page.evaluate("l => window.kvlab.players.hero.views[l].canvas.width", lane)

    def pixels(b):
        r = blocks["rects"][b]
        box = (round(r["x"] * scale), round(r["y"] * scale), round((r["x"] + r["w"]) * scale),
               round((r["y"] + r["h"]) * scale))
        crop = shot.crop(box)
        return list(crop.get_flattened_data() if hasattr(crop, "get_flattened_data") else crop.getdata())

    grey = Image.new("RGB", (1, 1))  # greyscale as a printer or a colour-blind-simulating filter would: luma only

    def as_grey(rgb):
        grey.putpixel((0, 0), rgb)
        v = grey.convert("L").getpixel((0, 0))
        return luminance((v, v, v))

    reserved = [as_grey(p) for p in pixels(square_of(blocks, "reserved"))]
    free = [as_grey(p) for p in pixels(square_of(blocks, "free"))]
    free_level = sum(free) / len(free)
    marks = [v for v in reserved if contrast(v, free_level) >= 3]
    return {"marks": len(marks) / len(reserved), "mark_contrast": min(contrast(v, free_level) for v in marks)
            if marks else 0.0, "free_spread": max(free) - min(free),
            "mean_contrast": contrast(sum(reserved) / len(reserved), free_level)}


@pytest.mark.parametrize("width, height", VIEWPORTS)
def test_the_first_screen_is_the_figure_and_its_headline(lab_at, width, height):
    probe = lab_at(width, height)
    page = probe.page
    # It plays on arrival, at the default speed.
    assert page.evaluate("window.kvlab.players.hero.speed") == DEFAULT_SPEED
    assert page.input_value('#hero-transport [data-act="speed"]') == str(int(DEFAULT_SPEED))
    wait_for_headline(page)
    headline = page.locator("#hero-headline")
    # The headline is reached within 10 s of play at the default speed, in the simulated time the page reports
    # (the machine may be slower; the figure's clock is not).
    t = float(headline.get_attribute("data-t"))
    assert t == pytest.approx(HERO_HOLD) and float(headline.get_attribute("data-speed")) == DEFAULT_SPEED
    assert t / DEFAULT_SPEED <= 10.0
    text = headline.inner_text()
    running = [int(page.get_attribute(f'#hero .panel:nth-child({i}) [data-counter="num_running"]', "data-value"))
               for i in (1, 2)]
    waiting = [int(page.get_attribute(f'#hero .panel:nth-child({i}) [data-counter="num_waiting"]', "data-value"))
               for i in (1, 2)]
    assert text.startswith(f"{running[0]} conversations at once against {running[1]}.")
    # The lesson shows without thrashing: pages run more than twice as many, and their queue is a fraction of the
    # other's (the rate is the engine's, halfway between the two caches' breaking points: test_lab_rates.py).
    assert running[1] > 2 * running[0] and 4 * waiting[1] <= waiting[0], (running, waiting)
    probe.screenshot(f"first-screen-{width}", full_page=False)
    # The first screen (no scrolling) holds both grids whole, the play button and the headline.
    inside = page.evaluate("""([w, h]) => {
        const r = e => e.getBoundingClientRect();
        const ok = e => { const b = r(e); return b.width > 0 && b.top >= 0 && b.left >= 0 && b.bottom <= h &&
                          b.right <= w; };
        return {grids: Array.from(document.querySelectorAll('#hero canvas.grid')).map(ok),
                play: ok(document.querySelector('#hero-transport [data-act=play]')),
                headline: ok(document.querySelector('#hero-headline')),
                side: new Set(Array.from(document.querySelectorAll('#hero canvas.grid'))
                              .map(c => Math.round(r(c).top))).size}; }""", [width, height])
    assert inside["grids"] == [True, True] and inside["play"] and inside["headline"], inside
    assert inside["side"] == 1  # side by side, on a phone too
    assert clipped(page) == [], "text cut off"
    # Reserved but empty against free, in grey: the stripes' ink is 3:1 or more against free grey (WCAG's contrast
    # for graphics) over at least two fifths of the square, and free squares are one flat grey.
    grey = grey_contrast_of_reserved_and_free(page, 0)
    assert grey["mark_contrast"] >= 3.0 and grey["marks"] >= 0.4, grey
    assert grey["free_spread"] == 0, grey
    # The last frame stays: the grids still hold the frame at 60 s.
    assert page.evaluate("window.kvlab.players.hero.views[0].owner.some(o => o >= 0)")


def hero_spec(page) -> dict:
    """The first figure's run as the page made it (its rate is the engine's: test_lab_rates.py)."""
    return {**HERO, "rate": page.evaluate("window.kvlab.players.hero.meta.setup.rate")}


def test_evictions_in_the_first_figure_are_named_where_they_flash(lab):
    """The first figure's legend names the eviction flash (its swatch is the flash over a free square, pointing at
    section 5) when its run has evicted, and only then: at the opening rate pages keep up and nothing flashes.
    Section 2's legend always names it."""
    page = lab.page
    wait_for_headline(page)
    race = build_race(parse_run_spec(hero_spec(page)))
    race.seek(HERO_HOLD)
    evicted = any(sim.counters_now()["num_preemptions"] for sim in race.sims)
    assert page.is_visible("#hero-legend .legend-evicted") == evicted
    assert (int(page.get_attribute("#hero .panel:nth-child(2)", "data-flashes") or 0) > 0) == evicted
    for legend in ("#hero-legend", "#grid-legend"):
        item = page.locator(f"{legend} .legend-evicted")
        assert item.text_content().startswith("flashing black: evicted (memory ran out mid-answer"), legend
        assert item.locator("a").get_attribute("href") == "#evictions"
        swatch = page.evaluate("""sel => Array.from(document.querySelector(sel + ' .legend-evicted canvas')
            .getContext('2d').getImageData(7, 7, 1, 1).data.slice(0, 3))""", legend)
        flash = page.evaluate("1 - 0.85")  # drawOverlay's black at the flash's start, over free grey
        free = page.evaluate("window.kvlab.freeRgb")
        assert swatch == [round(v * flash) for v in free], (legend, swatch)


@pytest.mark.parametrize("width, height", VIEWPORTS)
def test_the_block_tables_numbers_are_written_only_where_legible(lab_at, width, height):
    """A square's logical block number is written in 10 px type or more, or not at all (a phone's squares are 12
    px): the caption then points at the outlined squares, and the list beside the grid holds the table."""
    page = lab_at(width, height).page
    wait_for_headline(page)
    page.locator("#table").scroll_into_view_if_needed()
    page.wait_for_function("document.querySelector('#table [data-field=table-map]').dataset.blocks")
    got = page.evaluate("""() => { const v = window.kvlab.table.view;
        return {s: v.layout.s, labels: v.labels.size, drawn: v.labelsDrawn,
                who: document.querySelector('#table [data-field=table-who]').textContent}; }""")
    assert got["labels"] > 0, got
    if got["s"] < 16:
        assert width == 390 and got["drawn"] == 0, got
        assert got["who"].endswith("(its squares are outlined on the grid):"), got
    else:
        assert width == 1440 and got["drawn"] > 0, got
        said = "(the numbers on the grid):" if got["drawn"] == got["labels"] else "where a number fits):"
        assert got["who"].endswith(said), got


def test_the_pages_numbers_are_the_engines_for_the_same_frame(lab):
    """Every number on the first figure, the block table and the batching figure is the engine's for the frame the
    page shows: the same simulations, built in this process and run to the same moment."""
    page = lab.page
    wait_for_headline(page)
    race = build_race(parse_run_spec(hero_spec(page)))
    race.seek(HERO_HOLD)
    frame_t = float(page.get_attribute("#hero-headline", "data-t"))
    assert frame_t == pytest.approx(HERO_HOLD)
    for i, sim in enumerate(race.sims):
        panel = f"#hero .panel:nth-child({i + 1})"
        counters, usage = sim.counters_now(), sim.slot_usage()
        assert int(page.get_attribute(f'{panel} [data-counter="num_running"]', "data-value")) == counters["num_running"]
        assert int(page.get_attribute(f'{panel} [data-counter="num_waiting"]', "data-value")) == counters["num_waiting"]
        share = 100 * usage.token / usage.num_slots
        bar = page.inner_text(f"{panel} .sharebar-label")
        assert bar.startswith(f"memory right now: {share:.1f}% tokens"), bar
        assert int(page.get_attribute(panel, "data-seq")) == int(page.get_attribute("#hero-headline", "data-seq"))
    headline = page.inner_text("#hero-headline")
    a, b = (sim.counters_now() for sim in race.sims)
    assert f"reserving the max leaves {a['num_waiting']:,} waiting, pages {b['num_waiting']:,}" in headline

    # The block table: the page's table of the picked conversation is the allocator's. (It and the batching
    # figure are drawn once they are on screen.)
    page.locator("#table").scroll_into_view_if_needed()
    page.wait_for_function("document.querySelector('#table [data-field=table-map]').dataset.blocks")
    rid = int(page.get_attribute("#table-figure", "data-id"))
    blocks = page.get_attribute('#table [data-field="table-map"]', "data-blocks")
    assert [int(x) for x in blocks.split(",")] == race.sims[1].allocator.get_block_ids(rid)
    # The conversation shown first is one whose pages do not lie in a row: the section's point.
    ids = [int(x) for x in blocks.split(",")]
    assert any(b != a + 1 for a, b in zip(ids, ids[1:])), ids
    # The batching figure marks the two runs' batches, from the same frame, on the cost model's curve.
    page.locator("#batching").scroll_into_view_if_needed()
    page.wait_for_function("document.querySelector('#batching-chart').dataset.batches")
    assert page.get_attribute("#batching-chart", "data-batches") == f"{a['num_running']},{b['num_running']}"
    cost = race.sims[0].config.cost
    caption = page.inner_text("#batching-chart figcaption")
    context = race.meta()["cost_curve"]["context_len"]
    for n in (a["num_running"], b["num_running"]):
        ms = 1000 * cost.terms(n, 0, n, n * context, n * context).total
        assert f"{ms:.1f} ms a step" in caption, (n, ms, caption)

    lab.screenshot("block-table", "#table")
    lab.screenshot("batching", "#batching")

    # One conversation up close: what each cache set aside for it is what its allocator holds for it.
    seek(page, 6.0, "one")
    race = build_race(parse_run_spec({**HERO, "num_requests": 1, "num_blocks": 144, "seed": 3}))
    race.seek(6.0)
    (slab_sim, pages_sim), rid = race.sims, race.sims[0].requests[0].request_id
    held = [float(page.get_attribute(f'#one .panel:nth-child({i}) [data-counter="held_slots"]', "data-value"))
            for i in (1, 2)]
    assert held == [slab_sim.allocator.get_slab(rid).chunk_size, pages_sim.allocator.get_num_slots(rid)]
    assert held[0] == 2048 and held[1] == 16 * len(pages_sim.allocator.get_block_ids(rid))
    tokens = float(page.get_attribute('#one .panel:nth-child(2) [data-counter="token_slots"]', "data-value"))
    assert tokens == pages_sim.slot_usage().token == slab_sim.slot_usage().token > 0
    lab.screenshot("one-conversation", "#one")

    # The grid of section 2 and the evictions of section 5, at a moment picked by the test.
    # (Section 5 runs at pages' breaking point, read from the engine: its evictions begin some 45 s in.)
    evictions = page.evaluate("window.kvlab.players.evictions.fixed")
    for section, spec, t in (("grid", {"kind": "grid", "strategies": ["continuous+max"]}, 37.5),
                             ("evictions", evictions, 60.0)):
        seek(page, t, section)
        race = build_race(parse_run_spec(spec))
        race.seek(t)
        sim = race.sims[0]
        counters, usage = sim.counters_now(), sim.slot_usage()
        got = {key: float(page.get_attribute(f'#{section} [data-counter="{key}"]', "data-value"))
               for key in ("num_running", "num_waiting", "num_preemptions")}
        assert got == {key: counters[key] for key in got}, (section, got)
        seats = page.inner_text(f"#{section} .seats-label")
        assert f"seats: {counters['num_running']:,} running" in seats
        assert f"queue: {counters['num_waiting']:,} waiting" in seats
        if section == "grid":
            # The free piece the allocator would hand out is outlined where the engine's note says it is.
            piece = race.frame(None)["grids"][0]["note"]["piece"]
            assert page.evaluate("window.kvlab.players.grid.views[0].gap") == piece
            outlined = page.evaluate("""b => { const v = window.kvlab.players.grid.views[0], r = v.blockRect(b);
                return !v.overlay.hidden && v.octx.getImageData(r.x + 1, r.y + 1, 1, 1).data[3] > 0; }""", piece[0])
            assert outlined
            share = 100 * usage.token / usage.num_slots
            assert page.inner_text('#grid [data-counter="token_share"]') == f"{share:.1f}%"
            assert page.inner_text("#grid .sharebar-label").startswith(f"memory right now: {share:.1f}% tokens")
        else:
            assert counters["num_preemptions"] > 0
            lost = sum(seq.num_lost_tokens for seq in sim.scheduler.waiting)
            assert float(page.get_attribute('#evictions [data-counter="tokens_to_recompute"]', "data-value")) == lost
            caption = page.inner_text("#evictions-caption")
            assert f"{counters['num_preemptions']:,} evictions" in caption
            assert f"{counters['num_recomputed_tokens']:,} tokens a second time" in caption
        lab.screenshot(f"{section}-at-{t:g}s", f"#{section}")


def test_comparisons_refuse_runs_of_other_settings(lab):
    page = lab.page
    small = {"num_requests": 40, "rate": 4, "batching": "continuous"}

    def run_to_end(**values):
        set_form(page, "grid", **values)
        page.click("#grid-transport [data-act=finish]")
        page.wait_for_selector("#grid-finish:not([hidden])", timeout=60_000)

    run_to_end(allocator="max", **small)
    run_to_end(allocator="paged", **{**small, "rate": 20})
    compare = page.locator("#story .compare")
    assert compare.get_attribute("data-compared") == ""
    text = compare.inner_text()
    assert text.startswith("Not compared: your reserve-the-max run (continuous+max) and your pages run "
                           "(continuous+paged) had different settings (requests/s 4 against 20)"), text
    rows = page.evaluate("Array.from(document.querySelectorAll('#grid-finish tr[data-strategy]'))"
                         ".map(r => r.dataset.strategy)")
    assert rows == ["continuous+paged"]  # the finish table holds this setup's runs only
    run_to_end(allocator="paged", **small)
    assert compare.get_attribute("data-compared") == "1"
    assert compare.inner_text().startswith("On the same settings (opt-13b on A100-40GB")
    rows = page.evaluate("Array.from(document.querySelectorAll('#grid-finish tr[data-strategy]'))"
                         ".map(r => r.dataset.strategy)")
    assert rows == ["continuous+max", "continuous+paged"]
    lab.screenshot("grid-compared", "#grid")


def test_a_tie_is_reported_as_one(lab):
    """continuous+paged and vllm-paper are the same engine decisions: the race says they tied, and crowns nobody."""
    page = lab.page
    page.click("#race-strategies details.more summary")
    set_form(page, "race", strategies=["static+max", "continuous+paged", "vllm-paper"], num_requests=40, rate=4)
    page.click("#race-transport [data-act=finish]")
    page.wait_for_selector("#race-finish:not([hidden])", timeout=60_000)
    verdict = page.inner_text("#race-finish .verdict")
    assert verdict.startswith("continuous+paged and vllm-paper tied: each served"), verdict
    assert "won" not in verdict and "served the most" not in verdict
    assert "★" not in page.inner_text("#race-finish table")
    assert page.locator("#race .panel.winner").count() == 0
    lab.screenshot("race-tie", "#race")


@pytest.mark.parametrize("width, height", VIEWPORTS)
def test_nothing_below_the_first_figure_moves_while_it_plays(browser_context, lab_url, width, height):
    """From the figure's first frame to its headline, section 2 stays where it is: the headline keeps one shape and
    "keep going" holds its place (section 2 once moved 30 px at 1440 and 65 px at 390 as the headline grew, which
    also moved a square out from under a reader's pointer)."""
    from conftest import PageProbe

    page = browser_context.new_page()
    page.set_viewport_size({"width": width, "height": height})
    probe = PageProbe(page, lab_url + "/")
    # Every animation frame from the first one whose headline the figure has written, where section 2 begins.
    page.add_init_script("""(() => { window.__tops = []; const f = () => {
        const h = document.getElementById('hero-headline'), g = document.getElementById('grid');
        if (h && h.dataset.seq && g) window.__tops.push(Math.round(g.getBoundingClientRect().top + scrollY));
        if (!window.__stop) requestAnimationFrame(f); }; requestAnimationFrame(f); })()""")
    try:
        page.goto(lab_url + "/")
        wait_for_headline(page)
        page.wait_for_timeout(300)  # (the frames after the headline's, "keep going" shown)
        tops = page.evaluate("window.__stop = true, window.__tops")
        assert len(tops) > 10 and len(set(tops)) == 1, sorted(set(tops))
        assert probe.errors == []
    finally:
        page.close()

"""The grid in a real browser: memory strategies, colours read off the canvas, preemption, keyboard, hover."""

from __future__ import annotations

import math

from labpage import counter, seek, set_form

# Okabe & Ito's colour-blind-safe palette without yellow: conversation k is drawn in PALETTE[k % 6].
PALETTE = [(0xE6, 0x9F, 0x00), (0x56, 0xB4, 0xE9), (0x00, 0x9E, 0x73),
           (0x00, 0x72, 0xB2), (0xD5, 0x5E, 0x00), (0xCC, 0x79, 0xA7)]
FREE = (0xE4, 0xE4, 0xE4)


def pale(rgb, f=0.3):
    return tuple(math.floor(255 - (255 - v) * f + 0.5) for v in rgb)  # JavaScript's Math.round


def ink(rgb, f=0.45):
    return tuple(math.floor(v * f + 0.5) for v in rgb)


def expected_pixel(kind, colour, x, y):
    """What lab.js's pixel() draws at canvas position (x, y): the patterns are the encoding."""
    if kind == "token":
        return colour
    if kind == "reserved":  # diagonal stripes, two pixels of ink in four
        return ink(colour) if (x + y) % 4 < 2 else pale(colour)
    if kind == "internal":  # cross-hatched
        return ink(colour) if (x + y) % 4 == 0 or (x - y) % 4 == 0 else pale(colour)
    if kind == "overhead":  # fine hatch in the owner's ink on free grey
        return ink(colour) if (x + y) % 3 == 0 or (x - y) % 3 == 0 else FREE
    return FREE


def set_grid(page, **values):
    """Change the grid's controls; the page starts a new run (a new session) with them."""
    set_form(page, "grid", **values)


def grid_blocks(page) -> dict:
    """The grid's block state as the page holds it, and where each block's square is."""
    return page.evaluate("""() => {
        const v = window.kvlab.players.grid.views[0];
        const rect = b => v.blockRect(b);
        return {n: v.n, k: v.layout.k, blockSize: v.blockSize, owner: Array.from(v.owner), token: Array.from(v.token),
                reserved: Array.from(v.reserved), internal: Array.from(v.internal), overhead: Array.from(v.overhead),
                rects: Array.from({length: v.n}, (_, b) => rect(b))};
    }""")


def square_pixels(page, rect) -> list[tuple[int, int, int]]:
    data = page.evaluate(
        """([x, y, w, h]) => Array.from(window.kvlab.players.grid.views[0].ctx.getImageData(x, y, w, h).data)""",
        [rect["x"], rect["y"], rect["w"], rect["h"]],
    )
    return [tuple(data[i:i + 3]) for i in range(0, len(data), 4)]


def check_colours(page, blocks) -> dict:
    """Every block whose slots are all in one state is drawn in that state's colour (and pattern)."""
    seen = {"token": 0, "reserved": 0, "internal": 0, "free": 0}
    bs = blocks["blockSize"]
    for b in range(blocks["n"]):
        owner = blocks["owner"][b]
        rect = blocks["rects"][b]
        states = {"token": blocks["token"][b], "reserved": blocks["reserved"][b], "internal": blocks["internal"][b]}
        whole = [s for s, v in states.items() if v == bs]
        if owner < 0 and sum(states.values()) == 0 and blocks["overhead"][b] == 0:
            kind = "free"
        elif len(whole) == 1:
            kind = whole[0]
        else:
            continue
        if seen[kind] >= 25:
            continue
        seen[kind] += 1
        pixels = square_pixels(page, rect)
        colour = PALETTE[owner % 6] if owner >= 0 else None
        for i, got in enumerate(pixels):
            x, y = rect["x"] + i % rect["w"], rect["y"] + i // rect["w"]
            if i % rect["w"] == 0 and kind != "free":
                continue  # the first column may be a boundary mark where a same-coloured conversation ends
            assert got == expected_pixel(kind, colour, x, y), (b, kind, owner, x, y, got)
    return seen


def legend_colours(page) -> dict:
    return page.evaluate("""() => {
        const px = c => Array.from(c.getContext('2d').getImageData(1, 0, 1, 1).data.slice(0, 3));
        const pick = cls => Array.from(document.querySelectorAll(`#grid-legend .${cls} canvas`)).map(px);
        return {token: pick('legend-token'), reserved: pick('legend-reserved'), free: pick('legend-free')};
    }""")


def test_legend_is_the_palette(lab):
    legend = legend_colours(lab.page)
    assert [tuple(c) for c in legend["token"]] == PALETTE[:3]
    assert [tuple(c) for c in legend["reserved"]] == [expected_pixel("reserved", c, 1, 0) for c in PALETTE[:3]]
    assert [tuple(c) for c in legend["free"]] == [FREE]


def test_pages_hold_more_tokens_than_reserve_the_max(lab):
    page = lab.page
    workload = {"rate": 4, "num_requests": 80, "seed": 3, "batching": "continuous", "block_size": 16}

    set_grid(page, allocator="max", **workload)
    seek(page, 12)
    max_share = counter(page, "token_share")
    blocks = grid_blocks(page)
    seen = check_colours(page, blocks)
    # Reserve-the-max: slabs mostly reserved-but-empty or never to be used, so those colours are on screen.
    assert seen["token"] > 0 and seen["internal"] > 0 and seen["free"] > 0, seen
    lab.screenshot("grid-reserve-the-max", "#grid")

    set_grid(page, allocator="paged", **workload)
    seek(page, 12)
    paged_share = counter(page, "token_share")
    blocks = grid_blocks(page)
    seen = check_colours(page, blocks)
    assert seen["token"] > 0 and seen["free"] > 0, seen
    # Pages: every block but each conversation's last is full.
    owned = [b for b in range(blocks["n"]) if blocks["owner"][b] >= 0]
    full = [b for b in owned if blocks["token"][b] == blocks["blockSize"]]
    assert len(full) >= len(owned) - counter(page, "num_running") - 1
    lab.screenshot("grid-pages", "#grid")

    assert paged_share > 2 * max_share, (max_share, paged_share)
    # The blocks on the page add up to the counters the server sent.
    assert sum(blocks["token"]) == round(paged_share / 100 * blocks["n"] * blocks["blockSize"])


def test_an_eviction_moves_the_counter_and_flashes_the_pages_out(lab):
    page = lab.page
    page.click('[data-show="q3"]')  # pages, a 64-block cache, 20 requests/s: memory runs out mid-answer
    # The first eviction: the counter moves, it pulses, and the evicted conversation's pages flash on the grid.
    page.wait_for_function(
        "Number(document.querySelector('#grid [data-counter=num_preemptions]').dataset.value) > 0 && "
        "window.kvlab.players.grid.views[0].flashes.length > 0",
        timeout=60_000,
    )
    flash = page.evaluate("""() => { const v = window.kvlab.players.grid.views[0], f = v.flashes[0];
        const [c] = f.cells, L = v.layout, x = (c % L.cols) * L.s + 1, y = Math.floor(c / L.cols) * L.s + 1;
        return {cells: f.cells.length, alpha: v.octx.getImageData(x, y, 1, 1).data[3],
                pulsing: document.querySelector('#grid [data-counter=num_preemptions]').classList.contains('pulse'),
                flashes: Number(document.querySelector('#grid .panel').dataset.flashes)}; }""")
    lab.screenshot("grid-eviction-flash", "#grid")
    assert flash["cells"] > 0 and flash["alpha"] > 0, flash  # drawn over the squares the conversation held
    assert flash["pulsing"] and flash["flashes"] >= 1, flash
    page.wait_for_function("Number(document.querySelector('#grid [data-counter=num_recomputed_tokens]')"
                           ".dataset.value) > 0", timeout=60_000)
    page.keyboard.press("Space")  # pause
    page.wait_for_function("!window.kvlab.players.grid.playing")
    evictions = counter(page, "num_preemptions")
    assert evictions > 0 and counter(page, "num_recomputed_tokens") > 0
    # Each eviction the counter shows was flashed (the engine counts them; the page names them between frames).
    flashed = float(page.get_attribute("#grid .panel", "data-flashes"))
    assert 0 < flashed <= evictions
    lab.screenshot("grid-preemption", "#grid")


def test_keyboard_plays_pauses_and_steps(lab):
    page = lab.page
    set_grid(page, allocator="paged", rate=2, num_requests=30)
    page.click("#grid-title")  # the keys drive the figure last touched (on arrival, the first one)
    page.keyboard.press("ArrowRight")
    page.wait_for_function("document.querySelector('#grid').dataset.seq === '1'")
    page.keyboard.press("ArrowRight")
    page.wait_for_function("document.querySelector('#grid').dataset.seq === '2'")
    page.keyboard.press("Space")
    page.wait_for_function("window.kvlab.players.grid.playing && "
                           "Number(document.querySelector('#grid').dataset.seq) > 4")
    assert "pause" in page.inner_text('#grid-transport [data-act="play"]')
    page.keyboard.press("Space")
    page.wait_for_function("!window.kvlab.players.grid.playing")
    assert "play" in page.inner_text('#grid-transport [data-act="play"]')


def test_hover_says_whose_block_it_is(lab):
    page = lab.page
    set_grid(page, allocator="max", rate=4, num_requests=30)
    seek(page, 5)
    blocks = grid_blocks(page)
    b = next(b for b in range(blocks["n"]) if blocks["owner"][b] >= 0 and blocks["token"][b] == blocks["blockSize"])
    rect = blocks["rects"][b]
    canvas = page.locator("#grid canvas.grid")
    canvas.hover(position={"x": rect["x"] + 1, "y": rect["y"] + 1})
    tip = page.locator("#tooltip")
    tip.wait_for(state="visible")
    text = tip.inner_text()
    assert f"block {b}" in text and f"conversation {blocks['owner'][b]}" in text
    assert f"{blocks['blockSize']} tokens" in text
    # The hovered conversation's blocks are outlined, the rest veiled.
    assert page.evaluate("window.kvlab.players.grid.views[0].highlight") == blocks["owner"][b]
    lab.screenshot("grid-hover-highlight", "#grid")
    # The tooltip is rewritten every frame: run on, and it follows what the block holds now.
    held_by = f"conversation {blocks['owner'][b]}:"
    for t in range(10, 60, 5):  # a few seconds on at a time, until the conversation has left that block
        seek(page, t)
        text = tip.inner_text()
        if held_by not in text:
            break
    assert held_by not in text and f"block {b}" in text, text


def test_large_pools_stay_legible(lab):
    page = lab.page
    # the most a page may ask for, on a model whose blocks fit that many on the GPU (OPT-13B's A100-40GB holds 1,274:
    # more is refused, as --num-gpu-blocks is)
    set_grid(page, model="qwen2.5-0.5b-instruct", allocator="paged", num_blocks=65536, rate=20, num_requests=200)
    info = page.evaluate("""() => { const v = window.kvlab.players.grid.views[0];
        return {k: v.layout.k, cells: v.layout.cells, height: v.canvas.height, n: v.n}; }""")
    assert info["n"] == 65536 and info["k"] > 1 and info["cells"] == -(-65536 // info["k"])
    assert info["height"] <= 420
    assert f"one square = {info['k']} blocks" in page.inner_text("#grid .scale")
    seek(page, 10)
    # An aggregated square is drawn as the mix of its blocks: as many token pixels as its share of tokens.
    mix = page.evaluate("""() => { const v = window.kvlab.players.grid.views[0];
        for (let c = 0; c < v.layout.cells; c++) { const s = v.cellState(c);
            if (c > 0 && s.t > 0 && s.t < s.total)
                return {c, t: s.t, total: s.total, owner: s.owner, rect: v.blockRect(c * v.layout.k)}; }
        return null; }""")
    assert mix is not None
    pixels = square_pixels(page, mix["rect"])
    solid = sum(p == PALETTE[mix["owner"] % 6] for p in pixels)
    # The page rounds as JavaScript's Math.round does (halves up), not as Python's round (halves to even).
    assert solid == math.floor(len(pixels) * mix["t"] / mix["total"] + 0.5)
    lab.screenshot("grid-large-pool", "#grid")


POSTED = "performance.getEntriesByType('resource').filter(e => e.name.endsWith('/api/sessions')).length"


def test_a_bad_number_is_refused_in_the_page(lab):
    page = lab.page
    page.click("#grid details.settings summary")
    before = page.evaluate("window.kvlab.players.grid.session")
    posted = page.evaluate(POSTED)
    page.fill('#grid-form [name="rate"]', "abc")
    page.eval_on_selector("#grid-form", "f => f.dispatchEvent(new Event('change'))")
    page.wait_for_selector("#grid-error:not([hidden])")
    assert page.inner_text("#grid-error") == 'requests/s (rate) "abc" is not a number: type one from 0.01 to 100'
    assert page.input_value('#grid-form [name="rate"]') == "abc"  # kept as typed, not replaced by a default
    assert page.get_attribute("#grid", "data-stale") == "1"  # the old result is dimmed
    page.click('#grid-transport [data-act="play"]')  # refused too: nothing runs, nothing is sent
    page.wait_for_timeout(500)
    assert not page.evaluate("window.kvlab.players.grid.playing")
    lab.screenshot("grid-error-abc", "#grid")
    page.fill('#grid-form [name="num_requests"]', "5000")
    page.fill('#grid-form [name="rate"]', "4")
    page.eval_on_selector("#grid-form", "f => f.dispatchEvent(new Event('change'))")
    assert page.inner_text("#grid-error") == "requests (num_requests) 5000 is out of range: 1 to 2000"
    page.fill('#grid-form [name="num_requests"]', "2.5")
    page.eval_on_selector("#grid-form", "f => f.dispatchEvent(new Event('input', {bubbles: true}))")
    assert page.inner_text("#grid-error") == \
        "requests (num_requests) 2.5 is not a whole number: type one from 1 to 2000"
    page.fill('#grid-form [name="num_blocks"]', "lots")
    page.fill('#grid-form [name="num_requests"]', "40")
    page.eval_on_selector("#grid-form", "f => f.dispatchEvent(new Event('change'))")
    assert page.inner_text("#grid-error") == \
        'KV blocks (num_blocks) "lots" is not a whole number: type one from 4 to 65536, or auto'
    page.wait_for_timeout(400)
    after = page.evaluate(POSTED)
    assert after == posted and page.evaluate("window.kvlab.players.grid.session") == before  # nothing sent
    # Fixed: the message goes, a new run starts, the result is no longer dimmed.
    page.fill('#grid-form [name="num_blocks"]', "auto")
    page.eval_on_selector("#grid-form", "f => f.dispatchEvent(new Event('change'))")
    page.wait_for_selector("#grid-error", state="hidden")
    page.wait_for_function("([old]) => window.kvlab.players.grid.session !== old && "
                           "document.querySelector('#grid').dataset.stale === ''", arg=[before])


def test_the_race_refuses_more_than_four_strategies(lab):
    page = lab.page
    assert page.is_hidden('#race-form input[value="vllm"]')  # the lesson's four in view, the others under "more"
    page.click("#race-strategies details.more summary")
    page.check('#race-form input[value="vllm"]', force=True)
    page.wait_for_selector("#race-error:not([hidden])")
    assert page.inner_text("#race-error") == "a race holds at most 4 strategies; 5 are ticked: untick 1"
    assert page.get_attribute("#race", "data-stale") == "1"
    lab.screenshot("race-error-five", "#race")


def test_a_value_the_page_cannot_check_still_gets_the_servers_message(lab):
    """The page checks ranges; what only the simulator knows (a model too long for the GPU) comes from the
    server's validation, shown the same way."""
    page = lab.page
    set_grid(page, num_requests=20)
    old = page.get_attribute("#grid", "data-session")
    page.evaluate("""() => { const f = document.querySelector('#grid-form');
        f.elements.model.value = 'llama-3.1-405b'; f.elements.gpu.value = 'T4';
        f.dispatchEvent(new Event('change')); }""")
    page.wait_for_selector("#grid-error:not([hidden])", timeout=30_000)
    assert "llama-3.1-405b does not fit on T4" in page.inner_text("#grid-error")
    assert page.get_attribute("#grid", "data-stale") == "1"
    assert page.get_attribute("#grid", "data-session") == old


def test_the_power_of_two_round_up_is_attributed_to_its_owner(lab):
    page = lab.page
    set_grid(page, allocator="pow2", num_requests=50)
    seek(page, 10)
    blocks = grid_blocks(page)
    b = next(b for b in range(blocks["n"])
             if blocks["owner"][b] >= 0 and blocks["overhead"][b] == blocks["blockSize"])
    owner, rect = blocks["owner"][b], blocks["rects"][b]
    inner = {p for i, p in enumerate(square_pixels(page, rect)) if i % rect["w"] != 0}
    assert inner == {ink(PALETTE[owner % 6]), FREE}, inner  # hatched in its owner's colour
    page.locator("#grid canvas.grid").hover(position={"x": rect["x"] + 2, "y": rect["y"] + 2})
    tip = page.locator("#tooltip")
    tip.wait_for(state="visible")
    assert f"{blocks['blockSize']} rounded up by the allocator for conversation {owner}" in tip.inner_text()
    lab.screenshot("grid-pow2-round-up", "#grid")


def test_section_2s_text_is_dimmed_when_its_pool_is_refused_and_follows_one_that_fits(lab):
    """The intro and the story box name the pool drawn (its blocks, its slab): refused a model that does not fit,
    they still name the last pool, so they are dimmed with the grid; a pool that fits is named."""
    page = lab.page
    set_grid(page, num_requests=20)
    opacity = lambda sel: float(page.eval_on_selector(sel, "e => getComputedStyle(e).opacity"))  # noqa: E731
    assert opacity("#grid-pool") == 1 and opacity("#story") == 1
    page.evaluate("""() => { const f = document.querySelector('#grid-form');
        f.elements.model.value = 'llama-3.1-70b'; f.elements.gpu.value = 'A100-40GB';
        f.dispatchEvent(new Event('change')); }""")
    page.wait_for_selector("#grid-error:not([hidden])", timeout=30_000)
    assert "does not fit" in page.inner_text("#grid-error")
    assert opacity("#grid-pool") < 0.5 and opacity("#story") < 0.5
    set_form(page, "grid", model="qwen3-32b", gpu="H100-SXM")
    m = page.evaluate("window.kvlab.players.grid.meta")
    assert opacity("#grid-pool") == 1 and opacity("#story") == 1
    assert page.inner_text('#grid-pool [data-field="model"]') == "qwen3-32b"
    assert page.inner_text('#grid-pool [data-field="num-blocks"]') == f"{m['num_gpu_blocks']:,}"
    assert page.inner_text('#story [data-field="slab-blocks"]') == f"{-(-m['max_model_len'] // m['kv_block_size']):,}"


def test_an_empty_grid_says_no_seat_is_taken_yet(lab):
    """Before anyone runs, the seats read "none taken yet" (they read "0 running of 1 (the most at once so far)")."""
    page = lab.page
    set_grid(page, num_requests=20)
    # The new run's first frame may be drawn a moment after the run starts: wait for the seats to be drawn, then read
    # the label and the count together (two reads could straddle a frame).
    page.wait_for_function("() => document.querySelector('#grid .seats-label').textContent !== ''", timeout=30_000)
    label, running = page.evaluate(
        "() => [document.querySelector('#grid .seats-label').textContent, document.querySelector('#grid .seats').dataset.running]")
    if running == "0":
        assert label.startswith("seats: none taken yet"), label
    assert "0 running of 1 (" not in label


def test_a_cache_too_small_for_any_conversation_says_why_each_is_turned_away(lab):
    """Four blocks under reserve the max: every conversation's slab (max_model_len) is larger than the cache, so the
    engine rejects each on arrival; the note under the grid says so and why, rather than nothing."""
    page = lab.page
    set_grid(page, allocator="max", batching="continuous", num_blocks=4, num_requests=20)
    seek(page, 30)
    assert counter(page, "num_rejected") > 0
    note = page.get_attribute("#grid .panel", "data-note")
    assert "turned away on arrival, never to run: max slab larger than the buddy allocator's largest block" in note
    assert "(4 blocks of 16 slots in this cache)" in note, note

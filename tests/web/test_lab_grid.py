"""The grid in a real browser: memory strategies, colours read off the canvas, preemption, keyboard, hover."""

from __future__ import annotations

import math

# Okabe & Ito's colour-blind-safe palette: conversation k is drawn in PALETTE[k % 7].
PALETTE = [(0xE6, 0x9F, 0x00), (0x56, 0xB4, 0xE9), (0x00, 0x9E, 0x73), (0xF0, 0xE4, 0x42),
           (0x00, 0x72, 0xB2), (0xD5, 0x5E, 0x00), (0xCC, 0x79, 0xA7)]
FREE = (0xD9, 0xD9, 0xD9)


def pale(rgb, f=0.3):
    return tuple(math.floor(255 - (255 - v) * f + 0.5) for v in rgb)  # JavaScript's Math.round


def set_grid(page, **values):
    """Change the grid's controls; the page starts a new run (a new session) with them."""
    old = page.get_attribute("#grid", "data-session")
    for name, value in values.items():
        selector = f'#grid-form [name="{name}"]'
        if page.eval_on_selector(selector, "e => e.tagName") == "SELECT":
            page.select_option(selector, str(value))
        else:
            page.fill(selector, str(value))
    page.eval_on_selector("#grid-form", "f => f.dispatchEvent(new Event('change'))")
    page.wait_for_function(
        "old => { const g = document.querySelector('#grid'); "
        "return g.dataset.session !== old && g.dataset.seq === '0' && g.dataset.busy === ''; }",
        arg=old, timeout=30_000,
    )


def clock(page) -> float:
    return float(page.get_attribute('#grid [data-field="clock"]', "data-value"))


def counter(page, key: str, section: str = "#grid") -> float:
    return float(page.get_attribute(f'{section} [data-counter="{key}"]', "data-value"))


def play_until(page, seconds: float):
    """Play with the keyboard until the simulated clock passes ``seconds``, then pause."""
    page.locator("body").click(position={"x": 5, "y": 5})
    page.keyboard.press("Space")
    page.wait_for_function(f"Number(document.querySelector('#grid [data-field=clock]').dataset.value) >= {seconds}"
                           " || window.kvlab.players.grid.done", timeout=60_000)
    page.keyboard.press("Space")
    page.wait_for_function("!window.kvlab.players.grid.playing")
    page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")  # drawn


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
        if kind == "free":
            assert set(pixels) == {FREE}, (b, set(pixels))
            continue
        colour = PALETTE[owner % 7]
        # Skip the first column: a boundary mark where a same-coloured conversation ends.
        inner = [p for i, p in enumerate(pixels) if i % rect["w"] != 0]
        if kind == "token":
            assert set(inner) == {colour}, (b, owner, set(inner))
        elif kind == "reserved":
            assert set(inner) == {pale(colour)}, (b, owner, set(inner))
        else:  # internal fragmentation: the pale tint striped with the solid colour
            assert set(inner) == {colour, pale(colour)}, (b, owner, set(inner))
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
    assert [tuple(c) for c in legend["reserved"]] == [pale(c) for c in PALETTE[:3]]
    assert [tuple(c) for c in legend["free"]] == [FREE]


def test_pages_hold_more_tokens_than_reserve_the_max(lab):
    page = lab.page
    workload = {"rate": 4, "num_requests": 80, "seed": 3, "batching": "continuous", "block_size": 16}

    set_grid(page, allocator="max", **workload)
    play_until(page, 12)
    max_share = counter(page, "token_share")
    blocks = grid_blocks(page)
    seen = check_colours(page, blocks)
    # Reserve-the-max: slabs mostly reserved-but-empty or never to be used, so those colours are on screen.
    assert seen["token"] > 0 and seen["internal"] > 0 and seen["free"] > 0, seen
    lab.screenshot("grid-reserve-the-max", "#grid")

    set_grid(page, allocator="paged", **workload)
    play_until(page, 12)
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


def test_forced_preemption_moves_the_evictions_counter(lab):
    page = lab.page
    page.click('[data-show="q3"]')  # pages, a 64-block cache, 20 requests/s: memory runs out mid-answer
    page.wait_for_function(
        "Number(document.querySelector('#grid [data-counter=num_preemptions]').dataset.value) > 0 && "
        "Number(document.querySelector('#grid [data-counter=num_recomputed_tokens]').dataset.value) > 0",
        timeout=60_000,
    )
    page.keyboard.press("Space")  # pause
    page.wait_for_function("!window.kvlab.players.grid.playing")
    assert counter(page, "num_preemptions") > 0
    assert counter(page, "num_recomputed_tokens") > 0
    answer = page.inner_text('[data-answer="q3"]')
    assert "evictions" in answer and "computed again" in answer
    lab.screenshot("grid-preemption", "#grid")
    lab.screenshot("questions-after-preemption", "#questions")


def test_keyboard_plays_pauses_and_steps(lab):
    page = lab.page
    set_grid(page, allocator="paged", rate=2, num_requests=30)
    page.locator("body").click(position={"x": 5, "y": 5})
    page.keyboard.press("ArrowRight")
    page.wait_for_function("document.querySelector('#grid').dataset.seq === '1'")
    page.keyboard.press("ArrowRight")
    page.wait_for_function("document.querySelector('#grid').dataset.seq === '2'")
    page.keyboard.press("Space")
    page.wait_for_function("window.kvlab.players.grid.playing && Number(document.querySelector('#grid').dataset.seq) > 4")
    assert "pause" in page.inner_text('#grid-transport [data-act="play"]')
    page.keyboard.press("Space")
    page.wait_for_function("!window.kvlab.players.grid.playing")
    assert "play" in page.inner_text('#grid-transport [data-act="play"]')


def test_hover_says_whose_block_it_is(lab):
    page = lab.page
    set_grid(page, allocator="max", rate=4, num_requests=30)
    play_until(page, 5)
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


def test_large_pools_stay_legible(lab):
    page = lab.page
    set_grid(page, allocator="paged", num_blocks=65536, rate=20, num_requests=200)
    info = page.evaluate("""() => { const v = window.kvlab.players.grid.views[0];
        return {k: v.layout.k, cells: v.layout.cells, height: v.canvas.height, n: v.n}; }""")
    assert info["n"] == 65536 and info["k"] > 1 and info["cells"] == -(-65536 // info["k"])
    assert info["height"] <= 420
    assert f"one square = {info['k']} blocks" in page.inner_text("#grid .scale")
    play_until(page, 10)
    # An aggregated square is drawn as the mix of its blocks: as many token pixels as its share of tokens.
    mix = page.evaluate("""() => { const v = window.kvlab.players.grid.views[0];
        for (let c = 0; c < v.layout.cells; c++) { const s = v.cellState(c);
            if (c > 0 && s.t > 0 && s.t < s.total) return {c, t: s.t, total: s.total, owner: s.owner, rect: v.blockRect(c * v.layout.k)}; }
        return null; }""")
    assert mix is not None
    pixels = square_pixels(page, mix["rect"])
    solid = sum(p == PALETTE[mix["owner"] % 7] for p in pixels)
    assert solid == round(len(pixels) * mix["t"] / mix["total"])
    lab.screenshot("grid-large-pool", "#grid")


def test_out_of_range_value_shows_the_servers_message(lab):
    page = lab.page
    page.fill('#grid-form [name="num_requests"]', "5000")
    page.eval_on_selector("#grid-form", "f => f.dispatchEvent(new Event('change'))")
    page.wait_for_selector("#grid-error:not([hidden])")
    assert "num_requests 5000 is out of range: 1 to 2000" in page.inner_text("#grid-error")
    lab.screenshot("grid-error", "#grid")

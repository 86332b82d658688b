"""The lab as a newcomer meets it: the default story (reserve the max, then pages), the page's layout on a phone
and a desktop, the quiz, and the bridge to a real vLLM (its command, its startup log, a pasted log)."""

from __future__ import annotations

from pathlib import Path

import pytest
from labpage import clock, counter, drawn, overflowing, seek, set_form, wait_new_run

VIEWPORTS = [(390, 844), (1440, 900)]
REAL_LOG = Path(__file__).parent / "data" / "vllm-0.32.0-cpu-startup.log"  # printed by vLLM 0.32.0 (CPU) here

SUMMARY_FIELDS = {
    "num_finished": lambda s: s["num_finished"],
    "finish_time": lambda s: s["makespan_s"],
    "throughput_rps": lambda s: s["throughput_rps"],
    "token_share": lambda s: s["memory_shares"]["token"],
    "mean_batch_size": lambda s: s["mean_batch_size"],
    "preemptions": lambda s: s["preemptions"],
    "recomputed_tokens": lambda s: s["recomputed_tokens"],
}


def summary_rows(page, section: str) -> dict[str, dict[str, float]]:
    return page.evaluate(
        """sel => { const out = {};
        for (const row of document.querySelectorAll(`${sel} table.summary tr[data-strategy]`)) {
            const cells = {};
            for (const td of row.querySelectorAll('td[data-key]')) cells[td.dataset.key] = Number(td.dataset.value);
            out[row.dataset.strategy] = cells; }
        return out; }""",
        section,
    )


def play(page, section: str = "#grid"):
    page.click(f'{section}-transport [data-act="play"]')
    page.wait_for_function(f"window.kvlab.players.{section[1:]}.playing")


def pause(page, section: str = "#grid"):
    page.click(f'{section}-transport [data-act="play"]')
    page.wait_for_function(f"!window.kvlab.players.{section[1:]}.playing")
    drawn(page)


def to_the_end(page, section: str = "#grid"):
    page.click(f'{section}-transport [data-act="finish"]')
    page.wait_for_selector(f"{section}-finish:not([hidden])", timeout=60_000)
    drawn(page)


def test_the_default_story_reserve_the_max_then_pages(lab, kvlab):
    """The page opens on reserve-the-max under the CLI's own load, then asks for pages; the token share rises past
    80% with pages, and the page's summaries are `kvlab race --json` for the same (default) settings."""
    race = kvlab("race", "continuous+max", "continuous+paged", "--json").json()
    expected = {s["name"]: s for s in race["strategies"]}
    page = lab.page
    assert page.evaluate("document.querySelector('#grid-form').elements.allocator.value") == "max"
    assert page.evaluate("document.querySelector('#grid-form').elements.batching.value") == "continuous"
    assert page.input_value('#grid-form [name="rate"]') == "4"
    assert page.input_value('#grid-form [name="num_requests"]') == "1000"
    assert "current" in page.get_attribute('#story [data-step="max"]', "class")
    lab.screenshot("story-0-opened", "#grid")

    seek(page, 30)  # thirty simulated seconds in: a defined frame, whatever the machine's speed
    assert clock(page) >= 30
    assert counter(page, "token_share") < 30  # most of each slab is reserved, never written
    assert counter(page, "num_waiting") > 0  # and a queue waits
    note = page.get_attribute("#grid .panel", "data-note")
    # The head of the queue needs a 2,048-slot slab (128 blocks) in one piece, and no free piece is that long.
    assert "needs 128 blocks in one piece; the largest free piece is" in note and "it waits" in note, note
    lab.screenshot("story-1-reserve-the-max", "#grid")
    play(page)  # and it plays on from there
    page.wait_for_function("Number(document.querySelector('#grid [data-field=clock]').dataset.value) > 31",
                           timeout=60_000)
    pause(page)

    to_the_end(page)
    max_run = expected["continuous+max"]
    rows = summary_rows(page, "#grid-finish")
    for key, field in SUMMARY_FIELDS.items():
        assert rows["continuous+max"][key] == pytest.approx(field(max_run), rel=1e-12, abs=1e-12), key
    # The end of the run keeps the run's time-averaged numbers on screen, not the empty last frame.
    average = float(page.get_attribute('#grid [data-counter="token_share"]', "data-average"))
    assert average == pytest.approx(max_run["memory_shares"]["token"], rel=1e-12)
    assert page.inner_text('#grid [data-counter="token_share"]') == f"{max_run['memory_shares']['token']:.1f}%"
    assert "Run over" in page.inner_text("#grid .ended")
    assert "current" in page.get_attribute('#story [data-step="paged"]', "class")
    lab.screenshot("story-1-end", "#grid")

    old = page.get_attribute("#grid", "data-session")
    page.click('#story [data-act="story-next"]')
    page.wait_for_function("old => document.querySelector('#grid').dataset.session !== old", arg=old)
    page.wait_for_function("window.kvlab.players.grid.playing")
    page.wait_for_function("Number(document.querySelector('#grid [data-counter=token_share]').dataset.value) > 80",
                           timeout=60_000)
    assert page.evaluate("document.querySelector('#grid-form').elements.allocator.value") == "paged"
    pause(page)
    lab.screenshot("story-2-pages", "#grid")
    to_the_end(page)
    rows = summary_rows(page, "#grid-finish")
    assert list(rows) == ["continuous+max", "continuous+paged"]
    for name, s in expected.items():
        for key, field in SUMMARY_FIELDS.items():
            assert rows[name][key] == pytest.approx(field(s), rel=1e-12, abs=1e-12), (name, key)
    compare = page.inner_text("#story .compare")
    assert f"{max_run['memory_shares']['token']:.1f}%" in compare
    assert f"{expected['continuous+paged']['memory_shares']['token']:.1f}%" in compare
    lab.screenshot("story-2-end", "#grid")


@pytest.mark.parametrize("width, height", VIEWPORTS)
def test_the_page_never_scrolls_sideways(lab_at, width, height):
    probe = lab_at(width, height)
    page = probe.page
    assert overflowing(page) == [], "at load"
    probe.screenshot(f"layout-{width}-load")
    play(page)
    page.wait_for_function("Number(document.querySelector('#grid [data-field=clock]').dataset.value) > 10",
                           timeout=60_000)
    assert overflowing(page) == [], "during a grid run"
    pause(page)
    to_the_end(page)
    assert overflowing(page) == [], "after a grid run"
    probe.screenshot(f"layout-{width}-grid-end", "#grid")
    set_form(page, "race", num_requests=200)
    play(page, "#race")
    page.wait_for_function("Number(document.querySelector('#race [data-field=clock]').dataset.value) > 10",
                           timeout=60_000)
    assert overflowing(page) == [], "during a race"
    pause(page, "#race")
    to_the_end(page, "#race")
    assert overflowing(page) == [], "after a race"
    lanes = page.evaluate("""() => { const xs = new Set(Array.from(document.querySelectorAll('#race .panel'))
        .map(p => Math.round(p.getBoundingClientRect().left))); return xs.size; }""")
    assert lanes == (1 if width < 640 else 4)  # the race's lanes: one column on a phone, four on a desktop
    probe.screenshot(f"layout-{width}-race-end", "#race")
    probe.screenshot(f"layout-{width}-page")


def test_after_a_resize_the_whole_grid_is_visible(lab_at):
    probe = lab_at(1440, 900)
    page = probe.page
    wide = page.evaluate("window.kvlab.players.grid.views[0].layout.cols")

    def whole_grid() -> dict:
        return page.evaluate("""() => { const v = window.kvlab.players.grid.views[0], L = v.layout;
            const c = v.canvas.getBoundingClientRect(), w = v.wrap.getBoundingClientRect();
            return {cols: L.cols, fits: L.cols * L.s <= v.wrap.clientWidth && c.right <= w.right + 0.5 &&
                    c.bottom <= w.bottom + 0.5 && c.width === v.canvas.width,
                    covers: L.cols * L.rows >= L.cells && L.cells * L.k >= v.n}; }""")

    for width in (390, 700, 1440):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_function(f"window.kvlab.players.grid.views[0].width <= {width}")
        drawn(page)
        got = whole_grid()
        assert got["fits"] and got["covers"], (width, got)
        if width == 390:
            assert got["cols"] < wide
            probe.screenshot("resize-390", "#grid")
    assert whole_grid()["cols"] == wide


def test_the_quiz_reveals_answers_only_after_a_choice(lab):
    page = lab.page
    for q in ("q1", "q2", "q3"):
        assert page.is_hidden(f"#{q} .reveal"), q
        assert page.inner_text(f'[data-answer="{q}"]') == ""
    lab.screenshot("quiz-before", "#questions")
    page.check('#q1 input[value="a"]', force=True)  # wrong: about 90%
    page.wait_for_selector("#q1 .reveal:not([hidden])")
    assert page.inner_text("#q1 .verdict").startswith("Not quite")
    assert "wrong" in page.get_attribute('#q1 .options label:has(input[value="a"])', "class")
    assert "right" in page.get_attribute('#q1 .options label:has(input[value="c"])', "class")
    assert "20.4%" in page.inner_text('[data-answer="q1"]')  # the paper's number, before any run of ours
    assert page.is_hidden("#q2 .reveal") and page.is_hidden("#q3 .reveal")  # the others stay closed

    # Watch reserve-the-max to its end: the explanation now uses that run's time-averaged shares.
    set_form(page, "grid", allocator="max", num_requests=200)
    to_the_end(page)
    shares = page.evaluate("window.kvlab.facts.max.summary.memory_shares")
    answer = page.inner_text('[data-answer="q1"]')
    assert "time-averaged" in answer and f"{shares['token']:.1f}%" in answer
    assert f"{shares['internal_fragmentation']:.1f}%" in answer

    page.click('[data-show="q3"]')  # a 64-block paged cache at 20 requests/s
    page.wait_for_function("Number(document.querySelector('#grid [data-counter=num_preemptions]').dataset.value) > 3",
                           timeout=60_000)
    pause(page)
    page.check('#q3 input[value="b"]', force=True)
    page.wait_for_selector("#q3 .reveal:not([hidden])")
    assert page.inner_text("#q3 .verdict").startswith("Right")
    c = page.evaluate("window.kvlab.facts.paged")
    answer = page.inner_text('[data-answer="q3"]')
    evictions = c["counters"]["num_preemptions"]
    assert f"{evictions:,} evictions" in answer
    assert f"computed {c['counters']['num_recomputed_tokens']:,} tokens a second time" in answer
    if c["note"]["tokens_to_recompute"]:
        assert f"and {c['note']['tokens_to_recompute']:,} more wait in the queue" in answer
    lab.screenshot("quiz-after", "#questions")


def test_the_bridge_reads_vllms_startup_lines(lab, kvlab):
    """The bridge speaks of the model picked on the page (the calculator's menu), not of command-line flags, and
    says what drawing its pool changes before the reader presses it."""
    page = lab.page
    page.wait_for_function("document.querySelector('#bridge-log').textContent.includes('KV cache size')")
    assert "vllm serve facebook/opt-13b" in page.inner_text("#bridge pre.cmd")  # the calculator's default
    page.select_option("#calc-model", "qwen2.5-0.5b-instruct")
    page.wait_for_function("document.querySelector('#bridge pre.cmd').textContent.includes('Qwen2.5-0.5B')")
    assert "vllm serve Qwen/Qwen2.5-0.5B-Instruct" in page.inner_text("#bridge pre.cmd")
    size = kvlab("size", "qwen2.5-0.5b-instruct", "--gpu", "A100-40GB", "--json").json()
    page.wait_for_function("document.querySelector('#bridge-log').textContent.includes('"
                           f"{size['num_tokens']:,}')")
    before = page.inner_text("#bridge-scale")
    assert before.startswith("This sets section 2 to qwen2.5-0.5b-instruct on A100-40GB") and "pages" in before
    assert "--" not in page.inner_text("#bridge")  # no command-line flags for a web reader
    assert page.inner_text("#bridge-log").splitlines() == size["vllm_log_lines"]
    blocks = page.locator('#bridge [data-field="bridge-blocks"]')
    assert int(blocks.get_attribute("data-value")) == size["num_blocks"] == size["num_tokens"] // 16
    assert f"{size['num_tokens']:,} / 16 = {size['num_blocks']:,} blocks" in blocks.inner_text()
    # The pool itself, drawn at a scale the page picks and states.
    old = page.get_attribute("#grid", "data-session")
    page.click('[data-act="bridge-draw"]')
    wait_new_run(page, "grid", old)
    meta = page.evaluate("(g => ({k: g.meta.display_scale, n: g.meta.num_gpu_blocks, layoutK: g.views[0].layout.k}))"
                         "(window.kvlab.players.grid)")
    assert meta["n"] == size["num_blocks"] and meta["k"] > 1
    scale = meta["k"] * meta["layoutK"]
    assert f"display scale: one square = {scale:,} blocks" in page.inner_text("#grid .scale")
    assert f"one square = {scale:,} blocks" in page.inner_text("#bridge-scale")
    play(page)
    page.wait_for_function("Number(document.querySelector('#grid [data-field=clock]').dataset.value) > 5",
                           timeout=60_000)
    pause(page)
    assert clock(page) > 5
    lab.screenshot("bridge-pool-in-the-grid", "#grid")
    lab.screenshot("bridge", "#bridge")


def test_a_pasted_startup_log_is_explained(lab):
    page = lab.page
    page.fill("#vllm-log-input", REAL_LOG.read_text())
    page.click('[data-act="explain-log"]')
    page.wait_for_selector("#vllm-log-out:not([hidden])")
    out = "#vllm-log-out"
    # vLLM 0.32.0 printed "CPU KV cache size: 262,144 tokens" with --block-size 32.
    assert page.get_attribute(f'{out} [data-key="kv_cache_tokens"]', "data-value") == "262144"
    assert page.get_attribute(f'{out} [data-key="num_gpu_blocks"]', "data-value") == str(262144 // 32)
    assert "blocks of 32 tokens" in page.inner_text(out)
    assert page.get_attribute(f'{out} [data-key="max_concurrency"]', "data-value") == "128"
    assert "262,144" in page.inner_text(out)
    assert "--model" not in page.inner_text(out)  # the page's own menu is named, not a command-line flag
    lab.screenshot("vllm-log-explained", "#bridge")
    # Text in no known format: the message says which lines were expected.
    page.fill("#vllm-log-input", "Traceback (most recent call last):\n  File 'x.py', line 1\nRuntimeError: boom\n")
    page.click('[data-act="explain-log"]')
    page.wait_for_selector("#vllm-log-error:not([hidden])")
    message = page.inner_text("#vllm-log-error")
    assert message.startswith("no vLLM KV cache line found") and "GPU KV cache size: N tokens" in message
    assert page.is_hidden(out)
    page.fill("#vllm-log-input", "   ")
    page.click('[data-act="explain-log"]')
    assert page.inner_text("#vllm-log-error").startswith("paste a vLLM startup log first")
    lab.screenshot("vllm-log-unknown", "#bridge")


def test_blocks_can_be_inspected_with_the_keyboard(lab):
    page = lab.page
    set_form(page, "grid", allocator="max", num_requests=40)
    play(page)
    page.wait_for_function("Number(document.querySelector('#grid [data-counter=num_running]').dataset.value) > 0",
                           timeout=60_000)
    pause(page)
    label = page.get_attribute("#grid canvas.grid", "aria-label")
    assert label.startswith("KV cache of continuous+max") and "Arrow keys" in label
    page.focus("#grid canvas.grid")
    page.keyboard.press("ArrowRight")  # the first square
    page.keyboard.press("ArrowRight")
    assert page.evaluate("window.kvlab.players.grid.views[0].kbCell") == 1
    page.wait_for_selector("#tooltip:not([hidden])")
    assert page.inner_text("#announce").startswith("block 1")  # read out by a screen reader (a live region)
    assert page.get_attribute("#grid .bignums", "aria-live") == "polite"
    assert not page.evaluate("window.kvlab.players.grid.playing")  # arrows on the grid move, they do not step

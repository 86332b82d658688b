"""The page's tail: each section's own error slot, stale figures dimmed or hidden, advice that names only the
page's controls, prose that follows the run it draws, and the smaller points of issue 33. Each test here failed on
the page before (5868b29). The ``lab`` fixtures fail a test on any console error: a refused value logs nothing."""

from __future__ import annotations

import pytest
from labpage import seek, set_form, wait_new_run

from kvlab.web.server import size_answer


def opacity(page, selector: str) -> float:
    return page.evaluate("""s => { let o = 1; for (let e = document.querySelector(s); e; e = e.parentElement)
        o *= Number(getComputedStyle(e).opacity); return o; }""", selector)


def test_a_refused_model_is_said_in_the_calculator_and_the_bridge_and_clears(lab):
    page = lab.page
    page.wait_for_function("document.querySelector('#calculator').dataset.state === 'ok'")
    refused = size_answer({"model": "llama-3.1-70b", "gpu": "A100-80GB"}, page=True)
    assert refused["refused"] and refused["advice"]  # the engine refuses this pair (else the test shows nothing)
    page.select_option("#calc-gpu", "A100-80GB")
    page.select_option("#calc-model", "llama-3.1-70b")
    page.wait_for_function("document.querySelector('#calculator').dataset.state === 'refused'")
    page.wait_for_selector("#bridge-error:not([hidden])")
    calc_error = page.inner_text("#calc-error")
    assert calc_error.startswith(refused["error"])
    assert "Try: " + "; or ".join(refused["advice"]) in calc_error
    # Advice names the page's controls only: no command-line flag (the page has no --tensor-parallel-size).
    assert "--" not in calc_error and "--" not in page.inner_text("#bridge-error")
    # The log box's slot is the log's: a refused model in the calculator is not said under "explain my log".
    assert page.is_hidden("#vllm-log-error")
    # The previous model's figures are not shown as this one's: hidden in the calculator, dimmed in the bridge.
    assert page.is_hidden("#calc-out")
    assert page.get_attribute("#bridge-now", "data-stale") == "1" and opacity(page, "#bridge-now pre.cmd") < 0.5
    assert page.is_disabled('[data-act="bridge-draw"]')
    lab.screenshot("calculator-refused", "#calculator")
    # A model that fits: both errors go, and the bridge speaks of it.
    page.select_option("#calc-model", "opt-13b")
    page.wait_for_function("document.querySelector('#calculator').dataset.state === 'ok'")
    page.wait_for_selector("#bridge-error", state="hidden")
    page.wait_for_function("document.querySelector('#bridge-now').dataset.stale === ''")
    assert page.is_hidden("#calc-error") and page.is_visible("#calc-out")
    assert page.inner_text('#bridge [data-field="bridge-model"]') == "opt-13b"
    assert opacity(page, "#bridge-now pre.cmd") == 1.0 and page.is_enabled('[data-act="bridge-draw"]')


def test_a_context_past_max_model_len_names_the_pages_field(lab):
    page = lab.page
    page.wait_for_function("document.querySelector('#calculator').dataset.state === 'ok'")
    page.fill("#calc-context", "4000")
    page.wait_for_function("document.querySelector('#calculator').dataset.state === 'refused'")
    expected = size_answer({"context_len": "4000"}, page=True)
    text = page.text_content("#calc-error")
    assert "--max-model-len" not in text and "tokens each" in text
    assert text == expected["error"] + "Try: " + expected["advice"][0] + "."


def test_a_value_typed_out_of_range_dims_the_figures_it_no_longer_matches(lab):
    page = lab.page
    page.wait_for_function("document.querySelector('#calculator').dataset.state === 'ok'")
    assert opacity(page, "#calc-figures") == 1.0
    page.fill("#calc-concurrency", "abc")
    page.wait_for_function("document.querySelector('#calculator').dataset.state === 'stale'")
    assert opacity(page, "#calc-figures") < 0.5
    page.fill("#calc-concurrency", "8")
    page.wait_for_function("document.querySelector('#calculator').dataset.state === 'ok'")
    assert opacity(page, "#calc-figures") == 1.0


def test_the_calculator_says_why_its_shares_are_not_the_papers(lab):
    page = lab.page
    catalog = page.evaluate("window.kvlab.catalog")
    fig1 = catalog["paper"]["figure1"]
    page.select_option("#calc-gpu", fig1["gpu"].upper())
    page.select_option("#calc-model", fig1["model"])
    page.wait_for_function("document.querySelector('#calc-paper').textContent.includes('label')")
    note = page.inner_text("#calc-paper")
    answer = size_answer({"model": fig1["model"], "gpu": fig1["gpu"]})
    assert f"{round(100 * fig1['weights_share'])}% weights" in note
    assert f"{round(100 * fig1['kv_cache_share'])}% KV cache" in note
    assert "1 GB = 10⁹ bytes" in note and "1 GiB = 2³⁰ bytes" in note
    assert f"{answer['gpu_memory_bytes'] / 2**30:.2f} GiB" in note
    assert "10% vLLM leaves unused at GPU memory utilization 0.9" in note
    assert f"these weights are {round(100 * answer['weights_bytes'] / fig1['label_bytes'])}%" in note


def test_section_2s_text_names_the_pool_it_draws(lab, kvlab):
    page = lab.page
    page.select_option("#calc-model", "qwen2.5-0.5b-instruct")
    page.wait_for_function("document.querySelector('#bridge-scale').textContent.includes('qwen2.5-0.5b')")
    size = kvlab("size", "qwen2.5-0.5b-instruct", "--gpu", "A100-40GB", "--json").json()
    old = page.get_attribute("#grid", "data-session")
    page.click('[data-act="bridge-draw"]')
    wait_new_run(page, "grid", old)
    text = page.inner_text("#grid-pool")
    assert "qwen2.5-0.5b-instruct on A100-40GB" in text
    assert f"leaves {size['num_blocks']:,} blocks of 16 tokens" in text
    default = page.evaluate("window.kvlab.catalog.defaults.model")
    assert default not in text


@pytest.mark.parametrize("section", ["grid", "race"])
def test_refused_runs_log_nothing_advise_the_pages_controls_and_clear(lab, section):
    """A run the engine refuses (a model that does not fit the GPU) is one line in the section, with what to change
    among the section's own controls, never a command-line flag (it once said "Would fit: --tensor-parallel-size 4",
    a control the page does not have); a valid one clears it. The fixture fails the test on any console error, the
    400 a refusal once logged included."""
    page = lab.page
    page.evaluate("""s => { const f = document.querySelector(s);
        f.elements.model.value = 'llama-3.1-70b'; f.elements.gpu.value = 'A100-40GB';
        f.dispatchEvent(new Event('change')); }""", f"#{section}-form")
    page.wait_for_selector(f"#{section}-error:not([hidden])", timeout=30_000)
    said = page.inner_text(f"#{section}-error")
    assert "does not fit" in said
    assert "--" not in said and "Try: pick a GPU it fits on: " in said, said
    assert page.get_attribute(f"#{section}", "data-stale") == "1"
    set_form(page, section, model="opt-13b")
    assert page.is_hidden(f"#{section}-error")


def test_every_section_link_is_in_view_on_a_phone(lab_at):
    page = lab_at(390, 844).page
    out = page.evaluate("""() => Array.from(document.querySelectorAll('header nav a')).map(a => {
        const r = a.getBoundingClientRect();
        const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
        return {text: a.textContent, left: r.left, right: r.right, shown: hit === a || a.contains(hit)}; })""")
    assert out and all(a["left"] >= 0 and a["right"] <= 390 and a["shown"] for a in out), out


def test_the_calculators_labels_are_legible(lab):
    """White type on each segment of the memory bar at 4.5:1 or more (WCAG AA for text)."""
    page = lab.page
    page.wait_for_function("document.querySelector('#calculator').dataset.state === 'ok'")
    ratios = page.evaluate("""() => {
        const lum = c => { const v = c.match(/\\d+/g).slice(0, 3).map(Number).map(x => x / 255)
            .map(x => x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4);
            return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; };
        return Array.from(document.querySelectorAll('#calc-bar span')).map(s => {
            const st = getComputedStyle(s), a = lum(st.color), b = lum(st.backgroundColor);
            return [s.dataset.part, (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)]; }); }""")
    assert {part for part, _ in ratios} >= {"weights", "kv", "other"}
    assert all(r >= 4.5 for _, r in ratios), ratios


def test_the_evictions_panel_says_each_number_once(lab):
    page = lab.page
    seek(page, 60, "evictions")  # (section 5 runs at pages' breaking point: evictions begin some 45 s in)
    panel = page.evaluate("""() => Array.from(document.querySelectorAll('#evictions .bignums > div')).map(d =>
        [d.querySelector('.big').textContent, d.querySelector('.what').textContent])""")
    assert float(page.get_attribute('#evictions [data-counter="num_preemptions"]', "data-value")) > 0
    for number, _ in panel:
        assert not any(number in what for _, what in panel), panel  # no label repeats a big number


def test_the_free_piece_outline_is_in_the_legend(lab):
    assert "dashed outline: the largest free piece" in lab.page.inner_text("#grid-legend")


def test_the_first_screen_uses_no_term_before_it_is_defined(lab):
    page = lab.page
    seek(page, 60, "hero")
    text = page.inner_text("#hero")
    for name in page.evaluate("window.kvlab.catalog.defaults.story"):
        assert name not in text  # kvlab's strategy names come with section 2's definitions
    if "null block" in text:
        assert "placeholder" in text  # defined where it is said


def test_the_first_screens_waste_is_said_in_full_size_type(lab):
    page = lab.page
    seek(page, 60, "hero")
    bold = page.locator('#hero .sharebar-label b[data-share="reserved"]').first
    assert "reserved, still empty" in bold.inner_text()
    size = float(bold.evaluate("b => parseFloat(getComputedStyle(b).fontSize)"))
    pointer = float(page.evaluate("parseFloat(getComputedStyle(document.querySelector('#hero .pointer')).fontSize)"))
    assert size >= pointer


@pytest.mark.parametrize("width, height", [(390, 844)])
def test_tapping_a_square_says_what_it_is(lab_at, width, height):
    page = lab_at(width, height).page
    seek(page, 60, "hero")
    said = page.evaluate("""() => { const c = document.querySelector('#hero canvas.grid');
        const r = c.getBoundingClientRect();
        c.dispatchEvent(new MouseEvent('click', {clientX: r.left + 3, clientY: r.top + 3, bubbles: true}));
        const t = document.getElementById('tooltip'); return [t.hidden, t.textContent]; }""")
    assert said[0] is False and said[1]


def test_the_race_table_needs_no_sideways_scrolling_on_a_phone(lab_at):
    page = lab_at(390, 844).page
    set_form(page, "race", num_requests=30)
    page.evaluate("window.kvlab.players.race.finish()")
    page.wait_for_selector("#race-finish table.summary", timeout=60_000)
    wrap = page.evaluate("""() => { const t = document.querySelector('#race-finish table.summary');
        return [t.scrollWidth, t.parentElement.clientWidth]; }""")
    assert wrap[0] <= wrap[1], wrap
    # Each value keeps its label beside it (the header row is not shown on a phone).
    label = page.evaluate("""() => getComputedStyle(document.querySelector(
        '#race-finish td[data-key=preemptions]'), '::before').content""")
    assert label == '"evictions"'


def test_every_part_of_the_script_is_joined_once_in_order():
    """Each web/static/lab-*.js is in the bundle's PARTS once (a part left out would be dead code in the package and
    a name missing at run time); the shared player is its own small part, its panels and finish line beside it."""
    from kvlab.web.bundle import PARTS
    from kvlab.web.server import static_dir

    assert sorted(PARTS) == sorted(p.name for p in static_dir().glob("lab-*.js"))
    assert PARTS.index("lab-player.js") < PARTS.index("lab-panel.js") < PARTS.index("lab-live.js")
    assert len((static_dir() / "lab-player.js").read_text(encoding="utf-8").splitlines()) < 200


def test_the_page_types_in_no_engine_number():
    """Every number and rule comes from the engine's frames and answers: none of the default setup's numbers, the
    paper's figures or a block-size fallback is typed into the page's script or text (the page's script is its
    parts joined, kvlab.web.bundle, as the export inlines it)."""
    from kvlab.paper import FIG2_PAPER
    from kvlab.web.bundle import PARTS, lab_js
    from kvlab.web.server import static_dir

    script, page = lab_js(), (static_dir() / "index.html").read_text(encoding="utf-8")
    assert all((static_dir() / part).read_text(encoding="utf-8") in script for part in PARTS)
    paper = {f"{v:g}" for shares in FIG2_PAPER.values() for v in shares.values() if v}
    for typed in ("|| 16", "||16", "2,048", "2048", "867", "800 KB", *paper):
        assert typed not in script, typed
        assert typed not in page, typed

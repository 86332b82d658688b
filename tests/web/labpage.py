"""What the browser tests do to the lab's page and read back from it (shared by the test files)."""

from __future__ import annotations


def set_form(page, section: str, **values):
    """Set the controls of ``#SECTION-form`` (toggles, settings, strategy checkboxes) as a person would leave them,
    and wait for the new run the page starts with them."""
    old = page.get_attribute(f"#{section}", "data-session")
    page.evaluate(
        """([sel, values]) => { const f = document.querySelector(sel);
        for (const [k, v] of Object.entries(values)) {
            if (k === 'strategies') {
                for (const i of f.querySelectorAll('input[name=strategy]')) i.checked = v.includes(i.value);
            } else f.elements[k].value = String(v);
        }
        f.dispatchEvent(new Event('change')); }""",
        [f"#{section}-form", values],
    )
    wait_new_run(page, section, old)


def wait_new_run(page, section: str, old: str | None):
    page.wait_for_function(
        "([sel, old]) => { const g = document.querySelector(sel); "
        "return g.dataset.session !== old && g.dataset.seq === '0' && g.dataset.busy === ''; }",
        arg=[f"#{section}", old], timeout=30_000,
    )


def clock(page, section: str = "#grid") -> float:
    return float(page.get_attribute(f'{section} [data-field="clock"]', "data-value"))


def counter(page, key: str, section: str = "#grid") -> float:
    return float(page.get_attribute(f'{section} [data-counter="{key}"]', "data-value"))


def drawn(page):
    page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def overflowing(page) -> list[str]:
    """Elements reaching past the viewport's right edge (outside a box that scrolls on its own): what would
    make the page scroll sideways. Empty when the layout holds."""
    return page.evaluate("""() => {
        const W = document.documentElement.clientWidth, out = [];
        const scrolls = e => { for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
            const o = getComputedStyle(a).overflowX;
            if (o === 'auto' || o === 'scroll' || o === 'hidden') return true; }
            return false; };
        for (const e of document.body.querySelectorAll('*')) {
            const r = e.getBoundingClientRect();
            if (r.width === 0 || r.height === 0 || getComputedStyle(e).position === 'fixed') continue;
            if (r.right > W + 0.5 && !scrolls(e)) out.push(`${e.tagName.toLowerCase()}${e.id ? '#' + e.id : ''}` +

                `.${e.className} right=${Math.round(r.right)} > ${W}`);
        }
        const sw = document.documentElement.scrollWidth;
        if (sw > W) out.push(`document scrollWidth ${sw}`);
        return out.slice(0, 10); }""")


def seek(page, seconds: float, section: str = "grid"):
    """Run the section's engine on to ``seconds`` of simulated time and wait until that frame is drawn, notes and
    all: a defined frame, the same on any machine and any browser (playing would stop wherever the wall clock
    happened to be when the test pressed pause)."""
    page.evaluate("([s, t]) => window.kvlab.players[s].seek(t)", [section, seconds])
    page.wait_for_function("s => { const p = window.kvlab.players[s]; return !p.playing && !p.textDue && "
                           "!p.drawPending; }", arg=section)
    drawn(page)

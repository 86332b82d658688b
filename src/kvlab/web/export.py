"""``kvlab race --html FILE``: one self-contained page that replays a race with the lab's grid and counters.

The race is run here, once, on one clock (session.Race), and every frame is recorded: a key frame, then deltas.
The frame log is gzip-compressed and base64-encoded into the page; the page's own script (the lab's lab.js,
inlined with lab.css) unpacks it with the browser's DecompressionStream and replays it. No server, no network,
no CDN: the file can be mailed to a colleague.

What a replay cannot hold, the page says: the lab's section 7 (each system's latency as the rate grows) is dozens of
whole-workload runs made when a rate is asked for, not frames; the page names the command that writes it as an
offline page of its own (rates_command).
"""

from __future__ import annotations

import base64
import gzip
import html
import json
from importlib import resources
from pathlib import Path

from kvlab.web.session import Race

# About this many frames per replay: smooth at 10x, and a page of a few MB at most for four grids.
TARGET_FRAMES = 600


def record_race(simulations: list, *, target_frames: int = TARGET_FRAMES) -> dict:
    """Run ``simulations`` (fresh, same workload) to the end on one clock; return the frame log.

    Frames are taken at a fixed step of simulated time: the span of arrivals over ``target_frames / 2``
    to start with; whenever the log reaches another ``target_frames / 2`` frames the step doubles, so a long
    tail (a slow strategy still draining its queue) cannot make the log grow without bound.
    """
    race = Race(simulations)
    frames = [race.frame(None)]
    first = race.sims[0]
    span = max(first.requests[-1].arrival_time - race.start_time, 1.0) if first.requests else 1.0
    half = max(1, target_frames // 2)
    dt = span / half
    next_doubling = 2 * half
    while not race.done:
        race.advance(dt)
        frames.append(race.frame(race.seq))
        if len(frames) >= next_doubling:
            dt *= 2
            next_doubling += half
    return {"meta": race.meta(), "frames": frames}


def pack_log(log: dict) -> str:
    raw = json.dumps(log, separators=(",", ":")).encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")


def rates_command(config) -> str:
    """The command that draws the lab's section 7 (each system's latency against the rate, its breaking point) for
    the race's configuration (a resolved KvlabConfig), as an offline page of its own (kvlab-rates/capacity.html):
    the search kvlab.web.rates runs."""
    from kvlab.web.rates import RateLab

    w = config.workload
    return (f"kvlab capacity --strategy {','.join(RateLab.systems())} --model {config.model.model} "
            f"--gpu {config.device.gpu.lower()} --workload {w.workload} -n {w.num_requests} --seed {w.seed} "
            f"--block-size {config.cache.block_size} --cost {config.cost.name} --out kvlab-rates")


def render_page(log: dict, *, title: str, rates: str) -> str:
    """The replay page for ``log``; ``rates``: the command that draws section 7 for its setup (rates_command)."""
    from kvlab.web.bundle import lab_js

    static = resources.files("kvlab.web") / "static"
    template = (static / "export.html").read_text(encoding="utf-8")
    css = (static / "lab.css").read_text(encoding="utf-8")
    js = lab_js()
    if "</script" in js.lower():
        raise RuntimeError("lab.js contains '</script', which would end the inlined script early")
    meta = log["meta"]
    about = (
        f"{len(meta['grids'])} strategies · {meta['model']} on {meta['gpu']} · "
        f"{meta['num_blocks']:,} blocks of {meta['block_size']} tokens ({meta['num_slots']:,} token slots) · "
        f"workload {meta['workload_description']}"
        + (f". {meta['printed_size']}." if meta.get("printed_size") else "")  # (run's setup line's relation)
    )
    # Placeholders are replaced in one pass, so text inside one (the script) is never searched for the others.
    parts = {
        "{{TITLE}}": html.escape(title),
        "{{ABOUT}}": html.escape(about),
        "{{RATES}}": html.escape(rates),
        "{{CSS}}": css,
        "{{JS}}": js,
        "{{LOG}}": pack_log(log),
    }
    out = []
    rest = template
    while True:
        hits = [(rest.find(key), key) for key in parts if rest.find(key) >= 0]
        if not hits:
            out.append(rest)
            break
        pos, key = min(hits)
        out.append(rest[:pos])
        out.append(parts[key])
        rest = rest[pos + len(key):]
    return "".join(out)


def write_race_html(path: str | Path, config, workload, strategies: list, *, title: str | None = None) -> Path:
    """Race ``strategies`` (names or kvlab.strategies.Strategy) on ``workload`` under ``config`` (a resolved
    KvlabConfig), recording every frame, and write the replay page to ``path``. The same inputs as `kvlab race`
    gives its table, through the same run service, so the page's finish line shows the same numbers. Returns the
    path written."""
    from kvlab import service
    from kvlab.report.setup import model_label, printed_size_text

    _, sims = service.start(config, service.strategies(strategies, config), workload=workload)
    log = record_race(sims)
    # vLLM's printed "GPU KV cache size" beside the token slots, where the two differ: run's setup line's sentence.
    log["meta"]["printed_size"] = printed_size_text(config.sizing, config.cache.num_slots, config.cache.block_size)
    log["meta"]["model"] = model_label(config.model.model, config.sizing)  # (as run's setup line names it)
    names = ", ".join(g["name"] for g in log["meta"]["grids"])
    page = render_page(log, title=title or f"{names} on {log['meta']['workload']}", rates=rates_command(config))
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path

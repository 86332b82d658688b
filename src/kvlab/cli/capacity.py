"""``kvlab capacity``: the highest request rate each configuration sustains under a latency target (SLO).

Every rate tried is a sweep point (kvlab.sweep.capacity: bracketing and bisection), judged on its measured window
(kvlab.window: sustained, stable / backlogged / overloaded) against the SLO (kvlab.sweep.slo: several terms, or
goodput). By default the workload is long enough to load the engine (scaled to its seats) and every built-in
cost profile that applies to the GPU prices it, so the answer shows how far the clock's choice moves it.
"""

from __future__ import annotations

import json
import math
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

import kvlab
from kvlab import defaults
from kvlab.catalog.prices import GpuPrice, price_text
from kvlab.catalog.prices import gpu_hour_price as check_price
from kvlab.cli.app import app
from kvlab.cli.options import (
    EXTRA_HELP,
    SWEEP_CONTEXT,
    GridOpt,
    JsonOpt,
    MaxTimeOpt,
    RayAddressOpt,
    RayOpt,
    WorkersOpt,
)
from kvlab.cli.options import SweepYesOpt as YesOpt
from kvlab.errors import KvlabError
from kvlab.report.setup import evidence, fitted_to, lead_text, pool_utilization_clause, setup_lines
from kvlab.report.tables import bracket_text
from kvlab.report.text import computed_text, dollars, plural, sentence, whole_values_table
from kvlab.sweep.capacity import default_out, rate_text, samples_text
from kvlab.sweep.session import Session, grid_lists, parse_duration, run_session
from kvlab.validate import check_options, note_written
from kvlab.window import WARMUP_SHARE

if TYPE_CHECKING:
    from kvlab.service.capacity import Answer

SloOpt = Annotated[str | None, typer.Option("--slo", help="The latency target: STAT_METRIC<VALUE terms, comma-separated, "
                                               "all of which must hold, e.g. p99_ttft<2s,p99_tpot<100ms,p50_e2e<10s; "
                                               "with --timeout, abandoned<5% bounds the share of clients that gave up "
                                               "\\[default: mean_normalized_latency<0.1s, the vLLM paper's metric].")]
GoodputOpt = Annotated[float | None, typer.Option("--goodput", help="Judge each request against every term (written "
                                                     "without a statistic: ttft<2s,tpot<100ms): a rate holds when at "
                                                     "least this share of requests meets them all (DistServe's goodput).")]
RtolOpt = Annotated[float, typer.Option("--rtol", help="Stop bisecting when the bracket \\[held, failed] is this "
                                        "narrow, relative.")]
MaxRateOpt = Annotated[float, typer.Option("--max-rate", help="Give up doubling above this rate (req/s).")]
PriceOpt = Annotated[float | None, typer.Option("--gpu-hour-price", help="US dollars a GPU-hour, for the cost per "
                                                "million output tokens \\[default: the catalogue's, with its date "
                                                "and source (kvlab.catalog.prices)].")]
CapacityOutOpt = Annotated[Path | None, typer.Option("--out", help="Folder of the search: its DuckDB store "
                                                     "(sweep.duckdb, resumed when present) and plots \\[default: the "
                                                     "user's cache folder, $KVLAB_CACHE_DIR or ~/.cache/kvlab, under "
                                                     "capacity/].")]


# What the searches write beside the store: write_capacity_plots' three, write_replicas_plot's one.
CAPACITY_PLOTS = ("capacity.png", "capacity_latency.png", "capacity.html", "replicas.png")


def _start_rate(lists: dict, explicit: list[dict], max_rate: float) -> float:
    """The search's first rate (--rate, taken out of ``lists``), checked against --max-rate."""
    from kvlab.sweep.grid import run_options

    rates = lists.pop("rate", [str(defaults.CAPACITY_FIRST_RATE)])
    if len(rates) != 1 or any("rate" in p for p in explicit):
        raise KvlabError("kvlab capacity searches the rate: give --rate one value (the first guess), or none")
    start_rate = run_options()["rate"].convert(rates[0])
    if start_rate is None or not start_rate > 0:
        raise KvlabError(f"--rate {rates[0]!r}: the first guess must be a positive rate")
    check_options({"rate": max_rate}, flags={"rate": "--max-rate"})
    if max_rate < start_rate:
        raise KvlabError(f"--max-rate {max_rate:g} is below the first rate tried (--rate {start_rate:g}); valid: "
                         f"--max-rate {start_rate:g} or more")
    return start_rate


@app.command(context_settings=SWEEP_CONTEXT, epilog=EXTRA_HELP + " Here --rate is the search's first guess.")
def capacity(
    ctx: typer.Context,
    slo: SloOpt = None,
    goodput: GoodputOpt = None,
    rtol: RtolOpt = defaults.CAPACITY_RTOL,
    max_rate: MaxRateOpt = defaults.CAPACITY_MAX_RATE,
    grid: GridOpt = None,
    workers: WorkersOpt = None,
    ray: RayOpt = False,
    ray_address: RayAddressOpt = None,
    out: CapacityOutOpt = None,
    max_time: MaxTimeOpt = "1h",
    yes: YesOpt = False,
    as_json: JsonOpt = False,
    gpu_hour_price: PriceOpt = None,
) -> None:
    """The highest request rate each configuration sustains under a latency target.

    A rate holds if its run kept up and met the target in its measured window (after a 20% warm-up; the latencies shown are its).

    Kept up: its waiting queue grew neither in count nor in oldest wait; every request finished (or hit its client's deadline).

    Each answer is searched on two samples (the workload and a longer one: a whole trace, else twice it), shown with their spread.

    Found by bracketing and bisection; every simulation is stored like a sweep's, so a search run again reuses them.

    Without --cost, every built-in cost profile that applies to the GPU prices the search, and the answer shows the spread.

    Without -n or --duration, the workload is scaled to load the engine (twice its seats arrive in the measured window).

    With --replicas auto --rate R: the fewest replicas that sustain R req/s, per --router (default round-robin,least-requests).

    With --replicas auto --prefill-replicas auto --rate R: aggregated or disaggregated (xPyD), whichever holds R on fewer GPUs.
    """
    from kvlab.service import capacity as service
    from kvlab.sweep.grid import run_options
    from kvlab.sweep.point import resolve_points
    from kvlab.sweep.slo import DEFAULT_SLO, parse_slo

    target = parse_slo(slo if slo is not None else DEFAULT_SLO, goodput)
    _check_flags(gpu_hour_price, rtol, max_time)
    out, writes = (default_out(), ()) if out is None else (out, CAPACITY_PLOTS)  # (kvlab's cache: no user's file)
    new_session = partial(Session, out, workers, ray, ray_address, as_json, writes=writes)
    lists, explicit = grid_lists(ctx.args, grid)
    _check_lists(lists)
    _check_deadlines(target, lists, explicit)
    budget = (max_time, yes)  # (--max-time: every mode refuses a search estimated beyond it, unless --yes)
    if lists.get("replicas") == ["auto"] and lists.get("prefill_replicas") == ["auto"]:
        return disagg_command(lists, explicit, target, new_session(), as_json, budget)
    if lists.get("replicas") == ["auto"]:
        lists.pop("replicas")
        replicas_command(lists, explicit, target, new_session(), as_json, budget, gpu_hour_price)
        return
    start_rate = _start_rate(lists, explicit, max_rate)
    configurations, seats, scaled, length_notes = service.searched_configurations(lists, explicit, start_rate)
    first_points = resolve_points([{**c, "rate": start_rate} for c in configurations], kvlab.__version__, unique=False)
    longer, no_second = service.longer_samples(configurations, start_rate)
    session = new_session()
    session.check_ray()
    _check_time(session, first_points, longer, start_rate, max_time, yes)
    session.say_cache_notes(first_points)
    searches, rows = run_session(session, lambda: service.capacities(
        configurations, longer, session.runner, target, start_rate, rtol, max_rate,
        on_round=None if as_json else RoundProgress(session)))
    names = list(run_options())
    answer = service.answer(configurations, longer, no_second, searches, first_points, seats, target, scaled,
                            gpu_hour_price, length_notes)
    written = write_capacity_plots(answer, rows, names, out)
    if as_json:
        typer.echo(json.dumps({"slo": target.text, "goodput": target.goodput, "setup": answer.common_setup(),
                               "capacities": service.capacity_json(answer, names), "spread": answer.spreads(),
                               "lead": {"cost": answer.lead(), "evidence": evidence(answer.lead())},
                               "cheapest": answer.cheapest(), "length_notes": answer.length_notes, **_nothing(answer, rows),
                               "cost_profiles": {n: fitted_to(n) for n in answer.costs()},
                               "num_computed": session.runner.num_computed, "store": str(out / "sweep.duckdb"),
                               "plots": [str(p) for p in written]}, indent=2))
        return
    stated = _stated("gpu_memory_utilization", lists, explicit)
    clauses = {pool_utilization_clause(p.config, stated) for p in first_points}  # (one where every point has it)
    print_capacity(answer, names, session, written, rows, clauses.pop() if len(clauses) == 1 else "")


def _stated(name: str, lists: dict[str, list], explicit: list[dict]) -> bool:
    """Whether option ``name`` was given, on the command line or in --grid."""
    return name in lists or any(name in point for point in explicit)


def _check_flags(gpu_hour_price: float | None, rtol: float, max_time: str) -> None:
    """Each refused in one line before anything runs, whichever search follows (--max-time's spelling; each search
    then estimates its own time against it)."""
    if gpu_hour_price is not None:
        check_price("", gpu_hour_price)  # (a price that is not a positive number)
    if not 0 < rtol < 1:
        raise KvlabError(f"--rtol {rtol:g} is out of range; valid: a relative width in (0, 1), e.g. 0.05")
    parse_duration(max_time)


class RoundProgress:
    """After each round of the searches (kvlab.sweep.capacity.search_capacities), one line on stderr saying how far
    along they are: the round's number, the time so far, and about how many rounds are left (service.capacity.rounds_left)
    with the time they would take at the pace so far. Through the points' bar where one is drawn (a terminal), so the
    line stands above it; never with --json."""

    def __init__(self, session: Session):
        import time

        self.session, self.round, self.started = session, 0, time.monotonic()

    def __call__(self, searches) -> None:
        import time

        from kvlab.service.capacity import rounds_left

        self.round += 1
        elapsed = time.monotonic() - self.started
        left, floor = rounds_left(searches)
        if not left:
            return
        eta = _duration(elapsed / self.round * left)
        more = f"{'at least ' if floor else 'about '}{left} more"
        why = " (a search is still doubling or halving to its bracket)" if floor else ""
        # (no "of ~N": a search still doubling does not know its rounds, and the sum rose as it found its bracket:
        # "round 4 of ~10 ... round 8 of ~14", trial 60, finding 9b)
        self._say(f"capacity search: round {self.round} done in {_duration(elapsed)}; {more} "
                  f"round{'s' if left > 1 else ''}{why}, ~{eta} at this pace")

    def _say(self, line: str) -> None:
        bar = getattr(getattr(self.session, "runner", None), "progress", None)
        console = getattr(getattr(bar, "progress", None), "console", None)
        if console is None:  # (no bar: a log)
            from rich.console import Console

            console = Console(stderr=True)
        # wrapped at the terminal's width (80 columns where there is none: trial 58, finding 8), each further line
        # indented, so that a log still tells the progress lines from others
        import textwrap

        console.print(textwrap.fill(line, max(console.width, 40), subsequent_indent="  "), markup=False,
                      highlight=False, soft_wrap=True)


def _duration(seconds: float) -> str:
    """'45 s', '3 min 20 s', '1 h 05 min'."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _check_time(session: Session, first_points, longer: list[dict], start_rate: float, max_time: str, yes: bool):
    """Refuse (without --yes) searches estimated to take longer than --max-time: each search on its own workload, a
    trace's second sample the whole trace however short the first (trial 53, finding 7)."""
    from kvlab.service import capacity as service
    from kvlab.sweep.point import resolve_points

    longer_points = resolve_points([{**c, "rate": start_rate} for c in longer], kvlab.__version__, unique=False)
    searches = len(first_points) + len(longer_points)
    session.check_time([*first_points, *longer_points], service.TYPICAL_SEARCH_RUNS * searches, max_time, yes,
                       f"{searches} capacity search{'es' if searches > 1 else ''} ({service.searched_what(longer)}; "
                       f"about {service.TYPICAL_SEARCH_RUNS} simulations each)")


def write_capacity_plots(answer: Answer, rows, names, out: Path) -> list[Path]:
    """capacity.png (bars: the strategies side by side, a group per cost profile), capacity_latency.png (the
    target's metric at every rate tried, each answer marked) and capacity.html (both, interactive)."""
    from kvlab.sweep.html import write_html
    from kvlab.sweep.plots import CAPACITY_OPTIONS, capacity_panels, slo_panels, write_png

    subtitle = " · ".join(setup_lines(answer.common_setup(), short=True))
    labels = [_label(c, answer) for c in answer.configurations]
    skip = (*CAPACITY_OPTIONS, *(("num_requests",) if answer.scaled else ()))  # (scaled: not the user's choice)
    bars = capacity_panels(answer.configurations, answer.searches, group_by="cost", skip=skip)
    curves = slo_panels(answer.configurations, answer.searches, labels, answer.slo)
    title = f"Capacity under {answer.slo.describe}"
    png, curves_png, html = (out / name for name in CAPACITY_PLOTS[:3])
    written = [write_png(bars, png, title=title, description=subtitle)]
    sections: list[tuple[str, list, float | None]] = [(title, bars, None)]
    if curves:
        curves_title = "The target's metric at the rates the searches tried"
        written.append(write_png(curves, curves_png, description=subtitle, title=curves_title))
        sections.append((curves_title, curves, None))
    written.append(write_html(html, sections, title="kvlab capacity", subtitle=subtitle))
    note_written(out, written)
    return written


def _check_auto(lists: dict[str, list]) -> None:
    """auto in lower case (AUTO: one line saying so), spaces around it dropped (trial 52 #8: ' auto' was told auto is
    kvlab capacity's, by kvlab capacity); --prefill-replicas / --decode-replicas auto only in the
    aggregated-against-disaggregated comparison."""
    from kvlab.sweep.grid import AUTO_COUNTS
    from kvlab.validate import whole_number_text

    for name in AUTO_COUNTS:
        flag, values = f"--{name.replace('_', '-')}", lists.get(name, [])
        if any(isinstance(v, str) and v.strip() == "auto" != v for v in values):  # (' auto': auto, as ' 16' is 16)
            values = lists[name] = [v.strip() if isinstance(v, str) and v.strip() == "auto" else v for v in values]
        valid = f"valid: {flag} auto (the fewest that sustain --rate R), or a comma list of whole numbers, e.g. 16,32"
        for value in (v.strip() for v in values if isinstance(v, str)):
            if value.lower() == "auto" and value != "auto":
                raise KvlabError(f"{flag} {value!r}: auto is written in lower case; {valid}")
            if value.lower() != "auto" and not whole_number_text(value):
                raise KvlabError(f"{flag} {value!r}: not a whole number; {valid}")
        if "auto" in values and len(values) > 1:
            raise KvlabError(f"{flag} {','.join(map(str, values))}: auto stands alone (it finds the count); {valid}")
    for name in ("prefill_replicas", "decode_replicas"):
        comparing = lists.get("replicas") == ["auto"] and lists.get("prefill_replicas") == ["auto"]
        if "auto" in lists.get(name, []) and not (comparing and lists[name] == ["auto"]):
            raise KvlabError(f"--{name.replace('_', '-')} auto: valid only as --replicas auto --prefill-replicas "
                             "auto --rate R (which of aggregated and disaggregated fleets holds R with fewer GPUs), "
                             "or whole numbers, e.g. --prefill-replicas 1 --decode-replicas 2")
    sides = [f"--{n.replace('_', '-')} {','.join(map(str, lists[n]))}" for n in ("prefill_replicas", "decode_replicas")
             if lists.get(n) and lists[n] != ["auto"]]
    # (--replicas auto beside fixed sides was said as the count auto had reached: trial 59, finding 5)
    if lists.get("replicas") == ["auto"] and lists.get("prefill_replicas") != ["auto"] and sides:
        raise KvlabError(f"--replicas auto with {' '.join(sides)}: a disaggregated fleet counts its replicas by side; "
                         "valid: --replicas auto --prefill-replicas auto --rate R (the fewest GPUs, either kind of "
                         "fleet), or the sides' counts without --replicas")


def _check_lists(lists: dict[str, list]) -> None:
    """The lists' checks before any branch: auto's (_check_auto); --router a,a refused by the rule every other list
    follows (kvlab.sweep.grid.expand: each value once), since the fewest-replicas search takes its routers out of the
    grid before expanding it, and ran a router given twice once without a word (service.replicas.replica_searches)."""
    from kvlab.sweep.grid import expand

    _check_auto(lists)
    if "router" in lists:
        expand({"router": lists["router"]})


def _check_deadlines(target, lists: dict[str, list], explicit: list[dict]) -> None:
    """An ``abandoned<X%`` target with no deadline anywhere in the grid: one line (kvlab.service.classes)."""
    from kvlab.service.classes import check_deadlines
    from kvlab.sweep.grid import expand

    grid = {name: lists[name] for name in ("workload", "timeout") if name in lists}
    check_deadlines([target], expand(grid, [{k: v for k, v in p.items() if k in ("workload", "timeout")}
                                            for p in explicit]))


def _label(config: dict, answer: Answer) -> str:
    """A configuration's name in plots: its strategy, with its cost profile when several are compared, and its
    request count when the user gave several."""
    varied_n = not answer.scaled and len({c.get("num_requests") for c in answer.configurations}) > 1
    return (config["strategy"] + (f" · {config['cost']}" if len(answer.costs()) > 1 else "")
            + (f" · n={config['num_requests']}" if varied_n else ""))


def _floor_percent(share: float) -> str:
    """94.9% as 94%, never 95%: the 95% line is not crossed by rounding."""
    return f"{math.floor(share * 100 + 1e-9):.0f}%"


def _print_footnotes(console, answer: Answer, deadlines: bool) -> None:
    """What the table's columns mean."""
    console.print("run at it: the run at the answer over its measured window (after a 20% warm-up, up to the last "
                  "arrival) and the share of the offered requests it served (read from its oldest wait's growth); "
                  "stable = the waiting queue grows neither in count nor in oldest wait, every request finished or "
                  "was given up at its deadline (docs/sweep.md).", markup=False)
    if answer.no_second is None:
        console.print("capacity: the lower of the two samples' (the workload and a longer one); the run at it, its "
                      "bracket and what limited it are that sample's (the answer below shows both).", markup=False)
    if deadlines:
        console.print("abandoned: the share of the window's requests whose client gave up at its deadline (--timeout) "
                      "in the run at the answer (docs/admission.md).", markup=False)


def _print_uncertified(console, answer: Answer) -> None:
    """Each answer that is not certified, why, and what would certify it."""
    for i, config in enumerate(answer.configurations):
        search = answer.answering(i)
        if search.uncertified:
            advice = "raise --max-rate"  # (else: none failed)
            if search.too_short:  # (on a file with its own arrivals -n is capped at its rows: trial 53, finding 6)
                advice = "raise -n or --duration" if answer.trace_rows[i] is None else "give " + \
                    answer.longer_run_advice(i, search.window_at(search.lo)["num_seats"])
            console.print(f"{search.mark}: {config['strategy']} under {config['cost']}: not certified: "
                          f"{search.uncertified}; {advice}.", markup=False)


def _window_note(answer: Answer, i: int) -> str:
    """Where a latency limit was measured: the failing run's window (kvlab.window), not the whole run (trial 55,
    finding 8: `kvlab run` at the same rate reports every request's latency)."""
    search = answer.answering(i)
    if not (search.limited_by or "").startswith("latency:"):
        return ""
    arrived, total = search.window_at(search.hi).get("num_arrived"), answer.answering_length(i)
    if not arrived:
        return ""
    which = (f"requests {total - arrived + 1:,}..{total:,} by arrival" if total and total >= arrived
             else f"its last {arrived:,} arrivals")
    return (f" (over that run's measured window: {which}, after a {WARMUP_SHARE:.0%} warm-up; "
            "`kvlab run` reports all its requests)")


def print_capacity(answer: Answer, names, session: Session, written, rows: list[dict] | None = None,
                   utilization: str = "") -> None:
    from rich.console import Console

    configurations, searches = answer.configurations, answer.searches
    varying = [n for n in names if n != "rate" and len({repr(c[n]) for c in configurations}) > 1] or ["strategy"]
    table_rows = []
    # (clients with deadlines: the share of the window's requests they gave up at the answer)
    deadlines = any("wasted_tokens" in w for s in searches for w in s.windows)
    for i, config in enumerate(configurations):
        search = answer.answering(i)  # (the sample that gave the answer: the lower of two)
        if search.error:
            cells = ["–", "–", "–", f"failed: {search.error}", str(len(search.probes) + 1)]
        else:
            at = search.window_at(search.lo)
            state = "–" if not at else f"{at['state']} {_floor_percent(at['served_share'])}"
            limit = search.limited_by
            cells = [search.capacity_text, state, "–" if limit is None else limit.split(":")[0],
                     bracket_text(search.lo, search.hi), str(len(search.probes))]
        if deadlines:
            at = search.window_at(search.lo)
            cells.insert(2, f"{at['abandoned_share']:.1%}" if at.get("abandoned_share") is not None else "–")
        table_rows.append([*(f"{config[n]:,}" if isinstance(config[n], int) and not isinstance(config[n], bool)
                             else str(config[n]) for n in varying), *cells])
    bracket = "bracket [held, failed]"
    table = whole_values_table(f"Capacity: the highest rate sustained with {answer.slo.describe} "
                               "(latencies over each run's measured window)",
                                (*varying, "capacity req/s", "run at it", *(("abandoned",) if deadlines else ()),
                                 "limited by", bracket, "sims"),
                                table_rows, left=set(varying),
                                wrapping={bracket} if any(s.error for s in searches) else set())
    console = Console(highlight=False)
    console.print(table)
    _print_footnotes(console, answer, deadlines)
    if answer.scaled:
        console.print("num_requests: scaled so that twice the engine's seats arrive in the measured window (-n or "
                      "--duration to choose).", markup=False)
    for note in answer.length_notes:
        console.print(f"num_requests: {note}.", markup=False)
    _print_uncertified(console, answer)
    for i, config in enumerate(configurations):
        search = answer.answering(i)
        if search.limited_by:
            sample = f" ({answer.answering_sample(i)})" if answer.answering_sample(i) else ""
            console.print(f"limited by: {_who(config, varying)} under {config['cost']}{sample}: {search.limited_by}"
                          f"{_window_note(answer, i)}.", markup=False)
    for i, config in enumerate(configurations):
        search = answer.answering(i)
        if search.unreachable:
            console.print(f"{_who(config, varying)} under {config['cost']}: the target cannot be met at any rate: "
                          f"{search.unreachable}.", markup=False)
    if any(not s.error and s.lo is None and not s.unreachable for s in searches):
        console.print("[–, failed]: even the lowest rate tried failed: capacity 0.", markup=False)
    if (line := _served_nothing_line(answer, rows or [])) is not None:
        console.print(line, markup=False)
    for spread in answer.spreads():
        parts = ", ".join(f"{name} {rate_text(value)}" for name, value in spread["capacities"].items())
        if spread["spread"] is not None:
            console.print(f"The clock's spread for {spread['strategy']}: {parts} req/s ({spread['spread']:.0%} between "
                          "the lowest and the highest).", markup=False)
        if spread["lead_apart"]:
            apart = spread["lead_apart"]
            words = f"{1 / apart:.1f}x below" if apart < 1 else f"{apart:.1f}x above"
            console.print(f"Caution: {answer.lead()} answers {words} every other clock here. Its measured error comes "
                          "from its calibration runs; a workload unlike them (prompt lengths, prefix caching, batch "
                          "sizes) is outside that evidence: check the answer against a measurement (kvlab bench) "
                          "before sizing on it.", markup=False)
    _print_answer(console, answer, varying)
    console.print(sentence("Setup: " + "; ".join(setup_lines(answer.common_setup(), utilization=utilization))),
                  markup=False)
    if len(answer.costs()) > 1:
        for name in answer.costs():
            console.print(sentence(f"  cost profile {fitted_to(name)}"), markup=False)
    num_simulations = sum(len(search.probes) + bool(search.error) for search in (*searches, *answer.second))
    console.print(computed_text(session.runner.num_computed, num_simulations, "simulation")
                  + f". Store: {session.store_path}. Plots: {', '.join(str(p) for p in written)}.", highlight=False)


def _nothing(answer: Answer, rows: list[dict]) -> dict[str, str | None]:
    """capacity --json's "served_nothing": _served_nothing_line, or null."""
    return {"served_nothing": _served_nothing_line(answer, rows)}


def _served_nothing_line(answer: Answer, rows: list[dict]) -> str | None:
    """Where a configuration's lowest rate tried served no request (a KV cache too small for the workload's requests,
    say), what became of them, in `kvlab run`'s words (kvlab.report.tables.served_nothing); None where each served."""
    from kvlab.report.tables import rows_served_nothing, served_nothing

    empty = rows_served_nothing(answer.failed_at_lowest(rows))
    if not empty:
        return None
    return served_nothing(empty, head="even at the lowest rate tried no request was served",
                          measured="their answers of 0 req/s")


def _who(config: dict, varying: list[str]) -> str:
    """A configuration in the lines under the table: its strategy, with the other values the table varies (trial 62,
    finding 5: two routers' lines both read "vllm")."""
    def value(v) -> str:
        return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)

    return config["strategy"] + "".join(f", {name.replace('_', ' ')} {value(config[name])}" for name in varying
                                        if name not in ("strategy", "cost"))


def _print_answer(console, answer: Answer, varying: list[str]) -> None:
    """The lead clock's answers with their two samples, and what each costs."""
    lead = answer.lead()
    several = len(answer.costs()) > 1
    console.print(lead_text(lead, answer.configurations[0]["gpu"], len(answer.costs()))
                  + ("; the other clocks are the spread." if several else "."), markup=False)
    for i, config in enumerate(answer.configurations):
        if config["cost"] != lead or answer.searches[i].error:
            continue
        sample, search = answer.samples(i), answer.answering(i)
        if search.mark == "?":  # (a rate the run could not load the engine at is no answer: trial 47, finding 4)
            at = search.window_at(search.lo)
            words = (f"no answer: the run at {rate_text(sample['answer_rps'])} req/s held {at['num_arrived']:,} "
                     f"requests in its window against {at['num_seats']:,} seats, too few to load the engine, so the "
                     f"rate that holds may be far lower; {answer.longer_run_advice(i, at['num_seats'])} "
                     "puts twice its seats in the window")
        elif sample["spread"] is None and sample.get("note"):
            words = f"{rate_text(sample['answer_rps'])} req/s ({sample['note']})"
        else:
            words = f"{rate_text(sample['answer_rps'])} req/s, the lower of two samples: " + samples_text(
                tuple(sample["lengths"]), tuple(rate_text(c) for c in sample["capacities"]), sample["spread"], "req/s",
                whole_trace=sample["whole_trace"], steady=sample["steady_requests"],
                first_uncertified=sample["first_uncertified"])
        cost = answer.cost_of(i)
        if search.mark == "?":
            console.print(f"  {_who(config, varying)}: {words}.", markup=False)
            continue
        if cost is None:
            money = "no price known for this GPU: give --gpu-hour-price"
        elif cost["usd_per_million_output_tokens"] is None:
            money = f"${cost['usd_per_hour']:,.2f} an hour for nothing served"
        else:
            money = (f"${cost['usd_per_hour']:,.2f} an hour on {cost['num_gpus']} GPU"
                     f"{'s' if cost['num_gpus'] > 1 else ''}, {dollars(cost['usd_per_million_output_tokens'])} per million "
                     f"output tokens (mean answer {cost['mean_output_tokens']:,.0f} tokens)")
        console.print(f"  {_who(config, varying)}: {words}; {money}.", markup=False)
    cheapest = answer.cheapest()
    if cheapest is not None and len(answer.configurations) > len(answer.costs()):
        console.print(f"Cheapest under the target: {_who(cheapest['configuration'], varying)} at "
                      f"{dollars(cheapest['usd_per_million_output_tokens'])} per million output tokens.", markup=False)
    price = next((p for p in answer.prices if p is not None), None)
    if price is not None:
        console.print(f"Price: {price_text(price)}.", markup=False)


# --- --replicas auto --prefill-replicas auto: aggregated against disaggregated (kvlab.service.disagg) -------------

def disagg_command(lists: dict[str, list], explicit: list[dict], slo, session: Session, as_json: bool,
                   budget: tuple[str, bool]) -> None:
    from rich.console import Console

    from kvlab.report.disagg import print_comparison
    from kvlab.service.disagg import TYPICAL_FLEETS, point_from_grid, prepare_comparison, run_comparison
    from kvlab.sweep.point import resolve_points

    def progress(row: dict) -> None:
        print(f"{row['shape']}: " + ("held" if row["held"] else f"did not hold ({row['reason']})"), file=sys.stderr,
              flush=True)

    lists.pop("replicas")
    point, given_length = point_from_grid(lists, explicit)
    comparison, samples = prepare_comparison(point, slo, given_length=given_length)
    session.check_ray()
    session.check_time(resolve_points(samples, kvlab.__version__, unique=False), TYPICAL_FLEETS * len(samples),
                       *budget, f"a comparison of fleets on {plural(len(samples), 'sample')} "
                       f"({' and '.join(f'{n:,}' for n in comparison.sample_lengths)} requests; about "
                       f"{TYPICAL_FLEETS} fleets each, every shape of 1 to 3 replicas)")
    comparison = run_session(session, lambda: run_comparison(comparison, samples, slo, session.runner,
                                                             None if as_json else progress))
    if as_json:
        print(json.dumps({**comparison.to_dict(), "store": session.store_path}, indent=2))
        return
    print_comparison(comparison)
    runner = session.runner
    Console(highlight=False).print(
        f"Each fleet is simulated on one clock, stored in the sweep store ({session.store_path}); "
        + computed_text(runner.num_computed, runner.num_total_before, "simulation") + ".", markup=False)


# --- --replicas auto: the fewest replicas that sustain a rate (kvlab.service.replicas) ------------------------------

def replicas_command(lists: dict[str, list], explicit: list[dict], slo, session: Session, as_json: bool,
                     budget: tuple[str, bool], gpu_hour_price: float | None = None) -> None:
    from kvlab.service import replicas as service
    from kvlab.sweep.point import resolve_points

    rate, searches = service.replica_searches(lists, explicit)
    session.check_ray()
    lengths = sorted({s.num_requests for s in searches if s.factor != 1})  # (the second samples')
    longer = (f"the workload and a longer sample of {', '.join(f'{n:,}' for n in lengths)} requests" if lengths else
              "the workload; no second sample")
    session.check_time(resolve_points([s.count_point(2) for s in searches], kvlab.__version__, unique=False),
                       service.TYPICAL_COUNTS * len(searches), *budget,
                       f"{len(searches)} fewest-replicas search{'es' if len(searches) > 1 else ''} ({longer}; about "
                       f"{service.TYPICAL_COUNTS} counts each)")
    several_costs = len({s.cost for s in searches}) > 1

    def progress(search, n: int, held: bool) -> None:
        name = (f"{search.strategy} behind {search.router}" + (f" under {search.cost}" if several_costs else "")
                + (f" ({search.num_requests:,} requests)" if search.factor != 1 else ""))
        print(f"{name}: {service.replicas_text(n)} {'held' if held else 'failed'}", file=sys.stderr, flush=True)

    run_session(session, lambda: service.search_fewest_replicas(searches, session.runner, slo, progress))
    answer = service.answer(rate, searches, gpu_hour_price)
    written = write_replicas_plot(answer.entries, slo, session.out, answer.setup)
    if as_json:
        typer.echo(json.dumps({"slo": slo.text, "goodput": slo.goodput, "rate": rate, "setup": answer.setup,
                               "fewest_replicas": answer.entries, "spread": answer.spreads,
                               "cost_profiles": {name: fitted_to(name) for name in answer.costs},
                               "plots": [str(p) for p in written]}, indent=2, default=str))
        return
    stated = _stated("gpu_memory_utilization", lists, explicit)
    clauses = {pool_utilization_clause(s.config, stated) for s in searches}  # (one where every search has it)
    print_replicas(answer, slo, session, written, clauses.pop() if len(clauses) == 1 else "")


def _name(e: dict[str, Any], several_costs: bool) -> str:
    return f"{e['strategy']} behind {e['router']}" + (f" under {e['cost']}" if several_costs else "")


def print_replicas(answer, slo, session: Session, written, utilization: str = "") -> None:
    from rich.console import Console

    from kvlab.service.replicas import replicas_text

    entries, costs = answer.entries, answer.costs
    several = len(costs) > 1
    headers = ("strategy", "router", *(("cost profile",) if several else ()), "replicas", "GPUs",
               "counts tried (✓ held, ✗ failed)")
    rows = []
    for e in entries:
        tried = ", ".join(f"{r['replicas']}{'✓' if r['held'] else '✗'}" for r in e["runs"])
        found = _count_text(e)
        rows.append([e["strategy"], e["router"], *((e["cost"],) if several else ()), found,
                     "–" if e["gpus"] is None or e["may_be_too_few"] else str(e["gpus"]), tried])
    table = whole_values_table(f"The fewest replicas that sustain {answer.rate:g} req/s with {slo.describe}", headers,
                               rows, left={"strategy", "router", "cost profile"},
                               wrapping={"counts tried (✓ held, ✗ failed)"})
    console = Console(highlight=False)
    console.print(table)
    for e in entries:
        # (the runs of the sample that answered: named where there were two, as --prefill-replicas auto does)
        sample = f" (on {e['num_requests']:,} requests)" if len(e["samples"]["lengths"]) > 1 else ""
        for r in e["runs"]:
            if not r["held"]:
                console.print(f"  {_name(e, several)}, {replicas_text(r['replicas'])}{sample}: {r['reason']}",
                              markup=False)
    for e in entries:
        console.print(_answer_line(e, several), markup=False)
        console.print(_samples_line(e), markup=False)
    if several:
        answers = ", ".join(f"{e['strategy']} behind {e['router']} {_count_text(e)}"
                            for e in entries if e["cost"] == answer.lead)
        clocks = len({e["cost"] for e in entries})
        console.print(lead_text(answer.lead, answer.gpu, clocks) + f": {answers}"
                      + ("; the other clocks are the spread." if clocks > 1 else "."), markup=False)
    priced = [e for e in entries if e["serving_cost"] and not e["may_be_too_few"]]
    if len(priced) > 1:
        console.print(f"Cheapest under the target: {cheapest_text(priced, answer.lead, several)}.", markup=False)
    if priced:
        c = priced[0]["serving_cost"]
        console.print(f"Price: {price_text(GpuPrice(c['usd_per_gpu_hour'], c['price_as_of'], c['price_source']))}.",
                      markup=False)
    for spread in answer.spreads:
        parts = ", ".join(f"under {cost} {'none' if n is None else n}" for cost, n in spread["replicas"].items())
        console.print(f"The clock's spread for {spread['strategy']} behind {spread['router']}: replicas {parts}.",
                      markup=False)
    if any(e["may_be_too_few"] for e in entries):
        console.print("(?): the run at the answer was too short to load its replicas (fewer requests in its window "
                      "than their seats): more replicas may be needed; raise -n or --duration.", markup=False)
    for line in dict.fromkeys(_memory_line(e["memory"]) for e in entries):
        console.print(line, markup=False)
    console.print(sentence("Setup: " + "; ".join(setup_lines(answer.setup, utilization=utilization))), markup=False)
    if several:
        for name in costs:
            console.print(sentence(f"  cost profile {fitted_to(name)}"), markup=False)
    runner = session.runner  # (its counts are distinct points: one replica is one point for every router)
    console.print("Each replica: the setup above. Each count is simulated as one fleet on one clock, stored in the "
                  f"sweep store ({session.store_path}); " + computed_text(runner.num_computed, runner.num_total_before,
                                                                          "simulation") + ".", markup=False)
    console.print("Plots: " + ", ".join(str(p) for p in written) + ".", markup=False)


def cheapest_text(priced: list[dict[str, Any]], lead: str, several_costs: bool, most: int = 3) -> str:
    """The cheapest of the ``priced`` entries, price by price until ``most`` are named: every entry of a price tied at
    it, the ``lead`` clock's first as the answer leads with them ("6 tied at $6.48/h: vllm behind round-robin under
    vllm-h100, ..."), not the first three of six led by another clock (trial 61, finding 10b)."""
    levels: dict[float, list[str]] = {}
    for e in sorted(priced, key=lambda e: (e["serving_cost"]["usd_per_hour"], e["cost"] != lead)):
        price = round(e["serving_cost"]["usd_per_hour"], 6)
        if price not in levels and sum(map(len, levels.values())) >= most:
            break
        levels.setdefault(price, []).append(_name(e, several_costs))
    return "; ".join(f"{names[0]} ${price:,.2f}/h" if len(names) == 1 else
                     f"{len(names)} tied at ${price:,.2f}/h: {', '.join(names)}" for price, names in levels.items())


def _count_text(e: dict[str, Any]) -> str:
    """A router's answer as the table and the lead line print it: a count held on a run too short to load its replicas
    is no answer, "none (181 ?)", as capacity's rate is."""
    if e["replicas"] is None:
        return "none"
    return f"none ({e['replicas']} ?)" if e["may_be_too_few"] else str(e["replicas"])


def _answer_line(e: dict[str, Any], several_costs: bool) -> str:
    """A router's answer and what limited one replica fewer."""
    name = _name(e, several_costs)
    if e.get("error"):
        return f"{name}: failed at {e['error']}."
    if e["replicas"] is None:
        return f"{name}: no count held; {e['fewer_limited_by']}."
    if e["may_be_too_few"]:
        from kvlab.service.replicas import replicas_text

        return (f"{name}: no answer: {replicas_text(e['replicas'])} held on a run too short to load "
                f"{'it' if e['replicas'] == 1 else 'them'} (?), so more may be needed.")
    head = f"{name}: {e['replicas']} replica{'' if e['replicas'] == 1 else 's'} ({e['gpus']} GPU" \
           f"{'' if e['gpus'] == 1 else 's'})"
    if e["fewer_limited_by"] is None:
        return head + ", the fewest there are."
    kind, _, reason = e["fewer_limited_by"].partition(": ")
    return f"{head}; one fewer was limited by {kind}: {reason}."


def _samples_line(e: dict[str, Any]) -> str:
    """A router's two samples (the workload and a longer one) and what its answer costs."""
    sample = e["samples"]
    counts = ["none" if n is None else str(n) for n in sample["replicas"]]
    if len(counts) == 1:
        text = f"  one sample: on {sample['lengths'][0]:,} requests {counts[0]} ({sample['note']})"
    else:
        text = (f"  two samples: on {sample['lengths'][0]:,} requests {counts[0]}, on {sample['lengths'][1]:,} "
                f"{counts[1]}" + ("" if sample["agree"] else ": they differ, the answer is the larger")
                + (f" ({sample['note']})" if sample["note"] else ""))
    if e["may_be_too_few"]:
        pass  # (no answer: nothing to price)
    elif e["serving_cost"]:
        text += (f"; ${e['serving_cost']['usd_per_hour']:,.2f} an hour, "
                 f"{dollars(e['serving_cost']['usd_per_million_output_tokens'])} per million output tokens")
    elif e["replicas"] is not None:
        text += "; no price known for this GPU: give --gpu-hour-price"
    return text + "."


def _memory_line(memory: dict[str, Any]) -> str:
    """The answer against memory alone: does one replica's TP × PP even hold the model and one full request? With
    `kvlab fit`'s shapes: tensor parallelism alone, and with pipeline stages too where that takes fewer GPUs."""
    has, fewest = memory["gpus_per_replica"], memory["fewest_gpus_per_replica"]
    what = f"{memory['model']}'s weights and one {memory['max_model_len']:,}-token request"
    piped = memory.get("fewest_gpus_pipelined")
    shape = "" if piped is None else (
        f"--tensor-parallel-size {piped['tensor_parallel_size']} --pipeline-parallel-size "
        f"{piped['pipeline_parallel_size']} ({piped['num_gpus']} × {memory['gpu']}, tensor parallelism within "
        f"{piped['node_gpus']} GPUs, a node's usual count)")
    if fewest is None:
        if piped is not None:
            return (f"Memory: tensor parallelism alone holds {what} on no count ({memory['note']}); with pipeline "
                    f"stages too, {shape} hold it (kvlab fit); these replicas have {has}: vLLM would refuse to start "
                    f"them; give {shape.split(' (')[0]} (or a lower --max-model-len).")
        return f"Memory: {memory['note']}: vLLM would refuse to start these replicas."
    if not memory["starts"]:
        alternative = "" if piped is None else f", or, with pipeline stages, {shape}"
        return (f"Memory: one replica needs at least {fewest} × {memory['gpu']} (TP {memory['tensor_parallel_size']}) "
                f"to hold {what} (kvlab fit); these replicas have {has}: vLLM would refuse to start them, so these "
                f"counts are not a fleet it can run; give --tensor-parallel-size {memory['tensor_parallel_size']}"
                f"{alternative} (or a lower --max-model-len).")
    return (f"Memory: each replica's {has} × {memory['gpu']} hold{'s' if has == 1 else ''} {what} (the fewest that "
            f"do: {fewest}, kvlab fit): the counts above are the traffic's and the target's, not memory's.")


def write_replicas_plot(entries, slo, out: Path, setup: dict) -> list[Path]:
    """replicas.png, its description the setup (as kvlab.sweep.plots.write_png writes one)."""
    from kvlab.report.replicas import replicas_figure

    costs = list(dict.fromkeys(e["cost"] for e in entries))
    description = " · ".join(setup_lines(setup, short=True) + ([] if "cost" in setup else
                                                                [f"cost profiles: {', '.join(costs)}"]))
    fig = replicas_figure(entries, slo, description)
    path = out / CAPACITY_PLOTS[3]
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, metadata={"Description": description})
    note_written(out, [path])
    return [path]

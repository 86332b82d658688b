"""``kvlab capacity``: the highest request rate each configuration sustains under a latency target (SLO).

Every rate tried is a sweep point (kvlab.sweep.capacity: bracketing and bisection), judged on its measured window
(kvlab.window: sustained, stable / backlogged / overloaded) against the SLO (kvlab.sweep.slo: several terms, or
goodput). By default the workload is long enough to load the engine (scaled to its seats) and every built-in
cost profile that applies to the GPU prices it, so the answer shows how far the clock's choice moves it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from kvlab.cli.app import app
from kvlab.cli.options import JsonOpt
from kvlab.cli.sweep import (
    EXTRA_HELP,
    SWEEP_CONTEXT,
    GridOpt,
    MaxTimeOpt,
    RayAddressOpt,
    RayOpt,
    Session,
    WorkersOpt,
    YesOpt,
    _computed_text,
    _whole_values_table,
    grid_lists,
    run_session,
)
from kvlab.report.setup import fitted_to, setup_lines
from kvlab.sweep.capacity import mark_text, rate_text

SloOpt = Annotated[str | None, typer.Option("--slo", help="The latency target: STAT_METRIC<VALUE terms, comma-separated, "
                                               "all of which must hold, e.g. p99_ttft<2s,p99_tpot<100ms,p50_e2e<10s "
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
TYPICAL_SEARCH_RUNS = 8  # simulations a search usually takes (bracket + bisection to 5%): for the time estimate
SEATS_FACTOR = 2  # the default workload: this many times the engine's seats arrive in the measured window
MIN_WINDOW_REQUESTS = 10  # fewer in the measured window measure nothing


def window_num_requests(seats: int) -> int:
    """Requests enough that SEATS_FACTOR × ``seats`` arrive in the measured window (kvlab.window: the arrivals after
    its 20% warm-up), in hundreds, at least `kvlab run`'s default."""
    from kvlab.config.options import DEFAULT_NUM_REQUESTS
    from kvlab.window import DRAIN_SHARE, WARMUP_SHARE

    needed = SEATS_FACTOR * seats / (1 - WARMUP_SHARE - DRAIN_SHARE)
    return max(DEFAULT_NUM_REQUESTS, 100 * math.ceil(needed / 100))


def seats_of(point: dict[str, Any], varied: set[str] | None = None) -> int:
    """The seats of a point's engine (kvlab.window.num_seats) on its workload (an error names the point by its
    ``varied`` options, kvlab.sweep.point.resolve_point)."""
    import kvlab
    from kvlab import service
    from kvlab.sweep.point import resolve_point
    from kvlab.window import mean_tokens_held, num_seats

    resolved = resolve_point(point, kvlab.__version__, varied)
    config = resolved.config
    allocator = service.strategies([resolved.strategy], config)[0].allocator
    held = mean_tokens_held(allocator, service.load(config).requests, config.scheduler.max_model_len)
    return num_seats(config.scheduler.max_num_seqs, config.cache.num_slots, held) * config.parallel.data_parallel_size


def _given(name: str, lists: dict, explicit: list[dict]) -> bool:
    return name in lists or any(name in p for p in explicit)


@app.command(context_settings=SWEEP_CONTEXT, epilog=EXTRA_HELP + " Here --rate is the search's first guess.")
def capacity(
    ctx: typer.Context,
    slo: SloOpt = None,
    goodput: GoodputOpt = None,
    rtol: RtolOpt = 0.05,
    max_rate: MaxRateOpt = 1000.0,
    grid: GridOpt = None,
    workers: WorkersOpt = None,
    ray: RayOpt = False,
    ray_address: RayAddressOpt = None,
    out: Annotated[Path | None, typer.Option("--out", help="Folder of the search: its DuckDB store (sweep.duckdb, "
                                             "resumed when present) and plots \\[default: the user's cache folder, "
                                             "$KVLAB_CACHE_DIR or ~/.cache/kvlab, under capacity/].")] = None,
    max_time: MaxTimeOpt = "1h",
    yes: YesOpt = False,
    as_json: JsonOpt = False,
    gpu_hour_price: PriceOpt = None,
) -> None:
    """The highest request rate each configuration sustains under a latency target.

    A rate holds when its run kept up and met the target: its waiting queue grew neither in count nor in oldest wait,
    every request finished, judged up to the last arrival.

    Each answer is searched on two samples (the workload, and twice it) and both are shown with their spread.

    Found by bracketing and bisection; every simulation is stored like a sweep's, so a search run again reuses them.

    Without --cost, every built-in cost profile that applies to the GPU prices the search, and the answer shows the spread.

    Without -n or --duration, the workload is scaled to load the engine (twice its seats arrive in the measured window).

    With --replicas auto --rate R: the fewest replicas that sustain R req/s, per --router (default round-robin,least-requests).
    """
    import kvlab
    from kvlab.catalog.prices import gpu_hour_price as check_price
    from kvlab.errors import KvlabError
    from kvlab.sweep.capacity import default_out
    from kvlab.sweep.grid import run_options
    from kvlab.sweep.point import resolve_points
    from kvlab.sweep.slo import DEFAULT_SLO, parse_slo
    from kvlab.validate import check_options

    target = parse_slo(slo if slo is not None else DEFAULT_SLO, goodput)
    out = out if out is not None else default_out()
    if gpu_hour_price is not None:
        check_price("", gpu_hour_price)  # (a price that is not a positive number: one line, before anything runs)
    if not 0 < rtol < 1:
        raise KvlabError(f"--rtol {rtol:g} is out of range; valid: a relative width in (0, 1), e.g. 0.05")
    lists, explicit = grid_lists(ctx.args, grid)
    if lists.get("replicas") == ["auto"]:
        lists.pop("replicas")
        from kvlab.cli.capacity_fleet import fewest_replicas_command

        fewest_replicas_command(lists, explicit, target, out, as_json, gpu_hour_price)
        return
    rates = lists.pop("rate", ["1"])
    if len(rates) != 1 or any("rate" in p for p in explicit):
        raise KvlabError("kvlab capacity searches the rate: give --rate one value (the first guess), or none")
    start_rate = run_options()["rate"].convert(rates[0])
    if start_rate is None or not start_rate > 0:
        raise KvlabError(f"--rate {rates[0]!r}: the first guess must be a positive rate")
    check_options({"rate": max_rate}, flags={"rate": "--max-rate"})
    if max_rate < start_rate:
        raise KvlabError(f"--max-rate {max_rate:g} is below the first rate tried (--rate {start_rate:g}); valid: "
                         f"--max-rate {start_rate:g} or more")
    configurations, seats, scaled = searched_configurations(lists, explicit, start_rate)
    first_points = resolve_points([{**c, "rate": start_rate} for c in configurations], kvlab.__version__)
    longer, no_second = _longer_samples(configurations, start_rate)
    session = Session(out, workers, ray, ray_address, as_json)
    session.check_ray()
    every = configurations + longer
    session.check_time(first_points, 3 * TYPICAL_SEARCH_RUNS * len(configurations), max_time, yes,
                       f"{len(every)} capacity search{'es' if len(every) > 1 else ''} (the workload and twice it; "
                       f"about {TYPICAL_SEARCH_RUNS} simulations each)")
    searches, rows = run_capacity(session, every, [start_rate] * len(every), target, rtol, max_rate)
    names = list(run_options())
    setups = [{**p.config.describe(), **_engine_setup(p)} for p in first_points]
    unreachable = [s.unreachable for s in searches if s.unreachable]
    if unreachable and len(unreachable) == len(searches):
        raise KvlabError(f"--slo {target.text!r} cannot be met at any rate: {unreachable[0]}; valid: a looser target")
    answer = Answer(configurations, searches[:len(configurations)], setups, seats, target, scaled)
    answer.add_samples(longer, searches[len(configurations):], no_second)
    answer.add_costs([p.config for p in first_points], gpu_hour_price)
    written = write_capacity_plots(answer, rows, names, out)
    if as_json:
        typer.echo(json.dumps({"slo": target.text, "goodput": target.goodput, "setup": answer.common_setup(),
                               "capacities": capacity_json(answer, names), "spread": answer.spreads(),
                               "lead": answer.lead(), "cheapest": answer.cheapest(),
                               "cost_profiles": {n: fitted_to(n) for n in answer.costs()},
                               "num_computed": session.runner.num_computed, "store": str(out / "sweep.duckdb"),
                               "plots": [str(p) for p in written]}, indent=2))
        return
    print_capacity(answer, names, session, written)


def _engine_setup(point) -> dict[str, Any]:
    from kvlab import service
    from kvlab.report.setup import engine_setup

    return engine_setup(point.config, service.strategies([point.strategy], point.config))


def _longer_samples(configurations: list[dict], start_rate: float) -> tuple[list[dict], str | None]:
    """Each configuration over twice its workload (kvlab.sweep.capacity.longer_sample), or none and why (a trace
    with fewer requests than twice the first sample)."""
    import kvlab
    from kvlab.errors import KvlabError
    from kvlab.sweep.capacity import longer_sample
    from kvlab.sweep.point import resolve_points

    longer = [longer_sample(c) for c in configurations]
    try:
        resolve_points([{**c, "rate": start_rate} for c in longer], kvlab.__version__)
    except KvlabError as exc:
        return [], f"no second sample: {exc}"
    return longer, None


def searched_configurations(lists: dict, explicit: list[dict], start_rate: float):
    """The configurations to search (the grid's points without a rate), each cost profile that applies to the GPU
    when --cost is not given, and the workload scaled to each one's seats when neither -n nor --duration is; with
    their seats and whether they were scaled. A window too short to measure at the first rate is refused."""
    from kvlab.sweep.grid import expand
    from kvlab.sweep.point import varied_options

    configurations = expand(lists, explicit)
    varied = varied_options(configurations)  # (in an error: what the user varies, not the profiles added below)
    if not _given("cost", lists, explicit):  # the clock's uncertainty: every profile that applies to the GPU
        from kvlab.catalog import get_gpu
        from kvlab.cost.profiles import applicable_profiles

        configurations = [{**c, "cost": name} for c in configurations
                          for name in applicable_profiles(get_gpu(c["gpu"]).id)]
    scaled = not (_given("num_requests", lists, explicit) or _given("duration", lists, explicit))
    seats = [seats_of({**c, "rate": start_rate}, varied) for c in configurations]
    if scaled:
        configurations = [{**c, "num_requests": window_num_requests(s)} for c, s in zip(configurations, seats)]
    _check_window(configurations, start_rate)
    return configurations, seats, scaled


def _check_window(configurations: list[dict], start_rate: float) -> None:
    """A workload whose measured window would hold fewer than MIN_WINDOW_REQUESTS at the first rate measures
    nothing: refused, naming what would do."""
    from kvlab.errors import KvlabError
    from kvlab.window import DRAIN_SHARE, WARMUP_SHARE

    share = 1 - WARMUP_SHARE - DRAIN_SHARE
    for c in configurations:
        if c.get("duration") is not None:
            expected = c["duration"] * start_rate * share
            if expected < MIN_WINDOW_REQUESTS:
                need = MIN_WINDOW_REQUESTS / share / start_rate
                raise KvlabError(f"--duration {c['duration']:g}: at the first rate ({start_rate:g} req/s) the measured "
                                 f"window (the last {share:.0%} of the arrivals) would hold about "
                                 f"{_requests(expected)}; valid: --duration {math.ceil(need)} or more (or a higher "
                                 "--rate)")
        elif c.get("num_requests") is not None and c["num_requests"] * share < MIN_WINDOW_REQUESTS:
            need = math.ceil(MIN_WINDOW_REQUESTS / share)
            raise KvlabError(f"--num-requests {c['num_requests']}: the measured window (the last {share:.0%} of the "
                             f"arrivals) would hold about {_requests(c['num_requests'] * share)}; valid: -n {need} "
                             "or more")


def _requests(count: float) -> str:
    return f"{count:.0f} request{'' if round(count) == 1 else 's'}"


def run_capacity(session: Session, configurations: list[dict], start_rates: list[float], slo, rtol: float,
                 max_rate: float):
    """The searches and the stored rows of every rate they tried (for the curves), inside the session."""
    import kvlab
    from kvlab.sweep.capacity import search_capacities
    from kvlab.sweep.point import resolve_point

    def work():
        searches = search_capacities(configurations, session.runner, slo, start_rates=start_rates, rtol=rtol,
                                     max_rate=max_rate)
        keys = [resolve_point({**c, "rate": r}, kvlab.__version__).key
                for c, s in zip(configurations, searches) for r, _, _ in s.probes]
        return searches, session.store.rows(keys)

    return run_session(session, work)


class Answer:
    """The searches with what they were searched on: a report's material."""

    SETUP_FIELDS = ("model", "gpu", "num_gpus", "tensor_parallel_size", "pipeline_parallel_size", "replicas",
                    "num_gpu_blocks", "block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                    "enable_chunked_prefill", "cost")

    def __init__(self, configurations, searches, setups, seats, slo, scaled: bool):
        self.configurations, self.searches, self.setups, self.seats = configurations, searches, setups, seats
        self.slo, self.scaled = slo, scaled

    def costs(self) -> list[str]:
        return list(dict.fromkeys(s["cost"] for s in self.setups))

    def add_samples(self, longer: list[dict], searches, no_second: str | None) -> None:
        """The second sample's searches (twice the workload), or why there is none."""
        self.longer, self.second, self.no_second = longer, searches, no_second

    def add_costs(self, configs, gpu_hour_price: float | None) -> None:
        from kvlab import service
        from kvlab.catalog import get_gpu
        from kvlab.catalog.prices import gpu_hour_price as price_of

        self.prices = [price_of(get_gpu(c.device.gpu).id, gpu_hour_price) for c in configs]
        self.num_gpus = [c.parallel.num_gpus for c in configs]
        requests = [service.load(c).requests for c in configs]
        self.mean_outputs = [sum(r.num_output_tokens for r in rs) / max(1, len(rs)) for rs in requests]

    def samples(self, i: int) -> dict[str, Any]:
        """Configuration ``i``'s two samples: their lengths, answers, spread, and the answer (the lower)."""
        from kvlab.sweep.capacity import agree, length_for_spread, sample_spread

        first = self.searches[i].capacity
        length = self.configurations[i].get("num_requests") or 0
        if self.no_second is not None:
            return {"lengths": [length], "capacities": [first], "spread": None, "stable": None,
                    "num_simulations": [len(self.searches[i].probes)],
                    "answer_rps": first, "note": self.no_second}
        second = self.second[i].capacity
        spread = sample_spread(first, second)
        return {"lengths": [length, self.longer[i].get("num_requests") or 0], "capacities": [first, second],
                "spread": spread, "stable": agree(spread),
                "num_simulations": [len(self.searches[i].probes), len(self.second[i].probes)],
                "answer_rps": min(first, second),
                "length_for_stable": length_for_spread(2 * length, spread) if length else None}

    def cost_of(self, i: int) -> dict[str, Any] | None:
        """Dollars per hour and per million output tokens at configuration ``i``'s answer (None: no price)."""
        from kvlab.catalog.prices import serving_cost

        price = self.prices[i]
        if price is None:
            return None
        at = self.samples(i)["answer_rps"]
        return {**serving_cost(price, self.num_gpus[i], at, self.mean_outputs[i]), "rate_rps": at,
                "num_gpus": self.num_gpus[i], "usd_per_gpu_hour": price.usd_per_gpu_hour, "price_as_of": price.as_of,
                "price_source": price.source, "mean_output_tokens": self.mean_outputs[i]}

    def lead(self) -> dict[str, Any]:
        """The clock the answer leads with (the best evidence for the GPU) and what it measured of itself."""
        from kvlab.catalog import get_gpu
        from kvlab.report.setup import evidence, lead_profile

        name = lead_profile(get_gpu(self.configurations[0]["gpu"]).id, self.costs())
        return {"cost": name, "evidence": evidence(name)}

    def cheapest(self) -> dict[str, Any] | None:
        """Under the lead clock, the configuration whose answer costs least per million output tokens."""
        lead = self.lead()["cost"]
        priced = [(c["usd_per_million_output_tokens"], i) for i in range(len(self.configurations))
                  if self.setups[i]["cost"] == lead and (c := self.cost_of(i)) and c["usd_per_million_output_tokens"]]
        if not priced:
            return None
        value, i = min(priced)
        return {"strategy": self.configurations[i]["strategy"], "cost": lead, **(self.cost_of(i) or {})}

    def setup_of(self, i: int) -> dict[str, Any]:
        """Configuration ``i``'s setup: kvlab.config's description, with the workload's length and seats."""
        setup = dict(self.setups[i])
        workload = dict(setup.pop("workload"))
        workload.pop("rate", None)  # searched
        return {**setup, "workload": {**workload, "arrival_rate": "searched", "num_seats": self.seats[i],
                                      "scaled_to_seats": self.scaled}}

    def common_setup(self) -> dict[str, Any]:
        """What every configuration shares (fields that vary are in each capacity's entry)."""
        all_setups = [self.setup_of(i) for i in range(len(self.setups))]
        common = {k: v for k, v in all_setups[0].items() if k != "workload" and all(s.get(k) == v for s in all_setups)}
        workloads = [s["workload"] for s in all_setups]
        common["workload"] = {k: v for k, v in workloads[0].items() if all(w.get(k) == v for w in workloads)}
        common["prefix_caching"] = {k: v for s in all_setups for k, v in s.get("prefix_caching", {}).items()}
        return common

    def spreads(self) -> list[dict[str, Any]]:
        """For each configuration but its cost profile: the capacity under each profile, and their spread."""
        groups: dict[str, list[int]] = {}
        for i, c in enumerate(self.configurations):
            groups.setdefault(json.dumps({k: v for k, v in c.items() if k not in ("cost", "num_requests")},
                                         sort_keys=True, default=str), []).append(i)
        spreads = []
        for indices in groups.values():
            if len(indices) < 2:
                continue
            by_cost = {self.setups[i]["cost"]: self.searches[i].capacity for i in indices}
            values = [v for v in by_cost.values() if v > 0]
            spreads.append({"strategy": self.configurations[indices[0]]["strategy"], "capacities": by_cost,
                            "low": min(values, default=0.0), "high": max(values, default=0.0),
                            "spread": (max(values) / min(values) - 1) if values else None})
        return spreads


def capacity_json(answer: Answer, option_names) -> list[dict]:
    common = answer.common_setup()
    entries = []
    for i, (c, s) in enumerate(zip(answer.configurations, answer.searches)):
        setup = answer.setup_of(i)
        own = {k: v for k, v in setup.items() if k != "workload" and common.get(k) != v}
        own_workload = {k: v for k, v in setup["workload"].items() if common["workload"].get(k) != v}
        entries.append({**{n: c[n] for n in option_names if n != "rate"}, **s.to_json(), "setup": setup,
                        "samples": answer.samples(i), "serving_cost": answer.cost_of(i),
                        "setup_differs": {**own, **({"workload": own_workload} if own_workload else {})}})
    return entries


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
    written = [write_png(bars, out / "capacity.png", title=title, description=subtitle)]
    sections: list[tuple[str, list, float | None]] = [(title, bars, None)]
    if curves:
        curves_title = "The target's metric at the rates the searches tried"
        written.append(write_png(curves, out / "capacity_latency.png", description=subtitle, title=curves_title))
        sections.append((curves_title, curves, None))
    written.append(write_html(out / "capacity.html", sections, title="kvlab capacity", subtitle=subtitle))
    return written


def _label(config: dict, answer: Answer) -> str:
    """A configuration's name in plots: its strategy, with its cost profile when several are compared, and its
    request count when the user gave several."""
    varied_n = not answer.scaled and len({c.get("num_requests") for c in answer.configurations}) > 1
    return (config["strategy"] + (f" · {config['cost']}" if len(answer.costs()) > 1 else "")
            + (f" · n={config['num_requests']}" if varied_n else ""))


def _floor_percent(share: float) -> str:
    """94.9% as 94%, never 95%: the 95% line is not crossed by rounding."""
    return f"{math.floor(share * 100 + 1e-9):.0f}%"


def print_capacity(answer: Answer, names, session: Session, written) -> None:
    from rich.console import Console

    configurations, searches = answer.configurations, answer.searches
    varying = [n for n in names if n != "rate" and len({repr(c[n]) for c in configurations}) > 1] or ["strategy"]
    table_rows = []
    for config, search in zip(configurations, searches):
        if search.error:
            cells = ["–", "–", "–", f"failed: {search.error}", str(len(search.probes) + 1)]
        else:
            hi = "–" if search.hi is None else f"{search.hi:g}"
            lo = "–" if search.lo is None else f"{search.lo:g}"
            at = search.window_at(search.lo)
            state = "–" if not at else f"{at['state']} {_floor_percent(at['served_share'])}"
            shown = mark_text(search.mark, rate_text(search.capacity))
            limit = search.limited_by
            cells = [shown, state, "–" if limit is None else limit.split(":")[0], f"[{lo}, {hi}]",
                     str(len(search.probes))]
        table_rows.append([*(f"{config[n]:,}" if isinstance(config[n], int) and not isinstance(config[n], bool)
                             else str(config[n]) for n in varying), *cells])
    bracket = "bracket [held, failed]"
    table = _whole_values_table(f"Capacity: the highest rate sustained with {answer.slo.describe}",
                                (*varying, "capacity req/s", "run at it", "limited by", bracket, "sims"),
                                table_rows, left=set(varying),
                                wrapping={bracket} if any(s.error for s in searches) else set())
    console = Console(highlight=False)
    console.print(table)
    console.print("run at it: the run at the answer over its measured window (after a 20% warm-up, up to the last "
                  "arrival) and the share of the offered requests it served (read from its oldest wait's growth); "
                  "stable = the waiting queue grows neither in count nor in oldest wait, every request finished "
                  "(docs/sweep.md).", markup=False)
    if answer.scaled:
        console.print("num_requests: scaled so that twice the engine's seats arrive in the measured window (-n or "
                      "--duration to choose).", markup=False)
    for config, search in zip(configurations, searches):
        if search.uncertified:
            advice = "raise -n or --duration" if search.too_short else "raise --max-rate"  # (else: none failed)
            console.print(f"{search.mark}: {config['strategy']} under {config['cost']}: not certified: "
                          f"{search.uncertified}; {advice}.", markup=False)
    for config, search in zip(configurations, searches):
        if search.limited_by:
            console.print(f"limited by: {config['strategy']} under {config['cost']}: {search.limited_by}.",
                          markup=False)
    for config, search in zip(configurations, searches):
        if search.unreachable:
            console.print(f"{config['strategy']} under {config['cost']}: the target cannot be met at any rate: "
                          f"{search.unreachable}.", markup=False)
    if any(not s.error and s.lo is None and not s.unreachable for s in searches):
        console.print("[–, failed]: even the lowest rate tried failed: capacity 0.", markup=False)
    for spread in answer.spreads():
        parts = ", ".join(f"{name} {rate_text(value)}" for name, value in spread["capacities"].items())
        if spread["spread"] is not None:
            console.print(f"The clock's spread for {spread['strategy']}: {parts} req/s ({spread['spread']:.0%} between "
                          "the lowest and the highest).", markup=False)
    _print_answer(console, answer)
    console.print("Setup: " + "; ".join(setup_lines(answer.common_setup())) + ".", markup=False)
    if len(answer.costs()) > 1:
        for name in answer.costs():
            console.print(f"  cost profile {fitted_to(name)}.", markup=False)
    num_simulations = sum(len(search.probes) + bool(search.error) for search in searches)
    console.print(_computed_text(session.runner.num_computed, num_simulations, "simulation")
                  + f". Store: {session.store_path}. Plots: {', '.join(str(p) for p in written)}.", highlight=False)


def _print_answer(console, answer: Answer) -> None:
    """The lead clock's answers with their two samples, and what each costs."""
    from kvlab.catalog.prices import price_text
    from kvlab.sweep.capacity import samples_text

    lead = answer.lead()
    console.print(f"Answer under {lead['cost']}, the clock with the best evidence for this GPU ({lead['evidence']}); "
                  "the other clocks are the spread.", markup=False)
    for i, config in enumerate(answer.configurations):
        if config["cost"] != lead["cost"] or answer.searches[i].error:
            continue
        sample = answer.samples(i)
        if sample["spread"] is None and sample.get("note"):
            words = f"{rate_text(sample['answer_rps'])} req/s ({sample['note']})"
        else:
            words = f"{rate_text(sample['answer_rps'])} req/s, the lower of two samples: " + samples_text(
                tuple(sample["lengths"]), tuple(rate_text(c) for c in sample["capacities"]), sample["spread"], "req/s")
        cost = answer.cost_of(i)
        if cost is None:
            money = "no price known for this GPU: give --gpu-hour-price"
        elif cost["usd_per_million_output_tokens"] is None:
            money = f"${cost['usd_per_hour']:,.2f} an hour for nothing served"
        else:
            money = (f"${cost['usd_per_hour']:,.2f} an hour on {cost['num_gpus']} GPU"
                     f"{'s' if cost['num_gpus'] > 1 else ''}, ${cost['usd_per_million_output_tokens']:,.2f} per million "
                     f"output tokens (mean answer {cost['mean_output_tokens']:,.0f} tokens)")
        console.print(f"  {config['strategy']}: {words}; {money}.", markup=False)
    cheapest = answer.cheapest()
    if cheapest is not None and len(answer.configurations) > len(answer.costs()):
        console.print(f"Cheapest under the target: {cheapest['strategy']} at ${cheapest['usd_per_million_output_tokens']:,.2f} "
                      "per million output tokens.", markup=False)
    price = next((p for p in answer.prices if p is not None), None)
    if price is not None:
        console.print(f"Price: {price_text(price)}.", markup=False)

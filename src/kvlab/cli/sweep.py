"""``kvlab sweep``: many `kvlab run` points at once, stored in DuckDB, on local processes or a Ray cluster, in a
session (kvlab.sweep.session: checks, store, pool, progress, interrupts) that ``kvlab capacity`` shares.

Any `kvlab run` option takes a comma list (``--rate 1,2 --strategy vllm,orca-oracle``); ``--grid FILE`` holds
more (kvlab/sweep/grid.py). Everything is checked before anything runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

import kvlab
from kvlab.cli.app import app
from kvlab.cli.options import (
    DEFAULT_OUT,
    EXTRA_HELP,
    SWEEP_CONTEXT,
    GridOpt,
    JsonOpt,
    MaxTimeOpt,
    OutOpt,
    RayAddressOpt,
    RayOpt,
    RetryOpt,
    WorkersOpt,
)
from kvlab.cli.options import SweepYesOpt as YesOpt
from kvlab.report.setup import engine_defaults_text, error_clause
from kvlab.report.text import computed_text, latency_column, plural, whole_values_table
from kvlab.strategies import parse_strategy
from kvlab.sweep.session import Session, grid_lists, run_session


def point_json(row: dict[str, Any], option_names: list[str]) -> dict[str, Any]:
    summary = json.loads(row["summary"]) if row["summary"] else {}
    summary.pop("name", None)
    return {**{n: row[n] for n in option_names}, "key": row["key"], "status": row["status"], "error": row["error"],
            **summary}


@app.command(context_settings=SWEEP_CONTEXT, epilog=EXTRA_HELP)
def sweep(
    ctx: typer.Context,
    grid: GridOpt = None,
    workers: WorkersOpt = None,
    ray: RayOpt = False,
    ray_address: RayAddressOpt = None,
    out: OutOpt = DEFAULT_OUT,
    max_time: MaxTimeOpt = "1h",
    yes: YesOpt = False,
    retry_failed: RetryOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a grid of `kvlab run` points and store every summary in DuckDB; run again, it resumes.

    Any of `kvlab run`'s options takes a comma list; the grid is every combination."""
    from kvlab.sweep.grid import expand, run_options
    from kvlab.sweep.point import check_workloads, resolve_points, varied_options

    lists, explicit = grid_lists(ctx.args, grid)
    grid_points = expand(lists, explicit)
    points = one_point_each(resolve_points(grid_points, kvlab.__version__, build=False, unique=False), lists)
    session = Session(out, workers, ray, ray_address, as_json, writes=SWEEP_PLOTS)
    session.check_ray()
    stored = set() if retry_failed else session.stored_keys()
    todo = [p for p in points if p.key not in stored]
    session.check_time(todo, len(todo), max_time, yes, f"{len(todo)} of {len(points)} points to compute")
    # (after the time check, which refuses at once; only the points to run: the stored ones were built before)
    check_workloads(todo, varied_options(grid_points), say=lambda line: typer.echo(line, err=True))
    session.say_cache_notes(points)
    rows = run_session(session, lambda: session.runner.run(points))
    names = list(run_options())
    written = write_sweep_plots(rows, names, out)
    if as_json:
        from kvlab.sweep.grid import row_kinds

        typer.echo(json.dumps({"points": [point_json(r, list(row_kinds())) for r in rows], "num_computed":
                               session.runner.num_computed, "store": str(out / "sweep.duckdb")}, indent=2))
        return
    varied = {name for name, values in lists.items() if len(values) > 1} | {n for p in explicit for n in p}
    # (a hybrid model's KV cache groups: kvlab.memory.hybrid simulates no prefix caching, as `kvlab run` says)
    print_sweep(rows, names, session, written, varied, simulated=_simulated(points))


def one_point_each(every, lists: dict[str, list]) -> list:
    """The resolved points, each simulation once; two spellings of one strategy (vllm,vllm+prefix: one key, since
    kvlab.sweep.point.resolve_point keys a point by the strategy's canonical name) refused as any value given twice
    is (kvlab.sweep.grid.expand), where the list asked for two points and got one (trial 59, finding 8); and two names
    of one behaviour (kvlab.strategies.behaviour: vllm-paper, vllm+noprefix, continuous+paged), which asked for two
    simulations with equal results (vllm and continuous+paged differ: vllm caches prefixes). Here only:
    `kvlab capacity --strategy vllm,vllm+prefix` answers each spelling (service.capacity)."""
    from kvlab.errors import KvlabError
    from kvlab.strategies import behaviour

    points: dict[str, Any] = {}
    alike: dict[tuple, Any] = {}  # (what a point simulates, whatever its strategy's name: the same simulation)
    for point in every:
        first = points.setdefault(point.key, point)
        a, b = str(first.options["strategy"]), str(point.options["strategy"])
        given = ",".join(map(str, lists.get("strategy") or [a, b]))
        if a != b:
            raise KvlabError(f"--strategy {given}: {b!r} is the same strategy as {a!r} (both run {point.strategy}: one "
                             "simulation, one point), given twice; valid: each strategy once")
        rest = tuple(sorted((k, repr(v)) for k, v in point.options.items() if k != "strategy"))
        other = alike.setdefault((behaviour(parse_strategy(b)), rest), point)
        if other.key != point.key:  # (vllm-paper, vllm+noprefix and continuous+paged: three names, one behaviour)
            raise KvlabError(f"--strategy {given}: {b!r} simulates what {str(other.options['strategy'])!r} does (same "
                             "batching, memory, preemption and prefix caching: equal results by construction), given "
                             "twice; valid: each strategy once")
    return list(points.values())


SWEEP_PLOTS = ("latency.png", "sweep.html")  # what write_sweep_plots writes beside the store


def write_sweep_plots(rows, names, out: Path) -> list[Path]:
    from kvlab.sweep.html import write_html
    from kvlab.sweep.plots import latency_panels, write_png
    from kvlab.validate import note_written

    panels = latency_panels(rows, names)
    if not panels:
        return []
    title = "Normalized latency against request rate"
    png, html = (out / name for name in SWEEP_PLOTS)
    written = [write_png(panels, png, title=title), write_html(html, [(title, panels, None)], title="kvlab sweep")]
    note_written(out, written)
    return written


def _simulated(points) -> bool | str:
    """How far prefix caching is simulated over a sweep's points (CacheConfig.prefix_caching_simulated): the least."""
    states = {p.config.cache.prefix_caching_simulated for p in points}
    return False if False in states else "own hits" if "own hits" in states else True


def print_sweep(rows, names, session: Session, written: list[Path], varied: set[str] | None = None,
                simulated: bool | str = True) -> None:
    from rich.console import Console

    varying = shown_columns(rows, names, varied)
    failed = any(row["status"] != "ok" for row in rows)  # (a status column only then: the table fits 80 columns)
    table_rows = []
    ttft_unit, ttft = latency_column([r.get("ttft_s_p99") if r["status"] == "ok" else None for r in rows])
    tpot_unit, tpot = latency_column([r.get("tpot_s_p99") if r["status"] == "ok" else None for r in rows])
    for i, row in enumerate(rows):
        ok = row["status"] == "ok"
        cells = [f"{row['throughput_rps']:.3f}", f"{row['throughput_tps']:.0f}",
                 _num(row.get("normalized_latency_s_per_token_mean"), zeros=True), ttft[i], tpot[i]] if ok else ["–"] * 5
        status = ["ok" if ok else f"failed: {row['error']}"] if failed else []
        table_rows.append([*(cell(row[n]) for n in varying), *cells, *status])
    headers = (*varying, "req/s", "tok/s", "s/tok", f"TTFT p99 {ttft_unit}", f"TPOT p99 {tpot_unit}",
               *(["status"] if failed else []))
    table = whole_values_table(f"Sweep: {plural(len(rows), 'point')}", headers, table_rows, left={*varying, "status"},
                                wrapping={"status"})
    console = Console()
    console.print(table)
    console.print("req/s, tok/s: finished requests (output tokens) ÷ the run's makespan, from its start to its last "
                  "finish, ramp and drain included: on a short run below the rate even while the engine keeps up (the "
                  "store's window_served_rps estimates the rate served over the measured window from how fast the "
                  "oldest wait grows, offered × (1 − its growth): an estimate, not a count of finished requests). "
                  "s/tok: mean normalized "
                  "latency (end-to-end seconds per output token); TTFT and TPOT: p99, each column in ms, or in s when "
                  "one of its values is 10 s or more.", highlight=False)
    if (line := falling_behind_text(rows, varying)) is not None:
        console.print(line, highlight=False)
    held = held_text(rows, varying)
    if held:
        console.print(f"Every point: {held}.", highlight=False)
    strategies = [parse_strategy(n) for n in dict.fromkeys(str(r["strategy"]) for r in rows)]
    console.print("Engine: " + engine_defaults_text(rows, strategies, simulated) + ".", highlight=False)
    for profile in dict.fromkeys(str(r["cost"]) for r in rows if r.get("cost")):  # (as capacity states its clocks')
        console.print(f"Cost profile {profile}: {error_clause(profile)}.", highlight=False)
    num_failed = sum(r["status"] != "ok" for r in rows)
    console.print(computed_text(session.runner.num_computed, len(rows), "point")
                  + (f", {num_failed} failed in all" if num_failed else "")
                  + f". Store: {session.store_path} (table points: SQL, docs/sweep.md)."
                  + (f" Plots: {', '.join(str(p) for p in written)}." if written else ""), highlight=False)
    if (line := served_nothing_text(rows)) is not None:
        console.print(line, highlight=False, soft_wrap=True)


def falling_behind_text(rows, varying) -> str | None:
    """The points whose engine fell behind its arrivals (their window's state: kvlab.window), which a req/s column
    does not show (trial 61, finding 4); None where every point kept up."""
    def state(row) -> str | None:  # (the stored summary's measured window)
        return (json.loads(row["summary"]).get("window") or {}).get("state") if row.get("summary") else None

    judged = [row for row in rows if row["status"] == "ok" and state(row) is not None]
    behind = [row for row in judged if state(row) in ("overloaded", "backlogged")]
    if not behind:
        return None
    which = (f"all {len(judged)} points" if len(behind) == len(judged) else
             "; ".join(", ".join(f"{name} {cell(row[name])}" for name in varying) or "the point" for row in behind))
    return (f"Falling behind (the waiting queue grew across the measured window): {which}. Their req/s is what an "
            "engine that cannot keep up serves, not a rate it sustains; kvlab capacity finds that rate.")


def served_nothing_text(rows) -> str | None:
    """The points that served no request (stored, and the sweep exits 0: a result of the grid), how many, and what
    became of their requests by strategy, in the words of `kvlab run`'s "no request was served" line; None if none."""
    from kvlab.report.tables import rows_served_nothing, served_nothing

    empty = rows_served_nothing(rows)
    if not empty:
        return None
    return served_nothing(empty, head=f"{sum(s['num_points'] for s in empty)} of {plural(len(rows), 'point')} served "
                          "no request", measured="their rows")


# What a point is (the options a reader asks for first), as the table's footer names them when all points share them.
HELD_OPTIONS = (("strategy", "{}"), ("model", "{}"), ("gpu", "on {}"), ("tensor_parallel_size", "TP {}"),
                ("cost", "cost {}"), ("workload", "workload {}"), ("num_requests", "{} requests"))


def held_text(rows, varying) -> str:
    """The options of HELD_OPTIONS every row shares and the table does not show ("vllm · opt-13b · on A100-40GB")."""
    parts = []
    for name, form in HELD_OPTIONS:
        values = {repr(r.get(name)) for r in rows}
        if name not in varying and len(values) == 1 and rows[0].get(name) is not None:
            parts.append(form.format(cell(rows[0][name])))
    return " · ".join(parts)


def shown_columns(rows, names, varied=None) -> list[str]:
    """The options whose values differ between the rows, among those the user varied (``varied``; a stored row
    also holds what follows from them, such as the blocks a utilization gives, which the store keeps)."""
    shown = [n for n in names if (varied is None or n in varied) and len({repr(r[n]) for r in rows}) > 1]
    return shown or ["strategy"]


def cell(value) -> str:
    """An option's value in a table: a resolved number in a few digits (6.645, not 6.644978334195912)."""
    from kvlab.report.tables import significant

    if isinstance(value, float) and not value.is_integer():
        return significant(value)
    return str(value)


def _num(value, scale: float = 1.0, zeros: bool = False) -> str:
    from kvlab.report.tables import significant

    return "–" if value is None else significant(value * scale, zeros=zeros)

"""``kvlab capacity --replicas auto``: the fewest replicas (and GPUs: replicas × TP × PP) that sustain an offered
rate under a latency target, per router (kvlab.fleet.fewest_replicas), each count judged as a capacity search
judges a rate: its measured window sustained (kvlab.window) and the SLO met by the window's requests."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

DEFAULT_ROUTERS = ("round-robin", "least-requests")
TRAFFIC_SECONDS = 120  # the default workload: this long of the offered traffic, at least


def fewest_replicas_command(lists: dict[str, list], explicit: list[dict], slo, out: Path, as_json: bool) -> None:
    import sys

    from kvlab import service, window
    from kvlab.config import resolve
    from kvlab.config.options import DEFAULT_NUM_REQUESTS
    from kvlab.errors import KvlabError
    from kvlab.fleet import MAX_REPLICAS, fewest_replicas
    from kvlab.report.setup import fitted_to, setup_lines
    from kvlab.sweep.grid import expand

    rates = lists.get("rate", [])
    if len(rates) != 1:
        raise KvlabError("kvlab capacity --replicas auto finds the fewest replicas for one offered rate: give "
                         "--rate R (req/s, the whole fleet's traffic)")
    routers = lists.pop("router", list(DEFAULT_ROUTERS))
    if any("router" in p or "replicas" in p for p in explicit):
        raise KvlabError("--replicas auto: give the routers on the command line (--router a,b), not in --grid")
    given_length = "num_requests" in lists or "duration" in lists
    searches = []
    for point in expand(lists, explicit):
        options = {k: v for k, v in point.items() if k not in ("strategy", "replicas", "router")}
        if not given_length:
            options["num_requests"] = max(DEFAULT_NUM_REQUESTS, math.ceil(point["rate"] * TRAFFIC_SECONDS))
        for router in routers:
            config = resolve({**options, "router": router, "replicas": 2})  # (a router needs a fleet; N is searched)
            strategy = service.strategies([point["strategy"]], config)[0]
            workload = service.load(config)
            held = window.mean_tokens_held(strategy.allocator, workload.requests, config.scheduler.max_model_len)
            seats = window.num_seats(config.scheduler.max_num_seqs, config.cache.num_slots, held)
            windows: dict[int, dict[str, Any]] = {}
            reasons: dict[int, str] = {}

            def holds(result, seats=seats, windows=windows, reasons=reasons) -> bool:
                records = result.as_result().records
                measured = window.measure(records, seats * result.num_replicas)
                windows[result.num_replicas] = measured.to_dict()
                verdict = slo.judge(measured.to_dict(), window.latencies(records, measured))
                reasons[result.num_replicas] = verdict.reason
                return verdict.held

            def progress(n, result, held, router=router, strategy=strategy) -> None:
                print(f"{strategy.name} behind {router}: {n} replicas {'held' if held else 'failed'}",
                      file=sys.stderr, flush=True)

            search = fewest_replicas(strategy, config.engine, config.router.spec(config.workload.seed), workload,
                                     holds, max_replicas=MAX_REPLICAS, on_run=progress)
            searches.append({"strategy": strategy.name, "router": router, "config": config, "search": search,
                             "windows": windows, "reasons": reasons, "seats": seats})
    entries = [_entry(s, slo) for s in searches]
    setup = searches[0]["config"].describe()
    setup.pop("replicas", None)
    setup.pop("router", None)
    parallel = searches[0]["config"].parallel
    setup["num_gpus"] = parallel.tensor_parallel_size * parallel.pipeline_parallel_size  # (each replica's)
    written = _plot(entries, slo, out, " · ".join(setup_lines(setup, short=True)))
    if as_json:
        typer.echo(json.dumps({"slo": slo.text, "goodput": slo.goodput, "rate": float(rates[0]), "setup": setup,
                               "fewest_replicas": entries, "cost_profile": fitted_to(setup["cost"]),
                               "plots": [str(p) for p in written]}, indent=2, default=str))
        return
    _print(entries, slo, float(rates[0]), setup, written)


def _entry(s: dict[str, Any], slo) -> dict[str, Any]:
    search, config = s["search"], s["config"]
    gpus_each = config.parallel.tensor_parallel_size * config.parallel.pipeline_parallel_size
    runs = []
    for n, ttft_p99, held in search.points():
        w = s["windows"].get(n, {})
        runs.append({"replicas": n, "gpus": n * gpus_each, "held": held, "ttft_p99_s": ttft_p99,
                     "state": w.get("state"), "served_share": w.get("served_share"), "loaded": w.get("loaded"),
                     "reason": s["reasons"].get(n, "")})
    answer = search.num_replicas
    at = s["windows"].get(answer, {}) if answer else {}
    return {"strategy": s["strategy"], "router": s["router"], "replicas": answer,
            "gpus": None if answer is None else answer * gpus_each,
            "may_be_too_few": bool(at) and not at.get("loaded", True), "runs": runs}


def _print(entries, slo, rate: float, setup: dict, written) -> None:
    from rich.console import Console

    from kvlab.cli.sweep import _whole_values_table
    from kvlab.report.setup import setup_lines

    rows = []
    for e in entries:
        tried = ", ".join(f"{r['replicas']}{'✓' if r['held'] else '✗'}" for r in e["runs"])
        answer = "none" if e["replicas"] is None else f"{e['replicas']}" + (" (?)" if e["may_be_too_few"] else "")
        rows.append([e["strategy"], e["router"], answer, "–" if e["gpus"] is None else str(e["gpus"]), tried])
    table = _whole_values_table(f"The fewest replicas that sustain {rate:g} req/s with {slo.describe}",
                                ("strategy", "router", "replicas", "GPUs", "counts tried (✓ held, ✗ failed)"), rows,
                                left={"strategy", "router"}, wrapping={"counts tried (✓ held, ✗ failed)"})
    console = Console(highlight=False)
    console.print(table)
    for e in entries:
        for r in e["runs"]:
            if not r["held"]:
                console.print(f"  {e['strategy']} behind {e['router']}, {r['replicas']} replicas: {r['reason']}",
                              markup=False)
    if any(e["may_be_too_few"] for e in entries):
        console.print("(?): the run at the answer was too short to load its replicas (fewer requests in its window "
                      "than their seats): more replicas may be needed; raise -n or --duration.", markup=False)
    console.print("Setup: " + "; ".join(setup_lines(setup)) + ".", markup=False)
    console.print("Each replica: the setup above. Each count is simulated as one fleet on one clock (not stored in "
                  "the sweep store).", markup=False)
    console.print("Plots: " + ", ".join(str(p) for p in written) + ".", markup=False)


def _plot(entries, slo, out: Path, description: str) -> list[Path]:
    from kvlab.report.plots import LINE_COLOURS
    from kvlab.sweep.plots import Panel, Series, write_png

    series = []
    for i, e in enumerate(entries):
        points = [(r["replicas"], r["ttft_p99_s"]) for r in e["runs"] if r["ttft_p99_s"] is not None]
        series.append(Series(f"{e['strategy']} · {e['router']}", [float(n) for n, _ in points], [v for _, v in points],
                             LINE_COLOURS[i % len(LINE_COLOURS)]))
    ttft = next((t for t in slo.terms if t.metric == "ttft_s"), None)
    marks = {f"{e['strategy']} · {e['router']}": float(e["replicas"]) for e in entries if e["replicas"]}
    panel = Panel(slo.describe, "replicas", "p99 TTFT (s)", series, threshold=None if ttft is None else ttft.limit_s,
                  threshold_label="" if ttft is None else f"target {ttft.limit_s:g} s", marks=marks, ylog=True)
    return [write_png([panel], out / "replicas.png", title="p99 TTFT against the replica count",
                      description=description)]

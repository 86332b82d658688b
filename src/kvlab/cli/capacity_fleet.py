"""``kvlab capacity --replicas auto``: the fewest replicas (and GPUs: replicas × TP × PP) that sustain an offered
rate under a latency target, per router (kvlab.fleet.fewest_replicas), each count judged as a capacity search
judges a rate: its measured window sustained (kvlab.window) and the SLO met by the window's requests.

Without --cost, every built-in cost profile that applies to the GPU prices a search of its own (as plain
``kvlab capacity`` does), and the answer shows their spread. Beside the answer, what memory alone asks of one
replica: the fewest GPUs that hold the model's weights and one max_model_len request (kvlab.sizing.fewest_gpus,
as ``kvlab fit`` answers it)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

DEFAULT_ROUTERS = ("round-robin", "least-requests")
TRAFFIC_SECONDS = 120  # the default workload: this long of the offered traffic, at least


def replicas_text(n: int) -> str:
    """'1 replica', '4 replicas'."""
    return f"{n} replica{'' if n == 1 else 's'}"


def fewest_replicas_command(lists: dict[str, list], explicit: list[dict], slo, out: Path, as_json: bool,
                            gpu_hour_price: float | None = None) -> None:
    from kvlab.errors import KvlabError
    from kvlab.report.setup import fitted_to
    from kvlab.sweep.grid import expand

    rates = lists.get("rate", [])
    if len(rates) != 1:
        raise KvlabError("kvlab capacity --replicas auto finds the fewest replicas for one offered rate: give "
                         "--rate R (req/s, the whole fleet's traffic)")
    routers = lists.pop("router", list(DEFAULT_ROUTERS))
    if any("router" in p or "replicas" in p for p in explicit):
        raise KvlabError("--replicas auto: give the routers on the command line (--router a,b), not in --grid")
    given_length = "num_requests" in lists or "duration" in lists
    points = expand(lists, explicit)
    if not ("cost" in lists or any("cost" in p for p in explicit)):  # the clock's uncertainty, as kvlab capacity's
        from kvlab.catalog import get_gpu
        from kvlab.cost.profiles import applicable_profiles

        points = [{**p, "cost": name} for p in points for name in applicable_profiles(get_gpu(p["gpu"]).id)]
    several = len({p["cost"] for p in points}) > 1
    searches = [_search(point, router, slo, given_length, several_costs=several)
                for point in points for router in routers]
    # The second sample: twice the workload (kvlab.sweep.capacity.longer_sample); the answer is the larger count.
    longer = [_search(point, router, slo, given_length, several_costs=several, factor=2)
              for point in points for router in routers]
    entries = [_with_second(_entry(s), _entry(t), gpu_hour_price, float(rates[0])) for s, t in zip(searches, longer)]
    costs = list(dict.fromkeys(e["cost"] for e in entries))
    from kvlab.report.setup import engine_setup

    setup = {**searches[0]["config"].describe(),
             **engine_setup(searches[0]["config"], [s["strategy_spec"] for s in searches])}
    for key in ("replicas", "router", *(("cost", "cost_source") if len(costs) > 1 else ())):
        setup.pop(key, None)
    parallel = searches[0]["config"].parallel
    setup["num_gpus"] = parallel.tensor_parallel_size * parallel.pipeline_parallel_size  # (each replica's)
    written = _plot(entries, slo, out, setup)
    spreads = _spreads(searches, entries)
    if as_json:
        typer.echo(json.dumps({"slo": slo.text, "goodput": slo.goodput, "rate": float(rates[0]), "setup": setup,
                               "fewest_replicas": entries, "spread": spreads,
                               "cost_profiles": {name: fitted_to(name) for name in costs},
                               "plots": [str(p) for p in written]}, indent=2, default=str))
        return
    _print(entries, spreads, costs, slo, float(rates[0]), setup, written)


def _search(point: dict[str, Any], router: str, slo, given_length: bool, *, several_costs: bool,
            factor: int = 1) -> dict[str, Any]:
    """One search over the replica count: ``point``'s engine behind ``router``, with the runs' windows and
    verdicts by count."""
    import sys

    from kvlab import service, window
    from kvlab.config import resolve
    from kvlab.config.options import DEFAULT_NUM_REQUESTS
    from kvlab.fleet import MAX_REPLICAS, fewest_replicas

    options = {k: v for k, v in point.items() if k not in ("strategy", "replicas", "router")}
    if not given_length:
        options["num_requests"] = max(DEFAULT_NUM_REQUESTS, math.ceil(point["rate"] * TRAFFIC_SECONDS))
    if factor != 1:
        from kvlab.sweep.capacity import longer_sample

        options = longer_sample({**options, "num_requests": options.get("num_requests") or DEFAULT_NUM_REQUESTS})
    config = resolve({**options, "router": router, "replicas": 2})  # (a router needs a fleet; N is searched)
    strategy = service.strategies([point["strategy"]], config)[0]
    workload = service.load(config)
    held = window.mean_tokens_held(strategy.allocator, workload.requests, config.scheduler.max_model_len)
    seats = window.num_seats(config.scheduler.max_num_seqs, config.cache.num_slots, held)
    windows: dict[int, dict[str, Any]] = {}
    reasons: dict[int, str] = {}
    name = (f"{strategy.name} behind {router}" + (f" under {point['cost']}" if several_costs else "")
            + (f" ({len(workload.requests):,} requests)" if factor != 1 else ""))

    def holds(result) -> bool:
        records = result.as_result().records
        measured = window.measure(records, seats * result.num_replicas)
        windows[result.num_replicas] = measured.to_dict()
        verdict = slo.judge(measured.to_dict(), window.latencies(records, measured))
        reasons[result.num_replicas] = verdict.reason
        return verdict.held

    def progress(n, result, held) -> None:
        print(f"{name}: {replicas_text(n)} {'held' if held else 'failed'}", file=sys.stderr, flush=True)

    search = fewest_replicas(strategy, config.engine, config.router.spec(config.workload.seed), workload, holds,
                             max_replicas=MAX_REPLICAS, on_run=progress)
    return {"strategy": strategy.name, "strategy_spec": strategy, "router": router, "cost": point["cost"],
            "point": point, "config": config, "num_requests": len(workload.requests),
            "mean_output_tokens": sum(r.num_output_tokens for r in workload.requests) / max(1, len(workload.requests)),
            "search": search, "windows": windows, "reasons": reasons, "seats": seats}


def _entry(s: dict[str, Any]) -> dict[str, Any]:
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
    return {"strategy": s["strategy"], "router": s["router"], "cost": s["cost"], "replicas": answer,
            "num_requests": s["num_requests"], "mean_output_tokens": s["mean_output_tokens"], "gpus_each": gpus_each,
            "gpu": config.device.gpu,
            "gpus": None if answer is None else answer * gpus_each,
            "may_be_too_few": bool(at) and not at.get("loaded", True),
            "fewer_limited_by": _fewer_limited_by(search, s["reasons"]), "memory": memory_per_replica(config),
            "runs": runs}


def _with_second(first: dict[str, Any], second: dict[str, Any], gpu_hour_price: float | None,
                 rate: float) -> dict[str, Any]:
    """The first sample's entry with the second's answer beside it; the answer is the larger count (None when
    either found none), priced (kvlab.catalog.prices) at the offered rate."""
    from kvlab.catalog import get_gpu
    from kvlab.catalog.prices import gpu_hour_price as price_of
    from kvlab.catalog.prices import serving_cost

    counts = [first["replicas"], second["replicas"]]
    answer = None if None in counts else max(counts)
    # The entry is the sample that gave the answer (its runs, what limited one fewer there); the other beside it.
    chosen, other = (second, first) if counts[0] is not None and answer != counts[0] else (first, second)
    entry = {**chosen, "samples": {"lengths": [first["num_requests"], second["num_requests"]], "replicas": counts,
                                   "agree": counts[0] == counts[1], "answered_by": chosen["num_requests"],
                                   "other_runs": other["runs"]},
             "replicas": answer, "gpus": None if answer is None else answer * first["gpus_each"]}
    price = price_of(get_gpu(first["gpu"]).id, gpu_hour_price)
    entry["serving_cost"] = None if price is None or answer is None else {
        **serving_cost(price, entry["gpus"], rate, first["mean_output_tokens"]), "usd_per_gpu_hour": price.usd_per_gpu_hour,
        "price_as_of": price.as_of, "price_source": price.source}
    return entry


def _fewer_limited_by(search, reasons: dict[int, str]) -> str | None:
    """What failed one replica fewer than the answer (or at the most tried, when none held): "latency: missed
    p99_ttft<2s (2.97 s) with 3 replicas", "throughput: overloaded (...) with 2 replicas" (the words of
    kvlab.sweep.capacity's limited_by). None when the answer is the first count tried."""
    from kvlab.sweep.capacity import LIMITS

    n = search.max_replicas if search.num_replicas is None else search.num_replicas - 1
    if n not in reasons:
        return None
    kind = next((k for word, k in LIMITS.items() if word in reasons[n]), "run")
    return f"{kind}: {reasons[n]} with {replicas_text(n)}"


def memory_per_replica(config) -> dict[str, Any]:
    """What memory alone asks of one replica: the fewest GPUs (on the run's GPU, at its pipeline parallelism) that
    hold the model's weights and one max_model_len request (kvlab.sizing.fewest_gpus, as `kvlab fit` answers
    it), against the run's TP × PP; ``starts`` False: vLLM would refuse to start such a replica."""
    from dataclasses import replace

    from kvlab.catalog import get_gpu, get_model
    from kvlab.errors import KvlabError
    from kvlab.sizing import fewest_gpus, settings_of

    sizing = config.sizing
    gpu = replace(get_gpu(config.device.gpu), memory_bytes=config.device.gpu_memory_bytes)  # (--gpu-memory-gib)
    has = config.parallel.tensor_parallel_size * config.parallel.pipeline_parallel_size
    memory: dict[str, Any] = {"model": sizing.model_id, "gpu": gpu.id, "gpus_per_replica": has,
                              "max_model_len": sizing.max_model_len}
    try:
        tp, _ = fewest_gpus(get_model(config.model.model), gpu, settings_of(sizing))
    except KvlabError as exc:
        return {**memory, "fewest_gpus_per_replica": None, "tensor_parallel_size": None, "starts": False,
                "note": str(exc)}
    fewest = tp * config.parallel.pipeline_parallel_size
    return {**memory, "fewest_gpus_per_replica": fewest, "tensor_parallel_size": tp, "starts": has >= fewest}


def _spreads(searches: list[dict[str, Any]], entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each configuration but its cost profile searched under several: the answer under each profile."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for s, e in zip(searches, entries):
        key = {k: v for k, v in s["point"].items() if k != "cost"}
        groups.setdefault(json.dumps({**key, "router": s["router"]}, sort_keys=True, default=str), []).append(e)
    spreads = []
    for group in groups.values():
        if len(group) < 2:
            continue
        found = [e["replicas"] for e in group if e["replicas"] is not None]
        spreads.append({"strategy": group[0]["strategy"], "router": group[0]["router"],
                        "replicas": {e["cost"]: e["replicas"] for e in group},
                        "gpus": {e["cost"]: e["gpus"] for e in group},
                        "fewest": min(found, default=None), "most": max(found, default=None),
                        "all_found": len(found) == len(group)})
    return spreads


def _name(e: dict[str, Any], several_costs: bool) -> str:
    return f"{e['strategy']} behind {e['router']}" + (f" under {e['cost']}" if several_costs else "")


def _print(entries, spreads, costs: list[str], slo, rate: float, setup: dict, written) -> None:
    from rich.console import Console

    from kvlab.cli.sweep import _whole_values_table
    from kvlab.report.setup import fitted_to, setup_lines

    several = len(costs) > 1
    headers = ("strategy", "router", *(("cost profile",) if several else ()), "replicas", "GPUs",
               "counts tried (✓ held, ✗ failed)")
    rows = []
    for e in entries:
        tried = ", ".join(f"{r['replicas']}{'✓' if r['held'] else '✗'}" for r in e["runs"])
        answer = "none" if e["replicas"] is None else f"{e['replicas']}" + (" (?)" if e["may_be_too_few"] else "")
        rows.append([e["strategy"], e["router"], *((e["cost"],) if several else ()), answer,
                     "–" if e["gpus"] is None else str(e["gpus"]), tried])
    table = _whole_values_table(f"The fewest replicas that sustain {rate:g} req/s with {slo.describe}", headers, rows,
                                left={"strategy", "router", "cost profile"},
                                wrapping={"counts tried (✓ held, ✗ failed)"})
    console = Console(highlight=False)
    console.print(table)
    for e in entries:
        for r in e["runs"]:
            if not r["held"]:
                console.print(f"  {_name(e, several)}, {replicas_text(r['replicas'])}: {r['reason']}", markup=False)
    for e in entries:
        console.print(_answer_line(e, several), markup=False)
        sample = e["samples"]
        counts = ["none" if n is None else str(n) for n in sample["replicas"]]
        console.print(f"  two samples: on {sample['lengths'][0]:,} requests {counts[0]}, on {sample['lengths'][1]:,} "
                      f"{counts[1]}" + ("" if sample["agree"] else ": they differ, the answer is the larger")
                      + (f"; ${e['serving_cost']['usd_per_hour']:,.2f} an hour, "
                         f"${e['serving_cost']['usd_per_million_output_tokens']:,.2f} per million output tokens"
                         if e["serving_cost"] else "; no price known for this GPU: give --gpu-hour-price"
                         if e["replicas"] is not None else "") + ".", markup=False)
    if several:
        from kvlab.catalog import get_gpu
        from kvlab.report.setup import evidence, lead_profile

        lead = lead_profile(get_gpu(entries[0]["gpu"]).id, costs)
        answers = ", ".join(f"{e['strategy']} behind {e['router']} {'none' if e['replicas'] is None else e['replicas']}"
                            for e in entries if e["cost"] == lead)
        console.print(f"Answer under {lead}, the clock with the best evidence for this GPU ({evidence(lead)}): "
                      f"{answers}; the other clocks are the spread.", markup=False)
    priced = sorted((e for e in entries if e["serving_cost"]), key=lambda e: e["serving_cost"]["usd_per_hour"])
    if len(priced) > 1:
        console.print("Cheapest under the target: " + "; ".join(
            f"{_name(e, several)} ${e['serving_cost']['usd_per_hour']:,.2f}/h" for e in priced[:3]) + ".",
            markup=False)
    if priced:
        from kvlab.catalog.prices import GpuPrice, price_text

        c = priced[0]["serving_cost"]
        console.print(f"Price: {price_text(GpuPrice(c['usd_per_gpu_hour'], c['price_as_of'], c['price_source']))}.",
                      markup=False)
    for spread in spreads:
        parts = ", ".join(f"under {cost} {'none' if n is None else n}" for cost, n in spread["replicas"].items())
        console.print(f"The clock's spread for {spread['strategy']} behind {spread['router']}: replicas {parts}.",
                      markup=False)
    if any(e["may_be_too_few"] for e in entries):
        console.print("(?): the run at the answer was too short to load its replicas (fewer requests in its window "
                      "than their seats): more replicas may be needed; raise -n or --duration.", markup=False)
    for line in dict.fromkeys(_memory_line(e["memory"]) for e in entries):
        console.print(line, markup=False)
    console.print("Setup: " + "; ".join(setup_lines(setup)) + ".", markup=False)
    if several:
        for name in costs:
            console.print(f"  cost profile {fitted_to(name)}.", markup=False)
    console.print("Each replica: the setup above. Each count is simulated as one fleet on one clock (not stored in "
                  "the sweep store).", markup=False)
    console.print("Plots: " + ", ".join(str(p) for p in written) + ".", markup=False)


def _answer_line(e: dict[str, Any], several_costs: bool) -> str:
    """A router's answer and what limited one replica fewer."""
    name = _name(e, several_costs)
    if e["replicas"] is None:
        return f"{name}: no count held; {e['fewer_limited_by']}."
    head = f"{name}: {replicas_text(e['replicas'])} ({e['gpus']} GPU{'' if e['gpus'] == 1 else 's'})"
    if e["fewer_limited_by"] is None:
        return head + ", the fewest there are."
    kind, _, reason = e["fewer_limited_by"].partition(": ")
    return f"{head}; one fewer was limited by {kind}: {reason}."


def _memory_line(memory: dict[str, Any]) -> str:
    """The answer against memory alone: does one replica's TP × PP even hold the model and one full request?"""
    has, fewest = memory["gpus_per_replica"], memory["fewest_gpus_per_replica"]
    what = f"{memory['model']}'s weights and one {memory['max_model_len']:,}-token request"
    if fewest is None:
        return f"Memory: {memory['note']}: vLLM would refuse to start these replicas."
    if not memory["starts"]:
        return (f"Memory: one replica needs at least {fewest} × {memory['gpu']} (TP {memory['tensor_parallel_size']}) "
                f"to hold {what} (kvlab fit); these replicas have {has}: vLLM would refuse to start them, so these "
                f"counts are not a fleet it can run; give --tensor-parallel-size {memory['tensor_parallel_size']} "
                "(or a lower --max-model-len).")
    return (f"Memory: each replica's {has} × {memory['gpu']} hold{'s' if has == 1 else ''} {what} (the fewest that "
            f"do: {fewest}, kvlab fit): the counts above are the traffic's and the target's, not memory's.")


def replicas_figure(entries: list[dict[str, Any]], slo, description: str = ""):
    """p99 TTFT against the replica count, one line per search, each answer marked (a matplotlib Figure, the setup
    in ``description`` under its title); the x axis has whole counts only."""
    from matplotlib.ticker import MaxNLocator

    from kvlab.report.plots import LINE_COLOURS
    from kvlab.sweep.plots import Panel, Series, build_figure

    several = len({e["cost"] for e in entries}) > 1

    def label(e: dict[str, Any]) -> str:
        return f"{e['strategy']} · {e['router']}" + (f" · {e['cost']}" if several else "")

    series = []
    for i, e in enumerate(entries):
        points = [(r["replicas"], r["ttft_p99_s"]) for r in e["runs"] if r["ttft_p99_s"] is not None]
        series.append(Series(label(e), [float(n) for n, _ in points], [v for _, v in points],
                             LINE_COLOURS[i % len(LINE_COLOURS)]))
    ttft = next((t for t in slo.terms if t.metric == "ttft_s"), None)
    marks = {label(e): float(e["replicas"]) for e in entries if e["replicas"]}
    panel = Panel(slo.describe, "replicas", "p99 TTFT (s)", series, threshold=None if ttft is None else ttft.limit_s,
                  threshold_label="" if ttft is None else f"target {ttft.limit_s:g} s", marks=marks, ylog=True,
                  mark_name="fewest replicas")
    fig = build_figure([panel], title="p99 TTFT against the replica count", description=description)
    for ax in fig.axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def _plot(entries, slo, out: Path, setup: dict) -> list[Path]:
    """replicas.png, its description the setup (as kvlab.sweep.plots.write_png writes one)."""
    from kvlab.report.setup import setup_lines

    costs = list(dict.fromkeys(e["cost"] for e in entries))
    description = " · ".join(setup_lines(setup, short=True) + ([] if "cost" in setup else
                                                                [f"cost profiles: {', '.join(costs)}"]))
    fig = replicas_figure(entries, slo, description)
    path = out / "replicas.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, metadata={"Description": description})
    return [path]

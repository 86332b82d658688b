"""``kvlab run`` and ``kvlab race``: strategies served on one workload, side by side.

``kvlab race`` with no arguments is kvlab's main job: the lesson's four strategies on the vLLM paper's setup
(OPT-13B on one A100-40GB, the ShareGPT stand-in, Poisson arrivals), in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from kvlab import defaults
from kvlab.cli.app import app
from kvlab.cli.options import ArrivalsOpt, JsonOpt, WideOpt, YesOpt, options_template, with_arrivals, with_options
from kvlab.config.options import RUN_OPTIONS
from kvlab.config.resolve import quietly
from kvlab.errors import KvlabError
from kvlab.report.setup import model_label, pool_utilization_clause, prefix_caching_text, printed_size_text, setup_lines
from kvlab.report.text import plural
from kvlab.service.classes import parse_slo_classes
from kvlab.strategies import STRATEGIES, strategy_names_help
from kvlab.validate import allow_large_work, check_output_path, note_written

OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Write per-request and per-iteration CSV files and "
                                                "PNG plots to this folder.")]
PlotsOpt = Annotated[Optional[bool], typer.Option("--plots/--no-plots", help="With --out: also draw the PNG plots "
                                                  "(--no-plots: CSV and JSON only, faster; without --out nothing is "
                                                  "drawn either way) \\[default: --plots].",
                                                  show_default=False)]


def check_out(out: Path | None, plots: bool) -> None:
    """--out: refused before any work where it would write over a file kvlab did not write (kvlab.validate)."""
    from kvlab.report.plots import RACE_PLOTS
    from kvlab.report.tables import RUN_DATA_FILES

    # (a fleet's replicas and a disaggregated fleet's sides write their own files one folder down)
    check_output_path(out, "--out", folder=True, writes=("summary.json", *(RACE_PLOTS if plots else ()),
                                                         *RUN_DATA_FILES, *(f"*/{name}" for name in RUN_DATA_FILES)))


def check_plots(plots: bool | None, out: Path | None) -> bool:
    """Whether to draw the plots; --plots given without --out (where nothing is written) is refused, and
    --no-plots without it is noted as doing nothing (trial 55, finding 12: it passed silently)."""
    if plots and out is None:
        raise KvlabError("--plots needs --out: the plots are files written to the --out folder; valid: --out FOLDER "
                         "--plots, or leave --plots out")
    if plots is False and out is None:
        from rich.console import Console

        Console(stderr=True, highlight=False).print(
            "note: --no-plots does nothing without --out (plots are drawn only into that folder)", style="yellow")
    return plots is not False


ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="A YAML or TOML file of options (model: ..., "
                                                   "max-num-seqs: ...), as `vllm serve --config`; a flag given on "
                                                   "the command line wins.")]
SloClassesOpt = Annotated[Optional[str], typer.Option("--slo-classes", help="An SLO per class of requests (a class is "
                                                      "a request's priority): CLASS:SLO;... in --slo's spelling, "
                                                      "e.g. '0:p99_ttft<1s;1:p99_e2e<60s' (docs/admission.md).")]


def with_config_file(ctx: typer.Context, path: Path | None, options: dict) -> dict:
    """The command's options with a --config file's values in place of those left at their defaults."""
    if path is None:
        return options
    from kvlab.config.files import read_options, server_only_keys

    from_file = read_options(path)
    if passed := server_only_keys(path):
        from rich.console import Console

        Console(stderr=True, highlight=False).print(
            f"note: --config {path}: {', '.join(passed)} only set vLLM's server (its HTTP side, logs, tokenizer or "
            "loading), not its engine: passed over", style="yellow")
    given = {name for name in options if ctx.get_parameter_source(name).name != "DEFAULT"}
    return {**options, **{name: value for name, value in from_file.items() if name not in given}}


def _stated(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` was given on the command line, at any value (a --config file's other than the default
    is in the configuration's ``given``)."""
    return ctx.get_parameter_source(name).name != "DEFAULT"


# `kvlab run` and `kvlab race` take every option of a run (kvlab/config/options.py), declared there once.
sim_option_template = options_template(RUN_OPTIONS)
SIM_OPTIONS = RUN_OPTIONS


def simulate(strategy_names: list[str], *, quiet: bool = False, slos=None, arrivals: str | None = None, **options):
    """Resolve the options, then run each strategy on the same workload through the run service; returns the
    RunResult. Every option is checked, and the work estimated, before anything is built; the notes (options
    unused, what vLLM would refuse) are printed first. ``arrivals``: --arrivals (cli.options.with_arrivals)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kvlab import service

    config = with_arrivals(quietly(options), arrivals)  # (the report prints the cost profile's notes)
    chosen = service.strategies(strategy_names, config)
    service.check_work(config, len(chosen))
    if slos:  # (--slo-classes: each class one of the workload's, checked before anything runs)
        from kvlab.service.classes import check_classes, check_deadlines, declared_classes, known_classes

        check_classes(slos, known_classes(config), declared_classes(config))
        check_deadlines(slos.values(), [{"workload": config.workload.workload, "timeout": config.workload.timeout}])
    console = Console(stderr=True)
    for note in service.notes(config, chosen):
        console.print(f"note: {note}", style="yellow", highlight=False)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=quiet or not console.is_terminal) as progress:
        tasks: dict[str, object] = {}

        def advance(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = progress.add_task(f"{name:<18}", total=total)
            progress.update(tasks[name], completed=done)  # type: ignore[arg-type]

        return service.run(config, chosen, progress=advance)


def setup_line(config, wl, replicas: int = 1, router: str = "", strategies=(), setup: dict | None = None,
               rescaled_to: float | None = None, sizing=None, utilization: str = "") -> str:
    """The run's setup in one paragraph; ``setup`` (KvlabConfig.describe()) adds a CPU tier and speculative decoding
    in setup_lines' words, when the run has them; ``rescaled_to``: the --rate a trace's own arrivals were rescaled
    to (over the whole trace, so that a sample's rate differs: trial 53, finding 9); ``sizing`` (the run's
    SizingResult) relates its token slots to vLLM's printed "GPU KV cache size" where they differ
    (printed_size_text); ``utilization``: the pool's utilization against the version's default
    (pool_utilization_clause), said in its parentheses."""
    cache, sched = config.cache, config.scheduler
    extras = setup_lines({k: v for k, v in (setup or {}).items() if k in ("cpu_tier", "speculative")})
    fleet = f"{replicas} replicas behind the {router} router, each " if replicas > 1 else ""
    caching = {s.name: s.enable_prefix_caching for s in strategies}
    prefix = f", {prefix_caching_text(caching, cache.prefix_caching_simulated)}" if strategies else ""
    printed = printed_size_text(sizing, cache.num_slots, cache.block_size)
    model = model_label(config.model.model, sizing)
    return (
        f"{fleet}{model} on {config.gpu}: KV cache {_slots_text(cache, strategies, utilization)}, max_model_len "
        f"{sched.max_model_len:,}, max_num_seqs {sched.max_num_seqs:,}, max_num_batched_tokens "
        f"{sched.max_num_batched_tokens:,}, chunked prefill {'on' if sched.enable_chunked_prefill else 'off'}{prefix}. "
        f"Workload: {wl.name}, {plural(wl.num_requests, 'request')}, "
        f"{_rate_text(wl, rescaled_to)}, mean prompt {wl.mean_prompt_len:,.0f} / output {wl.mean_output_len:,.0f} tokens."
        + "".join(f" {line[0].upper()}{line[1:]}." for line in extras)
        + (f" {printed}." if printed else "")
    )


def _slots_text(cache, strategies, utilization: str = "") -> str:
    """The pool in a run's setup line: the strategies' one, or each by prefix caching where theirs differ (a hybrid
    whose groups are pooled: CacheConfig.prefix_caching_slots, KvlabConfig.for_strategy); ``utilization`` added in
    its parentheses."""
    slots, size = cache.prefix_caching_slots, cache.block_size
    extra = f"; {utilization}" if utilization else ""
    used = sorted({slots[s.enable_prefix_caching] for s in strategies}) if slots else []
    if len(used) == 2:
        off, on = slots
        return (f"{on:,} token slots with prefix caching, {off:,} without ({on // size:,} and {off // size:,} blocks "
                f"of {size}, one of them vLLM's null block for paged memory{extra})")
    num_slots = used[0] if used else cache.num_slots
    return (f"{num_slots:,} token slots ({num_slots // size:,} blocks of {size}, one of them vLLM's null block for "
            f"paged memory{extra})")


def _rate_text(wl, rescaled_to: float | None = None) -> str:
    from kvlab.report.tables import significant, workload_rate

    rate = workload_rate(wl)
    if wl.num_requests == 1:
        return f"arriving at {significant(wl.duration)} s (one arrival, no rate)"
    if rate is None:
        return "all arriving at once"
    said = f"arriving at {significant(rate)} req/s on average"
    if rescaled_to is not None:
        said += (f" (the trace's own arrivals, rescaled so that the whole trace averages --rate {rescaled_to:g}; "
                 f"these {wl.num_requests:,} arrive at their own pace within it)")
    return said


def rescaled_rate(workload) -> float | None:
    """The --rate a run's trace keeps its own arrivals under, rescaled (None: arrivals drawn at the rate, or the
    trace's own unscaled): resolve_workload leaves "auto" only on a source with arrival times."""
    return workload.rate if workload.arrival in ("auto", "trace") else None


def typical_iteration(config, summary: dict) -> dict:
    """The cost model's terms for an iteration of this run's mean batch over its mean KV context (a decode
    iteration: one new token per request): what an iteration's time is made of, in ms."""
    num_seqs = summary["mean_batch_size"]
    context = summary["memory_shares"]["token"] / 100 * config.cache.num_slots
    terms = config.cost.terms(round(num_seqs), 0, round(num_seqs), round(context), round(context))
    return {"num_seqs": num_seqs, "num_context_tokens": context, "weights_ms": 1e3 * terms.weights,
            "kv_ms": 1e3 * terms.kv, "compute_ms": 1e3 * terms.compute, "overhead_ms": 1e3 * terms.overhead,
            "seqs_ms": 1e3 * terms.seqs, "prefill_ms": 1e3 * terms.prefill,
            "total_ms": 1e3 * terms.total, "bound": terms.bound, "cost_profile": config.cost.profile}


def report(run, *, as_json: bool, out: Path | None, title: str, wide: bool = False, plots: bool = True, slos=None,
           utilization_stated: bool = False) -> list[dict]:
    """A RunResult (kvlab.service) as a table, a verdict and an explanation, or as JSON; with ``out``, files. Returns
    each strategy's summary. ``utilization_stated``: --gpu-memory-utilization given (setup_line's ``utilization``)."""
    from rich.console import Console

    from kvlab.report.tables import footnotes, race_table, verdict
    from kvlab.service.classes import run_classes

    config, wl, results = run.config.engine, run.workload, run.results
    setup = run.config.describe()
    summaries = run.summaries()
    band = _error_band(config.cost)
    for summary, result in zip(summaries, results):
        summary["typical_iteration"] = typical_iteration(run.config.for_strategy(result.strategy).engine, summary)
        if band is not None:  # (each latency and the throughput: where the real engine would be, docs/cost.md)
            summary["error_band"] = band.intervals(summary)
    for summary, classes in zip(summaries, run_classes(run, slos or {}) or ()):
        summary["classes"] = classes
    written: list[Path] = []
    if out is not None:
        from kvlab.report.tables import write_run_data

        out.mkdir(parents=True, exist_ok=True)
        for result in results:
            written += write_run_data(result, out)
        for fleet in run.fleets:  # (each replica's own files, its iteration log among them)
            for j, replica in enumerate(fleet.replicas):
                written += write_run_data(replica, out / f"replica{j}")
        for disaggregated in run.disaggregated:  # (each side's replicas, as a fleet's)
            for side, replicas in (("prefill", disaggregated.prefill), ("decode", disaggregated.decode)):
                for j, replica in enumerate(replicas):
                    written += write_run_data(replica, out / f"{side}{j}")
        if plots and not run.fleets and not run.disaggregated:  # (the race's plots read one engine's iteration log)
            from kvlab.report.plots import plot_race

            written += plot_race(results, out)
        summary_path = out / "summary.json"
        summary_path.write_text(json.dumps(race_json(config, wl, summaries, setup), indent=2))
        written.append(summary_path)
        note_written(out, written)
    if as_json:
        if wide:  # (trial 58, finding 16: ignored silently)
            Console(stderr=True, highlight=False).print("note: --wide is not used with --json: the JSON holds every "
                                                        "column", style="yellow")
        typer.echo(json.dumps(race_json(config, wl, summaries, setup), indent=2))
        return summaries
    console = Console(highlight=False)
    if not console.is_terminal and wide:
        console.width = max(console.width, 150)  # piped --wide output: room for the whole table
    behaviours = [r.strategy for r in results]
    utilization = pool_utilization_clause(run.config, utilization_stated)  # (finding 8 of trial 61)
    console.print(setup_line(config, wl, run.config.parallel.data_parallel_size, setup.get("router", ""), behaviours,
                             setup, rescaled_rate(run.config.workload), run.config.sizing, utilization))
    console.print(race_table(summaries, title, wide=wide, strategies=behaviours, width=console.width))
    for line in footnotes(summaries, wide=wide, hybrid=bool(config.cache.kv_cache_groups)):
        console.print(line)
    console.print(verdict(summaries, strategies=behaviours))
    if (line := _all_overloaded(run, summaries)) is not None:
        console.print(line, highlight=False)
    _print_parts(console, run, summaries)
    best = max(summaries, key=lambda s: s["throughput_rps"])
    t = best["typical_iteration"]
    if t["num_seqs"] > 0:  # (nothing to explain when every request was rejected)
        _print_typical_iteration(console, config, best["name"], t)
        if band is not None and best["num_finished"]:
            console.print(band_line(band, best, run.overloaded()[1][summaries.index(best)]), highlight=False)
    else:  # (the clause the typical iteration carries, said on its own)
        console.print(f"Cost profile {config.cost.profile!r}{_measured_error(config.cost)}.", highlight=False)
    for note in config.cost.notes:
        console.print(f"warning: {note}", style="yellow", highlight=False)
    if written:
        console.print(f"Wrote {len(written)} files to {out}/: " + ", ".join(p.name for p in written))
    return summaries


def _print_parts(console, run, summaries) -> None:
    """What the run's parts did, where it has them: the fleet's router and replicas, the disaggregated sides, the
    gateway and classes, the CPU tier."""
    from kvlab.report.classes import print_admission
    from kvlab.report.offload import cpu_tier_line

    if run.fleets:
        print_fleets(console, run, summaries)
    for summary in summaries if run.disaggregated else ():
        print_disaggregation(console, summary)
    print_admission(console, summaries)
    for line in filter(None, map(cpu_tier_line, summaries)):  # (trial 62, finding 8: said in --json only before)
        console.print(line, highlight=False)


def band_line(band, summary: dict, overloaded: bool) -> str:
    """Where the real engine's figures would be (the profile's leave-one-out band, kvlab.cost.band): TTFT and
    latency always; the req/s range only for an overloaded strategy, whose req/s is what it served busy (its start
    and drain included): one that keeps up serves what arrives, and a range around it read as a capacity (trial 58,
    finding 12)."""
    from kvlab.report.tables import significant

    def span(lo: float, hi: float, scale: float, unit: str) -> str:
        top = "no upper bound" if hi == float("inf") else significant(hi * scale)
        return f"{significant(lo * scale)}–{top} {unit}"

    ttft = span(*band.around(summary["ttft_s"]["p50"], "ttft_mean"), 1e3, "ms")
    latency = span(*band.around(summary["normalized_latency_s_per_token"]["p50"], "itl_mean"), 1e3, "ms/tok")
    rate = (f"; overloaded, it served {span(*band.rate(summary['throughput_rps']), 1, 'req/s')} over this run" if overloaded
            else "; no req/s range: one holds only for an overloaded engine (below its capacity it serves what "
            "arrives; kvlab capacity finds the capacity)")
    return (f"{summary['name']}, where the real engine would be ({band.covers}, profile {band.profile}): TTFT p50 "
            f"{ttft}, lat. p50 {latency}{rate}.")


def exit_if_nothing_served(summaries: list[dict]) -> None:
    """Exit status 1, after the report, where no strategy served any request: a script can tell from the status."""
    from kvlab.report.tables import served_nothing  # (kvlab.report.tables: `kvlab sweep` says it of its points too)

    if (line := served_nothing(summaries)) is not None:
        from rich.console import Console
        from rich.markup import escape

        # (as kvlab.cli's one red line for a refusal; a reason may hold brackets, which are not markup)
        Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {escape(line)}", soft_wrap=True)
        raise typer.Exit(1)


def _all_overloaded(run, summaries) -> str | None:
    """Each strategy whose waiting queue grows at the offered rate (kvlab.service.RunResult.overloaded), said with
    the rate it served over the run (its start and drain included, when it was not full: below what it sustains
    full, and closer to it the longer the run; trial 62, finding 1): every strategy in one paragraph, or each
    overloaded one in run's words beside those that keep up (trial 58, finding 4); a gateway that admits less than
    is offered said to be where the queue grows (trial 62, finding 2)."""
    from kvlab.report.tables import significant
    from kvlab.window import MIN_WINDOW_REQUESTS

    offered, each = run.overloaded()
    if offered is None or not any(each):
        if (short := run.too_short_to_judge()) is None:
            return None
        w, needed = short
        return (f"Too short to judge whether it keeps up: the measured window (after the first 20% of arrivals) held "
                f"{w.num_arrived:,} arrivals, fewer than the {MIN_WINDOW_REQUESTS} a window needs to measure a "
                f"queue; -n {needed:,} puts twice the engine's seats ({w.num_seats:,}) in the window.")
    gateway = run.config.admission if run.config.admission is not None and run.config.admission.rate < offered else None
    if len(summaries) == 1:  # (kvlab run: one engine, no race)
        return overloaded_text(summaries[0], offered, gateway)
    if all(each):
        listed = ", ".join(f"{s['name']} {significant(s['throughput_rps'])}" for s in summaries)
        return (f"Every strategy is overloaded at the offered rate ({significant(offered)} req/s {_WINDOW}; its "
                f"waiting queue grows{_gateway_text(gateway)}): this race compares engines falling behind. "
                f"Each served, over the whole run ({_SERVED}): {listed} req/s; kvlab capacity finds the rate each "
                "sustains under a latency target.")
    behind = [s for s, over in zip(summaries, each) if over]
    # (one that served nothing does not keep up: the verdict says it served nothing; trial 59, finding 1)
    keeping = ", ".join(s["name"] for s, over in zip(summaries, each) if not over and s["num_finished"])
    if not keeping:
        return " ".join(overloaded_text(s, offered, gateway) for s in behind)
    return " ".join(overloaded_text(s, offered, gateway) for s in behind) + (
        f" {keeping} {'keeps' if ',' not in keeping else 'keep'} up: {'its' if ',' not in keeping else 'their'} req/s "
        "is what arrived, capped by the arrivals, so a ratio against an overloaded strategy compares an engine "
        "keeping up with one falling behind, not their capacities.")


_WINDOW = "over the measured window, after the first 20% of arrivals"
_SERVED = "its start and drain included, when it was not full: below what it sustains full"


def _gateway_text(gateway) -> str:
    """Where the queue grows when a gateway admits less than is offered: at the gateway, whatever the engine serves."""
    from kvlab.report.tables import significant

    if gateway is None:
        return ""
    return (f" at the gateway, which admits at most {significant(gateway.rate)} req/s (--rate-limit), whatever the "
            "engine's capacity: a run without --rate-limit shows the engine's")


def overloaded_text(summary: dict, offered: float, gateway=None) -> str:
    """One overloaded strategy in words (kvlab run's sentence; a race says it of each that is); ``gateway``: the
    run's AdmissionSpec where it admits less than is offered."""
    from kvlab.report.tables import significant

    served = _SERVED if gateway is None else f"at most the gateway's {significant(gateway.rate)}; its start and drain included"
    return (f"{summary['name']} is overloaded at the offered rate ({significant(offered)} req/s {_WINDOW}; its "
            f"waiting queue grows{_gateway_text(gateway)}): it served {significant(summary['throughput_rps'])} req/s "
            f"over the whole run ({served}); kvlab capacity finds the rate it sustains under a latency target.")


def _reasons_text(reasons: dict[str, int]) -> str:
    """The router's reasons with their counts, most first ("300 no prefix cached: fewest requests": a prefix router
    on a workload that shares no prefix routes by load, which its hit rate of 0% alone did not say: trial 62, 9a)."""
    return ", ".join(f"{n:,} {reason}" for reason, n in sorted(reasons.items(), key=lambda item: -item[1]))


def print_fleets(console, run, summaries) -> None:
    """Each strategy's fleet: the router's work (imbalance, prefix hits, where requests went) and, for one or two
    strategies, each replica's numbers."""
    from rich import box
    from rich.table import Table

    from kvlab.report.text import same_decimals

    def ms(values) -> list[str]:
        return same_decimals([None if v is None else 1e3 * v for v in values])

    for summary in summaries:
        f = summary["fleet"]
        hit = "–" if f["prefix_hit_rate"] is None else f"{100 * f['prefix_hit_rate']:.1f}%"
        imbalance = "–" if f["load_imbalance"] is None else f"{f['load_imbalance']:.2f}"
        console.print(f"{summary['name']}: {f['num_replicas']} replicas behind {f['router']}: load imbalance "
                      f"{imbalance} (max over mean of each replica's served tokens), prefix hit rate {hit}; "
                      f"requests routed per replica: {', '.join(f'{n:,}' for n in f['decisions']['per_replica'])}; "
                      f"why: {_reasons_text(f['decisions']['reasons'])}.")
        if len(run.fleets) > 2:
            continue
        table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False)
        for column in ("replica", "routed", "req/s", "TTFT p99 ms", "TPOT p50 ms", "pre-empt.", "prefix hits"):
            table.add_column(column, justify="right")
        replicas = f["replicas"]  # (each number column with one number of decimals: trial 61, finding 10d)
        rates = same_decimals([r["throughput_rps"] for r in replicas])
        ttfts, tpots = ms([r["ttft_s"]["p99"] for r in replicas]), ms([r["tpot_s"]["p50"] for r in replicas])
        for r, rate, ttft, tpot in zip(replicas, rates, ttfts, tpots):
            table.add_row(str(r["replica"]), f"{r['num_routed']:,}", rate, ttft, tpot, f"{r['preemptions']:,}",
                          "–" if r["prefix_hit_rate"] is None else f"{100 * r['prefix_hit_rate']:.1f}%")
        console.print(table)


def print_disaggregation(console, summary: dict) -> None:
    """A disaggregated fleet's link and what its clients' first tokens waited for (kvlab.disagg.result)."""
    from kvlab.report.tables import significant

    d = summary["disaggregation"]
    parts = {k: "–" if v is None else f"{significant(1e3 * v)} ms" for k, v in d["ttft_parts_s"].items()}
    from kvlab.report.text import plural

    link = "the given link (--kv-transfer-bandwidth)" if d["link"] == "given" else d["link"]
    console.print(f"{summary['name']}: {d['shape']} ({plural(d['num_prefill_replicas'], 'prefill replica')}, "
                  f"{plural(d['num_decode_replicas'], 'decode replica')}), KV over {link} at "
                  f"{d['link_bandwidth_gb_s']:g} GB/s after "
                  f"{1e3 * d['link_latency_s']:g} ms: {d['num_transfers']:,} transfers, "
                  f"{d['transfer_bytes'] / 1e9:,.2f} GB. Mean TTFT = prefill {parts['prefill']} + transfer "
                  f"{parts['transfer']} + decode side {parts['decode']}"
                  + (f" + the cost profile's request latency and admission lag {parts['outside_engine']}"
                     if d["ttft_parts_s"]["outside_engine"] else "")
                  + ("" if summary["ttft_s"]["mean"] is None else f" = {significant(1e3 * summary['ttft_s']['mean'])} ms")
                  + ".", highlight=False)


def _print_typical_iteration(console, config, name: str, t: dict) -> None:
    console.print(
        f"A typical iteration of {name} ({plural(round(t['num_seqs']), 'request')} over {t['num_context_tokens']:,.0f} "
        f"tokens of KV): reading the weights {t['weights_ms']:.1f} ms + reading the KV {t['kv_ms']:.1f} ms against "
        f"computing {t['compute_ms']:.1f} ms ({t['bound']}-bound), + {t['overhead_ms']:.1f} ms overhead"
        + (f" + {t['seqs_ms']:.1f} ms per-sequence overhead" if t["seqs_ms"] else "")
        + f" = {t['total_ms']:.1f} ms, under cost profile {config.cost.profile!r} (kvlab cost; docs/cost.md)"
        + _measured_error(config.cost) + ".",
        highlight=False)


def _profile(cost):
    """The CostProfile a cost model was built from (by its name: built in, or a file this process read)."""
    from kvlab.cost.profiles import get_profile

    return get_profile(cost.profile)


def _error_band(cost):
    """The profile's leave-one-out error band (kvlab.cost.error_band), None for a profile not fitted on runs."""
    from kvlab.cost.band import error_band

    return error_band(_profile(cost))


def _measured_error(cost) -> str:
    """The profile's accuracy clause, as capacity and size state theirs (kvlab.report.setup.error_clause: its error
    on real runs, or that it is not measured): "; error on the 12 real vLLM runs ...". Trial 54, finding 3."""
    from kvlab.report.setup import error_clause

    return f"; {error_clause(cost.profile)}"


def race_json(config, wl, summaries, setup: dict | None = None) -> dict:
    """``config`` is the engine's (SimConfig); ``setup`` the resolved configuration's description."""
    from kvlab.report.tables import workload_rate

    return {
        "model": config.model.model,
        "gpu": config.gpu,
        "num_slots": config.cache.num_slots,
        # (a hybrid whose pool differs by prefix caching: each strategy's is vLLM's with its own, KvlabConfig.for_strategy)
        **({"prefix_caching_slots": dict(zip(("without", "with"), config.cache.prefix_caching_slots))}
           if config.cache.prefix_caching_slots else {}),
        "block_size": config.cache.block_size,
        "max_model_len": config.scheduler.max_model_len,
        "cost": {"profile": config.cost.profile, "notes": list(config.cost.notes),
                 "accuracy": _measured_error(config.cost)[2:],
                 "error_band": (band.as_dict() if (band := _error_band(config.cost)) else None)},
        "workload": {"name": wl.name, "num_requests": wl.num_requests, "rate": workload_rate(wl),
                     "description": wl.description},
        "strategies": summaries,
        **({"setup": setup} if setup is not None else {}),
        **({"memory_shares_note": _HYBRID_SHARES_NOTE} if config.cache.kv_cache_groups else {}),
    }


# (summary.json's memory_shares on a hybrid: the arithmetic is kvlab.metrics'; what its share holds is said here)
_HYBRID_SHARES_NOTE = ("external_fragmentation is free memory and the allocator's overhead together; on this hybrid "
                       "model the overhead holds the other KV cache groups' blocks (Mamba states, sliding windows) of "
                       "the running requests, which are not free: memory_shares_detailed has overhead and free apart")


RACE_HELP = f"""Race serving strategies on the same workload and clock; the table says who served the most and why.

Exit status 1, after the report, where no strategy served any request (each rejected them all).

{strategy_names_help()}
"""


@app.command(help=RACE_HELP)
@with_options(sim_option_template)
def race(
    ctx: typer.Context,
    strategies: Annotated[Optional[list[str]], typer.Argument(help="Strategies to race \\[default: the lesson's "
                                                                   f"four: {' '.join(defaults.RACE_STRATEGIES)}].",
                                                              show_default=False)] = None,
    as_json: JsonOpt = False,
    out: OutOpt = None,
    plots: PlotsOpt = None,
    html: Annotated[Optional[Path], typer.Option("--html", help="Write a self-contained page that replays the race "
                                                 "(no server, no network).")] = None,
    wide: WideOpt = False,
    yes: YesOpt = False,
    config: ConfigOpt = None,
    slo_classes: SloClassesOpt = None,
    arrivals: ArrivalsOpt = None,
    **options,
) -> None:
    """Race serving strategies on the same workload and clock (RACE_HELP)."""
    names = list(strategies) if strategies else list(defaults.RACE_STRATEGIES)
    if not strategies and (options.get("prefill_replicas") is not None or options.get("decode_replicas") is not None):
        # (the lesson's four reserve slabs, which a disaggregated fleet cannot model: trial 51)
        raise KvlabError(f"a disaggregated race needs strategies with paged memory and prefix caching, which the "
                         f"default ones ({' '.join(names)}) do not all have; valid: name them, e.g. kvlab race vllm "
                         "vllm+prefix --prefill-replicas ... --decode-replicas ...")
    draw = check_plots(plots, out)
    check_out(out, draw)
    check_output_path(html, "--html", folder=False)
    options = with_config_file(ctx, config, options)
    with allow_large_work(yes):
        run = simulate(names, quiet=as_json, slos=(slos := parse_slo_classes(slo_classes)), arrivals=arrivals,
                       **options)
    raced = plural(len(names), "strategy", "strategies")
    summaries = report(run, as_json=as_json, out=out, title=f"Race: {raced}, same workload", wide=wide, plots=draw,
                       slos=slos, utilization_stated=_stated(ctx, "gpu_memory_utilization"))
    if html is not None:
        from kvlab.web.export import write_race_html

        path = write_race_html(html, run.config, run.workload, names)
        if not as_json:
            typer.echo(f"Wrote {path}: open it in a browser to replay the race.")
    exit_if_nothing_served(summaries)


@app.command()
@with_options(sim_option_template)
def run(
    ctx: typer.Context,
    strategy: Annotated[str, typer.Argument(help=f"A strategy: {', '.join(STRATEGIES)}, or "
                                            "BATCHING+ALLOCATOR[+swap][+prefix].")] = "vllm",
    as_json: JsonOpt = False,
    out: OutOpt = None,
    plots: PlotsOpt = None,
    wide: WideOpt = False,
    yes: YesOpt = False,
    config: ConfigOpt = None,
    slo_classes: SloClassesOpt = None,
    arrivals: ArrivalsOpt = None,
    **options,
) -> None:
    """Serve a workload with one strategy and report memory shares, throughput, latency and preemptions.

    Exit status 1, after the report, where it served no request (every one rejected)."""
    draw = check_plots(plots, out)
    check_out(out, draw)
    options = with_config_file(ctx, config, options)
    with allow_large_work(yes):
        run = simulate([strategy], quiet=as_json, slos=(slos := parse_slo_classes(slo_classes)), arrivals=arrivals,
                       **options)
    summaries = report(run, as_json=as_json, out=out, title=f"Run: {run.results[0].strategy.name}", wide=wide,
                       plots=draw, slos=slos, utilization_stated=_stated(ctx, "gpu_memory_utilization"))
    exit_if_nothing_served(summaries)

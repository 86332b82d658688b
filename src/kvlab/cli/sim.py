"""``kvlab run``, ``kvlab race`` and ``kvlab workloads``: strategies served on one workload, side by side.

``kvlab race`` with no arguments is kvlab's main job: the lesson's four strategies on the vLLM paper's setup
(OPT-13B on one A100-40GB, the ShareGPT stand-in, Poisson arrivals), in seconds.
"""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer

from kvlab import defaults
from kvlab.cli.app import app
from kvlab.cli.size import (
    AvailOpt,
    BatchedOpt,
    BlockOpt,
    DtypeOpt,
    GpuGibOpt,
    KvDtypeOpt,
    MaxLenOpt,
    PpOpt,
    SeqsOpt,
    TpOpt,
    UtilOpt,
    plural,
    with_options,
)
from kvlab.strategies import STRATEGIES, strategy_names_help

# req/s for workloads without arrival times, and requests served: kvlab.defaults, shared with the lab and --html.
DEFAULT_RATE = defaults.RATE
DEFAULT_NUM_REQUESTS = defaults.NUM_REQUESTS

ModelOpt = Annotated[str, typer.Option("--model", help="Model: catalogue name, config.json, folder or HF id.")]
GpuOpt = Annotated[str, typer.Option("--gpu", help="GPU from the catalogue (its bandwidth and FLOP/s set the clock).")]
WorkloadOpt = Annotated[str, typer.Option("--workload", "-w", help="Bundled workload (see `kvlab workloads`) or a "
                                          "CSV/JSONL file with prompt_len, output_len[, arrival_time, max_tokens] "
                                          "(or Vidur's num_prefill_tokens, num_decode_tokens).")]
RateOpt = Annotated[Optional[float], typer.Option("--rate", help="Requests per second. Workloads without arrival "
                                                  f"times get Poisson arrivals at this rate \\[default: {DEFAULT_RATE}]; "
                                                  "a trace keeps its own arrivals unless --rate is given, "
                                                  "which rescales them to it.")]
ArrivalOpt = Annotated[str, typer.Option("--arrival", help="auto (a trace's own times, else Poisson), poisson, "
                                         "gamma, trace, burst (all at t=0).")]
CvOpt = Annotated[float, typer.Option("--cv", help="Coefficient of variation of gamma inter-arrival times.")]
NumReqOpt = Annotated[Optional[int], typer.Option("--num-requests", "-n", help="Serve the first N requests "
                                                  f"\\[default: {DEFAULT_NUM_REQUESTS} unless --duration].")]
DurationOpt = Annotated[Optional[float], typer.Option("--duration", help="Serve the requests arriving in the first "
                                                      "this many seconds.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed: same seed, same requests.")]
NumBlocksOpt = Annotated[Optional[int], typer.Option("--num-gpu-blocks", help="Fix the KV cache at this many blocks "
                                                     "(vLLM's num_gpu_blocks_override), vLLM's null block included: "
                                                     "7425 gives 7424 usable.")]
ChunkedOpt = Annotated[bool, typer.Option("--enable-chunked-prefill/--no-enable-chunked-prefill",
                                          help="Split long prompts over iterations (vLLM V1 always does).")]
PreemptOpt = Annotated[Optional[str], typer.Option("--preemption-mode", help="recompute or swap \\[default: the "
                                                   "strategy's, recompute].")]
SwapOpt = Annotated[float, typer.Option("--swap-space", help="CPU swap space per GPU in GiB, for swap preemption.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
CostOpt = Annotated[Optional[str], typer.Option("--cost", help="Cost profile that sets the clock: a name (kvlab cost) "
                                               "or a .toml/.json file (kvlab calibrate) \\[default: roofline].")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Write per-request and per-iteration CSV files and "
                                                "PNG plots to this folder.")]
PlotsOpt = Annotated[bool, typer.Option("--plots/--no-plots", help="With --out: also draw the PNG plots (--no-plots: "
                                        "CSV and JSON only, faster).")]
WideOpt = Annotated[bool, typer.Option("--wide", help="Every column of the table (memory split, p50 and p99, "
                                       "recomputed tokens); the default fits 80 columns.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Go ahead with work beyond kvlab's limits (the refusal says "
                                      "what it would cost).")]
LongOpt = Annotated[str, typer.Option("--long-requests", help="A request whose prompt + output exceeds "
                                      "--max-model-len: reject (vLLM: a too-long prompt is refused, an answer stops "
                                      "at max_model_len) or clip (Vidur: prompt and output scaled down to fit).")]


def workload_options(workload, rate, arrival, cv, num_requests, duration, seed, max_model_len,
                     long_requests="reject") -> dict:
    """``load_workload``'s arguments for the command line: bundled workloads without arrival times get DEFAULT_RATE
    unless a rate is given; traces and user files with an arrival_time column keep their own times."""
    from kvlab.workload import WORKLOADS
    from kvlab.workload.load import _resolve

    entry = WORKLOADS.get(workload)
    if entry is None and arrival in ("auto", "poisson", "gamma") and rate is None:
        entry = _resolve(workload)  # a user's file: lengths only (needs a rate) or with arrival times
    own_arrivals = entry is None or entry.kind == "trace"
    if rate is None and not own_arrivals and arrival not in ("trace", "burst"):
        rate = DEFAULT_RATE
    if num_requests is None and duration is None and entry is not None and entry.name in WORKLOADS:
        # A trace's own arrivals cannot be stretched past its rows; a user's file is served whole.
        num_requests = min(DEFAULT_NUM_REQUESTS, entry.rows().num_rows) if own_arrivals else DEFAULT_NUM_REQUESTS
    return {"num_requests": num_requests, "duration": duration, "rate": rate, "arrival": arrival, "cv": cv,
            "seed": seed, "max_model_len": max_model_len, "long_requests": long_requests}


def build_workload(workload, rate, arrival, cv, num_requests, duration, seed, max_model_len, long_requests="reject"):
    """The workload of the command line (``workload_options``)."""
    from kvlab.workload import load_workload

    return load_workload(workload, **workload_options(workload, rate, arrival, cv, num_requests, duration, seed,
                                                      max_model_len, long_requests))


# The options that describe the workload (``workload_options``'s); the others configure the engine.
WORKLOAD_OPTIONS = ("workload", "rate", "arrival", "cv", "num_requests", "duration", "seed", "long_requests")
# `kvlab run` flags that SimConfig.from_options spells differently.
CONFIG_RENAMES = {"swap_space": "swap_space_gib"}


def engine_options(values: dict) -> dict:
    """``SimConfig.from_options``'s keywords from `kvlab run`'s options (``values`` may hold others too)."""
    kwargs = {CONFIG_RENAMES.get(name, name): values[name] for name in SIM_OPTIONS
              if name not in WORKLOAD_OPTIONS and name in values}
    kwargs["tensor_parallel_size"] = kwargs.get("tensor_parallel_size") or 1
    return kwargs


def check_work(strategies: list, workload: str, options: dict) -> None:
    """Refuse, before anything is built, a run beyond kvlab.validate's limits (the estimate says why)."""
    from kvlab.validate import check_simulation_work
    from kvlab.workload.load import estimate_workload

    num, mean_len = estimate_workload(workload, num_requests=options["num_requests"], duration=options["duration"],
                                      rate=options["rate"], arrival=options["arrival"])
    check_simulation_work(num, mean_len, len(strategies), "this run")


DEFAULT_SWAP_SPACE_GIB = 4.0  # vLLM's --swap-space default


def _unused_options(strategies, swap_space: float, available_kv_gib, num_gpu_blocks) -> list[str]:
    """Options given that this run does not use, each said in one line (the run goes on)."""
    notes = []
    if swap_space != DEFAULT_SWAP_SPACE_GIB and not any(s.preemption_mode == "swap" for s in strategies):
        notes.append(f"--swap-space {swap_space:g} is not used: no strategy here swaps (a +swap strategy, or "
                     f"--preemption-mode swap, would)")
    if available_kv_gib and num_gpu_blocks:
        notes.append(f"--num-gpu-blocks {num_gpu_blocks} sets the pool (as vLLM's --num-gpu-blocks-override "
                     f"does): --available-kv-gib {available_kv_gib:g} is not used")
    return notes


def _refusals(config) -> list[str]:
    """What vLLM would refuse to start with, though kvlab runs it (the run shows what would happen)."""
    from kvlab.config import min_num_gpu_blocks

    cache, max_model_len = config.cache, config.scheduler.max_model_len
    least = min_num_gpu_blocks(max_model_len, cache.block_size)
    if cache.num_gpu_blocks >= least:
        return []
    return [f"vLLM would refuse to start with this pool: one {max_model_len:,}-token request (--max-model-len) "
            f"needs {least - 1:,} blocks of {cache.block_size}, more than the {cache.num_gpu_blocks - 1:,} "
            f"usable (the null block aside); kvlab runs it anyway, and a request that can never fit is rejected"]


def simulate(strategy_names: list[str], *, model, gpu, gpu_memory_gib, tensor_parallel_size, pipeline_parallel_size,
             gpu_memory_utilization, block_size, dtype, kv_cache_dtype, max_model_len, max_num_batched_tokens,
             max_num_seqs, available_kv_gib, num_gpu_blocks, enable_chunked_prefill, preemption_mode, swap_space,
             workload, rate, arrival, cv, num_requests, duration, seed, cost=None, quiet: bool = False,
             long_requests: str = "reject"):
    """Build the config and the workload once, run each strategy on them; returns (config, workload, results).
    Every option is checked, and the work estimated, before anything is built."""
    from dataclasses import replace

    from kvlab.cli.size import gpu_label
    from kvlab.strategies import check_distinct, parse_strategy, with_preemption_mode
    from kvlab.validate import check_options, check_pool_work

    long_requests = long_requests or "reject"
    given = dict(locals())
    check_options(given)
    strategies = [with_preemption_mode(parse_strategy(name), preemption_mode) for name in strategy_names]
    check_distinct(strategies)
    options = workload_options(workload, rate, arrival, cv, num_requests, duration, seed, None, long_requests)
    check_work(strategies, workload, options)
    # The engine is imported only for work that passed the checks: a refusal comes in a fraction of a second.
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kvlab.cost import CostProfileWarning
    from kvlab.cost.latency import as_seen_by_clients, delayed
    from kvlab.sim import SimConfig, Simulation

    with warnings.catch_warnings():  # the report prints the profile's notes itself
        warnings.simplefilter("ignore", CostProfileWarning)
        config = SimConfig.from_options(**engine_options(given))
    config = replace(config, gpu=gpu_label(config.gpu, gpu_memory_gib))
    check_pool_work(config.cache.num_gpu_blocks, config.cache.block_size)
    if long_requests == "clip":
        options["max_model_len"] = config.scheduler.max_model_len
    from kvlab.workload import load_workload

    wl = load_workload(workload, **options)
    latency_s = config.cost.request_latency_s
    results = []
    console = Console(stderr=True)
    for note in [*_unused_options(strategies, swap_space, available_kv_gib, num_gpu_blocks), *_refusals(config)]:
        console.print(f"note: {note}", style="yellow", highlight=False)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=quiet or not console.is_terminal) as progress:
        for strategy in strategies:
            task = progress.add_task(f"{strategy.name:<18}", total=wl.num_requests)
            # A profile's time outside the engine delays each request on its way in (kvlab/cost/latency.py).
            sim = Simulation(strategy, config, delayed(wl, latency_s))
            result = sim.run(progress=lambda done, total, task=task: progress.update(task, completed=done))
            results.append(as_seen_by_clients(result, latency_s))
    return config, wl, results


def setup_line(config, wl) -> str:
    cache, sched = config.cache, config.scheduler
    return (
        f"{config.model.model} on {config.gpu}: KV cache {cache.num_slots:,} token slots "
        f"({cache.num_gpu_blocks:,} blocks of {cache.block_size}, one of them vLLM's null block "
        f"for paged memory), max_model_len "
        f"{sched.max_model_len:,}, max_num_seqs {sched.max_num_seqs}, max_num_batched_tokens "
        f"{sched.max_num_batched_tokens:,}. Workload: {wl.name}, {plural(wl.num_requests, 'request')}, "
        f"{_rate_text(wl)}, mean prompt {wl.mean_prompt_len:,.0f} / output {wl.mean_output_len:,.0f} tokens."
    )


def workload_rate(wl) -> float | None:
    """The workload's mean arrival rate, or None when every request arrives at once (it has no rate, and JSON
    has no infinity)."""
    return wl.request_rate if wl.duration > 0 else None


def _rate_text(wl) -> str:
    from kvlab.report.tables import significant

    rate = workload_rate(wl)
    return "all arriving at once" if rate is None else f"arriving at {significant(rate)} req/s on average"


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


def report(config, wl, results, *, as_json: bool, out: Path | None, title: str, wide: bool = False,
           plots: bool = True) -> None:
    from rich.console import Console

    from kvlab.report.tables import footnotes, race_table, verdict

    summaries = [r.summary() for r in results]
    for summary in summaries:
        summary["typical_iteration"] = typical_iteration(config, summary)
    written: list[Path] = []
    if out is not None:
        from kvlab.report.tables import write_run_data

        out.mkdir(parents=True, exist_ok=True)
        for result in results:
            written += write_run_data(result, out)
        if plots:
            from kvlab.report.plots import plot_race

            written += plot_race(results, out)
        summary_path = out / "summary.json"
        summary_path.write_text(json.dumps(race_json(config, wl, summaries), indent=2))
        written.append(summary_path)
    if as_json:
        typer.echo(json.dumps(race_json(config, wl, summaries), indent=2))
        return
    console = Console(highlight=False)
    if not console.is_terminal and wide:
        console.width = max(console.width, 150)  # piped --wide output: room for the whole table
    behaviours = [r.strategy for r in results]
    console.print(setup_line(config, wl))
    console.print(race_table(summaries, title, wide=wide, strategies=behaviours, width=console.width))
    for line in footnotes(summaries, wide=wide):
        console.print(line)
    console.print(verdict(summaries, strategies=behaviours))
    best = max(summaries, key=lambda s: s["throughput_rps"])
    t = best["typical_iteration"]
    if t["num_seqs"] > 0:  # (nothing to explain when every request was rejected)
        _print_typical_iteration(console, config, best["name"], t)
    for note in config.cost.notes:
        console.print(f"warning: {note}", style="yellow", highlight=False)
    if written:
        console.print(f"Wrote {len(written)} files to {out}/: " + ", ".join(p.name for p in written))


def _print_typical_iteration(console, config, name: str, t: dict) -> None:
    console.print(
        f"A typical iteration of {name} ({plural(round(t['num_seqs']), 'request')} over {t['num_context_tokens']:,.0f} "
        f"tokens of KV): reading the weights {t['weights_ms']:.1f} ms + reading the KV {t['kv_ms']:.1f} ms against "
        f"computing {t['compute_ms']:.1f} ms ({t['bound']}-bound), + {t['overhead_ms']:.1f} ms overhead"
        + (f" + {t['seqs_ms']:.1f} ms per-sequence overhead" if t["seqs_ms"] else "")
        + f" = {t['total_ms']:.1f} ms, under cost profile {config.cost.profile!r} (kvlab cost; docs/cost.md).",
        highlight=False)


def race_json(config, wl, summaries) -> dict:
    return {
        "model": config.model.model,
        "gpu": config.gpu,
        "num_slots": config.cache.num_slots,
        "block_size": config.cache.block_size,
        "max_model_len": config.scheduler.max_model_len,
        "cost": {"profile": config.cost.profile, "notes": list(config.cost.notes)},
        "workload": {"name": wl.name, "num_requests": wl.num_requests, "rate": workload_rate(wl),
                     "description": wl.description},
        "strategies": summaries,
    }


def sim_option_template(
    model: ModelOpt = defaults.MODEL,
    gpu: GpuOpt = defaults.GPU,
    gpu_memory_gib: GpuGibOpt = None,
    tensor_parallel_size: TpOpt = None,
    pipeline_parallel_size: PpOpt = 1,
    gpu_memory_utilization: UtilOpt = 0.9,
    block_size: BlockOpt = defaults.BLOCK_SIZE,
    dtype: DtypeOpt = "auto",
    kv_cache_dtype: KvDtypeOpt = "auto",
    max_model_len: MaxLenOpt = None,
    max_num_batched_tokens: BatchedOpt = None,
    max_num_seqs: SeqsOpt = None,
    available_kv_gib: AvailOpt = None,
    num_gpu_blocks: NumBlocksOpt = None,
    enable_chunked_prefill: ChunkedOpt = True,
    preemption_mode: PreemptOpt = None,
    swap_space: SwapOpt = DEFAULT_SWAP_SPACE_GIB,
    workload: WorkloadOpt = defaults.WORKLOAD,
    rate: RateOpt = None,
    arrival: ArrivalOpt = "auto",
    cv: CvOpt = 1.0,
    num_requests: NumReqOpt = None,
    duration: DurationOpt = None,
    seed: SeedOpt = defaults.SEED,
    cost: CostOpt = None,
    long_requests: LongOpt = "reject",
) -> None:
    """The options `kvlab run` and `kvlab race` share (``simulate``'s keyword arguments), declared once."""


SIM_OPTIONS = tuple(inspect.signature(sim_option_template).parameters)


def sim_options(values: dict) -> dict:
    """The options `simulate` takes, picked from a command's arguments (run and race share them all)."""
    return {name: values[name] for name in SIM_OPTIONS}


RACE_HELP = f"""Race serving strategies on the same workload and clock; the table says who served the most and why.

{strategy_names_help()}
"""


@app.command(help=RACE_HELP)
@with_options(sim_option_template)
def race(
    strategies: Annotated[Optional[list[str]], typer.Argument(help="Strategies to race \\[default: the lesson's "
                                                                   f"four: {' '.join(defaults.RACE_STRATEGIES)}].",
                                                              show_default=False)] = None,
    as_json: JsonOpt = False,
    out: OutOpt = None,
    plots: PlotsOpt = True,
    html: Annotated[Optional[Path], typer.Option("--html", help="Write a self-contained page that replays the race "
                                                 "(no server, no network).")] = None,
    wide: WideOpt = False,
    yes: YesOpt = False,
    **options,
) -> None:
    """Race serving strategies on the same workload and clock (RACE_HELP)."""
    from kvlab.validate import allow_large_work, check_output_path

    names = list(strategies) if strategies else list(defaults.RACE_STRATEGIES)
    check_output_path(out, "--out", folder=True)
    check_output_path(html, "--html", folder=False)
    with allow_large_work(yes):
        config, wl, results = simulate(names, quiet=as_json, **options)
    report(config, wl, results, as_json=as_json, out=out, title=f"Race: {len(names)} strategies, same workload",
           wide=wide, plots=plots)
    if html is not None:
        from kvlab.web.export import write_race_html

        path = write_race_html(html, config, wl, names)
        if not as_json:
            typer.echo(f"Wrote {path}: open it in a browser to replay the race.")


@app.command()
@with_options(sim_option_template)
def run(
    strategy: Annotated[str, typer.Argument(help=f"A strategy: {', '.join(STRATEGIES)}, or "
                                            "BATCHING+ALLOCATOR[+swap][+prefix].")] = "vllm",
    as_json: JsonOpt = False,
    out: OutOpt = None,
    plots: PlotsOpt = True,
    wide: WideOpt = False,
    yes: YesOpt = False,
    **options,
) -> None:
    """Serve a workload with one strategy and report memory shares, throughput, latency and preemptions."""
    from kvlab.validate import allow_large_work, check_output_path

    check_output_path(out, "--out", folder=True)
    with allow_large_work(yes):
        config, wl, results = simulate([strategy], quiet=as_json, **options)
    report(config, wl, results, as_json=as_json, out=out, title=f"Run: {results[0].strategy.name}", wide=wide,
           plots=plots)


@app.command()
def workloads(as_json: JsonOpt = False, wide: WideOpt = False) -> None:
    """The bundled workloads: real traces, length files and the paper's stand-ins, with sources and licences."""
    from dataclasses import asdict

    from rich.console import Console

    from kvlab.cli.catalog import compact_table
    from kvlab.workload import list_workloads

    infos = list_workloads()
    if as_json:
        typer.echo(json.dumps([asdict(i) for i in infos], indent=2))
        return
    kinds = {"trace with arrivals": "trace", "lengths only": "lengths", "stand-in": "stand-in"}
    table = compact_table("Bundled workloads (use with --workload NAME)")
    columns = ["name", "kind", "rows", "mean\nprompt", "mean\noutput", "req/s", "licence"] + (["source"] if wide else [])
    for col in columns:
        table.add_column(col, justify="left" if col in ("name", "kind", "licence", "source") else "right",
                         no_wrap=col != "source")
    for i in infos:
        row = [i.name, kinds.get(i.kind, i.kind), "–" if i.num_rows is None else f"{i.num_rows:,}",
               f"{i.mean_prompt_len:,.0f}", f"{i.mean_output_len:,.0f}",
               "–" if i.mean_rate is None else f"{i.mean_rate:.2f}", i.licence]
        table.add_row(*(row + ([i.source] if wide else [])))
    console = Console(highlight=False)
    console.print(table)
    if not wide:
        console.print("kind: trace (its own arrival times), lengths (arrivals at --rate), stand-in (fitted to the "
                      "vLLM paper's means). Sources:")
        for i in infos:
            console.print(f"  {i.name}: {i.source}")

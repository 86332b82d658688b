"""``kvlab run``, ``kvlab race`` and ``kvlab workloads``: strategies served on one workload, side by side.

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
)

# req/s for workloads without arrival times, and requests served: kvlab.defaults, shared with the lab and --html.
DEFAULT_RATE = defaults.RATE
DEFAULT_NUM_REQUESTS = defaults.NUM_REQUESTS

ModelOpt = Annotated[str, typer.Option("--model", help="Model: catalogue name, config.json, folder or HF id.")]
GpuOpt = Annotated[str, typer.Option("--gpu", help="GPU from the catalogue (its bandwidth and FLOP/s set the clock).")]
WorkloadOpt = Annotated[str, typer.Option("--workload", "-w", help="Bundled workload (see `kvlab workloads`) or a "
                                          "CSV/JSONL file with arrival_time, prompt_len, output_len[, max_tokens].")]
RateOpt = Annotated[Optional[float], typer.Option("--rate", help="Requests per second. Workloads without arrival "
                                                  f"times get Poisson arrivals at this rate \\[default: {DEFAULT_RATE}]; "
                                                  "a trace's own arrivals are rescaled to it.")]
ArrivalOpt = Annotated[str, typer.Option("--arrival", help="auto (a trace's own times, else Poisson), poisson, "
                                         "gamma, trace, burst (all at t=0).")]
CvOpt = Annotated[float, typer.Option("--cv", help="Coefficient of variation of gamma inter-arrival times.")]
NumReqOpt = Annotated[Optional[int], typer.Option("--num-requests", "-n", help="Serve the first N requests "
                                                  f"\\[default: {DEFAULT_NUM_REQUESTS} unless --duration].")]
DurationOpt = Annotated[Optional[float], typer.Option("--duration", help="Serve the requests arriving in the first "
                                                      "this many seconds.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed: same seed, same requests.")]
NumBlocksOpt = Annotated[Optional[int], typer.Option("--num-gpu-blocks", help="Fix the KV cache at this many blocks "
                                                     "(vLLM's num_gpu_blocks_override).")]
ChunkedOpt = Annotated[bool, typer.Option("--enable-chunked-prefill/--no-enable-chunked-prefill",
                                          help="Split long prompts over iterations (vLLM V1 always does).")]
PreemptOpt = Annotated[Optional[str], typer.Option("--preemption-mode", help="recompute or swap \\[default: the "
                                                   "strategy's, recompute].")]
SwapOpt = Annotated[float, typer.Option("--swap-space", help="CPU swap space per GPU in GiB, for swap preemption.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Write per-request and per-iteration CSV files and "
                                                "PNG plots to this folder.")]


def build_workload(workload: str, rate, arrival, cv, num_requests, duration, seed, max_model_len):
    """The workload of the command line. Bundled workloads without arrival times get DEFAULT_RATE unless a rate
    is given; traces and user files (which have an arrival_time column) keep their own times."""
    from kvlab.workload import WORKLOADS, load_workload

    entry = WORKLOADS.get(workload)
    own_arrivals = entry is None or entry.kind == "trace"  # a user's file has an arrival_time column
    if rate is None and not own_arrivals and arrival not in ("trace", "burst"):
        rate = DEFAULT_RATE
    if num_requests is None and duration is None and entry is not None:
        # A trace's own arrivals cannot be stretched past its rows; a user's file is served whole.
        num_requests = min(DEFAULT_NUM_REQUESTS, entry.rows().num_rows) if own_arrivals else DEFAULT_NUM_REQUESTS
    return load_workload(workload, num_requests=num_requests, duration=duration, rate=rate, arrival=arrival, cv=cv,
                         seed=seed, max_model_len=max_model_len)


def simulate(strategy_names: list[str], *, model, gpu, gpu_memory_gib, tensor_parallel_size, pipeline_parallel_size,
             gpu_memory_utilization, block_size, dtype, kv_cache_dtype, max_model_len, max_num_batched_tokens,
             max_num_seqs, available_kv_gib, num_gpu_blocks, enable_chunked_prefill, preemption_mode, swap_space,
             workload, rate, arrival, cv, num_requests, duration, seed, quiet: bool = False):
    """Build the config and the workload once, run each strategy on them; returns (config, workload, results)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kvlab.sim import SimConfig, Simulation
    from kvlab.strategies import parse_strategy

    strategies = [parse_strategy(name) for name in strategy_names]
    if max_model_len is not None and block_size > max_model_len:
        from kvlab.errors import KvlabError

        raise KvlabError(f"--block-size {block_size} is larger than --max-model-len {max_model_len}: "
                         f"a block must fit in a sequence")
    config = SimConfig.from_options(
        model=model, gpu=gpu, gpu_memory_gib=gpu_memory_gib, available_kv_gib=available_kv_gib,
        num_gpu_blocks=num_gpu_blocks, gpu_memory_utilization=gpu_memory_utilization, block_size=block_size,
        dtype=dtype, kv_cache_dtype=kv_cache_dtype, tensor_parallel_size=tensor_parallel_size or 1,
        pipeline_parallel_size=pipeline_parallel_size, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, enable_chunked_prefill=enable_chunked_prefill,
        preemption_mode=preemption_mode, swap_space_gib=swap_space,
    )
    wl = build_workload(workload, rate, arrival, cv, num_requests, duration, seed, None)
    results = []
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=quiet or not console.is_terminal) as progress:
        for strategy in strategies:
            task = progress.add_task(f"{strategy.name:<18}", total=wl.num_requests)
            sim = Simulation(strategy, config, wl)
            results.append(sim.run(progress=lambda done, total: progress.update(task, completed=done)))
    return config, wl, results


def setup_line(config, wl) -> str:
    return (
        f"{config.model} on {config.gpu}: KV cache {config.num_slots:,} token slots "
        f"({config.num_slots // config.block_size:,} blocks of {config.block_size}), max_model_len "
        f"{config.max_model_len:,}, max_num_seqs {config.max_num_seqs}, max_num_batched_tokens "
        f"{config.max_num_batched_tokens:,}. Workload: {wl.name}, {wl.num_requests:,} requests, "
        f"{wl.request_rate:.2f} req/s, mean prompt {wl.mean_prompt_len:.0f} / output {wl.mean_output_len:.0f} tokens."
    )


def typical_iteration(config, summary: dict) -> dict:
    """The cost model's terms for an iteration of this run's mean batch over its mean KV context (a decode
    iteration: one new token per request): what an iteration's time is made of, in ms."""
    num_seqs = summary["mean_batch_size"]
    context = summary["memory_shares"]["token"] / 100 * config.num_slots
    terms = config.cost.terms(round(num_seqs), 0, round(num_seqs), round(context), round(context))
    return {"num_seqs": num_seqs, "num_context_tokens": context, "weights_ms": 1e3 * terms.weights,
            "kv_ms": 1e3 * terms.kv, "compute_ms": 1e3 * terms.compute, "overhead_ms": 1e3 * terms.overhead,
            "total_ms": 1e3 * terms.total, "bound": terms.bound}


def report(config, wl, results, *, as_json: bool, out: Path | None, title: str) -> None:
    from rich.console import Console

    from kvlab.report.tables import race_table, verdict

    summaries = [r.summary() for r in results]
    for summary in summaries:
        summary["typical_iteration"] = typical_iteration(config, summary)
    written: list[Path] = []
    if out is not None:
        from kvlab.report.plots import plot_race
        from kvlab.report.tables import write_run_data

        out.mkdir(parents=True, exist_ok=True)
        for result in results:
            written += write_run_data(result, out)
        written += plot_race(results, out)
        summary_path = out / "summary.json"
        summary_path.write_text(json.dumps(race_json(config, wl, summaries), indent=2))
        written.append(summary_path)
    if as_json:
        typer.echo(json.dumps(race_json(config, wl, summaries), indent=2))
        return
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 150)  # piped output: room for the whole table
    console.print(setup_line(config, wl), highlight=False)
    console.print(race_table(summaries, title))
    console.print(verdict(summaries), highlight=False)
    best = max(summaries, key=lambda s: s["throughput_rps"])
    t = best["typical_iteration"]
    console.print(
        f"A typical iteration of {best['name']} ({t['num_seqs']:.0f} requests over {t['num_context_tokens']:,.0f} "
        f"tokens of KV): reading the weights {t['weights_ms']:.1f} ms + reading the KV {t['kv_ms']:.1f} ms against "
        f"computing {t['compute_ms']:.1f} ms ({t['bound']}-bound), + {t['overhead_ms']:.1f} ms overhead = "
        f"{t['total_ms']:.1f} ms (docs/metrics.md: the cost model).", highlight=False)
    if written:
        console.print(f"Wrote {len(written)} files to {out}/: " + ", ".join(p.name for p in written), highlight=False)


def race_json(config, wl, summaries) -> dict:
    return {
        "model": config.model,
        "gpu": config.gpu,
        "num_slots": config.num_slots,
        "block_size": config.block_size,
        "max_model_len": config.max_model_len,
        "workload": {"name": wl.name, "num_requests": wl.num_requests, "rate": wl.request_rate,
                     "description": wl.description},
        "strategies": summaries,
    }


SIM_OPTIONS = (
    "model", "gpu", "gpu_memory_gib", "tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization",
    "block_size", "dtype", "kv_cache_dtype", "max_model_len", "max_num_batched_tokens", "max_num_seqs",
    "available_kv_gib", "num_gpu_blocks", "enable_chunked_prefill", "preemption_mode", "swap_space", "workload",
    "rate", "arrival", "cv", "num_requests", "duration", "seed",
)


def sim_options(values: dict) -> dict:
    """The options `simulate` takes, picked from a command's arguments (run and race share them all)."""
    return {name: values[name] for name in SIM_OPTIONS}


@app.command()
def race(
    strategies: Annotated[Optional[list[str]], typer.Argument(help="Strategies to race \\[default: the lesson's "
                                                                   "four: static+max continuous+max static+paged "
                                                                   "continuous+paged].", show_default=False)] = None,
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
    swap_space: SwapOpt = 4.0,
    workload: WorkloadOpt = defaults.WORKLOAD,
    rate: RateOpt = None,
    arrival: ArrivalOpt = "auto",
    cv: CvOpt = 1.0,
    num_requests: NumReqOpt = None,
    duration: DurationOpt = None,
    seed: SeedOpt = defaults.SEED,
    as_json: JsonOpt = False,
    out: OutOpt = None,
    html: Annotated[Optional[Path], typer.Option("--html", help="Write a self-contained page that replays the race "
                                                 "(no server, no network).")] = None,
) -> None:
    """Race serving strategies on the same workload and clock; the table says who served the most and why."""
    names = list(strategies) if strategies else list(defaults.RACE_STRATEGIES)
    options = sim_options(locals())
    config, wl, results = simulate(names, quiet=as_json, **options)
    report(config, wl, results, as_json=as_json, out=out, title=f"Race: {len(names)} strategies, same workload")
    if html is not None:
        from kvlab.web.export import write_race_html

        path = write_race_html(html, config, wl, names)
        if not as_json:
            typer.echo(f"Wrote {path}: open it in a browser to replay the race.")


@app.command()
def run(
    strategy: Annotated[str, typer.Argument(help="A strategy: vllm, orca-max, orca-pow2, orca-oracle, static+max, "
                                            "continuous+paged, ... or BATCHING+ALLOCATOR[+swap][+prefix].")] = "vllm",
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
    swap_space: SwapOpt = 4.0,
    workload: WorkloadOpt = defaults.WORKLOAD,
    rate: RateOpt = None,
    arrival: ArrivalOpt = "auto",
    cv: CvOpt = 1.0,
    num_requests: NumReqOpt = None,
    duration: DurationOpt = None,
    seed: SeedOpt = defaults.SEED,
    as_json: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Serve a workload with one strategy and report memory shares, throughput, latency and evictions."""
    config, wl, results = simulate([strategy], quiet=as_json, **sim_options(locals()))
    report(config, wl, results, as_json=as_json, out=out, title=f"Run: {results[0].strategy.name}")


@app.command()
def workloads(as_json: JsonOpt = False) -> None:
    """The bundled workloads: real traces, length files and the paper's stand-ins, with sources and licences."""
    from dataclasses import asdict

    from rich.console import Console
    from rich.table import Table

    from kvlab.workload import list_workloads

    infos = list_workloads()
    if as_json:
        typer.echo(json.dumps([asdict(i) for i in infos], indent=2))
        return
    table = Table(title="Bundled workloads (use with --workload NAME)", title_justify="left", header_style="bold")
    for col in ("name", "kind", "rows", "mean prompt", "mean output", "req/s", "source", "licence"):
        table.add_column(col, justify="right" if col in ("rows", "mean prompt", "mean output", "req/s") else "left")
    for i in infos:
        table.add_row(i.name, i.kind, "–" if i.num_rows is None else f"{i.num_rows:,}", f"{i.mean_prompt_len:,.0f}",
                      f"{i.mean_output_len:,.0f}", "–" if i.mean_rate is None else f"{i.mean_rate:.2f}",
                      i.source, i.licence)
    Console().print(table)

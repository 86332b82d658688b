"""``kvlab bench --url URL``: a kvlab workload replayed against a real OpenAI-compatible server, measured;
``--compare`` lays kvlab's simulation of the same requests on the server's configuration beside it."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from kvlab.cli.app import app
from kvlab.cli.options import JsonOpt, YesOpt, options_template, with_options
from kvlab.errors import KvlabError
from kvlab.service.bench import DEFAULT_NUM_REQUESTS, bench_workload, check_bench_options
from kvlab.validate import allow_large_work, check_output_path, note_written

# The workload's options and the simulation's (for --compare), declared once in kvlab/config/options.py; here the
# defaults are a real server's: a bounded load, and the server's own KV cache and limits.
SERVER = "the server's (--compare)"
BENCH_WORKLOAD_OPTIONS = ("workload", "rate", "arrival", "cv", "num_requests", "duration", "seed")
SIM_SETUP_OPTIONS = ("gpu", "cost", "block_size", "num_gpu_blocks", "max_model_len", "max_num_seqs",
                     "max_num_batched_tokens")
bench_options = options_template(
    BENCH_WORKLOAD_OPTIONS + SIM_SETUP_OPTIONS,
    defaults={"cost": None, "block_size": None},
    default_texts={"num_requests": f"{DEFAULT_NUM_REQUESTS} unless --duration", "cost": "roofline, not calibrated",
                   "block_size": SERVER, "num_gpu_blocks": SERVER, "max_model_len": SERVER,
                   "max_num_seqs": "kvlab's for the GPU (as the server was started)",
                   "max_num_batched_tokens": "kvlab's for the GPU (as the server was started)"})
UrlOpt = Annotated[str, typer.Option("--url", help="The server, e.g. http://127.0.0.1:8000 (OpenAI-compatible: "
                                     "/v1/models, /v1/completions; vLLM also gives /metrics).")]
ConcurrencyOpt = Annotated[Optional[int], typer.Option("--concurrency", help="N clients in a closed loop (each sends "
                                                       "its next request when the last one ended) instead of the "
                                                       "arrival times.")]
ServedModelOpt = Annotated[Optional[str], typer.Option("--model", help="Served model name to send requests to "
                                                       "\\[default: the first of /v1/models].")]
PromptFormatOpt = Annotated[str, typer.Option("--prompt-format", help="auto (token ids for vLLM, else text), "
                                              "token-ids, or text of about prompt_len words.")]
IgnoreEosOpt = Annotated[Optional[bool], typer.Option("--ignore-eos/--no-ignore-eos", help="Ask for exactly "
                                                      "max_tokens tokens \\[default: on for vLLM, which takes it].")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds a request may take, sending to last token, "
                                           "before it counts as timed out.")]
TimeLimitOpt = Annotated[float, typer.Option("--time-limit", help="Seconds the whole run may take; then the requests "
                                             "still open are stopped and kept, marked.")]
IntervalOpt = Annotated[float, typer.Option("--metrics-interval", help="Seconds between scrapes of /metrics (at least 4 "
                                            "times as long as the last one took: scraping keeps to a fifth of the "
                                            "server's time).")]
BenchOutOpt = Annotated[Optional[Path], typer.Option("--out", help="Write requests.csv, token_times.jsonl, "
                                                     "metrics.csv, summary.json (and --compare's plots and table) "
                                                     "here.")]
CompareOpt = Annotated[bool, typer.Option("--compare", help="Simulate the same requests on the server's "
                                          "configuration and lay measured beside simulated.")]
ModelConfigOpt = Annotated[Optional[str], typer.Option("--model-config", help="--compare: the simulation's model: "
                                                       "catalogue name, config.json, folder or HF id \\[default: what "
                                                       "the server loaded] (--model is the served model's name).")]


@app.command()
@with_options(bench_options)
def bench(
    ctx: typer.Context,
    url: UrlOpt,
    concurrency: ConcurrencyOpt = None,
    model: ServedModelOpt = None,
    prompt_format: PromptFormatOpt = "auto",
    ignore_eos: IgnoreEosOpt = None,
    timeout: TimeoutOpt = 120.0,
    time_limit: TimeLimitOpt = 600.0,
    metrics_interval: IntervalOpt = 0.5,
    as_json: JsonOpt = False,
    out: BenchOutOpt = None,
    compare: CompareOpt = False,
    model_config: ModelConfigOpt = None,
    yes: YesOpt = False,
    **options,
) -> None:
    """Replay a workload against a real OpenAI-compatible server (vLLM, Ollama, ...), streaming every answer.

    TTFT, TPOT and latency per request, the server's /metrics over time; --compare puts kvlab's simulation beside."""
    from rich.console import Console

    _check_options(concurrency, timeout, time_limit, metrics_interval, prompt_format)
    check_output_path(out, "--out", folder=True, writes=_out_files())  # (before the load, not after)
    _check_applies(ctx, compare, concurrency, {"model_config": model_config, **options})
    check_bench_options({n: options[n] for n in BENCH_WORKLOAD_OPTIONS}, options["gpu"] if compare else None,
                        {n: options[n] for n in SIM_SETUP_OPTIONS if n != "gpu"} if compare else None)
    console = Console(stderr=True, highlight=False)
    try:  # before the load: Ctrl-C here has nothing to keep; --yes: a workload beyond kvlab's limits (trial 58)
        with allow_large_work(yes):
            server, setup, wl = _prepare(url, model, compare,
                                         {"model_config": model_config, **{n: options[n] for n in SIM_SETUP_OPTIONS}},
                                         {n: options[n] for n in BENCH_WORKLOAD_OPTIONS})
    except KeyboardInterrupt:
        console.print("Interrupted before any load was sent.")
        raise typer.Exit(130) from None
    config = _client_config(server, prompt_format, ignore_eos, concurrency, timeout, time_limit, metrics_interval)
    for line in _intro(server, wl, config) + [f"[yellow]note:[/] {n}" for n in (setup.notes if setup else ())]:
        console.print(line)
    run = _run(wl, config, console, quiet=as_json)
    summary = _summary(run, server, wl, config)
    written: list[Path] = []
    if setup is not None:
        with allow_large_work(yes):
            summary["compare"], written = _compare(run, wl, setup, summary, out)
    if out is not None:
        from kvlab.bench.results import write_bench_files

        written = write_bench_files(run.results, run.samples, summary, out) + written
        note_written(out, written)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        _report(summary, run, console)
    if written:
        console.print(f"Wrote {len(written)} files to {out}/: "
                      + ", ".join(str(p.relative_to(out)) if p.is_relative_to(out) else str(p) for p in written))
    if run.stopped == "interrupted":
        raise typer.Exit(130)
    if not summary["num_finished"]:  # (trial 51: a bench that measured nothing exited 0, as one that measured)
        console.print(f"[bold red]error:[/] none of the {len(run.results)} requests finished: nothing was measured "
                      "(what ended them is listed above)", highlight=False)
        raise typer.Exit(1)


def _check_options(concurrency, timeout, time_limit, metrics_interval, prompt_format) -> None:
    from kvlab.bench.client import PROMPT_FORMATS

    seconds = "seconds, a finite number > 0"
    for name, value, valid in (("--concurrency", concurrency, "clients, a whole number ≥ 1"),
                               ("--timeout", timeout, seconds), ("--time-limit", time_limit, seconds),
                               ("--metrics-interval", metrics_interval, seconds)):
        if value is None:
            continue
        if not math.isfinite(value):  # (inf would switch the bound off: a bench is bounded, as run's --timeout is)
            raise KvlabError(f"{name} {value:g} is not a finite number; valid: {valid}")
        if not value > 0:
            raise KvlabError(f"{name} {value:g} is out of range; valid: {valid}")
    if prompt_format not in ("auto", *PROMPT_FORMATS):
        raise KvlabError(f"--prompt-format {prompt_format!r} is not one of its values; valid: auto, "
                         f"{', '.join(PROMPT_FORMATS)}")


COMPARE_ONLY = ("model_config", *SIM_SETUP_OPTIONS)  # the simulation's options: nothing to set without --compare


def _check_applies(ctx: typer.Context, compare: bool, concurrency, values: dict) -> None:
    """Refuse an option given where it does nothing, as kvlab does elsewhere: the simulation's without --compare,
    --rate in a closed loop (--concurrency) unless --duration asks the rate how many requests it holds."""
    sources = {n: ctx.get_parameter_source(n) for n in values}
    given = {n for n, source in sources.items() if source is not None and source.name != "DEFAULT"}
    if not compare:
        for name in COMPARE_ONLY:
            if name in given:
                raise KvlabError(f"--{name.replace('_', '-')} {values[name]} applies only with --compare (it sets the "
                                 "simulation beside the measurement); valid: add --compare, or drop it")
    if concurrency is not None and "rate" in given and values.get("duration") is None:
        raise KvlabError(f"--rate {values['rate']:g} does not apply with --concurrency {concurrency}: a closed loop "
                         "sends each client's next request when its last one ended; valid: drop --rate (or "
                         "--concurrency to send at the rate)")


def _prepare(url, model, compare: bool, sim_options: dict, workload_options: dict):
    """(server, simulation setup or None, workload): everything that can refuse, done before any load."""
    from kvlab.bench.server import api_key_from_env, probe

    server = probe(url, model=model, api_key=api_key_from_env(os.environ))
    setup = None
    if compare:
        from kvlab.bench.compare import sim_setup

        setup = sim_setup(server, **sim_options)
    return server, setup, bench_workload(**workload_options, max_model_len=server.max_model_len)


def _too_long(wl, max_model_len: int) -> str | None:
    """The requests a server of ``max_model_len`` refuses before serving (vLLM's OpenAI server answers HTTP 400 "This
    model's maximum context length is ..." where the prompt and max_tokens, one at least, pass it), said before
    they are sent."""
    long = [r for r in wl.requests if r.prompt_len + max(r.num_output_tokens, 1) > max_model_len]
    if not long:
        return None
    longest = max(r.prompt_len for r in long)
    return (f"{len(long):,} of the {wl.num_requests:,} requests have prompts too long for the server's max_model_len "
            f"{max_model_len:,} (the longest {longest:,} tokens): it will refuse them (HTTP 400); a workload with "
            "shorter prompts measures the server")


def _capped(wl, max_model_len: int | None) -> str:
    """' (N answers capped to fit max_model_len M: max_tokens = M - prompt; uncapped, the mean output is X)' where
    the bench shortens answers to fit the server (kvlab run of the same workload serves them whole), else ''."""
    capped = [r for r in wl.requests if r.max_tokens is not None and r.max_tokens < r.output_len]
    if not capped or max_model_len is None:
        return ""
    whole = sum(r.output_len for r in wl.requests) / wl.num_requests
    answers = f"{len(capped):,} answer{'s' if len(capped) != 1 else ''}"
    return (f" ({answers} capped to fit the server's max_model_len {max_model_len:,}: max_tokens = "
            f"max_model_len - prompt; uncapped, as kvlab run serves them, the mean output is {whole:,.0f})")


def _client_config(server, prompt_format, ignore_eos, concurrency, timeout, time_limit, metrics_interval):
    from kvlab.bench.client import ClientConfig
    from kvlab.bench.server import api_key_from_env

    return ClientConfig(
        url=server.url, model=server.model, api_key=api_key_from_env(os.environ),
        prompt_format=prompt_format if prompt_format != "auto" else ("token-ids" if server.is_vllm else "text"),
        ignore_eos=server.is_vllm if ignore_eos is None else ignore_eos, continuous_usage=server.is_vllm,
        concurrency=concurrency, request_timeout=timeout, time_limit=time_limit,
        scrape_interval=metrics_interval if server.has_metrics else None,
    )


def _intro(server, wl, config) -> list[str]:
    """What is about to happen: the server, the load, and its bounds."""
    cache = server.cache_config
    kind = f"vLLM {server.vllm_version}" if server.vllm_version else ("vLLM" if server.is_vllm else "not vLLM")
    parts = [f"Server {server.shown_url}: model {server.model!r} ({kind})"]
    if cache.get("num_gpu_blocks") is not None:
        parts.append(f"KV cache {cache['num_gpu_blocks']:,} blocks of {cache.get('block_size')} tokens")
    if server.max_model_len is not None:
        parts.append(f"max_model_len {server.max_model_len:,}")
    pacing = (f"{config.concurrency} clients in a closed loop" if config.concurrency is not None
              else "at the workload's arrival times (" + (f"{wl.request_rate:.2f} req/s)" if wl.duration > 0
                                                          else "all at t = 0)"))
    extras = ", ".join(x for x in ("prompts as token ids" if config.prompt_format == "token-ids"
                                   else "prompts as text (about one token per word)",
                                   "ignore_eos" if config.ignore_eos else "") if x)
    lines = [", ".join(parts) + "."]
    lines += [f"[yellow]note:[/] {note}" for note in server.notes]
    if server.max_model_len is not None:
        lines += [f"[yellow]note:[/] {note}" for note in [_too_long(wl, server.max_model_len)] if note]
    lines.append(f"Load: {wl.num_requests:,} requests of {wl.name} {pacing}, mean prompt {wl.mean_prompt_len:,.0f} / "
                 f"output {wl.mean_output_len:,.0f} tokens{_capped(wl, server.max_model_len)}, {extras}. Bounds: "
                 "each request times out after "
                 f"{config.request_timeout:g} s (--timeout), the run stops after {config.time_limit:g} s "
                 "(--time-limit); Ctrl-C stops it and keeps what was measured.")
    return lines


def _run(wl, config, console, *, quiet: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kvlab.bench.client import run_bench

    counts = {"finished": 0, "failed": 0, "timeout": 0}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[counts]}"), console=console, transient=True,
                  disable=quiet or not console.is_terminal) as progress:
        task = progress.add_task("bench", total=wl.num_requests, counts="")

        def on_result(result) -> None:
            counts[result.status] += 1
            progress.update(task, advance=1, counts=", ".join(f"{n} {s}" for s, n in counts.items() if n))

        return run_bench(wl.requests, config, on_result=on_result)


def _summary(run, server, wl, config) -> dict:
    """What --json prints and summary.json holds (docs/bench.md, "What is measured")."""
    from kvlab.bench.results import summarize
    from kvlab.report.tables import workload_rate

    summary = summarize(run.results, run.makespan, run.server_counters)
    summary["stopped"] = run.stopped
    summary["server"] = server.to_json()
    summary["workload"] = {"name": wl.name, "num_requests": wl.num_requests, "rate": workload_rate(wl),
                           "description": wl.description, "num_prompt_tokens": wl.num_prompt_tokens,
                           "num_output_tokens": wl.num_output_tokens}
    summary["client"] = {"concurrency": config.concurrency, "prompt_format": config.prompt_format,
                         "ignore_eos": config.ignore_eos, "timeout_s": config.request_timeout,
                         "time_limit_s": config.time_limit, "metrics_interval_s": config.scrape_interval,
                         "num_scrape_errors": run.num_scrape_errors, "started_at": _started_at(run.makespan)}
    summary["requests"] = [r.row() for r in run.results]
    return summary


def _started_at(makespan: float) -> str:
    """When the bench started, as the machine's local time (as a vLLM server's log stamps its lines, "12-07 01:16:01",
    with the date and offset): its end less its makespan, to a second. kvlab calibrate names it beside a server log's
    times."""
    from datetime import datetime, timedelta

    return (datetime.now().astimezone() - timedelta(seconds=makespan)).isoformat(sep=" ", timespec="seconds")


def _out_files() -> tuple[str, ...]:
    """What --out receives, as glob patterns (kvlab.validate.check_output_path): the contract files, and --compare's
    table, plots (bench/plots.py's compare_*.png) and simulated run (simulated/)."""
    from kvlab.bench.results import BENCH_FILES
    from kvlab.report.tables import RUN_DATA_FILES

    return (*BENCH_FILES, "compare.csv", "compare_*.png", *(f"simulated/{name}" for name in RUN_DATA_FILES))


def _compare(run, wl, setup, summary: dict, out: Path | None) -> tuple[dict, list[Path]]:
    """The comparison's table (and, with --out, its plots and the simulation's files)."""
    import csv

    from kvlab.bench import compare as cmp

    result = cmp.simulate_sent(run, wl.requests, setup)
    sim_summary = result.summary()
    measured, simulated = cmp.measured_series(run.samples), cmp.simulated_series(result)
    rows = cmp.headline_rows(summary, sim_summary, measured, simulated, result.records)
    written: list[Path] = []
    if out is not None:
        from kvlab.bench.plots import plot_comparison
        from kvlab.report.tables import write_run_data

        out.mkdir(parents=True, exist_ok=True)
        table_path = out / "compare.csv"
        with table_path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=("figure", "measured", "simulated", "ratio"))
            writer.writeheader()
            writer.writerows(rows)
        written = [table_path, *plot_comparison(measured, simulated, cmp.latencies(run.results, result.records), out)]
        written += write_run_data(result, out / "simulated")
    return {"settings": setup.settings, "notes": list(setup.notes), "table": rows,
            "rejected": _rejected_note(result.records), "output_lengths": cmp.received_lengths_note(run)}, written


def _measured_tables(summary: dict) -> list:
    """The measurement in two tables that keep to 80 columns: what ended how, and the latencies."""
    from rich import box
    from rich.table import Table

    def ms(d: dict, key: str) -> str:
        return "–" if d[key] is None else f"{1e3 * d[key]:.1f} ms"

    counts = Table(title="Measured", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for col in ("finished", "failed", "timed out", "req/s", "tokens/s", "preemptions"):
        counts.add_column(col, justify="right", no_wrap=True)
    counts.add_row(str(summary["num_finished"]), str(summary["num_failed"]), str(summary["num_timeout"]),
                   f"{summary['throughput_rps']:.2f}", f"{summary['throughput_tps']:.1f}", _fmt(summary["preemptions"]))
    latency = Table(title="Measured latency", title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for col in ("TTFT p50", "TTFT p99", "TPOT p50", "e2e p50", "e2e p99"):
        latency.add_column(col, justify="right", no_wrap=True)
    latency.add_row(ms(summary["ttft_s"], "p50"), ms(summary["ttft_s"], "p99"), ms(summary["tpot_s"], "p50"),
                    ms(summary["e2e_latency_s"], "p50"), ms(summary["e2e_latency_s"], "p99"))
    return [counts, latency]


def _print_compare(stdout, compare: dict) -> None:
    """Measured beside simulated, titled with the strategy the simulation ran, and what the simulation rejected."""
    from rich.table import Table

    table = Table(title=f"Measured beside simulated (kvlab's `{compare['settings']['strategy']}` strategy)",
                  title_justify="left", header_style="bold")
    for col in ("figure", "measured", "simulated", "measured / simulated"):
        table.add_column(col, justify="left" if col == "figure" else "right")
    for row in compare["table"]:
        table.add_row(row["figure"], _fmt(row["measured"]), _fmt(row["simulated"]),
                      "–" if row["ratio"] is None else f"{row['ratio']:.3f}")
    stdout.print(table)
    if compare.get("output_lengths"):
        stdout.print(f"[yellow]note:[/] {escape(compare['output_lengths'])}")
    if compare.get("rejected"):
        stdout.print(f"[yellow]note:[/] {escape(compare['rejected'])}")


def _rejected_note(records) -> str | None:
    """What the simulation rejected, by reason (a cache too small for the requests rejects them all)."""
    from collections import Counter

    reasons = Counter(r.reject_reason or "rejected" for r in records if r.status == "rejected")
    if not reasons:
        return None
    total = sum(reasons.values())
    share = "every one" if total == len(records) else f"{total:,}"
    return (f"the simulation rejected {share} of the {len(records):,} requests sent ("
            + ", ".join(f"{n:,} {reason}" for reason, n in reasons.most_common())
            + "): check --num-gpu-blocks, --block-size and --max-model-len against the server's")


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4g}"
    return f"{value:,.0f}"


def _report(summary: dict, run, console) -> None:
    from rich.console import Console

    from kvlab.report.text import plural

    stdout = Console(highlight=False)  # (the terminal's width, 80 when not one: the README's promise for tables)
    for table in _measured_tables(summary):
        stdout.print(table)
    counters = summary["server_counters"]
    if counters is not None:
        stdout.print(f"The server counted {counters['prompt_tokens']:,} prompt tokens (kvlab sent "
                     f"{summary['num_prompt_tokens_sent']:,}) and generated {counters['generation_tokens']:,} "
                     f"(kvlab received {summary['num_output_tokens_received']:,}); "
                     f"{plural(counters['preemptions'], 'preemption')}.")
    if summary["errors"]:
        stdout.print(f"What did not finish ({plural(len(summary['requests']) - summary['num_finished'], 'request')}):")
    for error, count in summary["errors"].items():
        stdout.print(f"[red]{count} ×[/] {escape(error)}")
    if summary["num_short"]:
        from kvlab.bench.results import why_short

        stdout.print(escape(why_short(summary["num_short"], summary["short_finish_reasons"])))
    if "compare" in summary:
        _print_compare(stdout, summary["compare"])
    if run.stopped == "interrupted":
        console.print(f"[yellow]Interrupted[/] (Ctrl-C): kept all {len(run.results)} rows; the requests that had "
                      "not finished are marked failed, 'interrupted'.")
    elif run.stopped == "time limit":
        console.print("[yellow]The time limit was reached[/]: the requests still open are marked timeout.")
    if run.num_scrape_errors:
        console.print(f"[yellow]note:[/] {run.num_scrape_errors} scrapes of /metrics failed (last: "
                      f"{run.last_scrape_error})")

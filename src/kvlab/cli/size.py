"""``kvlab size MODEL`` and ``kvlab fit MODEL``: vLLM's KV cache numbers for a model on a GPU, and the reverse.

Options use vLLM's spelling. Kept light: only the catalogue, the sizing arithmetic and Rich are imported.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Annotated, Optional

import typer

from kvlab.catalog import GpuSpec, get_model
from kvlab.catalog.accuracy import estimate_accuracy_clause, kv_token_accuracy
from kvlab.catalog.models import DTYPE_BYTES
from kvlab.cli.app import app
from kvlab.cli.options import JsonOpt, YesOpt, options_template, with_options
from kvlab.config.options import OPTIONS, SIZING_OPTIONS, speculative_method_help
from kvlab.errors import KvlabError
from kvlab.report.setup import printed_size_row_text, utilization_clause
from kvlab.report.text import plural
from kvlab.service.size import at_once_text as _at_once
from kvlab.service.size import max_num_seqs_cap as _max_num_seqs
from kvlab.service.size import running_replicas, sizing_config, start_refusal
from kvlab.sizing import (
    NODE_GPUS,
    SPECULATIVE_METHODS,
    cuda_block_size_note,
    expert_parallel_note,
    fewest_gpus_for_workload,
    fit_sizing,
    gpu_notes,
    kv_layout,
    load_buffer_bytes,
    max_context_len,
    max_num_requests,
    node_gpus,
    quantization_note,
    size_kv_cache,
    valid_tensor_parallel_sizes,
    workload_fit,
    workload_replicas,
)
from kvlab.validate import allow_large_work, check_options

GIB = 2**30

ModelArg = Annotated[str, typer.Argument(help="Catalogue name (see `kvlab models`), a config.json or a folder "
                                             "holding one, or a Hugging Face id.", show_default=False)]
ConcOpt = Annotated[Optional[int], typer.Option("--concurrency", help="Requests that should fit at once.")]
CtxOpt = Annotated[Optional[int], typer.Option(
    "--context-len", help="Tokens per request (prompt + answer; 8k: 8,000, 8K: 8,192, as --max-model-len reads them).")]
# (their help and defaults are the run options' of the same names, declared in kvlab/config/options.py)
VersionOpt = Annotated[Optional[str], typer.Option(
    OPTIONS["vllm_version"].flag, help=OPTIONS["vllm_version"].help, show_default=OPTIONS["vllm_version"].default_text)]
QuantOpt = Annotated[Optional[str], typer.Option(
    OPTIONS["quantization"].flag, "-q", help=OPTIONS["quantization"].help,
    show_default=OPTIONS["quantization"].default_text)]
EagerOpt = Annotated[bool, typer.Option("--enforce-eager", help="No CUDA graphs (vLLM's --enforce-eager).")]
SamplerOpt = Annotated[Optional[str], typer.Option(
    "--sampler", help="Top-k/top-p sampler of vLLM's profiling run, as its log names it: flashinfer or pytorch.",
    show_default="the vLLM version's usual one")]
RunnerOpt = Annotated[Optional[str], typer.Option(
    "--model-runner", help="vLLM's GPU model runner, as VLLM_USE_V2_MODEL_RUNNER sets it: v1 (=0) or v2 (=1); it "
    "decides the sampler's share of the profiling run.", show_default="the one the vLLM version picks for the model")]
# vLLM's --decode-context-parallel-size (-dcp; --dcp-size here, a name that fits the 80-column help): groups of TP
# ranks that each keep every DCP-th token's KV
DcpOpt = Annotated[int, typer.Option(
    "--dcp-size", "-dcp", help="GPUs of a tensor-parallel group that split each request's KV cache by token "
    "(vLLM's decode context parallelism, its --decode-context-parallel-size); must divide --tensor-parallel-size.")]
PrefixOpt = Annotated[Optional[bool], typer.Option(
    "--enable-prefix-caching/--no-enable-prefix-caching", help="vLLM's prefix caching: only a hybrid model's sizing "
    "reads it (its Mamba/linear-attention state keeps more blocks a request with it on, mamba_cache_mode 'align').",
    show_default="vLLM's default: on, for a hybrid model from 0.28.0")]
EpOpt = Annotated[bool, typer.Option(
    "--enable-expert-parallel", "-ep", help="Deal a MoE model's routed experts out whole, E / TP to each GPU, instead "
    "of splitting each expert over the tensor-parallel ranks (vLLM's --enable-expert-parallel).")]

# The options `kvlab size` and `kvlab fit` share (kvlab.service.size.sizing_config's arguments): the ones that decide
# the KV cache, declared once in kvlab/config/options.py. Here the GPU is optional: without one, the per-token numbers.
# --speculative-method: the methods whose cache kvlab sizes (kvlab.sizing.SPECULATIVE_METHODS, which its check reads).
sizing_options = options_template(SIZING_OPTIONS, defaults={"gpu": None},
                                  helps={"speculative_method": speculative_method_help(SPECULATIVE_METHODS)})


def _note(note: str | None, as_json: bool) -> str | None:
    """A sizing note (kvlab.sizing's *_note functions) on stderr, unless the answer is JSON; returned for JSON."""
    if note and not as_json:
        from rich.console import Console

        Console(stderr=True, highlight=False).print(f"note: {note}", style="yellow")
    return note


def _note_block_size(block_size: int, as_json: bool) -> None:
    """A block size vLLM's CUDA backends refuse is sized all the same, with a note on stderr."""
    _note(cuda_block_size_note(block_size), as_json)


def _note_expert_parallel(spec, config, as_json: bool) -> None:
    """--enable-expert-parallel where it changes nothing (sizing.expert_parallel_note), on stderr."""
    _note(expert_parallel_note(spec, config), as_json)


def _note_quantization(spec, quantization: str | None, as_json: bool) -> str | None:
    """--quantization none on a quantized checkpoint (sizing.quantization_note): on stderr, and returned for JSON."""
    return _note(quantization_note(spec, quantization), as_json)


def weight_dtype(options: dict, quantization: str | None, as_json: bool) -> str | None:
    """``--dtype fp8`` asks for FP8 weights, which vLLM spells ``--quantization fp8`` (its --dtype is the
    activations'): sized as that, with a note, rather than refused. Returns the quantization to size with."""
    if options.get("dtype") not in ("fp8", "fp8_e4m3"):
        return quantization
    options["dtype"] = "auto"
    if not as_json:
        from rich.console import Console

        Console(stderr=True, highlight=False).print("note: --dtype fp8 sized as vLLM's --quantization fp8 (FP8 "
                                                    "weights, activations in the checkpoint's dtype)", style="yellow")
    return quantization or "fp8"


# --- formatting ----------------------------------------------------------------------------------------

def b(n: int) -> str:
    return f"{n:,} B"


def gib(n: float) -> str:
    return f"{n / GIB:,.2f} GiB"


def human(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} B"


def _per_token_rows(model, layout, tp: int) -> list[tuple[str, str, str]]:
    """Rows for the per-token numbers; ``layout`` is a KVLayout or a SizingResult (same field names)."""
    kvb, kv_dtype = layout.kv_dtype_bytes, layout.kv_cache_dtype
    if model.is_mla:
        per_token = (f"1 latent (MLA, no separate K and V) x {model.num_attention_layers} layers x "
                     f"({model.kv_lora_rank} kv_lora_rank + {model.qk_rope_head_dim} qk_rope_head_dim) x "
                     f"{kvb} B ({kv_dtype})")
        per_gpu = (f"{layout.num_layers_per_gpu} layers x 1 latent: MLA's latent is not split by tensor "
                   "parallelism")
        page = f"{layout.kv_cache_groups[0].spec.block_size} tokens x {model.kv_head_size} x {kvb} B"
    else:
        per_token = (f"2 (K and V) x {model.num_attention_layers} layers x {model.num_key_value_heads} KV heads x "
                     f"{model.head_dim} head_dim x {kvb} B ({kv_dtype})")
        derived = model.hidden_size // model.num_attention_heads
        if model.head_dim != derived:
            per_token += f"; head_dim from config.json, not hidden_size / heads = {derived}"
        split = f"{model.num_key_value_heads} KV heads / TP {tp}, at least 1" if tp > 1 else "all KV heads"
        attention_layers = round(layout.num_layers_per_gpu * model.num_attention_layers / model.num_hidden_layers)
        per_gpu = f"{attention_layers} layers x {layout.num_kv_heads_per_gpu} KV heads ({split})"
        page = (f"2 x {layout.kv_cache_groups[0].spec.block_size} tokens x {layout.num_kv_heads_per_gpu} heads x "
                f"{model.head_dim} x {kvb} B")
        if model.gemma4 is not None:  # shapes that differ by layer type, and layers keeping no cache
            per_token, per_gpu = model.per_layer_kv_text(kvb, tp)
    if model.state is not None:
        page += ("; a linear-attention/Mamba layer's state padded to the same page (the attention block grown to "
                 "hold it)")
        others = model.num_hidden_layers - model.num_attention_layers - model.num_state_layers
        per_token += (f"; {model.num_state_layers} layers keep a fixed {model.state.kind} state per request instead"
                      + (f" and {others} hold no cache (MLP or MoE only)" if others else ""))
    if model.num_sliding_layers:
        keeping = model.kv_cache_layers  # (Gemma 4: not the layers that read an earlier one's cache)
        sliding = sum(model.layer_types[i] == "sliding_attention" for i in keeping)
        of = "the layers" if len(keeping) == model.num_attention_layers else f"the {len(keeping)} keeping a cache"
        per_token += f"; {sliding} of {of} keep only a {model.sliding_window:,}-token window per request"
    return [
        ("KV cache per token", f"{b(layout.kv_bytes_per_token)} ({human(layout.kv_bytes_per_token)})", per_token),
        ("  per GPU", b(layout.kv_bytes_per_token_per_gpu), per_gpu),
        ("Page (one block, one layer)", b(layout.page_size_bytes), page),
    ]


# Where a catalogue GPU's total memory comes from (kvlab gpus: the source column), in words.
MEMORY_SOURCES = {
    "cuda_reported_observed": "the total CUDA reports, as seen in real logs",
    "cuda_device_query": "the total CUDA's device query reports",
    "marketing_label": "the marketing figure: no CUDA-reported total known",
}


def _weights_row(model, weights_bytes: int, act_bytes: int, tp: int, pp: int,
                 quantization: str | None = None, buffers: str = "") -> tuple[str, str, str]:
    how = model.weights_source(quantization) + f"; the rest at {act_bytes} B a parameter"
    if tp > 1 or pp > 1:
        how += f"; split over TP {tp} x PP {pp} (the heaviest GPU shown)"
    return ("Weights per GPU", gib(weights_bytes), how + buffers)


def _groups_text(result) -> str:
    groups = result.kv_cache_groups
    if len(groups) == 1:
        g = groups[0]
        kind = {"mla": "MLA", "full_attention": "full-attention", "sliding_attention": "sliding-window"}[g.spec.kind]
        return f"1 KV cache group: all {len(g.layers)} layers are {kind}"
    counts: dict[str, list[int]] = {}
    for g in groups:
        counts.setdefault(g.spec.kind, []).append(len(g.layers))
    parts = [f"{len(v)} {k.replace('_attention', '')} group{'s' if len(v) > 1 else ''} of up to {max(v)} layers"
             for k, v in counts.items()]
    return f"{len(groups)} KV cache groups (hybrid model, vLLM's grouping): " + ", ".join(parts)


def _per_request_text(result) -> str:
    in_flight, dcp = result.max_in_flight_tokens, result.decode_context_parallel_size
    length = -(result.max_model_len // -dcp)  # each GPU of a DCP group keeps every DCP-th token
    terms: dict[tuple[str, int], int] = {}
    for g in result.kv_cache_groups:
        blocks = g.spec.max_num_blocks_per_request(length, in_flight)
        if g.spec.kind == "mamba":
            text = f"state: {blocks} block{'s' if blocks > 1 else ''}"  # (_state_blocks_text says why)
        elif g.spec.kind == "sliding_attention":
            w = g.spec.sliding_window
            text = (f"sliding: ceil(min({w:,} - 1 + {in_flight:,} in flight, {length:,}) / {g.spec.block_size}) + 1 = "
                    f"{blocks:,}")
        else:
            text = f"{'MLA' if g.spec.kind == 'mla' else 'full'}: ceil({length:,} / {g.spec.block_size}) = {blocks:,}"
        terms[(text, blocks)] = terms.get((text, blocks), 0) + 1
    if len(terms) == 1 and sum(terms.values()) == 1:
        text = next(iter(terms))[0].split(": ", 1)[1]
    else:
        sums = " + ".join(f"{n} x {v:,}" if n > 1 else f"{v:,}" for (_, v), n in terms.items())
        text = ("; ".join(f"{n} groups x ({t})" if n > 1 else t for (t, _), n in terms.items())
                + f"; in all {sums} = {sum(n * v for (_, v), n in terms.items()):,}")
    if dcp == 1:
        return text
    return (f"its {result.max_model_len:,} tokens over DCP {dcp}: ceil({result.max_model_len:,} / {dcp}) = {length:,} "
            "on each GPU; " + text)


def _state_blocks_count(result) -> str:
    return f"{next(g.spec.state_blocks for g in result.kv_cache_groups if g.spec.kind == 'mamba'):,}"


def _state_blocks_text(result) -> str:
    """Why a hybrid's state groups take the blocks they do a request: prefix caching's mamba_cache_mode
    (kvlab.vllm_rules.mamba_cache_mode) and what each mode keeps (mamba_state_blocks)."""
    spec = next(g.spec for g in result.kv_cache_groups if g.spec.kind == "mamba")
    spec_tokens = result.num_speculative_tokens if result.speculative_method else 0
    parts = ["1 running state"] + ([f"{spec_tokens} for the draft tokens"] if spec_tokens else [])
    if result.mamba_cache_mode == "align":
        parts.append("1 for the last block boundary's state")
        extra = spec.state_blocks - 2 - spec_tokens
        if extra:
            parts.append(f"{extra} prefill checkpoint (Mamba2, from vLLM 0.32.0)")
    mode = {"none": "mamba_cache_mode 'none'", "align": "mamba_cache_mode 'align'"}[result.mamba_cache_mode]
    fewer = spec.state_blocks - 1 - spec_tokens
    tail = (f" (--no-enable-prefix-caching: {plural(fewer, 'block')} fewer a group; prefix-cache hits, which "
            "share blocks, are not counted here)" if result.mamba_cache_mode == "align" else "")
    return f"in each state group: {' + '.join(parts)}; {mode}: {result.mamba_cache_mode_why}{tail}"


def size_rows(model, result, gpu) -> list[tuple[str, str, str]]:
    rows = _per_token_rows(model, result, result.tensor_parallel_size)
    drafter = (f" (with the MTP drafter's {result.drafter_layers}: --speculative-method mtp, "
               f"{result.num_speculative_tokens} draft token{'s' if result.num_speculative_tokens > 1 else ''} a step)"
               if result.drafter_layers else "")
    rows.append(("Block (all layers of a group)", b(result.bytes_per_block),
                 f"{result.bytes_per_block // result.page_size_bytes} layers{drafter} x {result.page_size_bytes:,} B; "
                 + _groups_text(result)))
    act = DTYPE_BYTES[result.dtype]
    buffers = load_buffer_bytes(model, result.vllm_version or None, result.max_num_batched_tokens, act)[1]
    drafter_weights = f" + {result.drafter_weights}" if result.drafter_weights else ""
    rows.append(_weights_row(model, result.weights_bytes, act, result.tensor_parallel_size,
                             result.pipeline_parallel_size, result.quantization, drafter_weights + buffers))
    if result.requested_memory_bytes is not None:
        where = f"{gpu.id}, {MEMORY_SOURCES.get(gpu.memory_bytes_source, gpu.memory_bytes_source.replace('_', ' '))}" \
            if gpu else "--gpu-memory-gib"
        rows.append(("GPU memory requested", gib(result.requested_memory_bytes),
                     f"{gib(result.gpu_memory_bytes)} ({where}) x {result.gpu_memory_utilization} "
                     "gpu_memory_utilization"))
    terms = {t.name: t for t in result.profile_terms}
    for name, label in (("peak activation", "Peak activation"), ("non-torch", "Non-torch memory"),
                        ("CUDA graphs", "CUDA graphs")):
        rows.append((label, gib(terms[name].bytes), terms[name].source))
    if result.available_kv_source == "given":
        budget = "given with --available-kv-gib (vLLM's own 'Available KV cache memory')"
    else:
        budget = (f"{gib(result.requested_memory_bytes)} requested - {gib(result.weights_bytes)} weights - "
                  f"{gib(result.activation_bytes)} activation - {gib(result.non_torch_bytes)} non-torch - "
                  f"{gib(result.cuda_graph_bytes)} CUDA graphs")
    rows.append(("KV cache budget", gib(result.available_kv_bytes), budget))
    rows.append(("Blocks", f"{result.num_blocks:,}",
                 f"{result.available_kv_bytes:,} B // {result.bytes_per_block:,} B per block"
                 + (f"; {result.binding_stage_text}" if result.binding_stage_text else "")))
    rows.append(("Blocks per request", f"{result.blocks_per_request:,}",
                 f"one {result.max_model_len:,}-token request (max_model_len): " + _per_request_text(result)))
    if result.mamba_cache_mode:
        rows.append(("State blocks", _state_blocks_count(result), _state_blocks_text(result)))
    rows.append(("GPU KV cache size", f"{result.num_tokens:,} tokens", printed_size_row_text(result)))
    rows.append(("Max concurrency", f"{result.max_concurrency:.2f}x",
                 f"{result.num_blocks:,} blocks / {result.blocks_per_request:,} blocks per request"))
    return rows


def _table(rows):
    from rich.table import Table

    table = Table(show_header=True, box=None, pad_edge=False, padding=(0, 2, 0, 0))
    table.add_column("", style="bold", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("where it comes from", style="dim")
    for row in rows:
        table.add_row(*row)
    return table


SPLIT_MARKS = (("weights", "█", "blue"), ("KV cache", "▓", "green"), ("other", "░", "grey50"))


def _split_bar(split: dict, width: int = 36) -> str:
    """The split as a bar whose parts differ in shape as well as colour, so it reads when piped or printed."""
    weights = round(split["weights_share"] * width)
    kv = round(split["kv_cache_share"] * width)
    other = max(0, width - weights - kv)
    bar = "".join(f"[{colour}]{mark * n}[/]" for (_, mark, colour), n in zip(SPLIT_MARKS, (weights, kv, other)))
    legend = "  ".join(f"[{colour}]{mark}[/] {name}" for name, mark, colour in SPLIT_MARKS)
    return f"{bar}  {legend}"


def _title(model, gpu, config, result=None) -> str:
    where = gpu.id if gpu else (f"a {gib(config.gpu_memory_bytes)} GPU" if config.gpu_memory_bytes else "any GPU")
    count = config.tensor_parallel_size * config.pipeline_parallel_size
    text = f"[bold]{model.id}[/]" + (f" ({model.hf_repo})" if model.hf_repo and model.hf_repo != model.id else "")
    text += f" on {count} x {where}" if count > 1 else f" on {where}"
    text += f" · TP {config.tensor_parallel_size} · PP {config.pipeline_parallel_size}"
    if config.decode_context_parallel_size > 1:
        text += f" · DCP {config.decode_context_parallel_size}"
    if config.enable_expert_parallel:
        text += " · EP"
    if result is not None:
        # (the weights' format as vLLM's config line names it: --quantization, else the checkpoint's own)
        weights = result.quantization or model.quantization
        text += (f" · {result.dtype}{f' · quantization {weights}' if weights else ''} · KV {result.kv_cache_dtype} · "
                 f"block_size {result.block_size} · max_model_len {result.max_model_len:,}")
        text += (f"\nvLLM {result.vllm_version}'s rules (those of {result.vllm_rules_since} on"
                 f"{', the newest kvlab knows' if config.vllm_version is None else ''}; docs/sizing.md)")
    return text


def _fit_verb(n: int, noun: str) -> str:
    """'1 request fits', '3 requests fit'."""
    return f"{plural(n, noun)} {'fits' if n == 1 else 'fit'}"


def _workload_dict(fit, cap: tuple[int, str]) -> dict:
    """WorkloadFit.to_dict, with vLLM's cap on the requests running at once and how many of these it runs."""
    return {**fit.to_dict(), "max_num_seqs": cap[0], "num_running_at_once": min(fit.num_requests, cap[0])}


def _print_workload(console, fit, cap: tuple[int, str]) -> None:
    from rich.text import Text

    def item(markup: str) -> None:  # wrapped lines stay under the first one, not at the margin
        for line in Text.from_markup(markup).wrap(console, max(20, console.width - 2)):
            line.rstrip()
            console.print(Text("  ") + line)

    spare = gib(abs(fit.spare_blocks) * fit.bytes_per_block)
    console.print(f"\n[bold]Workload:[/] {plural(fit.num_requests, 'request')} x {fit.context_len:,} tokens")
    item(f"needs {plural(fit.num_blocks_needed, 'block')} ({fit.num_requests:,} x {fit.blocks_per_request:,}) = "
         f"{gib(fit.kv_bytes_needed)} per GPU; the cache holds {plural(fit.num_usable_blocks, 'usable block')} "
         f"({gib(fit.kv_bytes_usable)}; one block is vLLM's null block)")
    over = (f"; [yellow]but {_at_once(cap)}: the other {fit.num_requests - cap[0]:,} wait in its queue[/]"
            if fit.num_requests > cap[0] else "")
    if fit.fits:
        room = plural(fit.max_num_requests - fit.num_requests, "more request")
        beyond = f", though {_at_once(cap)}" if fit.max_num_requests > cap[0] and not over else ""
        item(f"[green]fits[/] in the KV cache, with {plural(fit.spare_blocks, 'block')} ({spare}) to spare: room for "
             f"{room} of this length{beyond}{over}")
    else:
        item(f"[red]does not fit[/]: {plural(-fit.spare_blocks, 'block')} ({spare}) short{over}")
    each = (f"{_fit_verb(fit.num_requests, 'request')} up to {fit.max_context_len:,} tokens each"
            if fit.max_context_len else f"{plural(fit.num_requests, 'request')} do not fit at any length")
    item(f"at {fit.context_len:,} tokens at most {_fit_verb(fit.max_num_requests, 'request')}; {each}")


@app.command()
@with_options(sizing_options)
def size(
    ctx: typer.Context,
    model: ModelArg,
    concurrency: ConcOpt = None,
    context_len: CtxOpt = None,
    vllm_version: VersionOpt = None,
    quantization: QuantOpt = None,
    enforce_eager: EagerOpt = False,
    sampler: SamplerOpt = None,
    model_runner: RunnerOpt = None,
    decode_context_parallel_size: DcpOpt = 1,
    enable_expert_parallel: EpOpt = False,
    enable_prefix_caching: PrefixOpt = None,
    as_json: JsonOpt = False,
    yes: YesOpt = False,
    **options,
) -> None:
    """The KV cache vLLM would allocate for MODEL, the lines it would print, and where each number comes from.

    Exit status 1, after the answer, where vLLM would refuse to start (one max_model_len request does not fit)."""
    check_options({"concurrency": concurrency, "context_len": context_len})
    with allow_large_work(yes):
        spec = get_model(model)
    quantization = weight_dtype(options, quantization, as_json)
    gpu_spec, config = sizing_config(**options, vllm_version=vllm_version, quantization=quantization,
                                    enforce_eager=enforce_eager, sampler=sampler, model_runner=model_runner,
                                    decode_context_parallel_size=decode_context_parallel_size,
                                    enable_expert_parallel=enable_expert_parallel,
                                    mtp_layers=spec.num_nextn_predict_layers)
    config = replace(config, enable_prefix_caching=enable_prefix_caching)
    _note_block_size(config.block_size, as_json)
    _note_expert_parallel(spec, config, as_json)
    quantized = _note_quantization(spec, quantization, as_json)
    if config.gpu_memory_bytes is None and config.available_kv_bytes is None:
        _print_layout_only(spec, config, kv_layout(spec, config), as_json)
        return
    result = _size_or_refuse(spec, gpu_spec, config)
    fit = None
    if concurrency is not None or context_len is not None:
        fit = workload_fit(spec, config, concurrency or 1, context_len or result.max_model_len)
    if as_json:
        data = result.to_dict()
        data["model"] = {"id": spec.id, "hf_repo": spec.hf_repo, "origin": spec.origin, "attention": spec.attention}
        data["estimate_note"] = ("activation_bytes, non_torch_bytes and cuda_graph_bytes are kvlab's estimate; "
                                 "vLLM measures them at startup")
        if result.available_kv_source == "estimated":
            data["estimate_accuracy"] = kv_token_accuracy()
        data["profile_terms"] = [{"name": t.name, "bytes": t.bytes, "source": t.source} for t in result.profile_terms]
        data["workload"] = _workload_dict(fit, _max_num_seqs(config)) if fit else None
        data["gpu_notes"] = gpu_notes(spec, config)
        data["model_notes"] = model_notes(spec, None)
        data["quantization_note"] = quantized
        typer.echo(json.dumps(data, indent=1))
    else:
        given = ctx.get_parameter_source("gpu_memory_utilization").name != "DEFAULT"
        _print_size(spec, gpu_spec, config, result, fit, "" if given else _utilization_note(config))
    if not result.fits_max_model_len:  # (vLLM's own check refuses to start: a script can tell from the status)
        raise typer.Exit(1)


def _size_or_refuse(spec, gpu_spec, config):
    """size_kv_cache, whose refusal of memory (the GPU cannot hold the model: kvlab.sizing.raise_too_small) `kvlab
    size` extends with `kvlab fit`'s fewest GPUs with pipeline stages, where tensor parallelism alone does not start
    the model at its max_model_len: searched once, here, on that refusal only (not in raise_too_small: the lab's
    calculator sizes many times over, and took 70 s with the search there)."""
    try:
        return size_kv_cache(spec, config)
    except KvlabError as refusal:
        staged = _pipelined_hint(spec, gpu_spec, config)
        if staged is None:
            raise
        raise KvlabError(f"{refusal}; {staged}") from None


def _tensor_parallel_starts(spec, config) -> bool:
    """Whether the smallest larger tensor-parallel size within a node whose GPUs hold the model (the refusal's own first
    hint) also starts it at its max_model_len."""
    from dataclasses import replace

    for tp in valid_tensor_parallel_sizes(spec, config.decode_context_parallel_size,
                                          expert_parallel=config.enable_expert_parallel):
        if tp <= config.tensor_parallel_size or tp > node_gpus(config.gpu_name):
            continue
        try:
            return size_kv_cache(spec, replace(config, tensor_parallel_size=tp)).fits_max_model_len
        except KvlabError:
            continue
    return False


def _pipelined_hint(spec, gpu_spec, config) -> str | None:
    """A refusal of memory on a --gpu without pipeline stages, where tensor parallelism alone does not start the model
    at its max_model_len: the fewest GPUs with tensor and pipeline parallelism that do (kvlab.service.size's
    fewest_pipelined, `kvlab fit`'s answer), as flags. None otherwise: a refusal before memory is sized (kv_layout's:
    a tensor-parallel size the model does not divide by, ...), or where the fewest need no stages."""
    from kvlab.service.size import fewest_pipelined

    if gpu_spec is None or config.pipeline_parallel_size != 1:
        return None
    try:
        kv_layout(spec, config)  # (its refusals are not of memory: stages do not help)
    except KvlabError:
        return None
    if _tensor_parallel_starts(spec, config):
        return None
    try:
        found = fewest_pipelined(spec, gpu_spec, config, None)
    except KvlabError:
        return None
    if found is None or found[1] == 1:
        return None
    tp, pp, result = found
    return (f"with pipeline stages too (`kvlab fit`'s fewest GPUs): --tensor-parallel-size {tp} "
            f"--pipeline-parallel-size {pp} ({tp * pp} x this GPU) at the full {result.max_model_len:,} tokens")


def _accuracy() -> str:
    """", <how far the estimate was off on the corpus of real logs>" (kvlab.catalog.accuracy), or nothing where
    nothing is stored."""
    clause = estimate_accuracy_clause()
    return f": {clause}" if clause else ""


def model_notes(spec, config) -> list[str]:
    """The notes size and fit print of the model: a family kvlab has not checked (kvlab.catalog.models.
    unchecked_family_note) and, with ``config``, the GPU's (kvlab.sizing.gpu_notes)."""
    from kvlab.catalog.models import unchecked_family_note

    said = [note] if (note := unchecked_family_note(spec)) else []
    return said + (gpu_notes(spec, config) if config is not None else [])


def _utilization_note(config) -> str:
    """With --gpu-memory-utilization not given: where the version's vLLM defaults to another than kvlab's (0.92 from
    0.20.0, kvlab.report.setup.utilization_clause, which run, race and capacity say too), what kvlab took and what
    that vLLM would; else ''."""
    from kvlab.vllm_rules import default_gpu_memory_utilization

    clause = utilization_clause(config.gpu_memory_utilization, config.vllm_version)
    if not clause:
        return ""
    return (f"at {clause}: pass --gpu-memory-utilization {default_gpu_memory_utilization(config.vllm_version):g} for "
            "what it starts with unless told")


def _print_size(spec, gpu_spec, config, result, fit, utilization_note: str = "") -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console(highlight=False)
    console.print(_title(spec, gpu_spec, config, result))
    for note in model_notes(spec, config):
        console.print(f"[yellow]note: {escape(note)}[/]")
    console.print(_table(size_rows(spec, result, gpu_spec)))
    console.print("\n[bold]vLLM would print[/]" + (f" (the budget is kvlab's estimate{_accuracy()}; pass "
                                                    "--available-kv-gib with vLLM's figure for its exact count)"
                                                    if result.available_kv_source == "estimated" else ""))
    if utilization_note and result.available_kv_source == "estimated":
        console.print(f"[yellow]{utilization_note}[/]")
    for line in result.vllm_log_lines:
        console.print(f"  {line}", markup=False)
    refusal = start_refusal(result)
    if refusal:
        console.print(f"[yellow]{refusal}[/]")
    split = result.memory_split
    if split:
        console.print(f"\n[bold]Memory of one GPU[/] (the paper's Figure 1), of {gib(split['gpu_memory_bytes'])}: "
                      f"[blue]weights {split['weights_share']:.1%}[/] · "
                      f"[green]KV cache {split['kv_cache_share']:.1%}[/] · other {split['other_share']:.1%} "
                      f"(activations, non-torch, the {1 - result.gpu_memory_utilization:.0%} vLLM leaves "
                      "unrequested, the part-block left over)")
        console.print("  " + _split_bar(split))
    if fit:
        _print_workload(console, fit, _max_num_seqs(config))


def _print_layout_only(spec, config, layout, as_json: bool) -> None:
    """No GPU and no budget: the per-token numbers, which need neither."""
    if as_json:
        typer.echo(json.dumps({
            "model": {"id": spec.id, "hf_repo": spec.hf_repo, "origin": spec.origin, "attention": spec.attention},
            "kv_bytes_per_token": layout.kv_bytes_per_token,
            "kv_bytes_per_token_per_gpu": layout.kv_bytes_per_token_per_gpu,
            "page_size_bytes": layout.page_size_bytes, "weights_bytes": layout.weights_bytes,
            "max_model_len": layout.max_model_len, "available_kv_bytes": None, "num_blocks": None,
            "num_tokens": None, "max_concurrency": None,
            "note": "give --gpu, --gpu-memory-gib or --available-kv-gib for the budget, blocks and tokens",
        }, indent=1))
        return
    from rich.console import Console

    console = Console(highlight=False)
    console.print(_title(spec, None, config) + f" · {layout.dtype} · KV {layout.kv_cache_dtype}")
    rows = _per_token_rows(spec, layout, config.tensor_parallel_size)
    buffers = load_buffer_bytes(spec, config.vllm_version, config.resolved_max_num_batched_tokens,
                                layout.act_dtype_bytes)[1]
    rows.append(_weights_row(spec, layout.weights_bytes, layout.act_dtype_bytes, config.tensor_parallel_size,
                             config.pipeline_parallel_size, buffers=buffers))
    one = layout.kv_bytes_per_token_per_gpu * layout.max_model_len
    rows.append((f"One {layout.max_model_len:,}-token request", gib(one), "KV cache per token per GPU x max_model_len"
                 + (" (sliding layers need less)" if spec.num_sliding_layers else "")))
    console.print(_table(rows))
    console.print("\nGive --gpu NAME, --gpu-memory-gib X or --available-kv-gib X for the budget, blocks, "
                  "GPU KV cache size and maximum concurrency vLLM would print.")


@app.command()
@with_options(sizing_options)
def fit(
    ctx: typer.Context,
    model: ModelArg,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Requests at once, for the longest context.")] = 1,
    context_len: CtxOpt = None,
    vllm_version: VersionOpt = None,
    quantization: QuantOpt = None,
    enforce_eager: EagerOpt = False,
    sampler: SamplerOpt = None,
    model_runner: RunnerOpt = None,
    decode_context_parallel_size: DcpOpt = 1,
    enable_expert_parallel: EpOpt = False,
    enable_prefix_caching: PrefixOpt = None,
    as_json: JsonOpt = False,
    yes: YesOpt = False,
    **options,
) -> None:
    """The reverse questions: longest context for N requests, most requests at a length, fewest GPUs for MODEL.

    Answered at a configuration vLLM starts with; exit status 2, with one line, where the settings given leave none.

    Exit status 2 too where not one token each fits --concurrency requests (--context-len adds the GPUs that do)."""
    check_options({"concurrency": concurrency, "context_len": context_len})
    with allow_large_work(yes):
        spec = get_model(model)
    quantization = weight_dtype(options, quantization, as_json)
    gpu_spec, config = sizing_config(**options, vllm_version=vllm_version, quantization=quantization,
                                    enforce_eager=enforce_eager, sampler=sampler, model_runner=model_runner,
                                    decode_context_parallel_size=decode_context_parallel_size,
                                    enable_expert_parallel=enable_expert_parallel,
                                    search_tensor_parallel=True, mtp_layers=spec.num_nextn_predict_layers)
    config = replace(config, enable_prefix_caching=enable_prefix_caching)
    _note_block_size(config.block_size, as_json)
    _note_expert_parallel(spec, config, as_json)
    quantized = _note_quantization(spec, quantization, as_json)
    if config.gpu_memory_bytes is None and config.available_kv_bytes is None:
        raise KvlabError("give --gpu NAME, --gpu-memory-gib X or --available-kv-gib X: the reverse questions need "
                         "a memory budget")
    target = _target_gpu(gpu_spec, config) if config.gpu_memory_bytes is not None else None
    sized = fit_sizing(spec, config, target, options["tensor_parallel_size"] is not None, context_len)
    config, result, notes = sized.config, sized.result, model_notes(spec, None) + list(sized.notes)
    answers: dict = {"model": spec.id, "gpu": gpu_spec.id if gpu_spec else None, "quantization_note": quantized}
    if target is not None:
        answers["fewest_gpus"] = _fewest_gpus(sized.fewest, target, config)
        answers["fewest_gpus_pipelined"] = _fewest_gpus_pipelined(spec, target, config, answers["fewest_gpus"])
    answers["notes"] = notes
    longest = max_context_len(spec, config, concurrency)
    if longest == 0 and not context_len:
        _refuse_concurrency(spec, config, result, concurrency)
    length = context_len or result.max_model_len
    most = max_num_requests(spec, config, length)
    answers["tensor_parallel_size"] = config.tensor_parallel_size
    # (what caps the longest context where memory does not: the model, or the --max-model-len given)
    capped_by = ("max_position_embeddings" if longest == spec.max_position_embeddings else
                 "max_model_len" if longest == options["max_model_len"] else None)
    answers["max_context_len"] = {"num_requests": concurrency, "context_len": longest, "capped_by": capped_by,
                                  "max_position_embeddings": spec.max_position_embeddings}
    if longest == 0:  # (not even one token each: how many requests of one token do fit)
        answers["max_context_len"]["max_num_requests_of_one_token"] = max_num_requests(spec, config, 1)
    answers["max_num_requests"] = {"context_len": length, "num_requests": most}
    cap = _max_num_seqs(config)
    answers["max_num_seqs"] = {"max_num_seqs": cap[0], "source": "given" if config.max_num_seqs is not None else
                               "vLLM's default"}
    answers["workload"] = _workload_dict(workload_fit(spec, config, concurrency, context_len), cap) if context_len else None
    if context_len:
        answers["workload_gpus"] = _workload_gpus(spec, gpu_spec, config, concurrency, context_len)
    answers["sizing"] = {k: v for k, v in result.to_dict().items() if k in (
        "kv_bytes_per_token", "kv_bytes_per_token_per_gpu", "page_size_bytes", "weights_bytes", "available_kv_bytes",
        "available_kv_source", "num_blocks", "num_tokens", "max_concurrency", "max_model_len")}
    if result.available_kv_source == "estimated":
        answers["estimate_accuracy"] = kv_token_accuracy()
    if as_json:
        typer.echo(json.dumps(answers, indent=1))
        return
    if (result.available_kv_source == "estimated" and ctx.get_parameter_source("gpu_memory_utilization").name == "DEFAULT"
            and (note := _utilization_note(config))):
        notes.append(note)  # (as `kvlab size` says it: trial 61, finding 8)
    _print_fit(spec, gpu_spec, config, result, answers, notes, concurrency, context_len)


def _refuse_concurrency(spec, config, result, concurrency: int) -> None:
    """Not even one token each fits ``concurrency`` requests: fit's help promises exit 2 with one line (trial 55,
    finding 6), naming the most requests of one token the cache holds."""
    one = max_num_requests(spec, config, 1)
    raise KvlabError(f"--concurrency {concurrency:,}: not even one token each fits in the KV cache "
                     f"({result.num_usable_blocks:,} usable blocks of {result.block_size} tokens per GPU); valid: up to "
                     f"{one:,} requests, or add --context-len N for the GPUs that would hold {concurrency:,}")


def _target_gpu(gpu_spec, config):
    """The GPU the reverse questions size on: --gpu's, or one of --gpu-memory-gib's memory."""
    return gpu_spec or GpuSpec(id=f"{gib(config.gpu_memory_bytes)} GPU", memory_bytes=config.gpu_memory_bytes,
                               memory_bytes_source="given", memory_bandwidth_bytes_per_s=None, peak_flops=None)


def _workload_gpus(spec, gpu_spec, config, num_requests: int, context_len: int) -> dict:
    """The fewest GPUs whose KV caches hold the workload at once and whose engines run it at once (as replicas x TP x
    PP: each runs at most max_num_seqs, service.size.running_replicas), and the replicas at the asked
    tensor-parallel size. On a GPU's memory every tensor-parallel size that starts is tried; a given KV budget
    (--available-kv-gib) is per GPU at the asked parallelism, so only that one is."""
    gpu = _target_gpu(gpu_spec, config) if config.available_kv_bytes is None else None
    cap = _max_num_seqs(config)
    options = running_replicas(workload_replicas(spec, config, num_requests, context_len, gpu), cap[0])
    fewest = fewest_gpus_for_workload(options)
    asked = fewest_gpus_for_workload(running_replicas(  # (config's size only)
        workload_replicas(spec, config, num_requests, context_len), cap[0]))

    def described(o) -> dict | None:
        return None if o is None else {**o.to_dict(), "max_num_seqs": cap[0],
                                       "num_running_per_replica": min(o.max_num_requests, cap[0])}

    return {"fewest": described(fewest), "at_tensor_parallel_size": described(asked),
            "gpu": None if gpu is None else gpu.id, "max_num_seqs_source": cap[1]}


def _print_workload_gpus(console, answer: dict, num_gpus: int) -> None:
    """The workload needs more GPUs than the asked replica's ``num_gpus``: the fewest whose KV caches hold it at
    once and whose engines run it at once (max_num_seqs each: trial 55, finding 2), and the replicas at the asked
    parallelism."""
    def replicas(o: dict) -> str:
        parallel = f"TP {o['tensor_parallel_size']}" + (f" x PP {o['pipeline_parallel_size']}"
                                                         if o["pipeline_parallel_size"] > 1 else "")
        each = "its KV cache holds" if o["num_replicas"] == 1 else "each KV cache holds"
        runs = (f"; each runs at most {o['max_num_seqs']:,} at once, {answer['max_num_seqs_source']}"
                if o["max_num_requests"] > o["max_num_seqs"] else "")
        return f"{plural(o['num_replicas'], 'replica')} x {parallel} ({each} {o['max_num_requests']:,} of them{runs})"

    fewest, asked = answer["fewest"], answer["at_tensor_parallel_size"]
    if fewest is None:
        console.print("  [red]memory alone:[/] no replica on this GPU holds one request of this length")
        return
    def gpus(o: dict) -> str:
        return f"{o['num_gpus']:,} x {answer['gpu']}" if answer["gpu"] else plural(o["num_gpus"], "GPU")

    n = f"{fewest['num_requests']:,}"
    need = (f"[bold]memory alone needs more than {plural(num_gpus, 'GPU')}:[/] the fewest whose KV caches hold the {n} "
            "requests at once" if fewest["max_num_requests"] <= fewest["max_num_seqs"] else
            f"[bold]running all {n} at once needs more than {plural(num_gpus, 'GPU')}:[/] the fewest whose KV caches "
            "hold them and whose max_num_seqs runs them all")
    console.print(f"  {need}: {gpus(fewest)}, {replicas(fewest)}")
    if asked is not None and asked != fewest:
        console.print(f"  at --tensor-parallel-size {asked['tensor_parallel_size']}: {gpus(asked)}, {replicas(asked)}")


def _fewest_gpus(fewest, target, config) -> dict | None:
    """`fit`'s fewest GPUs that hold the weights and one max_model_len request (None where none do)."""
    if fewest is None:
        return None
    tp, result = fewest
    return {"tensor_parallel_size": tp, "pipeline_parallel_size": config.pipeline_parallel_size,
            "num_gpus": tp * config.pipeline_parallel_size, "gpu": target.id, "max_model_len": result.max_model_len,
            "num_tokens": result.num_tokens, "max_concurrency": result.max_concurrency}


def _fewest_gpus_pipelined(spec, target, config, fewest: dict | None) -> dict | None:
    """`fit`'s fewest GPUs with pipeline parallelism as well (tensor parallelism within a node), where
    --pipeline-parallel-size was not given and it differs from tensor parallelism alone's: fewer GPUs, or as many
    without tensor parallelism across nodes."""
    from kvlab.service.size import fewest_pipelined

    if fewest is not None:  # (at tensor parallelism alone's length, not the one the other answers were lowered to)
        config = replace(config, max_model_len=fewest["max_model_len"])
    found = fewest_pipelined(spec, target, config, None if fewest is None else fewest["num_gpus"])
    if found is None:
        return None
    tp, pp, result = found
    return {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "num_gpus": tp * pp, "gpu": target.id,
            "max_model_len": result.max_model_len, "num_tokens": result.num_tokens,
            "max_concurrency": result.max_concurrency, "node_gpus": NODE_GPUS}


def _print_fewest(console, answers: dict) -> None:
    """`fit`'s "Fewest GPUs" lines: tensor parallelism alone (at the --pipeline-parallel-size given), and with
    pipeline stages too where that differs."""
    def held(f: dict) -> str:
        parallel = f"--tensor-parallel-size {f['tensor_parallel_size']}" + (
            f" --pipeline-parallel-size {f['pipeline_parallel_size']}" if f["pipeline_parallel_size"] > 1 else "")
        return (f"{f['num_gpus']} x {f['gpu']} ({parallel}) hold the weights and one {f['max_model_len']:,}-token "
                f"request (GPU KV cache size {f['num_tokens']:,} tokens, {f['max_concurrency']:.2f}x")

    f, piped = answers.get("fewest_gpus"), answers.get("fewest_gpus_pipelined")
    if f:
        label = ("Fewest GPUs" if piped is None and f["pipeline_parallel_size"] == 1 else
                 "Fewest GPUs with tensor parallelism alone" if f["pipeline_parallel_size"] == 1 else
                 f"Fewest GPUs at --pipeline-parallel-size {f['pipeline_parallel_size']}")
        console.print(f"\n[bold]{label}:[/] {held(f)})")
    if piped:
        console.print(f"{'' if f else chr(10)}[bold]Fewest GPUs with pipeline parallelism too:[/] {held(piped)}; "
                      f"tensor parallelism within {piped['node_gpus']} GPUs, a node's usual count: the catalogue "
                      "has no node sizes)")


def _print_fit(spec, gpu_spec, config, result, answers: dict, notes: list[str], concurrency: int,
               context_len: int | None) -> None:
    longest = answers["max_context_len"]["context_len"]
    length, most = answers["max_num_requests"]["context_len"], answers["max_num_requests"]["num_requests"]
    from rich.console import Console

    console = Console(highlight=False)
    console.print(_title(spec, gpu_spec, config, result))
    for note in notes:
        console.print(f"[dim]({note})[/]")
    budget = "given" if result.available_kv_source == "given" else f"kvlab's estimate{_accuracy()}"
    console.print(f"KV cache: {result.num_blocks:,} blocks of {result.block_size} tokens ({gib(result.kv_cache_bytes)}"
                  f" per GPU, budget {budget}); {result.num_usable_blocks:,} usable")
    _print_fewest(console, answers)
    capped = {"max_position_embeddings": " (the model's max_position_embeddings)",
              "max_model_len": f" (the --max-model-len given: vLLM rejects a longer request; the model takes up to "
                               f"{spec.max_position_embeddings:,})"}.get(answers["max_context_len"]["capped_by"], "")
    none = answers["max_context_len"].get("max_num_requests_of_one_token")
    cap = _max_num_seqs(config)
    over = f"; {_at_once(cap)}" if concurrency > cap[0] and none is None else ""
    console.print(f"[bold]Longest context for {concurrency:,} concurrent request{'s' if concurrency > 1 else ''}:[/] "
                  + (f"{longest:,} tokens{capped}{over}" if none is None
                     else f"none: at most {none:,} requests of one token fit"))
    console.print(f"[bold]Most concurrent requests at {length:,} tokens:[/] "
                  + (f"{most:,} fit in the KV cache; {_at_once(cap)}" if most > cap[0] else f"{most:,}"))
    if context_len:
        fit = workload_fit(spec, config, concurrency, context_len)
        _print_workload(console, fit, cap)
        if not fit.fits:
            _print_workload_gpus(console, answers["workload_gpus"], config.world_size)

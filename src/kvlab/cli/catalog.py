"""``kvlab models`` and ``kvlab gpus``: the catalogue as Rich tables or JSON."""

from __future__ import annotations

import json

import typer

from kvlab.catalog import list_gpus, list_models
from kvlab.catalog.gpus import ambiguous_aliases, catalogued
from kvlab.cli.app import app
from kvlab.report.text import compact_table

GIB = 2**30


def _print_json(data) -> None:
    typer.echo(json.dumps(data, indent=1))


WideOpt = typer.Option(False, "--wide", help="Every column (layer kinds, experts, dtype); the default fits 80 "
                       "columns.")


@app.command()
def models(as_json: bool = typer.Option(False, "--json", help="Print the catalogue as JSON."),
           wide: bool = WideOpt) -> None:
    """The models kvlab knows, with the numbers that size their KV cache and where they come from."""
    specs = list_models()
    if as_json:
        _print_json([model_dict(m) for m in specs])
        return
    from rich.console import Console

    table = compact_table("kvlab models (`kvlab size MODEL` for more)")
    headers = [("model", "left"), ("attn", "left"), ("layers", "right"), ("heads\nq/kv", "right"),
               ("head\ndim", "right"), ("KV B/token\n(dtype)", "right"), ("params", "right"),
               ("max ctx\ntokens", "right")]
    if wide:
        headers += [("sliding layers", "left"), ("experts\nactive/all", "right"), ("dtype", "left")]
    for header, justify in headers:
        table.add_column(header, justify=justify, no_wrap=True)
    for m in specs:
        head_dim = f"{m.kv_lora_rank}+{m.qk_rope_head_dim}" if m.is_mla else str(m.head_dim)
        attention = m.attention + ("·MoE" if m.is_moe else "") + ("·SW" if m.num_sliding_layers else "")
        row = [m.id, attention, str(m.num_hidden_layers), f"{m.num_attention_heads}/{m.num_kv_heads_cached}",
               head_dim, f"{m.kv_bytes_per_token(m.dtype_bytes):,}", f"{m.num_params / 1e9:.1f}B",
               _tokens(m.max_position_embeddings)]
        if wide:
            sliding = f"{m.num_sliding_layers} of {m.sliding_window:,}" if m.num_sliding_layers else "–"
            experts = f"{m.experts_per_token}/{m.num_experts}" if m.is_moe else "–"
            row += [sliding, experts, m.dtype + (f" ({m.quantization})" if m.quantization else "")]
        table.add_row(*row)
    console = Console(highlight=False)
    if wide:  # every column whole, however narrow the terminal or pipe (as run --wide): wider lines, never "…"
        console.width = max(console.width, console.measure(table, options=console.options.update_width(10_000)).maximum)
    console.print(table)
    if not wide:
        console.print("attn: MHA/GQA/MQA/MLA; ·MoE: mixture of experts; ·SW: some layers use a sliding window. "
                      "--wide for layer kinds, experts and dtype.")


def model_dict(m) -> dict:
    return {
        "id": m.id, "hf_repo": m.hf_repo, "aliases": list(m.aliases), "model_type": m.model_type,
        "attention": m.attention, "num_hidden_layers": m.num_hidden_layers, "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads, "num_key_value_heads": m.num_key_value_heads,
        "head_dim": m.head_dim, "kv_lora_rank": m.kv_lora_rank, "qk_rope_head_dim": m.qk_rope_head_dim,
        "sliding_window": m.sliding_window, "num_sliding_layers": m.num_sliding_layers,
        "layer_types": list(m.layer_types), "max_position_embeddings": m.max_position_embeddings, "dtype": m.dtype,
        "quantization": m.quantization, "num_experts": m.num_experts, "experts_per_token": m.experts_per_token,
        "kv_bytes_per_token": m.kv_bytes_per_token(m.dtype_bytes), "num_params": m.num_params,
        "num_active_params": m.num_active_params, "params_total_card": m.params_total_card,
        "notes": list(m.notes), "source": list(m.source),
    }


@app.command()
def gpus(as_json: bool = typer.Option(False, "--json", help="Print the catalogue as JSON.")) -> None:
    """The GPUs kvlab knows: memory (and which figure it is), bandwidth and peak FLOP/s, with sources."""
    specs = list_gpus()
    if as_json:
        _print_json([{"id": g.id, "aliases": list(g.aliases), "memory_bytes": g.memory_bytes,
                      "memory_bytes_source": g.memory_bytes_source, "memory_gb_marketing": g.memory_gb_marketing,
                      "memory_type": g.memory_type, "memory_bandwidth_bytes_per_s": g.memory_bandwidth_bytes_per_s,
                      "peak_flops": g.peak_flops, "peak_flops_kind": g.peak_flops_kind, "notes": list(g.notes),
                      "source": list(g.source)} for g in specs])
        return
    from rich.console import Console

    table = compact_table("kvlab GPUs")
    for header, justify in (("gpu", "left"), ("memory\nGiB", "right"), ("memory figure", "left"),
                            ("bandwidth\nTB/s", "right"), ("peak\nTFLOP/s", "right"), ("kind", "left")):
        table.add_column(header, justify=justify, no_wrap=header != "kind")
    for g in specs:
        bandwidth = "-" if g.memory_bandwidth_bytes_per_s is None else f"{g.memory_bandwidth_bytes_per_s / 1e12:.2f}"
        flops = "-" if g.peak_flops is None else f"{g.peak_flops / 1e12:,.1f}"
        table.add_row(g.id, f"{g.memory_gib:.2f}", g.memory_bytes_source.replace("_", " "), bandwidth, flops,
                      g.peak_flops_kind or "no source")
    console = Console(highlight=False)
    console.print(table)
    # Every name --gpu takes (case, spaces, '-' and '_' do not matter), and the names refused as fitting two cards.
    console.print("Names: " + "; ".join(f"{g.id} = {', '.join(g.aliases)}" if g.aliases else g.id for g in specs),
                  soft_wrap=False)
    console.print("Refused (fit two cards): " + "; ".join(
        f"{name}: {' or '.join(i if catalogued(i) else f'{i} (not in the catalogue)' for i in ids)}"
        for name, ids in ambiguous_aliases().items()))


def _tokens(n: int) -> str:
    """A context length in an 80-column cell: 1,024,000 as 1,024k (Mistral-NeMo's), others in full."""
    return f"{n // 1000:,}k" if n >= 1_000_000 and n % 1000 == 0 else f"{n:,}"

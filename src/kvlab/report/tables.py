"""Rich tables and CSV files for runs and races. The winner and the reason are said in words, too."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING

from kvlab.metrics import ITERATION_COLUMNS

if TYPE_CHECKING:
    from rich.table import Table

    from kvlab.sim import SimResult


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:,.0f}"


def race_table(summaries: list[dict], title: str) -> Table:
    from rich.table import Table

    best = max(summaries, key=lambda s: s["throughput_rps"])
    table = Table(title=title, title_justify="left", header_style="bold", caption=(
        "KV memory shares are time averages: tokens | reserved for tokens to come | internal fragmentation "
        "(reserved, never used) | external fragmentation, allocator round-up and free. ★ most requests/s."),
        caption_justify="left")
    for header, justify in (("strategy", "left"), ("tokens\n%", "right"), ("reserv.\n%", "right"),
                            ("int.frag\n%", "right"), ("ext+free\n%", "right"), ("batch\nmean", "right"),
                            ("req/s", "right"), ("out\ntok/s", "right"), ("latency\nms/tok p50", "right"),
                            ("TTFT\np50 ms", "right"), ("evictions", "right"), ("recomp.\ntokens", "right"),
                            ("done/\nrejected", "right")):
        table.add_column(header, justify=justify, no_wrap=header == "strategy")
    for s in summaries:
        shares = s["memory_shares"]
        style = "bold green" if s is best else None
        table.add_row(
            s["name"] + (" ★" if s is best else ""),
            f"{shares['token']:.1f}",
            f"{shares['reserved']:.1f}",
            f"{shares['internal_fragmentation']:.1f}",
            f"{shares['external_fragmentation']:.1f}",
            f"{s['mean_batch_size']:.1f}",
            f"{s['throughput_rps']:.2f}",
            f"{s['throughput_tps']:,.0f}",
            _ms(s["normalized_latency_s_per_token"]["p50"]),
            _ms(s["ttft_s"]["p50"]),
            f"{s['preemptions']:,}",
            f"{s['recomputed_tokens']:,}",
            f"{s['num_finished']:,}/{s['num_rejected']:,}",
            style=style,
        )
    return table


def verdict(summaries: list[dict]) -> str:
    """One paragraph: who served the most, and why (memory holding tokens → batch size → throughput)."""
    if len(summaries) < 2:
        s = summaries[0]
        return (
            f"{s['name']}: {s['memory_shares']['token']:.1f}% of KV memory held tokens; "
            f"{s['mean_batch_size']:.1f} requests per iteration on average; {s['throughput_rps']:.2f} req/s."
        )
    ranked = sorted(summaries, key=lambda s: s["throughput_rps"], reverse=True)
    best, worst = ranked[0], ranked[-1]
    ratio = best["throughput_rps"] / worst["throughput_rps"] if worst["throughput_rps"] > 0 else float("inf")
    text = (
        f"{best['name']} served the most: {best['throughput_rps']:.2f} req/s, {ratio:.1f}× {worst['name']} "
        f"({worst['throughput_rps']:.2f} req/s). Why: {best['memory_shares']['token']:.1f}% of its KV memory held "
        f"tokens against {worst['memory_shares']['token']:.1f}%, so it batched {best['mean_batch_size']:.1f} requests "
        f"per iteration against {worst['mean_batch_size']:.1f}; every iteration reads all the weights once, so more "
        f"requests per iteration means more tokens per second."
    )
    preempting = [s for s in summaries if s["preemptions"]]
    if preempting:
        text += " Preemptions (memory ran out mid-answer): " + ", ".join(
            f"{s['name']} {s['preemptions']:,} ({s['recomputed_tokens']:,} tokens recomputed)" for s in preempting
        ) + "."
    return text


def write_run_data(result: SimResult, out_dir: Path) -> list[Path]:
    """Per-request and per-iteration CSV files for one strategy."""
    out_dir.mkdir(parents=True, exist_ok=True)
    name = result.strategy.name.replace("+", "_")
    requests_path = out_dir / f"{name}_requests.csv"
    with requests_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([
            "request_id", "arrival_time", "prompt_len", "num_output_tokens", "status", "first_scheduled_time",
            "first_token_time", "finish_time", "ttft", "tpot", "e2e_latency", "normalized_latency",
            "num_preemptions", "reject_reason",
        ])
        for r in sorted(result.records, key=lambda r: r.request_id):
            writer.writerow([
                r.request_id, r.arrival_time, r.prompt_len, r.num_output_tokens, r.status, r.first_scheduled_time,
                r.first_token_time, r.finish_time, r.ttft, r.tpot, r.e2e_latency, r.normalized_latency,
                r.num_preemptions, r.reject_reason or "",
            ])
    paths = [requests_path]
    if result.log is not None:
        iterations_path = out_dir / f"{name}_iterations.csv"
        cols = [result.log.columns[c] for c in ITERATION_COLUMNS]
        with iterations_path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(ITERATION_COLUMNS)
            for row in zip(*cols):
                writer.writerow([int(v) if v.is_integer() and i > 1 else v for i, v in enumerate(row)])
        paths.append(iterations_path)
    return paths

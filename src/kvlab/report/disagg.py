"""`kvlab capacity --replicas auto --prefill-replicas auto`'s answer in words: every fleet tried, and which holds with
fewer GPUs (kvlab.service.disagg.DisaggComparison)."""

from __future__ import annotations


def print_comparison(comparison) -> None:
    from rich.console import Console
    from rich.table import Table

    def ms(value) -> str:
        return "–" if value is None else f"{1e3 * value:,.1f}"

    table = Table(title=f"Aggregated and disaggregated fleets at {comparison.rate:g} req/s with {comparison.slo}")
    for column in ("fleet", "GPUs", "held", "TTFT p99 ms", "TPOT p99 ms", "why not"):
        table.add_column(column, justify="left" if column in ("fleet", "why not") else "right")
    for row in comparison.tried:
        table.add_row(row["shape"], str(row["gpus"]), "✓" if row["held"] else "✗", ms(row["ttft_p99_s"]),
                      ms(row["tpot_p99_s"]), row["reason"])
    console = Console(highlight=False)
    console.print(table)
    console.print(answer_line(comparison))


def answer_line(comparison) -> str:
    gpus = comparison.gpus_per_replica
    most = max((row["prefill_replicas"] + row["decode_replicas"] for row in comparison.tried), default=0) * gpus
    agg = f"no aggregated fleet of up to {most} GPUs held" if comparison.aggregated is None else \
        f"{comparison.aggregated} aggregated replica{'s' if comparison.aggregated > 1 else ''} " \
        f"({comparison.aggregated * gpus} GPUs) held"
    dis = f"no disaggregated fleet of up to {most} GPUs held" if comparison.disaggregated is None else \
        f"{comparison.disaggregated[0]}P{comparison.disaggregated[1]}D ({sum(comparison.disaggregated) * gpus} GPUs) held"
    tail = {"aggregated": "aggregated holds with fewer GPUs", "disaggregated": "disaggregated holds with fewer GPUs",
            "either": "both hold with the same GPUs",
            "neither": f"neither holds with up to {comparison.max_replicas} replicas"}[comparison.answer]
    return f"{agg}; {dis}: {tail}."

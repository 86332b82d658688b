"""`kvlab capacity --replicas auto --prefill-replicas auto`'s answer in words: every fleet tried, and which holds with
fewer GPUs (kvlab.service.disagg.DisaggComparison)."""

from __future__ import annotations


def print_comparison(comparison) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    def ms(value) -> str:
        return "–" if value is None else f"{1e3 * value:,.1f}"

    table = Table(title=f"Aggregated and disaggregated fleets at {comparison.rate:g} req/s with {comparison.slo}",
                  title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)  # (plain rules: trial 59, 14)
    for column in ("fleet", "GPUs", "held", "TTFT p99 ms (run)", "TPOT p99 ms (run)"):
        table.add_column(column, justify="left" if column == "fleet" else "right")
    for row in comparison.tried:
        table.add_row(row["shape"], str(row["gpus"]), "✓" if row["held"] else "✗", ms(row["ttft_p99_s"]),
                      ms(row["tpot_p99_s"]))
    console = Console(highlight=False)
    console.print(table)
    console.print(latency_line(comparison), markup=False)
    for row in comparison.tried:
        if not row["held"]:
            console.print(f"  {row['shape']}: {row['reason']}", markup=False)
    console.print(answer_line(comparison), markup=False)
    console.print(samples_line(comparison), markup=False)


def latency_line(comparison) -> str:
    """What the table's latency columns are over: the first sample's whole run, not the window a fleet is judged
    on (kvlab.window; kvlab.service.disagg._row keeps the run's p99 of each)."""
    first = f" ({comparison.sample_lengths[0]:,} requests)" if comparison.sample_lengths else ""
    return (f"(run): the p99 over every request the first sample's run{first} finished, its warm-up included; whether "
            "a fleet held is judged on each sample's measured window instead (the requests after a 20% warm-up, up "
            "to the last arrival), as kvlab capacity judges a rate.")


def samples_line(comparison) -> str:
    """The samples every fleet was judged on, and why there is one only or why the first is shorter."""
    lengths = " and ".join(f"{n:,}" for n in comparison.sample_lengths)
    head = (f"Each fleet judged on two samples ({lengths} requests): it holds when it held on both"
            if len(comparison.sample_lengths) == 2 else f"Each fleet judged on one sample ({lengths} requests)")
    return head + (f"; {comparison.note}." if comparison.note else ".")


def answer_line(comparison) -> str:
    gpus = comparison.gpus_per_replica

    def gpus_text(n: int) -> str:
        return f"{n * gpus} GPU{'' if n * gpus == 1 else 's'}"

    most = max((row["prefill_replicas"] + row["decode_replicas"] for row in comparison.tried), default=0)
    agg = f"no aggregated fleet of up to {gpus_text(most)} held" if comparison.aggregated is None else \
        f"{comparison.aggregated} aggregated replica{'s' if comparison.aggregated > 1 else ''} " \
        f"({gpus_text(comparison.aggregated)}) held"
    if comparison.disaggregated is not None:
        dis = f"{comparison.disaggregated[0]}P{comparison.disaggregated[1]}D ({gpus_text(sum(comparison.disaggregated))})" \
              " held"
    elif most < 2:
        dis = "no disaggregated fleet was tried (one takes 2 replicas or more)"
    else:
        dis = f"no disaggregated fleet of up to {gpus_text(most)} held"
    tail = {"aggregated": "aggregated holds with fewer GPUs", "disaggregated": "disaggregated holds with fewer GPUs",
            "either": "both hold with the same GPUs",
            "neither": f"neither holds with up to {comparison.max_replicas} replicas"}[comparison.answer]
    return f"{agg}; {dis}: {tail}."

"""The gateway's decisions and each class of requests, in words and a table (kvlab.service.classes computes them)."""

from __future__ import annotations

from kvlab.report.tables import significant


def _seconds(value: float | None) -> str:
    if value is None or value != value:
        return "–"
    return f"{significant(1e3 * value)} ms" if value < 1 else f"{significant(value)} s"


def gateway_line(name: str, admission: dict) -> str:
    """One strategy's gateway: what it admitted, queued and rejected."""
    reasons = ", ".join(f"{n:,} {reason}" for reason, n in admission["reject_reasons"].items()) or "none"
    wait = admission["gateway_wait_s"]
    return (f"{name}: gateway ({admission['gateway']}) admitted {admission['num_admitted']:,} of "
            f"{admission['num_offered']:,} requests"
            + (f", {admission['num_queued']:,} after a wait (p99 wait of all admitted {_seconds(wait['p99'])})"
               if admission["num_queued"] else "") + f"; rejected {admission['num_rejected']:,} "
            f"({100 * admission['rejected_share']:.1f}%: {reasons})"
            + (f"; {admission['num_aborted_in_queue']:,} clients gave up in its queue"
               if admission["num_aborted_in_queue"] else "") + ".")


def _value(term: str, value: float) -> str:
    """An SLO term's value: the abandoned share as a percentage (kvlab.sweep.slo), a latency otherwise."""
    from kvlab.sweep.slo import ABANDONED

    return f"{100 * value:.1f}%" if term.startswith(ABANDONED) else _seconds(value)


def _verdict(c: dict) -> str:
    """'held (values)' or 'missed (values)'; where the miss is something no value shows (clients that gave up under
    an SLO with no abandoned<X% term, which allows none; no request finished), it says that first and how to bound it."""
    from kvlab.sweep.slo import parse_slo

    # (each term's measured value under its metric's name: "p99_ttft 82.6 s", not the target again)
    values = ", ".join(f"{term.split('<')[0]} {_value(term, value)}" for term, value in c["slo_values"].items())
    if c["slo_held"]:
        return f"held ({values})"
    unseen = []
    if not c["num_finished"]:
        unseen.append("none of its requests finished")
    if c["abandoned_share"] > 0 and parse_slo(c["slo"]).abandoned_text is None:
        unseen.append(f"{100 * c['abandoned_share']:.1f}% of its clients gave up (an SLO without an abandoned<X% term "
                      "allows none); add e.g. abandoned<5%")
    return f"missed: {'; '.join(unseen)}; {values}" if unseen else f"missed ({values})"


def print_classes(console, name: str, classes: dict, *, deadlines: bool = False) -> None:
    """One strategy's classes: requests, rejections (and, with client deadlines, abandonments), latencies, and each
    SLO with its goodput."""
    from rich import box
    from rich.table import Table

    table = Table(title=f"{name}: per class (class = request priority)", box=box.SIMPLE_HEAD, header_style="bold",
                  pad_edge=False)
    columns = ("class", "requests", "rejected") + (("abandoned",) if deadlines else ()) + (
        "TTFT\np50", "TTFT\np99", "E2E\np99", "goodput")  # (stacked: room for abandoned at 80 columns)
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    for number, c in classes.items():
        slo = c.get("slo")
        abandoned = (f"{100 * c['abandoned_share']:.1f}%",) if deadlines else ()
        table.add_row(number, f"{c['num_requests']:,}", f"{100 * c['rejected_share']:.1f}%", *abandoned,
                      _seconds(c["ttft_s"]["p50"]), _seconds(c["ttft_s"]["p99"]), _seconds(c["e2e_latency_s"]["p99"]),
                      "–" if slo is None else f"{100 * c['goodput']:.1f}%")
    console.print(table)
    for number, c in classes.items():
        if "slo" in c:
            console.print(f"class {number}: SLO {c['slo']} {_verdict(c)}; goodput {100 * c['goodput']:.1f}% of its "
                          "requests (finished within every limit)",
                          highlight=False)


def print_admission(console, summaries: list[dict]) -> None:
    """Each strategy's gateway line and class table, where the run has them."""
    for summary in summaries:
        if "admission" in summary:
            console.print(gateway_line(summary["name"], summary["admission"]), highlight=False)
        if "classes" in summary:
            print_classes(console, summary["name"], summary["classes"], deadlines="num_aborted" in summary)

"""Rich tables and CSV files for runs and races. The winner and the reason are said in words, too."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING

from kvlab.metrics import ITERATION_COLUMNS
from kvlab.service.verdict import same_throughput
from kvlab.service.verdict import tied as tied_names
from kvlab.service.verdict import winner as verdict_winner

if TYPE_CHECKING:
    from rich.table import Table

    from kvlab.sim import SimResult


def workload_rate(wl) -> float | None:
    """The workload's mean arrival rate, or None when every request arrives at once (it has no rate, and JSON
    has no infinity) or there is one request (one arrival has no rate: trial 55, finding 17)."""
    return wl.request_rate if wl.duration > 0 and wl.num_requests > 1 else None


def _time(value: float | None, factor: float) -> str:
    if value is None:
        return "–"
    x = value * factor
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def winner(summaries: list[dict]) -> dict | None:
    """The summary of who won (kvlab.service.verdict: the most requests/s, a tie at 3 significant digits), or None
    when the best ties with another (or only one ran)."""
    name = verdict_winner(summaries)
    return next((s for s in summaries if s["name"] == name), None) if name is not None else None


def race_table(summaries: list[dict], title: str, *, wide: bool = False, strategies=None,
               width: int | None = None) -> Table:
    """The race as a table that fits 80 columns (``wide``: every column). Names are never cut; times are in ms
    (TTFT) and ms/tok (per-token latency) in every table, so that two runs' tables read alike. Given the terminal's
    ``width``, the default table drops its least needed columns (DROP_ORDER) rather than cut a value."""
    from rich.table import Table

    best = winner(summaries)
    # (per-token latency always in ms: seconds a token would read "0.01" or "0.24", too coarse: trial 55, finding 9)
    lat_unit, lat_factor = "ms", 1e3
    # (TTFT always in ms too: a unit picked per table made two runs' tables read 106 beside 2.78, ms in one and s in
    # the other: trial 58, finding 15)
    ttft_unit, ttft_factor = "ms", 1e3
    table = Table(title=title, title_justify="left", header_style="bold underline", box=None, pad_edge=False,
                  padding=(0, 1, 0, 0))
    columns = [("strategy", "strategy"), ("KV\ntok %", "token")]
    if wide:
        columns += [("KV\nresv %", "reserved"), ("int.\nfrag %", "internal_fragmentation"),
                    ("free+\nother %", "external_fragmentation")]
    columns += [("batch\nmean", "batch"), ("req/s", "rps"), ("out\ntok/s", "tps"),
                (f"lat. p50\n{lat_unit}/tok", "lat50")]
    if wide:
        columns += [(f"lat. p99\n{lat_unit}/tok", "lat99")]
    columns += [(f"TTFT\np50 {ttft_unit}", "ttft50")]
    if wide:
        columns += [(f"TTFT\np99 {ttft_unit}", "ttft99")]
    columns += [("pre-\nempt.", "preemptions")]
    if wide:
        columns += [("recomp.\ntokens", "recomputed")]
    columns += [("done", "done"), ("rej.", "rejected")]
    if any("num_aborted" in s for s in summaries):  # (client deadlines: --timeout, or a file's timeout column)
        columns += [("abort.", "aborted")]
    rows = [_cells(s, s is best, lat_factor, ttft_factor) for s in summaries]
    if width is not None and not wide:
        columns = _fit(columns, rows, width)
    for header, key in columns:
        justify = "left" if key == "strategy" else "right"
        table.add_column(header, justify=justify, no_wrap=True, min_width=_width(header, key, rows))
    for s, cells in zip(summaries, rows):
        table.add_row(*(cells[key] for _, key in columns), style="bold green" if s is best else None)
    return table


# Columns the default table gives up first when a long strategy name leaves too little room.
DROP_ORDER = ("tps", "batch", "preemptions", "ttft50")


def _width(header: str, key: str, rows: list[dict]) -> int:
    return max(max(len(line) for line in header.split("\n")), *(len(r[key]) for r in rows))


def _fit(columns: list[tuple[str, str]], rows: list[dict], width: int) -> list[tuple[str, str]]:
    """The columns that fit ``width`` (one space between them), dropping DROP_ORDER's first."""
    def total(cols):
        return sum(_width(h, k, rows) for h, k in cols) + len(cols) - 1

    for key in DROP_ORDER:
        if total(columns) <= width:
            break
        columns = [c for c in columns if c[1] != key]
    return columns


def significant(value: float, *, zeros: bool = False) -> str:
    """Three significant digits ('0.0288', '97.7'); where that would take an exponent, whole with separators
    ('1,110', not 1.11e+03; 999.6 is '1,000'). ``zeros``: trailing zeros kept, for a table's column ('6.60' under
    '8.39', not '6.6': trial 62, finding 9d)."""
    text = f"{value:#.3g}".rstrip(".") if zeros else f"{value:.3g}"
    return f"{value:,.0f}" if "e+" in text else text


def bracket_text(lo: float | None, hi: float | None) -> str:
    """A capacity search's bracket [held, failed] to the answer's 3 significant digits (kvlab.sweep.capacity.
    rate_text, which rounds the answer down): the held rate rounded down, the failed one up, so that the bracket
    shown holds both the answer shown and the bracket searched (trial 58, finding 6: "2.18 [2.188, 2.25]")."""
    from kvlab.sweep.capacity import rate_text

    return f"[{'–' if lo is None else rate_text(lo)}, {'–' if hi is None else _rate_up(hi)}]"


def _rate_up(rate: float) -> str:
    """A rate to 3 significant digits, rounded up (rate_text's rounding down, mirrored)."""
    import math

    if rate <= 0:
        return "0"
    step = 10 ** (math.floor(math.log10(rate)) - 2)
    value = math.ceil(rate / step - 1e-9) * step
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _tokens_per_s(value: float) -> str:
    """Whole tokens per second with separators; below 10, three significant digits (a slow rate is not 0)."""
    return f"{value:,.0f}" if value >= 10 or value == 0 else f"{value:.3g}"


def _cells(s: dict, is_best: bool, lat_factor: float, ttft_factor: float) -> dict:
    shares, lat, ttft = s["memory_shares"], s["normalized_latency_s_per_token"], s["ttft_s"]
    return {
        "strategy": s["name"] + (" ★" if is_best else ""), "token": f"{shares['token']:.1f}",
        "reserved": f"{shares['reserved']:.1f}", "internal_fragmentation": f"{shares['internal_fragmentation']:.1f}",
        "external_fragmentation": f"{shares['external_fragmentation']:.1f}",
        "batch": f"{s['mean_batch_size']:.1f}", "rps": f"{s['throughput_rps']:.3g}",
        "tps": _tokens_per_s(s["throughput_tps"]), "lat50": _time(lat["p50"], lat_factor),
        "lat99": _time(lat["p99"], lat_factor), "ttft50": _time(ttft["p50"], ttft_factor),
        "ttft99": _time(ttft["p99"], ttft_factor), "preemptions": f"{s['preemptions']:,}",
        "recomputed": f"{s['recomputed_tokens']:,}", "done": f"{s['num_finished']:,}",
        "rejected": f"{s['num_rejected']:,}", "aborted": f"{s.get('num_aborted', 0):,}",
    }


HYBRID_SHARES = ("on this hybrid model the other KV cache groups' blocks (Mamba states, sliding windows: the "
                 "allocator's overhead, memory_shares_detailed) held by running requests count there too: not free")


def footnotes(summaries: list[dict], *, wide: bool = False, hybrid: bool = False) -> list[str]:
    """What the columns mean, and every rejection with its reason and count; ``hybrid``: the run gave blocks in a
    hybrid model's KV cache groups (kvlab.memory.hybrid, a slab's other groups' part), whose overhead is no free
    memory."""
    lines = [("lat. = normalized latency: a request's end-to-end time divided by its output tokens (the vLLM "
              "paper's metric), p50 over requests. TTFT: time to first token. KV tok %: share of KV memory holding "
              "tokens, averaged over time. pre-empt.: preemptions (memory ran out mid-answer; a request can be preempted "
              "more than once). req/s, out tok/s: finished requests (output tokens) ÷ the run's makespan, from its "
              "start to its last finish, ramp and drain included: on a short run below the arrival rate even while "
              "the engine keeps up (kvlab capacity measures the served rate over a window instead)."
              # (no ★ where no strategy finished a request: nothing won, and all 0 req/s is no tie)
              + (f" ★ {_star_text(summaries)}{_tie_text(summaries)}."
                 if len(summaries) > 1 and any(s["num_finished"] for s in summaries) else ""))]
    if wide:
        other = (f"allocator round-up, free blocks; {HYBRID_SHARES}" if hybrid else
                 "allocator round-up, free blocks; for paged memory this is free memory, not fragmentation")
        lines.append("KV memory shares: tokens | reserved for tokens to come | internal fragmentation (reserved, "
                     f"never used) | free and other ({other}).")
    rejected = [s for s in summaries if s["num_rejected"]]
    if rejected:
        parts = []
        for s in rejected:
            reasons = ", ".join(f"{reason}: {count:,}" for reason, count in sorted(
                s.get("reject_reasons", {}).items(), key=lambda item: -item[1]))
            parts.append(f"{s['name']} {s['num_rejected']:,}" + (f" ({reasons})" if reasons else ""))
        lines.append("Rejected: " + "; ".join(parts) + ".")
    return lines + preemption_lines(summaries) + deadline_lines(summaries)


def preemption_lines(summaries: list[dict]) -> list[str]:
    """What each strategy's preemptions cost: the tokens computed again (recompute mode) and the bytes moved between
    GPU and CPU memory (swap mode: out when preempted, back in when resumed), as `--json` has them."""
    parts = []
    for s in summaries:
        if not s.get("preemptions"):
            continue
        cost = []
        if s.get("swapped_bytes"):
            cost.append(f"{s['swapped_bytes'] / 2**30:,.1f} GiB swapped between GPU and CPU memory, out and back in")
        if s.get("recomputed_tokens"):
            cost.append(f"{s['recomputed_tokens']:,} tokens computed again")
        parts.append(f"{s['name']} {s['preemptions']:,}" + (f" ({'; '.join(cost)})" if cost else ""))
    return ["Preemptions: " + "; ".join(parts) + "."] if parts else []


def _star_text(summaries: list[dict]) -> str:
    """What the ★ is given for (kvlab.service.verdict: with deadlines, who lost requests does not contend)."""
    if not any(s.get("num_aborted") for s in summaries):
        return "most req/s"
    if all(s.get("num_aborted") for s in summaries):
        return "most req/s finished (every strategy lost requests to client deadlines)"
    return "most req/s of the strategies that lost no request to a client's deadline"


def _tie_text(summaries: list[dict]) -> str:
    """Why no row has the ★: the best req/s is shared (kvlab.service.verdict.winner gives none then)."""
    names = tied_names(summaries)
    return f" (none here: {' and '.join(names)} tie)" if len(names) > 1 else ""


def num_offered(s: dict) -> int:
    """The requests a strategy was offered, from its summary: those that finished, were rejected or aborted."""
    if s.get("num_aborted"):
        return round(s["num_aborted"] / s["abandoned_share"])
    return s["num_finished"] + s["num_rejected"]


def deadline_lines(summaries: list[dict]) -> list[str]:
    """With client deadlines (--timeout, or a file's timeout column): how many each strategy aborted, their share
    and the tokens computed for them in vain, and that the latencies are over the finished requests only; a
    strategy that finished nothing says why."""
    with_deadlines = [s for s in summaries if "num_aborted" in s]
    if not with_deadlines:
        return []
    parts = [f"{s['name']} {s['num_aborted']:,} of {num_offered(s):,} ({100 * s['abandoned_share']:.1f}% abandoned, "
             f"{s['wasted_tokens']:,} tokens computed in vain)" for s in with_deadlines]
    lines = ["Client deadlines: aborted = requests whose client gave up before the answer finished (vLLM aborts "
             "them): " + "; ".join(parts) + ". Latencies, TTFT and req/s are over the finished requests only."]
    for s in with_deadlines:
        if s["num_finished"] == 0 and s["num_aborted"]:
            offered = num_offered(s)
            which = "all" if s["num_aborted"] == offered else f"{s['num_aborted']:,} of"
            lines.append(f"{s['name']} finished nothing: {which} {offered:,} requests were aborted, each client's "
                         "deadline passing before its answer finished, so there are no latencies.")
    return lines


def _duplicates_text(summaries: list[dict], strategies) -> str:
    if not strategies:
        return ""
    from kvlab.strategies import behaviour

    groups: dict[tuple, list[str]] = {}
    for strategy in strategies:
        groups.setdefault(behaviour(strategy), []).append(strategy.name)
    same = [names for names in groups.values() if len(names) > 1]
    return "".join(f" {' and '.join(names)} are the same strategy under {len(names)} names (same batching, memory "
                   "and preemption): their results are equal by construction." for names in same)


def _distinct(strategies) -> int | None:
    """How many different strategies the names given are (None when they are not known)."""
    if not strategies:
        return None
    from kvlab.strategies import behaviour

    return len({behaviour(strategy) for strategy in strategies})


def verdict(summaries: list[dict], strategies=None) -> str:
    """One paragraph: who served the most, and why (memory holding tokens → batch size → throughput); ties,
    duplicates and strategies that served nothing are said as such."""
    if len(summaries) < 2:
        s = summaries[0]
        return (
            f"{s['name']}: {s['memory_shares']['token']:.1f}% of KV memory held tokens; "
            f"{s['mean_batch_size']:.1f} requests per iteration on average; {s['throughput_rps']:.3g} req/s."
        )
    ranked = sorted(summaries, key=lambda s: s["throughput_rps"], reverse=True)
    best, worst = ranked[0], ranked[-1]
    tied = [s["name"] for s in ranked if same_throughput(s["throughput_rps"], best["throughput_rps"])]
    if not any(s["num_finished"] for s in summaries):  # (all at 0 req/s: no winner, and no tie either)
        text = (f"None of the {len(ranked)} strategies finished a request, so none served the most "
                "(what became of their requests: the table's footnotes).")
    elif any(s.get("num_aborted") for s in summaries):
        text = _deadlines_verdict(summaries)
    elif len(tied) == len(ranked) and _distinct(strategies) == 1:  # (one strategy under several names: trial 60, 4)
        text = f"A tie: all {len(ranked)} strategies served {best['throughput_rps']:.3g} req/s."
    elif len(tied) == len(ranked) and not any(s["preemptions"] for s in summaries):
        text = (f"A tie: all {len(ranked)} strategies served {best['throughput_rps']:.3g} req/s. At this load "
                "the requests do not compete for memory, so how it is managed does not change throughput.")
    elif len(tied) == len(ranked):  # (memory was contended, and what each did about it moved no throughput: trial 61, 2)
        text = (f"A tie: all {len(ranked)} strategies served {best['throughput_rps']:.3g} req/s. The requests did "
                f"compete for memory ({' and '.join(format(s['preemptions'], ',') for s in ranked)} preemptions), "
                "but how each strategy handled it did not change throughput at this precision.")
    elif worst["num_finished"] == 0:  # (each that served nothing named: trial 59, finding 1)
        nothing = [s for s in ranked if s["num_finished"] == 0]
        text = (f"{' and '.join(tied)} served the most: {best['throughput_rps']:.3g} req/s; "
                f"{' and '.join(s['name'] for s in nothing)} served nothing ("
                f"{' and '.join(format(s['num_rejected'], ',') for s in nothing)} requests rejected).")
    else:
        lead = best["name"] if len(tied) == 1 else f"{' and '.join(tied)} (a tie)"
        ratio = best["throughput_rps"] / worst["throughput_rps"]
        text = (f"{lead} served the most: {best['throughput_rps']:.3g} req/s, {ratio:.2f}× " if ratio < 1.1 else
                f"{lead} served the most: {best['throughput_rps']:.3g} req/s, {ratio:.1f}× ")
        text += f"{worst['name']} ({worst['throughput_rps']:.3g} req/s). {_why(best, worst)}"
    text += _duplicates_text(summaries, strategies)
    return text  # (what the preemptions cost is the footnotes' line, preemption_lines: one home, swaps included)


def _why(best: dict, worst: dict) -> str:
    """Why the best served more than the worst, from the figures that differ at the table's precision (trial 59,
    finding 7: "0.0% of its KV memory held tokens against 0.0%" explained nothing)."""
    tokens = [f"{s['memory_shares']['token']:.1f}%" for s in (best, worst)]
    batches = [f"{s['mean_batch_size']:.1f}" for s in (best, worst)]
    more = "every iteration reads all the weights once, so more requests per iteration means more tokens per second."
    if tokens[0] != tokens[1] and batches[0] != batches[1]:
        return (f"Why: {tokens[0]} of its KV memory held tokens against {tokens[1]}, so it batched {batches[0]} "
                f"requests per iteration against {batches[1]}; {more}")
    if batches[0] != batches[1]:
        return f"Why: it batched {batches[0]} requests per iteration against {batches[1]}; {more}"
    return (f"Their KV memory held tokens alike ({tokens[0]}) and they batched alike ({batches[0]} requests per "
            "iteration), so memory does not explain the difference.")


def _deadlines_verdict(summaries: list[dict]) -> str:
    """Who won when clients gave up (kvlab.service.verdict: who lost requests to deadlines contends only when all
    did), and what each lost."""
    names = tied_names(summaries)
    top = next(s for s in summaries if s["name"] == names[0])
    lead = names[0] if len(names) == 1 else f"{' and '.join(names)} (a tie)"
    lost = [s for s in summaries if s.get("num_aborted")]
    losses = ", ".join(f"{s['name']} {s['num_aborted']:,} of {num_offered(s):,}" for s in lost)
    if len(lost) < len(summaries):
        return (f"{lead} served the most of the strategies that lost no request to a client's deadline: "
                f"{top['throughput_rps']:.3g} req/s. Aborted as their clients gave up: {losses}; their req/s count "
                "only the requests they finished, so they do not contend.")
    return (f"Every strategy lost requests to client deadlines (aborted: {losses}); {lead} finished the most per "
            f"second: {top['throughput_rps']:.3g} req/s, {top['num_finished']:,} of {num_offered(top):,} requests.")


def csv_stem(strategy_name: str) -> str:
    """A strategy's name in file names: one style for all (``orca-max``, ``static-max``, ``vllm-swap``)."""
    return strategy_name.replace("+", "-")


# What write_run_data writes (a strategy's name in front), as glob patterns for --out's check (kvlab.validate).
RUN_DATA_FILES = ("*_requests.csv", "*_iterations.csv")


def write_run_data(result: SimResult, out_dir: Path) -> list[Path]:
    """Per-request and per-iteration CSV files for one strategy."""
    out_dir.mkdir(parents=True, exist_ok=True)
    name = csv_stem(result.strategy.name)
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


def rows_served_nothing(rows) -> list[dict]:
    """Stored points (a sweep's rows, a capacity search's) that served no request, merged by strategy into what
    served_nothing reads (its requests' fates, and ``num_points``: how many points); [] where every one served."""
    import json

    merged: dict[str, dict] = {}
    for row in rows:
        if row["status"] != "ok" or row.get("num_finished"):
            continue
        name = str(row["strategy"])
        s = merged.setdefault(name, {"name": name, "num_finished": 0, "num_rejected": 0, "num_aborted": 0,
                                     "reject_reasons": {}, "num_points": 0})
        s["num_points"] += 1
        s["num_rejected"] += row.get("num_rejected") or 0
        s["num_aborted"] += row.get("num_aborted") or 0
        reasons = row.get("reject_reasons") or {}
        for reason, count in (json.loads(reasons) if isinstance(reasons, str) else reasons).items():  # (stored as JSON)
            s["reject_reasons"][reason] = s["reject_reasons"].get(reason, 0) + count
    return list(merged.values())


def served_nothing(summaries: list[dict], *, head: str = "no request was served",
                   measured: str = "the figures above") -> str | None:
    """Where no strategy finished a single request (a KV cache too small for any of the workload's requests, say),
    the one line that says so, with what became of each strategy's requests; None where any served one. ``head``
    and ``measured``: what served nothing and which figures measure nothing (`kvlab sweep`: some of its points)."""
    if not summaries or any(s["num_finished"] for s in summaries):
        return None
    parts = []
    for s in summaries:
        reasons = sorted(s.get("reject_reasons", {}).items(), key=lambda item: -item[1])
        fates = [f"rejected {count:,} as {reason}" for reason, count in reasons]
        fates += [f"rejected {left:,} more"] if (left := s["num_rejected"] - sum(c for _, c in reasons)) > 0 else []
        fates += [f"abandoned {s['num_aborted']:,}"] if s.get("num_aborted") else []
        parts.append(f"{s['name']} {' and '.join(fates) or 'finished none'}")
    valid = []
    if any(s["num_rejected"] for s in summaries):
        valid.append("a KV cache in which the workload's requests fit (`kvlab size --context-len N` gives how many "
                     "fit) and prompts within max_model_len")
    if any(s.get("num_aborted") for s in summaries):
        valid.append("a --timeout long enough for a request to finish")
    return (f"{head} ({'; '.join(parts)}): {measured} measure nothing; valid: "
            + (" and ".join(valid) or "a workload with requests"))

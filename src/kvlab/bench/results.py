"""What a bench run measured, in the simulator's schema, and the files ``kvlab bench --out DIR`` writes.

The files are a contract (docs/bench.md, "What is measured"; ``kvlab calibrate`` reads them):

- ``requests.csv``: one row per request, REQUEST_COLUMNS; times in s since the bench started, empty when unknown.
- ``token_times.jsonl``: per request {"request_id", "times": [s of each streamed chunk that carried >= 1 token],
  "num_tokens": [tokens in each chunk]}.
- ``metrics.csv``: the scraped /metrics, long format: time, name, value (summed over label sets; histograms as
  their _sum and _count series).
- ``summary.json``: exactly what ``kvlab bench --json`` prints.

Latencies are measured from the moment the request was sent (``send_time``), as a client sees them:
    ttft = first_token_time − send_time
    tpot = (finish_time − first_token_time) / (num_output_tokens − 1)      (requests with ≥ 2 tokens)
    e2e_latency = finish_time − send_time                                   (finished requests only)
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path

STATUSES = ("finished", "failed", "timeout")

REQUEST_COLUMNS = (
    "request_id", "arrival_time", "prompt_len", "requested_output_tokens", "num_output_tokens", "status", "error",
    "send_time", "first_token_time", "finish_time", "ttft", "tpot", "e2e_latency", "finish_reason",
)


@dataclass(frozen=True)
class RequestResult:
    """One request's outcome, as the client saw it; every request of a run has exactly one."""

    request_id: int
    arrival_time: float  # the workload's
    prompt_len: int
    requested_output_tokens: int  # the max_tokens sent
    num_output_tokens: int  # tokens received
    status: str  # finished | failed | timeout
    error: str = ""
    send_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None  # the last token for a finished request; when it ended for the others
    token_times: tuple[float, ...] = ()
    token_counts: tuple[int, ...] = ()
    # The server's finish_reason: "stop" (an end-of-sequence token or a stop string), "length" (max_tokens, or the
    # server's own cap: max_model_len, a max_tokens limit), None when the stream gave none.
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None or self.send_time is None:
            return None
        return self.first_token_time - self.send_time

    @property
    def tpot(self) -> float | None:
        if self.status != "finished" or self.num_output_tokens < 2:
            return None
        if self.first_token_time is None or self.finish_time is None:
            return None
        return (self.finish_time - self.first_token_time) / (self.num_output_tokens - 1)

    @property
    def e2e_latency(self) -> float | None:
        if self.status != "finished" or self.send_time is None or self.finish_time is None:
            return None
        return self.finish_time - self.send_time

    def row(self) -> dict:
        """The request's row of requests.csv and of ``requests`` in the JSON summary."""
        return {name: getattr(self, name) for name in REQUEST_COLUMNS}


@dataclass(frozen=True)
class MetricSample:
    time: float  # s since the bench started
    name: str
    value: float


def summarize(results: list[RequestResult], makespan: float, server_counters: dict | None) -> dict:
    """The summary keys of ``kvlab run --json`` for what was measured, plus the failures.

    ``makespan`` runs from the first request's send to the last request's end (as kvlab run's runs from the first
    arrival); ``server_counters`` are the server's own counts over the run (differences of its /metrics
    counters), None when it publishes none."""
    from collections import Counter

    from kvlab.metrics import distribution

    finished = [r for r in results if r.status == "finished"]

    def dist(attr: str) -> dict:
        return distribution([v for r in finished if (v := getattr(r, attr)) is not None])

    short = [r for r in finished if r.num_output_tokens < r.requested_output_tokens]
    num_output_tokens = sum(r.num_output_tokens for r in finished)
    normalized = [e2e / r.num_output_tokens for r in finished
                  if r.num_output_tokens and (e2e := r.e2e_latency) is not None]
    return {
        "name": "bench",
        "num_requests": len(results),
        "num_finished": len(finished),
        "num_failed": sum(r.status == "failed" for r in results),
        "num_timeout": sum(r.status == "timeout" for r in results),
        # Finished, but with fewer tokens than asked, by the server's finish_reason (SHORT_REASONS).
        "num_short": len(short),
        "short_finish_reasons": dict(Counter(r.finish_reason or "none" for r in short).most_common()),
        "errors": error_counts(results),
        "throughput_rps": len(finished) / makespan if makespan > 0 else 0.0,
        "throughput_tps": num_output_tokens / makespan if makespan > 0 else 0.0,
        "makespan_s": makespan,
        "ttft_s": dist("ttft"),
        "tpot_s": dist("tpot"),
        "e2e_latency_s": dist("e2e_latency"),
        "normalized_latency_s_per_token": distribution(normalized),
        "preemptions": None if server_counters is None else server_counters.get("preemptions"),
        "num_prompt_tokens_sent": sum(r.prompt_len for r in results if r.send_time is not None),
        "num_output_tokens_received": sum(r.num_output_tokens for r in results),
        "server_counters": server_counters,
    }


# The one part of an error that is the request's own (kvlab.bench.client's wording: "after 3 tokens", ": 2 of 9
# tokens", "after 3 of 7 tokens"): requests that ended the same way are counted on one line, the counts as ranges.
_TOKEN_COUNTS = re.compile(r"(?:after |: )(?P<got>\d+) (?:of (?P<asked>\d+) )?tokens")


def error_counts(results: list[RequestResult]) -> dict[str, int]:
    """How many requests ended with each error, most first; errors that differ only in the request's token counts
    are one, their counts given as ranges ("0 of 20–53 tokens")."""
    from collections import Counter

    groups: dict[tuple[str, str], list[re.Match]] = {}
    plain: Counter[str] = Counter()
    for r in results:
        match = _TOKEN_COUNTS.search(r.error) if r.error else None
        if match is None:
            plain.update([r.error] if r.error else [])
            continue
        key = (r.error[:match.start("got")], r.error[match.end():])
        groups.setdefault(key, []).append(match)
    for (head, tail), matches in groups.items():
        asked = [int(m["asked"]) for m in matches if m["asked"] is not None]
        counts = _span([int(m["got"]) for m in matches]) + (f" of {_span(asked)}" if asked else "")
        plain[f"{head}{counts} tokens{tail}"] += len(matches)
    return dict(plain.most_common())


def _span(values: list[int]) -> str:
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}–{high}"


def why_short(num_short: int, reasons: dict[str, int]) -> str:
    """Why finished requests got fewer tokens than the max_tokens sent, read from the server's finish_reason."""
    why = {"stop": "at an end-of-sequence token or stop string (finish_reason \"stop\"): try --ignore-eos",
           "length": ("at the server's own cap (finish_reason \"length\" before the max_tokens sent: its "
                      "max_model_len or a max_tokens limit; --ignore-eos will not help)"),
           "none": "with no finish_reason in the stream"}
    parts = [f"{n:,} stopped {why.get(reason, f'with finish_reason {reason!r}')}" for reason, n in reasons.items()]
    return f"{num_short:,} finished requests got fewer tokens than asked: " + "; ".join(parts) + "."


def _cell(value) -> str | int | float:
    return "" if value is None else value


def write_requests_csv(results: list[RequestResult], path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(REQUEST_COLUMNS)
        for result in results:
            row = result.row()
            writer.writerow([_cell(row[name]) for name in REQUEST_COLUMNS])
    return path


def write_token_times(results: list[RequestResult], path: Path) -> Path:
    with path.open("w") as f:
        for result in results:
            record = {"request_id": result.request_id, "times": list(result.token_times),
                      "num_tokens": list(result.token_counts)}
            f.write(json.dumps(record) + "\n")
    return path


def write_metrics_csv(samples: list[MetricSample], path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("time", "name", "value"))
        for sample in samples:
            writer.writerow((sample.time, sample.name, sample.value))
    return path


BENCH_FILES = ("requests.csv", "token_times.jsonl", "metrics.csv", "summary.json")  # what write_bench_files writes


def write_bench_files(results: list[RequestResult], samples: list[MetricSample], summary: dict,
                      out_dir: Path) -> list[Path]:
    """The four contract files in ``out_dir`` (created if missing)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    requests, token_times, metrics, summary_path = (out_dir / name for name in BENCH_FILES)
    summary_path.write_text(json.dumps(summary, indent=2))
    return [write_requests_csv(results, requests), write_token_times(results, token_times),
            write_metrics_csv(samples, metrics), summary_path]


def read_requests_csv(path: Path) -> list[dict]:
    """requests.csv back as dicts of numbers (empty cells as None): what ``kvlab calibrate`` and the tests read."""
    ints = {"request_id", "prompt_len", "requested_output_tokens", "num_output_tokens"}
    text = {"status", "error", "finish_reason"}
    rows = []
    with path.open(newline="") as f:
        for raw in csv.DictReader(f):
            row: dict = {}
            for name, value in raw.items():
                if name in text:
                    row[name] = None if name == "finish_reason" and not value else value
                elif value == "":
                    row[name] = None
                else:
                    row[name] = int(value) if name in ints else float(value)
            rows.append(row)
    return rows

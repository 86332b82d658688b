"""The server's own account of its iterations, for ``kvlab calibrate --server-log``.

vLLM started with ``--enable-logging-iteration-details`` logs one line per engine step (vllm/v1/metrics/loggers.py:
``_log_iteration_details``):

    Engine 000: Iteration(1538): 1 context requests, 24 context tokens, 7 generation requests, 7 generation tokens,
    iteration elapsed time: 21.03 ms, CPU KV cache usage: 4.4%

It says exactly what the step held (context requests are prefilling, generation requests decoding), how much of the
KV cache its requests held afterwards (their context, to a block), and how long its forward pass took, measured
inside the engine core from dispatching the batch to the model runner to having its sampled tokens
(vllm/v1/engine/core.py: ``capture_iteration_details``). A streaming client sees none of this directly: its chunk
gaps also hold the API server's streaming and every pause of a shared machine, and what a step held has to be
guessed from the requests' timelines (calibrate.py).

The rest of an iteration (scheduling, update_from_output, the message queue between the engine core and the model
runner) is outside ``elapsed``, and grows with the number of requests the step held. vLLM's inter-token-latency
histogram (``vllm:inter_token_latency_seconds``) times consecutive tokens of a request from the engine core's
output timestamps, so it holds whole iterations, each once per generation token. Between two scrapes j of
/metrics, the steps that ran (numbered by the scraped step counter below) and the histogram's growth give

    ITL_sum_j − Σ_{steps i in j} generation_tokens_i × elapsed_i = Σ_i generation_tokens_i × (a + b × num_seqs_i)

and the outside part of a step, ``a + b × num_seqs``, is the non-negative least-squares fit of a and b over the
scrapes (measured on the CPU server: a 0.8–3.6 ms, b 0.12–0.53 ms per request).

Which lines belong to a bench: the steps are numbered from the engine's start, and the bench scraped the number of
steps so far (``vllm:iteration_tokens_total_count``, one observation per step) at its start and its end: the
bench's steps are those numbered from the first scrape's count up to the last's.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from kvlab.errors import KvlabError

ITERATION_LINE = re.compile(
    r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation requests, "
    r"(\d+) generation tokens, iteration elapsed time: ([\d.]+) ms.*? KV cache usage: ([\d.]+)%"
)
STEP_COUNTER = "vllm:iteration_tokens_total_count"
STEP_TOKENS = "vllm:iteration_tokens_total_sum"  # the tokens each step scheduled, summed: a log's steps must add up to it
LOG_TIME = re.compile(r"\b(\d\d-\d\d \d\d:\d\d:\d\d)\b")  # vLLM's "INFO 12-07 01:16:01 [loggers.py:199]"
# A log's steps are the bench's when their tokens add up to what the bench scraped: within this share (the last
# scrape may miss the last steps' tokens; the matched runs of trial 56 were 0.5% apart, a log of another run 34%).
TOKEN_TOLERANCE = 0.1
ITL = "vllm:inter_token_latency_seconds"


def read_steps(path: Path, times: dict[int, str] | None = None) -> dict[int, tuple[int, int, int, int, float, float]]:
    """{step: (context requests, context tokens, generation requests, generation tokens, elapsed s, KV cache
    usage)}; the usage is the fraction of the blocks (the null block aside) held after the step. ``times`` receives
    each step's logged time ("12-07 01:16:01"), where the line has one."""
    if not path.is_file():
        raise KvlabError(f"--server-log {str(path)!r} is not a file: give the log of the vLLM server the bench ran "
                         "against")
    steps = {}
    with path.open(errors="replace") as f:
        for line in f:
            m = ITERATION_LINE.search(line)
            if m:
                *counts, elapsed_ms, usage_percent = m.groups()
                steps[int(counts[0])] = (*(int(c) for c in counts[1:]), float(elapsed_ms) / 1e3,
                                         float(usage_percent) / 100)
                if times is not None and (stamp := LOG_TIME.search(line)) is not None:
                    times[int(counts[0])] = stamp.group(1)
    if not steps:
        raise KvlabError(f"{path} has no per-iteration lines (\"Iteration(N): ... iteration elapsed time: ... ms\"): "
                         "start the server with --enable-logging-iteration-details")
    return steps  # type: ignore[return-value]


def read_metrics(path: Path) -> dict[str, list[tuple[float, float]]]:
    """{metric: [(time, value) of each scrape, in time order]} of a bench's metrics.csv (time, name, value); a
    file cut short or not in that form is refused by name and line."""
    import io

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KvlabError(f"{path}: cannot read it ({exc}); valid: the metrics.csv kvlab bench wrote") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if text.strip() and not {"time", "name", "value"} <= set(reader.fieldnames or ()):
        raise KvlabError(f"{path} has the columns {reader.fieldnames}; valid: time, name, value (kvlab bench's "
                         "metrics.csv)")
    out: dict[str, list[tuple[float, float]]] = {}
    for number, row in enumerate(reader, 2):
        try:
            out.setdefault(row["name"], []).append((float(row["time"]), float(row["value"])))
        except (TypeError, ValueError):
            raise KvlabError(f"{path} line {number} is not a scrape (time, name, value as numbers): "
                             f"{','.join(str(v) for v in row.values())!r} (the file is cut short?)") from None
    return {name: sorted(samples) for name, samples in out.items()}


def _scrapes(directory: Path) -> dict[str, list[tuple[float, float]]]:
    """{metric: [(time, value) of each scrape, in time order]} of metrics.csv."""
    path = directory / "metrics.csv"
    if not path.is_file():
        raise KvlabError(f"{str(directory)!r} has no metrics.csv: --server-log needs the bench's scrapes of /metrics "
                         "(kvlab bench without --metrics-interval 0)")
    return read_metrics(path)


def bench_steps(directory: Path, steps: dict, times: dict[int, str] | None = None, started: str | None = None
                ) -> tuple[list[tuple[int, int, int, int, float, float]], float, float]:
    """The logged steps of the bench in ``directory`` and the part of a step outside ``elapsed``, as
    (a, b): a + b × num_seqs seconds (the module's docstring). A log whose steps of those numbers do not add up to
    the tokens the bench scraped is another server run's (``times``: the steps' logged times, ``started``: the
    bench's, for the refusal)."""
    scraped = _scrapes(directory)
    for name in (STEP_COUNTER, f"{ITL}_sum", f"{ITL}_count"):
        if name not in scraped:
            raise KvlabError(f"{directory / 'metrics.csv'} has no {name}: --server-log needs a vLLM server's /metrics")
    counter = scraped[STEP_COUNTER]
    first, last = int(counter[0][1]), int(counter[-1][1])
    rows = [steps[i] for i in range(first, last) if i in steps]
    if len(rows) < (last - first) / 2:
        raise KvlabError(f"the server log has {len(rows)} of the {last - first} steps of the bench in {directory} "
                         f"(numbered {first} to {last - 1}): give the log of the server that bench ran against")
    _check_same_run(directory, scraped, rows, [times.get(i) for i in range(first, last) if i in steps] if times else [],
                    started)
    return rows, *_outside(counter, dict(scraped[f"{ITL}_sum"]), steps)


def _check_same_run(directory: Path, scraped: dict, rows: list, times: list, started: str | None) -> None:
    """Refuse a log whose steps (numbered as the bench's) scheduled other tokens than the bench's server did: the
    step numbers restart with every server, so another run's log has steps of the same numbers."""
    tokens = scraped.get(STEP_TOKENS)
    if not tokens:  # (a vLLM without the histogram: the numbers alone)
        return
    expected = tokens[-1][1] - tokens[0][1]
    logged = sum(r[1] + r[3] for r in rows)
    if abs(logged - expected) <= TOKEN_TOLERANCE * max(expected, 1.0):
        return
    stamped = [t for t in times if t]
    when = "" if not stamped else f", logged {stamped[0]}" + (f" to {stamped[-1]}" if stamped[-1] != stamped[0] else "")
    bench_when = f"the bench started {started}" if started else "the bench's start time is not in its summary.json"
    raise KvlabError(f"the server log's steps {int(scraped[STEP_COUNTER][0][1])} to {int(scraped[STEP_COUNTER][-1][1]) - 1}"
                     f"{when}, scheduled {logged:,} tokens, but the server of the bench in {directory} scheduled "
                     f"{expected:,.0f} in its steps of those numbers ({STEP_TOKENS}; {bench_when}): the log is another "
                     "server run's; give the log of the server that bench ran against")


def _outside(counter: list[tuple[float, float]], itl_sum: dict[float, float], steps: dict) -> tuple[float, float]:
    """(a, b) of the outside part a + b × num_seqs, from the scrapes' growth of the step counter and of the
    inter-token latencies' sum (read at the same scrape times)."""
    import numpy as np
    from scipy.optimize import nnls

    rows, rhs = [], []
    for (t0, c0), (t1, c1) in zip(counter, counter[1:]):
        interval = [steps[i] for i in range(int(c0), int(c1)) if i in steps]
        if t0 not in itl_sum or t1 not in itl_sum or len(interval) < int(c1) - int(c0) or not interval:
            continue
        generation = sum(r[3] for r in interval)
        if generation == 0:
            continue
        rows.append([generation, sum(r[3] * (r[0] + r[2]) for r in interval)])
        rhs.append(itl_sum[t1] - itl_sum[t0] - sum(r[3] * r[4] for r in interval))
    if len(rows) < 2:
        return 0.0, 0.0
    matrix, excess = np.asarray(rows, dtype=float), np.asarray(rhs)
    scale = matrix.max(axis=0)  # (columns of very different sizes: a count and a count × batch size)
    (a, b), _ = nnls(matrix / scale, excess)
    return float(a / scale[0]), float(b / scale[1])

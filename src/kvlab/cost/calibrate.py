"""``kvlab calibrate``: fit an absolute cost profile to a real server's measurements (``kvlab bench --out DIR``).

Two sources of iterations. With ``--server-log``, the server's own log of every step (vLLM's ``--enable-logging-
iteration-details``: what each step held and how long it took, server_log.py), which a machine's pauses and the API
server's streaming do not touch: on a shared CPU they dominate what a client sees (docs/cost.md, "Validation
against the real vLLM server"). Without it, what a streaming client sees: consecutive chunks of a decoding request
are one iteration apart (docs/bench.md: token_times.jsonl): a chunk closes the iterations that started at the chunk
before, one per token it carried. Chunks less than BURST_GAP_S apart are one burst (a server whose streaming fell
behind sends a backlog at once): their tokens count as one chunk's. What an iteration held is read off every
request's timeline at its midpoint:

    decoding   = requests whose first token came before the midpoint and whose last came after it
    prefilling = requests whose first token came within a quarter iteration of its end (their prompt ran in it)
    num_seqs = decoding + prefilling;  num_decode_tokens = decoding;  num_prefill_tokens = Σ prefilling prompts
    num_context_tokens = Σ decoding (prompt + tokens so far) + Σ prefilling prompts

Many requests observe the same iteration; observations that start and end together are merged (median). The
iteration times are then fitted by least squares (scipy's least_squares, constants >= 0, weighted by the
iterations each observation spans) with the cost model's own expression (kvlab/cost/model.py, absolute kind):

    t = max(weights_read_s + context_token_s × num_context_tokens, token_s × num_tokens)
        + overhead_s + seq_overhead_s × num_seqs + prefill_token_overhead_s × num_prefill_tokens

(on the CPU engine the larger side is the engine's step or, with many requests, the API server's streaming of
their tokens, which runs beside it). Each constant gets a standard error from the Jacobian at the fit
(σ² (JᵀJ)⁻¹); a constant the data cannot tell from the others (what it multiplies never varies, varies in step
with another's, or never sets the time) is refused by name, with the data that would identify it.

``request_latency_s``, a request's time outside the engine, is not an iteration's: it is the median over requests
of their time to first token less the iteration that prefilled them and half the one before, leaving out those
sent while the server's scraped queue (metrics.csv: vllm:num_requests_waiting) was not empty.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from kvlab.errors import KvlabError, require_scipy

# Constants calibrate can fit and the data that identifies each.
FIT_HINTS = {
    "weights_read_s": "a bench where some iterations are bound by the engine's fixed step (a low rate: small "
                      "batches) and others by per-token work (a rate near capacity: large batches)",
    "context_token_s": "a bench with prompts and outputs of varying length (context grows as requests decode)",
    "token_s": "a bench at a rate near or above capacity, where batches grow until per-token work sets the time",
    "overhead_s": "iterations of more varied batches (a rate between idle and saturated), so that the fixed "
                  "per-iteration cost is told from the per-request and per-token ones",
    "seq_overhead_s": "a bench where the number of running requests varies (a rate between idle and saturated, "
                      "Poisson or gamma arrivals)",
    "prefill_token_overhead_s": "a bench where requests arrive while others decode, with prompts of varying length",
    "request_latency_s": "more finished requests sent while the server had none waiting (a rate below capacity: "
                         "their time to first token is then their prefill and this latency)",
}
ITERATION_CONSTANTS = ("weights_read_s", "context_token_s", "token_s", "overhead_s", "seq_overhead_s",
                       "prefill_token_overhead_s")
DEFAULT_FIT = (*ITERATION_CONSTANTS, "request_latency_s")
MIN_ITERATIONS_PER_CONSTANT = 10
MIN_FIRST_TOKENS = 5
COLLINEAR = 1e-6  # 1 - R² of a Jacobian column on the others below this: not separable
CONSTANT = 1e-6  # a Jacobian column whose range is below this share of its size: the same in every iteration
BURST_GAP_S = 5e-4  # chunks closer than this are one burst (no engine iteration is this short)


# Where iterations are timed from when no server log is given.
TOKEN_STREAMS = "the token streams"


@dataclass(frozen=True)
class Wording:
    """How a refusal names the data and what data would identify each constant: a bench's (kvlab calibrate), or
    the real engine's own steps (kvlab vllm calibrate, vllm/timing.py)."""

    data: str = "the bench data"
    hints: Mapping[str, str] = field(default_factory=lambda: MappingProxyType(FIT_HINTS))
    more: str = "bench more requests or longer outputs"


BENCH = Wording()


class Unidentifiable(KvlabError):
    """The data cannot identify ``constant``; the message says why and what data would."""

    def __init__(self, message: str, constant: str) -> None:
        super().__init__(message)
        self.constant = constant


@dataclass(frozen=True)
class Iterations:
    """Observed iterations, one numpy array per column, the idle arrivals' TTFTs, and where they came from."""

    duration: object  # seconds per iteration
    weight: object  # iterations the observation spans
    num_seqs: object
    num_prefill_tokens: object
    num_decode_tokens: object
    num_context_tokens: object
    end: object  # when each observed iteration ended (s since its bench started)
    bench: object  # which bench folder (index into sources) each came from
    first_tokens: tuple  # (bench, send_time, first_token_time, prompt_len, queued) of each finished request
    num_requests: int
    sources: tuple[str, ...]
    observed_by: str = TOKEN_STREAMS
    client: Iterations | None = None  # the client's observations, when these are the server log's

    def __len__(self) -> int:
        return len(self.duration)


def read_bench(directory: Path) -> tuple[list[dict], dict[int, tuple[list[float], list[int]]], dict]:
    """requests.csv rows, {request_id: (chunk times, tokens per chunk)}, summary.json (docs/bench.md, "What it
    writes"); a file that is empty, cut short or not what kvlab bench writes is refused by name."""
    if not directory.is_dir():
        raise KvlabError(f"{str(directory)!r} is not a folder: give folders written by kvlab bench --out DIR")
    for name in ("requests.csv", "token_times.jsonl"):
        if not (directory / name).is_file():
            raise KvlabError(f"{str(directory)!r} has no {name}: give a folder written by kvlab bench --out DIR")
    requests = _read_requests(directory / "requests.csv")
    times: dict[int, tuple[list[float], list[int]]] = {}
    for number, line in enumerate(_text(directory / "token_times.jsonl").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            times[int(row["request_id"])] = ([float(t) for t in row["times"]], [int(n) for n in row["num_tokens"]])
        except (ValueError, KeyError, TypeError) as exc:
            raise KvlabError(f"{directory / 'token_times.jsonl'} line {number} is not a token-times row "
                             f"({{request_id, times, num_tokens}}): {exc}") from None
    summary_path = directory / "summary.json"
    summary = read_json_object(summary_path) if summary_path.is_file() else {}
    _check_seconds(directory, requests, times, summary)
    return requests, times, summary


# No served engine's step takes this long (a token every 5 s): a bench whose median gap per token is longer holds
# its times in another unit (milliseconds read as seconds: a 20 ms step reads as 20 s).
MOST_ITERATION_S = 5.0


def _check_seconds(directory: Path, requests: list[dict], times: dict, summary: dict) -> None:
    """Refuse a bench whose times are not seconds (a file converted to milliseconds): requests that span far more
    than the summary's makespan_s, or a median gap per token no engine step takes."""
    import numpy as np

    sends = [float(r["send_time"]) for r in requests if r.get("finish_time")]
    finishes = [float(r["finish_time"]) for r in requests if r.get("finish_time")]
    makespan = summary.get("makespan_s")
    if sends and isinstance(makespan, int | float) and not isinstance(makespan, bool) and makespan > 0:
        span = max(finishes) - min(sends)
        if span > 10 * makespan + 1:
            raise KvlabError(f"{directory / 'requests.csv'}: send_time to finish_time span {span:,.4g}, but "
                             f"summary.json's makespan_s is {makespan:,.4g} s: the times are not in seconds "
                             "(milliseconds?); valid: seconds since the bench started, as kvlab bench writes them")
    gaps = [(b - a) / n for chunk_times, counts in times.values()
            for a, b, n in zip(chunk_times, chunk_times[1:], counts[1:]) if n > 0]
    if gaps and (median := float(np.median(gaps))) > MOST_ITERATION_S:
        raise KvlabError(f"{directory / 'token_times.jsonl'}: the median gap per token between a request's chunks "
                         f"('times') is {median:,.4g} s, longer than any served engine step ({MOST_ITERATION_S:g} s): "
                         "the times are not in seconds (milliseconds?); valid: seconds since the bench started, as "
                         "kvlab bench writes them")


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KvlabError(f"{path}: cannot read it ({exc}); valid: the text file kvlab bench wrote") from None


def read_json_object(path: Path) -> dict:
    """A JSON file whose top level is an object (kvlab bench's summary.json), or a one-line refusal naming it."""
    text = _text(path)
    if not text.strip():
        raise KvlabError(f"{path} is empty; valid: the JSON object kvlab bench writes (run the bench again, or "
                         "remove the file)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KvlabError(f"{path} is not valid JSON ({exc}); valid: the JSON object kvlab bench writes") from None
    if not isinstance(data, dict):
        raise KvlabError(f"{path} holds a JSON {type(data).__name__}; valid: the JSON object kvlab bench writes")
    return data


REQUEST_COLUMNS = {"request_id": int, "prompt_len": int, "status": str, "send_time": float,
                   "first_token_time": float, "finish_time": float}


def _read_requests(path: Path) -> list[dict]:
    """requests.csv's rows, each with the columns calibrate reads, as numbers where they are numbers (a time may
    be empty: the request never got that far)."""
    import io

    rows = list(csv.DictReader(io.StringIO(_text(path), newline="")))
    missing = set(REQUEST_COLUMNS) - set(rows[0] if rows else {})
    if rows and missing:
        raise KvlabError(f"{path} lacks the column {min(missing)!r} (the columns kvlab bench writes: docs/bench.md)")
    for number, row in enumerate(rows, 2):
        for column, kind in REQUEST_COLUMNS.items():
            value = row.get(column)
            if value is None:
                raise KvlabError(f"{path} line {number} has no {column!r} cell (the file is cut short?); valid: "
                                 "every row with all the columns of the header")
            if kind is str or (value == "" and column in ("send_time", "first_token_time", "finish_time")):
                continue
            try:
                number_value = kind(value)
            except ValueError:
                raise KvlabError(f"{path} line {number}: {column} = {value!r} is not a "
                                 f"{'whole number' if kind is int else 'number'}") from None
            if kind is float and not math.isfinite(number_value):
                raise KvlabError(f"{path} line {number}: {column} = {value!r}; valid: a finite number of seconds")
    return rows


def observe_iterations(directories: list[Path]) -> Iterations:
    """The iterations the token times of one or more bench folders show (see the module's docstring)."""
    import numpy as np

    names = ("end", "duration", "weight", "num_seqs", "num_prefill_tokens", "num_decode_tokens",
             "num_context_tokens")
    columns: dict[str, list[float]] = {k: [] for k in (*names, "bench")}
    first_tokens = []
    num_requests = 0
    for index, directory in enumerate(directories):
        requests, times, _ = read_bench(directory)
        timelines = _timelines(requests, times)
        num_requests += len(timelines)
        for row in _merged(_observations(timelines)):
            for key, value in zip(names, row):
                columns[key].append(value)
            columns["bench"].append(index)
        queue = _queue_samples(directory)
        first_tokens += [(index, float(r["send_time"]), float(r["first_token_time"]), int(r["prompt_len"]),
                          _queued(queue, float(r["send_time"])))
                         for r in requests if r.get("status") == "finished" and r.get("first_token_time")]
    arrays = {k: np.asarray(v, dtype=float) for k, v in columns.items()}
    return Iterations(**arrays, first_tokens=tuple(first_tokens), num_requests=num_requests,
                      sources=tuple(str(d) for d in directories))


def logged_iterations(directories: list[Path], server_log: Path) -> Iterations:
    """The iterations the server's own log shows for each bench folder (server_log.py): exactly what each step
    held (its context to a block, from the KV cache usage), and its time (the forward pass as logged, plus the
    rest of an iteration as vLLM's inter-token latency shows it, per step and per request in the step). The
    requests' first tokens are the client's, as in ``observe_iterations``."""
    import numpy as np

    from kvlab.cost.server_log import bench_steps, read_steps

    times: dict[int, str] = {}
    steps = read_steps(server_log, times)
    columns: dict[str, list[float]] = {k: [] for k in ("duration", "num_seqs", "num_prefill_tokens",
                                                       "num_decode_tokens", "num_context_tokens", "bench")}
    for index, directory in enumerate(directories):
        _, _, summary = read_bench(directory)
        block_size, num_gpu_blocks = (summary.get("server", {}).get(k) for k in ("block_size", "num_gpu_blocks"))
        if not isinstance(block_size, int) or not isinstance(num_gpu_blocks, int):
            raise KvlabError(f"{directory / 'summary.json'} does not say the server's block_size and num_gpu_blocks "
                             "(a bench of a vLLM server has them): --server-log reads each step's context off its KV "
                             "cache usage")
        started = summary.get("client", {}).get("started_at") if isinstance(summary.get("client"), dict) else None
        rows, outside_s, outside_per_seq_s = bench_steps(directory, steps, times, started)
        for num_prefilling, num_prefill_tokens, num_decoding, num_decode_tokens, elapsed_s, usage in rows:
            num_seqs = num_prefilling + num_decoding
            # The blocks held, less half a block per request (its last block is partly filled).
            context = max(0.0, usage * (num_gpu_blocks - 1) * block_size - num_seqs * block_size / 2)
            duration = elapsed_s + outside_s + outside_per_seq_s * num_seqs
            for key, value in zip(columns, (duration, num_seqs, num_prefill_tokens, num_decode_tokens, context, index)):
                columns[key].append(value)
    arrays = {k: np.asarray(v, dtype=float) for k, v in columns.items()}
    client = observe_iterations(directories)
    num = len(arrays["duration"])
    return Iterations(**arrays, weight=np.ones(num), end=np.full(num, np.nan),
                      first_tokens=client.first_tokens, num_requests=client.num_requests, sources=client.sources,
                      observed_by=f"the server's log ({server_log})", client=client)


def _queue_samples(directory: Path) -> tuple[list[float], list[float]]:
    """(times, values) of the server's vllm:num_requests_waiting from metrics.csv (empty without one)."""
    from kvlab.cost.server_log import read_metrics

    path = directory / "metrics.csv"
    samples = read_metrics(path).get("vllm:num_requests_waiting", []) if path.is_file() else []
    return [t for t, _ in samples], [v for _, v in samples]


def _queued(queue: tuple[list[float], list[float]], t: float) -> bool:
    """Whether the server had requests waiting at the last scrape before ``t`` or the first after it."""
    import bisect

    times, values = queue
    k = bisect.bisect_right(times, t)
    return any(values[j] > 0 for j in (k - 1, k) if 0 <= j < len(values))


def _timelines(requests: list[dict], times: dict) -> list[tuple[int, list[float], list[int]]]:
    """(prompt_len, chunk times, cumulative tokens after each chunk) of every finished request with a stream;
    chunks of one burst (less than BURST_GAP_S apart) are one chunk at the burst's last time."""
    out = []
    for row in requests:
        rid = int(row["request_id"])
        if row.get("status") != "finished" or rid not in times or not times[rid][0]:
            continue
        chunk_times, cumulative, total = [], [], 0
        for t, n in zip(*times[rid]):
            total += n
            if chunk_times and t - chunk_times[-1] < BURST_GAP_S:
                chunk_times[-1], cumulative[-1] = t, total
            else:
                chunk_times.append(t)
                cumulative.append(total)
        out.append((int(row["prompt_len"]), chunk_times, cumulative))
    return out


def _observations(timelines) -> list[tuple[float, float, list[float]]]:
    """(start, end, [iterations, num_seqs, num_prefill_tokens, num_decode_tokens, num_context_tokens]) per chunk
    after a request's first."""
    import bisect

    import numpy as np

    firsts = np.array([t[1][0] for t in timelines])
    lasts = np.array([t[1][-1] for t in timelines])
    prompts = np.array([t[0] for t in timelines], dtype=float)
    order = np.argsort(firsts)
    sorted_firsts = firsts[order]
    observations = []
    for _, chunk_times, cumulative in timelines:
        for k in range(1, len(chunk_times)):
            start, end = chunk_times[k - 1], chunk_times[k]
            num_iterations = cumulative[k] - cumulative[k - 1]
            duration = (end - start) / num_iterations
            mid = start + (end - start) / 2
            decoding = np.nonzero((firsts < mid) & (lasts > mid))[0]
            lo = bisect.bisect_right(sorted_firsts, end - duration / 4)
            hi = bisect.bisect_right(sorted_firsts, end + duration / 4)
            prefilling = order[lo:hi]
            context = sum(prompts[i] + _tokens_before(timelines[i], mid) for i in decoding)
            num_prefill = float(prompts[prefilling].sum())
            observations.append((start, end, [float(num_iterations), float(len(decoding) + len(prefilling)),
                                              num_prefill, float(len(decoding)), float(context + num_prefill)]))
    return observations


def _tokens_before(timeline, t: float) -> int:
    import bisect

    _, chunk_times, cumulative = timeline
    k = bisect.bisect_right(chunk_times, t)
    return cumulative[k - 1] if k else 0


def _merged(observations) -> list[list[float]]:
    """One row per iteration (or run of iterations): observations whose start and end agree within a fifth of
    their span (the same iterations, seen by several requests) merged; the duration is their median."""
    import numpy as np

    observations.sort(key=lambda o: (o[1], o[0]))
    rows, group = [], []

    def close() -> None:
        durations = [(end - start) / state[0] for start, end, state in group]
        rows.append([group[0][1], float(np.median(durations)), *group[len(group) // 2][2]])

    for obs in observations:
        if group:
            start, end, _ = group[0]
            tolerance = (end - start) / 5
            if abs(obs[1] - end) > tolerance or abs(obs[0] - start) > tolerance:
                close()
                group = []
        group.append(obs)
    if group:
        close()
    return rows


@dataclass(frozen=True)
class Fit:
    constants: dict[str, float]  # every absolute constant: fitted, or 0 where not fitted
    sigma: dict[str, float]  # standard error of each fitted constant
    fitted: tuple[str, ...]
    num_iterations: int
    num_requests: int
    num_first_tokens: int  # requests whose time to first token request_latency_s was read from
    rms_residual_s: float
    median_abs_relative_residual: float
    r2: float
    mean_duration_s: float
    sources: tuple[str, ...]
    observed_by: str = TOKEN_STREAMS

    def profile(self, name: str, model: str = "", gpu: str = "") -> dict:
        """The fit as a profile document (profiles.py) that --cost takes."""
        shown = ", ".join(f"{k} {self.constants[k]:.4g} ± {self.sigma[k]:.2g}" for k in self.fitted)
        not_fitted = [k for k in self.constants if k not in self.fitted]
        source = (
            f"kvlab calibrate: {self.num_iterations} iterations timed from {self.observed_by} for "
            f"{self.num_requests} requests in {', '.join(self.sources)} (kvlab bench --out), fitted by least "
            f"squares (scipy, constants >= 0): {shown} s; residuals rms {self.rms_residual_s * 1e3:.3g} ms "
            f"(median {self.median_abs_relative_residual:.1%} of an iteration), R² {self.r2:.3f}"
            + (f"; request_latency_s from the time to first token of {self.num_first_tokens} requests"
               if "request_latency_s" in self.fitted else "")
            + (f". Not fitted (0): {', '.join(not_fitted)}." if not_fitted else ".")
        )
        return {
            "name": name, "kind": "absolute", "source": source, "model": model, "gpu": gpu,
            "constants": dict(self.constants),
            "fit": {"sources": list(self.sources), "num_iterations": self.num_iterations,
                    "num_requests": self.num_requests, "num_first_tokens": self.num_first_tokens,
                    "fitted": list(self.fitted), "sigma": {k: self.sigma[k] for k in self.fitted},
                    "rms_residual_s": self.rms_residual_s,
                    "median_abs_relative_residual": self.median_abs_relative_residual, "r2": self.r2,
                    "mean_iteration_s": self.mean_duration_s, "observed_by": self.observed_by},
        }


def predicted(x: dict, num_seqs, num_prefill_tokens, num_decode_tokens, num_context_tokens):
    """The absolute cost model's time (attention pairs aside), from constants by name (numpy arrays)."""
    import numpy as np

    return (np.maximum(x["weights_read_s"] + x["context_token_s"] * num_context_tokens,
                       x["token_s"] * (num_prefill_tokens + num_decode_tokens))
            + x["overhead_s"] + x["seq_overhead_s"] * num_seqs + x["prefill_token_overhead_s"] * num_prefill_tokens)


def fit_iterations(its: Iterations, fit: tuple[str, ...] = DEFAULT_FIT, wording: Wording = BENCH) -> Fit:
    """Least squares over the observed iterations; Unidentifiable (a KvlabError) when the data cannot identify a
    requested constant, with the --fit it does identify (tried: leaving that constant out can leave another
    unidentified), KvlabError when there are too few iterations."""
    try:
        return _fit_once(its, fit, wording)
    except Unidentifiable as exc:
        raise Unidentifiable(f"{exc}. {_advice(its, fit, wording, exc.constant)}", exc.constant) from None


def _advice(its: Iterations, fit: tuple[str, ...], wording: Wording, refused: str) -> str:
    """'Or leave it out: --fit ...' with a --fit this data does identify: the constants asked for less ``refused``
    and each further one the data then cannot identify (or, where none fits, what data would)."""
    names = [k for k in fit if k != refused]
    dropped = []
    while "overhead_s" in names:
        try:
            _fit_once(its, tuple(names), wording)
        except Unidentifiable as exc:
            if exc.constant == "overhead_s":
                break
            names.remove(exc.constant)
            dropped.append(exc.constant)
            continue
        except KvlabError:
            break
        also = f" (without it this data does not identify {', '.join(dropped)} either)" if dropped else ""
        return f"Or leave it out: --fit {','.join(names)}{also}"
    return f"Leaving it out does not help: no smaller --fit with overhead_s fits this data; {wording.more}"


def _fit_once(its: Iterations, fit: tuple[str, ...], wording: Wording) -> Fit:
    import numpy as np

    from kvlab.cost.profiles import ABSOLUTE_CONSTANTS

    unknown = [k for k in fit if k not in FIT_HINTS]
    if unknown:
        raise KvlabError(f"--fit {unknown[0]!r}: calibrate fits {', '.join(FIT_HINTS)}")
    if "overhead_s" not in fit:
        raise KvlabError("--fit must include overhead_s (every iteration has one)")
    iteration_fit = tuple(k for k in ITERATION_CONSTANTS if k in fit)
    needed = MIN_ITERATIONS_PER_CONSTANT * len(iteration_fit)
    if len(its) < needed:
        raise KvlabError(
            f"{wording.data} shows {len(its)} timed iterations (from {its.num_requests} finished requests); fitting "
            f"{len(iteration_fit)} constants needs at least {needed}: {wording.more}"
        )
    x, sigma, residual = _least_squares(its, iteration_fit, wording)
    constants = dict.fromkeys(ABSOLUTE_CONSTANTS, 0.0)
    constants.update(x)
    num_first_tokens = 0
    if "request_latency_s" in fit:
        constants["request_latency_s"], sigma["request_latency_s"], num_first_tokens = _request_latency(
            its, constants, wording)
    y, w = its.duration, its.weight
    mean = float(np.average(y, weights=w))
    total = float((w * (y - mean) ** 2).sum())
    rss = float((w * residual**2).sum())
    return Fit(
        constants=constants, sigma=sigma, fitted=tuple(k for k in DEFAULT_FIT if k in fit),
        num_iterations=len(y), num_requests=its.num_requests, num_first_tokens=num_first_tokens,
        rms_residual_s=math.sqrt(rss / float(w.sum())),
        median_abs_relative_residual=float(np.median(np.abs(residual) / y)),
        r2=1 - rss / total if total > 0 else 1.0, mean_duration_s=mean, sources=its.sources,
        observed_by=its.observed_by,
    )


def _least_squares(its: Iterations, names: tuple[str, ...], wording: Wording = BENCH):
    """(constants, standard errors, residuals) of the weighted fit, from several starts (the max makes it
    non-convex); refuses constants the Jacobian at the fit cannot separate."""
    import numpy as np

    require_scipy("kvlab calibrate")
    from scipy.optimize import least_squares

    y, sqrt_w = its.duration, np.sqrt(its.weight)
    state = (its.num_seqs, its.num_prefill_tokens, its.num_decode_tokens, its.num_context_tokens)
    tokens = its.num_prefill_tokens + its.num_decode_tokens
    # Scales: each constant's typical contribution is about one mean iteration.
    typical = {"weights_read_s": 1.0, "overhead_s": 1.0, "context_token_s": its.num_context_tokens.mean(),
               "token_s": tokens.mean(), "seq_overhead_s": its.num_seqs.mean(),
               "prefill_token_overhead_s": max(its.num_prefill_tokens.mean(), 1e-9)}
    scale = np.array([float(y.mean()) / max(typical[k], 1e-9) for k in names])

    def constants(v) -> dict:
        return {**dict.fromkeys(ITERATION_CONSTANTS, 0.0), **dict(zip(names, v * scale))}

    def residuals(v):
        return (predicted(constants(v), *state) - y) * sqrt_w

    best = None
    # Starts: the per-token side setting the time from a percentile of the batches' tokens on (or never), with
    # and without a per-sequence share (the max makes the problem non-convex).
    for crossing in (None, 50, 75, 90, 97):
        for seq_share in (0.0, 0.3):
            v0 = np.full(len(names), 0.3)
            if "token_s" in names:
                v0[names.index("token_s")] = 0.0 if crossing is None else float(
                    y.mean() / np.percentile(tokens, crossing)) / scale[names.index("token_s")]
            if "seq_overhead_s" in names:
                v0[names.index("seq_overhead_s")] = seq_share
            result = least_squares(residuals, v0, bounds=(0, np.inf), method="trf", x_scale=1.0)
            if best is None or result.cost < best.cost:
                best = result
    jac = best.jac * (1 / scale)  # d residual / d constant
    _check_identifiable(jac / sqrt_w[:, None], names, wording)
    dof = max(1, len(y) - len(names))
    s2 = 2 * best.cost / dof
    cov = s2 * np.linalg.pinv(jac.T @ jac)
    sigma = {k: float(np.sqrt(max(cov[i, i], 0.0))) for i, k in enumerate(names)}
    x = {k: float(v) for k, v in zip(names, best.x * scale)}
    return x, sigma, best.fun / sqrt_w


def _check_identifiable(jac, names: tuple[str, ...], wording: Wording = BENCH) -> None:
    """Each constant's column of the Jacobian must vary on its own: not all zero (it never sets the time), not
    constant unless it is the overhead, not a combination of the others' columns (the overhead's is the others'
    to avoid)."""
    import numpy as np

    def refuse(name: str, why: str) -> None:  # (fit_iterations adds the --fit that this data does identify)
        raise Unidentifiable(f"{wording.data} cannot identify {name}: {why}. Data that would: {wording.hints[name]}",
                             name)

    num = len(jac)
    # First a side of the max that never sets the time: then the constants beside it look constant too.
    for i, name in enumerate(names):
        if not np.any(jac[:, i]):
            refuse(name, f"in none of the {num} timed iterations does it set the time (the other side of the max "
                         f"does)")
    for i, name in enumerate(names):
        if name == "overhead_s":  # (every step has the overhead: what moves in step with it is the other one)
            continue
        column = jac[:, i]
        # (the Jacobian is numerical: a column that is constant in truth varies in its last digits)
        if np.ptp(column) <= CONSTANT * np.abs(column).max():
            refuse(name, f"what it multiplies is the same in all {num} timed iterations, so it cannot be told from "
                         f"the per-iteration overhead")
        rest = np.delete(jac, i, axis=1)
        if rest.shape[1]:
            coef, *_ = np.linalg.lstsq(rest, column, rcond=None)
            spread = float(((column - column.mean()) ** 2).sum())
            if float(((column - rest @ coef) ** 2).sum()) < COLLINEAR * spread:
                refuse(name, f"over the {num} timed iterations it moves the time in step with "
                             f"{', '.join(k for k in names if k != name)}")


def _request_latency(its: Iterations, constants: dict, wording: Wording = BENCH) -> tuple[float, float, int]:
    """A request's time outside the engine: its time to first token less the iteration that prefilled it (ended
    at its first token) and half the one before (it reached the engine at some point of it; none when the engine
    was idle). Each iteration's duration as observed, or as fitted where no other request observed it. The
    median over requests, its standard error and how many requests."""
    import numpy as np

    observed = its.client or its
    gaps = []
    for bench, send, first, prompt_len, queued in its.first_tokens:
        if queued:  # it waited for a seat: its gap holds that wait too
            continue
        own = _observed(observed, bench, first)
        if own is None:  # nobody else decoding: the prefill ran alone
            own = float(predicted(constants, 1.0, float(prompt_len), 0.0, float(prompt_len)))
        before = _observed(observed, bench, first - own) or 0.0
        gaps.append(first - own - before / 2 - send)
    n = len(gaps)
    if n < MIN_FIRST_TOKENS:
        raise Unidentifiable(f"{wording.data} cannot identify request_latency_s: {n} of its {len(its.first_tokens)} "
                             "finished requests were sent while no request waited at the server (metrics.csv's "
                             f"vllm:num_requests_waiting), and it needs {MIN_FIRST_TOKENS}. Data that would: "
                             f"{wording.hints['request_latency_s']}", "request_latency_s")
    gaps = np.asarray(gaps)
    return max(0.0, float(np.median(gaps))), float(1.2533 * np.std(gaps) / math.sqrt(n)), n


def _observed(its: Iterations, bench: int, end: float) -> float | None:
    """The duration of the observed iteration of that bench that ended at ``end`` (within a fifth of it)."""
    import numpy as np

    near = np.nonzero((its.bench == bench) & (np.abs(its.end - end) <= its.duration / 5))[0]
    return float(its.duration[near[np.argmin(np.abs(its.end[near] - end))]]) if len(near) else None


def calibrate(directories: list[Path], fit: tuple[str, ...] | None = None, server_log: Path | None = None) -> Fit:
    """The fit of ``fit`` (default: every constant the data can give) to the bench folders' iterations, as the
    token streams show them or, with ``server_log``, as the server logged them."""
    if not directories:
        raise KvlabError("give at least one folder written by kvlab bench --out DIR")
    from kvlab.cost.profiles import MAX_SECONDS

    its = observe_iterations(directories) if server_log is None else logged_iterations(directories, server_log)
    result = fit_iterations(its, fit or DEFAULT_FIT)
    for name in result.fitted:
        if result.constants[name] > MAX_SECONDS:
            where = ", ".join(str(d) for d in directories) + (f" and {server_log}" if server_log else "")
            raise KvlabError(f"the fit to {where} gives {name} = {result.constants[name]:,.4g} s, more than any cost "
                             f"profile takes ({MAX_SECONDS:g} s): the bench's times are not in seconds "
                             "(milliseconds?); valid: requests.csv and token_times.jsonl in seconds since the bench "
                             "started, as kvlab bench writes them")
    return result


# Below this R², or above this median residual (a share of an iteration), a fit explains the iterations poorly.
POOR_R2, POOR_MEDIAN_RESIDUAL = 0.5, 0.2


def fit_quality(fit: Fit) -> tuple[str, str | None]:
    """One line on how well the fit explains the iterations (R², median residual), and, where it is poor, a
    warning: what of the profile still holds, what does not, and what data would fit better (None otherwise)."""
    line = (f"Fit: the cost model explains {max(fit.r2, 0.0):.0%} of the variation in the {fit.num_iterations:,} "
            f"iterations' times (R² {fit.r2:.3f}); half of them are off by more than "
            f"{fit.median_abs_relative_residual:.1%} of their time.")
    if fit.r2 >= POOR_R2 and fit.median_abs_relative_residual <= POOR_MEDIAN_RESIDUAL:
        return line, None
    better = ("a quieter machine (nothing else running: its pauses are in the server's steps too), and a bench "
              "whose batches vary more (Poisson arrivals at a rate between idle and saturated, prompts of varying "
              "length)") if fit.observed_by != TOKEN_STREAMS else (
              "the server's own log of its steps (--server-log: the token streams hold the client's and the "
              "machine's pauses), a quieter machine, and a bench whose batches vary more (Poisson arrivals at a "
              "rate between idle and saturated, prompts of varying length)")
    return line, (f"a poor fit (R² below {POOR_R2:g} or a median residual above {POOR_MEDIAN_RESIDUAL:.0%}): the "
                  "profile is written, and may still predict typical (median) latencies, but not the tail: do not "
                  f"trust its p90/p99 predictions. Data that would fit better: {better}")


def significance(fit: Fit, wording: Wording = BENCH) -> list[str]:
    """Sentences on the constants the data barely constrains (an uncertainty as large as the value)."""
    out = []
    for k in fit.fitted:
        value, sigma = fit.constants[k], fit.sigma[k]
        if not math.isfinite(sigma) or sigma >= abs(value):
            out.append(f"{k} = {value:.3g} ± {sigma:.2g} s: not distinguishable from 0 with this data "
                       f"({wording.hints[k]} would pin it down)")
    return out

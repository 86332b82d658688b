"""``kvlab calibrate``: fit an absolute cost profile to a real server's measurements (``kvlab bench --out DIR``).

What a streaming client sees is enough to time the engine's iterations. Consecutive chunks of a decoding request
are one iteration apart (CONTRACTS.md: token_times.jsonl), so each one-token chunk after the first closes an
observed iteration that started at the chunk before. What that iteration held is read off every request's
timeline at its midpoint:

    decoding   = requests whose first token came before the midpoint and whose last came after it
    prefilling = requests whose first token came within half an iteration of its end (their prompt ran in it)
    num_seqs = decoding + prefilling;  num_decode_tokens = decoding;  num_prefill_tokens = Σ prefilling prompts
    num_context_tokens = Σ decoding (prompt + tokens so far) + Σ prefilling prompts

Many requests observe the same iteration; observations that start and end together are merged (median). Then
the iteration times are fitted by linear least squares with non-negative constants (scipy's lsq_linear):

    t = overhead_s + seq_overhead_s × num_seqs + prefill_token_overhead_s × num_prefill_tokens
        + context_token_s × num_context_tokens

which is the cost model's expression (kvlab/cost/model.py) with no weights read and no compute side: on a machine
where per-step CPU time dominates (the CPU engine) that is the whole time. Each constant gets a standard error
from the Jacobian (here the design matrix: σ² (XᵀX)⁻¹); a constant the data cannot tell from the others (no
variation in what it multiplies, or variation in step with another's) is refused by name, with the data that
would identify it.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

from kvlab.errors import KvlabError

# Constants calibrate can fit, with what each multiplies and the data that identifies it.
FIT_COLUMNS = {
    "overhead_s": ("1", "any iterations"),
    "seq_overhead_s": ("num_seqs", "a bench where the number of running requests varies (a rate between idle and "
                                   "saturated, or Poisson/gamma arrivals rather than a constant batch)"),
    "prefill_token_overhead_s": ("num_prefill_tokens", "a bench where requests arrive while others decode, with "
                                                       "prompts of varying length"),
    "context_token_s": ("num_context_tokens", "a bench with prompts and outputs of varying length (context grows "
                                              "as requests decode)"),
}
DEFAULT_FIT = tuple(FIT_COLUMNS)
MIN_ITERATIONS_PER_CONSTANT = 10
COLLINEAR = 1e-6  # 1 - R² of a column on the others below this: not separable


@dataclass(frozen=True)
class Iterations:
    """Observed iterations, one array per column (numpy), and where they came from."""

    duration: object
    num_seqs: object
    num_prefill_tokens: object
    num_decode_tokens: object
    num_context_tokens: object
    num_requests: int
    sources: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.duration)

    def column(self, name: str):
        import numpy as np

        return np.ones(len(self)) if name == "1" else getattr(self, name)


def read_bench(directory: Path) -> tuple[list[dict], dict[int, tuple[list[float], list[int]]], dict]:
    """requests.csv rows, {request_id: (chunk times, tokens per chunk)}, summary.json (CONTRACTS.md)."""
    if not directory.is_dir():
        raise KvlabError(f"{str(directory)!r} is not a folder: give folders written by kvlab bench --out DIR")
    for name in ("requests.csv", "token_times.jsonl"):
        if not (directory / name).is_file():
            raise KvlabError(f"{str(directory)!r} has no {name}: give a folder written by kvlab bench --out DIR")
    with (directory / "requests.csv").open(newline="") as f:
        requests = list(csv.DictReader(f))
    times: dict[int, tuple[list[float], list[int]]] = {}
    for number, line in enumerate((directory / "token_times.jsonl").read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            times[int(row["request_id"])] = ([float(t) for t in row["times"]], [int(n) for n in row["num_tokens"]])
        except (ValueError, KeyError, TypeError) as exc:
            raise KvlabError(f"{directory / 'token_times.jsonl'} line {number} is not a token-times row "
                             f"({{request_id, times, num_tokens}}): {exc}") from None
    summary_path = directory / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return requests, times, summary


def observe_iterations(directories: list[Path]) -> Iterations:
    """The iterations the token times of one or more bench folders show (see the module's docstring)."""
    import numpy as np

    columns: dict[str, list[float]] = {k: [] for k in ("duration", "num_seqs", "num_prefill_tokens",
                                                       "num_decode_tokens", "num_context_tokens")}
    num_requests = 0
    for directory in directories:
        requests, times, _ = read_bench(directory)
        timelines = _timelines(requests, times)
        num_requests += len(timelines)
        for row in _merged(_observations(timelines)):
            for key, value in zip(columns, row):
                columns[key].append(value)
    arrays = {k: np.asarray(v, dtype=float) for k, v in columns.items()}
    return Iterations(**arrays, num_requests=num_requests, sources=tuple(str(d) for d in directories))


def _timelines(requests: list[dict], times: dict) -> list[tuple[int, list[float], list[int]]]:
    """(prompt_len, chunk times, cumulative tokens after each chunk) of every finished request with a stream."""
    out = []
    for row in requests:
        if row.get("status") != "finished":
            continue
        rid = int(row["request_id"])
        if rid not in times or not times[rid][0]:
            continue
        chunk_times, chunk_tokens = times[rid]
        cumulative, total = [], 0
        for n in chunk_tokens:
            total += n
            cumulative.append(total)
        out.append((int(row["prompt_len"]), chunk_times, cumulative))
    return out


def _observations(timelines) -> list[tuple[float, float, list[float]]]:
    """(start, end, [num_seqs, num_prefill_tokens, num_decode_tokens, num_context_tokens]) per one-token chunk."""
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
            if cumulative[k] - cumulative[k - 1] != 1:
                continue  # several tokens in one chunk: several iterations
            start, end = chunk_times[k - 1], chunk_times[k]
            duration = end - start
            if duration <= 0:
                continue
            mid = start + duration / 2
            decoding = np.nonzero((firsts < mid) & (lasts > mid))[0]
            lo = bisect.bisect_right(sorted_firsts, end - duration / 2)
            hi = bisect.bisect_right(sorted_firsts, end + duration / 2)
            prefilling = order[lo:hi]
            context = sum(prompts[i] + _tokens_before(timelines[i], mid) for i in decoding)
            num_prefill = float(prompts[prefilling].sum())
            observations.append((start, end, [float(len(decoding) + len(prefilling)), num_prefill,
                                              float(len(decoding)), float(context + num_prefill)]))
    return observations


def _tokens_before(timeline, t: float) -> int:
    import bisect

    _, chunk_times, cumulative = timeline
    k = bisect.bisect_right(chunk_times, t)
    return cumulative[k - 1] if k else 0


def _merged(observations) -> list[list[float]]:
    """One row per iteration: observations whose start and end agree within a fifth of the iteration (the same
    iteration, seen by several requests) merged; the duration is their median."""
    import numpy as np

    observations.sort(key=lambda o: (o[1], o[0]))
    rows, group = [], []

    def close() -> None:
        durations = [end - start for start, end, _ in group]
        rows.append([float(np.median(durations)), *group[len(group) // 2][2]])

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
    rms_residual_s: float
    median_abs_relative_residual: float
    r2: float
    mean_duration_s: float
    sources: tuple[str, ...]

    def profile(self, name: str, model: str = "", gpu: str = "") -> dict:
        """The fit as a profile document (profiles.py) that --cost takes."""
        shown = ", ".join(f"{k} {self.constants[k]:.4g} ± {self.sigma[k]:.2g}" for k in self.fitted)
        not_fitted = [k for k in self.constants if k not in self.fitted]
        source = (
            f"kvlab calibrate: {self.num_iterations} iterations timed from the token streams of "
            f"{self.num_requests} requests in {', '.join(self.sources)} (kvlab bench --out), fitted by linear least "
            f"squares (scipy lsq_linear, constants >= 0): {shown} s; residuals rms {self.rms_residual_s * 1e3:.3g} ms "
            f"(median {self.median_abs_relative_residual:.1%} of an iteration), R² {self.r2:.3f}. Not fitted (0): "
            f"{', '.join(not_fitted)}."
        )
        return {
            "name": name, "kind": "absolute", "source": source, "model": model, "gpu": gpu,
            "constants": dict(self.constants),
            "fit": {"sources": list(self.sources), "num_iterations": self.num_iterations,
                    "num_requests": self.num_requests, "fitted": list(self.fitted),
                    "sigma": {k: self.sigma[k] for k in self.fitted}, "rms_residual_s": self.rms_residual_s,
                    "median_abs_relative_residual": self.median_abs_relative_residual, "r2": self.r2,
                    "mean_iteration_s": self.mean_duration_s},
        }


def fit_iterations(its: Iterations, fit: tuple[str, ...] = DEFAULT_FIT) -> Fit:
    """Least squares over the observed iterations; KvlabError when the data cannot identify a requested constant."""
    import numpy as np
    from scipy.optimize import lsq_linear

    from kvlab.cost.profiles import ABSOLUTE_CONSTANTS

    unknown = [k for k in fit if k not in FIT_COLUMNS]
    if unknown:
        raise KvlabError(f"--fit {unknown[0]!r}: calibrate fits {', '.join(FIT_COLUMNS)}")
    if "overhead_s" not in fit:
        raise KvlabError("--fit must include overhead_s (every iteration has one)")
    needed = MIN_ITERATIONS_PER_CONSTANT * len(fit)
    if len(its) < needed:
        raise KvlabError(
            f"the bench data shows {len(its)} timed iterations (from {its.num_requests} finished requests); fitting "
            f"{len(fit)} constants needs at least {needed}: bench more requests or longer outputs"
        )
    _check_identifiable(its, fit)
    x = np.column_stack([its.column(FIT_COLUMNS[k][0]) for k in fit])
    y = its.duration
    scale = np.linalg.norm(x, axis=0)
    result = lsq_linear(x / scale, y, bounds=(0, np.inf), method="bvls")
    beta = result.x / scale
    residual = y - x @ beta
    dof = max(1, len(y) - len(fit))
    s2 = float(residual @ residual) / dof
    cov = s2 * np.linalg.inv(x.T @ x)
    sigma = np.sqrt(np.diag(cov))
    constants = dict.fromkeys(ABSOLUTE_CONSTANTS, 0.0)
    constants.update({k: float(v) for k, v in zip(fit, beta)})
    total = float(((y - y.mean()) ** 2).sum())
    return Fit(
        constants=constants, sigma={k: float(s) for k, s in zip(fit, sigma)}, fitted=tuple(fit),
        num_iterations=len(y), num_requests=its.num_requests,
        rms_residual_s=float(np.sqrt(np.mean(residual**2))),
        median_abs_relative_residual=float(np.median(np.abs(residual) / y)),
        r2=1 - float(residual @ residual) / total if total > 0 else 1.0,
        mean_duration_s=float(y.mean()), sources=its.sources,
    )


def _check_identifiable(its: Iterations, fit: tuple[str, ...]) -> None:
    import numpy as np

    for name in fit:
        if name == "overhead_s":
            continue
        values = its.column(FIT_COLUMNS[name][0])
        others = [k for k in fit if k != name]
        if np.ptp(values) == 0:
            raise KvlabError(
                f"the bench data cannot identify {name}: {FIT_COLUMNS[name][0]} is {values[0]:g} in every one of the "
                f"{len(its)} timed iterations, so its cost cannot be told from the per-iteration overhead. Data that "
                f"would: {FIT_COLUMNS[name][1]}. Or leave it out: --fit {','.join(others)}"
            )
        rest = np.column_stack([its.column(FIT_COLUMNS[k][0]) for k in others])
        coef, *_ = np.linalg.lstsq(rest, values, rcond=None)
        unexplained = float(((values - rest @ coef) ** 2).sum()) / float(((values - values.mean()) ** 2).sum())
        if unexplained < COLLINEAR:
            raise KvlabError(
                f"the bench data cannot identify {name}: {FIT_COLUMNS[name][0]} varies in step with "
                f"{', '.join(FIT_COLUMNS[k][0] for k in others if k != 'overhead_s')} over the timed iterations. "
                f"Data that would: {FIT_COLUMNS[name][1]}. Or leave it out: --fit {','.join(others)}"
            )


def calibrate(directories: list[Path], fit: tuple[str, ...] = DEFAULT_FIT) -> Fit:
    if not directories:
        raise KvlabError("give at least one folder written by kvlab bench --out DIR")
    return fit_iterations(observe_iterations(directories), fit)


def significance(fit: Fit) -> list[str]:
    """Sentences on the constants the data barely constrains (an uncertainty as large as the value)."""
    out = []
    for k in fit.fitted:
        value, sigma = fit.constants[k], fit.sigma[k]
        if not math.isfinite(sigma) or sigma >= abs(value):
            out.append(f"{k} = {value:.3g} ± {sigma:.2g} s: not distinguishable from 0 with this data "
                       f"({FIT_COLUMNS[k][1]} would pin it down)")
    return out

"""How far a fitted profile's predictions are from the real engine: intervals from its leave-one-out errors.

A profile fitted on measured runs (``kvlab calibrate --runs``, kvlab/cost/fit.py) keeps, per run and metric, the
error of the run predicted by constants fitted on the other runs (``[fit.loo_error]``: predicted / measured − 1).
Over those runs, ``e`` is the ``coverage`` quantile of |error| (numpy's linear interpolation between the sorted
runs): in that share of the runs the prediction was within ``e`` of the measurement. For a predicted value v the
measured value then lies in

    [v / (1 + e), v / (1 − e)]                  (predicted / measured − 1 within ±e)

and a predicted rate (a throughput at saturation, a capacity) moves inversely with the time per output token, so
with the end-to-end mean's ``e`` (an answer's time, set by its decode iterations; every run's published E2E is its
own, where two runs' published ITL is not, docs/cost.md):

    [rate × (1 − e), rate × (1 + e)]

It says what the runs say and no more: the GPU they ran on, their models, their loads (the profile's ``[fit]``).
A profile that was not fitted on measured runs (roofline, the Vidur fits, a server calibration) has none: None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

COVERAGE = 0.9
# What each figure of a run's summary is judged by: (summary key, statistic) -> the measured metric whose errors
# bound it (the runs publish means, p90 and p99; a median is judged by the mean's errors).
SUMMARY_METRICS = {
    ("ttft_s", "mean"): "ttft_mean", ("ttft_s", "p50"): "ttft_mean", ("ttft_s", "p90"): "ttft_p90",
    ("ttft_s", "p99"): "ttft_p99",
    ("e2e_latency_s", "mean"): "e2e_mean", ("e2e_latency_s", "p50"): "e2e_mean", ("e2e_latency_s", "p90"): "e2e_p90",
    ("e2e_latency_s", "p99"): "e2e_p99",
    ("tpot_s", "mean"): "itl_mean", ("tpot_s", "p50"): "itl_mean",
    ("normalized_latency_s_per_token", "mean"): "itl_mean", ("normalized_latency_s_per_token", "p50"): "itl_mean",
}
RATE_METRIC = "e2e_mean"


@dataclass(frozen=True, slots=True)
class ErrorBand:
    """A profile's leave-one-out error quantiles (module doc)."""

    profile: str
    gpu: str  # the GPU the runs ran on ("" when they differ)
    num_runs: int
    coverage: float
    relative: MappingProxyType  # metric (e2e_mean, ttft_p99, ...) -> e, the coverage quantile of |LOO error|

    @property
    def covers(self) -> str:
        """What the interval covers, in words: "LOO p90 over 13 H100-SXM runs"."""
        return f"LOO p{self.coverage * 100:.0f} over {self.num_runs} {self.gpu + ' ' if self.gpu else ''}runs"

    def around(self, value: float, metric: str) -> tuple[float, float]:
        """Where the measured value lies, for a predicted latency ``value`` of ``metric``."""
        e = self.relative[metric]
        return value / (1.0 + e), (value / (1.0 - e) if e < 1.0 else float("inf"))

    def rate(self, rate: float) -> tuple[float, float]:
        """Where the real rate lies, for a predicted rate at saturation (throughput, capacity)."""
        e = self.relative[RATE_METRIC]
        return rate * max(0.0, 1.0 - e), rate * (1.0 + e)

    def intervals(self, summary: dict) -> dict:
        """For a run's summary (kvlab.metrics' keys: ttft_s, tpot_s, ...): each latency figure's interval, and the
        throughput's (which is a rate at saturation only: below it, the engine serves what arrives)."""
        out: dict = {}
        for (key, stat), metric in SUMMARY_METRICS.items():
            value = (summary.get(key) or {}).get(stat)
            if value is not None:  # (no upper bound, where the errors reached 100%: null)
                out.setdefault(key, {})[stat] = [b if b != float("inf") else None for b in self.around(value, metric)]
        if summary.get("throughput_rps") is not None:
            out["throughput_rps"] = list(self.rate(summary["throughput_rps"]))
        return out

    def as_dict(self) -> dict:
        return {"profile": self.profile, "gpu": self.gpu, "num_runs": self.num_runs, "coverage": self.coverage,
                "covers": self.covers, "relative": dict(self.relative), "rate_metric": RATE_METRIC}


def error_band(profile, coverage: float = COVERAGE) -> ErrorBand | None:
    """The band of a profile (a CostProfile or a built-in's name), from its ``[fit.loo_error]``; None without one."""
    import numpy as np

    from kvlab.cost.profiles import get_profile

    if isinstance(profile, str):
        profile = get_profile(profile)
    per_run = profile.fit.get("loo_error") or {}
    rows = [dict(errors) for errors in per_run.values() if isinstance(errors, Mapping)]
    if not rows:
        return None
    metrics = sorted(set.intersection(*(set(r) for r in rows)))
    relative = {m: float(np.quantile([abs(float(r[m])) for r in rows], coverage)) for m in metrics}
    return ErrorBand(profile=profile.name, gpu=str(profile.gpu or ""), num_runs=len(rows), coverage=coverage,
                     relative=MappingProxyType(relative))

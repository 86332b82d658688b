"""Capacity: the highest request rate at which a configuration still meets its latency target.

For each configuration (a point without its rate) the search brackets the capacity by doubling or halving the
rate from a first guess, then bisects the bracket until it is narrower than a relative tolerance:

    holds  ✓ at r  → lo = r, next 2r            (until a rate fails: the bracket [lo, hi] is found)
    fails  ✗ at r  → hi = r, next r/2           (until a rate holds, or below min_rate: capacity 0)
    then   r = (lo + hi) / 2                    (until hi / lo − 1 ≤ rtol)

The capacity is ``lo``, the highest rate that held: a conservative answer. Every rate tried is a sweep point,
stored like any other, so a search run twice (or beside a sweep over the same rates) reuses its simulations.
The target is mean normalized latency (the vLLM paper's metric: end-to-end latency ÷ output tokens, averaged
over requests) by default, or a percentile of TTFT, TPOT, end-to-end or normalized latency (``--slo``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kvlab.errors import KvlabError

METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_latency_s", "e2e_latency": "e2e_latency_s",
           "normalized": "normalized_latency_s_per_token", "normalized_latency": "normalized_latency_s_per_token"}
STATS = ("mean", "p50", "p90", "p99")
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
# The paper's Figure 12 curves sit at a few tens of ms per token until a system's queue starts to grow, then
# climb past 1 s per token; 0.1 s per token (a few times the unloaded value) is on the steep part of every curve.
DEFAULT_SLO = "mean_normalized_latency<0.1s"


@dataclass(frozen=True, slots=True)
class Slo:
    """A latency target: ``stat`` of ``metric`` (a summary entry, seconds) at most ``limit_s``."""

    text: str
    metric: str
    stat: str
    limit_s: float

    def value(self, summary: dict[str, Any] | None) -> float | None:
        if summary is None:
            return None
        return summary[self.metric][self.stat]

    def holds(self, summary: dict[str, Any] | None) -> bool:
        """Met, with every request served: a run that rejected or dropped requests did not sustain the rate."""
        value = self.value(summary)
        if summary is None or value is None or summary["num_finished"] == 0 or summary["num_rejected"] > 0:
            return False
        return value <= self.limit_s


def parse_slo(text: str) -> Slo:
    """``p99_ttft<2s``, ``p90_tpot<100ms``, ``mean_normalized_latency<0.1s`` -> Slo."""
    match = re.fullmatch(r"\s*(\w+?)_(\w+)\s*<=?\s*([0-9.eE+-]+)\s*(s|ms|us)\s*", text)
    example = 'e.g. "p99_ttft<2s", "p90_tpot<100ms", "mean_normalized_latency<0.1s"'
    if not match:
        raise KvlabError(f"--slo {text!r}: expected STAT_METRIC<VALUE with a unit (s or ms), {example}")
    stat, metric, number, unit = match.groups()
    if stat not in STATS:
        raise KvlabError(f"--slo {text!r}: {stat!r} is not a statistic kvlab reports; use {', '.join(STATS)}")
    if metric not in METRICS:
        raise KvlabError(f"--slo {text!r}: {metric!r} is not a latency kvlab reports; use "
                         f"{', '.join(sorted(METRICS))}")
    try:
        limit = float(number) * UNITS[unit]
    except ValueError:
        raise KvlabError(f"--slo {text!r}: {number!r} is not a number") from None
    if not limit > 0:
        raise KvlabError(f"--slo {text!r}: the limit must be positive")
    return Slo(text.strip(), METRICS[metric], stat, limit)


def round_rate(rate: float) -> float:
    """Rates to 4 significant digits: a search's points then have short, repeatable names in the store."""
    return float(f"{rate:.4g}")


@dataclass
class Search:
    """One configuration's search. ``next_rate()`` says what to simulate; ``record()`` takes the outcome."""

    start_rate: float
    rtol: float = 0.05
    min_rate: float = 1e-3
    max_rate: float = 1e4
    lo: float | None = None  # highest rate that held
    hi: float | None = None  # lowest rate that failed
    probes: list[tuple[float, float | None, bool]] = field(default_factory=list)  # (rate, value, held)
    error: str | None = None  # a point that failed to simulate ends the search

    def next_rate(self) -> float | None:
        """The next rate to try, or None when the search is over."""
        if self.error is not None:
            return None
        if not self.probes:
            return round_rate(self.start_rate)
        if self.lo is None:
            assert self.hi is not None  # a probe was made and did not hold
            rate = round_rate(self.hi / 2)
            return rate if rate >= self.min_rate else None
        if self.hi is None:
            rate = round_rate(self.lo * 2)
            return rate if rate <= self.max_rate else None
        if self.hi / self.lo - 1 <= self.rtol:
            return None
        rate = round_rate((self.lo + self.hi) / 2)
        return rate if self.lo < rate < self.hi else None

    def record(self, rate: float, value: float | None, held: bool) -> None:
        self.probes.append((rate, value, held))
        if held:
            self.lo = rate if self.lo is None else max(self.lo, rate)
        else:
            self.hi = rate if self.hi is None else min(self.hi, rate)

    @property
    def capacity(self) -> float:
        return self.lo or 0.0

    def to_json(self) -> dict[str, Any]:
        return {"capacity_rps": self.capacity, "bracket": [self.lo, self.hi], "num_simulations": len(self.probes),
                "probes": [{"rate": r, "value": v, "held": h} for r, v, h in self.probes], "error": self.error}


def search_capacities(configurations: list[dict[str, Any]], runner, slo: Slo, *, start_rates: list[float],
                      rtol: float = 0.05, max_rate: float = 1e4) -> list[Search]:
    """One search per configuration (a point's options without ``rate``), each from its first guess, all
    advancing together: each round simulates the next rate of every unfinished search at once, so a pool of N
    workers runs N searches side by side."""
    import json

    searches = [Search(start_rate=rate, rtol=rtol, max_rate=max_rate) for rate in start_rates]
    while True:
        batch = [(search, config, rate) for search, config in zip(searches, configurations)
                 if (rate := search.next_rate()) is not None]
        if not batch:
            return searches
        rows = runner.run([{**config, "rate": rate} for _, config, rate in batch])
        for (search, _, rate), row in zip(batch, rows):
            if row["status"] != "ok":
                search.error = row["error"]
                continue
            summary = json.loads(row["summary"])
            search.record(rate, slo.value(summary), slo.holds(summary))

"""Latency targets (SLOs) and whether a stored run meets one.

An SLO is one or more terms, comma-separated, all of which must hold:

    p99_ttft<2s,p99_tpot<100ms,p50_e2e<10s       a statistic of each latency over the window's requests
    ttft<2s,tpot<100ms  with --goodput 0.9       each request against every term; goodput (DistServe's): the
                                                 rate holds if at least 90% of the requests meet every term

Statistics: ``mean`` or ``pNN`` (any percentile, p50, p90, p99, p99.9). Latencies: ``ttft``, ``tpot``, ``e2e``
(end-to-end) and ``normalized`` (end-to-end ÷ output tokens, the vLLM paper's metric). Units: s, ms, us.

    p99_ttft<5s,abandoned<5%                     with client deadlines (--timeout, a file's timeout column): at
                                                 most 5% of the window's requests aborted when their client gave up

``abandoned`` is a share of the window's requests, not a latency: a percentage in (0%, 100%), no statistic, and
the same with --goodput (whose share of good requests counts an aborted one as not good); alone (``abandoned<5%``)
it asks for the highest rate at which at most that share of clients gives up. An aborted request is judged by it
alone (its latencies are left out: it got no answer to time, kvlab.window); without the term no client may give
up: a window with an aborted request misses "abandoned=0%".

Either way a rate holds only when the run sustained it (kvlab.window: the waiting queue grew neither in count nor
in its oldest wait over the measured window, and every request finished or was given up), and the latencies
judged are those of every request that arrived in the window (after the warm-up, up to the last arrival: a burst
at the end counts). A verdict that failed says which signal decided it: "overloaded: oldest wait grew: ...",
"backlogged: queue count grew ...", "missed p99_ttft<2s (2.41 s)", "missed abandoned<5% (7.3%)".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvlab.errors import KvlabError
from kvlab.window import LATENCY_METRICS

if TYPE_CHECKING:
    import numpy as np

METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_latency_s", "e2e_latency": "e2e_latency_s",
           "normalized": "normalized_latency_s_per_token", "normalized_latency": "normalized_latency_s_per_token"}
METRIC_WORDS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_latency_s": "end-to-end latency",
                "normalized_latency_s_per_token": "normalized latency"}
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
# The paper's Figure 12 curves sit at a few tens of ms per token until a system's queue starts to grow, then
# climb past 1 s per token; 0.1 s per token (a few times the unloaded value) is on the steep part of every curve.
DEFAULT_SLO = "mean_normalized_latency<0.1s"
EXAMPLE = 'e.g. "p99_ttft<2s", "p99_ttft<2s,p99_tpot<100ms", "mean_normalized_latency<0.1s", "abandoned<5%"'
_TERM = re.compile(r"\s*(?:(mean|p\d+(?:\.\d+)?)_)?([a-z_0-9]+?)\s*<=?\s*([0-9.eE+-]+)\s*([a-z%]*)\s*")
ABANDONED = "abandoned"  # the term on the share of requests whose client gave up (kvlab.window.abandoned_share)
NO_ABANDONED = "abandoned=0%"  # what a target without the term asks of that share


@dataclass(frozen=True, slots=True)
class Term:
    """``stat`` (mean, p99, ...; None: each request) of ``metric`` (a summary's latency name) at most ``limit_s``."""

    text: str
    metric: str
    stat: str | None
    limit_s: float

    @property
    def quantile(self) -> float | None:
        """p99 -> 0.99; None for the mean (and for a per-request term)."""
        return None if self.stat in (None, "mean") else float(self.stat[1:]) / 100

    def value(self, latencies: np.ndarray) -> float:
        """The statistic over the window's requests (``latencies``: kvlab.window.latencies' array): the same
        linear interpolation between order statistics as a summary's percentiles."""
        import numpy as np

        values = latencies[LATENCY_METRICS.index(self.metric)]
        values = values[~np.isnan(values)]
        if not len(values):
            return float("nan")
        if self.quantile is None:
            return float(values.mean())
        return _quantile(values, self.quantile)

    def met_by_each(self, latencies: np.ndarray) -> np.ndarray:
        """Which of the window's requests meet this term (a request without this latency, a one-token answer's
        TPOT, meets it)."""
        import numpy as np

        values = latencies[LATENCY_METRICS.index(self.metric)]
        return np.isnan(values) | (values <= self.limit_s)


def _quantile(values: np.ndarray, quantile: float) -> float:
    """NumPy's linear interpolation between order statistics, where a refused request's infinite latency counts as
    infinitely long: a quantile that takes any weight from an infinite order statistic is infinite, one that takes
    none is its finite neighbour (NumPy's own arithmetic gives NaN there and warns, inf - inf or inf x 0: trial 59)."""
    import numpy as np

    position = quantile * (len(values) - 1)
    low = int(position)
    weight = position - low
    neighbours = np.partition(values, (low, min(low + 1, len(values) - 1)))[low:low + 2]
    if not math.isinf(neighbours[-1]):
        return float(np.quantile(values, quantile))
    return float(neighbours[0]) if weight == 0.0 else math.inf


@dataclass(frozen=True, slots=True)
class Verdict:
    held: bool
    values: dict[str, float]  # each term's statistic (goodput: each term's share of requests meeting it)
    attainment: float | None  # goodput: the share of requests meeting every term
    reason: str  # why it failed ("" when it held)


@dataclass(frozen=True, slots=True)
class Slo:
    """A latency target: every term holds (``goodput`` None), or at least ``goodput`` of the requests meet every
    term."""

    text: str
    terms: tuple[Term, ...]
    goodput: float | None = None
    # ``abandoned<5%``: the most of the window's requests that may be aborted at their client's deadline (0.05), and
    # the term's text; None: none may be.
    max_abandoned: float | None = None
    abandoned_text: str | None = None

    @property
    def describe(self) -> str:
        if self.goodput is None:
            return self.text
        return f"{self.goodput:.0%} of requests with {self.text}"

    def judge(self, window: dict[str, Any] | None, latencies: np.ndarray | None) -> Verdict:
        """Whether a stored run (its window, kvlab.window.Window.to_dict, and its window's latencies) meets the
        target at a sustained rate."""
        import numpy as np

        if window is None or latencies is None:
            return Verdict(False, {}, None, "no measured window")
        if self.goodput is None:
            values = {t.text: t.value(latencies) for t in self.terms}
            missed = [f"{t.text} ({_seconds(values[t.text])})" for t in self.terms if not values[t.text] <= t.limit_s]
            attainment = None
        else:
            each = [t.met_by_each(latencies) for t in self.terms]
            values = {t.text: float(m.mean()) if len(m) else float("nan") for t, m in zip(self.terms, each)}
            every = np.logical_and.reduce(each) if len(latencies[0]) else np.zeros(0, dtype=bool)
            # (an aborted request is not in ``latencies``, and never counts as good: DistServe's goodput charges the
            # rate for the requests it lost, as kvlab.service.classes does)
            offered = len(every) + window.get("num_aborted", 0)
            attainment = float(every.sum()) / offered if offered else 0.0
            missed = [] if attainment >= self.goodput else [f"{attainment:.1%} of requests met every term"]
        share = _abandoned_share(window)
        bound = self.abandoned_text or NO_ABANDONED
        if self.abandoned_text is not None or share > 0:  # (the implicit bound's value only where it missed)
            values[bound] = share
        if share > (self.max_abandoned or 0.0):
            missed.append(f"{bound} ({share:.1%}" + (")" if self.abandoned_text else
                                                      ": without a term such as abandoned<5% no client may give up)"))
        if window["state"] != "stable":
            reason = f"{window['state']}: {window['decided_by']}"
        elif window["num_rejected"]:
            reason = f"{window['num_rejected']} requests refused"
        else:
            reason = "; ".join(f"missed {m}" for m in missed)
        return Verdict(not reason, values, attainment, reason)

    def value(self, verdict: Verdict) -> float | None:
        """What a plot shows of a verdict: the first term's statistic, or the attainment."""
        if self.goodput is not None:
            return verdict.attainment
        return verdict.values.get(self.terms[0].text if self.terms else self.abandoned_text or "")


def _abandoned_share(window: dict[str, Any]) -> float:
    """The share of the window's requests aborted at their client's deadline (kvlab.window.Window)."""
    arrived = window.get("num_arrived") or 0
    return window.get("num_aborted", 0) / arrived if arrived else 0.0


def _seconds(value: float) -> str:
    """A latency in the unit that reads best: 2.41 s, 87.3 ms, 450 us."""
    if value != value:
        return "no value"
    if value == math.inf:
        return "unbounded: refused requests"
    if value >= 1 or value == 0:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} us"


# The longest latency a target may name: a day (a limit past it bounds nothing a run of requests measures, and an
# infinite one, 1e999s, cannot be drawn on the plots' axes).
MAX_LIMIT_S = 86_400.0


def parse_slo(text: str, goodput: float | None = None) -> Slo:
    """``p99_ttft<2s,p90_tpot<100ms`` (and ``ttft<2s`` with a goodput share) -> Slo."""
    if goodput is not None and not 0 < goodput <= 1:
        raise KvlabError(f"--goodput {goodput:g}: the share of requests that must meet every term is in (0, 1], "
                         "e.g. 0.9")
    parts = text.split(",")
    if not text.strip() or any(not p.strip() for p in parts):
        raise KvlabError(f"--slo {text!r}: an empty term; expected STAT_METRIC<VALUE terms separated by commas, "
                         f"{EXAMPLE}")
    shares = [p.strip() for p in parts if (match := _TERM.fullmatch(p)) and match.group(2) == ABANDONED]
    if len(shares) > 1:
        raise KvlabError(f"--slo {text!r}: {shares[0]!r} and {shares[1]!r} both bound the abandoned share; give it "
                         "once")
    share = _abandoned_term(shares[0], text) if shares else None
    terms = [_term(p, text, goodput) for p in parts if p.strip() not in shares]
    if not terms and goodput is not None:
        raise KvlabError(f"--slo {text!r} with --goodput {goodput:g}: goodput needs a latency term to judge each "
                         f"request against, {EXAMPLE}")
    seen: dict[tuple[str, str | None], Term] = {}
    for term in terms:
        other = seen.setdefault((term.metric, term.stat), term)
        if other is not term:
            raise KvlabError(f"--slo {text!r}: {other.text!r} and {term.text!r} bound the same statistic twice; "
                             f"give each statistic of a latency once")
    return Slo(",".join([*(t.text for t in terms), *shares]), tuple(terms), goodput, share,
               shares[0] if shares else None)


def _abandoned_term(part: str, text: str) -> float:
    """``abandoned<5%`` -> 0.05: the most of the window's requests that may be aborted at their deadline."""
    where = f"--slo {text!r}" if part == text.strip() else f"--slo {text!r}: the term {part!r}"
    match = _TERM.fullmatch(part)
    assert match is not None
    stat, _, number, unit = match.groups()
    valid = "valid: a percentage above 0% and below 100%, e.g. abandoned<5%"
    if stat is not None:
        raise KvlabError(f"{where}: {ABANDONED} is the share of the window's requests whose client gave up, not a "
                         f"latency: no statistic ({stat!r}); {valid}")
    if unit != "%":
        what = f"{number} has no unit" if not unit else f"{number}{unit} is not a percentage"
        raise KvlabError(f"{where}: the share {what}; {valid}")
    try:
        percent = float(number)
    except ValueError:
        raise KvlabError(f"{where}: {number!r} is not a number; {valid}") from None
    if not 0 < percent < 100:
        raise KvlabError(f"{where}: {number}% is not a share a client may give up at; {valid} (without the term no "
                         "client may give up)")
    return percent / 100


def _term(part: str, text: str, goodput: float | None) -> Term:
    where = f"--slo {text!r}" if part.strip() == text.strip() else f"--slo {text!r}: the term {part.strip()!r}"
    match = _TERM.fullmatch(part)
    if not match:
        lower = " (names and units are lower case)" if part != part.lower() and _TERM.fullmatch(part.lower()) else ""
        raise KvlabError(f"{where}: expected STAT_METRIC<VALUE with a unit (s, ms or us){lower}, {EXAMPLE}")
    stat, metric, number, unit = match.groups()
    if metric not in METRICS:
        head = metric.split("_")[0]
        hint = (f" ({head!r} is not a statistic: use mean or pNN such as p99)" if head not in METRICS
                and "_" in metric else "")
        raise KvlabError(f"{where}: {metric!r} is not a latency kvlab reports; use {', '.join(sorted(METRICS))}"
                         + hint)
    if stat is not None and stat != "mean" and not 0 < float(stat[1:]) < 100:
        raise KvlabError(f"{where}: {stat!r} is not a percentile; use p1 to p99.9 (or mean)")
    if not unit:
        raise KvlabError(f"{where}: the limit {number} has no unit; use s, ms or us (e.g. {number}s, 100ms)")
    if unit == "%":
        raise KvlabError(f"{where}: a latency is bounded in s, ms or us, not %; a share bounds only "
                         f"{ABANDONED} (e.g. abandoned<5%)")
    if unit not in UNITS:
        raise KvlabError(f"{where}: {unit!r} is not a unit; use s, ms or us (e.g. 2s, 100ms)")
    try:
        limit = float(number) * UNITS[unit]
    except ValueError:
        raise KvlabError(f"{where}: {number!r} is not a number") from None
    if not 0 < limit <= MAX_LIMIT_S:
        raise KvlabError(f"{where}: the limit {number}{unit} is out of range; valid: a positive latency of at most "
                         f"{MAX_LIMIT_S:,.0f} s (a day)")
    if goodput is None and stat is None:
        raise KvlabError(f"{where}: which statistic? e.g. p99_{metric}<{number}{unit}, or judge each request "
                         f"against it with --goodput SHARE")
    if goodput is not None and stat is not None:
        raise KvlabError(f"{where}: with --goodput each request is judged against the term: write it without a "
                         f"statistic ({metric}<{number}{unit})")
    return Term(part.strip(), METRICS[metric], stat, limit)

"""Capacity: the highest request rate at which a configuration still meets its latency target.

For each configuration (a point without its rate) the search brackets the capacity by doubling or halving the
rate from a first guess, then bisects the bracket until it is narrower than a relative tolerance:

    holds  ✓ at r  → lo = r, next 2r            (until a rate fails: the bracket [lo, hi] is found)
    fails  ✗ at r  → hi = r, next r/2           (until a rate holds, or below min_rate: capacity 0)
    then   r = (lo + hi) / 2                    (until hi / lo − 1 ≤ rtol)

The capacity is ``lo``, the highest rate that held: a conservative answer. A rate holds only when its run
sustained it (kvlab.window: the engine kept up over the measured window) and the window's requests met the
target (kvlab.sweep.slo). The answer is only a lower bound when no rate tried failed, or when the run at ``lo``
was too short to load the engine (more seats than requests in its window: an overload could not show).
Every rate tried is a sweep point, stored like any other, so a search run twice (or beside a sweep over the
same rates) reuses its simulations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvlab.sweep.slo import DEFAULT_SLO, Slo, Verdict, parse_slo

__all__ = ["DEFAULT_SLO", "Search", "Slo", "parse_slo", "mark_text", "rate_text", "round_rate", "search_capacities", "verdict"]


FLOOR_RTOL = 0.01  # two halvings whose missed latencies differ by less: the latency's floor (Search.unreachable)
# What a failing rate's reason (kvlab.sweep.slo.Slo.judge) says limited the answer.
LIMITS = {"missed": "latency", "overloaded": "throughput", "backlogged": "throughput", "refused": "refusals"}


def _backlog_size(reason: str, window: dict[str, Any]) -> str:
    """How big a backlog that failed a rate was: a queue that grew by a couple of requests over a short sample is
    what the rule catches first, long before a latency target misses; said so that it does not read as the GPU
    running out (trial 53, finding 13)."""
    if not reason.startswith("backlogged") or "queue_first_half" not in window:
        return ""
    growth = (window["queue_second_half"] + window.get("decode_queue_second_half", 0.0)
              - window["queue_first_half"] - window.get("decode_queue_first_half", 0.0))
    return (f" (the queue grew by about {growth:.0f} requests over the window's {window['num_arrived']:,} arrivals: "
            "small, but growing, so a longer run would wait ever longer; the latency target may still hold on this "
            "short one)")


def round_rate(rate: float) -> float:
    """Rates to 4 significant digits: a search's points then have short, repeatable names in the store."""
    return float(f"{rate:.4g}")


def rate_text(rate: float) -> str:
    """A capacity to 3 significant digits (the search's 5% tolerance does not tell a fourth), rounded down: the
    rate shown never exceeds the rate that held."""
    if rate <= 0:
        return "0"
    step = 10 ** (math.floor(math.log10(rate)) - 2)
    value = math.floor(rate / step + 1e-9) * step
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def mark_text(mark: str, value: str) -> str:
    """A capacity with its mark: "≥ 2.5" (a lower bound), "2.5 ?" (too short to tell), "2.5"."""
    return f"≥ {value}" if mark == "≥" else f"{value} ?" if mark == "?" else value


def at_latency_floor(verdicts: list, windows: list) -> bool:
    """Two failed verdicts (of a lower rate, or of more replicas, one after the other) that show the latency at its
    floor: both sustained with nothing waiting, both missing the same terms by values within FLOOR_RTOL of each other,
    so taking load off again changes nothing the target judges."""
    (a, b), (wa, wb) = verdicts, windows
    if not (a.reason.startswith("missed") and b.reason.startswith("missed")):
        return False
    if any(w is None or w.get("state") != "stable" or w.get("oldest_wait_second_half_s", 1.0) > 0 for w in (wa, wb)):
        return False
    missed = [t for t in b.values if t in b.reason]
    return bool(missed) and all(t in a.values and math.isclose(a.values[t], b.values[t], rel_tol=FLOOR_RTOL)
                                for t in missed)


def beyond_reach(verdicts: list, windows: list, slo: Slo) -> str | None:
    """Where two failed verdicts (load halved between them: half the rate, or twice the replicas) were both sustained
    (stable), the words saying that no further halving meets the target; None where one might. While the load is
    sustained a request's latency above its idle floor grows with the load at least in proportion (convex through
    zero: the requests it shares its batches with, the queue it waits in), so halving the load again gains at most
    what the last halving gained; where every missed term still needs more than that, it is out of reach. (Latency
    targets only: a goodput target's values are shares.)"""
    (a, b), (wa, wb) = verdicts, windows
    if slo.goodput is not None or not (a.reason.startswith("missed") and b.reason.startswith("missed")):
        return None
    if any(w is None or w.get("state") != "stable" for w in (wa, wb)):
        return None
    missed = [t for t in slo.terms if t.text in b.reason and t.text in a.values and t.text in b.values]
    if not missed or any(b.values[t.text] - t.limit_s <= a.values[t.text] - b.values[t.text] for t in missed):
        return None
    t = missed[0]
    gained, needed = a.values[t.text] - b.values[t.text], b.values[t.text] - t.limit_s
    return (f"{t.text} missed at {_seconds(b.values[t.text])}, sustained; the last halving of the load gained "
            f"{_seconds(max(gained, 0.0))}, and all further halvings together gain at most as much (the latency above "
            f"its idle floor is convex in the load), less than the {_seconds(needed)} still needed")


def _seconds(value: float) -> str:
    return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.2f} s"


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
    verdicts: list[Verdict] = field(default_factory=list)  # one per probe
    windows: list[dict[str, Any]] = field(default_factory=list)  # one per probe: kvlab.window.Window.to_dict
    error: str | None = None  # a point that failed to simulate ends the search

    def next_rate(self) -> float | None:
        """The next rate to try, or None when the search is over."""
        if self.error is not None:
            return None
        if not self.probes:
            return round_rate(self.start_rate)
        if self.lo is None:
            assert self.hi is not None  # a probe was made and did not hold
            if self.unreachable is not None:
                return None
            rate = round_rate(self.hi / 2)
            return rate if rate >= self.min_rate else None
        if self.hi is None:
            rate = round_rate(self.lo * 2)
            return rate if rate <= self.max_rate else None
        if self.hi / self.lo - 1 <= self.rtol:
            return None
        rate = round_rate((self.lo + self.hi) / 2)
        return rate if self.lo < rate < self.hi else None

    def record(self, rate: float, value: float | None, held: bool, verdict: Verdict | None = None,
               window: dict[str, Any] | None = None) -> None:
        self.probes.append((rate, value, held))
        self.verdicts.append(verdict or Verdict(held, {}, None, "" if held else "missed"))
        self.windows.append(window or {})
        if held:
            self.lo = rate if self.lo is None else max(self.lo, rate)
        else:
            self.hi = rate if self.hi is None else min(self.hi, rate)

    @property
    def unreachable(self) -> str | None:
        """Why no rate will hold, when the latency has reached its floor: the last two rates tried (halving, nothing
        held yet) both sustained, nothing waiting, and missed the same terms by values within FLOOR_RTOL of each
        other: halving the rate again changes nothing the target judges. None otherwise."""
        if self.lo is not None or len(self.probes) < 2 or any(held for _, _, held in self.probes[-2:]):
            return None
        if not at_latency_floor(self.verdicts[-2:], self.windows[-2:]):
            return None
        rate, reason = self.probes[-1][0], self.verdicts[-1].reason
        if reason.startswith("missed abandoned"):  # (deadlines shorter than the answers take with no queue)
            return (f"{reason} even at {rate:g} req/s, with nothing waiting: the clients' deadlines (--timeout) are "
                    "shorter than their answers take with no queue, whatever the rate")
        return (f"{reason} even at {rate:g} req/s, with nothing waiting: the engine's latency with "
                "no queue (the slowest requests' own prefill or decode) is above the target, whatever the rate")

    @property
    def capacity(self) -> float:
        return self.lo or 0.0

    def window_at(self, rate: float | None) -> dict[str, Any]:
        for (r, _, _), window in zip(self.probes, self.windows):
            if r == rate:
                return window
        return {}

    @property
    def uncertified(self) -> str | None:
        """Why the answer is not certified (None: it is: a rate above it failed and the run at it loaded the
        engine). Either no rate tried failed (the answer is a lower bound, ``mark`` ≥), or the run at the answer was
        too short to load the engine (``mark`` ?): its queue had no time to build, so a longer run may fail at a
        lower rate; the answer may be too high as well as too low."""
        if self.error is not None or self.lo is None:
            return None
        window = self.window_at(self.lo)
        short = (f"the run at {self.lo:g} req/s was too short to load the engine ({window['num_arrived']} requests "
                 f"in its window, {window['num_seats']} seats): a longer run may fail at a lower rate"
                 ) if self.too_short else None
        if self.hi is None:
            return "no rate tried failed" + (f", and {short}" if short else "")
        return short

    @property
    def mark(self) -> str:
        """How the answer is marked: "?" (too short to load the engine), "≥" (a lower bound: no rate failed), or ""
        (certified)."""
        if self.uncertified is None:
            return ""
        return "?" if self.too_short else "≥"

    @property
    def answer(self) -> float | None:
        """The capacity as an answer: None where the run at it was too short to load the engine (``mark`` ?): its
        queue had no time to build, so the rate it held is no answer (``uncertified_rps`` in JSON keeps it)."""
        return None if self.mark == "?" else self.capacity

    @property
    def capacity_text(self) -> str:
        """The answer as the table and the lab print it: "2.5", "≥ 2.5" (a lower bound), "none (2.5 ?)" (no answer:
        the run at 2.5 req/s was too short to load the engine)."""
        shown = mark_text(self.mark, rate_text(self.capacity))
        return f"none ({shown})" if self.answer is None else shown

    @property
    def too_short(self) -> bool:
        """The run at the answer did not load the engine: a longer workload (not a higher rate) would tell more."""
        window = self.window_at(self.lo)
        return bool(window) and not window.get("loaded", True)

    @property
    def limited_by(self) -> str | None:
        """What stopped the answer going higher: the lowest failing rate's reason, e.g. "throughput: overloaded
        (served 91.2% of offered, ...) at 55 req/s" or "latency: missed p99_ttft<2s (2.41 s) at 55 req/s" (None:
        no rate failed)."""
        if self.hi is None:
            return None
        for (rate, _, held), verdict in zip(self.probes, self.verdicts):
            if rate == self.hi and not held:
                kind = "abandonment" if verdict.reason.startswith("missed abandoned") else next(
                    (k for word, k in LIMITS.items() if word in verdict.reason), "run")
                return f"{kind}: {verdict.reason} at {rate:g} req/s" + _backlog_size(verdict.reason,
                                                                                   self.window_at(rate))
        return None

    def to_json(self) -> dict[str, Any]:
        at = self.window_at(self.lo)
        return {"capacity_rps": self.answer, "uncertified_rps": self.capacity if self.answer is None else None,
                "capacity_text": self.capacity_text, "certified": self.uncertified is None,
                "lower_bound": self.mark == "≥", "too_short": self.mark == "?", "uncertified_reason": self.uncertified,
                "limited_by": self.limited_by, "unreachable": self.unreachable, "bracket": [self.lo, self.hi],
                "served_share_at_capacity": at.get("served_share"), "state_at_capacity": at.get("state"),
                "decided_by_at_capacity": at.get("decided_by"),
                # (with client deadlines only: the window's share aborted, and the whole run's wasted tokens)
                **({"abandoned_share_at_capacity": at.get("abandoned_share"),
                    "wasted_tokens_at_capacity": at.get("wasted_tokens")} if "wasted_tokens" in at else {}),
                "num_simulations": len(self.probes),
                "probes": [{"rate": r, "value": v, "held": h, "state": w.get("state"), "loaded": w.get("loaded"),
                            "served_share": w.get("served_share"), "decided_by": w.get("decided_by"),
                            "offered_rps": w.get("offered_rps"),
                            "served_rps": w.get("served_rps"), "values": verdict.values,
                            **({"abandoned_share": w.get("abandoned_share"), "wasted_tokens": w["wasted_tokens"]}
                               if "wasted_tokens" in w else {}),
                            "attainment": verdict.attainment, "reason": verdict.reason}
                           for (r, v, h), verdict, w in zip(self.probes, self.verdicts, self.windows)],
                "error": self.error}


def verdict(slo: Slo, row: dict[str, Any]) -> tuple[Verdict, dict[str, Any] | None]:
    """A stored row judged against ``slo``: the verdict and the row's measured window."""
    import json

    summary = json.loads(row["summary"]) if row.get("summary") else None
    window = None if summary is None else summary.get("window")
    # (clients had deadlines: the run's KV computed in vain travels with the window)
    if summary is not None and window is not None and "wasted_tokens" in summary:
        window = {**window, "wasted_tokens": summary["wasted_tokens"]}
    return slo.judge(window, window_latencies(row)), window


def window_latencies(row: dict[str, Any]):
    """A stored row's latencies of the requests in its measured window (kvlab.window.latencies' (4, n) array), or
    None for a row stored without them."""
    import numpy as np

    from kvlab.window import LATENCY_METRICS

    blob = row.get("window_latencies")
    return None if blob is None else np.frombuffer(blob, dtype=np.float64).reshape(len(LATENCY_METRICS), -1)


def window_p99_ttft(row: dict[str, Any]) -> float | None:
    """The p99 TTFT of a stored row's measured window (what a p99_ttft target judges), or None without it."""
    from kvlab.sweep.slo import Term

    latencies = window_latencies(row)
    if latencies is None or not latencies.shape[1]:
        return None
    return Term("p99_ttft", "ttft_s", "p99", 0.0).value(latencies)


def search_capacities(configurations: list[dict[str, Any]], runner, slo: Slo, *, start_rates: list[float],
                      rtol: float = 0.05, max_rate: float = 1e4, on_round=None) -> list[Search]:
    """One search per configuration (a point's options without ``rate``), each from its first guess, all
    advancing together: each round simulates the next rate of every unfinished search at once, so a pool of N
    workers runs N searches side by side. ``on_round(searches)``, where given, after each round (a progress)."""

    searches = [Search(start_rate=rate, rtol=rtol, max_rate=max_rate) for rate in start_rates]
    runner.in_rounds = True  # (the progress' total: the rates asked for so far; each round asks for more)
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
            judged, window = verdict(slo, row)
            search.record(rate, slo.value(judged), judged.held, judged, window)
        if on_round is not None:
            on_round(searches)


# Two samples agree when their answers are this close (relative to the lower): twice the search's tolerance.
STABLE_SPREAD = 0.10


# A trace's second sample is the whole trace, up to this many requests (its first sample is at most half of it).
WHOLE_TRACE_LIMIT = 100_000


def longer_sample(configuration: dict[str, Any], rows: int | None = None) -> dict[str, Any]:
    """The second sample a capacity answer is checked on: the same configuration over a longer workload. On a trace
    that keeps its own arrival times (``rows`` requests), the whole trace up to WHOLE_TRACE_LIMIT requests (at least
    twice the first sample): a trace's later stretches can be heavier than its beginning, which the first sample is;
    else twice the workload (twice its requests, or twice its duration), a generated workload drawing as many again.
    An answer that holds on both does not move with the sample's length (docs/sweep.md)."""
    if configuration.get("duration") is not None:
        return {**configuration, "duration": 2 * configuration["duration"]}
    n = configuration["num_requests"]
    if rows is not None:
        return {**configuration, "num_requests": max(2 * n, min(rows, WHOLE_TRACE_LIMIT))}
    return {**configuration, "num_requests": 2 * n}


def agree(spread: float | None) -> bool:
    """Two samples agree: their spread within STABLE_SPREAD (a hair of rounding over it, 66 against 60, agrees)."""
    return spread is not None and spread <= STABLE_SPREAD + 1e-9


def sample_spread(first: float, second: float) -> float | None:
    """How far two samples' answers are apart, relative to the lower (None: either is 0)."""
    low, high = sorted((first, second))
    return high / low - 1 if low > 0 else None


def length_for_spread(length: int, spread: float | None, target: float = STABLE_SPREAD) -> int | None:
    """The workload length (requests) at which two samples would likely agree within ``target``: a sample's error
    falls as 1/√n, so the spread seen at ``length`` shrinks to ``target`` at length × (spread / target)²; rounded
    up to hundreds (None: no spread to scale)."""
    if spread is None or spread <= target + 1e-9:
        return None
    return 100 * math.ceil(length * (spread / target) ** 2 / 100)


def samples_text(lengths: tuple[int, int], answers: tuple[str, str], spread: float | None, unit: str,
                 *, what: str = "requests", whole_trace: bool = False, steady: int | None = None,
                 first_uncertified: str | None = None) -> str:
    """'on 2,400 requests 9.1 req/s, on 4,800 8.7 (spread 5%: stable)', or the advice when they disagree (no longer
    sample to ask for when the second is the ``whole_trace``). ``steady``: the requests the engine needs to reach a
    steady state (twice its seats in the window), ``first_uncertified``: why the first sample's own answer is not
    certified (Search.uncertified); a first sample shorter than ``steady``, or whose answer is not certified, is said
    to be too short, not blamed on the trace's beginning (trial 54, finding 2)."""
    text = f"on {lengths[0]:,} {what} {answers[0]} {unit}, on {lengths[1]:,} {answers[1]}"
    # (a rate on a trace is --rate's: its own arrivals rescaled so that the whole trace has that mean; its first
    # requests arrive at their own pace, often another: trial 53, finding 9)
    rates = (f"; each rate is --rate's, the whole trace's mean with its own arrivals rescaled to it: its first "
             f"{lengths[0]:,} arrive at their own pace within it") if whole_trace and unit == "req/s" else ""
    if spread is None:
        return text + " (one of them 0: no spread)" + rates
    if agree(spread):
        return text + f" (spread {spread:.0%}: stable)" + rates
    if whole_trace and steady is not None and (lengths[0] < steady or first_uncertified):
        why = f"which takes about {steady:,}" if lengths[0] < steady else \
            f"its own answer is not certified: {first_uncertified}"
        return text + (f", the whole trace (spread {spread:.0%}: the first sample's {lengths[0]:,} {what} are too few "
                       f"to reach a steady state ({why}); the answer is the lower)") + rates
    if whole_trace:
        return text + (f", the whole trace (spread {spread:.0%}: the trace's beginning is not like the whole of it; "
                       "the answer is the lower)") + rates
    need = length_for_spread(lengths[1], spread)
    return text + (f" (spread {spread:.0%}: the answer moves with the sample; a trace of about {need:,} {what} "
                   "would give a stable one: -n)")


def default_out():
    """Where a capacity search keeps its store and plots without --out: the user's cache folder, as the published
    traces' (kvlab.workload.published.cache_dir: $KVLAB_CACHE_DIR, else $XDG_CACHE_HOME/kvlab, else ~/.cache/kvlab),
    under capacity/: never the working directory."""
    from kvlab.workload.published import cache_dir

    return cache_dir().parent / "capacity"

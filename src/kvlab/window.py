"""Whether a run sustained its rate: the measured window, what was served in it, and the queue across it.

A run of N requests arriving over [a₀, a₁] has three parts:

    warm-up  [a₀, a₀ + 20%)        the engine fills from empty: not measured
    window   [a₀ + 20%, a₁ − 10%]  measured
    drain    (a₁ − 10%, end]        arrivals stop and the engine empties: not measured

Over the window, the engine **keeps up** when it served at least 95% of what was offered (served ÷ offered ≥
0.95) and its queue (requests that arrived and were not yet scheduled) did not grow. Served ÷ offered is read from
how the latency of the window's arrivals grows: an engine that keeps up gives the last of them the same latency as
the first, one that falls behind makes each wait longer than the one before. If the latency grows by g seconds for
each second of arrivals, the window's arrivals finish at 1 / (1 + g) of the pace they arrive at: that is the share
served. g is the median latency of the window's later half of arrivals less that of its earlier half, over the time
between their median arrivals (medians: a few long answers, or one burst, do not move it; at light load it is 0 and
the share 1, however few the requests). The queue grows when its mean over the window's second half exceeds its
mean over the first half by more than 1% of the window's arrivals (and at least 2 requests). A run is then

    stable       keeps up: served ≥ 95% and the queue does not grow
    backlogged   served ≥ 95%, but the queue grows (it would fail on a longer run)
    overloaded   served < 95%

The latency a target judges is that of the requests that arrived inside the window (they finish whenever they
finish: the run drains). A window can only show an overload if more requests arrive in it than the engine has
seats (``num_seats``: at most max_num_seqs, at most as many requests as the KV cache holds: their slabs under a
reserving strategy, their prompts under paging): an engine that admits every request at once never queues,
however slow it is. Such a run is **not loaded**, and a rate it holds is only a lower bound.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from kvlab.metrics import RequestRecord

WARMUP_SHARE = 0.2  # of the arrival span, before the window
DRAIN_SHARE = 0.1  # of the arrival span, after it
SERVED_SHARE = 0.95  # served ÷ offered over the window, at least
QUEUE_GROWTH_SHARE = 0.01  # of the window's arrivals: the most the queue's mean may grow between its halves
QUEUE_GROWTH_MIN = 2  # requests: less is noise
NUM_QUEUE_SAMPLES = 64  # per half of the window
STATES = ("stable", "backlogged", "overloaded")
# The latencies a target can judge, in the order of ``latencies``' rows (a summary's names).
LATENCY_METRICS = ("ttft_s", "tpot_s", "e2e_latency_s", "normalized_latency_s_per_token")


@dataclass(frozen=True, slots=True)
class Window:
    """What a run's measured window shows (plain numbers: a sweep stores them with the point)."""

    start_s: float
    end_s: float
    num_arrived: int  # requests that arrived in the window
    latency_growth: float  # g: seconds of latency gained per second of arrivals across the window (module doc)
    num_rejected: int  # of those that arrived in it
    queue_first_half: float  # mean number waiting (arrived, not yet scheduled), first half of the window
    queue_second_half: float
    num_seats: int  # how many requests the engine could hold at once
    state: str  # stable | backlogged | overloaded
    loaded: bool  # more arrivals in the window than seats: an overload would show

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def offered_rps(self) -> float:
        return self.num_arrived / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def served_share(self) -> float:
        """Served ÷ offered: 1 / (1 + g), at most 1 (a latency that falls across the window: a warm-up's queue
        draining, the engine ahead of its arrivals); 0 when nothing arrived."""
        return share_served(self.num_arrived, self.latency_growth)

    @property
    def served_rps(self) -> float:
        return self.offered_rps * self.served_share

    @property
    def queue_growth(self) -> float:
        return self.queue_second_half - self.queue_first_half

    @property
    def sustained(self) -> bool:
        """Kept up, nothing refused, and loaded enough to tell."""
        return self.state == "stable" and self.num_rejected == 0

    def to_dict(self) -> dict[str, Any]:
        fields = asdict(self)
        if math.isinf(self.latency_growth):  # (JSON has no infinity: nothing of the later half finished)
            fields["latency_growth"] = None
        return {**fields, "duration_s": self.duration_s, "offered_rps": self.offered_rps,
                "served_rps": self.served_rps, "served_share": self.served_share, "queue_growth": self.queue_growth}


def share_served(num_arrived: int, latency_growth: float) -> float:
    """Served ÷ offered of a window with ``num_arrived`` arrivals whose latency grew by ``latency_growth`` seconds
    per second of arrivals (the module doc): 1 / (1 + g), at most 1; 0 when nothing arrived."""
    return 1.0 / (1.0 + max(0.0, latency_growth)) if num_arrived else 0.0


def num_seats(max_num_seqs: int, num_kv_tokens: int, mean_tokens_held: float) -> int:
    """How many requests an engine could hold at once: max_num_seqs, or as many requests as its KV cache holds
    at ``mean_tokens_held`` each, whichever is fewer."""
    return max(1, min(max_num_seqs, int(num_kv_tokens // max(1.0, mean_tokens_held))))


def mean_tokens_held(allocator: str, requests, max_model_len: int) -> float:
    """What a request holds at admission, on average: its slab under a reserving strategy (kvlab.memory.contiguous),
    its prompt under paging (an upper bound on the seats: the outputs take room too)."""
    from kvlab.memory.contiguous import SLAB_POLICIES

    if not requests:
        return 1.0
    slab = SLAB_POLICIES.get(allocator)
    if slab is not None:
        return sum(slab(r, max_model_len) for r in requests) / len(requests)
    return sum(r.prompt_len for r in requests) / len(requests)


def bounds(arrivals: np.ndarray) -> tuple[float, float]:
    """The window of arrival times ``arrivals``: after the warm-up, before the drain."""
    first, last = float(arrivals.min()), float(arrivals.max())
    span = last - first
    return first + WARMUP_SHARE * span, last - DRAIN_SHARE * span


def measure(records: list[RequestRecord], seats: int) -> Window:
    """The window of a run's requests (every request's record, finished or rejected)."""
    import numpy as np

    if not records:
        return Window(0.0, 0.0, 0, 0, 0, 0.0, 0.0, seats, "overloaded", False)
    arrival = np.fromiter((r.arrival_time for r in records), dtype=np.float64, count=len(records))
    finish = np.fromiter((math.inf if r.finish_time is None else r.finish_time for r in records),
                         dtype=np.float64, count=len(records))
    scheduled = np.fromiter((math.inf if r.first_scheduled_time is None else r.first_scheduled_time
                             for r in records), dtype=np.float64, count=len(records))
    rejected = np.fromiter((r.status == "rejected" for r in records), dtype=bool, count=len(records))
    start, end = bounds(arrival)
    inside = (arrival >= start) & (arrival <= end)
    num_arrived = int(inside.sum())
    kept = inside & ~rejected
    growth = latency_growth(arrival[kept], finish[kept] - arrival[kept])
    # The queue at a time t: arrived by t, not refused, not yet scheduled.
    arrival_sorted = np.sort(arrival[~rejected])
    scheduled_sorted = np.sort(scheduled[~rejected])
    middle = (start + end) / 2

    def mean_queue(lo: float, hi: float) -> float:
        times = np.linspace(lo, hi, NUM_QUEUE_SAMPLES)
        waiting = np.searchsorted(arrival_sorted, times, side="right") - np.searchsorted(scheduled_sorted, times,
                                                                                          side="right")
        return float(waiting.mean())

    first_half, second_half = mean_queue(start, middle), mean_queue(middle, end)
    served = share_served(num_arrived, growth) >= SERVED_SHARE
    growing = second_half - first_half > max(QUEUE_GROWTH_MIN, QUEUE_GROWTH_SHARE * num_arrived)
    state = "overloaded" if not served else "backlogged" if growing else "stable"
    return Window(start, end, num_arrived, growth, int((inside & rejected).sum()), first_half, second_half,
                  seats, state, num_arrived > seats)


def latency_growth(arrival: np.ndarray, latency: np.ndarray) -> float:
    """g: the median latency of the later half of the arrivals less that of the earlier half, over the time
    between their median arrivals (the module doc). A request that has not finished has an infinite latency: g is
    infinite when the later half's median has none. 0 with fewer than two arrivals, or no time between halves."""
    import numpy as np

    if len(arrival) < 2:
        return 0.0
    order = np.argsort(arrival, kind="stable")
    times, latencies_in_order = arrival[order], latency[order]
    half = len(times) // 2
    early, late = slice(0, half), slice(len(times) - half, len(times))
    gap = float(np.median(times[late]) - np.median(times[early]))
    early_latency, late_latency = (float(np.median(latencies_in_order[half_])) for half_ in (early, late))
    if math.isinf(late_latency):
        return math.inf
    if not gap > 0:
        return 0.0
    return (late_latency - early_latency) / gap


def latencies(records: list[RequestRecord], window: Window) -> np.ndarray:
    """The latencies of the requests that arrived in the window: a (4, n) array, one row per LATENCY_METRICS
    entry; a refused request's are infinite (it met no target), the TPOT of a one-token answer is NaN (it has
    none: no TPOT target judges it)."""
    import numpy as np

    chosen = [r for r in records if window.start_s <= r.arrival_time <= window.end_s]
    inf = math.inf
    rows = [[inf if (v := r.ttft) is None else v for r in chosen],
            [(inf if r.status == "rejected" else math.nan) if (v := r.tpot) is None else v for r in chosen],
            [inf if (v := r.e2e_latency) is None else v for r in chosen],
            [inf if (v := r.normalized_latency) is None else v for r in chosen]]
    return np.array(rows, dtype=np.float64).reshape(len(LATENCY_METRICS), len(chosen))

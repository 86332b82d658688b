"""Whether a run sustained its rate: the measured window, what was served in it, and the queue across it.

A run of N requests arriving over [a₀, a₁] has three parts:

    warm-up  [a₀, a₀ + 20%)        the engine fills from empty: not measured
    window   [a₀ + 20%, a₁ − 10%]  measured
    drain    (a₁ − 10%, end]        arrivals stop and the engine empties: not measured

Over the window, the engine **keeps up** when it finished at least 95% as many requests as arrived in it (served
÷ offered ≥ 0.95; the finishes counted over the window shifted by its arrivals' median latency, so that the
requests in flight at its ends cancel) and its queue (requests that arrived and were not yet scheduled) did not
grow: the queue's mean over the window's second half exceeds its mean over the first half by at most 1% of the
window's arrivals (and at least 2 requests; a growing queue is an engine falling behind). A run is then

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
    num_served: int  # requests that finished in it
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
    def served_rps(self) -> float:
        return self.num_served / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def served_share(self) -> float:
        return self.num_served / self.num_arrived if self.num_arrived else 0.0

    @property
    def queue_growth(self) -> float:
        return self.queue_second_half - self.queue_first_half

    @property
    def sustained(self) -> bool:
        """Kept up, nothing refused, and loaded enough to tell."""
        return self.state == "stable" and self.num_rejected == 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "duration_s": self.duration_s, "offered_rps": self.offered_rps,
                "served_rps": self.served_rps, "served_share": self.served_share, "queue_growth": self.queue_growth}


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
    # Served: the requests that finished in the window shifted by the median latency of its arrivals, so that the
    # requests in flight at either end do not count for or against an engine that keeps up (over a short window
    # they are many); an engine falling behind has latencies that grow across the window, which no shift undoes.
    latency = finish[inside] - arrival[inside]
    latency = latency[np.isfinite(latency)]
    shift = float(np.median(latency)) if len(latency) else 0.0
    num_served = int(((finish >= start + shift) & (finish <= end + shift)).sum())
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
    served = num_served >= SERVED_SHARE * num_arrived and num_arrived > 0
    growing = second_half - first_half > max(QUEUE_GROWTH_MIN, QUEUE_GROWTH_SHARE * num_arrived)
    state = "overloaded" if not served else "backlogged" if growing else "stable"
    return Window(start, end, num_arrived, num_served, int((inside & rejected).sum()), first_half, second_half,
                  seats, state, num_arrived > seats)


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

"""Whether a run sustained its rate: the measured window, the waiting queue across it, and what was finished.

A run of N requests arriving over [a₀, a₁] has two parts, and a drain after them:

    warm-up  [a₀, a₀ + 20%)   the engine fills from empty: left out (its requests find an emptier engine
                               than the rest: counting them would flatter the answer)
    window   [a₀ + 20%, a₁]   measured, up to the last arrival: a burst at the end of a trace counts
    drain    (a₁, end]        arrivals stop; the window's requests finish whenever they finish, and their
                               latencies (all of them, the last arrivals' too) are what a target judges

The engine **keeps up** when its waiting queue (requests that arrived and were not yet scheduled) does not grow
across the window, by either measure of it, and the offered work is finished:

    queue count   the mean number waiting over the window's second half less that over its first half, at most
                  1% of the window's arrivals (and at least 2 requests: less is noise)
    oldest wait   how long the oldest waiting request has waited, sampled over the window: an engine that serves
                  μ of the λ requests a second offered to it falls behind by 1 − μ/λ seconds each second, so the
                  oldest wait grows by that much for each second of the window. The served share is 1 − that
                  growth (mean oldest wait, second half less first half, over the half-window between them);
                  the engine keeps up while it is at least 95%
    finished      every request of the window finished or was given up by its client at its deadline (status
                  ``aborted``, --timeout): none refused (a refused request meets no target), none left unfinished

    stable        keeps up: the queue neither grows in count nor in age, everything finished
    backlogged    the oldest wait is flat (served ≥ 95%), but more and more requests wait: it would fail on a
                  longer run
    overloaded    the oldest wait grows (served < 95%), or a request of the window was never finished

A request aborted at its client's deadline is an outcome, not a sign of overload by itself: it leaves the queue
when its client gives up (so a deadline caps the oldest wait, and an engine that cannot keep up shows it as a
growing share of clients giving up rather than a growing wait), and the window counts it (``num_aborted``,
``abandoned_share``). Whether that share is acceptable is the target's to say (kvlab.sweep.slo: ``abandoned<5%``;
without such a term no client may give up). Its latencies are left out of ``latencies``: it got no answer to time.
A queue that still grows in count is overload, deadlines or not.

Latency is not a signal: a trace whose later answers are longer takes longer per request without anything
waiting, and is not overloaded; only a target on the latency can fail it (kvlab.sweep.slo). A preempted request
that waits again is not counted in the queue (it has been scheduled once); the arrivals queued behind it are.
Each Window says which signal decided its state (``decided_by``).

A disaggregated fleet (xPyD, kvlab.disagg) has two queues in series: its prefill replicas' (the client's arrival to
its prompt's first iteration, the requests' records) and its decode replicas' (the KV's arrival over the link to the
decode side's first iteration: ``decode_records``). Each is sampled over the one window; the counts waiting add up,
and the served share is the product of the two (the decode side serves its share of what the prefill side served),
so a decode side that falls behind is overload as an engine that falls behind is, by the same rule.

A window can only show an overload if more requests arrive in it than the engine has seats (``num_seats``: at
most max_num_seqs, at most as many requests as the KV cache holds: their slabs under a reserving strategy,
their prompts under paging): an engine that admits every request at once never queues, however slow it is. Such
a run is **not loaded**, and a rate it holds is only a lower bound.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from kvlab.metrics import RequestRecord

WARMUP_SHARE = 0.2  # of the arrival span, before the window
DRAIN_SHARE = 0.0  # of the arrival span left out at its end: none, the last arrivals are judged (the module doc)
SERVED_SHARE = 0.95  # served ÷ offered over the window, at least: the oldest wait grows by at most 5% of the time
MIN_WINDOW_REQUESTS = 10  # fewer arrivals in the window measure nothing (a run, a capacity search's workload)
SEATS_FACTOR = 2  # a workload long enough to judge: this many times the engine's seats arrive in the window
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
    end_s: float  # the last arrival
    num_arrived: int  # requests that arrived in the window
    num_rejected: int  # of those that arrived in it: refused by the engine
    num_unfinished: int  # of those that arrived in it: neither finished, refused nor aborted
    queue_first_half: float  # mean number waiting (arrived, not yet scheduled), first half of the window
    queue_second_half: float
    oldest_wait_first_half_s: float  # mean age of the oldest waiting request, first half of the window (0: none)
    oldest_wait_second_half_s: float
    num_seats: int  # how many requests the engine could hold at once
    state: str  # stable | backlogged | overloaded
    decided_by: str  # the signal that decided the state, in words (the module doc)
    loaded: bool  # more arrivals in the window than seats: an overload would show
    drain_s: float  # from the last arrival to the last finish
    num_aborted: int = 0  # of those that arrived in it: aborted when their client's deadline passed (--timeout)
    # A disaggregated fleet's decode side, its queue sampled over the same window (the module doc; 0: none)
    decode_queue_first_half: float = 0.0
    decode_queue_second_half: float = 0.0
    decode_oldest_wait_first_half_s: float = 0.0
    decode_oldest_wait_second_half_s: float = 0.0

    @property
    def abandoned_share(self) -> float:
        """The share of the window's arrivals whose client gave up at its deadline (0 when nothing arrived)."""
        return self.num_aborted / self.num_arrived if self.num_arrived else 0.0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def offered_rps(self) -> float:
        return self.num_arrived / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def wait_growth(self) -> float:
        """Seconds the oldest wait gained per second of the window (half-means, half a window apart)."""
        return _growth(self.oldest_wait_first_half_s, self.oldest_wait_second_half_s, self.duration_s)

    @property
    def decode_wait_growth(self) -> float:
        """wait_growth of a disaggregated fleet's decode side (0 without one)."""
        return _growth(self.decode_oldest_wait_first_half_s, self.decode_oldest_wait_second_half_s, self.duration_s)

    @property
    def served_share(self) -> float:
        """Served ÷ offered: 1 − wait_growth, within [0, 1] (an oldest wait that falls across the window: a
        warm-up's queue draining, the engine ahead of its arrivals); 0 when nothing arrived. With a decode side,
        times its own share (the module doc)."""
        return share_served(self.num_arrived, self.wait_growth) * share_served(self.num_arrived,
                                                                               self.decode_wait_growth)

    @property
    def served_rps(self) -> float:
        return self.offered_rps * self.served_share

    @property
    def queue_growth(self) -> float:
        """How many more wait, second half less first (at either side of a disaggregated fleet)."""
        return self.queue_second_half + self.decode_queue_second_half - self.queue_first_half \
            - self.decode_queue_first_half

    @property
    def sustained(self) -> bool:
        """Kept up, nothing refused, and loaded enough to tell."""
        return self.state == "stable" and self.num_rejected == 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "duration_s": self.duration_s, "offered_rps": self.offered_rps,
                "served_rps": self.served_rps, "served_share": self.served_share, "queue_growth": self.queue_growth,
                "wait_growth": self.wait_growth, "abandoned_share": self.abandoned_share}


def _growth(first_half: float, second_half: float, duration_s: float) -> float:
    half = duration_s / 2
    return (second_half - first_half) / half if half > 0 else 0.0


def share_served(num_arrived: int, wait_growth: float) -> float:
    """Served ÷ offered of a window with ``num_arrived`` arrivals whose oldest wait grew by ``wait_growth`` seconds
    per second (the module doc): 1 − growth, within [0, 1]; 0 when nothing arrived."""
    return min(1.0, max(0.0, 1.0 - wait_growth)) if num_arrived else 0.0


def num_seats(max_num_seqs: int, num_kv_tokens: int, mean_tokens_held: float) -> int:
    """How many requests an engine could hold at once: max_num_seqs, or as many requests as its KV cache holds
    at ``mean_tokens_held`` each, whichever is fewer."""
    return max(1, min(max_num_seqs, int(num_kv_tokens // max(1.0, mean_tokens_held))))


def window_num_requests(seats: int) -> int:
    """Requests enough that SEATS_FACTOR × ``seats`` arrive in the measured window (the arrivals after its warm-up),
    in hundreds, at least `kvlab run`'s default (a capacity search's default workload; a run too short to judge)."""
    from kvlab.config.options import DEFAULT_NUM_REQUESTS

    needed = SEATS_FACTOR * seats / (1 - WARMUP_SHARE - DRAIN_SHARE)
    return max(DEFAULT_NUM_REQUESTS, 100 * math.ceil(needed / 100))


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


def measure(records: list[RequestRecord], seats: int, decode_records: list[RequestRecord] | None = None) -> Window:
    """The window of a run's requests (every request's record, finished or rejected); with ``decode_records``, a
    disaggregated fleet's decode side's records (arrival: the KV's at the decode side), whose queue is judged with
    the prefill side's (the module doc)."""
    import numpy as np

    if not records:
        return Window(0.0, 0.0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, seats, "overloaded", "nothing arrived", False, 0.0)
    n = len(records)
    arrival = np.fromiter((r.arrival_time for r in records), dtype=np.float64, count=n)
    finish = np.fromiter((math.nan if r.finish_time is None else r.finish_time for r in records), np.float64, n)
    rejected = np.fromiter((r.status == "rejected" for r in records), dtype=bool, count=n)
    aborted = np.fromiter((r.status == "aborted" for r in records), dtype=bool, count=n)
    unfinished = np.fromiter((r.status not in ("finished", "rejected", "aborted") for r in records), dtype=bool,
                             count=n)
    start, end = bounds(arrival)
    inside = (arrival >= start) & (arrival <= end)
    num_arrived = int(inside.sum())
    (count_1, age_1), (count_2, age_2) = _queue(records, start, end)
    (d_count_1, d_age_1), (d_count_2, d_age_2) = ((0.0, 0.0), (0.0, 0.0)) if decode_records is None else \
        _queue(decode_records, start, end)
    num_rejected = int((inside & rejected).sum())
    num_unfinished = int((inside & unfinished).sum())
    num_aborted = int((inside & aborted).sum())
    served = share_served(num_arrived, _growth(age_1, age_2, end - start)) * share_served(
        num_arrived, _growth(d_age_1, d_age_2, end - start))
    growth = count_2 + d_count_2 - count_1 - d_count_1
    growing = growth > max(QUEUE_GROWTH_MIN, QUEUE_GROWTH_SHARE * num_arrived)
    queue = f"queue {count_1:.0f} → {count_2:.0f} waiting, oldest wait {_age(age_1)} → {_age(age_2)}"
    if decode_records is not None:
        queue = (f"prefill {queue}; decode queue {d_count_1:.0f} → {d_count_2:.0f} waiting, oldest wait "
                 f"{_age(d_age_1)} → {_age(d_age_2)}")
    if num_unfinished:
        state, decided = "overloaded", f"{num_unfinished} of the window's requests never finished"
    elif served < SERVED_SHARE:
        state, decided = "overloaded", f"oldest wait grew: served {served:.1%} of offered ({queue})"
    elif growing:
        state, decided = "backlogged", f"queue count grew ({queue})"
    else:
        state, decided = "stable", f"queue flat ({queue})"
    if num_aborted:
        decided += f"; {num_aborted} of {num_arrived} clients gave up at their deadline"
    last_finish = float(np.nanmax(finish)) if not np.isnan(finish).all() else float(arrival.max())
    return Window(start, end, num_arrived, num_rejected, num_unfinished, count_1, count_2, age_1, age_2, seats,
                  state, decided, num_arrived > seats, max(0.0, last_finish - float(arrival.max())), num_aborted,
                  d_count_1, d_count_2, d_age_1, d_age_2)


def _queue(records: list[RequestRecord], start: float, end: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """The mean number waiting and the mean age of the oldest waiting over each half of [start, end]
    (NUM_QUEUE_SAMPLES times each): waiting from a request's arrival to its first iteration (or its finish: a client
    that gave up leaves then), refused requests never."""
    import numpy as np

    kept = [r for r in records if r.status != "rejected"]
    arrival_kept = np.fromiter((r.arrival_time for r in kept), dtype=np.float64, count=len(kept))
    scheduled_kept = np.fromiter((min(math.inf if r.first_scheduled_time is None else r.first_scheduled_time,
                                      math.inf if r.finish_time is None else r.finish_time) for r in kept),
                                 dtype=np.float64, count=len(kept))
    arrival_sorted, scheduled_sorted = np.sort(arrival_kept), np.sort(scheduled_kept)
    by_arrival = np.argsort(arrival_kept, kind="stable")
    arrival_kept, scheduled_kept = arrival_kept[by_arrival], scheduled_kept[by_arrival]

    def mean_queue(lo: float, hi: float) -> tuple[float, float]:
        times = np.linspace(lo, hi, NUM_QUEUE_SAMPLES)
        waiting = np.searchsorted(arrival_sorted, times, side="right") - np.searchsorted(scheduled_sorted, times,
                                                                                          side="right")
        ages = []
        for t in times:
            arrived = np.searchsorted(arrival_kept, t, side="right")
            still = np.flatnonzero(scheduled_kept[:arrived] > t)
            ages.append(t - arrival_kept[still[0]] if len(still) else 0.0)
        return float(waiting.mean()), float(np.mean(ages))

    middle = (start + end) / 2
    return mean_queue(start, middle), mean_queue(middle, end)


def _age(seconds: float) -> str:
    return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:,.0f} s"


def latencies(records: list[RequestRecord], window: Window) -> np.ndarray:
    """The latencies of the requests that arrived in the window: a (4, n) array, one row per LATENCY_METRICS
    entry; a refused request's are infinite (it met no target), the TPOT of a one-token answer is NaN (it has
    none: no TPOT target judges it). An aborted request is left out: its client gave up, and the window's
    ``abandoned_share`` counts it (the module doc)."""
    import numpy as np

    chosen = judged(records, window)
    inf = math.inf
    rows = [[inf if (v := r.ttft) is None else v for r in chosen],
            [(inf if r.status == "rejected" else math.nan) if (v := r.tpot) is None else v for r in chosen],
            [inf if (v := r.e2e_latency) is None else v for r in chosen],
            [inf if (v := r.normalized_latency) is None else v for r in chosen]]
    return np.array(rows, dtype=np.float64).reshape(len(LATENCY_METRICS), len(chosen))


def judged(records: list[RequestRecord], window: Window) -> list[RequestRecord]:
    """The requests whose latencies a target judges, in ``latencies``' column order: those that arrived in the
    window, less those their client gave up on."""
    return [r for r in records if window.start_s <= r.arrival_time <= window.end_s and r.status != "aborted"]


def measure_run(records: list[RequestRecord], allocator: str, requests, scheduler, num_slots: int,
                num_replicas: int = 1, decode_records: list[RequestRecord] | None = None) -> Window:
    """The window of one engine's run (or a fleet's, ``num_replicas`` engines' seats: a disaggregated fleet's decode
    replicas, with ``decode_records``), its seats counted from its allocator, workload and scheduler
    (``scheduler``: max_num_seqs and max_model_len)."""
    held = mean_tokens_held(allocator, requests, scheduler.max_model_len)
    return measure(records, num_seats(scheduler.max_num_seqs, num_slots, held) * num_replicas, decode_records)

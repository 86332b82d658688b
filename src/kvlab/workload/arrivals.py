"""Arrival processes: Poisson and gamma renewal processes at a rate, and reshaping a trace's own arrivals.

All times are seconds. Generated processes start at t = 0 and the first request arrives one gap later, as
in a renewal process observed from time zero. Gaps are drawn in fixed-size chunks, so the first ``k``
arrivals of a seed are the same whether 10 or 10 million were asked for (and whether counted or cut at a
duration).
"""

from __future__ import annotations

import numpy as np

from kvlab.errors import KvlabError

# Gaps drawn per call; fixed so that results never depend on how many arrivals were asked for.
CHUNK = 4096


def _gaps(process: str, rate: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    if process == "poisson":
        return rng.standard_exponential(CHUNK) / rate
    # Gamma gaps with mean 1/rate and coefficient of variation cv: shape k = 1/cv², scale = cv²/rate
    # (mean = k·scale, variance = k·scale²). cv = 1 is the exponential; cv > 1 is burstier than Poisson.
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, cv * cv / rate, CHUNK)


def generate_arrivals(
    process: str,
    rate: float,
    rng: np.random.Generator,
    *,
    num: int | None = None,
    duration: float | None = None,
    cv: float = 1.0,
) -> np.ndarray:
    """Arrival times of a ``process`` ("poisson" or "gamma") at ``rate`` requests/s.

    The first ``num`` arrivals, or all arrivals before ``duration`` seconds, or the first ``num`` of those
    before ``duration`` when both are given.
    """
    if num is None and duration is None:
        raise ValueError("generate_arrivals needs num or duration")
    chunks: list[np.ndarray] = []
    num_drawn = 0
    clock = 0.0
    while True:
        times = clock + np.cumsum(_gaps(process, rate, cv, rng))
        chunks.append(times)
        num_drawn += len(times)
        clock = float(times[-1])
        if (num is not None and num_drawn >= num) or (duration is not None and clock >= duration):
            break
    times = np.concatenate(chunks)
    if duration is not None:
        times = times[: np.searchsorted(times, duration, side="left")]
    if num is not None:
        times = times[:num]
    return times


def burst_arrivals(num: int) -> np.ndarray:
    """Everyone at t = 0: the whole workload queued at once (the offline, throughput setting)."""
    return np.zeros(num)


def rescale_arrivals(times: np.ndarray, rate: float) -> np.ndarray:
    """A trace's own arrivals stretched or squeezed to a mean rate of ``rate`` requests/s.

    The trace's pattern (bursts, lulls, diurnal drift) is kept; only the clock runs faster or slower.
    The trace's own rate is (num_rows − 1) / span, so after rescaling the mean gap is exactly 1/rate.
    """
    span = float(times[-1] - times[0])
    if len(times) < 2 or span <= 0:
        raise KvlabError(
            f"cannot rescale these arrivals to {rate:g} req/s: all {len(times)} requests arrive at the same moment; "
            "use --arrival poisson or gamma for a rate"
        )
    own_rate = (len(times) - 1) / span
    return (times - times[0]) * (own_rate / rate)


def spread_within_bins(times: np.ndarray, bin_width: float) -> np.ndarray:
    """Requests that share a binned timestamp, spread evenly over their bin.

    Mooncake's trace rounds arrivals to about 3 s bins, so 10–28 requests share one timestamp. Left as they
    are, each bin is a burst that queueing at a one-second scale would misread. The ``i``-th of ``k``
    requests stamped ``t`` arrives at ``t + i·w/k``, where ``w`` is the gap to the next stamp, at most
    ``bin_width``. Deterministic; order and the per-bin count are kept. ``times`` must be sorted.
    """
    stamps, first, counts = np.unique(times, return_index=True, return_counts=True)
    widths = np.empty_like(stamps, dtype=float)
    widths[:-1] = np.minimum(np.diff(stamps), bin_width)
    widths[-1] = bin_width
    group = np.repeat(np.arange(len(stamps)), counts)
    rank = np.arange(len(times)) - first[group]
    return stamps[group] + rank * widths[group] / counts[group]

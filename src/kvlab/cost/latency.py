"""A request's time outside the engine (a profile's ``request_latency_s``): HTTP, the API server, the queues
between its processes. A client sees every request that much later than the engine's clock says; the engine's
iterations are not slowed by it (vLLM's API server is a process of its own).

The admission lag (a profile's ``admission_lag_iterations``): vLLM's async scheduling (on by default since 0.14,
vllm/v1/core/sched/async_scheduler.py) decides iteration N + 1 while iteration N runs, so a request that reaches
a busy engine joins one iteration later than a synchronous scheduler (kvlab's, vLLM's V0 and V1 without it)
admits it. kvlab keeps the synchronous schedule and puts the lag on the clock: the request's first token and its
end come ``admission_lag_iterations`` of its own mean decode iterations later ((finish − first token) /
(output tokens − 1)); a request that found the engine idle is scheduled at once and has none.

The simulator has no such delay, so a run applies it around the simulation: the requests reach the scheduler
``request_latency_s`` after they arrive (``delayed``), and the records keep the clients' arrival times
(``as_seen_by_clients``), so TTFT and end-to-end latency include it and time per output token does not.

The lag's spread (a profile's ``lag_jitter_iterations``; an experiment, off in every built-in profile: docs/cost.md,
"Terms tried and not kept"): each request's first token and end come a further ``lag_jitter_iterations`` × X of its
own mean decode iterations later, X a seeded standard exponential draw per request (``jitter_draws``: the same
request gets the same draw in every run), so that the time outside the engine core is not the same for every
request. It is put on the records after the engine, like the lag: the schedule is unchanged.

The lag's step (a profile's ``lag_step_probability``, q; an experiment, off in every built-in profile): with
probability q a request's first token and end come one more of its own mean decode iterations later, the others'
not at all; a request takes it where its draw X (the spread's, above: one seeded stream) has exp(−X) < q, an
event of probability q. A shape for a tail made of a few slow requests, where the spread moves every request.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

JITTER_SEED = 29  # (the seed of the per-request draws: fixed, so a run's numbers repeat)


def delayed(workload, latency_s: float):
    """The workload as the scheduler receives it: each request ``latency_s`` after its arrival."""
    if not latency_s:
        return workload
    return replace(workload, requests=tuple(replace(r, arrival_time=r.arrival_time + latency_s)
                                            for r in workload.requests))


def jitter_draws(request_ids) -> np.ndarray:
    """Each request's standard exponential draw (mean 1), by its id: request i gets the i-th draw of one seeded
    stream, whatever the order or the replica its record comes from."""
    ids = np.asarray(request_ids, dtype=np.int64)
    if not len(ids):
        return np.zeros(0)
    return np.random.default_rng(JITTER_SEED).standard_exponential(int(ids.max()) + 1)[ids]


def spread_iterations(request_ids, jitter_iterations: float, step_probability: float = 0.0):
    """Each request's iterations from the lag's spread and its step (module doc): ``jitter_iterations`` × X, plus 1
    where exp(−X) < ``step_probability``, X its draw (``jitter_draws``); None when both are 0."""
    if not jitter_iterations and not step_probability:
        return None
    x = jitter_draws(request_ids)
    return jitter_iterations * x + (np.exp(-x) < step_probability)


def admission_lag(lag_iterations: float, busy, first_token, finish, num_output_tokens, jitter=0.0):
    """Seconds each request's first token and end come later under async scheduling (module doc); numbers or
    numpy arrays. ``busy``: whether it reached a busy engine (its first iteration started after it arrived);
    ``jitter``: the lag's spread, in iterations, for every request (``lag_jitter_iterations`` × its draw)."""
    iterations = lag_iterations * busy + jitter
    return iterations * (finish - first_token) / max(1, num_output_tokens - 1) if lag_iterations or np.any(jitter) else 0.0


def as_seen_by_clients(result, latency_s: float, lag_iterations: float = 0.0, jitter_iterations: float = 0.0,
                       step_probability: float = 0.0):
    """The result with each record's arrival put back at the client's time (latencies now include the delay),
    with the admission lag on the first token and the end of each request that reached a busy engine, and the
    lag's spread (``jitter_iterations`` × the request's draw) and step (one iteration with probability
    ``step_probability``) on every finished request's."""
    if not latency_s and not lag_iterations and not jitter_iterations and not step_probability:
        return result
    draws = spread_iterations([r.request_id for r in result.records], jitter_iterations, step_probability)
    records = []
    for i, r in enumerate(result.records):
        r = r._replace(arrival_time=r.arrival_time - latency_s)
        # (a request abandoned before its first token has an end but no first iteration and no first token: no lag)
        if r.finish_time is not None and r.first_token_time is not None and r.first_scheduled_time is not None and (
                lag_iterations or draws is not None):
            busy = r.first_scheduled_time > r.arrival_time + latency_s
            lag = admission_lag(lag_iterations, busy, r.first_token_time, r.finish_time, r.num_output_tokens,
                                0.0 if draws is None else float(draws[i]))
            r = r._replace(first_token_time=r.first_token_time + lag, finish_time=r.finish_time + lag)
        records.append(r)
    return replace(result, records=records, makespan=result.makespan + latency_s)

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
"""

from __future__ import annotations

from dataclasses import replace


def delayed(workload, latency_s: float):
    """The workload as the scheduler receives it: each request ``latency_s`` after its arrival."""
    if not latency_s:
        return workload
    return replace(workload, requests=tuple(replace(r, arrival_time=r.arrival_time + latency_s)
                                            for r in workload.requests))


def admission_lag(lag_iterations: float, busy, first_token, finish, num_output_tokens):
    """Seconds each request's first token and end come later under async scheduling (module doc); numbers or
    numpy arrays. ``busy``: whether it reached a busy engine (its first iteration started after it arrived)."""
    return lag_iterations * busy * (finish - first_token) / max(1, num_output_tokens - 1) if lag_iterations else 0.0


def as_seen_by_clients(result, latency_s: float, lag_iterations: float = 0.0):
    """The result with each record's arrival put back at the client's time (latencies now include the delay),
    and with the admission lag on the first token and the end of each request that reached a busy engine."""
    if not latency_s and not lag_iterations:
        return result
    records = []
    for r in result.records:
        r = r._replace(arrival_time=r.arrival_time - latency_s)
        if lag_iterations and r.finish_time is not None and r.first_scheduled_time > r.arrival_time + latency_s:
            lag = admission_lag(lag_iterations, True, r.first_token_time, r.finish_time, r.num_output_tokens)
            r = r._replace(first_token_time=r.first_token_time + lag, finish_time=r.finish_time + lag)
        records.append(r)
    return replace(result, records=records, makespan=result.makespan + latency_s)

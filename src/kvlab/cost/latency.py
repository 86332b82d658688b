"""A request's time outside the engine (a profile's ``request_latency_s``): HTTP, the API server, the queues
between its processes. A client sees every request that much later than the engine's clock says; the engine's
iterations are not slowed by it (vLLM's API server is a process of its own).

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


def as_seen_by_clients(result, latency_s: float):
    """The result with each record's arrival put back at the client's time (latencies now include the delay)."""
    if not latency_s:
        return result
    records = [r._replace(arrival_time=r.arrival_time - latency_s) for r in result.records]
    return replace(result, records=records, makespan=result.makespan + latency_s)

"""A disaggregated fleet (xPyD) on one clock: the router hands each arrival to a prefill replica, whose KV then
crosses the link to a decode replica picked by the same kind of router when it gets there (docs/disaggregation.md).

    arrival ──▶ router ──▶ prefill replica i (max_tokens=1) ──▶ link ──▶ router ──▶ decode replica j ──▶ answer
                           (kvlab.disagg.sides.PrefillSimulation)          (at the transfer's end)

Nothing flows back from the decode side to the prefill side (vLLM's proxy sends the decode request after the prefill
answered; the prefill side only waits for the transfer), so the prefill replicas run first, all of them on the one
clock, and the decode replicas then serve what arrived from the link. Each side's router is brought the replicas'
state at each of its arrivals (kvlab.fleet.fleet.EveryReplica).
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import replace

from kvlab.config import SimConfig
from kvlab.config.router import RouterSpec
from kvlab.disagg.config import DisaggConfig
from kvlab.disagg.result import DisaggResult, client_result
from kvlab.disagg.sides import PrefillSimulation, Transfer, decode_simulation
from kvlab.errors import KvlabError
from kvlab.fleet.fleet import EveryReplica
from kvlab.fleet.routers import Replica, make_router
from kvlab.sim import Simulation
from kvlab.strategies import Strategy
from kvlab.workload import Request, Workload


def check_disagg(strategy: Strategy, config: SimConfig, workload: Workload) -> None:
    """What kvlab's disaggregated fleet does not model, refused in one line each."""
    if strategy.allocator != "paged" or not strategy.enable_prefix_caching:
        raise KvlabError(f"a disaggregated fleet needs paged memory with prefix caching (the decode side finds the "
                         f"sent KV through the prefix-cache lookup, as vLLM's scheduler asks its KV connector beside "
                         f"it); strategy {strategy.name!r} has not: valid: vllm, vllm+prefix")
    for given, flag in ((config.offload, "--kv-offloading-size"), (config.speculative, "--speculative-method")):
        if given is not None:  # (the one given, by name: trial 51)
            raise KvlabError(f"a disaggregated fleet with {flag} is not modelled; valid: drop {flag}, or give it to "
                             "an aggregated fleet (no --prefill-replicas / --decode-replicas)")
    if any(r.timeout is not None for r in workload.requests):
        raise KvlabError("a disaggregated fleet with client time-outs (--timeout) is not modelled; valid: no --timeout")


class DisaggFleet:
    """``disagg.num_prefill_replicas`` prefill and ``disagg.num_decode_replicas`` decode replicas of ``strategy``
    on ``config``, each side behind its own ``router``, serving ``workload``."""

    def __init__(self, strategy: Strategy, config: SimConfig, workload: Workload, router: RouterSpec,
                 disagg: DisaggConfig, *, record_iterations: bool = True) -> None:
        check_disagg(strategy, config, workload)
        self.strategy = strategy
        self.config = config
        self.workload = workload
        self.router = router
        self.disagg = disagg
        self.record_iterations = record_iterations

    def run(self) -> DisaggResult:
        from kvlab.cost.latency import as_seen_by_clients, delayed

        latency_s = self.config.cost.request_latency_s
        requests = sorted(delayed(self.workload, latency_s).requests, key=lambda r: (r.arrival_time, r.request_id))
        start = requests[0].arrival_time if requests else 0.0
        empty = replace(self.workload, requests=())
        prefill = [PrefillSimulation(self.strategy, self.config, empty, self.disagg, i, start_time=start,
                                     record_iterations=self.record_iterations)
                   for i in range(self.disagg.num_prefill_replicas)]
        decode = [decode_simulation(self.strategy, self.config, empty, start_time=start,
                                    record_iterations=self.record_iterations)
                  for _ in range(self.disagg.num_decode_replicas)]
        collecting = gc.isenabled()
        gc.disable()  # (as Simulation.run: a run makes no reference cycles)
        try:
            routed_p = self._route(prefill, [replace(r, max_tokens=1) for r in requests])
            for sim in prefill:
                sim.run()
                sim.finish_transfers()
            transfers = sorted((t for sim in prefill for t in sim.transfers), key=lambda t: (t.end, t.request_id))
            routed_d = self._route(decode, _at_decode(requests, transfers))
            for replica in decode:
                replica.run()
            p_results = [sim.result() for sim in prefill]
            d_results = [sim.result() for sim in decode]
        finally:
            if collecting:
                gc.enable()
        # The client's view: its arrival, the prefill's first iteration, the decode side's tokens; then, as the run
        # service does for one engine, the request latency and the admission lag put around it.
        client = as_seen_by_clients(client_result(self.strategy, self.config, self.workload.name, p_results,
                                                  d_results), latency_s, self.config.cost.admission_lag_iterations,
                                    self.config.cost.lag_jitter_iterations, self.config.cost.lag_step_probability)
        received = [(replica.allocator.num_received_tokens, replica.allocator.num_local_hit_tokens)
                    for replica in decode]
        return DisaggResult(self.strategy, self.config, self.workload.name, self.router, self.disagg, p_results,
                            d_results, transfers, routed_p, routed_d, received, client)

    def _route(self, replicas: Sequence[Simulation], requests: list[Request]) -> list[int]:
        """Each request to a replica as the router picks it from their state at its arrival; returns the replica
        of each, in ``requests``' order."""
        views = [Replica(sim) for sim in replicas]
        router, clock, chosen = make_router(self.router), EveryReplica(views), []
        for request in requests:
            clock.before(request)
            index, _ = router.route(request, views)
            replicas[index].add_request(request)
            chosen.append(index)
        return chosen


def _at_decode(requests: list[Request], transfers: list[Transfer]) -> list[Request]:
    """The requests as they reach the decode side: as the client sent them, arriving when their KV has."""
    by_id = {r.request_id: r for r in requests}
    return [replace(by_id[t.request_id], arrival_time=t.end) for t in transfers]


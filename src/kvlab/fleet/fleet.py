"""A fleet: N replicas of one engine behind a router, on one clock.

    arrival t ──▶ bring the replicas to t ──▶ router.route(request, replicas) ──▶ replicas[i].add_request(request)
                  (Simulation.run_until(t):              (their state at t)
                   every iteration starting before t runs)

Each replica is a ``kvlab.sim.Simulation`` with the run's strategy and configuration, unchanged; its clock starts
where the fleet's does (the first arrival), so every replica's times are on the one clock. Requests are handed
out in arrival order; a replica serves what it was given exactly as a lone engine would serve that workload.

Bringing a replica to an arrival cuts its run of iterations there, which costs a scheduling pass; a fleet brings
only as many as the router needs, and reads the rest inside their runs (``replicas_read``):

    none    the router reads nothing (round-robin, random): it is asked at once, and each replica runs its
            requests afterwards in one pass (NoReplica)
    load    it reads only loads (least-requests; prefix when nothing can be cached): a replica is read at an
            arrival only when one of its requests may have finished since, and that read, as the next one's,
            cuts nothing (WhenLoadMayChange)
    runs    it reads KV use (least-kv, weighted): every replica is read at every arrival, but a decode run that
            would go past it is not begun, so the read cuts nothing: its blocks by then are counted from its plan
            (Simulation.read_at); only the replica given the request ends the run there (ReadInRuns)
    every   it reads cached blocks: every replica to every arrival (EveryReplica)

Each gives the decisions and the records of ``every``: cutting an engine's runs at instants where nothing arrives
changes nothing (runs = stepping, tests/test_runs.py), and the state skipped is state the router does not read or
that cannot have changed (tests/test_fleet.py compares every router's decisions and runs with ``every``'s;
tests/test_fleet_reads.py the reads inside runs).
"""

from __future__ import annotations

import gc
from dataclasses import replace

from kvlab.config import SimConfig
from kvlab.config.admission import AdmissionSpec
from kvlab.errors import KvlabError
from kvlab.fleet.result import FleetResult
from kvlab.fleet.routers import CACHED_TOKENS, LOAD, Replica, RouterSpec, make_router, parse_router
from kvlab.sched.seq import num_tokens_to_finish
from kvlab.sim import RunInFlight, Simulation
from kvlab.strategies import Strategy
from kvlab.workload import Request, Workload

INF = float("inf")
# The clock adds iterations one after another; their least duration times a count may round above that sum.
SAFETY = 1 - 1e-9


def check_num_replicas(num_replicas: object) -> int:
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise KvlabError(f"--replicas {num_replicas!r}: a fleet has a whole number of replicas, 1 or more")
    return num_replicas


class Fleet:
    """``num_replicas`` engines with ``strategy`` and ``config`` behind ``router`` (a RouterSpec or a router's name),
    serving ``workload``. ``sync_every_arrival`` brings every replica to every arrival even when the router reads
    no state: the reference path the default is tested against. ``admission``: a gateway in front of the router
    (kvlab.fleet.admission), None for none."""

    def __init__(self, strategy: Strategy, config: SimConfig, workload: Workload, router: RouterSpec | str,
                 num_replicas: int, *, record_iterations: bool = True, sync_every_arrival: bool = False,
                 admission: AdmissionSpec | None = None) -> None:
        if not isinstance(config, SimConfig):  # (resolve()'s KvlabConfig carries it as .engine: trial 51)
            engine = " (resolve()'s configuration: pass its .engine)" if hasattr(config, "engine") else ""
            raise KvlabError(f"Fleet's config is a {type(config).__name__}{engine}; valid: a SimConfig, such as "
                             "kvlab.config.resolve(...).engine")
        self.strategy = strategy
        self.config = config
        self.workload = workload
        self.router = parse_router(router) if isinstance(router, str) else router
        self.num_replicas = check_num_replicas(num_replicas)
        self.record_iterations = record_iterations
        self.sync_every_arrival = sync_every_arrival
        self.admission = admission

    def run(self) -> FleetResult:
        from kvlab.cost.latency import as_seen_by_clients, delayed

        # As the run service does for one engine: a profile's time outside the engines (HTTP, the API servers)
        # delays each request on its way in, so the router decides as it reaches them; the records are put back
        # on the clients' clock.
        latency_s = self.config.cost.request_latency_s
        requests = sorted(delayed(self.workload, latency_s).requests, key=lambda r: (r.arrival_time, r.request_id))
        gate = None
        if self.admission is not None:  # the gateway: the router sees only what it admits, when it admits it
            from kvlab.fleet.admission import admit

            gate = admit(self.admission, requests, latency_s)
            requests = list(gate.admitted)
        start = requests[0].arrival_time if requests else 0.0
        empty = replace(self.workload, requests=())
        replicas = [Simulation(self.strategy, self.config, empty, record_iterations=self.record_iterations,
                               start_time=start) for _ in range(self.num_replicas)]
        router = make_router(self.router)
        views = [Replica(sim) for sim in replicas]
        clock = self._clock(router.reads, views)
        num_routed = [0] * len(replicas)
        reasons: dict[str, int] = {}
        # As Simulation.run: a run makes no reference cycles, and the collector would scan every live request.
        collecting = gc.isenabled()
        gc.disable()
        try:
            for request in requests:
                clock.before(request)
                index, reason = router.route(request, views)
                clock.given(index, request)  # (before it joins: a run still in flight ends where it arrives)
                replicas[index].add_request(request)
                num_routed[index] += 1
                reasons[reason] = reasons.get(reason, 0) + 1
            lag = self.config.cost.admission_lag_iterations
            jitter, step = self.config.cost.lag_jitter_iterations, self.config.cost.lag_step_probability
            results = [as_seen_by_clients(sim.run(), latency_s, lag, jitter, step) for sim in replicas]
            if gate is not None:  # (the clients sent them before their wait at the gateway)
                results = [replace(r, records=gate.as_seen_by_clients(r.records)) for r in results]
        finally:
            if collecting:
                gc.enable()
        hits = [_prefix_counts(sim) for sim in replicas]
        return FleetResult(self.strategy, self.config, self.workload.name, self.router, results, num_routed, reasons,
                           [h for h, _ in hits], [q for _, q in hits], gate)

    def _clock(self, reads: frozenset[str], replicas: list[Replica]):
        """How replicas are brought to an arrival's instant for a router that reads ``reads`` of them."""
        shares = any(r.prefix_hashes for r in self.workload.requests)
        kind = "every" if self.sync_every_arrival else replicas_read(reads, self.strategy, shares)
        if kind == "every":
            return EveryReplica(replicas)
        if kind == "runs":
            return ReadInRuns(replicas)
        if kind == "load":
            return WhenLoadMayChange(replicas, self.config.cost.iteration_times(0, 0, 0, 0, 0))
        return NoReplica()


def replicas_read(reads: frozenset[str], strategy: Strategy, shares_prefixes: bool = True) -> str:
    """What a router reading ``reads`` needs of the replicas: "none", "load" (only their loads), "runs" (their
    loads and KV use at every arrival, read inside their runs) or "every" (their state at every arrival: the prefix
    cache). Without prefix caching, or without prompts that share a prefix, no request ever finds anything
    cached: that answer is 0 whatever the state."""
    if not (strategy.enable_prefix_caching and shares_prefixes):
        reads -= {CACHED_TOKENS}
    if CACHED_TOKENS in reads:
        return "every"
    if reads - {LOAD}:
        return "runs"
    return "load" if reads else "none"


# How the replicas are brought to the instant a request arrives: ``before(request)`` the router reads them,
# ``given(index, request)`` once replica ``index`` has it.

class NoReplica:
    """A router that reads nothing: each replica runs its requests once the last is routed."""

    def before(self, request: Request) -> None:
        pass

    def given(self, index: int, request: Request) -> None:
        pass


class EveryReplica:
    """Every replica brought to every arrival (``run_until``): the state the router reads is the state at t."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas = replicas

    def before(self, request: Request) -> None:
        t = request.arrival_time
        for replica in self.replicas:
            replica.sim.run_until(t)

    def given(self, index: int, request: Request) -> None:
        pass


class ReadInRuns:
    """Every replica read at every arrival without cutting its run (``Simulation.read_at``): a replica runs up to
    a decode run that would go past t and stays before it, its blocks by t counted as in flight; only the replica
    given the request ends that run at t, where its arrival ends it (``run_until``). So a replica's runs are cut
    where its own requests arrive, as a lone engine's are, and the router reads what EveryReplica shows it
    (tests/test_fleet_reads.py)."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas = replicas

    def before(self, request: Request) -> None:
        t = request.arrival_time
        for replica in self.replicas:
            replica.slots_in_flight, replica.run_in_flight = replica.sim.read_at(t, replica.run_in_flight)

    def given(self, index: int, request: Request) -> None:
        replica = self.replicas[index]
        replica.sim.run_until(request.arrival_time)
        replica.slots_in_flight, replica.run_in_flight = 0, None


class WhenLoadMayChange:
    """For a router that reads only each replica's load (requests given, less those finished or rejected), which
    changes only when one of its requests finishes or is rejected: a replica is read at an arrival only when that
    may have happened since it was last read. Every request it holds needs at least as many more iterations as it
    has tokens left to generate, each at least ``min_iteration_s`` long (the cost model's iteration with nothing in
    it: every term grows with the work), so none finishes in an iteration that starts before ``quiet[j]``; and a
    decode run left pending by a read (``Simulation.read_at``: the read does not cut it) finishes nobody before its
    last iteration starts. A request it is given joins its queue (a new request only adds work: the others' bounds
    hold) or, rejected, leaves at its next iteration. So the router reads the loads it would read if every replica
    were brought to every arrival (tests/test_fleet.py checks the decisions against EveryReplica's,
    tests/test_fleet_reads.py the runs)."""

    def __init__(self, replicas: list[Replica], min_iteration_s: float) -> None:
        self.replicas = replicas
        self.min_iteration_s = min_iteration_s
        self.quiet = [INF] * len(replicas)  # replica j's load stays as it is for arrivals up to quiet[j]
        self.by_tokens = [INF] * len(replicas)  # the part of quiet[j] from tokens left: a new request leaves it
        self.first_due = INF  # min(quiet): most arrivals read nobody

    def before(self, request: Request) -> None:
        t = request.arrival_time
        if t <= self.first_due:
            return
        quiet = self.quiet
        for j, replica in enumerate(self.replicas):
            if t > quiet[j]:
                replica.slots_in_flight, replica.run_in_flight = replica.sim.read_at(t, replica.run_in_flight)
                self.by_tokens[j], quiet[j] = self._quiet_until(replica.sim, replica.run_in_flight)
        self.first_due = min(quiet)

    def given(self, index: int, request: Request) -> None:
        served, reason = self.replicas[index].sim.admission(request)
        t = request.arrival_time
        # Its arrival ends the pending run (if any): the bound from tokens left stands, the run's does not.
        bound = t if reason is not None else min(self.by_tokens[index],
                                                 t + (served.num_output_tokens - 1) * self.min_iteration_s * SAFETY)
        self.by_tokens[index] = min(self.by_tokens[index], bound)
        if bound < self.quiet[index]:
            self.quiet[index] = bound
            self.first_due = min(self.first_due, bound)

    def _quiet_until(self, sim: Simulation, run: RunInFlight | None) -> tuple[float, float]:
        """(the bound from tokens left, the bound) on the arrivals the load read now stays for."""
        sched = sim.scheduler
        if sim.next_arrival_time != INF:
            return sim.now, sim.now  # arrived during the last iteration: joins (or is rejected) as the next starts
        if not sched.num_unfinished:
            return INF, INF  # idle: nothing changes until it is given a request
        if run is None:
            sched.sync()  # (each request's tokens up to date)
            fewest_left = min(min(map(num_tokens_to_finish, sched.running), default=INF),
                              min(map(num_tokens_to_finish, sched.waiting), default=INF))
        else:  # (its iterations up to the first finish: the running's fewest tokens left, or fewer)
            fewest_left = min(run.num_iterations, min(map(num_tokens_to_finish, sched.waiting), default=INF))
        by_tokens = sim.now + (fewest_left - 1) * self.min_iteration_s * SAFETY
        return by_tokens, by_tokens if run is None else max(by_tokens, sim.first_finish_start(run))


def _prefix_counts(sim: Simulation) -> tuple[int, int]:
    """(prompt tokens found cached, prompt tokens) over the requests the replica admitted: vLLM's prefix-cache hits
    and queries of new requests."""
    hits = queried = 0
    for seq in sim.seqs.values():
        if seq.num_cached_tokens is not None:
            hits += seq.num_cached_tokens
            queried += seq.request.prompt_len
    return hits, queried


def run_fleet(strategy: Strategy, config: SimConfig, workload: Workload, router: RouterSpec | str,
              num_replicas: int, **options) -> FleetResult:
    """``Fleet(...).run()`` in one call."""
    return Fleet(strategy, config, workload, router, num_replicas, **options).run()

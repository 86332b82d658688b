"""Routers: which replica serves a request, decided when it arrives from the replicas' state at that instant.

Each router is a small class with one method, ``route(request, replicas) -> (index, reason)``; ``ROUTERS`` maps
the names to them (a plain dict, as vLLM picks its implementations). A replica is a ``Replica``: a
``kvlab.sim.Simulation`` as it stands at the arrival's instant, or just before a decode run that will go on past
it (a read does not cut a run: ``Simulation.read_at``). A router reads it through the three functions below, the
numbers a production router scrapes from vLLM:

    load(r)                   requests it was given that have not finished: running + waiting (vLLM's
                              num_requests_running + num_requests_waiting), and those that arrived during the
                              iteration now running (they join its queue when it ends)
    kv_usage(r)               the share of its KV cache handed to requests (vLLM's kv_cache_usage gauge: a
                              cached block whose requests finished is free; vLLM leaves the null block out of the
                              count, which scales every replica alike), the run in flight's blocks counted
    cached_tokens(r, req)     the prompt tokens the request would find in its prefix cache if admitted now, by
                              vLLM's block hashes as the paged allocator keeps them (0 without prefix caching)

Rules (ties always go to the lowest replica index, so a run is reproducible):

    round-robin     replicas in turn: 0, 1, ..., N-1, 0, ...
    random          uniformly at random, from the router's own generator (seeded: same seed, same choices)
    least-requests  the lowest load
    least-kv        the lowest kv_usage
    prefix          the longest cached prefix of the prompt; among equals, and when no replica holds any, the
                    lowest load
    weighted        the highest weighted sum of scorers, each in [0, 1], as llm-d's scheduler scores pods; among
                    equal sums the lowest load, as prefix's (a set without a load scorer sent them all to 0):
                      prefix          cached_tokens / prompt_len            (llm-d's prefix-cache scorer)
                      least-kv        1 - kv_usage                          (its kv-cache-utilization scorer)
                      least-requests  (max load - load) / (max load - min load), 1 when all loads are equal
                                                                            (its queue scorer, min-max normalised)
                    spelt NAME:WEIGHT,... (``parse_scorers``: weights finite and >= 0, one at least > 0)

``reads`` names what a router reads of the replicas (of "load", "kv_usage", "cached_tokens"): round-robin and
random read nothing, so a fleet need not bring every replica to every arrival's instant for them, and a router
that reads only the load needs a replica brought there only when one of its requests may have finished
(kvlab.fleet.fleet).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

# The router as configured is parsed in the configuration (kvlab.config.router); its names are kept here for
# kvlab.fleet's callers.
from kvlab.config.router import DEFAULT_SCORERS, RouterSpec, parse_router, parse_scorers  # noqa: F401
from kvlab.workload.request import Request

if TYPE_CHECKING:
    from kvlab.sim import RunInFlight, Simulation


class Replica:
    """A replica as a router reads it at an arrival's instant: its simulation, and the slots that the iterations
    starting before that instant of a decode run not yet begun will take (``Simulation.read_at``: a read does not
    cut a run; 0 when the simulation stands at the instant)."""

    __slots__ = ("sim", "slots_in_flight", "run_in_flight")

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.slots_in_flight = 0
        self.run_in_flight: RunInFlight | None = None  # (that run, as the last read priced it)


def load(replica: Replica) -> int:
    """Requests given to the replica and not yet finished (or rejected)."""
    sim = replica.sim
    counters = sim.counters
    return len(sim.requests) - counters.num_finished - counters.num_rejected


def kv_usage(replica: Replica) -> float:
    allocator = replica.sim.allocator
    return (allocator.num_allocated_slots + replica.slots_in_flight) / allocator.num_slots


def cached_tokens(replica: Replica, request: Request) -> int:
    # (A fleet reads inside runs only where this answer cannot depend on the state: kvlab.fleet.fleet.replicas_read.)
    return replica.sim.allocator.peek_num_cached_tokens(request)


LOAD, KV_USAGE, CACHED_TOKENS = "load", "kv_usage", "cached_tokens"


class Router(Protocol):
    name: str
    reads: frozenset[str]

    def route(self, request: Request, replicas: Sequence[Replica]) -> tuple[int, str]:
        """The replica (an index into ``replicas``) and why, in a few words from a fixed set (counted per run)."""
        ...


def _least_loaded(replicas: Sequence[Replica], indices: Sequence[int] | None = None) -> int:
    """The replica with the lowest load (the lowest index among equals), of ``indices`` (default: all)."""
    if indices is None:
        loads = [load(replica) for replica in replicas]
        return loads.index(min(loads))
    return min(indices, key=lambda i: (load(replicas[i]), i))


class RoundRobin:
    name = "round-robin"
    reads: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.next = 0

    def route(self, request: Request, replicas: Sequence[Replica]) -> tuple[int, str]:
        index = self.next
        self.next = (index + 1) % len(replicas)
        return index, "in turn"


class Random:
    name = "random"
    reads: frozenset[str] = frozenset()

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def route(self, request: Request, replicas: Sequence[Replica]) -> tuple[int, str]:
        return self.rng.randrange(len(replicas)), "drawn"


class LeastRequests:
    name = "least-requests"
    reads = frozenset({LOAD})

    def route(self, request: Request, replicas: Sequence[Replica]) -> tuple[int, str]:
        return _least_loaded(replicas), "fewest requests"


class LeastKV:
    name = "least-kv"
    reads = frozenset({KV_USAGE})

    def route(self, request: Request, replicas: Sequence[Replica]) -> tuple[int, str]:
        return min(range(len(replicas)), key=lambda i: (kv_usage(replicas[i]), i)), "lowest KV use"


class Prefix:
    name = "prefix"
    reads = frozenset({LOAD, CACHED_TOKENS})

    def route(self, request: Request, replicas: Sequence[Replica]) -> tuple[int, str]:
        hits = [cached_tokens(replica, request) for replica in replicas]
        best = max(hits)
        if not best:
            return _least_loaded(replicas), "no prefix cached: fewest requests"
        holders = [i for i, hit in enumerate(hits) if hit == best]
        if len(holders) == 1:
            return holders[0], "longest cached prefix"
        return _least_loaded(replicas, holders), "longest cached prefix, tie: fewest requests"


# Scorers of the weighted router: each gives every replica a score in [0, 1], higher is better.

def _prefix_scores(request: Request, replicas: Sequence[Replica]) -> list[float]:
    return [cached_tokens(sim, request) / request.prompt_len for sim in replicas]


def _kv_scores(request: Request, replicas: Sequence[Replica]) -> list[float]:
    return [1.0 - kv_usage(replica) for replica in replicas]


def _request_scores(request: Request, replicas: Sequence[Replica]) -> list[float]:
    loads = [load(replica) for replica in replicas]
    lo, hi = min(loads), max(loads)
    return [1.0] * len(loads) if hi == lo else [(hi - n) / (hi - lo) for n in loads]


SCORERS: dict[str, Callable[[Request, Sequence[Replica]], list[float]]] = {
    "prefix": _prefix_scores,
    "least-kv": _kv_scores,
    "least-requests": _request_scores,
}
_SCORER_READS = {"prefix": CACHED_TOKENS, "least-kv": KV_USAGE, "least-requests": LOAD}


class Weighted:
    name = "weighted"

    def __init__(self, scorers: tuple[tuple[str, float], ...]) -> None:
        self.scorers = tuple((SCORERS[name], weight) for name, weight in scorers if weight > 0)
        # (the load too, for ties: a set without a load scorer would send every request that scores alike, one that
        # shares no prefix under prefix:1, to replica 0; trial 51)
        self.reads = frozenset(_SCORER_READS[name] for name, weight in scorers if weight > 0) | {LOAD}

    def route(self, request: Request, replicas: Sequence[Replica]) -> tuple[int, str]:
        totals = [0.0] * len(replicas)
        for scorer, weight in self.scorers:
            for i, score in enumerate(scorer(request, replicas)):
                totals[i] += weight * score
        best = max(totals)
        holders = [i for i, total in enumerate(totals) if total == best]
        if len(holders) == 1:
            return holders[0], "highest score"
        return _least_loaded(replicas, holders), "highest score, tie: fewest requests"


ROUTERS: dict[str, Callable[..., Router]] = {
    "round-robin": RoundRobin,
    "random": Random,
    "least-requests": LeastRequests,
    "least-kv": LeastKV,
    "prefix": Prefix,
    "weighted": Weighted,
}


def make_router(spec: RouterSpec) -> Router:
    """A fresh router as ``spec`` configures it (its turn counter or generator at the start)."""
    if spec.name == "weighted":
        return Weighted(spec.scorers)
    if spec.name == "random":
        return Random(spec.seed)
    return ROUTERS[spec.name]()

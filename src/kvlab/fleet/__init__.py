"""A fleet: many replicas of one vLLM engine behind a router, on one clock (docs/fleet.md).

    from kvlab.fleet import Fleet, parse_router, fewest_replicas, check_fleet_work

    router = parse_router("prefix")                                    # or "weighted", scorers="prefix:2,least-kv:1"
    result = Fleet(strategy, config, workload, router, num_replicas=8).run()     # a FleetResult
    result.summary()          # {"router", "num_replicas", "fleet": kvlab run's summary of the whole fleet,
                              #  "prefix_hit_rate", "load_imbalance", "decisions", "replicas": [per replica]}
    result.replicas[j]        # replica j's SimResult (records, counters, integral, log), as a lone engine's
    result.records            # every request's record, in arrival order

    search = fewest_replicas(strategy, config, router, workload, holds=lambda r: ...)   # the fewest that hold
    search.num_replicas, search.runs                                    # the answer and every run it rests on

    check_fleet_work(num_requests, num_replicas, router, num_gpu_blocks)   # TooMuchWork with an estimate, unless
                                                                           # kvlab.validate.allow_large_work()

One replica behind any router gives the engine's own records and summary, bit for bit (`--replicas 1` is
`kvlab run`). The pieces: routers.py (the routers and the weighted router's scorers), fleet.py (the loop on one
clock), result.py (what a fleet did, and its numbers), capacity.py (the fewest replicas), work.py (what a fleet costs to
simulate).
"""

from kvlab.fleet.capacity import ReplicaSearch, fewest_replicas
from kvlab.fleet.fleet import Fleet, check_num_replicas, run_fleet
from kvlab.fleet.result import FleetResult
from kvlab.fleet.routers import DEFAULT_SCORERS, ROUTERS, SCORERS, RouterSpec, parse_router, parse_scorers
from kvlab.fleet.work import MAX_REPLICAS, FleetWork, check_fleet_work, estimate_fleet_work

__all__ = [
    "DEFAULT_SCORERS",
    "MAX_REPLICAS",
    "ROUTERS",
    "SCORERS",
    "Fleet",
    "FleetResult",
    "FleetWork",
    "ReplicaSearch",
    "RouterSpec",
    "check_fleet_work",
    "check_num_replicas",
    "estimate_fleet_work",
    "fewest_replicas",
    "parse_router",
    "parse_scorers",
    "run_fleet",
]

"""A fleet: many replicas of one vLLM engine behind a router, on one clock (docs/fleet.md).

The library API (what the command line's --replicas / --router / --router-scorers call):

    from kvlab.config import resolve
    from kvlab.fleet import Fleet, check_fleet_work, check_num_replicas, fewest_replicas, parse_router

    config = resolve(model="llama-3.1-8b", gpu="h100-sxm", workload="sessions", rate=8.0)   # as kvlab run's
    router = parse_router("weighted", scorers="prefix:2,least-kv:1,least-requests:1", seed=0)
                              # a RouterSpec; names in ROUTERS; scorers (weighted only) in SCORERS; seed: random's
    check_num_replicas(8)     # KvlabError for 0, -1, 1.5: "--replicas ...: a whole number of replicas, 1 or more"
    check_fleet_work(num_requests, 8, router, config.cache.num_gpu_blocks, strategy)
                              # TooMuchWork with the estimate, unless kvlab.validate.allow_large_work() (--yes)
    result = Fleet(strategy, config.engine, workload, router, 8).run()          # a FleetResult
    result = Fleet(strategy, config.engine, workload, router, 8, admission=config.admission).run()
                              # behind a gateway (kvlab.fleet.admission, --rate-limit): result.gate, and
                              # result.summary()["fleet"]["admission"]
    result.summary()          # {"router", "num_replicas", "fleet": kvlab run's summary of the whole fleet,
                              #  "prefix_hit_rate", "load_imbalance", "decisions", "replicas": [per replica]}
    result.replicas[j]        # replica j's SimResult (records, counters, integral, log), as a lone engine's
    result.records            # every request's record, in arrival order, on the clients' clock

    search = fewest_replicas(strategy, config.engine, router, workload, holds=lambda result: ...)
    search.num_replicas       # the fewest that held (None: not even max_replicas did)
    search.runs, search.held  # every count tried: its FleetResult, and whether it held
    search.points()           # (replicas, p99 TTFT, held) for each count tried: the plot against replica count

One replica behind any router gives the engine's own records and summary, bit for bit (`--replicas 1` is
`kvlab run`: tests/test_fleet.py against kvlab.service.run). A profile's request latency is put around the fleet
as the run service puts it around one engine. The pieces: routers.py (the routers and the weighted router's
scorers), fleet.py (the loop on one clock, and how much of it each router needs), result.py (what a fleet did,
and its numbers), capacity.py (the fewest replicas), work.py (what a fleet costs to simulate), experiments.py
(the routing experiments docs/fleet.md reports).
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

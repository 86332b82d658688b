"""What a fleet costs to simulate, estimated before anything is built, and the refusal beyond the work limits.

A fleet is one process: its CPU time is each request's own (as in one engine) plus, for a router that reads the
replicas' state, bringing every replica to every arrival; its memory is the requests' plus every replica's KV
block pool. In kvlab.validate's unit, a request-run (one request through one engine, ~60 µs on the benchmark
machine, benchmarks/README.md):

    request-runs = num_requests · (1 + SYNC_COST[what the router reads] · num_replicas)
                 + num_replicas · num_gpu_blocks · BLOCK_COST            (setting up each replica's pool)
    memory       = num_requests · BYTES_PER_REQUEST + num_replicas · num_gpu_blocks · BYTES_PER_BLOCK

The constants are measured by benchmarks/bench_fleet.py (docs/fleet.md gives the figures).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.fleet.fleet import check_num_replicas, replicas_read
from kvlab.fleet.routers import RouterSpec, make_router, parse_router
from kvlab.strategies import Strategy
from kvlab.validate import BYTES_PER_REQUEST, GIB, TooMuchWork, large_work_allowed, work_limit

# The most replicas one fleet may have: each is a whole engine with its own pool in this one process.
MAX_REPLICAS = 4096
# What bringing the replicas to each arrival adds, in request-runs per replica per request, by what the router
# reads (kvlab.fleet.fleet.replicas_read; bench_fleet.py, 8 replicas against one: round-robin and random read
# nothing, least-requests only loads, least-kv and weighted read inside runs, prefix routers everything).
SYNC_COST = {"none": 0.0, "load": 0.07, "runs": 0.08, "every": 0.18}
# Setting up a pool's block (a paged pool's free list): in request-runs, and bytes.
BLOCK_COST = 0.02
BYTES_PER_BLOCK = 48
SECONDS_PER_REQUEST_RUN = 60e-6


@dataclass(frozen=True, slots=True)
class FleetWork:
    num_requests: int
    num_replicas: int
    request_runs: float
    memory_bytes: float

    @property
    def seconds(self) -> float:
        """A rough wall time on the benchmark machine."""
        return self.request_runs * SECONDS_PER_REQUEST_RUN


def estimate_fleet_work(num_requests: int, num_replicas: int, router: RouterSpec | str, num_gpu_blocks: int,
                        strategy: Strategy | None = None) -> FleetWork:
    """What a fleet of ``strategy`` (default: prefix caching on, the costliest) would cost to simulate."""
    spec = parse_router(router) if isinstance(router, str) else router
    check_num_replicas(num_replicas)
    reads = replicas_read(make_router(spec).reads, strategy or Strategy("", "continuous", "paged", enable_prefix_caching=True))
    sync = SYNC_COST[reads] * num_replicas
    runs = num_requests * (1 + sync) + num_replicas * num_gpu_blocks * BLOCK_COST
    memory = num_requests * BYTES_PER_REQUEST + num_replicas * num_gpu_blocks * BYTES_PER_BLOCK
    return FleetWork(num_requests, num_replicas, runs, memory)


def check_fleet_work(num_requests: int, num_replicas: int, router: RouterSpec | str, num_gpu_blocks: int,
                     strategy: Strategy | None = None, *, what: str = "this fleet") -> FleetWork:
    """The estimate; TooMuchWork, saying it, when beyond the limits (``--replicas`` above MAX_REPLICAS, or
    kvlab.validate's request-runs and memory) unless kvlab.validate.allow_large_work() is on (the CLI's --yes)."""
    work = estimate_fleet_work(num_requests, num_replicas, router, num_gpu_blocks, strategy)
    if large_work_allowed():
        return work
    max_runs, max_memory = work_limit("max_request_runs"), work_limit("max_memory_bytes")
    if num_replicas <= MAX_REPLICAS and work.request_runs <= max_runs and work.memory_bytes <= max_memory:
        return work
    raise TooMuchWork(
        f"{what} means {num_replicas:,} replicas of {num_gpu_blocks:,} KV blocks serving about {num_requests:,} "
        f"requests: ~{_duration(work.seconds)} and ~{work.memory_bytes / GIB:,.1f} GiB of memory, beyond the limit of "
        f"{MAX_REPLICAS:,} replicas, {max_runs:,} request-runs and {max_memory / GIB:,.0f} GiB; use fewer --replicas "
        "or requests (-n, --duration), or pass --yes to go ahead")


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.0f} {unit}"
    return f"{seconds:,.0f} s"

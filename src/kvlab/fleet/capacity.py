"""The fewest replicas that hold a rate: a search over the replica count, resting on the runs it shows.

Which count to judge next (double until a count holds, then bisect) is kvlab.fleet.counts.CountSearch's rule, the
one the service's stored search (kvlab.service.replicas) follows too; here each count is a fleet run in this
process. The workload is the offered traffic (its rate is the fleet's), the same at every N; ``holds(result)``
judges a run (the caller's "sustained" and SLO: kvlab.sweep's definitions). The search assumes that a count that
holds still holds with more replicas, as the bisection needs; every count it tried is in ``runs``, so a reader can
see the ones on both sides of the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvlab.config import SimConfig
from kvlab.fleet.counts import CountSearch
from kvlab.fleet.fleet import check_num_replicas, run_fleet
from kvlab.fleet.result import FleetResult
from kvlab.fleet.routers import RouterSpec, parse_router
from kvlab.strategies import Strategy
from kvlab.workload import Workload


@dataclass
class ReplicaSearch:
    """The answer (None when not even ``max_replicas`` held) and every run it rests on, by replica count."""

    router: RouterSpec
    num_replicas: int | None
    max_replicas: int
    runs: dict[int, FleetResult] = field(default_factory=dict)
    held: dict[int, bool] = field(default_factory=dict)

    @property
    def tried(self) -> list[int]:
        return sorted(self.runs)

    def points(self, metric: str = "ttft_s", stat: str = "p99") -> list[tuple[int, float | None, bool]]:
        """(replicas, the fleet's ``stat`` of ``metric``, held) for every count tried, fewest first: the curve a
        report plots (p99 TTFT against replica count by default)."""
        return [(n, self.runs[n].summary()["fleet"][metric][stat], self.held[n]) for n in self.tried]


def fewest_replicas(strategy: Strategy, config: SimConfig, router: RouterSpec | str, workload: Workload,
                    holds: Callable[[FleetResult], bool], *, max_replicas: int = 64, first: int = 1,
                    on_run: Callable[[int, FleetResult, bool], None] | None = None,
                    **fleet_options) -> ReplicaSearch:
    """The fewest replicas of ``strategy`` on ``config`` behind ``router`` for which ``holds(run)`` is true on
    ``workload``, trying ``first``, 2·first, 4·first, ... up to ``max_replicas``, then bisecting. ``on_run(n,
    result, held)`` is called after each run (a progress line)."""
    spec = parse_router(router) if isinstance(router, str) else router
    check_num_replicas(first)
    counts = CountSearch(first=first, max_replicas=max_replicas)
    search = ReplicaSearch(spec, None, max_replicas)
    while (n := counts.next_count()) is not None:
        result = run_fleet(strategy, config, workload, spec, n, **fleet_options)
        held = bool(holds(result))
        search.runs[n], search.held[n] = result, held
        counts.record(n, held)
        if on_run is not None:
            on_run(n, result, held)
    search.num_replicas = counts.num_replicas
    return search

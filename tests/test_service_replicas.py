"""The fewest-replicas search (kvlab.service.replicas), in process: each count is a sweep point run through the
service's fleet run, so the fleet's work check refuses a count it would refuse in `kvlab run --replicas N`, and a
search stopped part-way resumes from the store without simulating a count again. Each search runs on two
samples, the workload and twice it, the answer the larger count. (tests/test_sweep_signals.py
stops the real command with SIGINT; tests/test_capacity_replicas.py checks its answers.)"""

from __future__ import annotations

from concurrent.futures import Future

import pytest

import kvlab
from kvlab.service import replicas
from kvlab.sweep.grid import parse_cli_args, row_kinds
from kvlab.sweep.point import compute
from kvlab.sweep.runner import Runner
from kvlab.sweep.slo import parse_slo
from kvlab.sweep.store import Store

ARGS = ["--rate", "8", "--strategy", "vllm", "--cost", "paper-2023", "--router", "round-robin"]
SLO = parse_slo("p99_ttft<2s", None)


class InlinePool:
    """A pool that computes each point as it is submitted, in this process; ``stop_after`` submissions, the next
    one is a Ctrl-C."""

    num_workers = 1

    def __init__(self, stop_after: int | None = None):
        self.submitted: list[dict] = []
        self.stop_after = stop_after

    def submit(self, point: dict) -> Future:
        if self.stop_after is not None and len(self.submitted) == self.stop_after:
            raise KeyboardInterrupt
        self.submitted.append(point)
        future: Future = Future()
        future.set_result(compute(point))
        return future

    def close(self, *, cancel: bool = False) -> None:
        pass


def _search(store: Store, pool: InlinePool):
    rate, searches = replicas.replica_searches(parse_cli_args(ARGS), [])
    judged: list[tuple[int, int, bool]] = []
    replicas.search_fewest_replicas(searches, Runner(store, pool, kvlab.__version__), SLO,
                                    lambda s, n, held: judged.append((s.factor, n, held)))
    return replicas.answer(rate, searches), judged


def test_a_stopped_search_resumes_without_simulating_a_count_again():
    whole_pool = InlinePool()
    whole, judged = _search(Store(None, row_kinds()), whole_pool)
    assert [n for factor, n, _ in judged if factor == 1] == [1, 2, 4, 8, 6, 5]
    (entry,) = whole.entries
    first, second = entry["samples"]["replicas"]
    held = {n for factor, n, h in judged if factor == 1 and h}
    assert first == min(held) and first - 1 not in held and entry["replicas"] == max(first, second)
    assert entry["samples"]["lengths"][1] == 2 * entry["samples"]["lengths"][0]

    store = Store(None, row_kinds())
    with pytest.raises(KeyboardInterrupt):
        _search(store, InlinePool(stop_after=2))  # (each sample's first count stored, the third never started)
    assert store.num_stored() == 2
    pool = InlinePool()
    resumed, judged_again = _search(store, pool)
    # (the two stored counts read from the store, every other count simulated once)
    assert pool.submitted == whole_pool.submitted[2:]
    assert judged_again == judged and resumed.entries == whole.entries


def test_a_count_beyond_the_fleets_work_limit_is_refused_as_kvlab_run_refuses_it(monkeypatch):
    """Each count runs through kvlab.service.run_fleets, whose check_fleet_work refuses a fleet too large to
    simulate (here: a limit of 1 request-run, so any fleet is too large; one replica is the engine alone)."""
    from kvlab.fleet import work

    monkeypatch.setattr(work, "work_limit", lambda name: 1)
    found, judged = _search(Store(None, row_kinds()), InlinePool())
    (entry,) = found.entries
    assert judged == [(1, 1, False), (2, 1, False)] and entry["replicas"] is None
    assert entry["error"].startswith("2 replicas: this fleet means 2 replicas of")

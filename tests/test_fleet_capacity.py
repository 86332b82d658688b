"""The fewest replicas that hold a rate, and what a fleet costs to simulate (refused beyond the work limits)."""

from __future__ import annotations

import pytest

from kvlab.config import resolve
from kvlab.errors import KvlabError
from kvlab.fleet import MAX_REPLICAS, check_fleet_work, estimate_fleet_work, fewest_replicas
from kvlab.strategies import parse_strategy
from kvlab.validate import TooMuchWork, allow_large_work
from kvlab.workload import load_workload


@pytest.fixture(scope="module")
def setup():
    config = resolve(model="opt-13b", gpu="a100-40gb", available_kv_gib=12).engine
    return parse_strategy("vllm"), config, load_workload("paper-sharegpt", rate=7.0, num_requests=1500, seed=0)


def p99_ttft_under(limit_s: float):
    def holds(result) -> bool:
        fleet = result.summary()["fleet"]
        return fleet["num_rejected"] == 0 and fleet["num_finished"] > 0 and fleet["ttft_s"]["p99"] < limit_s
    return holds


def test_the_fewest_replicas_hold_and_one_fewer_does_not(setup):
    """7 req/s of ShareGPT-like requests on OPT-13B/A100 replicas (one sustains about 2.6): 1 and 2 drown (p99
    TTFT of minutes and tens of seconds), 4 hold, and the bisection finds that 3 hold too."""
    strategy, config, workload = setup
    seen = []
    search = fewest_replicas(strategy, config, "least-requests", workload, p99_ttft_under(0.5),
                             on_run=lambda n, result, held: seen.append((n, held)))
    assert search.num_replicas == 3
    assert seen == [(1, False), (2, False), (4, True), (3, True)]
    assert search.tried == [1, 2, 3, 4] and search.held == {1: False, 2: False, 4: True, 3: True}
    assert search.runs[3].num_replicas == 3 and search.runs[3].summary()["fleet"]["ttft_s"]["p99"] < 0.5
    assert search.runs[2].summary()["fleet"]["ttft_s"]["p99"] > 10
    assert search.router.text == "least-requests"
    curve = search.points()
    assert [(n, held) for n, _, held in curve] == [(1, False), (2, False), (3, True), (4, True)]
    assert curve[0][1] > curve[1][1] > curve[2][1] > 0  # p99 TTFT falls as replicas are added


def test_no_answer_below_the_most_replicas_allowed(setup):
    strategy, config, workload = setup
    search = fewest_replicas(strategy, config, "round-robin", workload, p99_ttft_under(1e-6), max_replicas=3)
    assert search.num_replicas is None and search.tried == [1, 2, 3]
    with pytest.raises(KvlabError, match="--max-replicas 1 is below the first count tried"):
        fewest_replicas(strategy, config, "round-robin", workload, p99_ttft_under(1.0), first=2, max_replicas=1)


def test_a_fleet_too_large_is_refused_with_its_estimate(monkeypatch):
    small = check_fleet_work(10_000, 8, "least-requests", 1000, parse_strategy("vllm"))
    assert small.num_replicas == 8 and small.request_runs > 10_000
    # What the router reads is what costs: nothing (round-robin) < loads < everything (least-kv).
    costs = [estimate_fleet_work(10_000, 8, router, 1000, parse_strategy("vllm")).request_runs
             for router in ("round-robin", "least-requests", "least-kv")]
    assert costs[0] < costs[1] < costs[2]
    assert estimate_fleet_work(10_000, 16, "least-kv", 1000).request_runs > costs[2]
    with pytest.raises(TooMuchWork, match=rf"beyond the limit of {MAX_REPLICAS:,} replicas.*pass --yes"):
        check_fleet_work(100, MAX_REPLICAS + 1, "round-robin", 100)
    monkeypatch.setenv("KVLAB_MAX_REQUEST_RUNS", "50000")
    with pytest.raises(TooMuchWork, match=r"64 replicas of 1,000 KV blocks serving about 100,000 requests: ~\d"):
        check_fleet_work(100_000, 64, "prefix", 1000)
    with allow_large_work():
        assert check_fleet_work(100_000, 64, "prefix", 1000).num_replicas == 64

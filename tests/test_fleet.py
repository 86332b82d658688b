"""A fleet of engines behind a router: one replica is the engine itself, the fast paths are the reference path,
and each router's rule gives exact decisions on tiny pools."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.config import CacheConfig, SchedulerConfig
from kvlab.cost import CostModel
from kvlab.errors import KvlabError
from kvlab.fleet import ROUTERS, Fleet, check_num_replicas, parse_router, parse_scorers
from kvlab.metrics import ITERATION_COLUMNS
from kvlab.sim import SimConfig, Simulation
from kvlab.strategies import parse_strategy
from kvlab.workload import Workload
from kvlab.workload.request import Request

# 10 ms of weights per iteration plus 1 µs per context token: simple numbers, memory-bound (as tests/test_sim.py).
COST = CostModel(weights_bytes=8e6, kv_bytes_per_token=800.0, flops_per_token=1.0, attention_flops_per_pair=1.0,
                 memory_bandwidth=1e9, peak_flops=1e15, overhead_s=0.0)

ROUTER_SPECS = [*(name for name in ROUTERS if name != "weighted"), "weighted"]


def config(**numbers) -> SimConfig:
    numbers = dict(num_slots=128, block_size=4, max_model_len=64, max_num_seqs=8, max_num_batched_tokens=64) | numbers
    parts = {kind: {k: v for k, v in numbers.items() if k in {f.name for f in dataclasses.fields(kind)}}
             for kind in (CacheConfig, SchedulerConfig)}
    return SimConfig(CacheConfig(**parts[CacheConfig]), COST, SchedulerConfig(**parts[SchedulerConfig]))


def workload(*requests: Request) -> Workload:
    return Workload(name="test", requests=tuple(requests), description="made by the test", source="test")


def req(i: int, t: float, prompt: int, output: int, prefix: tuple[int, ...] = ()) -> Request:
    return Request(i, t, prompt, output, prefix_hashes=prefix, prefix_chunk_len=8)


def random_workload(seed: int, num: int = 160) -> Workload:
    """Bursts and lulls, equal arrival times, prompts sharing prefixes, a few too long to serve."""
    rng = random.Random(seed)
    t, requests = 0.0, []
    for i in range(num):
        t += 0.0 if rng.random() < 0.15 else rng.expovariate(60.0 if rng.random() < 0.7 else 5.0)
        prefix = (rng.randrange(4), rng.randrange(3)) if rng.random() < 0.6 else ()
        prompt = rng.randrange(70, 90) if rng.random() < 0.03 else rng.randrange(2, 40)
        requests.append(req(i, t, prompt, rng.randrange(1, 24), prefix))
    return workload(*requests)


def _same_run(a, b) -> None:
    """Two SimResults alike: records, counters, memory integral, every column of the log."""
    assert a.records == b.records
    assert a.counters == b.counters
    assert a.integral == b.integral
    assert a.makespan == b.makespan
    assert a.summary() == b.summary()
    if a.log is not None or b.log is not None:
        for column in ITERATION_COLUMNS:
            assert np.array_equal(a.log.columns[column], b.log.columns[column]), column


# One replica is the engine ------------------------------------------------------------------------------------


@pytest.mark.parametrize("router", ROUTER_SPECS)
@pytest.mark.parametrize("strategy", ["vllm", "vllm+prefix", "orca-max", "static+paged"])
def test_one_replica_behind_any_router_is_kvlab_run(router, strategy):
    """The contract `--replicas 1` rests on: the engine's own records, log and summary, bit for bit."""
    wl = random_workload(seed=3)
    cfg = config()
    plain = Simulation(parse_strategy(strategy), cfg, wl).run()
    fleet = Fleet(parse_strategy(strategy), cfg, wl, router, 1).run()
    _same_run(fleet.replicas[0], plain)
    assert fleet.records == plain.records
    assert fleet.summary()["fleet"] == plain.summary()
    assert fleet.num_routed == [wl.num_requests]


@pytest.mark.parametrize("router", ["round-robin", "least-requests", "prefix"])
@pytest.mark.parametrize(("name", "strategy"), [("paper-sharegpt", "vllm"), ("sessions", "vllm+prefix")])
def test_one_replica_is_what_the_run_service_gives(router, name, strategy):
    """`kvlab run` is kvlab.service.run: one replica behind a router gives its result exactly."""
    from kvlab import service
    from kvlab.config import resolve

    config = resolve(model="opt-13b", gpu="a100-40gb", available_kv_gib=2, workload=name, rate=3.0,
                     num_requests=400, seed=1)
    ran = service.run(config, [strategy])
    fleet = Fleet(parse_strategy(strategy), config.engine, ran.workload, router, 1).run()
    _same_run(fleet.replicas[0], ran.results[0])
    assert fleet.summary()["fleet"] == ran.summaries()[0]


def test_a_profiles_request_latency_is_around_the_fleet_as_around_one_engine():
    from kvlab.cost.latency import as_seen_by_clients, delayed

    cfg = config()
    cfg = dataclasses.replace(cfg, cost=dataclasses.replace(cfg.cost, request_latency_s=0.05))
    wl = random_workload(seed=2)
    alone = as_seen_by_clients(Simulation(parse_strategy("vllm"), cfg, delayed(wl, 0.05)).run(), 0.05)
    fleet = Fleet(parse_strategy("vllm"), cfg, wl, "least-requests", 1).run()
    _same_run(fleet.replicas[0], alone)
    assert fleet.records[0].arrival_time == wl.requests[0].arrival_time  # the client's clock
    assert min(r.ttft for r in fleet.records if r.ttft is not None) > 0.05


def with_deadlines(wl: Workload, seed: int) -> Workload:
    """Some clients give up after 0.05 to 0.5 s (a few iterations to a few dozen), some never."""
    rng = random.Random(seed)
    return dataclasses.replace(wl, requests=tuple(
        dataclasses.replace(r, timeout=rng.choice((None, 0.05, 0.1, 0.2, 0.5))) for r in wl.requests))


@pytest.mark.parametrize("router", ["round-robin", "least-requests", "least-kv", "prefix"])
@pytest.mark.parametrize("gateway", [False, True])
def test_one_replica_keeps_the_engines_client_deadlines(router, gateway):
    """Trial 46: a fleet's replicas start empty and are given their requests later; a deadline among them must end
    a run as it does in a lone engine (Simulation._watch_deadlines), so one replica, alone or behind a gateway that
    admits everything (docs/admission.md), gives the lone engine's records bit for bit with --timeout."""
    from kvlab.config.admission import AdmissionSpec

    wl = with_deadlines(random_workload(seed=5), seed=5)
    cfg = config()
    plain = Simulation(parse_strategy("vllm"), cfg, wl).run()
    assert plain.counters.num_aborted  # (deadlines that pass inside decode runs)
    admission = AdmissionSpec(rate=1e6, burst=1000, max_queue=0) if gateway else None
    fleet = Fleet(parse_strategy("vllm"), cfg, wl, router, 1, admission=admission).run()
    _same_run(fleet.replicas[0], plain)
    assert fleet.records == plain.records


@pytest.mark.parametrize("router", ["round-robin", "least-kv"])
def test_no_replica_finishes_a_request_more_than_an_iteration_after_its_client_left(router):
    wl = with_deadlines(random_workload(seed=6, num=300), seed=6)
    fleet = Fleet(parse_strategy("vllm"), config(), wl, router, 2).run()
    timeouts = {r.request_id: r.timeout for r in wl.requests}
    longest = max(float(r.log.columns["duration"].max()) for r in fleet.replicas)
    late = [(r.request_id, r.e2e_latency, timeouts[r.request_id]) for r in fleet.records if r.status == "finished"
            and timeouts[r.request_id] is not None and r.e2e_latency > timeouts[r.request_id] + longest]
    assert sum(r.status == "aborted" for r in fleet.records) and not late


# The fast paths are the reference path ------------------------------------------------------------------------


@pytest.mark.parametrize("router", ROUTER_SPECS)
@pytest.mark.parametrize("strategy", ["vllm", "vllm+prefix"])
@pytest.mark.parametrize("seed", [0, 1])
def test_replicas_brought_only_where_needed_decide_and_run_as_if_all_were(router, strategy, seed):
    """Round-robin and random never bring the replicas to an arrival, least-requests only those whose load may
    have changed: the same decisions, and each replica the same run, as when every replica is brought to every
    arrival."""
    wl, cfg = random_workload(seed), config(num_slots=96)
    fast = Fleet(parse_strategy(strategy), cfg, wl, router, 3).run()
    reference = Fleet(parse_strategy(strategy), cfg, wl, router, 3, sync_every_arrival=True).run()
    assert fast.num_routed == reference.num_routed
    assert fast.reasons == reference.reasons
    for a, b in zip(fast.replicas, reference.replicas):
        _same_run(a, b)
    assert fast.summary() == reference.summary()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(st.tuples(st.floats(0, 0.05), st.integers(1, 60), st.integers(1, 30), st.integers(-1, 2)),
                   min_size=1, max_size=40),
    num_replicas=st.integers(2, 4),
    strategy=st.sampled_from(["vllm", "vllm+swap", "orca-oracle", "static+paged"]),
    chunked=st.booleans(),
    num_blocks=st.integers(8, 40),
    seq_overhead_s=st.sampled_from([0.0, 0.004]),
)
def test_loads_read_lazily_are_the_loads_at_every_arrival(specs, num_replicas, strategy, chunked, num_blocks,
                                                          seq_overhead_s):
    """least-requests on random tiny fleets (preemption by recompute or swap, slabs, static batches, chunked
    prefill on and off, a per-sequence cost): the replicas it skips could not have changed their loads."""
    t, requests = 0.0, []
    for i, (gap, prompt, output, group) in enumerate(specs):
        t += gap
        requests.append(req(i, t, prompt, output, (group, 5) if group >= 0 else ()))
    cost = dataclasses.replace(COST, seq_overhead_s=seq_overhead_s)
    cfg = dataclasses.replace(config(num_slots=4 * num_blocks, enable_chunked_prefill=chunked), cost=cost)
    wl = workload(*requests)
    fast = Fleet(parse_strategy(strategy), cfg, wl, "least-requests", num_replicas).run()
    reference = Fleet(parse_strategy(strategy), cfg, wl, "least-requests", num_replicas, sync_every_arrival=True).run()
    assert fast.num_routed == reference.num_routed
    for a, b in zip(fast.replicas, reference.replicas):
        assert a.records == b.records


def test_a_replica_serves_its_share_as_a_lone_engine_would():
    wl, cfg = random_workload(seed=5), config()
    fleet = Fleet(parse_strategy("vllm"), cfg, wl, "round-robin", 3).run()
    for j, replica in enumerate(fleet.replicas):
        share = workload(*wl.requests[j::3])
        alone = Simulation(parse_strategy("vllm"), cfg, share, start_time=wl.requests[0].arrival_time).run()
        _same_run(replica, alone)


# Each router's rule on tiny pools -------------------------------------------------------------------------------


def decisions(router: str, strategy: str, *requests: Request, num_replicas: int = 3, **numbers) -> list[int]:
    """The replica each request went to, in request order."""
    fleet = Fleet(parse_strategy(strategy), config(**numbers), workload(*requests), router, num_replicas).run()
    where = {record.request_id: j for j, result in enumerate(fleet.replicas) for record in result.records}
    return [where[r.request_id] for r in requests]


# Iterations take 10 ms (+1 µs per context token). r1 asks 2 tokens: its prefill (1-11 ms) and one decode
# (11-21 ms), so it is gone by 100 ms; r0 and r2 ask 20 tokens (~200 ms).
LOADS = (req(0, 0.000, 4, 20), req(1, 0.001, 4, 2), req(2, 0.002, 4, 20), req(3, 0.100, 4, 20),
         req(4, 0.101, 4, 20), req(5, 0.102, 4, 20))


def test_round_robin_takes_turns():
    assert decisions("round-robin", "vllm", *LOADS) == [0, 1, 2, 0, 1, 2]
    assert decisions("round-robin", "vllm", *LOADS, num_replicas=2) == [0, 1, 0, 1, 0, 1]


def test_random_draws_from_its_own_seeded_generator():
    draws = random.Random(0)
    assert decisions("random", "vllm", *LOADS) == [draws.randrange(3) for _ in LOADS]
    spec = parse_router("random", seed=7)
    fleet = Fleet(parse_strategy("vllm"), config(), workload(*LOADS), spec, 3)
    draws = random.Random(7)
    assert [j for r in LOADS for j, res in enumerate(fleet.run().replicas)
            if r.request_id in {x.request_id for x in res.records}] == [draws.randrange(3) for _ in LOADS]


def test_least_requests_counts_running_and_waiting():
    # At 100 ms replica 1 has finished r1 (loads 1, 0, 1): r3 goes there; then all hold one and the lowest index
    # takes r4; r5 sees loads 2, 1, 1.
    assert decisions("least-requests", "vllm", *LOADS) == [0, 1, 2, 1, 0, 1]


def test_least_kv_reads_the_blocks_not_the_requests():
    # r0's 24-token prompt holds 6 blocks of replica 0; r1 and r2 one each. At 3 ms every replica holds one
    # request: least-requests gives r3 to replica 0, least-kv to replica 1 (1 block; replica 2's 1 block ties).
    requests = (req(0, 0.000, 24, 10), req(1, 0.001, 4, 10), req(2, 0.002, 4, 10), req(3, 0.003, 4, 10))
    assert decisions("least-kv", "vllm", *requests) == [0, 1, 2, 1]
    assert decisions("least-requests", "vllm", *requests) == [0, 1, 2, 0]


PREFIXED = (
    req(0, 0.000, 17, 30, prefix=(7, 8)),  # miss everywhere: the least loaded (all 0: replica 0)
    req(1, 0.001, 6, 30),  # no prefix: the least loaded, replica 1
    req(2, 0.050, 17, 30, prefix=(7, 8)),  # replica 0 holds its 16 shared tokens, though replica 2 is idle
    req(3, 0.060, 9, 30, prefix=(9,)),  # misses: the least loaded, replica 2
    req(4, 0.070, 12, 30, prefix=(7, 5)),  # replica 0 holds 8 of its tokens (block 0 and 1 of chunk 7)
)


def test_prefix_goes_where_the_prefix_is_cached_and_misses_to_the_least_loaded():
    fleet = Fleet(parse_strategy("vllm+prefix"), config(), workload(*PREFIXED), "prefix", 3).run()
    assert decisions("prefix", "vllm+prefix", *PREFIXED) == [0, 1, 0, 2, 0]
    assert fleet.reasons == {"no prefix cached: fewest requests": 3, "longest cached prefix": 2}
    summary = fleet.summary()
    assert summary["replicas"][0]["prefix_hit_rate"] == pytest.approx((16 + 8) / (17 + 17 + 12))
    assert summary["prefix_hit_rate"] == pytest.approx((16 + 8) / (17 + 6 + 17 + 9 + 12))
    # Without prefix caching nothing is ever cached: the prefix router is least-requests.
    assert decisions("prefix", "vllm+noprefix", *PREFIXED) == decisions("least-requests", "vllm+noprefix",
                                                                         *PREFIXED) == [0, 1, 2, 0, 1]


def test_a_prefix_tie_goes_to_the_least_loaded_holder():
    # r0 and r1 arrive together: r1 finds nothing cached (r0 has not run yet) and goes to the least loaded,
    # replica 1; r2 has no prefix and goes to replica 2 (loads 1, 1, 0).
    requests = (req(0, 0.000, 17, 40, prefix=(7, 8)), req(1, 0.000, 17, 40, prefix=(7, 8)),
                req(2, 0.001, 5, 40), req(3, 0.050, 17, 40, prefix=(7, 8)))
    fleet = Fleet(parse_strategy("vllm+prefix"), config(), workload(*requests), "prefix", 3).run()
    assert decisions("prefix", "vllm+prefix", *requests) == [0, 1, 2, 0]
    # r3: replicas 0 and 1 both hold 16 of its tokens and one request each: the lowest index.
    assert fleet.reasons == {"no prefix cached: fewest requests": 3, "longest cached prefix, tie: fewest requests": 1}


def test_weighted_adds_its_scorers_by_weight():
    # At 50 ms (r2): prefix scores 16/17, 0, 0; loads 1, 1, 0 give least-requests scores 0, 0, 1.
    # prefix:1 + least-requests:1 -> 0.94, 0, 1: replica 2; prefix:2 -> 1.88, 0, 1: replica 0.
    def weighted(scorers: str) -> list[int]:
        fleet = Fleet(parse_strategy("vllm+prefix"), config(), workload(*PREFIXED[:3]),
                      parse_router("weighted", scorers), 3).run()
        where = {rec.request_id: j for j, res in enumerate(fleet.replicas) for rec in res.records}
        return [where[i] for i in range(3)]

    assert weighted("prefix:1,least-requests:1") == [0, 1, 2]
    assert weighted("prefix:2,least-requests:1") == [0, 1, 0]
    assert weighted("least-requests") == [0, 1, 2]


# What the fleet reports ---------------------------------------------------------------------------------------


def test_served_tokens_imbalance_and_decisions():
    requests = (req(0, 0.0, 10, 5), req(1, 0.01, 20, 5), req(2, 0.02, 10, 5), req(3, 0.03, 30, 5))
    summary = Fleet(parse_strategy("vllm"), config(), workload(*requests), "round-robin", 2).run().summary()
    served = [r["served_tokens"] for r in summary["replicas"]]
    assert served == [10 + 5 + 10 + 5, 20 + 5 + 30 + 5]
    assert summary["load_imbalance"] == pytest.approx(60 / 45)
    assert summary["decisions"] == {"per_replica": [2, 2], "reasons": {"in turn": 4}}
    assert summary["num_replicas"] == 2 and summary["router"] == "round-robin"
    assert summary["fleet"]["num_finished"] == 4
    assert [r["num_routed"] for r in summary["replicas"]] == [2, 2]
    # The fleet's makespan is the last finish anywhere, on the one clock.
    assert summary["fleet"]["makespan_s"] == max(r["makespan_s"] for r in summary["replicas"])


# Bad input ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_replicas_must_be_a_whole_number_from_1(value):
    with pytest.raises(KvlabError, match=r"--replicas .*whole number of replicas, 1 or more"):
        check_num_replicas(value)


def test_unknown_router_names_the_valid_ones():
    with pytest.raises(KvlabError, match=r"unknown router 'least-request'; did you mean 'least-requests'\? \(valid: "
                                         r"round-robin, random, least-requests, least-kv, prefix, weighted\)"):
        parse_router("least-request")
    with pytest.raises(KvlabError, match="--router-scorers applies only to --router weighted"):
        parse_router("prefix", "prefix:1")


@pytest.mark.parametrize(("spec", "message"), [
    ("prefix:2,lru:1", r"unknown scorer 'lru' in --router-scorers 'prefix:2,lru:1'; valid: prefix, least-kv, "
                       r"least-requests"),
    ("prefix:nan", r"weight 'nan' of scorer 'prefix' .* is not a finite number >= 0"),
    ("prefix:inf", r"weight 'inf' of scorer 'prefix' .* is not a finite number >= 0"),
    ("prefix:two", r"weight 'two' of scorer 'prefix' .* is not a finite number >= 0"),
    ("least-kv:-1", r"weight '-1' of scorer 'least-kv' .* is not a finite number >= 0"),
    ("prefix:1,prefix:2", r"scorer 'prefix' is given twice"),
    ("prefix:0", r"weighs every scorer 0"),
    ("  ", r"--router-scorers is empty"),
])
def test_bad_scorers_get_one_line(spec, message):
    with pytest.raises(KvlabError, match=message):
        parse_scorers(spec)


def test_scorers_parse_with_default_weights():
    assert parse_scorers("prefix:2, least-kv:1,least-requests") == (("prefix", 2.0), ("least-kv", 1.0),
                                                                     ("least-requests", 1.0))
    assert parse_router("weighted").text == "weighted(prefix:2,least-kv:1,least-requests:1)"


def test_the_configuration_names_the_routers_and_scorers_the_fleet_runs():
    """--router is parsed in kvlab.config.router (config never imports the fleet); the fleet maps the same names."""
    from kvlab.config.router import ROUTER_NAMES, SCORER_NAMES
    from kvlab.fleet import SCORERS

    assert tuple(ROUTERS) == ROUTER_NAMES
    assert tuple(SCORERS) == SCORER_NAMES


def test_a_weighted_router_without_a_load_scorer_breaks_ties_by_load(kvlab):
    """trial 51, finding 16: --router weighted --router-scorers prefix:1 on prompts that share nothing scores every
    replica 0, and every tie went to replica 0 ("requests routed per replica: 100, 0, 0, 0"); the prefix router on
    the same run falls back to the fewest requests, and so does weighted now."""
    import json

    runs = {}
    for router in (("weighted", "--router-scorers", "prefix:1"), ("prefix",)):
        r = kvlab("run", "vllm", "-n", "100", "--rate", "8", "--replicas", "4", "--router", *router, "--json")
        assert r.exit_code == 0, r.stderr
        runs[router[0]] = json.loads(r.stdout)["strategies"][0]["fleet"]["decisions"]["per_replica"]
    assert runs["weighted"] == runs["prefix"] and max(runs["weighted"]) < 40, runs


def test_a_fleet_given_resolves_whole_configuration_names_its_engine():
    """trial 51, finding 17: docs/fleet.md's snippet passed resolve()'s KvlabConfig, and .run() failed deep inside
    ("'CostConfig' object has no attribute 'request_latency_s'"); it takes config.engine."""
    from kvlab.config import resolve
    from kvlab.errors import KvlabError
    from kvlab.workload import load_workload

    config = resolve(model="opt-13b", num_requests=20, rate=8, seed=0)
    wl = load_workload("paper-sharegpt", num_requests=20, rate=8, seed=0)
    with pytest.raises(KvlabError, match=r"^Fleet's config is a KvlabConfig \(resolve\(\)'s configuration: pass its "
                                         r"\.engine\); valid: a SimConfig"):
        Fleet(parse_strategy("vllm"), config, wl, "prefix", 8)
    assert Fleet(parse_strategy("vllm"), config.engine, wl, "prefix", 8).run().summary()["num_replicas"] == 8

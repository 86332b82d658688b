"""The gateway in front of the router (kvlab.fleet.admission): a token bucket and a bounded queue. Exact decisions
on tiny cases; on any input, every request ends finished, aborted or rejected, the bucket's bound holds, and no
engine loses a block."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.config import CacheConfig, SchedulerConfig, resolve
from kvlab.config.admission import AdmissionSpec
from kvlab.cost import CostModel
from kvlab.errors import KvlabError
from kvlab.fleet import Fleet
from kvlab.fleet.admission import QUEUE_FULL, RATE_LIMITED, admit
from kvlab.sim import SimConfig, Simulation
from kvlab.strategies import parse_strategy
from kvlab.workload import Workload
from kvlab.workload.request import Request

COST = CostModel(weights_bytes=8e6, kv_bytes_per_token=800.0, flops_per_token=1.0, attention_flops_per_pair=1.0,
                 memory_bandwidth=1e9, peak_flops=1e15, overhead_s=0.0)


def config(**numbers) -> SimConfig:
    numbers = dict(num_slots=128, block_size=4, max_model_len=64, max_num_seqs=8, max_num_batched_tokens=64) | numbers
    parts = {kind: {k: v for k, v in numbers.items() if k in {f.name for f in dataclasses.fields(kind)}}
             for kind in (CacheConfig, SchedulerConfig)}
    return SimConfig(CacheConfig(**parts[CacheConfig]), COST, SchedulerConfig(**parts[SchedulerConfig]))


def workload(*requests: Request) -> Workload:
    return Workload(name="test", requests=tuple(requests), description="made by the test", source="test")


def at(*times: float, timeouts: dict[int, float] | None = None) -> list[Request]:
    return [Request(i, t, 8, 4, timeout=(timeouts or {}).get(i)) for i, t in enumerate(times)]


def decided(gate) -> tuple[list[tuple[int, float]], dict[int, float], list[tuple[int, str, str | None]]]:
    return ([(r.request_id, r.arrival_time) for r in gate.admitted], gate.waits,
            [(r.request_id, r.status, r.reject_reason or r.finish_time) for r in gate.refused])


# Exact decisions ---------------------------------------------------------------------------------------------


def test_a_bucket_of_two_at_one_per_second_with_a_queue_of_two():
    """Five requests at t=0: two take the bucket's tokens, two wait for the next tokens (t=1, t=2), the fifth finds
    the queue full."""
    gate = admit(AdmissionSpec(rate=1.0, burst=2, max_queue=2), at(0, 0, 0, 0, 0))
    assert decided(gate) == ([(0, 0.0), (1, 0.0), (2, 1.0), (3, 2.0)], {2: 1.0, 3: 2.0},
                             [(4, "rejected", QUEUE_FULL)])
    summary = gate.summary()
    assert (summary["num_offered"], summary["num_admitted"], summary["num_queued"], summary["num_rejected"]) == \
        (5, 4, 2, 1)
    assert summary["rejected_share"] == 0.2
    assert summary["reject_reasons"] == {QUEUE_FULL: 1}


def test_without_a_queue_a_request_that_finds_no_token_is_rejected_at_once():
    gate = admit(AdmissionSpec(rate=1.0, burst=2, max_queue=0), at(0, 0, 0, 0.5, 1.5))
    # t=1.5: the bucket refilled 1.5 tokens since t=0 (one of them taken)
    assert decided(gate) == ([(0, 0.0), (1, 0.0), (4, 1.5)], {},
                             [(2, "rejected", RATE_LIMITED), (3, "rejected", RATE_LIMITED)])


def test_the_bucket_holds_at_most_burst_tokens():
    """Idle for 10 s, a bucket of 2 holds 2 tokens, not 10: the third of a burst waits for the next token."""
    gate = admit(AdmissionSpec(rate=1.0, burst=2, max_queue=5), at(0, 0, 10, 10, 10))
    assert decided(gate)[0] == [(0, 0.0), (1, 0.0), (2, 10.0), (3, 10.0), (4, 11.0)]


def test_a_client_whose_deadline_passes_in_the_queue_leaves_it():
    """Request 1 gives up at 0.5 s, before its token (t=1): aborted at the gateway, its place freed for request 3;
    request 2's deadline is shortened by its wait."""
    gate = admit(AdmissionSpec(rate=1.0, burst=1, max_queue=2), at(0, 0, 0, 0.7, timeouts={1: 0.5, 2: 3.0}))
    admitted, waits, refused = decided(gate)
    assert admitted == [(0, 0.0), (2, 1.0), (3, 2.0)]
    assert waits == {2: 1.0, 3: 1.3}
    assert refused == [(1, "aborted", 0.5)]
    assert [r.timeout for r in gate.admitted] == [None, 2.0, None]


@pytest.mark.parametrize("policy, order", [("fcfs", [1, 2, 3]), ("priority", [2, 1, 3])])
def test_the_queue_releases_in_arrival_order_or_by_priority(policy, order):
    """A bucket of one at 1 req/s, four requests at t=0 of priorities 1, 1, 0, 1: request 0 takes the token; the
    other three go at t=1, 2, 3, in arrival order, or the priority-0 request first."""
    requests = [Request(i, 0.0, 8, 4, priority=p) for i, p in enumerate((1, 1, 0, 1))]
    gate = admit(AdmissionSpec(rate=1.0, burst=1, max_queue=3, queue_policy=policy), requests)
    assert [(r.request_id, r.arrival_time) for r in gate.admitted] == [(0, 0.0)] + [
        (i, float(k)) for k, i in enumerate(order, start=1)]


def test_a_deadline_that_comes_with_the_token_has_left():
    gate = admit(AdmissionSpec(rate=1.0, burst=1, max_queue=1), at(0, 0, timeouts={1: 1.0}))
    assert decided(gate) == ([(0, 0.0)], {}, [(1, "aborted", 1.0)])


# Through the engine ------------------------------------------------------------------------------------------


def test_a_gateway_that_admits_everything_at_once_changes_nothing():
    requests = [Request(i, 0.01 * i, 8 + i % 5, 3 + i % 7) for i in range(40)]
    strategy = parse_strategy("vllm")
    plain = Fleet(strategy, config(), workload(*requests), "round-robin", 1).run()
    gated = Fleet(strategy, config(), workload(*requests), "round-robin", 1,
                  admission=AdmissionSpec(rate=1e6, burst=1000, max_queue=0)).run()
    assert gated.records == plain.records
    assert gated.as_result().summary()["admission"]["num_admitted"] == 40
    assert {k: v for k, v in gated.as_result().summary().items() if k != "admission"} == plain.as_result().summary()


def test_the_wait_at_the_gateway_is_in_the_clients_latency():
    """Three requests at t=0 through a bucket of one at 2 req/s: the engine receives them at 0, 0.5 and 1.0; the
    records keep t=0, so their TTFT counts the wait."""
    requests = at(0, 0, 0)
    spec = AdmissionSpec(rate=2.0, burst=1, max_queue=2)
    result = Fleet(parse_strategy("vllm"), config(), workload(*requests), "round-robin", 1, admission=spec).run()
    alone = Simulation(parse_strategy("vllm"), config(), workload(*admit(spec, requests).admitted)).run()
    assert [r.arrival_time for r in result.records] == [0.0, 0.0, 0.0]
    assert [r.first_scheduled_time for r in result.records] == [0.0, 0.5, 1.0]
    assert [r.first_token_time for r in result.records] == [r.first_token_time for r in alone.records]
    assert [r.ttft for r in result.records] == [r.first_token_time for r in alone.records]


# Any input ---------------------------------------------------------------------------------------------------


def random_requests(seed: int, num: int) -> list[Request]:
    rng = random.Random(seed)
    t, requests = 0.0, []
    for i in range(num):
        t += 0.0 if rng.random() < 0.2 else rng.expovariate(rng.choice((2.0, 40.0)))
        timeout = rng.choice((None, None, 0.05, 0.5, 3.0))
        prompt = rng.randrange(70, 90) if rng.random() < 0.03 else rng.randrange(2, 40)
        requests.append(Request(i, t, prompt, rng.randrange(1, 24), timeout=timeout, priority=rng.randrange(2)))
    return requests


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), num=st.integers(0, 120), rate=st.sampled_from([0.5, 3.0, 20.0]),
       burst=st.integers(1, 6), max_queue=st.integers(0, 8), policy=st.sampled_from(["fcfs", "priority"]))
def test_on_any_input_the_gateway_keeps_its_bounds_and_every_request_ends(seed, num, rate, burst, max_queue, policy):
    requests = random_requests(seed, num)
    spec = AdmissionSpec(rate, burst, max_queue, policy)
    gate = admit(spec, requests)
    by_id = {r.request_id: r for r in requests}
    # offered = admitted + rejected + aborted in the queue, each once
    ids = [r.request_id for r in gate.admitted] + [r.request_id for r in gate.refused]
    assert sorted(ids) == list(range(num))
    # admitted in time order, never before arriving, waits as said; the bucket: at most burst + rate·(t_j − t_i)
    times = [r.arrival_time for r in gate.admitted]
    assert times == sorted(times)
    for r in gate.admitted:
        assert r.arrival_time == pytest.approx(by_id[r.request_id].arrival_time + gate.waits.get(r.request_id, 0.0))
        assert gate.sent.get(r.request_id, r.arrival_time) == by_id[r.request_id].arrival_time
    for i in range(len(times)):
        for j in range(i, len(times)):
            assert j - i + 1 <= burst + rate * (times[j] - times[i]) + 1e-9
    # as each request arrives, the queue holds those before it that leave it later (admitted or gone): none when
    # it goes straight through, fewer than max_queue when it joins, max_queue when it is refused
    leaves = {r.request_id: r.arrival_time for r in gate.admitted} | {r.request_id: r.finish_time
                                                                      for r in gate.refused if r.status == "aborted"}
    for x in requests:
        waiting = sum(1 for y in requests[:x.request_id] if leaves.get(y.request_id, -1.0) > x.arrival_time)
        refused = next((r for r in gate.refused if r.request_id == x.request_id and r.status == "rejected"), None)
        if refused is not None:
            assert waiting == max_queue and refused.reject_reason == (QUEUE_FULL if max_queue else RATE_LIMITED)
        elif x.request_id in gate.sent:
            assert waiting < max_queue
        elif x.request_id in leaves and leaves[x.request_id] == x.arrival_time:
            assert waiting == 0
    # through the engine: every request finished, aborted or rejected; no block lost
    sim = Simulation(parse_strategy("vllm"), config(), workload(*gate.admitted))
    result = sim.run()
    allocator = sim.allocator
    assert allocator.num_free_blocks == allocator.num_blocks - 1, "a block lost"
    statuses = [r.status for r in result.records] + [r.status for r in gate.refused]
    assert len(statuses) == num and set(statuses) <= {"finished", "aborted", "rejected"}


# The configuration and bad input ---------------------------------------------------------------------------


def test_the_options_give_the_gateway_and_its_key():
    spec = resolve(rate_limit=2, rate_limit_burst=4, gateway_queue=8).admission
    assert spec == AdmissionSpec(2.0, 4, 8)
    assert resolve().admission is None
    assert resolve(rate_limit=2).admission == AdmissionSpec(2.0, 1, 0)
    assert resolve(rate_limit=2).key != resolve().key
    assert resolve(rate_limit=2, gateway_queue=4, gateway_queue_policy="priority").admission.queue_policy == "priority"
    assert resolve(rate_limit=2, gateway_queue_policy="fcfs").key == resolve(rate_limit=2).key


@pytest.mark.parametrize("options, message", [
    (dict(rate_limit=0), "--rate-limit 0 is out of range; valid: requests per second, a number > 0"),
    (dict(rate_limit=-1), "--rate-limit -1 is out of range"),
    (dict(rate_limit=1, rate_limit_burst=0), "--rate-limit-burst 0 is out of range; valid: requests, a whole number "
                                             "≥ 1"),
    (dict(rate_limit=1, gateway_queue=-1), "--gateway-queue -1 is out of range; valid: requests, a whole number "
                                           "≥ 0"),
    (dict(gateway_queue=3), "--gateway-queue needs --rate-limit"),
    (dict(rate_limit_burst=3), "--rate-limit-burst needs --rate-limit"),
    (dict(gateway_queue_policy="priority"), "--gateway-queue-policy needs --rate-limit"),
    (dict(rate_limit=1, gateway_queue_policy="lifo"), "--gateway-queue-policy 'lifo'"),
    (dict(rate_limit=1, gateway_queue_policy="priority"), "--gateway-queue-policy priority orders the gateway's "
     "queue, and --gateway-queue 0 gives it none"),
])
def test_bad_gateway_options_get_one_line(options, message):
    with pytest.raises(KvlabError, match=message.replace("(", r"\(")):
        resolve(**options)


@pytest.mark.parametrize("spec", [dict(rate=0.0), dict(rate=1.0, burst=0), dict(rate=1.0, max_queue=-1),
                                  dict(rate=1.0, burst=1.5), dict(rate=1.0, queue_policy="lifo")])
def test_the_spec_refuses_what_the_options_would(spec):
    with pytest.raises(KvlabError, match="valid:"):
        AdmissionSpec(**spec)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("router", ["round-robin", "least-requests", "prefix"])
def test_a_fleet_behind_a_gateway_accounts_for_every_request(seed, router):
    """Two replicas behind a gateway: every request offered has one record, finished, aborted or rejected, and the
    counters say the same (the gateway's rejections and queue-leavers with the engines')."""
    requests = random_requests(seed, 150)
    fleet = Fleet(parse_strategy("vllm"), config(), workload(*requests), router, 2,
                  admission=AdmissionSpec(rate=8.0, burst=3, max_queue=4)).run()
    records = fleet.records
    assert sorted(r.request_id for r in records) == list(range(150))
    assert [r.arrival_time for r in records] == sorted(r.arrival_time for r in requests)
    summary = fleet.summary()["fleet"]
    statuses = [r.status for r in records]
    assert (statuses.count("finished"), statuses.count("rejected"), statuses.count("aborted")) == \
        (summary["num_finished"], summary["num_rejected"], summary["num_aborted"])
    assert summary["num_finished"] + summary["num_rejected"] + summary["num_aborted"] == 150
    gateway = summary["admission"]
    assert gateway["num_admitted"] == sum(fleet.num_routed)
    assert gateway["num_admitted"] + gateway["num_rejected"] + gateway["num_aborted_in_queue"] == 150


def test_with_a_profiles_request_latency_the_records_keep_the_clients_times():
    """The gateway sees each request 50 ms after its client sent it (a profile's request latency); every record,
    admitted after a wait, rejected or not, keeps the client's time."""
    cfg = config()
    cfg = dataclasses.replace(cfg, cost=dataclasses.replace(cfg.cost, request_latency_s=0.05))
    requests = at(0, 0, 0, 0, 0)
    fleet = Fleet(parse_strategy("vllm"), cfg, workload(*requests), "round-robin", 1,
                  admission=AdmissionSpec(rate=1.0, burst=2, max_queue=2)).run()
    assert [(r.request_id, r.status, r.arrival_time) for r in fleet.records] == [
        (0, "finished", 0.0), (1, "finished", 0.0), (2, "finished", 0.0), (3, "finished", 0.0),
        (4, "rejected", 0.0)]
    assert [r.first_scheduled_time for r in fleet.records[:4]] == [0.05, 0.05, 1.05, 2.05]


@pytest.mark.parametrize("gateway", [["--rate-limit", "5"], ["--rate-limit", "50", "--rate-limit-burst", "100"]])
def test_a_sweep_behind_a_gateway_is_stored_with_its_rejections_by_reason(kvlab, tmp_path, gateway):
    """The gateway's rejections by reason (a dict inside the summary's gateway entry, empty when it rejects
    nothing) are one JSON column of the store: a sweep or capacity search with a gateway stores its points."""
    import json

    import duckdb

    r = kvlab("sweep", "--strategy", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "2,4",
              "-n", "100", *gateway, "--out", str(tmp_path))
    assert r.exit_code == 0, r.stderr
    db = duckdb.connect(str(tmp_path / "sweep.duckdb"), read_only=True)
    rows = db.execute("SELECT status, summary, admission_reject_reasons FROM points").fetchall()
    assert [status for status, _, _ in rows] == ["ok", "ok"]
    for _, summary, reasons in rows:
        assert json.loads(reasons) == json.loads(summary)["admission"]["reject_reasons"]

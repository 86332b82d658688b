"""Disaggregated prefill and decode (kvlab.disagg): a prefill replica keeps a request's blocks until its KV has
crossed the link, then frees them; the decode replica allocates blocks for the sent prompt at admission and computes
only its last token. Tiny pools at exact block ids; invariants on any input (no block lost or held twice, every
request ends finished or rejected); the run service and the command line; bad shapes refused in one line."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab import service
from kvlab.config import resolve
from kvlab.disagg.config import DisaggConfig
from kvlab.disagg.fleet import DisaggFleet
from kvlab.disagg.sides import PrefillSimulation, SendingAllocator, Transfer, decode_simulation
from kvlab.errors import KvlabError
from kvlab.fleet import parse_router
from kvlab.memory.base import Fit
from kvlab.sched.seq import Seq, SeqStatus
from kvlab.sim import Simulation
from kvlab.strategies import parse_strategy
from tests.test_fleet import config, req, workload

VLLM = parse_strategy("vllm")
# 1,000 bytes a block over 100 kB/s: 10 ms a block, no latency (an iteration of the tiny engine: 10 ms and a bit).
LINK = DisaggConfig(1, 1, block_bytes=1000, link="test", link_bandwidth_bytes_per_s=1e5)


def _prefill(*requests, num_slots=32, disagg=LINK) -> PrefillSimulation:
    """A prefill replica of 7 usable blocks of 4 tokens (block 0 is vLLM's null block), given the proxy's requests
    (max_tokens=1)."""
    sim = PrefillSimulation(VLLM, config(num_slots=num_slots, max_model_len=32), workload(), disagg, 0,
                            start_time=0.0)
    for request in requests:
        sim.add_request(replace(request, max_tokens=1))
    return sim


def _held(sim: PrefillSimulation) -> list:
    return [seq for _, _, seq, _ in sim.in_flight]


def test_the_prefill_side_holds_the_blocks_until_the_kv_has_left_then_frees_them():
    sim = _prefill(req(0, 0.0, 10, 5), req(1, 0.0, 14, 3), req(2, 0.0, 5, 2))
    allocator = sim.allocator
    assert isinstance(allocator, SendingAllocator)
    first = sim.step()  # A and B compute their prompts and sample their one token; C does not fit
    assert first is not None and first.new_req_ids == (0, 1)
    t1 = sim.now
    assert [sim.seqs[i].status for i in (0, 1)] == [SeqStatus.FINISHED, SeqStatus.FINISHED]
    # Finished, but their blocks stay: the KV is on the link.
    assert allocator.get_block_ids(0) == [1, 2, 3] and allocator.get_block_ids(1) == [4, 5, 6, 7]
    assert allocator.free_block_ids() == [] and allocator.num_held_blocks == 7
    assert sim.transfers == [Transfer(0, 0, t1, t1 + 0.03, 3, 3000), Transfer(1, 0, t1, t1 + 0.04, 4, 4000)]
    allocator.check_invariants(_held(sim))
    # Nothing running, C waiting for blocks on the link: the clock moves to A's transfer's end, its blocks are freed
    # (tail first) and C takes two of them.
    second = sim.step()
    assert second is not None and second.new_req_ids == (2,)
    assert sim.seqs[2].first_scheduled_time == t1 + 0.03
    assert allocator.get_block_ids(2) == [3, 2]
    assert 0 not in allocator._block_tables and allocator.get_block_ids(1) == [4, 5, 6, 7]
    assert allocator.free_block_ids() == [1]
    assert allocator.num_held_blocks == 4 + 2  # B's, still leaving, and C's, just finished
    allocator.check_invariants(_held(sim))
    assert sim.step() is None  # nothing left to serve
    sim.finish_transfers()
    assert allocator.num_held_blocks == 0 and allocator.num_free_blocks == 7
    # B's then C's, each tail first; their last blocks, partly filled and never cached, to the front (the pool's rule)
    assert allocator.free_block_ids() == [2, 7, 1, 6, 5, 4, 3]
    allocator.check_invariants([])


def test_a_request_without_its_token_frees_its_blocks_at_once():
    """Preempted or aborted before its token, a request on the prefill side sends nothing: freed as usual."""
    allocator = SendingAllocator(8, 4, True, max_model_len=32)
    seq = Seq(replace(req(0, 0.0, 10, 5), max_tokens=1))
    assert allocator.allocate_slots(seq, 10) is Fit.NOW and allocator.get_block_ids(0) == [1, 2, 3]
    allocator.free(seq)
    assert allocator.num_held_blocks == 0 and allocator.outbox == []
    assert allocator.free_block_ids() == [3, 4, 5, 6, 7, 2, 1]  # (its partly filled last block to the front)


def test_the_decode_side_finds_the_sent_prompt_and_computes_its_last_token():
    sim = decode_simulation(VLLM, config(num_slots=32, max_model_len=32), workload(req(0, 0.05, 10, 5)),
                            start_time=0.0)
    out = sim.step()
    assert out is not None and out.new_req_ids == (0,)
    assert out.num_scheduled_tokens == {0: 1} and out.num_prefill_tokens == 1  # 9 tokens came over the link
    assert sim.allocator.get_block_ids(0) == [1, 2, 3]  # blocks for the whole prompt, allocated at admission
    seq = sim.seqs[0]
    assert seq.num_computed_tokens == 10 and seq.num_output_tokens == 1  # its first token, sampled here
    assert sim.allocator.num_received_tokens == 9  # type: ignore[attr-defined]
    assert sim.allocator.free_block_ids() == [4, 5, 6, 7]
    sim.run()
    assert seq.status is SeqStatus.FINISHED and seq.num_output_tokens == 5
    assert sim.allocator.num_free_blocks == 7


def test_the_decode_side_takes_its_own_prefix_hit_first_and_the_rest_from_the_link():
    shared = (7,)  # the first 8 tokens (prefix_chunk_len 8): blocks 1 and 2 of the first request
    sim = decode_simulation(VLLM, config(num_slots=32, max_model_len=32),
                            workload(req(0, 0.0, 10, 5, shared), req(1, 0.5, 12, 3, shared)), start_time=0.0)
    sim.run_until(0.5)  # the first has finished: its blocks are free, 1 and 2 still cached
    assert sim.allocator.free_block_ids() == [4, 5, 6, 7, 3, 2, 1]
    out = sim.step()
    assert out is not None and out.num_scheduled_tokens == {1: 1}
    assert sim.allocator.get_block_ids(1) == [1, 2, 4]  # its hit, then the free queue's front
    assert sim.allocator.num_local_hit_tokens == 8  # type: ignore[attr-defined]
    assert sim.allocator.num_received_tokens == 9 + 3  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_decode_sides_runs_are_its_steps(seed):
    """The decode replica's runs of many iterations give the records, counters and memory of stepping it."""
    arrivals = _random_workload(seed, 40)
    results, num_runs = [], 0
    for max_iterations in (1, 1 << 16):
        sim = decode_simulation(VLLM, config(num_slots=96), arrivals, start_time=0.0, max_iterations=max_iterations)
        while (out := sim.step()) is not None:
            num_runs += out.num_iterations > 1
        results.append(sim.result())
        assert sim.allocator.num_free_blocks == 23
    assert num_runs > 0  # (runs of many iterations did happen)
    stepped, ran = results
    assert stepped.records == ran.records and stepped.counters == ran.counters
    assert stepped.integral == pytest.approx(ran.integral)


def test_ttft_is_the_prefill_the_transfer_and_the_decode_sides_first_iteration():
    result = DisaggFleet(VLLM, config(num_slots=32, max_model_len=32), workload(req(0, 0.0, 10, 5)),
                         parse_router("round-robin"), LINK).run()
    [transfer] = result.transfers
    [p] = result.prefill[0].records
    [d] = result.decode[0].records
    [client] = result.records
    assert transfer.start == p.first_token_time == p.finish_time
    assert transfer.end == pytest.approx(p.finish_time + 0.03)  # 3 blocks of 1,000 bytes at 100 kB/s
    assert d.arrival_time == transfer.end and d.first_scheduled_time == transfer.end  # an idle decode replica
    assert (client.arrival_time, client.first_scheduled_time) == (0.0, 0.0)
    assert (client.first_token_time, client.finish_time) == (d.first_token_time, d.finish_time)
    assert client.num_output_tokens == 5 and client.status == "finished"
    parts = result.disaggregation()["ttft_parts_s"]
    assert parts["outside_engine"] == 0.0  # (a zero-latency clock; tests/test_fix62b.py: under vllm-h100)
    assert sum(parts.values()) == pytest.approx(client.first_token_time)
    summary = result.summary()
    assert summary["num_finished"] == 1 and summary["disaggregation"]["transfer_bytes"] == 3000


# -- invariants on any input -----------------------------------------------------------------------------


def _checked_steps(monkeypatch) -> list[str]:
    """After every step of either side: no block lost or held twice (the allocator's invariants over the running
    requests and, on the prefill side, those whose KV is leaving)."""
    sides: list[str] = []
    prefill_step, plain_step = PrefillSimulation.step, Simulation.step

    def checked_prefill(self):
        out = prefill_step(self)
        self.allocator.check_invariants([*self.scheduler.running, *_held(self)])
        sides.append("prefill")
        return out

    def checked(self):
        out = plain_step(self)
        if not isinstance(self, PrefillSimulation):
            self.scheduler.sync()
            self.allocator.check_invariants(list(self.scheduler.running))
            sides.append("decode")
        return out

    monkeypatch.setattr(PrefillSimulation, "step", checked_prefill)
    monkeypatch.setattr(Simulation, "step", checked)
    return sides


def _random_workload(seed: int, num: int):
    rng = random.Random(seed)
    t, requests = 0.0, []
    for i in range(num):
        t += 0.0 if rng.random() < 0.2 else rng.expovariate(80.0)
        prefix = (rng.randrange(3),) if rng.random() < 0.5 else ()
        prompt = rng.randrange(70, 90) if rng.random() < 0.05 else rng.randrange(2, 40)
        requests.append(req(i, t, prompt, rng.randrange(1, 24), prefix))
    return workload(*requests)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), num_prefill=st.integers(1, 3), num_decode=st.integers(1, 3),
       num_blocks=st.integers(12, 40), bandwidth=st.sampled_from([1e4, 1e5, 1e9]),
       latency=st.sampled_from([0.0, 0.005]), router=st.sampled_from(["round-robin", "least-requests", "least-kv"]))
def test_no_block_is_lost_or_held_twice_and_every_request_ends(monkeypatch, seed, num_prefill, num_decode,
                                                                num_blocks, bandwidth, latency, router):
    wl = _random_workload(seed, 40)
    disagg = DisaggConfig(num_prefill, num_decode, 1000, "test", bandwidth, latency)
    with monkeypatch.context() as patch:
        sides = _checked_steps(patch)
        result = DisaggFleet(VLLM, config(num_slots=num_blocks * 4), wl, parse_router(router), disagg).run()
    assert "prefill" in sides
    records = result.records
    assert sorted(r.request_id for r in records) == list(range(40))  # one record each
    assert {r.status for r in records} <= {"finished", "rejected", "aborted"}
    sent = {t.request_id for t in result.transfers}
    assert len(sent) == len(result.transfers)  # each request's KV leaves once
    assert sent == {r.request_id for p in result.prefill for r in p.records if r.status == "finished"}
    for side in (result.prefill, result.decode):
        for replica in side:
            assert replica.counters.num_finished + replica.counters.num_rejected == len(replica.records)
    for r in records:
        if r.status == "finished":
            assert r.request_id in sent and r.arrival_time <= r.first_scheduled_time <= r.first_token_time
            assert r.first_token_time <= r.finish_time
    for t in result.transfers:
        assert t.end == pytest.approx(t.start + latency + t.num_bytes / bandwidth)


def test_every_block_is_free_once_the_fleet_has_served_everything():
    wl = _random_workload(3, 60)
    fleet = DisaggFleet(VLLM, config(num_slots=64), wl, parse_router("least-requests"),
                        DisaggConfig(2, 1, 1000, "test", 1e5, 0.001))
    result = fleet.run()
    assert result.summary()["num_finished"] + result.summary()["num_rejected"] == 60
    assert sum(received for received, _ in result.num_received_tokens) > 0


# -- the run service, the command line, bad input ----------------------------------------------------------


def test_the_run_service_runs_a_disaggregated_fleet_and_its_options_round_trip():
    options = dict(model="llama-3.1-8b", gpu="h100-sxm", prefill_replicas=1, decode_replicas=2, num_requests=40,
                   rate=8.0, kv_transfer_latency=0.002)
    config_ = resolve(**options)
    assert config_.disagg is not None and config_.disagg.name == "1P2D"
    assert config_.disagg.link == "NVLink 4" and config_.disagg.link_bandwidth_bytes_per_s == 450e9
    assert config_.disagg.block_bytes == config_.cache.kv_bytes_per_token * config_.cache.block_size
    assert config_.num_gpus == 3 and resolve(config_.options()) == config_
    assert resolve(model="llama-3.1-8b").key == resolve(model="llama-3.1-8b", prefill_replicas=None).key
    run = service.run(config_, ["vllm"])
    summary = run.results[0].summary()
    assert summary["num_finished"] == 40
    d = run.disaggregated[0].disaggregation()
    assert (d["shape"], d["num_transfers"], d["link_latency_s"]) == ("1P2D", 40, 0.002)
    assert [r["num_routed"] for r in d["decode_replicas"]] == [20, 20]  # round-robin


@pytest.mark.parametrize(("options", "line"), [
    ({"prefill_replicas": 0, "decode_replicas": 1}, "--prefill-replicas 0 is out of range; valid: prefill replicas, "
                                                    "a whole number from 1 to 4,096"),
    ({"prefill_replicas": 2, "decode_replicas": 0}, "--decode-replicas 0 is out of range; valid: decode replicas, a "
                                                    "whole number from 1"),
    ({"prefill_replicas": 2}, "--prefill-replicas 2 without --decode-replicas: a disaggregated fleet (xPyD) needs"),
    ({"decode_replicas": 1}, "--decode-replicas 1 without --prefill-replicas"),
    ({"prefill_replicas": 1, "decode_replicas": 1, "replicas": 2}, "--replicas 2 with --prefill-replicas"),
    ({"kv_transfer_bandwidth": 50.0}, "--kv-transfer-bandwidth 50 needs a disaggregated fleet"),
])
def test_a_fleet_without_a_prefill_or_a_decode_replica_is_refused_in_one_line(options, line):
    with pytest.raises(KvlabError) as refused:
        resolve(**options)
    assert line in str(refused.value)


def test_a_strategy_the_fleet_cannot_model_is_refused(kvlab):
    r = kvlab("run", "continuous+paged", "-n", "5", "--prefill-replicas", "1", "--decode-replicas", "1")
    assert r.exit_code == 2
    assert "a disaggregated fleet needs paged memory with prefix caching" in " ".join(r.stderr.split())


def test_a_gateway_in_front_of_the_fleet_is_refused(kvlab):
    r = kvlab("run", "vllm", "-n", "5", "--prefill-replicas", "1", "--decode-replicas", "1", "--rate-limit", "3")
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == ["error: a gateway (--rate-limit) in front of a disaggregated fleet is "
                                             "not modelled; valid: drop --rate-limit, or give it to an aggregated "
                                             "fleet (no --prefill-replicas / --decode-replicas)"]


def test_kvlab_run_prints_the_link_and_ttfts_parts_and_refuses_a_fleet_with_no_decode_replica(kvlab, tmp_path):
    r = kvlab("run", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "-n", "30", "--prefill-replicas", "1",
              "--decode-replicas", "1", "--kv-transfer-bandwidth", "50")
    assert r.exit_code == 0, r.stderr
    out = " ".join(r.stdout.split())
    # (trial 51, finding 13: it read "1P1D (1 prefill, 1 decode replicas), KV over given at 50 GB/s")
    assert ("vllm: 1P1D (1 prefill replica, 1 decode replica), KV over the given link (--kv-transfer-bandwidth) at "
            "50 GB/s after 0 ms: 30 transfers") in out
    assert "Mean TTFT = prefill" in out
    as_json = kvlab("run", "vllm", "-n", "10", "--prefill-replicas", "1", "--decode-replicas", "1", "--json").json()
    assert as_json["strategies"][0]["disaggregation"]["num_transfers"] == 10
    out = tmp_path / "out"
    files = kvlab("run", "vllm", "-n", "10", "--prefill-replicas", "1", "--decode-replicas", "1", "--out", out)
    assert files.exit_code == 0, files.stderr
    assert (out / "prefill0" / "vllm_iterations.csv").exists() and (out / "decode0" / "vllm_requests.csv").exists()
    bad = kvlab("run", "vllm", "-n", "5", "--prefill-replicas", "1", "--decode-replicas", "0")
    assert bad.exit_code == 2
    assert bad.stderr.strip().splitlines() == ["error: --decode-replicas 0 is out of range; valid: decode replicas, "
                                               "a whole number from 1 to 4,096"]
    negative = kvlab("run", "vllm", "-n", "5", "--prefill-replicas", "-1", "--decode-replicas", "1")
    assert negative.stderr.strip().splitlines() == ["error: --prefill-replicas -1 is out of range; valid: prefill "
                                                    "replicas, a whole number from 1 to 4,096"]


# -- overload: a disaggregated fleet judged as an aggregated one is (kvlab.window, trial 46) ------------------

ROOFLINE_1P1D = dict(prefill_replicas=1, decode_replicas=1, cost="roofline")


def test_a_fleet_whose_decode_side_falls_behind_is_overloaded_as_an_engine_is():
    """opt-13b on A100-40GB serves about 2.6 req/s as one engine and as 1P1D (the decode replica runs every answer):
    at 13.5 req/s the prefill replica keeps up and the decode replica's queue grows. Before trial 46 only the
    prefill queue was judged: "stable" at 13.5 req/s, and capacity answered 32 req/s on 100 requests."""
    over = service.run(resolve(**ROOFLINE_1P1D, rate=13.5, num_requests=200), ["vllm"])
    (w,) = over.windows()
    assert w.state == "overloaded" and w.served_share < 0.5 and over.overloaded_rps() == w.offered_rps
    assert w.decided_by.startswith("oldest wait grew: served ") and "decode queue" in w.decided_by
    assert w.queue_second_half < 1 and w.decode_queue_first_half + 10 < w.decode_queue_second_half  # (the decode side)
    alone = service.run(resolve(cost="roofline", rate=13.5, num_requests=200), ["vllm"])
    assert alone.windows()[0].state == "overloaded"
    light = service.run(resolve(**ROOFLINE_1P1D, rate=1.0, num_requests=100), ["vllm"])
    assert light.windows()[0].state == "stable" and light.overloaded_rps() is None


def test_kvlab_run_says_a_disaggregated_fleet_is_overloaded_as_it_says_of_replicas(kvlab):
    for shape in (["--prefill-replicas", "1", "--decode-replicas", "1"], ["--replicas", "2"]):
        r = kvlab("run", "vllm", *shape, "--rate", "20", "-n", "200", "--cost", "roofline")
        assert r.exit_code == 0, r.stderr
        text = " ".join(r.stdout.split())
        assert "vllm is overloaded at the offered rate" in text and "this race" not in text, shape


def test_capacity_of_1p1d_is_what_its_decode_replica_serves(kvlab, tmp_path):
    r = kvlab("capacity", "--prefill-replicas", "1", "--decode-replicas", "1", "--strategy", "vllm", "--slo",
              "p99_ttft<100s", "--cost", "roofline", "-n", "100", "--workers", "1", "--out", tmp_path, "--json")
    assert r.exit_code == 0, r.stderr
    (answer,) = r.json()["capacities"]
    assert 2.0 < answer["capacity_rps"] < 3.5  # (2.62 on 100 and 200 requests; 32 before trial 46)


def test_the_comparison_judges_1p1d_overloaded_where_it_falls_behind(kvlab, tmp_path):
    """At 4.5 req/s two replicas hold; one replica and 1P1D (one decode replica) fall behind: "aggregated" (before
    trial 46, "either": 1P1D held)."""
    r = kvlab("capacity", "--replicas", "auto", "--prefill-replicas", "auto", "--rate", "4.5", "--strategy", "vllm",
              "--slo", "p99_ttft<100s", "--cost", "roofline", "-n", "100", "--workers", "1", "--out", tmp_path,
              "--json")
    assert r.exit_code == 0, r.stderr
    answer = r.json()
    assert [(row["shape"], row["held"]) for row in answer["tried"]] == [
        ("1 replica", False), ("2 replicas", True), ("1P1D", False)]
    assert answer["tried"][2]["reason"].startswith("overloaded: oldest wait grew: served ")
    assert "decode queue" in answer["tried"][2]["reason"] and answer["answer"] == "aggregated"


# -- capacity: aggregated against disaggregated on the same GPUs ---------------------------------------------


def test_the_shapes_of_n_replicas_are_the_aggregated_fleet_then_each_xpyd():
    from kvlab.service.disagg import shapes

    assert shapes(1) == [(0, 1)]
    assert shapes(3) == [(0, 3), (1, 2), (2, 1)]


@pytest.mark.parametrize(("holds", "tried", "answer"), [
    # aggregated from 3 replicas, 1P2D from 3: both at 3 GPUs; every shape of a count is judged at once
    ({(0, 3), (1, 2), (2, 1)}, ["1 replica", "2 replicas", "1P1D", "3 replicas", "1P2D", "2P1D"], "either"),
    ({(1, 1)}, ["1 replica", "2 replicas", "1P1D"], "disaggregated"),
    ({(0, 2)}, ["1 replica", "2 replicas", "1P1D"], "aggregated"),
    (set(), ["1 replica", "2 replicas", "1P1D"], "neither"),
])
def test_the_comparison_stops_at_the_first_count_at_which_either_holds(holds, tried, answer):
    from kvlab.service.disagg import DisaggComparison, shape_name

    comparison = DisaggComparison(2.0, "p99_tpot<20ms", 1, max_replicas=2 if not holds else 3)
    while fleets := comparison.next_fleets():
        for prefill, decode in fleets:
            comparison.record({"shape": shape_name(prefill, decode), "prefill_replicas": prefill,
                               "decode_replicas": decode, "held": (prefill, decode) in holds})
    assert [row["shape"] for row in comparison.tried] == tried
    assert comparison.answer == answer
    assert comparison.disaggregated == (None if answer in ("aggregated", "neither") else min(holds - {(0, 3)}))


def test_capacity_says_which_fleet_holds_with_fewer_gpus(kvlab, tmp_path):
    """At 8 req/s of the Azure conversations on H100s, a TPOT bound is met by 1P1D and by no aggregated fleet of
    2 GPUs (prefills share their iterations), on both samples (the second the whole trace); the rows say why each
    failed; every fleet is stored, so the same question asked again simulates nothing. (Under vllm-h100 with no
    per-prefill-token cost, p99 TPOT 13.4-13.8 ms on 1 replica, 9.5-9.7 on 2, 8.6 on 1P1D on 200 and 400 requests;
    at 2 req/s one replica held 20 ms, at 9.0.)"""
    args = ["capacity", "--replicas", "auto", "--prefill-replicas", "auto", "--model", "llama-3.1-8b", "--gpu",
            "h100-sxm", "--workload", "azure-conv", "--rate", "8", "-n", "200", "--slo", "p99_tpot<9ms",
            "--out", str(tmp_path)]
    r = kvlab(*args, "--json")
    assert r.exit_code == 0, r.stderr
    answer = r.json()
    assert [(row["shape"], row["gpus"], row["held"]) for row in answer["tried"]] == [
        ("1 replica", 1, False), ("2 replicas", 2, False), ("1P1D", 2, True)]
    assert answer["sample_lengths"] == [200, 19_366]  # (the second sample: the whole trace)
    assert [[s["num_requests"] for s in row["samples"]] for row in answer["tried"]] == [[200, 19_366]] * 3
    assert all(s["held"] for s in answer["tried"][2]["samples"])
    assert answer["tried"][1]["reason"].startswith("missed p99_tpot<9ms")
    assert (answer["answer"], answer["aggregated_replicas"]) == ("disaggregated", None)
    text = kvlab(*args)
    words = " ".join(text.stdout.split())
    assert "disaggregated holds with fewer GPUs" in words
    assert "two samples (200 and 19,366 requests)" in words
    assert "Computed 0 simulations now, 6 were stored already" in words
    bad = kvlab(*args[:5], "--decode-replicas", "2", "--rate", "2")
    assert bad.exit_code == 2 and "give no --decode-replicas values" in bad.stderr


@pytest.mark.parametrize("flags", [["--prefill-replicas", "auto"], ["--decode-replicas", "auto"],
                                   ["--replicas", "auto", "--decode-replicas", "auto"]])
def test_auto_prefill_or_decode_replicas_outside_the_comparison_is_one_line(kvlab, flags):
    r = kvlab("capacity", *flags, "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--rate", "2", "-n", "100")
    assert r.exit_code == 2
    assert "valid only as --replicas auto --prefill-replicas auto --rate R" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("flags", "message"), [
    (["--timeout", "10", "--slo", "abandoned<5%"], "with client time-outs (--timeout) is not modelled"),
    # (trial 51, finding 13: the one given, by name; it read "with --kv-offloading-size or --speculative-method ...")
    (["--kv-offloading-size", "8"], "with --kv-offloading-size is not modelled; valid: drop --kv-offloading-size"),
    (["--speculative-method", "ngram", "--spec-acceptance", "0.5"], "with --speculative-method is not modelled; valid: "
     "drop --speculative-method"),
    (["--rate-limit", "5"], "a gateway (--rate-limit) in front of a disaggregated fleet is not modelled"),
])
def test_the_comparison_refuses_what_a_disaggregated_fleet_does_not_model_before_any_run(kvlab, tmp_path, flags,
                                                                                          message):
    r = kvlab("capacity", "--replicas", "auto", "--prefill-replicas", "auto", "--model", "llama-3.1-8b", "--gpu",
              "h100-sxm", "--workload", "azure-conv", "--rate", "4", "-n", "300", *flags, "--out", str(tmp_path))
    assert r.exit_code == 2 and message in r.stderr
    assert "points:" not in r.stderr  # (no fleet simulated)


def test_an_answer_at_one_replica_says_no_disaggregated_fleet_was_tried():
    from kvlab.report.disagg import answer_line
    from kvlab.service.disagg import DisaggComparison

    comparison = DisaggComparison(2.0, "p99_ttft<2s", 1, 8)
    comparison.record({"shape": "1 replica", "prefill_replicas": 0, "decode_replicas": 1, "held": True})
    assert answer_line(comparison) == ("1 aggregated replica (1 GPU) held; no disaggregated fleet was tried (one "
                                       "takes 2 replicas or more): aggregated holds with fewer GPUs.")


def test_the_comparisons_latency_columns_say_what_they_are_over(capsys):
    """trial 46: the table's TTFT (and TPOT) column did not say which requests its p99 is over: the first sample's
    whole run, warm-up included, while a fleet is judged on each sample's measured window."""
    from kvlab.report.disagg import print_comparison
    from kvlab.service.disagg import DisaggComparison

    comparison = DisaggComparison(2.0, "p99_ttft<2s", 1, 8)
    comparison.sample_lengths = [300, 600]
    comparison.record({"shape": "1 replica", "prefill_replicas": 0, "decode_replicas": 1, "gpus": 1, "held": True,
                       "reason": "", "ttft_p99_s": 0.0346, "tpot_p99_s": 0.0074})
    print_comparison(comparison)
    out = " ".join(capsys.readouterr().out.split())
    assert "TTFT p99 ms (run)" in out and "TPOT p99 ms (run)" in out and "34.6" in out
    assert ("(run): the p99 over every request the first sample's run (300 requests) finished, its warm-up included; "
            "whether a fleet held is judged on each sample's measured window instead (the requests after a 20% "
            "warm-up, up to the last arrival)") in out


def test_a_disaggregated_fleets_capacity_is_priced_on_all_its_gpus():
    """trial 46 (seen while checking the progress fix): kvlab capacity --prefill-replicas 1 --decode-replicas 1 on an
    H100 priced the answer as '$3.24 an hour on 1 GPU' beside 'Setup: ... on 2x H100-SXM': a fleet's GPUs are both
    sides' (KvlabConfig.num_gpus), not one replica's."""
    from kvlab.config import resolve
    from kvlab.service.capacity import Answer

    config = resolve(model="llama-3.1-8b", gpu="h100-sxm", prefill_replicas=1, decode_replicas=2, num_requests=20)
    answer = Answer([{}], [], [], [], None, False)
    answer.add_costs([config], 2.0)
    assert answer.num_gpus == [3] == [config.num_gpus]


def test_a_router_with_one_replica_a_side_is_refused_as_with_one_replica(kvlab):
    """trial 51, finding 22: --router least-kv with --prefill-replicas 1 --decode-replicas 1 ran, while one aggregated
    replica with it is refused ("needs a fleet"): with one replica a side the router routes nothing either."""
    r = kvlab("run", "vllm", "-n", "20", "--prefill-replicas", "1", "--decode-replicas", "1", "--router", "least-kv")
    assert r.exit_code == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [
        "error: --router least-kv needs a choice of replicas, and 1 prefill and 1 decode replica leave none (each side "
        "routes to its one); valid: --prefill-replicas or --decode-replicas 2 or more, or drop --router"]
    assert kvlab("run", "vllm", "-n", "20", "--prefill-replicas", "1", "--decode-replicas", "2", "--router",
                 "least-kv").exit_code == 0


def test_a_disaggregated_race_of_the_default_strategies_asks_for_named_ones(kvlab):
    """trial 51, finding 13: `kvlab race --prefill-replicas 1 --decode-replicas 1` was refused as "strategy
    'static+max' has not: valid: vllm, vllm+prefix", though the user named no strategy."""
    r = kvlab("race", "-n", "10", "--prefill-replicas", "1", "--decode-replicas", "1")
    assert r.exit_code == 2 and "Traceback" not in r.stderr, r.stderr
    line = " ".join(r.stderr.split())
    assert line.startswith("error: a disaggregated race needs strategies with paged memory and prefix caching, which "
                           "the default ones (")
    assert line.endswith("do not all have; valid: name them, e.g. kvlab race vllm vllm+prefix --prefill-replicas ... "
                         "--decode-replicas ...")


def test_a_transfer_bandwidth_no_link_has_is_refused_with_the_valid_range(kvlab):
    """Trial 56: --kv-transfer-bandwidth 1e-9 ran (TTFT p50 98,304,000 s)."""
    r = kvlab("run", "vllm", "-n", "5", "--prefill-replicas", "1", "--decode-replicas", "1",
              "--kv-transfer-bandwidth", "1e-9")
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [
        "error: --kv-transfer-bandwidth 1e-09 is out of range; valid: GB/s, a number ≥ 0.01 and ≤ 1,000,000"]

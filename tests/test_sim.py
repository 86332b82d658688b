"""The scheduler and the event loop: exact decisions on tiny pools, invariants on any input, runs = steps."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.config import CacheConfig, SchedulerConfig
from kvlab.cost import CostModel
from kvlab.memory.base import slot_usage
from kvlab.sim import SimConfig, Simulation
from kvlab.strategies import LESSON_RACE, PAPER_SYSTEMS, parse_strategy
from kvlab.workload import Workload
from kvlab.workload.request import Request

# 10 ms of weights per iteration plus 1 µs per context token: simple numbers, memory-bound.
COST = CostModel(
    weights_bytes=8e6,
    kv_bytes_per_token=800.0,
    flops_per_token=1.0,
    attention_flops_per_pair=1.0,
    memory_bandwidth=1e9,
    peak_flops=1e15,
    overhead_s=0.0,
)


def workload(*specs: tuple) -> Workload:
    """Requests from (arrival, prompt, output[, prefix group]): a group >= 0 shares a prefix of up to two
    8-token chunks with the other requests of its group."""
    requests = []
    for i, (t, p, o, *group) in enumerate(specs):
        prefix = (group[0], 100 + group[0] % 2) if group and group[0] >= 0 else ()
        requests.append(Request(i, t, p, o, prefix_hashes=prefix, prefix_chunk_len=8))
    return Workload(name="test", requests=tuple(requests), description="made by the test", source="test")


def config(cost: CostModel = COST, **numbers) -> SimConfig:
    """A config from plain numbers, each given to the sub-config that owns it."""
    numbers = dict(num_slots=32, block_size=4, max_model_len=32, max_num_seqs=8, max_num_batched_tokens=16) | numbers
    parts = {kind: {k: v for k, v in numbers.items() if k in {f.name for f in dataclasses.fields(kind)}}
             for kind in (CacheConfig, SchedulerConfig)}
    assert set(numbers) == set(parts[CacheConfig]) | set(parts[SchedulerConfig]), numbers
    return SimConfig(CacheConfig(**parts[CacheConfig]), cost, SchedulerConfig(**parts[SchedulerConfig]))


def trace(sim: Simulation) -> list[tuple[dict[int, int], tuple[int, ...]]]:
    steps = []
    while (out := sim.step()) is not None:
        steps.append((dict(out.num_scheduled_tokens), out.preempted_req_ids))
    return steps


def test_continuous_paged_preempts_the_newest_and_recomputes_it():
    # 8 blocks of 4 slots, block 0 the null block: 7 usable. Three requests of 6 + 6 tokens arrive together.
    sim = Simulation(parse_strategy("vllm+noprefix"), config(), workload((0, 6, 6), (0, 6, 6), (0, 6, 6)), max_iterations=1)
    steps = trace(sim)
    assert steps == [
        ({0: 6, 1: 6, 2: 4}, ()),  # C gets the last 4 tokens of the budget: a prefill chunk
        ({0: 1, 1: 1, 2: 2}, ()),
        ({0: 1, 1: 1, 2: 1}, ()),
        ({0: 1, 1: 1}, (2,)),  # B needs a 3rd block and none is free: the newest (C) is evicted
        ({0: 1, 1: 1}, ()),  # C waits: its 8 tokens need 2 blocks, 1 is free
        ({0: 1, 1: 1}, ()),  # A and B finish
        ({2: 8}, ()),  # C recomputes its prompt and its 2 generated tokens
        ({2: 1}, ()),
        ({2: 1}, ()),
        ({2: 1}, ()),
    ]
    result = sim.result()
    assert result.counters.num_preemptions == 1
    # C had computed 7 tokens (its prompt and its first output) when evicted; step 7 computes them again,
    # plus its second output token, which had been sampled but never computed.
    assert result.counters.num_recomputed_tokens == 7
    assert [r.num_output_tokens for r in sorted(result.records, key=lambda r: r.request_id)] == [6, 6, 6]


def test_block_ids_follow_vllm_free_queue_order():
    sim = Simulation(parse_strategy("vllm+noprefix"), config(), workload((0, 6, 6), (0, 6, 6), (0, 6, 6)), max_iterations=1)
    sim.step()
    assert [sim.allocator.get_block_ids(i) for i in range(3)] == [[1, 2], [3, 4], [5]]
    for _ in range(3):
        sim.step()
    assert sim.allocator.get_block_ids(0) == [1, 2, 7]
    assert sim.allocator.get_block_ids(1) == [3, 4, 6]  # C's blocks came back tail first: 6, then 5
    assert sim.allocator.free_block_ids() == [5]
    for _ in range(2):
        sim.step()
    # A and B finished; their blocks went back tail first to the front of the queue (vLLM reuses uncached
    # blocks LIFO): [6, 4, 3, 7, 2, 1, 5].
    assert sim.allocator.free_block_ids() == [6, 4, 3, 7, 2, 1, 5]
    sim.step()
    assert sim.allocator.get_block_ids(2) == [6, 4]


def test_static_batch_runs_until_its_slowest_member_finishes():
    # Two 16-slot slabs fit in 32 slots; C has to wait for a whole batch under static batching.
    cfg = config(max_model_len=16, block_size=4)
    reqs = workload((0, 4, 2), (0, 4, 8), (0, 4, 2))
    static = trace(Simulation(parse_strategy("static+max"), cfg, reqs, max_iterations=1))
    continuous = trace(Simulation(parse_strategy("continuous+max"), cfg, reqs, max_iterations=1))
    assert static[0] == ({0: 4, 1: 4}, ())
    assert len(static) == 10 and static[8] == ({2: 4}, ())  # C starts only after B's 8th token
    assert len(continuous) == 8 and continuous[2] == ({1: 1, 2: 4}, ())  # C takes A's seat at once


def test_requests_that_can_never_fit_are_rejected_with_a_reason():
    cfg = config(num_slots=32, max_model_len=64, block_size=4)
    sim = Simulation(parse_strategy("vllm+noprefix"), cfg, workload((0, 64, 1), (0, 40, 1), (0, 4, 2)))
    result = sim.run()
    reasons = {r.request_id: r.reject_reason for r in result.records}
    assert reasons == {0: "prompt longer than max_model_len", 1: "larger than the whole KV cache", 2: None}
    assert result.counters.num_rejected == 2 and result.counters.num_finished == 1


def test_output_is_cut_at_max_model_len_as_vllm_stops_it():
    sim = Simulation(parse_strategy("vllm+noprefix"), config(max_model_len=16), workload((0, 10, 50)))
    result = sim.run()
    assert result.records[0].num_output_tokens == 6


def test_swap_preemption_moves_bytes_and_recomputes_nothing():
    cfg = config(kv_bytes_per_token=100, swap_space_bytes=10**6)
    sim = Simulation(parse_strategy("vllm+swap"), cfg, workload((0, 6, 6), (0, 6, 6), (0, 6, 6)))
    result = sim.run()
    assert result.counters.num_preemptions == 1
    assert result.counters.num_recomputed_tokens == 0
    # C held 7 computed tokens when evicted: out and back in.
    assert result.counters.num_swapped_bytes == 2 * 7 * 100
    assert result.counters.num_finished == 3


def test_swap_without_swap_space_is_refused():
    with pytest.raises(Exception, match="swap space"):
        Simulation(parse_strategy("vllm+swap"), config(swap_space_bytes=0), workload((0, 4, 4)))


# -- invariants on any input -----------------------------------------------------------------------------

request_specs = st.lists(
    st.tuples(st.floats(0, 0.5), st.integers(1, 40), st.integers(1, 40), st.integers(-1, 2)), min_size=1, max_size=25
)
STRATEGY_NAMES = sorted(set(LESSON_RACE) | set(PAPER_SYSTEMS) | {"vllm+prefix", "vllm+swap", "static+pow2"})


def check_invariants(sim: Simulation) -> None:
    sched = sim.scheduler
    sched.sync()
    usage = slot_usage(sim.allocator, sched.num_resident_computed_tokens)
    assert usage.num_slots == sim.allocator.num_slots
    assert min(usage.token, usage.reserved, usage.internal_fragmentation, usage.overhead, usage.free) >= 0
    assert sched.num_resident_computed_tokens == sum(s.num_computed_tokens for s in sched.running)
    assert len(sched.running) <= sim.config.scheduler.max_num_seqs
    sim.allocator.check_invariants(list(sched.running), in_running_order=True, all_decoding=sched.is_decoding)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=request_specs,
    name=st.sampled_from(STRATEGY_NAMES),
    num_blocks=st.integers(12, 40),
    budget=st.sampled_from([8, 16, 64]),
    max_num_seqs=st.integers(1, 8),
)
def test_every_request_finishes_and_memory_states_sum_to_capacity(specs, name, num_blocks, budget, max_num_seqs):
    cfg = config(
        num_slots=num_blocks * 4, max_model_len=48, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
        kv_bytes_per_token=10, swap_space_bytes=2000,
    )
    wl = workload(*specs)
    sim = Simulation(parse_strategy(name), cfg, wl, max_iterations=1)
    while sim.step() is not None:
        check_invariants(sim)
    result = sim.result()
    assert result.counters.num_finished + result.counters.num_rejected == len(specs)
    for record in result.records:
        request = wl.requests[record.request_id]
        if record.status == "finished":
            assert record.num_output_tokens == min(request.output_len, cfg.scheduler.max_model_len - request.prompt_len)
            assert record.arrival_time <= record.first_token_time <= record.finish_time
        else:
            assert record.reject_reason
    shares = result.summary()["memory_shares"]
    if result.integral.num_iterations:  # (everything may have been rejected: a 48-slot slab needs 64 buddy slots)
        assert sum(shares.values()) == pytest.approx(100.0)


def assert_same_run(strategy, cfg, wl) -> None:
    """Runs of iterations give what stepping gives: records, counters, integrals and the per-iteration log, exactly."""
    stepped = Simulation(strategy, cfg, wl, max_iterations=1).run()
    runs = Simulation(strategy, cfg, wl).run()
    assert runs.records == stepped.records
    assert runs.counters == stepped.counters
    assert dataclasses.asdict(runs.integral) == dataclasses.asdict(stepped.integral)
    assert {k: list(v) for k, v in runs.log.columns.items()} == {k: list(v) for k, v in stepped.log.columns.items()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=request_specs,
    name=st.sampled_from(STRATEGY_NAMES),
    num_blocks=st.integers(12, 64),
    max_num_seqs=st.integers(1, 8),
)
def test_runs_give_what_stepping_gives(specs, name, num_blocks, max_num_seqs):
    cfg = config(num_slots=num_blocks * 4, max_model_len=48, max_num_seqs=max_num_seqs,
                 kv_bytes_per_token=10, swap_space_bytes=2000)
    assert_same_run(parse_strategy(name), cfg, workload(*specs))


# Decode turns compute-bound from 3 requests on (6 ms of compute per token against 8 ms of weights), and with
# costly attention also as contexts grow: a run's durations must take the larger of the two times as a step does.
COMPUTE_BOUND_COSTS = [
    dataclasses.replace(COST, flops_per_token=3e6, peak_flops=1e9),
    dataclasses.replace(COST, flops_per_token=3e6, attention_flops_per_pair=1e3, peak_flops=1e9),
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=request_specs,
    name=st.sampled_from(STRATEGY_NAMES),
    num_blocks=st.integers(12, 64),
    max_num_seqs=st.integers(1, 8),
    cost=st.sampled_from(COMPUTE_BOUND_COSTS),
)
def test_runs_give_what_stepping_gives_when_compute_bound(specs, name, num_blocks, max_num_seqs, cost):
    cfg = config(num_slots=num_blocks * 4, max_model_len=48, max_num_seqs=max_num_seqs, cost=cost,
                 kv_bytes_per_token=10, swap_space_bytes=2000)
    assert_same_run(parse_strategy(name), cfg, workload(*specs))


def test_runs_really_skip_scheduling_on_long_decodes():
    wl = workload(*[(0.0, 8, 200) for _ in range(4)])
    sim = Simulation(parse_strategy("vllm+noprefix"), config(num_slots=4096, max_model_len=512, max_num_batched_tokens=64), wl)
    calls = 0
    schedule = sim.scheduler.schedule

    def counting_schedule(*args):
        nonlocal calls
        calls += 1
        return schedule(*args)

    sim.scheduler.schedule = counting_schedule
    result = sim.run()
    assert result.integral.num_iterations == 200
    assert calls <= 3  # one prefill, one decode, then a run to the iteration in which all four finish


def test_a_request_arriving_into_decodes_is_admitted_by_the_first_iteration_of_a_run():
    # Request 0 decodes alone when request 1 arrives (at 50 ms, 8 ms iterations): the next output computes 1's
    # prompt beside 0's decode and runs on with both decoding, to 1's last token, in one SchedulerOutput.
    wl = workload((0.0, 8, 40), (0.05, 6, 10))
    cfg = config(num_slots=256, max_model_len=64, max_num_batched_tokens=32)
    sim = Simulation(parse_strategy("vllm+noprefix"), cfg, wl)
    outputs = []
    while (out := sim.step()) is not None:
        outputs.append(out)
    joined = next(out for out in outputs if 1 in out.new_req_ids)
    assert joined.new_req_ids == (1,) and joined.decodes_in_bulk
    assert joined.num_scheduled_tokens == {0: 1, 1: 6}
    assert joined.num_iterations == 10  # 1's prompt and first token, then its nine other tokens
    columns = sim.log.columns
    first = list(columns["num_prefill_tokens"]).index(6)
    assert [int(v) for v in columns["num_prefill_tokens"][first:first + 11]] == [6] + [0] * 10
    assert [int(v) for v in columns["num_decode_tokens"][first:first + 11]] == [1] + [2] * 9 + [1]
    assert [int(v) for v in columns["num_seqs"][first:first + 11]] == [2] * 10 + [1]
    assert_same_run(parse_strategy("vllm+noprefix"), cfg, wl)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    specs=request_specs,
    name=st.sampled_from(STRATEGY_NAMES),
    num_blocks=st.integers(12, 64),
    max_num_seqs=st.integers(1, 8),
)
def test_numpy_priced_runs_and_buffer_flushes_match_stepping(specs, name, num_blocks, max_num_seqs, monkeypatch):
    # The small workloads above rarely reach a run priced with numpy (32+ iterations) or a buffer flush (32,768
    # iterations): make both happen all the time.
    import kvlab.cost.model
    import kvlab.metrics

    monkeypatch.setattr(kvlab.cost.model, "VECTOR_MIN_ITERATIONS", 2)
    monkeypatch.setattr(kvlab.metrics.IterationRecorder, "BUFFER_ITERATIONS", 5)
    cfg = config(num_slots=num_blocks * 4, max_model_len=48, max_num_seqs=max_num_seqs,
                 kv_bytes_per_token=10, swap_space_bytes=2000)
    assert_same_run(parse_strategy(name), cfg, workload(*specs))


def test_run_until_in_slices_gives_the_same_run():
    wl = workload(*[(0.01 * i, 5 + 7 * i % 30, 10 + 13 * i % 40, i % 3 - 1) for i in range(30)])
    whole = Simulation(parse_strategy("vllm+prefix"), config(num_slots=96), wl).run()
    sliced = Simulation(parse_strategy("vllm+prefix"), config(num_slots=96), wl)
    t = 0.0
    while not sliced.done:
        t += 0.037
        sliced.run_until(t)
    assert sliced.result().records == whole.records
    assert sliced.result().counters == whole.counters


def test_a_run_leaves_its_objects_to_the_collectors_oldest_generation():
    """run() makes its objects with the collector off; at its end they go to the oldest generation in one move
    (kvlab.sim._keep_as_old), so the collector's next young pass does not walk a Seq and a record per request.
    A caller's frozen objects stay frozen (unfreeze would release them: the move is skipped then)."""
    import gc

    wl = workload(*[(0.01 * i, 5 + 7 * i % 30, 10 + 13 * i % 40) for i in range(300)])
    cfg = config(num_slots=256, max_model_len=128)
    gc.collect()
    result = Simulation(parse_strategy("vllm"), cfg, wl).run()
    young, _, _ = gc.get_count()
    assert young < 100, young  # (without the move: ~600, a Seq and a record for each of the 300 requests)
    assert gc.isenabled() and len(result.records) == 300
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        Simulation(parse_strategy("vllm"), cfg, wl).run()
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()

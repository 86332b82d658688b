"""A router's read of a replica inside a run (Simulation.read_at, the fleet's ReadInRuns): it shows the state
``run_until`` would show, it ends no run, and it changes nothing in any replica's outputs."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fleet import COST, _same_run, config, req, workload

from kvlab.fleet import Fleet, parse_router
from kvlab.fleet.fleet import WhenLoadMayChange
from kvlab.fleet.routers import Replica, load
from kvlab.sim import Simulation
from kvlab.strategies import parse_strategy

STRATEGIES = ["vllm", "vllm+prefix", "vllm+noprefix", "vllm+swap", "orca-oracle", "static+paged", "continuous+paged"]


def _requests(specs):
    t, requests = 0.0, []
    for i, (gap, prompt, output, group) in enumerate(specs):
        t += gap
        requests.append(req(i, t, prompt, output, (group, 5) if group >= 0 else ()))
    return requests


SPECS = st.lists(st.tuples(st.floats(0, 0.08), st.integers(1, 60), st.integers(1, 40), st.integers(-1, 2)),
                 min_size=1, max_size=40)


def test_a_read_inside_a_decode_run_does_not_begin_it():
    """One request decoding 40 tokens, 4-token blocks, 10 ms iterations: read 0.2 s in, the run is not begun (the
    clock stays at the prefill's end), and the blocks its iterations before then take are counted."""
    cfg = config()
    wl = workload(req(0, 0.0, 4, 40))
    read, stepped = (Simulation(parse_strategy("vllm"), cfg, wl) for _ in range(2))
    slots, run = read.read_at(0.2)
    stepped.run_until(0.2)
    assert read.now < 0.2 <= stepped.now and run is not None
    assert slots > 0
    assert read.allocator.num_allocated_slots + slots == stepped.allocator.num_allocated_slots
    _same_run(read.run(), Simulation(parse_strategy("vllm"), cfg, wl).run())


def test_a_load_read_inside_a_decode_run_does_not_begin_it():
    """least-requests' clock (WhenLoadMayChange): a request decoding 60 tokens in iterations of 12 ms, its bound from
    tokens left assumes 8 ms (the empty iteration), so an arrival at 0.6 s is past the bound; the read there leaves
    the run that goes on to its finish (~0.73 s) pending, reads the load run_until would show, and holds the
    replica's load as it is up to the start of that run's last iteration."""
    cfg = dataclasses.replace(config(), cost=dataclasses.replace(COST, seq_overhead_s=0.004))
    first = req(0, 0.0, 4, 60)
    sim, twin = (Simulation(parse_strategy("vllm"), cfg, workload(first)) for _ in range(2))
    replica = Replica(sim)
    clock = WhenLoadMayChange([replica], cfg.cost.iteration_times(0, 0, 0, 0, 0))
    clock.given(0, first)
    sim.run_until(0.02)  # (past its prefill)
    assert clock.quiet[0] < 0.6
    clock.before(req(1, 0.6, 4, 10))
    twin.run_until(0.6)
    assert sim.now < 0.6 <= twin.now and replica.run_in_flight is not None
    assert load(replica) == load(Replica(twin)) == 1
    # Held up to the start of the iteration in which it finishes (priced whole): exactly, on either side of it.
    before, after = (Simulation(parse_strategy("vllm"), cfg, workload(first)) for _ in range(2))
    before.run_until(clock.quiet[0])
    after.run_until(math.nextafter(clock.quiet[0], math.inf))
    assert (before.counters.num_finished, after.counters.num_finished) == (0, 1)
    _same_run(sim.run(), Simulation(parse_strategy("vllm"), cfg, workload(first)).run())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=SPECS, reads=st.lists(st.floats(0, 2.0), max_size=12), strategy=st.sampled_from(STRATEGIES),
       chunked=st.booleans(), num_blocks=st.integers(8, 40), seq_overhead_s=st.sampled_from([0.0, 0.004]))
def test_reads_show_run_until_and_change_nothing(specs, reads, strategy, chunked, num_blocks, seq_overhead_s):
    """On any workload, a simulation read at any instants (each read given the run the last one left pending)
    shows at each the allocator's slots and the loads a twin brought there by ``run_until`` has, and runs to the
    end with the records, counters, integral and log of one never read."""
    cost = dataclasses.replace(COST, seq_overhead_s=seq_overhead_s)
    cfg = dataclasses.replace(config(num_slots=4 * num_blocks, enable_chunked_prefill=chunked), cost=cost)
    wl = workload(*_requests(specs))
    read, twin = (Simulation(parse_strategy(strategy), cfg, wl) for _ in range(2))
    run = None
    for t in sorted(reads):
        slots, run = read.read_at(t, run)  # (the run read last, priced as far as that read went)
        twin.run_until(t)
        assert read.allocator.num_allocated_slots + slots == twin.allocator.num_allocated_slots
        assert read.counters.num_finished == twin.counters.num_finished
        assert read.counters.num_rejected == twin.counters.num_rejected
        assert read._next_arrival == twin._next_arrival
    _same_run(read.run(), Simulation(parse_strategy(strategy), cfg, wl).run())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=SPECS, num_replicas=st.integers(2, 4), strategy=st.sampled_from(STRATEGIES),
       router=st.sampled_from([parse_router("least-kv"), parse_router("weighted"),
                               parse_router("weighted", "least-kv:1"), parse_router("weighted", "least-kv:1,least-requests:2"),
                               parse_router("least-requests"), parse_router("prefix"),
                               parse_router("weighted", "least-requests:1")]),
       chunked=st.booleans(), num_blocks=st.integers(8, 40), seq_overhead_s=st.sampled_from([0.0, 0.004]))
def test_routers_reading_inside_runs_decide_and_run_as_when_every_run_is_cut(specs, num_replicas, strategy, router,
                                                                             chunked, num_blocks, seq_overhead_s):
    """least-kv, weighted, least-requests and prefix on random tiny fleets: the replicas read inside their runs
    (ReadInRuns; WhenLoadMayChange for the routers that read only loads, prefix among them on strategies without
    prefix caching or prompts that share nothing) give the decisions, and each replica the run (records, counters,
    integral, every column of the log), of every replica brought to every arrival."""
    cost = dataclasses.replace(COST, seq_overhead_s=seq_overhead_s)
    cfg = dataclasses.replace(config(num_slots=4 * num_blocks, enable_chunked_prefill=chunked), cost=cost)
    wl = workload(*_requests(specs))
    fast = Fleet(parse_strategy(strategy), cfg, wl, router, num_replicas).run()
    reference = Fleet(parse_strategy(strategy), cfg, wl, router, num_replicas, sync_every_arrival=True).run()
    assert fast.num_routed == reference.num_routed
    assert fast.reasons == reference.reasons
    for a, b in zip(fast.replicas, reference.replicas):
        _same_run(a, b)
    assert fast.summary() == reference.summary()

"""Runs of iterations give what stepping gives, on everything a user can see, at realistic sizes.

Stepping (``max_iterations=1``) runs the scheduler's two loops every iteration; runs let the scheduler return
many decode iterations at once. Here both serve hundreds of requests of the bundled traces with
``max_model_len`` >= 2,048, with and without chunked prefill, with swap and prefix caching, and must agree on
the per-request records, every column of the iteration log, and, at checkpoints along the way, the block
tables, the free queue and the grid's snapshot. tests/test_sim.py checks the same on tiny random workloads.
"""

from __future__ import annotations

import dataclasses

import pytest

import kvlab
from kvlab.config import resolve
from kvlab.memory import ContiguousAllocator, PagedAllocator
from kvlab.sim import SimConfig, Simulation
from kvlab.strategies import parse_strategy
from kvlab.workload import load_workload

# (strategy, workload, requests, rate, num_gpu_blocks, max_model_len, chunked prefill): small pools, so the
# cache fills, requests wait and (paged) get preempted.
CASES = [
    ("vllm", "paper-sharegpt", 400, 8.0, 600, 2048, True),
    ("vllm", "sharegpt-8k", 300, 2.0, 1200, 4096, False),
    ("vllm+swap", "paper-sharegpt", 400, 8.0, 500, 2048, True),
    ("vllm+prefix", "mooncake-conversation", 300, None, 3000, 32768, True),
    ("static+paged", "llmservingsim-sharegpt", 300, None, 900, 2048, True),
    ("orca-pow2", "paper-sharegpt", 400, 6.0, 700, 2048, True),
    ("static+max", "azure-conv", 300, None, 1500, 4096, False),
    # vLLM's --scheduling-policy priority: each request in one of three classes (request id mod 3), its victims
    # taken from the middle of the batch.
    ("vllm", "paper-sharegpt", 400, 8.0, 600, 2048, True, "priority"),
    ("vllm+prefix", "mooncake-conversation", 300, None, 3000, 32768, True, "priority"),
    # Client deadlines (Request.timeout): requests aborted as they run or wait, a run cut where a deadline falls.
    ("vllm", "paper-sharegpt", 400, 8.0, 600, 2048, True, "priority", 25.0),
    ("vllm+swap", "paper-sharegpt", 400, 8.0, 500, 2048, True, "fcfs", 20.0),
]


def _config(num_gpu_blocks: int, max_model_len: int, chunked: bool, policy: str = "fcfs") -> SimConfig:
    model = "llama-2-7b" if max_model_len <= 4096 else "llama-3.1-8b"
    return resolve(model=model, gpu="a100-80gb", num_gpu_blocks=num_gpu_blocks,
                   max_model_len=max_model_len, max_num_batched_tokens=max(4096, max_model_len),
                   enable_chunked_prefill=chunked, scheduling_policy=policy).engine


def _memory_state(sim: Simulation) -> tuple:
    """Block tables and the free queue (paged), or slabs and the buddy allocator's free chunks (contiguous)."""
    allocator, running = sim.allocator, sim.scheduler.running
    if isinstance(allocator, PagedAllocator):
        return {s.request_id: allocator.get_block_ids(s.request_id) for s in running}, allocator.free_block_ids()
    assert isinstance(allocator, ContiguousAllocator)
    return {s.request_id: allocator.get_slab(s.request_id) for s in running}, allocator.buddy.free_chunks()


def _counting_outputs(sim: Simulation) -> list[int] | None:
    """Each SchedulerOutput's number of iterations, as the simulation goes; None on the compiled engine, whose
    methods cannot be wrapped (a mypyc class's attributes are read-only: scripts/test.sh runs this file on both)."""
    sizes: list[int] = []
    schedule = sim.scheduler.schedule

    def counted(*args):
        out = schedule(*args)
        sizes.append(out.num_iterations)
        return out

    try:
        sim.scheduler.schedule = counted
    except AttributeError:
        assert kvlab.engine() == "compiled (mypyc)"
        return None
    return sizes


@pytest.fixture(scope="module", params=CASES, ids=[f"{c[0]}-{c[1]}" + "".join(f"-{x}" for x in c[7:]) for c in CASES])
def pair(request):
    name, workload_name, n, rate, num_blocks, max_model_len, chunked, *extra = request.param
    policy, timeout = (extra + [None, None])[:2]
    config = _config(num_blocks, max_model_len, chunked, policy or "fcfs")
    workload = load_workload(workload_name, num_requests=n, rate=rate, seed=1,
                             arrival="poisson" if rate else "auto")
    if policy:
        workload = dataclasses.replace(workload, requests=tuple(dataclasses.replace(r, priority=r.request_id % 3)
                                                                for r in workload.requests))
    if timeout:
        workload = dataclasses.replace(workload, requests=tuple(dataclasses.replace(r, timeout=timeout)
                                                                for r in workload.requests))
    strategy = parse_strategy(name)
    stepped = Simulation(strategy, config, workload, max_iterations=1)
    runs = Simulation(strategy, config, workload)
    sizes = _counting_outputs(runs)
    checkpoints = []
    t = stepped.start_time
    while not (stepped.done and runs.done):
        t += 7.3
        stepped.run_until(t)
        runs.run_until(t)
        checkpoints.append((
            (stepped.now, stepped.scheduler.step, _memory_state(stepped), stepped.snapshot()),
            (runs.now, runs.scheduler.step, _memory_state(runs), runs.snapshot()),
        ))
    return stepped, runs, checkpoints, sizes


def test_the_runs_really_run_many_iterations_at_once(pair):
    stepped, runs, _, sizes = pair
    if runs.config.scheduler.scheduling_policy == "priority":  # (the classes are in play)
        assert len({r.priority for r in runs.requests}) == 3
    if runs.requests[0].timeout is not None:  # (deadlines are in play: some requests were aborted, not all)
        statuses = [r.status for r in runs.result().records]
        assert 0 < statuses.count("aborted") < statuses.count("finished")
    if sizes is None:
        pytest.skip("the compiled engine's scheduler cannot be wrapped to count its outputs; the pure-Python run counts them")
    assert sum(sizes) == runs.result().integral.num_iterations == stepped.result().integral.num_iterations
    assert max(sizes) > 1 and len(sizes) < sum(sizes) / 2  # (mostly runs: at least 2 iterations per output)


def test_records_and_counters_are_those_of_stepping(pair):
    stepped, runs, _, _ = pair
    a, b = stepped.result(), runs.result()
    assert b.records == a.records
    assert b.counters == a.counters
    assert dataclasses.asdict(b.integral) == dataclasses.asdict(a.integral)


def test_every_column_of_the_iteration_log_is_that_of_stepping(pair):
    stepped, runs, _, _ = pair
    a, b = stepped.result().log.columns, runs.result().log.columns
    assert a.keys() == b.keys()
    for name in a:
        assert list(b[name]) == list(a[name]), name


def test_block_tables_free_queue_and_snapshots_agree_along_the_way(pair):
    _, _, checkpoints, _ = pair
    assert len(checkpoints) > 3
    for stepped, runs in checkpoints:
        assert runs[:3] == stepped[:3]
        assert runs[3] == stepped[3]  # the grid's snapshot: owners and slot states of every block


def test_the_log_over_time_adds_up_to_the_memory_shares(pair):
    # The per-iteration log (what plots and CSVs show) and the summary's shares (what tables show) are the
    # same memory: each state's slots x duration, summed over the log, is the integral.
    _, runs, _, _ = pair
    result = runs.result()
    columns, integral = result.log.columns, result.integral
    for name in ("token", "reserved", "internal_fragmentation", "overhead", "free"):
        assert float((columns[name] * columns["duration"]).sum()) == pytest.approx(getattr(integral, name), rel=1e-9)
    capacity = sum(columns[name] for name in ("token", "reserved", "internal_fragmentation", "overhead", "free"))
    assert set(capacity.tolist()) == {float(runs.config.cache.num_slots)}

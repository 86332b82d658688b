"""Runs of iterations on a hybrid in vLLM's mamba_cache_mode 'align' (``vllm`` on a model with Gated DeltaNet groups):
a multi-step decode run stops before the iteration in which a request crosses a block boundary (it takes a block of
tokens and a state block in each Mamba group), that iteration and the next (which frees the previous states) begin
schedules of their own, and the queue's head is tried again there. Stepping (``max_iterations=1``) must agree at every
output: block ids, the free queue, the queue, and in the end the records, the counters, the integral and the log.
"""

from __future__ import annotations

import dataclasses

import pytest

import kvlab
from kvlab.config import resolve
from kvlab.sim import Simulation
from kvlab.strategies import parse_strategy
from kvlab.workload import load_workload

QWEN36 = "tests/data/sizing_configs/qwen3.6-27b.json"  # 1 full attention group + 3 Gated DeltaNet groups, 784 tokens a block


def _sims(tmp_path):
    path = tmp_path / "w.csv"
    # A: 700 + 200 tokens, crosses 784 at its 85th; B: 300 + 90; C: 500 + 20, waits for room
    path.write_text("arrival_time,prompt_len,output_len\n0,700,200\n0,300,90\n0,500,20\n")
    config = resolve(model=QWEN36, gpu="h100-sxm", workload=str(path), num_gpu_blocks=12)
    assert config.cache.mamba_align
    workload = load_workload(config.workload.workload)
    return (Simulation(parse_strategy("vllm"), config.engine, workload, max_iterations=1),
            Simulation(parse_strategy("vllm"), config.engine, workload))


def _recorded(sim: Simulation) -> list[tuple] | None:
    """After each output: (its first step, iterations, admitted, preempted, prefill tokens, each running request's
    block ids, the free queue, the queue's length). None on the compiled engine, whose scheduler cannot be wrapped."""
    sched, log = sim.scheduler, []
    schedule = sched.schedule

    def recorded(*args):
        out = schedule(*args)
        log.append((out.step, out.num_iterations, out.new_req_ids, out.preempted_req_ids, out.num_prefill_tokens,
                    {s.request_id: sim.allocator.get_block_ids(s.request_id) for s in sched.running},
                    sim.allocator.free_block_ids(), len(sched.waiting)))
        return out

    try:
        sched.schedule = recorded
    except AttributeError:
        assert kvlab.engine() == "compiled (mypyc)"
        return None
    return log


def test_a_run_stops_at_a_block_boundary_and_the_queues_head_is_tried_where_the_previous_states_are_freed(tmp_path):
    stepped, runs = _sims(tmp_path)
    steps, outputs = _recorded(stepped), _recorded(runs)
    stepped.run_until(float("inf"))
    runs.run_until(float("inf"))
    a, b = stepped.result(), runs.result()
    assert b.records == a.records and b.counters == a.counters
    assert dataclasses.asdict(b.integral) == dataclasses.asdict(a.integral)
    for name in a.log.columns:
        assert list(b.log.columns[name]) == list(a.log.columns[name]), name
    assert a.counters.num_preemptions == 1 and a.integral.num_iterations == 200
    if outputs is None or steps is None:
        pytest.skip("the compiled engine's scheduler cannot be wrapped to record its outputs")
    # (groups: 3 Gated DeltaNet tables indexed by token position, then the full attention table)
    assert outputs == [
        # A and B admitted whole (1,000 tokens); C needs 4 blocks, 3 are free
        (1, 1, (0, 1), (), 1000, {0: [[1], [2], [3], [4]], 1: [[5], [6], [7], [8]]}, [9, 10, 11], 1),
        # 84 decode iterations, up to the one in which A computes its 785th token
        (2, 84, (), (), 0, {0: [[1], [2], [3], [4]], 1: [[5], [6], [7], [8]]}, [9, 10, 11], 1),
        # A takes a full block and a state in each group beside its first: 4 blocks, 3 free: B (the newest) preempted
        (86, 1, (), (1,), 0, {0: [[1, 8], [2, 7], [3, 6], [4, 5]]}, [9, 10, 11], 2),
        # A frees its previous states (to the front), and B, the queue's head, is admitted into them
        (87, 1, (1,), (), 385, {0: [[0, 8], [0, 7], [0, 6], [4, 5]], 1: [[1], [2], [3], [9]]}, [10, 11], 1),
        (88, 4, (), (), 0, {0: [[0, 8], [0, 7], [0, 6], [4, 5]], 1: [[1], [2], [3], [9]]}, [10, 11], 1),  # B's last
        (92, 20, (2,), (), 500, {0: [[0, 8], [0, 7], [0, 6], [4, 5]], 2: [[9], [3], [2], [1]]}, [10, 11], 0),
        (112, 89, (), (), 0, {0: [[0, 8], [0, 7], [0, 6], [4, 5]]}, [1, 2, 3, 9, 10, 11], 0),
    ]
    # stepping: the same block ids, free queue and queue after each output's last iteration
    by_step = {s[0]: s[5:] for s in steps}
    for step, num_iterations, *_, tables, free, waiting in outputs:
        assert by_step[step + num_iterations - 1] == (tables, free, waiting)

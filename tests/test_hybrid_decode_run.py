"""The hybrid allocator's event-driven decode run (kvlab.memory.hybrid ``allocate_decode_run``, ``decode_run_slots``)
against its one-iteration-at-a-time definition (``allocate_decode_run_stepwise``) on random workloads: several KV
cache groups, sliding windows of different sizes and block sizes (Gemma 4's 32 beside 16), Mamba groups, pools small
enough that runs stop short. Block ids, the free queue (the order of frees and allocations), the growth tuples, the
counters and the slots ``decode_run_slots`` foresees must all be equal.
"""

from __future__ import annotations

import copy
import random

import pytest
from seqs import Seq

from kvlab.memory import Fit, HybridAllocator
from kvlab.memory.hybrid import GroupSpec
from kvlab.workload.request import Request


def random_groups(rng: random.Random, block_size: int) -> list[GroupSpec]:
    groups = [GroupSpec("full_attention")]
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(["sliding_attention", "sliding_attention", "mamba", "full_attention"])
        if kind == "sliding_attention":
            window = rng.choice([1, 2, 3, 5, 8, 13, 17, 32, 40, 64])
            groups.append(GroupSpec(kind, sliding_window=window, admission_blocks=rng.choice([0, 4, 8]),
                                    block_size=rng.choice([block_size, 2 * block_size])))
        elif kind == "mamba":
            groups.append(GroupSpec(kind, state_blocks=rng.randint(1, 3)))
        else:
            groups.append(GroupSpec(kind))
    rng.shuffle(groups)
    return groups


def state(a: HybridAllocator, seqs: list[Seq]) -> tuple:
    return ({s.request.request_id: a.get_block_ids(s.request.request_id) for s in seqs
             if s.request.request_id in a._held},
            a.free_block_ids(), a.num_allocated_slots, a.num_overhead_slots, a.num_internal_fragmentation_slots)


def scenario(seed: int) -> dict[str, int]:
    """Two allocators given the same admissions, then decode runs: one event-driven, one stepwise; equal after each."""
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4])
    groups = random_groups(rng, block_size)
    align = seed % 2 == 1 and any(g.kind == "mamba" for g in groups)  # (mamba_cache_mode 'align': prefix caching on)
    fast = HybridAllocator(rng.randint(8, 80), block_size, groups, mamba_align=align)
    slow = HybridAllocator(fast.num_blocks, block_size, groups, mamba_align=align)
    running: list[Seq] = []
    stats = {"runs": 0, "short": 0, "frees": 0, "growth": 0}
    next_id = 0
    for _ in range(rng.randint(2, 6)):
        for _ in range(rng.randint(0, 4)):  # admissions, the whole prompt at once
            prompt = rng.randint(1, 60)
            s = Seq(Request(next_id, 0.0, prompt, rng.randint(1, 1500)))
            twin = Seq(s.request)
            next_id += 1
            fit = fast.allocate_slots(s, prompt)
            assert slow.allocate_slots(twin, prompt) is fit
            if fit is Fit.NOW:
                s.num_computed_tokens = prompt
                s.num_tokens = prompt + 1
                running.append(s)
        assert state(fast, running) == state(slow, running)
        for s in [s for s in running if s.num_computed_tokens >= s.request.num_kv_tokens]:  # finished
            fast.free(s)
            slow.free(s)
            running.remove(s)
        # (a run ends at the first request to finish, as the scheduler's runs do)
        max_iterations = min([rng.choice([1, 2, 7, 50, 300, 1000])]
                             + [s.request.num_kv_tokens - s.num_computed_tokens for s in running])
        for n in (1, max_iterations // 2, max_iterations):  # what the run will hand out, foreseen
            expected = stepwise_slots(slow, n)
            assert fast.decode_run_slots(n) == expected and slow.decode_run_slots(n) == expected
        assert state(fast, running) == state(slow, running)
        free_before = fast.num_free_blocks
        run = fast.allocate_decode_run(running, max_iterations, first=5)
        assert slow.allocate_decode_run_stepwise(running, max_iterations, first=5) == run
        assert state(fast, running) == state(slow, running)
        for s in running:
            s.num_computed_tokens += run.num_iterations
            s.num_tokens = s.num_computed_tokens + 1
        fast.check_invariants(running, in_running_order=True, all_decoding=True)
        slow.check_invariants(running, in_running_order=True, all_decoding=True)
        stats["runs"] += 1
        stats["short"] += run.num_iterations < max_iterations
        stats["growth"] += len(run.growth) // 3
        stats["frees"] += fast.num_free_blocks > free_before - sum(run.growth[1::3]) // block_size
        for s in rng.sample(running, rng.randint(0, len(running))):  # some finish, tails back first
            fast.free(s)
            slow.free(s)
            running.remove(s)
        assert state(fast, running) == state(slow, running)
    return stats


def stepwise_slots(a: HybridAllocator, num_iterations: int) -> int | None:
    """The token slots a stepwise run of every held request (admission order) takes over ``num_iterations``, run on
    a copy: None when it stops short."""
    twin = copy.deepcopy(a)
    run = twin.allocate_decode_run_stepwise([Seq(Request(i, 0.0, 1, 1)) for i in twin._held], num_iterations)
    return sum(run.growth[1::3]) if run.num_iterations == max(num_iterations, 0) else None


@pytest.mark.parametrize("first_seed", range(0, 400, 100))
def test_the_event_driven_run_is_the_stepwise_run(first_seed):
    totals = {"runs": 0, "short": 0, "frees": 0, "growth": 0}
    for seed in range(first_seed, first_seed + 100):
        for key, value in scenario(seed).items():
            totals[key] += value
    # the workloads exercise what they must: runs stopped by a full pool, sliding windows giving blocks back
    assert totals["short"] >= 5 and totals["frees"] >= 5 and totals["growth"] >= 50, totals


def test_a_long_run_plans_only_at_its_events(monkeypatch):
    """1,000 iterations of 3 requests over a full and a sliding group of 32-token blocks: a few dozen plans, not
    the 3,000 a stepwise run makes."""
    groups = [GroupSpec("full_attention"), GroupSpec("sliding_attention", sliding_window=64, block_size=32),
              GroupSpec("mamba", state_blocks=2)]
    fast, slow = HybridAllocator(400, 16, groups), HybridAllocator(400, 16, groups)
    running = [Seq(Request(i, 0.0, 100 + i, 2000)) for i in range(3)]
    for s in running:
        assert fast.allocate_slots(s, s.request.prompt_len) is Fit.NOW
        assert slow.allocate_slots(s, s.request.prompt_len) is Fit.NOW
        s.num_computed_tokens = s.request.prompt_len
    calls = {"n": 0}
    plan = HybridAllocator._plan

    def counting(self, *args, **kwargs):
        calls["n"] += 1
        return plan(self, *args, **kwargs)

    monkeypatch.setattr(HybridAllocator, "_plan", counting)
    run = fast.allocate_decode_run(running, 1000)
    fast_calls, calls["n"] = calls["n"], 0
    assert slow.allocate_decode_run_stepwise(running, 1000) == run and run.num_iterations == 1000
    assert state(fast, running) == state(slow, running)
    # each request: a full block every 16 tokens, a sliding block taken and one freed every 32 (events may coincide)
    assert fast_calls <= 3 * (1000 // 16 + 2 * (1000 // 32) + 3), fast_calls
    assert calls["n"] >= 2 * 3 * 1000

"""vLLM's mamba_cache_mode 'align' (a Mamba hybrid with prefix caching on) in kvlab.memory.hybrid, on tiny pools with
exact block ids: a Mamba group's table indexed by token position (null but for the running state), the second state
block a request holds for the step after it crosses a block boundary, freed blocks with a hash to the back of the free
queue, a preempted request's own blocks still cached counted at its readmission; the scheduler's prefill chunks cut
at block boundaries (kvlab.sched.batching.mamba_aligned_chunk). tests/test_vllm_hybrid.py holds them to the engine.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from seqs import Seq, decode_run

from kvlab.memory import Fit, HybridAllocator
from kvlab.memory.block_pool import NULL_BLOCK_ID
from kvlab.sched.batching import mamba_aligned_chunk
from kvlab.workload.request import Request

MAMBA, FULL = ("mamba", 1, 0, 0), ("full_attention", 1, 0, 0)


def seq(request_id: int, prompt_len: int, output_len: int = 100) -> Seq:
    return Seq(Request(request_id, 0.0, prompt_len, output_len))


def step(a: HybridAllocator, s: Seq, num_new: int, num_cached: int = 0) -> Fit:
    fit = a.allocate_slots(s, num_new, num_cached)
    if fit is Fit.NOW:
        s.num_computed_tokens += num_cached + num_new
        s.num_tokens = max(s.num_tokens, s.num_computed_tokens + 1)
    return fit


def run_x(a: HybridAllocator) -> Seq:
    """Request 0: a 12-token prompt in chunks of 4 (the boundaries of 4-token blocks), then 5 decode steps."""
    x = seq(0, 12)
    for n in (4, 4, 4, 1, 1, 1, 1, 1):
        assert step(a, x, n) is Fit.NOW
        a.check_invariants([x])
    return x


def test_a_state_block_per_block_of_tokens_position_indexed_the_previous_one_freed_a_step_later():
    a = HybridAllocator(10, 4, [MAMBA, FULL], mamba_align=True)
    x = seq(0, 12)
    assert a.mamba_align_block_size == 4 and a.enable_prefix_caching
    assert step(a, x, 4) is Fit.NOW and a.get_block_ids(0) == [[1], [2]]
    # the chunk to token 8 crosses a boundary: a second state block, at the position of its block of tokens
    assert step(a, x, 4) is Fit.NOW and a.get_block_ids(0) == [[1, 3], [2, 4]]
    # the next step frees the previous state first (not hashed: to the front, and taken again at once)
    assert step(a, x, 4) is Fit.NOW and a.get_block_ids(0) == [[0, 3, 1], [2, 4, 5]]
    assert a.free_block_ids() == [6, 7, 8, 9]
    # the state at the prompt's last block boundary (token 8) is the one vLLM hashes: freed to the back
    assert step(a, x, 1) is Fit.NOW and a.get_block_ids(0) == [[0, 0, 1, 6], [2, 4, 5, 7]]
    assert a.free_block_ids() == [8, 9, 3]
    assert step(a, x, 1) is Fit.NOW and a.get_block_ids(0) == [[0, 0, 0, 6], [2, 4, 5, 7]]
    assert a.free_block_ids() == [1, 8, 9, 3]
    a.check_invariants([x])
    # a chunk crossing two boundaries: a null between the state and the new one
    a = HybridAllocator(10, 4, [MAMBA, FULL], mamba_align=True)
    y = seq(1, 12)
    assert step(a, y, 2) is Fit.NOW and step(a, y, 10) is Fit.NOW
    assert a.get_block_ids(1) == [[1, NULL_BLOCK_ID, 3], [2, 4, 5]]
    a.check_invariants([y])


def test_a_freed_request_sends_its_hashed_blocks_to_the_back_and_its_others_to_the_front():
    a = HybridAllocator(10, 4, [MAMBA, FULL], mamba_align=True)
    x = run_x(a)
    assert a.get_block_ids(0) == [[0, 0, 0, 6, 1], [2, 4, 5, 7, 8]] and a.free_block_ids() == [9, 3]
    a.free(x)  # (17 tokens with slots: the full group's first 4 blocks hashed, its 5th and both states not)
    assert a.free_block_ids() == [8, 1, 6, 9, 3, 7, 5, 4, 2]
    a.check_invariants([])


def test_a_preempted_requests_own_cached_blocks_are_its_hit_while_they_are_not_reused():
    a = HybridAllocator(10, 4, [MAMBA, FULL], mamba_align=True)
    x = run_x(a)
    a.free(x)
    x.num_computed_tokens = 0  # preempted: recomputed
    # the full group's 4 blocks are cached, but a Mamba state only at token 8 (block 3): a hit of 8 tokens
    assert a.get_num_cached_tokens(x) == 8
    y, z = seq(1, 1), seq(2, 1)
    assert step(a, y, 1) is Fit.NOW and step(a, z, 1) is Fit.NOW and a.get_num_cached_tokens(x) == 8
    assert a.get_block_ids(1) == [[8], [1]] and a.get_block_ids(2) == [[6], [9]] and a.free_block_ids()[0] == 3
    w = seq(3, 1)
    assert step(a, w, 1) is Fit.NOW and a.get_block_ids(3) == [[3], [7]]
    assert a.get_num_cached_tokens(x) == 0  # its state at token 8 is reused: no hit


def test_a_hit_takes_its_blocks_out_of_the_queue_and_counts_them():
    a = HybridAllocator(10, 4, [MAMBA, FULL], mamba_align=True)
    x = run_x(a)
    a.free(x)
    x.num_computed_tokens = 0
    y = seq(1, 8)
    assert step(a, y, 8) is Fit.NOW and a.get_block_ids(1) == [[0, 8], [1, 6]] and a.num_free_blocks == 6
    # 18 tokens: 5 full blocks (2 of them the hit's, free: taken) and 2 state blocks (the hit's, and a new one)
    assert a.get_num_cached_tokens(x) == 8 and a.allocate_slots(x, 10, 8) is Fit.LATER
    a.free(y)
    assert a.free_block_ids() == [8, 9, 3, 7, 5, 4, 2, 6, 1]
    assert step(a, x, 10, 8) is Fit.NOW and x.num_computed_tokens == 18
    assert a.get_block_ids(0) == [[0, 3, 0, 0, 8], [2, 4, 9, 7, 5]] and a.free_block_ids() == [6, 1]
    a.check_invariants([x])
    # its hit state (the prompt's boundary) back to the back a step later
    assert step(a, x, 1) is Fit.NOW and a.get_block_ids(0) == [[0, 0, 0, 0, 8], [2, 4, 9, 7, 5]]
    assert a.free_block_ids() == [6, 1, 3]
    a.check_invariants([x])


@pytest.mark.parametrize(("start", "num_new", "prompt", "tokens", "block_size", "budget", "expected"), [
    (136, 160, 362, 362, 288, 160, 152),  # to the block boundary it runs past
    (0, 7, 400, 400, 288, 160, 7),  # no boundary inside, a block wider than a chunk: not cut
    (0, 10, 100, 100, 16, 160, 0),  # no boundary inside, a block narrower than a chunk: nothing this step
    (0, 40, 100, 100, 16, 160, 32),  # the last boundary inside
    (40, 100, 100, 100, 16, 160, 8),  # a chunk from inside a block stops at its end
    (288, 74, 362, 362, 288, 160, 74),  # the prompt's last chunk: not cut ...
    (0, 150, 150, 150, 64, 160, 128),  # ... but at the last boundary before the prompt's end
    (48, 100, 100, 150, 16, 160, 96),  # resumed: its prefill ends at its tokens but one (149): cut at 144
    (200, 1, 100, 201, 16, 160, 1),  # decoding: not cut
])
def test_the_aligned_split(start, num_new, prompt, tokens, block_size, budget, expected):
    s = Seq(Request(0, 0.0, prompt, 1000))
    s.num_tokens = tokens
    s.num_computed_tokens = start
    assert mamba_aligned_chunk(s, start, num_new, block_size, budget) == expected


def test_a_decode_run_stops_before_an_iteration_past_its_first_that_takes_or_frees_a_block():
    """A decode run's growth carries token slots only, and a run's overhead is one figure for all its iterations: in
    'align' mode the state block a request takes as it crosses a block boundary, and the previous one it frees the
    iteration after, make each run stop before such an iteration unless it is the run's first (``first`` = 0). x: 6
    tokens (a null, then its state), y: 3; 20 iterations asked each time. The stepwise definition does the same."""
    a = HybridAllocator(12, 4, [MAMBA, FULL], mamba_align=True)
    twin = HybridAllocator(12, 4, [MAMBA, FULL], mamba_align=True)
    x, y = seq(0, 6, 20), seq(1, 3, 20)
    for s in (x, y):
        assert a.allocate_slots(s, s.request.prompt_len) is Fit.NOW
        assert twin.allocate_slots(Seq(s.request), s.request.prompt_len) is Fit.NOW
        s.num_computed_tokens, s.num_tokens = s.request.prompt_len, s.request.prompt_len + 1
    assert (a.get_block_ids(0), a.get_block_ids(1), a.free_block_ids()) == ([[0, 1], [2, 3]], [[4], [5]],
                                                                              [6, 7, 8, 9, 10, 11])

    def run(first: int = 0) -> tuple:
        assert a.decode_run_slots(20) is None  # (the run stops before 20: nothing foreseen)
        out = a.allocate_decode_run([x, y], 20, first)
        assert twin.allocate_decode_run_stepwise([x, y], 20, first) == out
        for s in (x, y):
            s.num_computed_tokens += out.num_iterations
            s.num_tokens = s.num_computed_tokens + 1
        a.check_invariants([x, y], in_running_order=True, all_decoding=True)
        assert [a.get_block_ids(i) for i in (0, 1)] == [twin.get_block_ids(i) for i in (0, 1)]
        assert a.free_block_ids() == twin.free_block_ids()
        return out.num_iterations, out.growth, a.get_block_ids(0), a.get_block_ids(1), a.free_block_ids()

    # iteration 1 would give y (4 tokens computed) its second block of tokens and a state beside its first: cut there
    assert run() == (1, (), [[0, 1], [2, 3]], [[4], [5]], [6, 7, 8, 9, 10, 11])
    # the run's first iteration takes them (y: state 6 at position 1, full block 7); the next would free state 4
    assert run() == (1, (0, 4, 0), [[0, 1], [2, 3]], [[4, 6], [5, 7]], [8, 9, 10, 11])
    # y frees state 4 (to the front) and x crosses at 8 tokens (state 8, full block 9); the next would free x's state 1
    assert run() == (1, (0, 4, 0), [[0, 1, 8], [2, 3, 9]], [[0, 6], [5, 7]], [4, 10, 11])
    # x frees state 1; 2 iterations, up to y's 8th token: its third block of tokens
    assert run() == (2, (), [[0, 0, 8], [2, 3, 9]], [[0, 6], [5, 7]], [1, 4, 10, 11])
    # a run after an iteration of its own (first = 1) takes and frees nothing, even in its first
    assert run(first=1) == (0, (), [[0, 0, 8], [2, 3, 9]], [[0, 6], [5, 7]], [1, 4, 10, 11])
    assert run() == (1, (0, 4, 0), [[0, 0, 8], [2, 3, 9]], [[0, 6, 1], [5, 7, 4]], [10, 11])
    # without 'align' nothing is taken or freed but token blocks: one run to the end of the free blocks
    b = HybridAllocator(12, 4, [MAMBA, FULL])
    for s in (x, y):
        s.num_computed_tokens = 0
        assert b.allocate_slots(s, s.request.prompt_len) is Fit.NOW
        s.num_computed_tokens, s.num_tokens = s.request.prompt_len, s.request.prompt_len + 1
    # (y takes a block of tokens at iterations 1, 5, 9, x at 2, 6, 10: the 6 free ones; y finds none at 13)
    assert b.decode_run_slots(13) == 24 and b.allocate_decode_run([x, y], 20).num_iterations == 13


def test_align_needs_the_mamba_groups_blocks_to_be_the_pools():
    with pytest.raises(Exception, match="align"):
        HybridAllocator(10, 4, [("mamba", 1, 0, 0, 8), FULL], mamba_align=True)
    assert HybridAllocator(10, 4, [MAMBA, FULL]).mamba_align_block_size == 0


@settings(max_examples=150, deadline=None)
@given(num_blocks=st.integers(6, 40), ops=st.lists(st.tuples(st.sampled_from(["admit", "step", "run", "free", "back"]),
                                                          st.integers(0, 5), st.integers(1, 30)), max_size=60))
def test_random_operations_conserve_blocks_in_align_mode(num_blocks, ops):
    a = HybridAllocator(num_blocks, 4, [MAMBA, FULL, ("mamba", 1, 0, 0)], mamba_align=True)
    running: list[Seq] = []
    preempted: list[Seq] = []
    next_id = 0
    for op, pick, n in ops:
        if op == "admit":
            s = seq(next_id, n)
            next_id += 1
            if step(a, s, n) is Fit.NOW:
                running.append(s)
        elif op == "back" and preempted:  # a preempted request's readmission, with its hit
            s = preempted[pick % len(preempted)]
            hit = a.get_num_cached_tokens(s)
            assert hit % 4 == 0 and hit < s.num_tokens
            if step(a, s, s.num_tokens - hit, hit) is Fit.NOW:
                preempted.remove(s)
                running.append(s)
        elif op == "step" and running:
            step(a, running[pick % len(running)], 1 + n % 3)
        elif op == "run" and running:
            decode_run(a, running, 1 + n % 4)
        elif op == "free" and running:
            s = running.pop(pick % len(running))
            a.free(s)
            s.num_computed_tokens = 0
            preempted.append(s)
        a.check_invariants(running)
        held = sum(len([b for b in t if b != NULL_BLOCK_ID]) for s in running for t in a.get_block_ids(s.request.request_id))
        assert held + a.num_free_blocks == num_blocks - 1


# `kvlab run` (config.resolve -> CacheConfig.mamba_align -> memory.make_allocator): a strategy with prefix caching runs
# a hybrid's Mamba groups in 'align', one without in one state block a request.

QWEN36 = "tests/data/sizing_configs/qwen3.6-27b.json"


def _tiny_run(tmp_path, strategy: str, **options):
    from kvlab.config import resolve
    from kvlab.sim import Simulation
    from kvlab.strategies import parse_strategy
    from kvlab.workload import load_workload

    path = tmp_path / "w.csv"
    path.write_text("arrival_time,prompt_len,output_len\n" + "0,960,4\n" * 4)
    config = resolve(model=QWEN36, gpu="h100-sxm", workload=str(path), num_gpu_blocks=12, **options)
    sim = Simulation(parse_strategy(strategy), config.engine, load_workload(config.workload.workload))
    sim.run_until(float("inf"))
    cols = sim.result().log.columns
    steps = [(int(r), int(p), int(d), int(e)) for r, p, d, e in zip(cols["num_running"], cols["num_prefill_tokens"],
                                                                     cols["num_decode_tokens"], cols["num_preemptions"])]
    return config, sim, steps


def test_kvlab_run_with_prefix_caching_runs_a_hybrids_mamba_groups_in_align_mode(tmp_path):
    """qwen3.6-27b (1 full attention group + 3 Gated DeltaNet groups, blocks of 784 tokens) in 11 usable blocks, 4
    requests of 960 + 4 tokens at once. vllm+noprefix: 5 blocks a request (2 full + 3 states), 2 at a time, each
    prompt whole in one step, no preemption: 8 steps. vllm ('align'): the prompt is cut at 784 (2 x 784 in step 0),
    each holds 1 full block + 3 states (3 blocks free); in step 1 each needs its second full block and, for the step
    after crossing the boundary, a new state in each group beside the old one: 4 blocks each against 3 free, so the
    newer is preempted and computes its 784 tokens again. Every pair goes so: 4 preemptions, 17 steps."""
    config, sim, off = _tiny_run(tmp_path, "vllm+noprefix")
    assert config.cache.mamba_align and sim.allocator.mamba_align_block_size == 0
    assert off == [(2, 1920, 0, 0)] + [(2, 0, 2, 0)] * 3 + [(2, 1920, 0, 0)] + [(2, 0, 2, 0)] * 3
    _, sim, on = _tiny_run(tmp_path, "vllm")
    assert sim.allocator.mamba_align_block_size == 784
    pair = [(1, 176, 0, 0), (2, 784, 1, 0), (1, 0, 1, 1), (1, 0, 1, 0)]  # (the newer one preempted in the 3rd)
    assert on == [(2, 1568, 0, 0), (1, 176, 0, 1), (2, 784, 1, 0), (1, 0, 1, 1), (1, 0, 1, 0)] + pair * 2 \
        + [(1, 176, 0, 0)] + [(1, 0, 1, 0)] * 3
    assert sum(s[3] for s in on) == 4 and len(on) == 17


@pytest.mark.parametrize(("version", "aligned"), [("0.15.1", False), ("0.16.0", True), ("0.32.0", True)])
def test_align_mode_follows_the_vllm_version(version, aligned):
    """'align' from 0.16.0 (kvlab.vllm_rules.MAMBA_SPECULATIVE_BLOCKS_SINCE); before it the prefix-caching state is
    not modelled and every strategy holds one state block a request, as the run note says."""
    from kvlab.config import resolve

    config = resolve(model=QWEN36, gpu="h100-sxm", vllm_version=version, num_gpu_blocks=12)
    assert config.cache.mamba_align is aligned
    note = " ".join(" ".join(config.cache.notes).split())
    assert ("a second for the step after a request crosses a block boundary" in note) is aligned
    assert ("is not modelled" in note) is not aligned


def test_a_mamba2_model_at_0_32_0_runs_align_without_its_checkpoint_block_and_says_so():
    from kvlab.config import resolve

    for version, checkpoint in (("0.28.0", False), ("0.32.0", True)):
        config = resolve(model="tests/data/sizing_configs/granite-4.0-h-1b.json", gpu="h100-sxm", vllm_version=version)
        note = " ".join(" ".join(config.cache.notes).split())
        assert config.cache.mamba_align
        assert ("not a Mamba2 mixer's prefill checkpoint block" in note) is checkpoint

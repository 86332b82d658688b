"""The hybrid allocator (kvlab.memory.hybrid): one pool of blocks, one block table per KV cache group and request.

Exact block ids on tiny pools (a Mamba group's state block taken at admission, a sliding window giving back its
oldest block, an admission refused when the groups' sum does not fit), invariants on random operations, stepping
against runs on a hybrid model, and a run of qwen3.6-27b holding at most the requests vLLM's pool holds (kvlab size).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from seqs import Seq, decode_run

from kvlab.config import resolve
from kvlab.errors import KvlabError
from kvlab.memory import Fit, HybridAllocator, PagedAllocator, make_allocator
from kvlab.memory.block_pool import NULL_BLOCK_ID
from kvlab.sim import Simulation
from kvlab.strategies import parse_strategy
from kvlab.workload import load_workload
from kvlab.workload.request import Request

HYBRID = "tests/data/sizing_configs/qwen3.6-27b.json"
FULL, MAMBA, SLIDING = ("full_attention", 1, 0, 0), ("mamba", 1, 0, 0), ("sliding_attention", 1, 8, 0)


def seq(request_id: int, prompt_len: int, output_len: int = 100) -> Seq:
    return Seq(Request(request_id, 0.0, prompt_len, output_len))


def step(allocator: HybridAllocator, s: Seq, num_new: int) -> Fit:
    """allocate_slots, then the step computes the tokens (a decode samples one more)."""
    fit = allocator.allocate_slots(s, num_new)
    if fit is Fit.NOW:
        s.num_computed_tokens += num_new
        s.num_tokens = max(s.num_tokens, s.num_computed_tokens + 1)
    return fit


def test_a_mamba_group_takes_its_state_block_at_admission_and_the_sum_must_fit():
    a = HybridAllocator(8, 4, [FULL, MAMBA])
    x, y, z = seq(0, 6), seq(1, 10), seq(2, 1)
    assert step(a, x, 6) is Fit.NOW
    assert a.get_block_ids(0) == [[1, 2], [3]]
    assert step(a, y, 10) is Fit.NOW  # 3 + 1 blocks: the last 4 free
    assert a.get_block_ids(1) == [[4, 5, 6], [7]] and a.num_free_blocks == 0
    assert step(a, z, 1) is Fit.LATER  # 1 full block would not be all: its state block too
    a.free(x)  # group by group, each tail first: the state block 3 is reused first, then 2, 1
    assert a.free_block_ids() == [3, 2, 1]
    assert step(a, z, 1) is Fit.NOW and a.get_block_ids(2) == [[3], [2]]
    # decoding never takes another state block: only the full group grows
    for _ in range(3):
        assert step(a, z, 1) is Fit.NOW
    assert a.get_block_ids(2) == [[3], [2]]
    assert step(a, z, 1) is Fit.NOW and a.get_block_ids(2) == [[3, 1], [2]]
    a.check_invariants([y, z])


def test_the_sum_over_groups_decides_never():
    a = HybridAllocator(6, 4, [FULL, MAMBA, MAMBA])  # 5 usable blocks
    assert a.allocate_slots(seq(0, 12), 12) is Fit.NOW  # 12 tokens: 3 + 1 + 1 = 5 blocks, all usable
    a2 = HybridAllocator(6, 4, [FULL, MAMBA, MAMBA])
    assert a2.allocate_slots(seq(0, 13), 13) is Fit.NEVER  # 4 + 1 + 1 = 6 > 5
    assert a2.why_never_fits(Request(0, 0.0, 13, 1)) == (
        "larger than the whole KV cache: at its longest context its blocks over the 3 KV cache groups, 2 of them Mamba "
        "state blocks whatever its length, are more than the 5 usable (the null block aside)")
    assert a2.why_never_fits(Request(0, 0.0, 8, 1)) is None


def test_with_prefix_caching_a_mamba_group_holds_its_state_blocks_as_without():
    """vLLM's mamba_cache_mode 'align' (prefix caching on) holds one state block between block boundaries, as without
    prefix caching: the paged strategy with prefix caching gives a hybrid the same blocks, and simulates no hit."""
    groups = (("full_attention", 1, 0, 0, 0), ("mamba", 1, 0, 0, 0))
    on = make_allocator("paged", num_slots=32, block_size=4, max_model_len=64, enable_prefix_caching=True,
                        kv_cache_groups=groups)
    off = make_allocator("paged", num_slots=32, block_size=4, max_model_len=64, kv_cache_groups=groups)
    assert isinstance(on, HybridAllocator) and not on.enable_prefix_caching
    for a in (on, off):
        assert step(a, seq(0, 6), 6) is Fit.NOW and a.get_block_ids(0) == [[1, 2], [3]]
        assert a.get_num_cached_tokens(seq(1, 6)) == 0


def test_a_sliding_window_gives_back_its_oldest_block_before_allocating():
    a = HybridAllocator(10, 4, [FULL, SLIDING])  # window 8 tokens = 2 blocks
    x = seq(0, 8)
    assert step(a, x, 8) is Fit.NOW and a.get_block_ids(0) == [[1, 2], [3, 4]]
    assert step(a, x, 1) is Fit.NOW and a.get_block_ids(0) == [[1, 2, 5], [3, 4, 6]]  # token 9: a block in each
    for _ in range(2):  # tokens 10, 11: room in the blocks held
        assert step(a, x, 1) is Fit.NOW
    assert a.get_block_ids(0) == [[1, 2, 5], [3, 4, 6]]
    # Allocating token 12 with 11 computed: tokens 0..3 (block 3) are before the window, 4..11 in it
    assert step(a, x, 1) is Fit.NOW
    assert a.get_block_ids(0) == [[1, 2, 5], [NULL_BLOCK_ID, 4, 6]]
    assert a.free_block_ids()[0] == 3  # freed to the front: reused next
    assert step(a, x, 1) is Fit.NOW  # token 13: a new block in each group, the full one first
    assert a.get_block_ids(0) == [[1, 2, 5, 3], [NULL_BLOCK_ID, 4, 6, 7]]
    a.check_invariants([x])
    a.free(x)
    assert a.num_free_blocks == 9 and a.num_allocated_slots == 0 and a.num_overhead_slots == 4


def test_the_whole_prompt_check_caps_a_sliding_group_at_its_admission_blocks():
    """vLLM's full_sequence_must_fit counts a sliding group's blocks up to its window and in-flight tokens (+1): a
    20-token prompt admitted by 8-token chunks needs 5 full blocks and, capped, 3 sliding ones: 8 of 9 usable."""
    capped = HybridAllocator(10, 4, [FULL, ("sliding_attention", 1, 8, 3)])
    x = seq(0, 20)
    assert capped.allocate_slots(x, 8) is Fit.NOW
    assert capped.get_block_ids(0) == [[1, 2], [3, 4]]  # this step's blocks only
    uncapped = HybridAllocator(10, 4, [FULL, SLIDING])
    assert uncapped.allocate_slots(seq(0, 20), 8) is Fit.NEVER  # 5 + 5 > 9 usable: more than the whole cache
    assert capped.admission(seq(1, 20)).num_slots == (5 + 5) * 4  # (its whole prompt in one step: every block)


def test_overhead_is_the_other_groups_blocks():
    a = HybridAllocator(10, 4, [FULL, MAMBA, SLIDING])
    x = seq(0, 5)
    step(a, x, 5)  # full 2, mamba 1, sliding 2
    assert a.num_allocated_slots == 8 and a.num_overhead_slots == (1 + 3) * 4
    a.check_invariants([x])


def test_make_allocator_builds_it_for_several_groups_only():
    assert isinstance(make_allocator("paged", num_slots=64, block_size=4, max_model_len=64), PagedAllocator)
    assert isinstance(make_allocator("paged", num_slots=64, block_size=4, max_model_len=64,
                                     kv_cache_groups=(FULL, MAMBA)), HybridAllocator)
    with pytest.raises(KvlabError, match="full attention"):
        HybridAllocator(8, 4, [MAMBA, SLIDING])
    with pytest.raises(KvlabError, match="unknown KV cache group kind 'cross'"):
        HybridAllocator(8, 4, [FULL, ("cross", 1, 0, 0)])


GROUPS = st.lists(st.sampled_from([MAMBA, ("mamba", 2, 0), SLIDING, ("sliding_attention", 1, 5, 3), FULL]),
                  min_size=1, max_size=3).map(lambda gs: [FULL, *gs])


@settings(max_examples=120, deadline=None)
@given(groups=GROUPS, num_blocks=st.integers(4, 40),
       ops=st.lists(st.tuples(st.sampled_from(["admit", "step", "run", "free"]), st.integers(0, 5),
                              st.integers(1, 30)), max_size=60))
def test_random_operations_conserve_blocks(groups, num_blocks, ops):
    a = HybridAllocator(num_blocks, 4, groups)
    running: list[Seq] = []
    next_id = 0
    for op, pick, n in ops:
        if op == "admit":
            s = seq(next_id, n)
            next_id += 1
            if step(a, s, n) is Fit.NOW:
                running.append(s)
        elif op == "step" and running:
            step(a, running[pick % len(running)], 1 + n % 3)
        elif op == "run" and running:
            for s in running:  # a decode run starts where each request's tokens were computed
                s.num_tokens = s.num_computed_tokens + 1
            a.check_invariants(running, all_decoding=True)
            decode_run(a, running, 1 + n % 4)
        elif op == "free" and running:
            a.free(running.pop(pick % len(running)))
        a.check_invariants(running)
        held = sum(len([b for b in t if b != NULL_BLOCK_ID]) for s in running for t in a.get_block_ids(s.request.request_id))
        assert held + a.num_free_blocks == num_blocks - 1


def _hybrid_config(**options):
    return resolve(model=HYBRID, gpu="h100-sxm", **options)


def test_a_hybrid_resolves_to_vllms_blocks():
    config = _hybrid_config()
    sizing = config.sizing
    assert config.cache.block_size == sizing.block_size and config.cache.num_gpu_blocks == sizing.num_blocks
    assert [g[0] for g in config.cache.kv_cache_groups] == [g.spec.kind for g in sizing.kv_cache_groups]
    given = _hybrid_config(num_gpu_blocks=100)
    assert given.cache.num_gpu_blocks == 100 and given.cache.block_size == sizing.block_size
    dense = resolve(model="llama-3.1-8b", gpu="h100-sxm")
    assert dense.cache.kv_cache_groups == () and dense.cache.block_size == 16


def _fixed_workload(tmp_path, n: int, prompt: int, output: int) -> str:
    path = tmp_path / "w.csv"
    path.write_text("arrival_time,prompt_len,output_len\n" + f"0,{prompt},{output}\n" * n)
    return str(path)


@pytest.mark.parametrize("strategy", ["vllm", "vllm+noprefix"])
def test_a_hybrid_run_holds_at_most_what_vllm_holds(kvlab, tmp_path, strategy):
    """1,024-token requests (960 + 64: the last sampled token is never written), all at once. Without prefix caching
    (vllm+noprefix) the run holds as many at once as vLLM's pool holds with one state block a Mamba group (`kvlab size
    --context-len 1024 --no-enable-prefix-caching`), no more (the pooled tokens held 3.8x as many) and never preempts.
    With it (vllm: vLLM 0.32.0's mamba_cache_mode 'align', whose startup arithmetic counts two state blocks a group,
    `kvlab size`'s default) prompts are cut at the 784-token block boundary: a request whose first chunk is computed
    holds 1 full attention block + 3 state blocks, so 2 more are admitted than fit once prompts are done, and the step
    after a request crosses the boundary it holds its previous states too: 14 preemptions."""
    flags = ("--gpu", "h100-sxm", "--context-len", "1024", "--json")
    held = kvlab("size", HYBRID, *flags, "--no-enable-prefix-caching").json()["workload"]
    printed = kvlab("size", HYBRID, *flags).json()["workload"]
    # 1,024 tokens in blocks of 784: 2 in the full attention group, and the state blocks in each of 3 Mamba groups
    assert (held["blocks_per_request"], printed["blocks_per_request"]) == (2 + 3 * 1, 2 + 3 * 2)
    most = held["max_num_requests"]
    assert printed["max_num_requests"] < most
    config = _hybrid_config(workload=_fixed_workload(tmp_path, 2 * most, 960, 64))
    assert config.cache.mamba_align
    sim = Simulation(parse_strategy(strategy), config.engine, load_workload(config.workload.workload))
    sim.run_until(float("inf"))
    result = sim.result()
    peak = int(result.log.columns["num_running"].max())
    aligned = strategy == "vllm"
    assert sim.allocator.mamba_align_block_size == (config.cache.block_size if aligned else 0)
    assert (most, peak, result.counters.num_preemptions) == ((71, 73, 14) if aligned else (71, 71, 0))
    assert result.counters.num_finished == 2 * most


@pytest.mark.parametrize("strategy", ["vllm", "continuous+paged"])
def test_runs_are_stepping_on_a_hybrid(strategy):
    config = _hybrid_config(num_gpu_blocks=60, max_model_len=8192).engine
    workload = load_workload("paper-sharegpt", num_requests=150, rate=6.0, seed=1, arrival="poisson")
    workload = dataclasses.replace(workload, requests=tuple(dataclasses.replace(r, prompt_len=r.prompt_len * 4)
                                                            for r in workload.requests))
    stepped = Simulation(parse_strategy(strategy), config, workload, max_iterations=1)
    runs = Simulation(parse_strategy(strategy), config, workload)
    t = stepped.start_time
    while not (stepped.done and runs.done):
        t += 7.3
        stepped.run_until(t)
        runs.run_until(t)
        assert stepped.snapshot() == runs.snapshot()
        ids = [s.request_id for s in runs.scheduler.running]
        assert [stepped.allocator.get_block_ids(i) for i in ids] == [runs.allocator.get_block_ids(i) for i in ids]
        runs.allocator.check_invariants(runs.scheduler.running)
    a, b = stepped.result(), runs.result()
    assert b.records == a.records and b.counters == a.counters
    assert dataclasses.asdict(b.integral) == dataclasses.asdict(a.integral)
    assert a.counters.num_preemptions > 0  # (the pool is small enough to run out)


def test_a_request_admitted_past_its_windows_start_gets_its_null_prefix():
    """A request admitted with tokens already computed (swapped back in) holds no blocks wholly before its window: its
    sliding table starts with the null block there, as long as the full one (review 56, M1)."""
    a = HybridAllocator(40, 16, [("sliding_attention", 1, 32, 0), FULL])
    s = seq(0, 101)
    s.num_computed_tokens = 100
    assert a.allocate_slots(s, 1) is Fit.NOW
    window, full = a.get_block_ids(0)
    # 101 tokens: 7 blocks; tokens 0-63 (blocks 0-3) are before the window of token 100 (69-100): null
    assert window == [0, 0, 0, 0, 1, 2, 3] and full == [4, 5, 6, 7, 8, 9, 10]
    assert a.num_free_blocks == 39 - 10
    a.check_invariants([s])


def test_a_request_that_could_never_be_admitted_again_is_refused_at_arrival():
    """Admitted again after a preemption, a request's whole sequence is checked (a sliding group up to its admission
    cap): one whose longest context cannot pass that check is refused at arrival, not admitted at its prompt to stall
    the run later (review 56, M2)."""
    groups = [("sliding_attention", 1, 32, 4), FULL]
    request = Request(0, 0.0, 16, 200)  # 215 tokens at most: 14 full blocks, the sliding group capped at 4
    assert HybridAllocator(18, 16, groups).why_never_fits(request) == (  # 18 > 17 usable (held, it would take 17)
        "larger than the whole KV cache: at its longest context its blocks over the 2 KV cache groups are more than "
        "the 17 usable (the null block aside)")
    assert HybridAllocator(19, 16, groups).why_never_fits(request) is None


def test_groups_whose_blocks_hold_different_token_counts_count_each_in_its_own():
    """One pool of one page size: a group of smaller layers holds more tokens in each block (Gemma 4: its sliding
    groups 32 tokens beside the full group's 16, or the reverse), so each group's blocks, window and skipped blocks
    are counted in its own block size (review 56, H1)."""
    a = HybridAllocator(20, 4, [("sliding_attention", 1, 16, 0, 8), ("full_attention", 1, 0, 0, 4)])
    s = seq(0, 10, 40)
    assert a.allocate_slots(s, 10) is Fit.NOW
    assert a.get_block_ids(0) == [[1, 2], [3, 4, 5]]  # 10 tokens: 2 blocks of 8, 3 of 4
    s.num_computed_tokens, s.num_tokens = 10, 11
    for _ in range(14):
        assert step(a, s, 1) is Fit.NOW
    # 24 tokens: 3 sliding blocks of 8, the first (tokens 0-7) before the window of token 23 (8-23): null, and back
    # at the free queue's front; 6 full blocks of 4
    assert a.get_block_ids(0) == [[0, 2, 7], [3, 4, 5, 6, 8, 9]]
    assert a.free_block_ids()[0] == 1 and a.num_free_blocks == 19 - 8
    a.check_invariants([s])
    with pytest.raises(KvlabError, match="token group's blocks hold 8 tokens"):
        HybridAllocator(20, 4, [("full_attention", 1, 0, 0, 8)])

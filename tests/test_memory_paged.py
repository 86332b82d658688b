"""Paged KV memory in vLLM V1's semantics: tiny pools, exact block ids and free-queue order after every call."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from seqs import Seq

from kvlab.errors import KvlabError
from kvlab.memory import Fit, PagedAllocator, make_allocator, slot_usage
from kvlab.memory.base import Admission, DecodeRun
from kvlab.workload.request import Request


def req(request_id: int, prompt_len: int, output_len: int = 4, prefix: tuple[int, ...] = (), chunk: int = 8) -> Request:
    return Request(request_id, 0.0, prompt_len, output_len, prefix_hashes=prefix, prefix_chunk_len=chunk)


def admit(allocator: PagedAllocator, seq: Seq, num_new_tokens: int | None = None) -> Fit:
    """What the scheduler does for a waiting request: look up the prefix cache, then allocate."""
    num_cached = allocator.get_num_cached_tokens(seq)
    if num_new_tokens is None:
        num_new_tokens = seq.num_tokens - num_cached
    fit = allocator.allocate_slots(seq, num_new_tokens, num_cached)
    if fit is Fit.NOW:
        seq.num_computed_tokens = num_cached + num_new_tokens
    return fit


def decode(allocator: PagedAllocator, seq: Seq) -> Fit:
    """One decode step: the token sampled last step is fed back."""
    assert seq.num_computed_tokens == seq.num_tokens - 1 or seq.num_computed_tokens == seq.num_tokens
    if seq.num_computed_tokens == seq.num_tokens:
        seq.num_tokens += 1  # the prefill just finished and sampled a token
    fit = allocator.allocate_slots(seq, 1)
    if fit is Fit.NOW:
        seq.num_computed_tokens += 1
        seq.num_tokens += 1
    return fit


# Without prefix caching -----------------------------------------------------------------------------------------


def test_initial_pool_holds_the_null_block_apart():
    allocator = PagedAllocator(num_blocks=8, block_size=4)
    assert allocator.free_block_ids() == [1, 2, 3, 4, 5, 6, 7]
    assert allocator.num_free_blocks == 7
    usage = slot_usage(allocator, 0)
    assert (usage.overhead, usage.free, usage.num_slots) == (4, 28, 32)
    snap = allocator.snapshot([])
    assert snap.overhead == (4, 0, 0, 0, 0, 0, 0, 0)
    assert snap.owner == (-1,) * 8


def test_allocate_from_the_front_free_tail_first_to_the_front():
    allocator = PagedAllocator(num_blocks=8, block_size=4)
    a = Seq(req(0, 10, output_len=5))  # writes 14 slots
    b = Seq(req(1, 5, output_len=3))
    assert admit(allocator, a) is Fit.NOW
    assert allocator.get_block_ids(0) == [1, 2, 3]
    assert allocator.get_num_slots(0) == 12
    assert allocator.free_block_ids() == [4, 5, 6, 7]
    assert admit(allocator, b) is Fit.NOW
    assert allocator.get_block_ids(1) == [4, 5]
    assert allocator.free_block_ids() == [6, 7]

    # Decoding fills block 3 (tokens 8..11) before a new block is needed for token 12.
    for _ in range(2):
        assert decode(allocator, a) is Fit.NOW
        assert allocator.get_block_ids(0) == [1, 2, 3]
    assert a.num_computed_tokens == 12
    assert decode(allocator, a) is Fit.NOW
    assert allocator.get_block_ids(0) == [1, 2, 3, 6]
    assert allocator.free_block_ids() == [7]
    assert allocator.num_internal_fragmentation_slots == (16 - 14) + (8 - 7)
    allocator.check_invariants([a, b])

    # Freed blocks without a hash go to the front, tail block first: reused LIFO (vLLM 0.32 free_blocks).
    allocator.free(a)
    assert allocator.get_num_slots(0) == 0
    assert allocator.free_block_ids() == [6, 3, 2, 1, 7]
    c = Seq(req(2, 9, output_len=1))
    assert admit(allocator, c) is Fit.NOW
    assert allocator.get_block_ids(2) == [6, 3, 2]
    assert allocator.free_block_ids() == [1, 7]
    assert allocator.ref_cnts() == [0, 0, 1, 1, 1, 1, 1, 0]
    allocator.check_invariants([b, c])


def test_later_changes_nothing_and_never_rejects():
    allocator = PagedAllocator(num_blocks=8, block_size=4)
    a = Seq(req(0, 20))
    assert admit(allocator, a) is Fit.NOW  # 5 blocks
    before = (allocator.free_block_ids(), allocator.ref_cnts(), slot_usage(allocator, 20))
    b = Seq(req(1, 12))  # 3 blocks, 2 free
    assert admit(allocator, b) is Fit.LATER
    assert (allocator.free_block_ids(), allocator.ref_cnts(), slot_usage(allocator, 20)) == before
    with pytest.raises(KeyError):
        allocator.get_block_ids(1)

    too_long = Seq(req(2, 29))  # 8 blocks > the 7 usable ones
    assert admit(allocator, too_long) is Fit.NEVER
    assert not allocator.why_never_fits(req(3, 25, output_len=4))  # writes 28 slots: 7 blocks
    assert allocator.why_never_fits(req(3, 26, output_len=4))  # 29 slots: 8 blocks


def test_a_running_request_that_runs_out_gets_later():
    allocator = PagedAllocator(num_blocks=4, block_size=4)
    a, b = Seq(req(0, 8, output_len=8)), Seq(req(1, 4, output_len=8))
    assert admit(allocator, a) is Fit.NOW
    assert admit(allocator, b) is Fit.NOW
    assert decode(allocator, a) is Fit.LATER  # token 8 needs a 4th block; the pool is full
    assert a.num_computed_tokens == 8
    allocator.free(b)  # the scheduler preempts b
    assert decode(allocator, a) is Fit.NOW
    assert allocator.get_block_ids(0) == [1, 2, 3]


def test_admission_needs_the_whole_sequence_to_fit():
    """vLLM's scheduler_reserve_full_isl (default on): a waiting request's first chunk is admitted only if all
    its num_tokens fit; a running request's later chunks are not checked again."""
    allocator = PagedAllocator(num_blocks=6, block_size=4)  # 5 usable blocks
    holder = Seq(req(0, 4))
    assert admit(allocator, holder) is Fit.NOW  # 4 free left
    resumed = Seq(req(1, 12, output_len=10), num_tokens=20)  # preempted after 8 outputs: 5 blocks
    assert allocator.admission(resumed) == Admission(20, 20, 16, False)  # 5 blocks needed, 4 free
    assert admit(allocator, resumed, num_new_tokens=4) is Fit.LATER
    lenient = PagedAllocator(num_blocks=6, block_size=4, scheduler_reserve_full_isl=False)
    assert admit(lenient, Seq(req(0, 4))) is Fit.NOW
    assert admit(lenient, resumed, num_new_tokens=4) is Fit.NOW
    assert lenient.get_block_ids(1) == [2]


def _decoding_pair(allocator):
    """a (9 KV tokens) and c (12), each having computed its 4-token prompt and sampled one token; b's blocks
    freed in between: a holds [1], c holds [4], the free queue starts 3, 2, 5, 6."""
    a, b, c = Seq(req(0, 4, 6)), Seq(req(1, 8, 3)), Seq(req(2, 4, 9))
    for seq in (a, b, c):
        assert allocator.allocate_slots(seq, seq.num_tokens) is Fit.NOW  # blocks 1 | 2, 3 | 4
        seq.num_computed_tokens = seq.num_tokens
        seq.num_output_tokens = 1
    allocator.free(b)
    return a, c


def test_a_decode_run_hands_out_what_allocate_slots_would_step_by_step():
    one_by_one, bulk = PagedAllocator(num_blocks=12, block_size=4), PagedAllocator(num_blocks=12, block_size=4)
    steps, run = _decoding_pair(one_by_one), _decoding_pair(bulk)
    for _ in range(6):
        for seq in steps:  # the running loop: in running order, one token each
            assert one_by_one.allocate_slots(seq, 1) is Fit.NOW
        for seq in steps:
            seq.num_computed_tokens += 1
    decode_run = bulk.allocate_decode_run(list(run), 6)
    assert decode_run.num_iterations == 6
    # Iteration 0: a's 5th token takes block 3, then c's block 2; iteration 4: a's 9th and last takes 5 (3 slots
    # beyond its last token: internal fragmentation), then c's takes 6.
    assert decode_run.growth == (0, 8, 0, 4, 8, 0, 4, 0, 3)  # (iteration, slots, internal slots) entries, flat
    assert [bulk.get_block_ids(i) for i in (0, 2)] == [one_by_one.get_block_ids(i) for i in (0, 2)]
    assert bulk.get_block_ids(0) == [1, 3, 5] and bulk.get_block_ids(2) == [4, 2, 6]
    assert bulk.free_block_ids() == one_by_one.free_block_ids() == [7, 8, 9, 10, 11]
    for name in ("num_allocated_slots", "num_internal_fragmentation_slots", "num_duplicate_token_slots"):
        assert getattr(bulk, name) == getattr(one_by_one, name), name
    for seq in run:
        seq.num_computed_tokens += 6
    bulk.check_invariants(list(run), all_decoding=True)


def test_a_decode_run_stops_before_the_first_iteration_whose_blocks_are_not_free():
    allocator = PagedAllocator(num_blocks=6, block_size=4)  # 5 usable: a [1], c [4], free 3, 2, 5
    a, c = _decoding_pair(allocator)
    run = allocator.allocate_decode_run([a, c], 6)
    assert run.num_iterations == 4  # iteration 4 needs two blocks, one is free: a step preempts there
    assert allocator.get_block_ids(0) == [1, 3] and allocator.get_block_ids(2) == [4, 2]
    assert allocator.free_block_ids() == [5]
    a.num_computed_tokens = c.num_computed_tokens = 8
    assert allocator.allocate_decode_run([c, a], 3) == DecodeRun(0)  # not even the first: nothing handed out
    assert allocator.free_block_ids() == [5]


def test_an_iteration_short_of_blocks_evicts_the_newest_as_the_running_loop_does():
    """Iteration 4 of _decoding_pair's run needs two blocks and one is free: a takes it, then c finds none,
    evicts the newest running request (itself) and nobody else is visited; the same as allocate_slots one
    request at a time with the running loop's preemption."""
    one_by_one, bulk = PagedAllocator(num_blocks=6, block_size=4), PagedAllocator(num_blocks=6, block_size=4)
    steps, run = list(_decoding_pair(one_by_one)), list(_decoding_pair(bulk))
    for allocator, seqs in ((one_by_one, steps), (bulk, run)):
        assert allocator.allocate_decode_run(seqs, 4).num_iterations == 4
        for seq in seqs:
            seq.num_computed_tokens += 4
    running = list(steps)
    for seq in steps:  # the running loop
        while seq in running and one_by_one.allocate_slots(seq, 1) is not Fit.NOW:
            one_by_one.free(running.pop())
    evicted = []

    def evict():
        evicted.append(run.pop())
        bulk.free(evicted[-1])
        return evicted[-1]

    iteration = bulk.allocate_decode_iteration(evict)
    assert [s.request.request_id for s in evicted] == [2] and len(running) == len(run) == 1
    assert iteration.growth == (0, 4, 0, 0, 0, 3)  # a's 9th and last token: 3 slots beyond it are internal
    assert bulk.get_block_ids(0) == one_by_one.get_block_ids(0) == [1, 3, 5]
    assert bulk.free_block_ids() == one_by_one.free_block_ids() == [2, 4]
    for name in ("num_allocated_slots", "num_internal_fragmentation_slots"):
        assert getattr(bulk, name) == getattr(one_by_one, name), name
    run[0].num_computed_tokens += 1
    bulk.check_invariants(run, all_decoding=True)


def test_free_of_an_unallocated_request_is_a_no_op():
    allocator = PagedAllocator(num_blocks=4, block_size=4)
    allocator.free(Seq(req(9, 3)))
    assert allocator.free_block_ids() == [1, 2, 3]


# With prefix caching -----------------------------------------------------------------------------------------------


def test_prefix_hit_shares_full_blocks_and_frees_cached_blocks_to_the_back():
    allocator = PagedAllocator(num_blocks=10, block_size=4, enable_prefix_caching=True)
    # 8 shared prefix tokens (one chunk of 8): blocks 0 and 1; the rest is unique to each request.
    a = Seq(req(0, 10, prefix=(7,)))
    assert allocator.get_num_cached_tokens(a) == 0
    assert admit(allocator, a) is Fit.NOW
    assert allocator.get_block_ids(0) == [1, 2, 3]
    # Blocks full of scheduled tokens are cached at allocation: 10 // 4 = 2 blocks.
    assert allocator.block_hash(1) is not None and allocator.block_hash(2) is not None
    assert allocator.block_hash(3) is None

    b = Seq(req(1, 12, prefix=(7,)))
    assert allocator.get_num_cached_tokens(b) == 8
    assert admit(allocator, b) is Fit.NOW
    assert b.num_computed_tokens == 12
    assert allocator.get_block_ids(1) == [1, 2, 4]
    assert allocator.ref_cnts() == [0, 2, 2, 1, 1, 0, 0, 0, 0, 0]
    assert allocator.block_hash(4) == (1, 2)  # b's third block: unique to b
    assert allocator.num_duplicate_token_slots == 8
    usage = slot_usage(allocator, a.num_computed_tokens + b.num_computed_tokens)
    assert usage.token == 10 + 12 - 8
    allocator.check_invariants([a, b])
    snap = allocator.snapshot([a, b])
    assert snap.shared[:5] == (False, True, True, False, False)
    assert snap.owner[:5] == (-1, 0, 0, 0, 1)
    assert snap.token[:5] == (0, 4, 4, 2, 4)

    # a's unhashed tail block goes to the front; its shared blocks only lose a reference.
    allocator.free(a)
    assert allocator.free_block_ids() == [3, 5, 6, 7, 8, 9]
    # b's blocks are all hashed: to the back, tail first, so the prefix is evicted last.
    allocator.free(b)
    assert allocator.free_block_ids() == [3, 5, 6, 7, 8, 9, 4, 2, 1]
    assert allocator.ref_cnts() == [0] * 10
    assert allocator.block_hash(1) is not None  # free but still cached
    allocator.check_invariants([])


def test_hit_removes_a_free_block_from_the_middle_of_the_queue():
    allocator = PagedAllocator(num_blocks=10, block_size=4, enable_prefix_caching=True)
    a = Seq(req(0, 10, prefix=(7,)))
    assert admit(allocator, a) is Fit.NOW  # [1, 2, 3]
    allocator.free(a)
    assert allocator.free_block_ids() == [3, 4, 5, 6, 7, 8, 9, 2, 1]
    e = Seq(req(1, 8))  # two full unique blocks, cached, then freed to the back
    assert admit(allocator, e) is Fit.NOW
    assert allocator.get_block_ids(1) == [3, 4]
    allocator.free(e)
    assert allocator.free_block_ids() == [5, 6, 7, 8, 9, 2, 1, 4, 3]

    c = Seq(req(2, 9, prefix=(7,)))
    assert allocator.get_num_cached_tokens(c) == 8
    assert admit(allocator, c) is Fit.NOW
    assert allocator.get_block_ids(2) == [1, 2, 5]
    assert allocator.free_block_ids() == [6, 7, 8, 9, 4, 3]
    allocator.check_invariants([c])


def test_cached_free_blocks_are_evicted_when_reused():
    allocator = PagedAllocator(num_blocks=6, block_size=4, enable_prefix_caching=True)
    a = Seq(req(0, 9, prefix=(7,)))
    assert admit(allocator, a) is Fit.NOW  # [1, 2, 3]; 1 and 2 cached
    allocator.free(a)
    assert allocator.free_block_ids() == [3, 4, 5, 2, 1]
    # Hit blocks that are free count as free capacity, as vLLM counts evictable blocks.
    big = Seq(req(1, 17))  # 5 blocks: takes 3, 4, 5, then evicts 2 and 1
    assert admit(allocator, big) is Fit.NOW
    assert allocator.get_block_ids(1) == [3, 4, 5, 2, 1]
    assert allocator.block_hash(2) == (1, 3) and allocator.block_hash(1) is None  # re-hashed for `big`, or not full
    allocator.free(big)
    assert allocator.get_num_cached_tokens(Seq(req(2, 9, prefix=(7,)))) == 0


def test_evictable_hits_count_against_free_blocks():
    allocator = PagedAllocator(num_blocks=5, block_size=4, enable_prefix_caching=True)
    a = Seq(req(0, 9, prefix=(7,)))
    assert admit(allocator, a) is Fit.NOW  # [1, 2] shared and cached, [3] holds its own last token
    allocator.free(a)
    holder = Seq(req(1, 4))
    assert admit(allocator, holder) is Fit.NOW  # takes 3
    assert allocator.free_block_ids() == [4, 2, 1]
    b = Seq(req(2, 16, prefix=(7,)))  # hits 8 tokens in two free blocks, needs 2 more: 4 > 3 free
    assert allocator.get_num_cached_tokens(b) == 8
    assert admit(allocator, b) is Fit.LATER
    assert allocator.free_block_ids() == [4, 2, 1]
    allocator.check_invariants([holder])


def test_equal_prefixes_share_only_full_blocks_before_the_last_prompt_token():
    allocator = PagedAllocator(num_blocks=10, block_size=4, enable_prefix_caching=True)
    assert admit(allocator, Seq(req(0, 8, prefix=(7,)))) is Fit.NOW
    # The same prefix id covers all 8 prompt tokens, but a prompt's last token is always its own
    # (Request.num_shared_prefix_tokens): only block 0 is shared, block 1 is recomputed.
    twin = Seq(req(1, 8, prefix=(7,)))
    assert allocator.get_num_cached_tokens(twin) == 4
    assert admit(allocator, twin) is Fit.NOW
    assert allocator.get_block_ids(1) == [1, 3]
    assert allocator.block_hash(3) != allocator.block_hash(2)


def test_preempted_request_finds_its_own_blocks_again():
    allocator = PagedAllocator(num_blocks=10, block_size=4, enable_prefix_caching=True)
    a = Seq(req(0, 6, output_len=10))
    assert admit(allocator, a) is Fit.NOW
    assert allocator.get_block_ids(0) == [1, 2]
    while a.num_computed_tokens < 10:
        assert decode(allocator, a) is Fit.NOW
    assert (a.num_computed_tokens, a.num_tokens) == (10, 11)
    assert allocator.get_block_ids(0) == [1, 2, 3]
    assert [allocator.block_hash(b) for b in (1, 2, 3)] == [(0, 0), (0, 1), None]

    # Preempt: free, reset (the output generated so far stays in num_tokens).
    allocator.free(a)
    a.num_computed_tokens = 0
    assert allocator.free_block_ids() == [3, 4, 5, 6, 7, 8, 9, 2, 1]
    other = Seq(req(1, 3))
    assert admit(allocator, other) is Fit.NOW
    assert allocator.get_block_ids(1) == [3]

    assert allocator.get_num_cached_tokens(a) == 8
    assert admit(allocator, a) is Fit.NOW
    assert a.num_computed_tokens == 11
    assert allocator.get_block_ids(0) == [1, 2, 4]
    allocator.check_invariants([a, other])


def test_equal_content_blocks_coexist_and_the_oldest_serves_hits():
    allocator = PagedAllocator(num_blocks=10, block_size=4, enable_prefix_caching=True)
    # 16 shared tokens (4 blocks), then each prompt's own last token.
    a = Seq(req(0, 17, prefix=(9,), chunk=16))
    b = Seq(req(1, 17, prefix=(9,), chunk=16))
    assert admit(allocator, a, num_new_tokens=8) is Fit.NOW  # chunked prefill: [1, 2]
    assert admit(allocator, b, num_new_tokens=9) is Fit.NOW  # hits 1, 2; computes the rest
    assert allocator.get_block_ids(1) == [1, 2, 3, 4, 5]
    assert allocator.allocate_slots(a, 8) is Fit.NOW  # a computes the same tokens again
    a.num_computed_tokens = 16
    assert allocator.get_block_ids(0) == [1, 2, 6, 7]
    assert allocator.block_hash(6) == allocator.block_hash(3)
    allocator.check_invariants([a, b])
    probe = Seq(req(2, 18, prefix=(9,), chunk=16))
    assert allocator.get_num_cached_tokens(probe) == 16

    allocator.free(b)
    # b's own last block (no hash) goes to the front, its cached blocks to the back.
    assert allocator.free_block_ids() == [5, 8, 9, 4, 3]
    filler = Seq(req(3, 16))  # takes 5, 8, 9 and evicts 4
    assert admit(allocator, filler) is Fit.NOW
    assert allocator.get_block_ids(3) == [5, 8, 9, 4]
    # The hash of block 4 now lives on in block 7 alone; block 3 still serves the third.
    assert allocator.get_num_cached_tokens(probe) == 16
    allocator.free(a)
    allocator.check_invariants([filler])


def test_prefix_blocks_straddling_chunks_and_offsets():
    """Blocks of 6 over chunks of 8: a block's content is named by the chunk ids covering it and its offset."""
    allocator = PagedAllocator(num_blocks=20, block_size=6, enable_prefix_caching=True)
    a = Seq(req(0, 30, prefix=(1, 2, 3)))  # 24 shared tokens: blocks 0..3 shared, block 4 unique
    assert admit(allocator, a) is Fit.NOW
    same_first_chunks = Seq(req(1, 30, prefix=(1, 2, 4)))  # differs from token 16: blocks 0, 1 match (0..11)
    assert allocator.get_num_cached_tokens(same_first_chunks) == 12
    other_first = Seq(req(2, 30, prefix=(5, 2, 3)))
    assert allocator.get_num_cached_tokens(other_first) == 0
    longer = Seq(req(3, 40, prefix=(1, 2, 3, 8)))
    assert allocator.get_num_cached_tokens(longer) == 24


def _turn(request_id: int, prompt_len: int, output_len: int, ids: tuple[int, ...], prefix_len: int | None) -> Seq:
    """A conversation's turn: its prompt and answer are the session's tokens, named by ``ids`` (chunks of 4)."""
    return Seq(Request(request_id, 0.0, prompt_len, output_len, prefix_hashes=ids, prefix_chunk_len=4,
                       prefix_len=prefix_len))


def _serve(allocator: PagedAllocator, seq: Seq) -> None:
    """Admit, decode to the last token whose KV is written, free (as a finished request)."""
    assert admit(allocator, seq) is Fit.NOW
    while seq.num_computed_tokens < seq.request.num_kv_tokens:
        assert decode(allocator, seq) is Fit.NOW
    allocator.free(seq)


def test_a_conversation_turn_finds_the_last_turns_answer_blocks_cached():
    """Turn 1: 6 prompt tokens and a 4-token answer, all of it the session's (prefix_len 10); its KV holds positions
    0..8 in blocks [1, 2, 3]. Turn 2's prompt repeats those 10 tokens and adds 3: its first two blocks, answer tokens
    6 and 7 among them, are turn 1's blocks 1 and 2; block 2 of the sequence (positions 8..11) was never full."""
    allocator = PagedAllocator(num_blocks=10, block_size=4, enable_prefix_caching=True)
    first = _turn(0, 6, 4, (10, 11, 12), prefix_len=10)
    assert admit(allocator, first) is Fit.NOW
    assert allocator.get_block_ids(0) == [1, 2]
    while first.num_computed_tokens < first.request.num_kv_tokens:
        assert decode(allocator, first) is Fit.NOW
    assert allocator.get_block_ids(0) == [1, 2, 3]
    # Block 2 filled while decoding: named by content (interned 1), not (request_id, 1); block 3 is not full.
    assert [allocator.block_hash(b) for b in (1, 2, 3)] == [0, 1, None]
    allocator.free(first)
    assert allocator.free_block_ids() == [3, 4, 5, 6, 7, 8, 9, 2, 1]

    second = _turn(1, 13, 2, (10, 11, 12, 13), prefix_len=15)
    assert allocator.peek_num_cached_tokens(second.request) == 8
    assert allocator.get_num_cached_tokens(second) == 8
    assert admit(allocator, second) is Fit.NOW
    assert allocator.get_block_ids(1) == [1, 2, 3, 4]
    assert allocator.free_block_ids() == [5, 6, 7, 8, 9]
    allocator.check_invariants([second])


def test_without_prefix_len_an_answer_is_the_requests_own():
    """The same two turns with a trace's semantics (ids name the prompt but its last token): turn 1's answer
    blocks are (request_id, j), so turn 2 finds only block 0 cached."""
    allocator = PagedAllocator(num_blocks=10, block_size=4, enable_prefix_caching=True)
    _serve(allocator, _turn(0, 6, 4, (10, 11, 12), prefix_len=None))
    assert [allocator.block_hash(b) for b in (1, 2, 3)] == [0, (0, 1), None]
    second = _turn(1, 13, 2, (10, 11, 12, 13), prefix_len=None)
    assert allocator.peek_num_cached_tokens(second.request) == 4
    assert allocator.get_num_cached_tokens(second) == 4


def test_peek_changes_nothing_and_agrees_with_the_lookup():
    allocator = PagedAllocator(num_blocks=12, block_size=4, enable_prefix_caching=True)
    _serve(allocator, _turn(0, 9, 6, (1, 2, 3, 4), prefix_len=15))
    holder = _turn(1, 17, 3, (1, 2, 3, 4, 5), prefix_len=20)  # hits 12 tokens, holds the blocks it computes
    assert admit(allocator, holder) is Fit.NOW
    probes = [_turn(2 + i, p, 1, ids, prefix_len=None)
              for i, (p, ids) in enumerate([(17, (1, 2, 3, 4, 5)), (30, (1, 2, 9)), (3, (1,)), (40, (7, 2, 3))])]
    before = (allocator.free_block_ids(), allocator.ref_cnts(), dict(allocator._prefix_block_hashes),
              {k: list(v.block_hashes) for k, v in allocator._hashes.items()})
    peeked = [allocator.peek_num_cached_tokens(p.request) for p in probes]
    after = (allocator.free_block_ids(), allocator.ref_cnts(), dict(allocator._prefix_block_hashes),
             {k: list(v.block_hashes) for k, v in allocator._hashes.items()})
    assert after == before
    assert peeked == [allocator.get_num_cached_tokens(p) for p in probes] == [16, 8, 0, 0]
    assert PagedAllocator(4, 4).peek_num_cached_tokens(probes[0].request) == 0  # no prefix caching


def test_make_allocator_paged():
    allocator = make_allocator("paged", num_slots=15_728, block_size=16, max_model_len=2048)
    assert isinstance(allocator, PagedAllocator)
    assert (allocator.num_blocks, allocator.num_slots) == (983, 15_728)
    assert len(allocator.snapshot([]).owner) == 983
    with pytest.raises(KvlabError, match="unknown memory strategy 'pages'"):
        make_allocator("pages", num_slots=100, block_size=16, max_model_len=64)
    with pytest.raises(KvlabError, match="at least 2 blocks"):
        make_allocator("paged", num_slots=16, block_size=16, max_model_len=64)
    with pytest.raises(KvlabError, match="block_size"):
        make_allocator("paged", num_slots=1000, block_size=128, max_model_len=64)


# Random runs ---------------------------------------------------------------------------------------------------------


def _state(allocator: PagedAllocator, seqs: list[Seq]):
    return (
        allocator.free_block_ids(),
        allocator.ref_cnts(),
        {s.request.request_id: allocator.get_block_ids(s.request.request_id) for s in seqs},
        [allocator.block_hash(b) for b in range(allocator.num_blocks)],
    )


@settings(max_examples=120, deadline=None)
@given(
    num_blocks=st.integers(2, 40),
    block_size=st.sampled_from([1, 2, 4, 16]),
    enable_prefix_caching=st.booleans(),
    requests=st.lists(
        st.tuples(st.integers(1, 60), st.integers(1, 30), st.lists(st.integers(0, 2), max_size=3)),
        min_size=1,
        max_size=12,
    ),
    ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10**6), st.integers(1, 40)), max_size=120),
)
def test_random_admit_grow_preempt_free(num_blocks, block_size, enable_prefix_caching, requests, ops):
    """A little scheduler drives random admissions, chunked prefills, decodes, preemptions and finishes."""
    allocator = PagedAllocator(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching)
    waiting = [Seq(req(i, p, o, prefix=tuple(h), chunk=4)) for i, (p, o, h) in enumerate(requests)]
    waiting = [s for s in waiting if not allocator.why_never_fits(s.request)]
    running: list[Seq] = []
    for action, pick, chunk in ops:
        if action == 0 and waiting:
            seq = waiting[0]
            num_cached = allocator.get_num_cached_tokens(seq)
            assert num_cached % block_size == 0 and num_cached < seq.num_tokens
            before = _state(allocator, running)
            num_new = min(chunk, seq.num_tokens - num_cached)
            need = allocator.admission(seq)
            fit = allocator.allocate_slots(seq, num_new, num_cached)
            assert fit is not Fit.NEVER
            if not num_cached:  # what the lab says admission takes is what the allocator does
                assert (fit is Fit.NOW) == (need.num_slots <= need.num_room_slots), need
                assert need.num_asked_slots == seq.num_tokens and not need.in_one_piece
                if fit is Fit.NOW and num_new == seq.num_tokens:
                    assert len(allocator.get_block_ids(seq.request.request_id)) * block_size == need.num_slots
            if fit is Fit.LATER:
                assert _state(allocator, running) == before
            else:
                seq.num_computed_tokens = num_cached + num_new
                running.append(waiting.pop(0))
        elif action == 1 and running:
            seq = running[pick % len(running)]
            num_new = min(chunk, seq.num_tokens - seq.num_computed_tokens)
            before = _state(allocator, running)
            fit = allocator.allocate_slots(seq, num_new)
            if fit is Fit.LATER:
                assert _state(allocator, running) == before
            else:
                assert fit is Fit.NOW
                seq.num_computed_tokens += num_new
        elif action == 2 and running:
            # Preempt the newest: recompute later from scratch, keeping the output generated so far.
            seq = running.pop()
            allocator.free(seq)
            seq.num_computed_tokens = 0
            waiting.insert(0, seq)
        # Every request whose computed tokens caught up samples one token; finished requests leave.
        for seq in list(running):
            if seq.num_computed_tokens == seq.num_tokens:
                seq.num_tokens += 1
                if seq.num_tokens - seq.request.prompt_len == seq.request.num_output_tokens:
                    allocator.free(seq)
                    running.remove(seq)
        allocator.check_invariants(running)
        usage = slot_usage(allocator, sum(s.num_computed_tokens for s in running))
        assert usage.num_slots == num_blocks * block_size
    for seq in running:
        allocator.free(seq)
    assert allocator.num_free_blocks == num_blocks - 1
    assert allocator.num_allocated_slots == 0
    assert allocator.num_internal_fragmentation_slots == 0
    allocator.check_invariants([])


def test_a_private_block_is_findable_once_its_request_is_preempted_and_never_when_it_finished():
    allocator = PagedAllocator(num_blocks=10, block_size=4, enable_prefix_caching=True)
    cached = allocator.prefix_pool.cached_block_hash_to_block
    a = Seq(req(0, 12))  # 12 prompt tokens of 16: three private blocks, full and hashed
    assert admit(allocator, a) is Fit.NOW
    assert [allocator.block_hash(b) for b in (1, 2, 3)] == [(0, 0), (0, 1), (0, 2)]
    assert not cached  # hashed, but nobody else can hit them: not in the dict while a runs
    allocator.free(a)  # preempted (4 tokens still to sample): it may come back for them
    assert allocator.free_block_ids() == [4, 5, 6, 7, 8, 9, 3, 2, 1]
    assert sorted(cached.values()) == [1, 2, 3]
    a.num_computed_tokens = 0
    assert allocator.get_num_cached_tokens(a) == 8  # its own blocks again (up to its last token)
    assert admit(allocator, a) is Fit.NOW
    assert allocator.get_block_ids(0) == [1, 2, 4]  # (block 3 is not hit: the last token is recomputed)
    a.num_tokens = 16  # it finished: its blocks go back hashed (to the back), but its new block stays unlisted
    allocator.free(a)
    assert allocator.free_block_ids() == [5, 6, 7, 8, 9, 3, 4, 2, 1]
    assert allocator.block_hash(4) == (0, 2) and 4 not in cached.values()
    allocator.check_invariants([])
    b = Seq(req(1, 24))  # takes every free block, evicting a's
    assert admit(allocator, b) is Fit.NOW
    assert allocator.get_block_ids(1) == [5, 6, 7, 8, 9, 3]
    allocator.check_invariants([b])

"""Contiguous reservation (max, pow2, oracle): slab sizes, Fit outcomes, counters, snapshot, random runs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from seqs import Seq

from kvlab.errors import KvlabError
from kvlab.memory import ContiguousAllocator, Fit, make_allocator, slot_usage
from kvlab.memory.base import Admission
from kvlab.workload.request import Request


def req(request_id: int, prompt_len: int, output_len: int, max_tokens: int | None = None) -> Request:
    return Request(request_id, 0.0, prompt_len, output_len, max_tokens)


@pytest.mark.parametrize(
    ("policy", "request_", "slab", "chunk"),
    [
        # max: max_model_len unless the client capped the answer.
        ("max", req(0, 100, 25), 2048, 2048),
        ("max", req(0, 100, 25, max_tokens=50), 150, 256),
        ("max", req(0, 2000, 25, max_tokens=500), 2048, 2048),  # capped at max_model_len
        # pow2: output space rounded to a power of two (25 -> 32).
        ("pow2", req(0, 100, 25), 132, 256),
        ("pow2", req(0, 161, 338), 161 + 512, 1024),
        ("pow2", req(0, 100, 1), 101, 128),
        ("pow2", req(0, 1500, 900), 2048, 2048),  # 1500 + 1024 capped at max_model_len
        ("pow2", req(0, 100, 100, max_tokens=20), 132, 256),  # the answer stops at 20
        # oracle: exactly the slots it will write (the last sampled token is never written).
        ("oracle", req(0, 100, 25), 124, 128),
        ("oracle", req(0, 10, 100, max_tokens=20), 29, 32),
    ],
)
def test_slab_sizes(policy, request_, slab, chunk):
    request = request_
    allocator = ContiguousAllocator(16_384, policy, max_model_len=2048)
    assert allocator.slab_size(request) == slab
    seq = Seq(request)
    assert allocator.admission(seq) == Admission(slab, chunk, 16_384, True)
    assert allocator.allocate_slots(seq, request.prompt_len) is Fit.NOW
    placed = allocator.get_slab(request.request_id)
    assert (placed.num_slots, placed.chunk_size) == (slab, chunk)
    assert allocator.num_allocated_slots == slab
    assert allocator.num_internal_fragmentation_slots == max(0, slab - request.num_kv_tokens)
    assert allocator.num_overhead_slots == chunk - slab
    assert allocator.num_duplicate_token_slots == 0
    allocator.free(seq)
    assert (allocator.num_allocated_slots, allocator.num_internal_fragmentation_slots) == (0, 0)
    assert allocator.num_overhead_slots == 0
    assert allocator.buddy.free_chunks() == [(0, 16_384)]


def test_slot_states_of_one_slab():
    allocator = ContiguousAllocator(1024, "max", max_model_len=512)
    seq = Seq(req(7, 100, 50, max_tokens=300))  # slab 400 in a 512 chunk; it will write 149 slots
    assert allocator.get_num_slots(7) == 0
    assert allocator.allocate_slots(seq, 100) is Fit.NOW
    assert allocator.get_num_slots(7) == 400
    seq.num_computed_tokens = 100
    usage = slot_usage(allocator, 100)
    assert (usage.token, usage.reserved, usage.internal_fragmentation, usage.overhead, usage.free) == (
        100,
        49,
        251,
        112,
        512,
    )
    allocator.check_invariants([seq])


def test_decode_stays_in_the_slab_and_growing_past_it_is_a_scheduler_bug():
    allocator = ContiguousAllocator(1024, "oracle", max_model_len=512)
    seq = Seq(req(0, 10, 5))  # writes 14 slots
    assert allocator.allocate_slots(seq, 10) is Fit.NOW
    for num_computed in range(10, 14):
        seq.num_computed_tokens = num_computed
        assert allocator.allocate_slots(seq, 1) is Fit.NOW
    assert allocator.buddy.allocated_chunks() == [(0, 16)]
    seq.num_computed_tokens = 14
    with pytest.raises(AssertionError, match="slab"):
        allocator.allocate_slots(seq, 1)


def test_fit_later_and_never():
    # 1,500 slots: regions 1024 + 256 + 128 + 64 + 16 + 8 + 4; the largest slab is 1024.
    allocator = ContiguousAllocator(1500, "max", max_model_len=2048)
    huge = Seq(req(0, 10, 10))  # max_model_len 2048 > 1024
    assert allocator.allocate_slots(huge, 10) is Fit.NEVER
    assert allocator.why_never_fits(huge.request)

    a = Seq(req(1, 10, 10, max_tokens=990))  # slab 1000 -> chunk 1024
    b = Seq(req(2, 10, 10, max_tokens=500))  # slab 510 -> chunk 512: only 476 slots outside the 1024 region
    assert not allocator.why_never_fits(b.request)
    assert allocator.allocate_slots(a, 10) is Fit.NOW
    assert allocator.buddy.free_chunks()[0] == (1024, 256)
    assert allocator.num_allocated_slots == 1000
    assert allocator.allocate_slots(b, 10) is Fit.LATER  # 476 free slots, but no 512-slot chunk
    assert allocator.num_allocated_slots == 1000
    allocator.free(a)
    assert allocator.allocate_slots(b, 10) is Fit.NOW
    assert allocator.get_slab(2).address == 0


def test_free_of_an_unallocated_request_is_a_no_op():
    allocator = ContiguousAllocator(64, "oracle", max_model_len=64)
    allocator.free(Seq(req(3, 4, 4)))
    assert allocator.buddy.free_chunks() == [(0, 64)]


def test_snapshot_exact_display_blocks():
    allocator = ContiguousAllocator(64, "max", max_model_len=64, display_block_size=16)
    a = Seq(req(5, 10, 4, max_tokens=10))  # slab 20, chunk 32 at 0, writes 13 slots
    b = Seq(req(6, 3, 2))  # max_tokens unset: slab = max_model_len 64 -> never fits next to a
    assert allocator.allocate_slots(a, 10) is Fit.NOW
    assert allocator.allocate_slots(b, 3) is Fit.LATER
    a.num_computed_tokens = 11
    snap = allocator.snapshot([a, b])
    assert snap.block_size == 16
    assert snap.owner == (5, 5, -1, -1)
    assert snap.token == (11, 0, 0, 0)
    assert snap.reserved == (2, 0, 0, 0)
    assert snap.internal_fragmentation == (3, 4, 0, 0)
    assert snap.overhead == (0, 12, 0, 0)
    assert snap.shared == (False,) * 4


def test_snapshot_small_chunks_share_a_display_block():
    allocator = ContiguousAllocator(32, "oracle", max_model_len=32)
    a, b = Seq(req(1, 3, 2)), Seq(req(2, 4, 1))  # 4 and 4 slots (kv 4, 4) -> chunks at 0 and 4
    assert allocator.allocate_slots(a, 3) is Fit.NOW
    assert allocator.allocate_slots(b, 4) is Fit.NOW
    b.num_computed_tokens = 4
    snap = allocator.snapshot([a, b])
    assert snap.owner == (1, -1)
    assert (snap.token, snap.reserved, snap.overhead) == ((4, 0), (4, 0), (0, 0))
    allocator.check_invariants([a, b])


def test_make_allocator_contiguous():
    allocator = make_allocator("pow2", num_slots=15_728, block_size=16, max_model_len=2048)
    assert isinstance(allocator, ContiguousAllocator)
    assert allocator.policy == "pow2"
    assert allocator.display_block_size == 16
    assert len(allocator.snapshot([]).owner) == 983
    with pytest.raises(KvlabError, match="prefix caching"):
        make_allocator("max", num_slots=100, block_size=16, max_model_len=64, enable_prefix_caching=True)
    with pytest.raises(KvlabError, match="unknown reservation policy 'min'"):
        ContiguousAllocator(100, "min", 64)


@settings(max_examples=80, deadline=None)
@given(
    policy=st.sampled_from(["max", "pow2", "oracle"]),
    num_slots=st.integers(64, 6000),
    max_model_len=st.integers(32, 2048),
    requests=st.lists(
        st.tuples(st.integers(1, 600), st.integers(1, 600), st.one_of(st.none(), st.integers(1, 600))),
        min_size=1,
        max_size=25,
    ),
    picks=st.lists(st.integers(0, 10**6), min_size=60, max_size=60),
)
def test_random_admit_grow_free(policy, num_slots, max_model_len, requests, picks):
    allocator = ContiguousAllocator(num_slots, policy, max_model_len)
    waiting = [
        Seq(req(i, p, o, m))
        for i, (p, o, m) in enumerate(requests)
        if p + min(o, m or o) <= max_model_len and not allocator.why_never_fits(req(i, p, o, m))
    ]
    running: list[Seq] = []
    for pick in picks:
        action = pick % 3
        if action == 0 and waiting:
            seq = waiting[0]
            need = allocator.admission(seq)
            fit = allocator.allocate_slots(seq, seq.request.prompt_len)
            assert fit is not Fit.NEVER
            # What the lab says admission takes is what the allocator does: fits iff the chunk is free, and takes it.
            assert (fit is Fit.NOW) == (need.num_slots <= need.num_room_slots), need
            if fit is Fit.NOW:
                slab = allocator.get_slab(seq.request.request_id)
                assert (slab.num_slots, slab.chunk_size) == (need.num_asked_slots, need.num_slots)
                waiting.pop(0)
                seq.num_computed_tokens = seq.request.prompt_len
                running.append(seq)
        elif action == 1 and running:
            seq = running[pick % len(running)]
            if seq.num_computed_tokens < seq.request.num_kv_tokens:
                assert allocator.allocate_slots(seq, 1) is Fit.NOW
                seq.num_computed_tokens += 1
        elif action == 2 and running:
            allocator.free(running.pop(pick % len(running)))
        allocator.check_invariants(running)
    for seq in running:
        allocator.free(seq)
    assert allocator.buddy.free_chunks() == list(allocator.buddy.regions)
    assert allocator.num_allocated_slots == allocator.num_overhead_slots == 0

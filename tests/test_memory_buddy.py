"""The buddy allocator: exact addresses on tiny spaces, the paper's 15,728-slot cache, random operation sequences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.errors import KvlabError
from kvlab.memory.base import Fit
from kvlab.memory.buddy import BuddyAllocator, next_pow2


def test_next_pow2():
    assert [next_pow2(n) for n in (1, 2, 3, 4, 5, 25, 32, 33, 1000)] == [1, 2, 4, 4, 8, 32, 32, 64, 1024]


def test_split_and_coalesce_exact_addresses():
    buddy = BuddyAllocator(16)
    assert buddy.free_chunks() == [(0, 16)]

    # 3 slots -> a 4-slot chunk: 16 splits into 8+8, the lower 8 into 4+4.
    assert buddy.allocate(3) == 0
    assert buddy.free_chunks() == [(4, 4), (8, 8)]
    assert buddy.chunk_size(0) == 4

    # An exact fit takes the free 4-slot chunk rather than splitting the 8.
    assert buddy.allocate(4) == 4
    assert buddy.free_chunks() == [(8, 8)]

    assert buddy.allocate(1) == 8
    assert buddy.free_chunks() == [(9, 1), (10, 2), (12, 4)]
    assert buddy.largest_free_chunk == 4
    assert buddy.num_free_slots == 7

    # Freeing 8 merges with 9, then 10, then 12: back to one 8-slot chunk.
    assert buddy.free(8) == 1
    assert buddy.free_chunks() == [(8, 8)]
    # 0's buddy (4) is allocated: no merge.
    buddy.free(0)
    assert buddy.free_chunks() == [(0, 4), (8, 8)]
    buddy.free(4)
    assert buddy.free_chunks() == [(0, 16)]
    assert buddy.num_free_slots == 16


def test_lowest_address_first_among_equal_chunks():
    buddy = BuddyAllocator(16)
    a, b, c, d = (buddy.allocate(4) for _ in range(4))
    assert (a, b, c, d) == (0, 4, 8, 12)
    buddy.free(12)
    buddy.free(4)
    assert buddy.allocate(4) == 4


def test_the_paper_cache_holds_seven_2048_slot_slabs():
    # OPT-13B on an A100-40GB with 12 GB of KV cache: 15,728 slots (the paper's Table 1 / §6.2 setup).
    buddy = BuddyAllocator(15_728)
    assert buddy.regions == (
        (0, 8192),
        (8192, 4096),
        (12288, 2048),
        (14336, 1024),
        (15360, 256),
        (15616, 64),
        (15680, 32),
        (15712, 16),
    )
    assert buddy.largest_region == 8192
    addresses = []
    for _ in range(7):
        assert buddy.fit(2048) is Fit.NOW
        addresses.append(buddy.allocate(2048))
    # The smallest region that fits is used first (no split), then the 8192 and 4096 regions are split.
    assert addresses == [12288, 8192, 10240, 0, 2048, 4096, 6144]
    assert buddy.fit(2048) is Fit.LATER
    assert buddy.largest_free_chunk == 1024
    assert buddy.num_free_slots == 15_728 - 7 * 2048
    assert buddy.fit(1024) is Fit.NOW
    for address in addresses:
        buddy.free(address)
    assert buddy.free_chunks() == list(buddy.regions)


def test_fit_never_beyond_the_largest_region():
    buddy = BuddyAllocator(15_728)
    assert buddy.fit(8192) is Fit.NOW
    assert buddy.fit(8193) is Fit.NEVER  # rounds to 16,384 > 8,192 even though 15,728 slots exist
    with pytest.raises(ValueError):
        buddy.allocate(8193)


def test_regions_never_merge():
    buddy = BuddyAllocator(12)  # 8 + 4
    # The 4-slot region fits exactly and goes first; then the 8-slot region splits.
    assert [buddy.allocate(4) for _ in range(3)] == [8, 0, 4]
    assert buddy.fit(1) is Fit.LATER
    for address in (8, 0, 4):
        buddy.free(address)
    assert buddy.free_chunks() == [(0, 8), (8, 4)]


def test_bad_size():
    with pytest.raises(KvlabError, match="num_slots=0"):
        BuddyAllocator(0)


def check_buddy(buddy: BuddyAllocator) -> None:
    """Chunks tile the space, are aligned, and no two free buddies are left unmerged."""
    chunks = sorted(buddy.free_chunks() + buddy.allocated_chunks())
    end = 0
    for address, size in chunks:
        assert address == end
        assert address % size == 0
        end += size
    assert end == buddy.num_slots
    free = set(buddy.free_chunks())
    for address, size in free:
        assert (address ^ size, size) not in free, f"free buddies ({address}, {size}) not merged"
    assert buddy.num_free_slots == sum(size for _, size in free)
    largest = max((size for _, size in free), default=0)
    assert buddy.largest_free_chunk == largest


@settings(max_examples=150, deadline=None)
@given(
    num_slots=st.integers(1, 5000),
    ops=st.lists(st.tuples(st.booleans(), st.integers(1, 5000), st.integers(0, 10**6)), max_size=80),
)
def test_random_operations_keep_the_space_tiled(num_slots, ops):
    buddy = BuddyAllocator(num_slots)
    live: list[int] = []
    for is_alloc, size, pick in ops:
        if is_alloc or not live:
            fit = buddy.fit(size)
            expected_fit = (
                Fit.NEVER
                if next_pow2(size) > buddy.largest_region
                else Fit.NOW
                if buddy.largest_free_chunk >= next_pow2(size)
                else Fit.LATER
            )
            assert fit is expected_fit
            if fit is Fit.NOW:
                before = buddy.free_chunks()
                smallest = min(s for _, s in before if s >= next_pow2(size))
                address = buddy.allocate(size)
                # Best fit by chunk size, then the lowest address.
                assert address == min(a for a, s in before if s == smallest)
                assert buddy.chunk_size(address) == next_pow2(size)
                live.append(address)
        else:
            buddy.free(live.pop(pick % len(live)))
        check_buddy(buddy)
    for address in live:
        buddy.free(address)
    assert buddy.free_chunks() == list(buddy.regions)

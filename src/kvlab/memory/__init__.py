"""Memory strategies: contiguous slabs (max, pow2, oracle) placed by a buddy allocator, and paged blocks.

Every strategy implements ``kvlab.memory.base.KVAllocator``; ``make_allocator`` builds one by name from the
simulator's plain numbers.
"""

from __future__ import annotations

from kvlab.errors import KvlabError
from kvlab.memory.base import BlockSnapshot, Fit, KVAllocator, Sequence, SlotUsage, slot_usage
from kvlab.memory.buddy import BuddyAllocator
from kvlab.memory.contiguous import SLAB_POLICIES, ContiguousAllocator
from kvlab.memory.hybrid import HybridAllocator
from kvlab.memory.paged import PagedAllocator

ALLOCATORS: dict[str, type] = {
    "max": ContiguousAllocator,
    "pow2": ContiguousAllocator,
    "oracle": ContiguousAllocator,
    "paged": PagedAllocator,
}


def make_allocator(
    name: str,
    *,
    num_slots: int,
    block_size: int,
    max_model_len: int,
    enable_prefix_caching: bool = False,
    kv_cache_groups: tuple[tuple[str, int, int, int, int], ...] = (),
    mamba_align: bool = False,
) -> KVAllocator:
    """The allocator called ``name`` over ``num_slots`` KV slots.

    Paged: ``num_slots // block_size`` blocks (block 0 is the null block); with several ``kv_cache_groups``
    ((kind, state_blocks, sliding_window, admission_blocks, ...) each: kvlab.memory.hybrid.GroupSpec) a request takes
    blocks in every group (kvlab.memory.hybrid: prefix-cache hits are not simulated there), its Mamba groups in
    vLLM's mamba_cache_mode 'align' where ``mamba_align`` (a strategy with prefix caching, CacheConfig.mamba_align).
    Contiguous: the whole slot
    space, shown in display blocks of ``block_size`` slots so that its grid lines up with the paged one; with
    several ``kv_cache_groups`` a request's slab covers every group (kvlab.memory.contiguous).
    """
    if name not in ALLOCATORS:
        raise KvlabError(f"unknown memory strategy {name!r}: expected one of {', '.join(ALLOCATORS)}")
    if block_size < 1:
        raise KvlabError(f"block_size must be at least 1, got {block_size}")
    if block_size > max_model_len:
        raise KvlabError(f"block_size ({block_size}) must not exceed max_model_len ({max_model_len})")
    if num_slots < 1:
        raise KvlabError(f"the KV cache must hold at least 1 slot, got num_slots={num_slots}")
    if name == "paged" and len(kv_cache_groups) > 1:
        return HybridAllocator(num_slots // block_size, block_size, kv_cache_groups, max_model_len=max_model_len,
                               mamba_align=mamba_align)
    if name == "paged":
        return PagedAllocator(
            num_slots // block_size,
            block_size,
            enable_prefix_caching=enable_prefix_caching,
            max_model_len=max_model_len,
        )
    if enable_prefix_caching:
        raise KvlabError(f"prefix caching needs the paged memory strategy, not {name!r}")
    return ContiguousAllocator(num_slots, name, max_model_len, display_block_size=block_size,
                               kv_cache_groups=kv_cache_groups)


__all__ = [
    "ALLOCATORS",
    "SLAB_POLICIES",
    "BlockSnapshot",
    "BuddyAllocator",
    "ContiguousAllocator",
    "Fit",
    "HybridAllocator",
    "KVAllocator",
    "PagedAllocator",
    "Sequence",
    "SlotUsage",
    "make_allocator",
    "slot_usage",
]

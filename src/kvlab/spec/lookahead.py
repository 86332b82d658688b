"""The EAGLE family's lookahead slots: vLLM's scheduler passes ``num_lookahead_tokens`` (k for eagle, eagle3 and the
MTP heads, 0 otherwise) to every running request's allocate_slots (vllm/v1/core/sched/scheduler.py; a request
being admitted with nothing computed gets 0), and the KV cache manager reserves that many slots beyond the
scheduled tokens, up to max_model_len (vllm/v1/core/kv_cache_manager.py: allocate_slots), for the drafter's KV.

An allocator class chosen once when the method reserves them (kvlab.sim): the scheduler's running loop and the
plain allocators pay nothing for it.
"""

from __future__ import annotations

from kvlab.memory.base import Fit, Sequence
from kvlab.memory.paged import PagedAllocator
from kvlab.offload.allocator import OffloadingPagedAllocator


class LookaheadSlots:
    """Put before a paged allocator class; set ``num_lookahead_tokens`` after making it."""

    num_lookahead_tokens = 0

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int = 0,
                       watermark_blocks: int = 0) -> Fit:
        if seq.request.request_id in self._block_tables:  # type: ignore[attr-defined]  # (running: it holds blocks)
            room = self.max_model_len - seq.num_computed_tokens  # type: ignore[attr-defined]
            num_new_tokens = min(num_new_tokens + self.num_lookahead_tokens, room)  # (the loop leaves room for 1)
        return super().allocate_slots(seq, num_new_tokens, num_cached_tokens, watermark_blocks)  # type: ignore[misc]


class LookaheadPagedAllocator(LookaheadSlots, PagedAllocator):
    """The paged allocator with the EAGLE family's lookahead slots."""


class LookaheadOffloadingAllocator(LookaheadSlots, OffloadingPagedAllocator):
    """The paged allocator with a CPU tier behind it (kvlab.offload) and the lookahead slots."""

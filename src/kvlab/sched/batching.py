"""When may a waiting request join the running batch? One function per batching policy.

Each is a generator the scheduler drains after its running loop: it admits requests from the front of the
waiting queue (allocating their memory and calling ``scheduler.admit``) and yields
``(seq, num_new_tokens, num_cached_tokens)`` for each, ``num_new_tokens`` being what it computes this iteration.

The contract that lets the scheduler run iterations in bulk: a policy's decision depends only on the queue, the
running requests, the token budget and the memory, and it admits from the front of the queue. If it admits
nobody in an iteration in which every running request decodes, it would admit nobody in the iterations after it
either, as long as nothing finishes (decoding only takes memory, and the seats and the budget stay the same),
even as requests arrive (they join the queue behind the head that waits).
"""

from __future__ import annotations

from collections.abc import Iterator

from mypy_extensions import mypyc_attr

from kvlab.config.engine import SchedulerConfig
from kvlab.memory.base import Fit, KVAllocator
from kvlab.memory.contiguous import ContiguousAllocator
from kvlab.memory.paged import PagedAllocator
from kvlab.sched.policy import WaitingQueue
from kvlab.sched.seq import Seq

Admission = Iterator[tuple[Seq, int, int]]


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (mypyc), subclassed by kvlab.sched.scheduler's Scheduler
class Scheduler:
    """What a batching policy reads of the scheduler, and the one call it makes: the base class of
    kvlab.sched.scheduler's, which sets these and implements ``admit``. (A class, not a Protocol: compiled, a policy
    reads these and calls ``admit`` natively, where through a Protocol each was a generic attribute lookup or method
    call, ~200-1,000 instructions; benchmarks/README.md, the fifteenth step.)"""

    config: SchedulerConfig
    allocator: KVAllocator
    paged_allocator: PagedAllocator | None  # the allocator when it is a PagedAllocator itself, else None
    contiguous_allocator: ContiguousAllocator | None  # the allocator when it is a ContiguousAllocator itself, else None
    waiting: WaitingQueue
    running: list[Seq]
    mamba_align_block_size: int  # the allocator's (a hybrid in vLLM's mamba_cache_mode 'align'), else 0
    # The frozen config's fields a policy reads at each pass, copied once (compiled, a read of the config's dataclass
    # is a generic attribute lookup, ~160 instructions; benchmarks/README.md, the nineteenth step).
    max_num_seqs: int
    enable_chunked_prefill: bool
    watermark: float

    def admit(self, seq: Seq, num_new_tokens: int, num_cached_tokens: int) -> None:
        raise NotImplementedError


def _lookup(allocator: KVAllocator, paged: PagedAllocator | None, seq: Seq) -> tuple[int, int]:
    """(tokens already computed if admitted now, of which prefix-cache hits). A swapped-out request keeps its
    computed tokens; a new or recomputing one starts from its prefix-cache hit (vLLM looks up only when
    num_computed_tokens == 0). ``paged``: the allocator when it is a PagedAllocator itself, called natively
    (compiled, a call through the KVAllocator Protocol is a generic method call; benchmarks/README.md, the
    fourteenth step)."""
    if seq.num_computed_tokens:
        return seq.num_computed_tokens, 0
    if paged is not None:
        cached = paged.get_num_cached_tokens(seq) if paged.enable_prefix_caching else 0
    elif allocator.enable_prefix_caching:
        cached = allocator.get_num_cached_tokens(seq)
    else:
        cached = 0
    return cached, cached


def mamba_aligned_chunk(seq: Seq, start: int, num_new: int, block_size: int, max_num_batched_tokens: int) -> int:
    """The prefill chunk of ``num_new`` tokens cut where a Mamba state must be kept, as vLLM's scheduler cuts it in
    mamba_cache_mode 'align' (Scheduler._mamba_block_aligned_split, no prefill checkpoint, no eagle, no prefix hit):
    a chunk that ends before the prefill does (the prompt; a resumed request's tokens but its last) ends at the last
    block boundary inside it (or at the block boundary or the last one before the prefill's end that it runs past),
    possibly 0 tokens; the prefill's last chunk is not cut. ``start``: its tokens computed (a prefix-cache hit
    included). The number of tokens it computes."""
    prefill_end = max(seq.request.prompt_len, seq.num_tokens - 1)
    if start >= prefill_end:
        return num_new
    end = start + num_new
    if end < prefill_end:
        aligned = end // block_size * block_size
        if aligned > start or block_size <= max_num_batched_tokens:
            end = aligned
    for stop in (start // block_size * block_size + block_size if start % block_size else 0,
                 (seq.num_tokens - 1) // block_size * block_size):  # the next boundary; the last one before the end
        if start < stop < end:
            end = stop
    return max(end - start, 0)


def _allocate(allocator: KVAllocator, paged: PagedAllocator | None, contiguous: ContiguousAllocator | None, seq: Seq,
              num_new: int, cached: int, watermark: int = 0) -> Fit:
    """``allocator.allocate_slots``, natively from a PagedAllocator or a ContiguousAllocator itself (see ``_lookup``;
    the contiguous one's: ~600 instructions a call more through the Protocol, 3 calls a request under ``continuous+max``,
    benchmarks/README.md, issue 34's twentieth step)."""
    if paged is not None:
        return paged.allocate_slots(seq, num_new, cached, watermark)
    if contiguous is not None:
        return contiguous.allocate_slots(seq, num_new, cached, watermark)
    return allocator.allocate_slots(seq, num_new, cached, watermark)


def continuous(sched: Scheduler, budget: int) -> Admission:
    """Orca's iteration-level scheduling, vLLM's default: between any two iterations waiting requests join,
    FCFS, while the token budget, ``max_num_seqs`` and memory allow. The first that does not fit stops the
    queue (no skipping ahead). With a watermark, a request joining a non-empty batch must leave that many blocks
    free (vLLM applies it only while something is scheduled, ``has_scheduled_reqs``: an idle engine admits)."""
    # (the scheduler's fields, the config's copies among them, read once a pass; the running list is the scheduler's,
    # admit appends to it)
    waiting, running = sched.waiting, sched.running
    max_num_seqs, chunked = sched.max_num_seqs, sched.enable_chunked_prefill
    allocator, paged, contiguous = sched.allocator, sched.paged_allocator, sched.contiguous_allocator
    watermark = allocator.watermark_blocks(sched.watermark) if sched.watermark else 0
    while budget > 0 and waiting and len(running) < max_num_seqs:
        # (typed: compiled, the queue's head is read as an object, and the arithmetic on its tokens below was generic,
        # ~1k instructions an admission; benchmarks/README.md, the sixteenth step)
        seq: Seq = waiting[0]
        computed, cached = _lookup(allocator, paged, seq)
        num_new = seq.num_tokens - computed
        if not chunked and num_new > budget:
            break
        num_new = min(num_new, budget)
        if sched.mamba_align_block_size:
            num_new = mamba_aligned_chunk(seq, computed, num_new, sched.mamba_align_block_size,
                                          sched.config.max_num_batched_tokens)
            if num_new == 0:
                break
        if _allocate(allocator, paged, contiguous, seq, num_new, cached, watermark if running else 0) is not Fit.NOW:
            break
        sched.admit(seq, num_new, cached)
        budget -= num_new
        yield seq, num_new, cached


def static(sched: Scheduler, budget: int) -> Admission:
    """Request-level batching (FasterTransformer): a batch forms only when the previous one has wholly
    finished; it takes as many requests from the queue as ``max_num_seqs`` and memory allow (memory for each
    whole prompt is taken at admission) and runs until its slowest member is done. Freed seats stay empty."""
    if sched.running:
        return
    waiting = sched.waiting
    allocator, paged, contiguous = sched.allocator, sched.paged_allocator, sched.contiguous_allocator
    while waiting and len(sched.running) < sched.max_num_seqs:
        seq: Seq = waiting[0]  # (typed: see continuous)
        computed, cached = _lookup(allocator, paged, seq)
        num_prompt = seq.num_tokens - computed
        if _allocate(allocator, paged, contiguous, seq, num_prompt, cached) is not Fit.NOW:
            break
        sched.admit(seq, num_prompt, cached)
        if num_prompt <= budget:
            num_new = num_prompt
        else:
            num_new = budget if sched.enable_chunked_prefill else 0
        budget -= num_new
        yield seq, num_new, cached


BATCHING = {"continuous": continuous, "static": static}

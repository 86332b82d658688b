"""When may a waiting request join the running batch? One function per batching policy.

Each is a generator the scheduler drains after its running loop: it admits requests from the front of the
waiting queue (allocating their memory and calling ``scheduler.admit``) and yields
``(seq, num_new_tokens, num_cached_tokens)`` for each, ``num_new_tokens`` being what it computes this iteration.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvlab.memory.base import Fit

# (An Enum member read through its class costs a metaclass lookup, ~6x a module global: hot paths use these.)
NOW = Fit.NOW

if TYPE_CHECKING:
    from kvlab.sched.scheduler import Scheduler
    from kvlab.sched.seq import Seq

Admission = Iterator[tuple["Seq", int, int]]


def _lookup(sched: Scheduler, seq: Seq) -> tuple[int, int]:
    """(tokens already computed if admitted now, of which prefix-cache hits). A swapped-out request keeps its
    computed tokens; a new or recomputing one starts from its prefix-cache hit (vLLM looks up only when
    num_computed_tokens == 0)."""
    if seq.num_computed_tokens:
        return seq.num_computed_tokens, 0
    cached = sched.allocator.get_num_cached_tokens(seq)
    return cached, cached


def continuous(sched: Scheduler, budget: int) -> Admission:
    """Orca's iteration-level scheduling, vLLM's default: between any two iterations waiting requests join,
    FCFS, while the token budget, ``max_num_seqs`` and memory allow. The first that does not fit stops the
    queue (no skipping ahead)."""
    cfg = sched.config
    waiting = sched.waiting
    running = sched.running
    allocate_slots = sched.allocator.allocate_slots
    # (_lookup inlined: this loop runs once per admission, a million times in a long run)
    get_num_cached_tokens = (
        sched.allocator.get_num_cached_tokens if getattr(sched.allocator, "enable_prefix_caching", True) else None
    )
    while budget > 0 and waiting and len(running) < cfg.max_num_seqs:
        seq = waiting[0]
        computed = seq.num_computed_tokens
        if computed or get_num_cached_tokens is None:
            cached = 0
        else:
            computed = cached = get_num_cached_tokens(seq)
        num_new = seq.request.prompt_len + seq.num_output_tokens - computed  # (seq.num_tokens, inlined)
        if not cfg.enable_chunked_prefill and num_new > budget:
            break
        if num_new > budget:
            num_new = budget
        if allocate_slots(seq, num_new, cached) is not NOW:
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
    cfg = sched.config
    waiting = sched.waiting
    while waiting and len(sched.running) < cfg.max_num_seqs:
        seq = waiting[0]
        computed, cached = _lookup(sched, seq)
        num_prompt = seq.num_tokens - computed
        if sched.allocator.allocate_slots(seq, num_prompt, cached) is not NOW:
            break
        sched.admit(seq, num_prompt, cached)
        if num_prompt <= budget:
            num_new = num_prompt
        else:
            num_new = budget if cfg.enable_chunked_prefill else 0
        budget -= num_new
        yield seq, num_new, cached


BATCHING = {"continuous": continuous, "static": static}

# Whether a request arriving while others run can join them (the simulator's jump test needs to know).
ADMITS_WHILE_RUNNING = {"continuous": True, "static": False}

"""One interface for every memory strategy, and the states a KV slot can be in.

Every slot of KV memory is, at every moment, in exactly one state (the vLLM paper's Figure 2, §3.1):

    token                   holds the K/V of a token already computed
    reserved                held by a request for a token it will still write
    internal_fragmentation  held by a request, but beyond the last token it will ever write
    overhead                handed out by the allocator beyond what was asked (a buddy allocator's round-up)
    free                    not handed out

The paper's fourth column, "external fragmentation & other", is ``overhead + free``: with a full cache and a
queue, free memory is memory that could not be given to the next request.

An allocator only knows what it handed out; how much of it already holds tokens is the scheduler's
``num_computed_tokens``. So an allocator keeps four counters (allocated, internal fragmentation, overhead,
duplicate references) and ``slot_usage`` combines them with the sum of computed tokens.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from kvlab.workload.request import Request


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` slots that hold ``num_tokens`` tokens (vLLM's ``cdiv(num_tokens, block_size)``): the
    one arithmetic of block needs, for a step's allocation (``allocate_slots``), a run's (memory/block_needs.py),
    and whether a request can ever fit."""
    return -(-num_tokens // block_size)


class Fit(enum.Enum):
    """What an allocation request came to. Never a sentinel: every caller handles all three."""

    NOW = "now"  # allocated
    LATER = "later"  # not enough memory now; retry after something is freed
    NEVER = "never"  # larger than the whole cache: reject the request


@dataclass(frozen=True, slots=True)
class SlotUsage:
    """Slots in each state; the five fields sum to the cache's capacity."""

    token: int
    reserved: int
    internal_fragmentation: int
    overhead: int
    free: int

    @property
    def num_slots(self) -> int:
        return self.token + self.reserved + self.internal_fragmentation + self.overhead + self.free

    @property
    def external_fragmentation(self) -> int:
        """The paper's "external fragmentation & other"."""
        return self.overhead + self.free


@dataclass(frozen=True, slots=True)
class BlockSnapshot:
    """The KV address space cut into display blocks of ``block_size`` slots, in address order.

    The one format the metrics, the trace and the web grid read. Per block: ``owner`` is the id of the request
    holding it (-1: nobody; this is a wire format, read by JavaScript too), and how many of its slots hold
    tokens, are reserved, are internal fragmentation or allocator overhead; the rest are free.
    A paged block shared by several requests names the first; ``shared`` marks it.
    """

    block_size: int
    owner: tuple[int, ...]
    token: tuple[int, ...]
    reserved: tuple[int, ...]
    internal_fragmentation: tuple[int, ...]
    overhead: tuple[int, ...]
    shared: tuple[bool, ...]


class Sequence(Protocol):
    """What an allocator reads of a running request (the simulator's request state)."""

    request: Request
    num_computed_tokens: int

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens so far (vLLM's ``Request.num_tokens``); a preempted request keeps its output.
        The paged allocator reads it: a prefix-cache hit is capped at ``num_tokens - 1`` and a request being
        admitted must fit ``num_tokens`` whole (vLLM's ``scheduler_reserve_full_isl``)."""
        ...


class DecodeRun(NamedTuple):
    """What ``allocate_decode_run`` handed out: the iterations it covers (0: not even the first, nothing was
    allocated) and ``(iteration from 0, slots, internal fragmentation slots)`` entries that add up, per
    iteration, what its blocks added to the counters, flat: three ints an entry, one after another (the recorder
    reads them into numpy as they are: tuples of three cost it twice the instructions an int to flatten). A
    contiguous slab holds every token already: no growth.
    (A named tuple: made once or twice per run, and a frozen dataclass's constructor costs several times more.
    No ``__bool__``: compiled by mypyc, a named tuple's truth is its length, always true; read ``num_iterations``.)"""

    num_iterations: int
    growth: tuple[int, ...] = ()


class Admission(NamedTuple):
    """What admitting a waiting request would take now (no prefix-cache hit counted), beside the room there is:
    memory admits it iff ``num_slots <= num_room_slots``. ``num_asked_slots`` is what the strategy reserves for
    it (its slab; or, with pages, its tokens so far: the prompt, and the answer of an evicted request coming
    back); ``num_slots`` what the allocator hands out for that (a buddy chunk, or whole blocks); ``in_one_piece``:
    those slots must be consecutive (a slab) or may lie anywhere (pages). The lab writes it beside the grid."""

    num_asked_slots: int
    num_slots: int
    num_room_slots: int  # the largest free chunk (in one piece), or every free block's slots
    in_one_piece: bool


class KVAllocator(Protocol):
    """The interface every memory strategy implements (contiguous: max, pow2, oracle; paged), and all that its
    callers use.

    The calls mirror vLLM's KVCacheManager:
      get_num_cached_tokens  prefix-cache hit for a request about to be admitted (0 where nothing is shared)
      peek_num_cached_tokens the same for a new request, changing nothing (what a prefix-aware router asks)
      allocate_slots         make room for ``num_computed_tokens + num_new_tokens`` tokens of ``seq``
      allocate_decode_run    allocate_slots(seq, 1) for many decoding requests over many iterations at once
      allocate_decode_iteration  the same for one iteration whose blocks run out, evicting as the running loop does
      free                   give back everything ``seq`` holds
    Counters (slots): ``num_slots`` capacity; ``num_allocated_slots`` handed to requests (a shared block once);
    ``num_internal_fragmentation_slots``; ``num_overhead_slots``; ``num_duplicate_token_slots`` (slots that
    more than one request counts among its computed tokens, counted once per extra reference).
    """

    num_slots: int
    enable_prefix_caching: bool

    @property
    def num_allocated_slots(self) -> int: ...

    @property
    def num_internal_fragmentation_slots(self) -> int: ...

    @property
    def num_overhead_slots(self) -> int: ...

    @property
    def num_duplicate_token_slots(self) -> int: ...

    @property
    def num_free_blocks(self) -> int:
        """Blocks a running request can still grow into (0 for slabs, which never grow)."""
        ...

    def get_num_cached_tokens(self, seq: Sequence) -> int: ...

    def peek_num_cached_tokens(self, request: Request) -> int: ...

    def watermark_blocks(self, watermark: float) -> int:
        """The blocks vLLM's ``watermark`` (a fraction of the pool) keeps free at admission; 0 for slabs."""
        ...

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int = 0,
                       watermark_blocks: int = 0) -> Fit:
        """Room for the request's next ``num_new_tokens`` (after ``num_cached_tokens`` of prefix-cache hits, for a
        request being admitted). ``watermark_blocks``: blocks a first allocation must leave free (vLLM's watermark;
        a contiguous slab has no blocks and ignores it)."""
        ...

    def allocate_decode_run(self, seqs: Iterable[Sequence], max_iterations: int, first: int = 0) -> DecodeRun:
        """``allocate_slots(seq, 1)`` for each of ``seqs`` (each computes the one token it sampled last), for up
        to ``max_iterations`` iterations, in step order (by iteration, then in ``seqs``' order): as many
        iterations as memory covers. The scheduler's runs of iterations allocate through it. ``first`` numbers
        the iterations of the growth it returns (the run's iteration this call's first one is)."""
        ...

    def decode_run_slots(self, num_iterations: int) -> int | None:
        """The slots ``allocate_decode_run`` would hand out for ``num_iterations`` iterations, handing out nothing
        (a reader's look into a run in flight); None when memory does not cover them all."""
        ...

    def allocate_decode_iteration(self, evict: Callable[[], Sequence]) -> DecodeRun:
        """One iteration of ``allocate_slots(seq, 1)`` for every request holding blocks, in running order, when
        their blocks are not all free, as the running loop does it: when a request finds no free block,
        ``evict()`` preempts the newest running request (freeing its blocks here) and returns it, until one is
        free or the request evicted itself (everyone after it went first). Covers one iteration, for those
        left."""
        ...

    def free(self, seq: Sequence) -> None: ...

    def get_num_slots(self, request_id: int) -> int:
        """Slots the request holds (0 if none): it can compute that many tokens before allocating again."""
        ...

    def admission(self, seq: Sequence) -> Admission:
        """What admitting ``seq`` (waiting, holding nothing) would take now, and the room there is."""
        ...

    def why_never_fits(self, request: Request) -> str | None:
        """None if the request can ever be served, else why not (the simulator rejects it with that reason)."""
        ...

    def snapshot(self, seqs: Iterable[Sequence]) -> BlockSnapshot: ...

    def check_invariants(self, seqs: Iterable[Sequence], *, in_running_order: bool = False,
                         all_decoding: bool = False) -> None:
        """For tests: the allocator's structures and counters agree with a recount (AssertionError if not);
        ``in_running_order``: ``seqs`` is the scheduler's running queue; ``all_decoding``: each of them computes the
        one token it sampled last in the next iteration (a decode run's precondition: what a run would hand out is
        checked too)."""
        ...


def slot_usage(allocator: KVAllocator, num_resident_computed_tokens: int) -> SlotUsage:
    """The five states, from the allocator's counters and the computed tokens of the requests it holds."""
    token = num_resident_computed_tokens - allocator.num_duplicate_token_slots
    internal = allocator.num_internal_fragmentation_slots
    reserved = allocator.num_allocated_slots - token - internal
    overhead = allocator.num_overhead_slots
    free = allocator.num_slots - allocator.num_allocated_slots - overhead
    return SlotUsage(token, reserved, internal, overhead, free)


def check_slot_states(allocator: KVAllocator, held: list[Sequence]) -> None:
    """For tests (each allocator's ``check_invariants`` ends with it): the five states are never negative, sum
    to the capacity, and the block snapshot agrees with the counters."""
    usage = slot_usage(allocator, sum(seq.num_computed_tokens for seq in held))
    assert min(usage.token, usage.reserved, usage.internal_fragmentation, usage.overhead, usage.free) >= 0, usage
    assert usage.num_slots == allocator.num_slots
    snap = allocator.snapshot(held)
    assert sum(snap.token) == usage.token
    assert sum(snap.reserved) == usage.reserved
    assert sum(snap.internal_fragmentation) == usage.internal_fragmentation
    assert sum(snap.overhead) == usage.overhead

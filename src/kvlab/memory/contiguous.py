"""Contiguous reservation: one slab per request, reserved at admission, placed by a buddy allocator.

The three reservation schemes the vLLM paper compares against (§6.2, "Orca (Max/Pow2/Oracle)"):

    max     the largest answer the request may produce: ``prompt_len + max_tokens`` if the client capped it,
            else ``max_model_len`` (capped at ``max_model_len`` either way)
    pow2    ``prompt_len + next_pow2(true output)``: the output space over-reserved at most 2x (output 25 -> 32)
    oracle  exactly the slots the request will write, ``num_kv_tokens`` (knows the future: an upper bound)

The slab is placed by ``BuddyAllocator``, whose power-of-two round-up is allocator ``overhead``::

    |<---------------------------- chunk (next_pow2(slab)) ---------------------------->|
    |<--------------------------- slab ---------------------------->|
    | token (computed) | reserved (still to write) | internal frag. |      overhead      |
    0            num_computed_tokens          num_kv_tokens        slab                chunk

A hybrid model (several KV cache groups: ``kv_cache_groups``, kvlab.memory.hybrid.GroupSpec each) keeps a
request's layers in one slab that covers them all, in the same pool of slots as the paged hybrid run: the
policy's token reservation R in each full attention (or MLA) group, ``state_blocks x block_size`` slots for each
Mamba group's state, and ``min(R, the window's blocks x block_size)`` for each sliding group (its cap,
``admission_blocks``, or its window in tokens where none is given). The first full attention group's R slots hold
the tokens (the states above); the other groups' slots are ``overhead``, as in kvlab.memory.hybrid, placed after
the tokens' part and before the buddy round-up. A single-group model's slab is R, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from kvlab.errors import KvlabError
from kvlab.memory.base import Admission, BlockSnapshot, DecodeRun, Fit, Sequence, check_slot_states
from kvlab.memory.buddy import BuddyAllocator, next_pow2
from kvlab.memory.hybrid import MAMBA, SLIDING, TOKEN_KINDS, GroupSpec
from kvlab.workload.request import Request


def max_slab(request: Request, max_model_len: int) -> int:
    if request.max_tokens is None:
        return max_model_len
    return min(max_model_len, request.prompt_len + request.max_tokens)


def pow2_slab(request: Request, max_model_len: int) -> int:
    return min(max_model_len, request.prompt_len + next_pow2(request.num_output_tokens))


def oracle_slab(request: Request, max_model_len: int) -> int:
    return request.num_kv_tokens


SLAB_POLICIES: dict[str, Callable[[Request, int], int]] = {
    "max": max_slab,
    "pow2": pow2_slab,
    "oracle": oracle_slab,
}


class Slab:
    """One request's slab. (A plain class with read-only fields, not a frozen dataclass: compiled by mypyc, the
    dataclass's constructor ran interpreted, ~7.5k instructions a slab, 5% of a ``max`` run's; this one is native.
    benchmarks/README.md, issue 34's twentieth step.)"""

    __slots__ = ("address", "num_slots", "chunk_size", "num_kv_tokens", "group_slots")

    def __init__(self, address: int, num_slots: int, chunk_size: int, num_kv_tokens: int, group_slots: int = 0) -> None:
        self.address: Final = address
        self.num_slots: Final = num_slots  # what the policy asked for (the tokens' part)
        self.chunk_size: Final = chunk_size  # what the buddy allocator handed out (>= num_slots + group_slots)
        self.num_kv_tokens: Final = num_kv_tokens
        self.group_slots: Final = group_slots  # a hybrid's other KV cache groups' slots, after the tokens' part (overhead)

    def _fields(self) -> tuple[int, int, int, int, int]:
        return self.address, self.num_slots, self.chunk_size, self.num_kv_tokens, self.group_slots

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Slab) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return "Slab(address={}, num_slots={}, chunk_size={}, num_kv_tokens={}, group_slots={})".format(*self._fields())


def group_slots(groups: tuple[GroupSpec, ...], reserved: int, block_size: int) -> int:
    """The slots a hybrid's slab takes beyond the ``reserved`` token slots of its first full attention (or MLA)
    group: ``reserved`` in each further one, a Mamba group's state blocks, a sliding group's most (its admission cap:
    the window and the tokens in flight, + 1 block; its window where it has none), at most ``reserved``; 0 for a
    single group."""
    extra = 0
    first = True
    for g in groups:
        bs = g.block_size or block_size  # (a group whose blocks hold more tokens takes fewer slots a token)
        if g.kind in TOKEN_KINDS:
            extra += 0 if first else reserved * block_size // bs
            first = False
        elif g.kind == MAMBA:
            extra += g.state_blocks * block_size
        elif g.kind == SLIDING:
            window = g.admission_blocks * bs if g.admission_blocks else g.sliding_window
            extra += min(reserved, window) * block_size // bs
    return extra


# Slot states in the snapshot's scratch array.
_FREE, _TOKEN, _RESERVED, _INTERNAL, _OVERHEAD = range(5)


class ContiguousAllocator:
    """``max``, ``pow2`` or ``oracle``: the KVAllocator interface over one slab per request."""

    def __init__(self, num_slots: int, policy: str, max_model_len: int, *, display_block_size: int = 16,
                 kv_cache_groups: Iterable[tuple] = ()) -> None:
        if policy not in SLAB_POLICIES:
            raise KvlabError(f"unknown reservation policy {policy!r}: expected one of {', '.join(SLAB_POLICIES)}")
        if max_model_len < 1:
            raise KvlabError(f"max_model_len must be at least 1, got {max_model_len}")
        if display_block_size < 1:
            raise KvlabError(f"display block size must be at least 1, got {display_block_size}")
        groups = tuple(GroupSpec(*g) for g in kv_cache_groups)
        if len(groups) > 1 and not any(g.kind in TOKEN_KINDS for g in groups):
            raise KvlabError("a hybrid model's slabs need a full attention (or MLA) group to hold the tokens; got "
                             f"{', '.join(g.kind for g in groups)}")
        self.groups = groups if len(groups) > 1 else ()
        self.policy = policy
        self.max_model_len = max_model_len
        self.display_block_size = display_block_size
        self.buddy = BuddyAllocator(num_slots)
        self.num_slots = num_slots
        self._slab_size = SLAB_POLICIES[policy]
        self._slabs: dict[int, Slab] = {}  # request_id -> its slab
        # The last request whose slab was sized, and its (R, whole slab): the queue's head is tried again after each
        # finish until it fits (``_sizes``).
        self._sized: Request | None = None
        self._sized_slots = (0, 0)
        self.num_allocated_slots = 0
        self.num_internal_fragmentation_slots = 0
        self.num_overhead_slots = 0
        self.num_duplicate_token_slots = 0  # nothing is shared between slabs
        self.enable_prefix_caching = False

    def slab_size(self, request: Request) -> int:
        """The policy's token reservation R (a hybrid's slab holds more: ``whole_slab_size``)."""
        return self._slab_size(request, self.max_model_len)

    def whole_slab_size(self, request: Request) -> int:
        """The slots the request's slab takes: R, and a hybrid's other groups' (``group_slots``)."""
        return self._whole(self.slab_size(request))

    def _whole(self, reserved: int) -> int:
        """The slots a slab of ``reserved`` token slots takes (``whole_slab_size``, from the reservation)."""
        if not self.groups:
            return reserved
        return reserved + group_slots(self.groups, reserved, self.display_block_size)

    def _sizes(self, request: Request) -> tuple[int, int]:
        """(``slab_size``, ``whole_slab_size``) of ``request``, kept for the last request ``allocate_slots`` sized
        (frozen: the same object, the same sizes). Compiled, the policy's call is generic (~700 instructions with its
        reads of the request), and ``continuous+max`` tries the queue's head about three times before it fits
        (benchmarks/README.md, issue 34's twentieth step)."""
        if request is not self._sized:
            reserved = self.slab_size(request)
            self._sized, self._sized_slots = request, (reserved, self._whole(reserved))
        return self._sized_slots

    def get_num_slots(self, request_id: int) -> int:
        """Slots the request holds (0 if none): its slab, a hybrid's other groups' part included."""
        slab = self._slabs.get(request_id)
        return 0 if slab is None else slab.num_slots + slab.group_slots

    def admission(self, seq: Sequence) -> Admission:
        """Its slab, in the buddy chunk that holds it (the next power of two), against the largest free chunk."""
        slab = self.whole_slab_size(seq.request)
        return Admission(slab, next_pow2(slab), self.buddy.largest_free_chunk, True)

    def get_slab(self, request_id: int) -> Slab:
        return self._slabs[request_id]

    def get_num_cached_tokens(self, seq: Sequence) -> int:
        return 0  # no prefix sharing between slabs

    def peek_num_cached_tokens(self, request: Request) -> int:
        return 0

    def why_never_fits(self, request: Request) -> str | None:
        reserved = self.slab_size(request)  # (not _sizes: it keeps the queue's head, asked here at each arrival)
        slab = self._whole(reserved)
        if slab > self.buddy.largest_region:
            what = "slab, with the other KV cache groups' slots," if self.groups else "slab"
            return f"{self.policy} {what} larger than the buddy allocator's largest block ({self.buddy.largest_region:,} slots)"
        assert request.num_kv_tokens <= reserved, "a slab holds every token its request writes"
        return None

    num_free_blocks = 0  # a slab never grows

    def allocate_decode_run(self, seqs: Iterable[Sequence], max_iterations: int, first: int = 0) -> DecodeRun:
        """A slab holds every token its request will write: decoding never allocates."""
        return DecodeRun(*self.decode_run_fields(seqs, max_iterations, first))

    def decode_run_fields(self, seqs: Iterable[Sequence], max_iterations: int, first: int = 0
                          ) -> tuple[int, tuple[int, ...]]:
        """``allocate_decode_run``'s two fields as a plain tuple, what the run scheduler calls on a ContiguousAllocator
        itself (as PagedAllocator.decode_run_fields: compiled, no named tuple made and no generic call)."""
        return max_iterations, ()

    def decode_run_slots(self, num_iterations: int) -> int | None:
        return 0  # (a slab holds every token its request writes)

    def allocate_decode_iteration(self, evict: Callable[[], Sequence]) -> DecodeRun:
        return DecodeRun(1)  # (never short of memory while decoding: a slab holds every token)

    def watermark_blocks(self, watermark: float) -> int:
        return 0  # (a slab is placed whole at admission: there are no blocks to keep free)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int = 0,
                       watermark_blocks: int = 0) -> Fit:
        """Reserve the request's slab on its first call; later calls only check they stay inside it."""
        request = seq.request
        request_id = request.request_id  # (read once: compiled, a read of the frozen request is generic)
        slab = self._slabs.get(request_id)
        if slab is None:
            size, whole = self._sizes(request)
            fit = self.buddy.fit(whole)
            if fit is not Fit.NOW:
                return fit
            address = self.buddy.allocate(whole)
            slab = Slab(address, size, self.buddy.chunk_size(address), request.num_kv_tokens, whole - size)
            self._slabs[request_id] = slab
            self.num_allocated_slots += size
            self.num_internal_fragmentation_slots += max(0, size - slab.num_kv_tokens)
            self.num_overhead_slots += slab.chunk_size - size
        num_tokens = seq.num_computed_tokens + num_cached_tokens + num_new_tokens
        # A slab never grows: the scheduler must not schedule past it.
        assert num_tokens <= slab.num_slots, (
            f"request {request_id} needs {num_tokens} slots but its {self.policy} slab has {slab.num_slots}"
        )
        return Fit.NOW

    def free(self, seq: Sequence) -> None:
        slab = self._slabs.pop(seq.request.request_id, None)
        if slab is None:
            return  # freed before it was ever allocated (e.g. rejected while waiting)
        self.buddy.free(slab.address)
        self.num_allocated_slots -= slab.num_slots
        self.num_internal_fragmentation_slots -= max(0, slab.num_slots - slab.num_kv_tokens)
        self.num_overhead_slots -= slab.chunk_size - slab.num_slots

    def snapshot(self, seqs: Iterable[Sequence]) -> BlockSnapshot:
        """The address space in display blocks of ``display_block_size`` slots.

        A trailing partial display block (``num_slots`` not a multiple of the display block size) shows its
        missing slots as free.
        """
        import numpy as np  # only snapshots need it; keeps `import kvlab.memory` light

        bs = self.display_block_size
        num_display_blocks = -(-self.num_slots // bs)
        state = np.zeros(num_display_blocks * bs, dtype=np.uint8)
        owner = np.full(num_display_blocks * bs, -1, dtype=np.int64)
        for seq in seqs:
            slab = self._slabs.get(seq.request.request_id)
            if slab is None:
                continue
            a, s = slab.address, slab.num_slots
            computed = a + min(seq.num_computed_tokens, s)
            written = a + min(slab.num_kv_tokens, s)
            state[a:computed] = _TOKEN
            state[computed:written] = _RESERVED
            state[written : a + s] = _INTERNAL
            state[a + s : a + slab.chunk_size] = _OVERHEAD
            owner[a : a + slab.chunk_size] = seq.request.request_id
        counts = np.bincount(
            np.repeat(np.arange(num_display_blocks) * 5, bs) + state, minlength=num_display_blocks * 5
        ).reshape(num_display_blocks, 5)
        owners = owner.reshape(num_display_blocks, bs)
        # A display block may hold the end of one small chunk and the start of another: name the first.
        first = (owners >= 0).argmax(axis=1)
        block_owner = owners[np.arange(num_display_blocks), first]
        return BlockSnapshot(
            block_size=bs,
            owner=tuple(block_owner.tolist()),
            token=tuple(counts[:, _TOKEN].tolist()),
            reserved=tuple(counts[:, _RESERVED].tolist()),
            internal_fragmentation=tuple(counts[:, _INTERNAL].tolist()),
            overhead=tuple(counts[:, _OVERHEAD].tolist()),
            shared=(False,) * num_display_blocks,
        )

    def check_invariants(self, seqs: Iterable[Sequence], *, in_running_order: bool = False,
                         all_decoding: bool = False) -> None:
        """For tests: slabs tile the space with the free chunks, counters match a recount, states sum up."""
        chunks = [(s.address, s.chunk_size) for s in self._slabs.values()]
        assert sorted(chunks) == self.buddy.allocated_chunks()
        covered = sorted(chunks + self.buddy.free_chunks())
        end = 0
        for address, size in covered:
            assert address == end, f"gap or overlap at slot {end}: next chunk starts at {address}"
            assert address % size == 0, f"chunk at {address} of {size} slots is misaligned"
            end = address + size
        assert end == self.num_slots
        assert self.buddy.num_free_slots == sum(size for _, size in self.buddy.free_chunks())
        slabs = list(self._slabs.values())
        assert self.num_allocated_slots == sum(s.num_slots for s in slabs)
        assert self.num_internal_fragmentation_slots == sum(max(0, s.num_slots - s.num_kv_tokens) for s in slabs)
        assert self.num_overhead_slots == sum(s.chunk_size - s.num_slots for s in slabs)
        for s in slabs:
            assert s.group_slots == group_slots(self.groups, s.num_slots, self.display_block_size)
            assert s.num_slots + s.group_slots <= s.chunk_size
        held = [seq for seq in seqs if seq.request.request_id in self._slabs]
        assert len(held) == len(self._slabs), "a slab is held by a request not among seqs"
        for seq in held:
            assert seq.num_computed_tokens <= self._slabs[seq.request.request_id].num_slots
        check_slot_states(self, held)

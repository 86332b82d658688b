"""Paged KV memory: fixed blocks handed out as a sequence grows, vLLM V1's KV cache manager semantics.

What each call does, as in vLLM 0.32.0 (vllm/v1/core/kv_cache_manager.py, single_type_kv_cache_manager.py
FullAttentionManager, block_pool.py):

``get_num_cached_tokens(seq)`` (vLLM: ``get_computed_blocks``)
    The longest run of full blocks, from block 0, whose block hashes are cached, over at most
    ``(num_tokens - 1) // block_size`` blocks: when the whole prompt hits, its last token is still recomputed
    to get logits, and hits are whole blocks, so up to a block is recomputed.
``allocate_slots(seq, num_new_tokens, num_cached_tokens)``
    Needs slots for ``num_computed_tokens + num_cached_tokens + num_new_tokens`` tokens. A request being
    admitted (holding no blocks) must also fit its whole ``num_tokens`` (vLLM's ``scheduler_reserve_full_isl``,
    on by default). Hit blocks still in the free queue count against the free blocks, as they leave it when
    touched. On success the hit blocks are touched, new blocks are taken from the free queue, and, with prefix
    caching, every block full of the ``num_computed_tokens + num_cached_tokens + num_new_tokens`` tokens gets
    its block hash (vLLM caches at scheduling time, before the forward pass writes them).
``free(seq)``
    The request's blocks go back in reverse order (tail first).

Block hashes. kvlab's requests carry lengths, not token ids, so a block's content is named from the request:
block j (tokens ``[j*block_size, (j+1)*block_size)``) inside the shared prefix (``Request.num_shared_prefix_tokens``:
part of the prompt, or with ``prefix_len`` a conversation's answer too) is named by the prefix ids covering it and
its offset, chained over its parent's hash so that equal hashes mean equal prefixes (as vLLM's
``hash_block_tokens`` chains over the parent hash); any other block holds prompt tail or generated tokens
unique to the request and is named ``(request_id, j)`` (packed in a negative int), which already fixes its whole
prefix. A preempted request therefore finds its own freed blocks again. Chained prefix hashes are interned to small
integers, so hits are exact (no hash collisions).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any, Final

from mypy_extensions import mypyc_attr

from kvlab.errors import KvlabError
from kvlab.memory.base import (
    Admission,
    BlockSnapshot,
    DecodeRun,
    Fit,
    Sequence,
    check_slot_states,
    num_blocks_for,
)
from kvlab.memory.block_needs import BlockNeeds, Holder
from kvlab.memory.block_pool import NULL_BLOCK_ID, BlockHash, BlockPool, PrefixCachingBlockPool
from kvlab.workload.request import Request

# DecodeRun(...) as one C call: the named tuple's own __new__ is a Python function, a frame per run compiled
# (kvlab.sched.output.new_tuple, which the memory layer does not import).
_new_tuple: Final = tuple.__new__
_NO_RUN: Final = DecodeRun(0)


def private_block_hash(request_id: int, j: int) -> int:
    """The hash of block ``j`` of a request's private blocks, ``(request_id, j)`` packed in a negative int (a tuple
    per block was a tenth of a compiled run): interned prefix hashes count up from 0, so the two never collide.
    Request ids are zigzagged (0, -1, 1, ... -> 0, 1, 2, ...) so that any id packs; ``j`` is below 2**31.

    The request goes in the high 32 bits, and scrambled into the low ones too (``_private_offset``): a dict's slot
    is a hash's low bits, and with ``j`` alone there every request's block j fell in the same slot (probe chains
    in the prefix cache's dict; 737k -> 723k instructions per request, benchmarks/count_instructions.py --case vllm).
    A request's blocks stay consecutive ints (``_extend_block_hashes`` hands them out as a range)."""
    zigzag = 2 * request_id if request_id >= 0 else -2 * request_id - 1
    return -1 - (zigzag << 32) - _private_offset(zigzag) - j


def _private_offset(zigzag: int) -> int:
    """Where a request's blocks start in the low 32 bits: its zigzagged id times an odd constant (Knuth's
    multiplicative hashing), below 2**31 so that ``offset + j`` stays below 2**32. (The constant 0x9E3779B1 taken
    modulo 2**31 first, 0x1E3779B1: the same low 31 bits of the product, and compiled a multiplication that stays
    within a machine word, where 0x9E3779B1 sent it to the generic one, ~700 instructions a request;
    benchmarks/README.md, the nineteenth step.)"""
    return (zigzag * 0x1E3779B1) & 0x7FFFFFFF


def private_block_key(block_hash: int) -> tuple[int, int]:
    """``(request_id, j)`` back from ``private_block_hash``."""
    zigzag, low = divmod(-1 - block_hash, 1 << 32)
    return (zigzag >> 1 if zigzag % 2 == 0 else -((zigzag + 1) >> 1)), low - _private_offset(zigzag)


class RequestHashes:
    """One request's prefix-caching state (prefix caching only): its block hashes so far (vLLM's
    ``Request.block_hashes``), how many of its leading blocks are cached (vLLM's ``num_cached_block``) and its block
    table while it holds blocks. One object per request rather than a dict per field keyed by request id: a decode
    run caches about a block per request, and each dict lookup there cost ~250 instructions compiled
    (benchmarks/README.md, issue 34)."""

    __slots__ = ("request", "block_hashes", "num_cached_blocks", "table")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.block_hashes: list[BlockHash] = []
        self.num_cached_blocks = 0
        self.table: list[int] | None = None  # (the same list as the allocator's _block_tables entry)


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (mypyc), subclassed by kvlab.offload and kvlab.disagg
class PagedAllocator:
    """The KVAllocator interface over a pool of ``num_blocks`` blocks of ``block_size`` slots."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = False,
        *,
        max_model_len: int | None = None,
        scheduler_reserve_full_isl: bool = True,
    ) -> None:
        if block_size < 1:
            raise KvlabError(f"block_size must be at least 1, got {block_size}")
        if num_blocks < 2:
            raise KvlabError(
                f"a paged KV cache needs at least 2 blocks (block 0 is vLLM's null block), got num_blocks={num_blocks}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.max_model_len = max_model_len
        self.scheduler_reserve_full_isl = scheduler_reserve_full_isl
        self.num_slots = num_blocks * block_size
        self.num_overhead_slots = block_size  # the null block
        # The prefix-caching pool, or None: the hash lookups and reference counts go through it.
        self.prefix_pool = PrefixCachingBlockPool(num_blocks) if enable_prefix_caching else None
        self.block_pool: BlockPool | PrefixCachingBlockPool = self.prefix_pool or BlockPool(num_blocks)
        self._block_tables: dict[int, list[int]] = {}  # request_id -> block ids, in token order
        self._needs = BlockNeeds(block_size)  # when each request will need its next block (decode runs)
        self._num_table_entries = 0  # sum of block table lengths: a shared block once per holder
        self.num_internal_fragmentation_slots = 0
        # Prefix caching only.
        # request_id -> its block hashes so far, its leading blocks already cached, its table (RequestHashes)
        self._hashes: dict[int, RequestHashes] = {}
        self._prefix_block_hashes: dict[tuple, int] = {}  # (parent, chunk_len, ids, offset) -> interned hash

    @property
    def _cached_pool(self) -> PrefixCachingBlockPool:
        assert self.prefix_pool is not None, "prefix caching is off"
        return self.prefix_pool

    # Counters (slots) ---------------------------------------------------------------------------------------

    @property
    def num_allocated_slots(self) -> int:
        """Slots of blocks with ref_cnt > 0: every block but the null block and the free ones."""
        return self.block_size * (self.num_blocks - 1 - self.block_pool.num_free_blocks)

    @property
    def num_duplicate_token_slots(self) -> int:
        """block_size x sum over blocks of (ref_cnt - 1): a shared block is full of computed tokens."""
        num_owned_blocks = self.num_blocks - 1 - self.block_pool.num_free_blocks
        return self.block_size * (self._num_table_entries - num_owned_blocks)

    # The KVAllocator interface ------------------------------------------------------------------------------

    def why_never_fits(self, request: Request) -> str | None:
        if num_blocks_for(request.num_kv_tokens, self.block_size) <= self.num_blocks - 1:
            return None
        return "larger than the whole KV cache"

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    def get_num_cached_tokens(self, seq: Sequence) -> int:
        """Prefix-cache hit, in tokens, for a request about to be admitted (0 without prefix caching)."""
        if not self.enable_prefix_caching:
            return 0
        request = seq.request
        cached = self._cached_pool.cached_block_hash_to_block
        max_num_blocks = (seq.num_tokens - 1) // self.block_size
        request_id: Any = request.request_id  # (read once, as the object the request holds: see _free_seq)
        state = self._hashes.get(request_id)
        hashes = state.block_hashes if state is not None else []
        num_hit_blocks = 0
        while num_hit_blocks < max_num_blocks:
            if num_hit_blocks == len(hashes):
                if state is None:  # (_hash_state, written out with the id read above)
                    state = self._hashes[request_id] = RequestHashes(request)
                hashes = self._extend_state_hashes(state, min(max_num_blocks, 2 * num_hit_blocks + 1))
            if hashes[num_hit_blocks] not in cached:
                break
            num_hit_blocks += 1
        return num_hit_blocks * self.block_size

    def peek_num_cached_tokens(self, request: Request) -> int:
        """The prefix-cache hit a new request would find if it were admitted now (``get_num_cached_tokens``' answer
        for it), computed without changing anything here: what a prefix-aware router asks each replica (llm-d's
        precise prefix-cache scorer keeps the same answer from the engines' KV events). 0 without prefix caching."""
        if not self.enable_prefix_caching:
            return 0
        bs = self.block_size
        # A new request's own blocks, (request_id, j), are cached nowhere: only its shared blocks can hit.
        num_blocks = min((request.prompt_len - 1) // bs, request.num_shared_prefix_tokens // bs)
        cached, interned = self._cached_pool.cached_block_hash_to_block, self._prefix_block_hashes
        parent = None
        for j in range(num_blocks):
            parent = interned.get(self._shared_block_key(request, parent, j))
            if parent is None or parent not in cached:
                return j * bs
        return num_blocks * bs

    def watermark_blocks(self, watermark: float) -> int:
        """``int(watermark × num_blocks)``, the null block counted (vllm/v1/core/kv_cache_manager.py:
        KVCacheManager.__init__)."""
        return int(watermark * self.num_blocks)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int = 0,
                       watermark_blocks: int = 0) -> Fit:
        """Make room for ``num_computed_tokens + num_cached_tokens + num_new_tokens`` tokens.

        As in vLLM, ``num_cached_tokens`` is the hit ``get_num_cached_tokens`` just returned for a request being
        admitted, not yet counted in ``seq.num_computed_tokens``; a request being admitted must leave
        ``watermark_blocks`` free (the scheduler passes vLLM's watermark). Fit.LATER changes nothing.
        """
        # (the id typed Any, the object the request holds: compiled, an int is boxed anew for each dict access. Its
        # holder, not its _block_tables entry: the same requests, and the holder has its table, KV tokens and state)
        request_id: Any = seq.request.request_id
        holder = self._needs.holders.get(request_id)
        if holder is None:
            return self._allocate_first(seq, num_new_tokens, num_cached_tokens, watermark_blocks)
        table = holder.table
        assert num_cached_tokens == 0, "a running request gets no new prefix-cache hits"
        # vLLM caps at max_model_len here too, but its scheduler never schedules a running request past it.
        num_tokens = seq.num_computed_tokens + num_new_tokens
        # (num_blocks_for(num_tokens, block_size), written out here and in _allocate_first: a call per request and
        # step was 1% of a saturated run's bytecodes, benchmarks/count_instructions.py --case 2.1)
        num_new_blocks = -(-num_tokens // self.block_size) - len(table)
        if num_new_blocks > 0:
            if num_new_blocks > self.block_pool.num_free_blocks:
                return Fit.NEVER if len(table) + num_new_blocks > self.num_blocks - 1 else Fit.LATER
            self._append_new_blocks(holder.kv_tokens, table, num_new_blocks)
        self._needs.update_holder(holder, len(table) * self.block_size, num_tokens)
        # With prefix caching, blocks just filled get their hashes (checked here first: most steps fill none).
        if self.enable_prefix_caching:
            state: RequestHashes = holder.state
            if num_tokens // self.block_size > state.num_cached_blocks:
                self._cache_blocks(state, table, min(num_tokens, seq.num_tokens))
        return Fit.NOW

    def allocate_decode_run(self, seqs: Iterable[Sequence], max_iterations: int, first: int = 0) -> DecodeRun:
        """``allocate_slots(seq, 1)`` for every request of ``seqs`` (all the requests holding blocks, in running
        order; each computes the token it sampled last), iteration after iteration, for as many of
        ``max_iterations`` iterations as the free blocks cover. The blocks go out in the order steps would hand
        them out: by iteration, then running order (``BlockNeeds`` knows who needs one when)."""
        num_iterations, growth = self.decode_run_fields(seqs, max_iterations, first)
        return _NO_RUN if num_iterations == 0 else _new_tuple(DecodeRun, (num_iterations, growth))

    def decode_run_fields(self, seqs: Iterable[Sequence], max_iterations: int, first: int = 0
                          ) -> tuple[int, tuple[int, ...]]:
        """``allocate_decode_run``, its ``DecodeRun``'s two fields as a plain tuple: what the run scheduler calls
        on a PagedAllocator itself (compiled, a plain tuple is returned as a C struct, where the named tuple is made
        by a generic call of ``tuple.__new__`` and freed, ~1.3k instructions a call; benchmarks/README.md, the
        eighteenth step)."""
        num_iterations, tables, growth, internal = self._needs.due(max_iterations, self.block_pool.num_free_blocks,
                                                                   first)
        if num_iterations == 0:
            return 0, ()
        self.block_pool.append_new_blocks(tables, len(tables))
        self._num_table_entries += len(tables)
        self.num_internal_fragmentation_slots += internal
        if self.enable_prefix_caching:
            self._cache_run(num_iterations)
        return num_iterations, tuple(growth)

    def _cache_run(self, num_iterations: int) -> None:
        """The blocks a decode run of ``num_iterations`` filled get their hashes, request by request in running order.
        A decoding request fills a block in the iteration before the one it needs its next in, so a run shorter than
        a block fills one block of each request due a block in its iterations 2 .. n + 1 (``BlockNeeds.filling``)
        and none of the others: only those are visited (visiting every running request was a fifth of a compiled
        run's instructions, most of them returning early)."""
        needs = self._needs
        # (each request's RequestHashes from its holder, where _allocate_first put it: not looked up by id in _hashes;
        # typed here so that compiled, its attributes are read natively)
        state: RequestHashes
        if num_iterations >= self.block_size:
            # Every request holding blocks (the run's ``seqs``), as BlockNeeds holds them in the same order
            # (admission's), with their states, tables and tokens: due placed them all on the clock it just advanced.
            # (Not from the requests' counters: the scheduler need not catch them up; nor through ``seqs``: compiled,
            # two attribute reads through a Protocol and three dict lookups a request. _cache_state, not
            # _cache_blocks: a decode run stores nothing where kvlab.offload overrides that.)
            clock = needs.num_decode_iterations
            for holder in needs.holders.values():
                state = holder.state
                self._cache_state(state, holder.table, clock + holder.tokens)
            return
        pool = self._cached_pool
        # Steps cache these blocks in admission order, which matters only where a hash enters the shared index (or is
        # interned): a private block's hash is its own request's, set on the block alone, so those are cached as they
        # come and only the others are sorted (the sort was a sixth of this function's instructions, compiled).
        # (the hashes as the objects the requests' lists hold: compiled, an int is unboxed and boxed again for each
        # use as a key or a stored item, an allocation each; Holder.request_id likewise)
        later: list[Holder] = []
        block_hash_of: list[Any] = pool.block_hash  # (the hashes stored as the objects the requests' lists hold)
        for bucket in self._needs.filling(num_iterations):
            for holder in bucket:
                state = holder.state
                j = state.num_cached_blocks
                hashes: list[Any] = state.block_hashes
                if j < len(hashes):  # (_cache_next_block, written out: about 12 calls per request)
                    block_hash = hashes[j]
                    value: int = block_hash  # (compared as an int: compiled, < of two objects is a generic comparison)
                    if value < 0:
                        # (pool.cache_full_block for a private block, written out: its hash set on the block alone;
                        # the call compared the hash, an object there, with 0 again, generically)
                        block_id = holder.table[j]
                        assert block_hash_of[block_id] is None, f"block {block_id} is already cached"
                        block_hash_of[block_id] = block_hash
                        state.num_cached_blocks = j + 1
                        continue
                later.append(holder)
        if later:
            BlockNeeds.in_admission_order(later)
            for holder in later:
                self._cache_next_block(holder.state)

    def _cache_next_block(self, state: RequestHashes) -> None:
        """The request's first block not yet cached gets its hash (a decode run fills one block of a request at most
        when shorter than a block)."""
        j = state.num_cached_blocks
        hashes = state.block_hashes
        if len(hashes) <= j:
            hashes = self._extend_state_hashes(state, j + 1)
        table = state.table
        assert table is not None
        self._cached_pool.cache_full_block(table[j], hashes[j])
        state.num_cached_blocks = j + 1

    def decode_run_slots(self, num_iterations: int) -> int | None:
        """The slots ``allocate_decode_run(seqs, num_iterations)`` would hand out, handing out nothing; None when the
        free blocks do not cover them all."""
        num_blocks = self._needs.num_blocks_due(num_iterations)
        return num_blocks * self.block_size if num_blocks <= self.block_pool.num_free_blocks else None

    def allocate_decode_iteration(self, evict: Callable[[], Sequence]) -> DecodeRun:
        """The running loop's blocks for one iteration in which everyone decodes and the free blocks run out
        (the KVAllocator doc): only the requests that need a block are visited (``BlockNeeds``), in running
        order; those evicted meanwhile are skipped."""
        assert not self.enable_prefix_caching, "prefix caching hashes blocks from the requests' counters: step"
        tables, pool = self._block_tables, self.block_pool
        given = 0
        for holder in self._needs.next_needs():
            request_id = holder.request_id
            if request_id not in tables:
                continue  # evicted for a request before it
            while not pool.num_free_blocks:
                if evict().request.request_id == request_id:
                    break
            if request_id not in tables:
                break  # it evicted itself
            tables[request_id].extend(pool.get_new_blocks(1))
            given += 1
        num_iterations, given_to, growth, internal = self._needs.due(1, given)
        assert num_iterations == 1 and len(given_to) == given, "the blocks given are the iteration's"
        self._num_table_entries += given
        self.num_internal_fragmentation_slots += internal
        return _new_tuple(DecodeRun, (1, tuple(growth)))

    def free(self, seq: Sequence) -> None:
        """Give back every block of the request, tail first; shared blocks only lose a reference."""
        self._free_seq(seq, False)

    def free_finished(self, seq: Sequence) -> None:
        """``free`` for a request that has finished, as its caller knows (the scheduler's finish): whether it has is
        not read from the request (compiled, the Sequence's and the Request's fields are generic reads: ``free``
        14.8k -> 13.7k instructions a request; benchmarks/README.md, the sixteenth step)."""
        self._free_seq(seq, True)

    def _free_seq(self, seq: Sequence, finished: bool) -> None:
        """``free``; ``finished``: the request has finished (False: it may not have, it is read)."""
        request = seq.request
        # (the id as the object the request holds, and get and del rather than dict.pop: compiled, an int is boxed
        # anew for each dict access, and pop is a generic method call, several times the instructions)
        request_id: Any = request.request_id
        # (its holder, which has its table, KV tokens and prefix-caching state: one lookup by id, not one in each of
        # _block_tables, _hashes and a dict of KV tokens; the holders are the requests with a _block_tables entry)
        holder = self._needs.holders.get(request_id)
        if holder is None:  # freed before it was ever allocated
            if self.enable_prefix_caching and request_id in self._hashes:  # (looked up before an admission)
                del self._hashes[request_id]
            return
        table = holder.table
        del self._block_tables[request_id]
        self._needs.forget_holder(holder)
        if self.enable_prefix_caching:
            state: RequestHashes = holder.state
            del self._hashes[request_id]
            if not finished and seq.num_tokens < request.prompt_len + request.num_output_tokens:
                # Not finished (preempted): it may come back for its own blocks, so they become findable.
                self._cached_pool.register_private(table, state.block_hashes, 0, state.num_cached_blocks)
        self._num_table_entries -= len(table)
        internal = len(table) * self.block_size - holder.kv_tokens
        if internal > 0:
            self.num_internal_fragmentation_slots -= internal
        self.block_pool.free_table(table)

    # Inspection ---------------------------------------------------------------------------------------------

    def get_num_slots(self, request_id: int) -> int:
        """Slots the request holds (0 if none): it can compute up to this many tokens without allocating."""
        table = self._block_tables.get(request_id)
        return 0 if table is None else len(table) * self.block_size

    def admission(self, seq: Sequence) -> Admission:
        """Blocks for all its tokens so far (vLLM's scheduler_reserve_full_isl, and what a whole prompt takes),
        anywhere, against the free blocks."""
        num_tokens = seq.num_tokens if self.max_model_len is None else min(seq.num_tokens, self.max_model_len)
        num_slots = num_blocks_for(num_tokens, self.block_size) * self.block_size
        return Admission(num_tokens, num_slots, self.block_pool.num_free_blocks * self.block_size, False)

    def get_block_ids(self, request_id: int) -> list[int]:
        return list(self._block_tables[request_id])

    def free_block_ids(self) -> list[int]:
        """The free queue, front (next handed out) to back."""
        return self.block_pool.free_block_ids()

    def ref_cnts(self) -> list[int]:
        """Reference count of every block (the null block's is 0).

        With prefix caching, the pool's counts; without, nothing is shared, so a block's count is the number
        of block tables holding it (kept implicit for speed) and ``check_invariants`` checks that it is <= 1.
        """
        if self.enable_prefix_caching:
            return list(self._cached_pool.ref_cnt)
        ref_cnt = [0] * self.num_blocks
        for table in self._block_tables.values():
            for block_id in table:
                ref_cnt[block_id] += 1
        return ref_cnt

    def block_hash(self, block_id: int) -> BlockHash | tuple[int, int] | None:
        """A block's hash (prefix caching only): set while it is full and cached, dropped on eviction. A shared
        block's is its interned int; a private block's is given as ``(request_id, j)``."""
        if not self.enable_prefix_caching:
            return None
        block_hash = self._cached_pool.block_hash[block_id]
        return block_hash if block_hash is None or block_hash >= 0 else private_block_key(block_hash)

    def snapshot(self, seqs: Iterable[Sequence]) -> BlockSnapshot:
        """Every pool block in block-id order; a shared block names its first holder among ``seqs``."""
        import numpy as np  # only snapshots need it; keeps `import kvlab.memory` light

        bs, nb = self.block_size, self.num_blocks
        tables, num_computed, num_kv, owners = [], [], [], []
        for seq in seqs:
            table = self._block_tables.get(seq.request.request_id)
            if table:
                tables.append(table)
                num_computed.append(seq.num_computed_tokens)
                num_kv.append(seq.request.num_kv_tokens)
                owners.append(seq.request.request_id)
        lens = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))
        total = int(lens.sum())
        ids = np.fromiter(chain.from_iterable(tables), dtype=np.int64, count=total)
        starts = np.repeat(np.cumsum(lens) - lens, lens)
        first_slot = (np.arange(total, dtype=np.int64) - starts) * bs
        token = np.clip(np.repeat(np.array(num_computed, dtype=np.int64), lens) - first_slot, 0, bs)
        written = np.clip(np.repeat(np.array(num_kv, dtype=np.int64), lens) - first_slot, 0, bs)
        refs = np.bincount(ids, minlength=nb)
        token_b = np.bincount(ids, weights=token, minlength=nb).astype(np.int64)
        # A shared block is counted by every holder; keep it once (as num_duplicate_token_slots does).
        token_b -= bs * np.maximum(refs - 1, 0)
        reserved_b = np.bincount(ids, weights=written - token, minlength=nb).astype(np.int64)
        internal_b = np.bincount(ids, weights=bs - written, minlength=nb).astype(np.int64)
        overhead_b = np.zeros(nb, dtype=np.int64)
        overhead_b[NULL_BLOCK_ID] = bs
        owner_rep = np.repeat(np.array(owners, dtype=np.int64), lens)
        owner_b = np.full(nb, -1, dtype=np.int64)
        if total and refs.max() > 1:
            _, first = np.unique(ids, return_index=True)
            owner_b[ids[first]] = owner_rep[first]
        else:
            owner_b[ids] = owner_rep
        return BlockSnapshot(
            block_size=bs,
            owner=tuple(owner_b.tolist()),
            token=tuple(token_b.tolist()),
            reserved=tuple(reserved_b.tolist()),
            internal_fragmentation=tuple(internal_b.tolist()),
            overhead=tuple(overhead_b.tolist()),
            shared=tuple((refs > 1).tolist()),
        )

    def check_invariants(self, seqs: Iterable[Sequence], *, in_running_order: bool = False,
                         all_decoding: bool = False) -> None:
        """For tests: every block is either free or owned, ref counts match the tables, counters a recount;
        ``in_running_order``: ``seqs`` are the scheduler's running queue, which must be in admission order;
        ``all_decoding``: each computes the token it sampled last next (when its next block falls is checked)."""
        held = [seq for seq in seqs if seq.request.request_id in self._block_tables]
        assert len(held) == len(self._block_tables), "a block table belongs to a request not among seqs"
        free = self.free_block_ids()
        assert len(set(free)) == len(free), "a block is twice in the free queue"
        assert self.num_free_blocks == len(free), "the free block count differs from the free queue"
        assert NULL_BLOCK_ID not in free, "the null block is in the free queue"
        holders = [0] * self.num_blocks
        for table in self._block_tables.values():
            for block_id in table:
                holders[block_id] += 1
        assert holders[NULL_BLOCK_ID] == 0, "the null block is in a block table"
        free_set = set(free)
        for block_id in range(1, self.num_blocks):
            in_queue = block_id in free_set
            assert in_queue != (holders[block_id] > 0), f"block {block_id}: free={in_queue}, holders={holders[block_id]}"
        if self.enable_prefix_caching:
            pool = self._cached_pool
            assert pool.ref_cnt == holders, "ref_cnt differs from the number of block tables holding a block"
            registered: set[int] = set()
            for block_hash, blocks in pool.cached_block_hash_to_block.items():
                block_ids = [blocks] if isinstance(blocks, int) else list(blocks)
                assert block_ids, f"empty entry for hash {block_hash!r}"
                for block_id in block_ids:
                    assert pool.block_hash[block_id] == block_hash
                registered.update(block_ids)
            assert pool.num_private_entries == sum(block_hash < 0 for block_hash in pool.cached_block_hash_to_block)
            # (a private block is in the dict once its request was preempted: PrefixCachingBlockPool.register_private)
            for block_id, maybe_hash in enumerate(pool.block_hash):
                assert maybe_hash is None or maybe_hash < 0 or block_id in registered, f"block {block_id} not findable"
            for seq in held:
                table = self._block_tables[seq.request.request_id]
                state = self._hashes.get(seq.request.request_id)
                assert self._needs.holders[seq.request.request_id].state is state, "a decode run would hash elsewhere"
                num_cached = state.num_cached_blocks if state is not None else 0
                hashes = state.block_hashes if state is not None else []
                for j, block_id in enumerate(table[:num_cached]):
                    assert pool.block_hash[block_id] == hashes[j], f"block {block_id} lost its hash while held"
            for block_id, count in enumerate(holders):
                if count > 1:
                    assert pool.block_hash[block_id] is not None, f"shared block {block_id} is not full and cached"
        else:
            assert max(holders) <= 1, "a block is shared without prefix caching"
        assert self._num_table_entries == sum(holders)
        assert self._needs.holders.keys() == self._block_tables.keys()
        for request_id, holder in self._needs.holders.items():
            assert holder.table is self._block_tables[request_id], "a holder's table is not the request's"
        assert all(self._needs.holders[seq.request.request_id].kv_tokens == seq.request.num_kv_tokens for seq in held)
        assert self.num_internal_fragmentation_slots == sum(
            max(0, len(self._block_tables[seq.request.request_id]) * self.block_size - seq.request.num_kv_tokens)
            for seq in held
        )
        for seq in held:
            table = self._block_tables[seq.request.request_id]
            assert seq.num_computed_tokens <= len(table) * self.block_size, "computed tokens without slots"
            if all_decoding:  # what a decode run would hand out next
                slack = len(table) * self.block_size - seq.num_computed_tokens
                assert self._needs.next_block_iteration(seq.request.request_id) == slack + 1, (
                    "the next block's iteration differs from the slots left")
        if in_running_order:  # the order decode runs hand blocks out in (see BlockNeeds)
            stamps = [self._needs.stamp(seq.request.request_id) for seq in held]
            assert stamps == sorted(stamps), "the requests holding blocks are not in the order they were admitted"
        check_slot_states(self, held)

    # Internals ----------------------------------------------------------------------------------------------

    def _allocate_first(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int,
                        watermark_blocks: int = 0) -> Fit:
        """Admit a request holding no blocks (new, or preempted and resumed), with its prefix-cache hit, leaving
        ``watermark_blocks`` free (vllm/v1/core/kv_cache_manager.py: allocate_slots adds them to both the full
        sequence's and this step's blocks before comparing with the free ones)."""
        assert num_new_tokens > 0 or num_cached_tokens > 0, "nothing to allocate"
        assert num_cached_tokens % self.block_size == 0, "prefix-cache hits are whole blocks"
        request = seq.request
        bs = self.block_size
        hit_blocks = self._get_hit_blocks(request, num_cached_tokens // bs) if num_cached_tokens else []
        num_tokens = seq.num_computed_tokens + num_cached_tokens + num_new_tokens
        seq_tokens = seq.num_tokens  # (read once: compiled, a read through the Sequence Protocol is generic)
        num_full_tokens = seq_tokens if self.scheduler_reserve_full_isl else 0
        max_model_len = self.max_model_len
        if max_model_len is not None:
            if num_tokens > max_model_len:
                num_tokens = max_model_len
            if num_full_tokens > max_model_len:
                num_full_tokens = max_model_len
        num_required_blocks = -(-num_tokens // bs)  # (num_blocks_for, written out: see allocate_slots)
        num_full_blocks = -(-num_full_tokens // bs)
        num_needed = num_required_blocks if num_required_blocks > num_full_blocks else num_full_blocks
        if num_needed > self.num_blocks - 1:
            return Fit.NEVER
        num_free = self.block_pool.num_free_blocks - watermark_blocks
        num_hit = len(hit_blocks)
        if hit_blocks:
            # A hit block sitting in the free queue leaves it when touched: it counts against the free blocks.
            ref_cnt = self._cached_pool.ref_cnt
            num_evictable = sum(ref_cnt[block_id] == 0 for block_id in hit_blocks)
            if max(num_full_blocks - num_hit, 0) + num_evictable > num_free:
                return Fit.LATER
            if max(num_required_blocks - num_hit, 0) + num_evictable > num_free:
                return Fit.LATER
            self._cached_pool.touch(hit_blocks)
        elif num_needed > num_free:
            return Fit.LATER
        # (the id as the object the request holds, typed Any: compiled, an int is boxed anew for each dict access, an
        # allocation each; see free)
        request_id: Any = request.request_id
        num_kv_tokens: int = request.num_kv_tokens
        if hit_blocks:
            table = hit_blocks
            self._num_table_entries += num_hit
            # Hit blocks are full of prompt tokens: never beyond num_kv_tokens.
            if num_required_blocks > num_hit:
                self._append_new_blocks(num_kv_tokens, table, num_required_blocks - num_hit)
        else:
            # (_append_new_blocks for an empty table, inlined: once per admission)
            table = self.block_pool.get_new_blocks(num_required_blocks) if num_required_blocks else []
            self._num_table_entries += num_required_blocks
            internal = num_required_blocks * bs - num_kv_tokens
            if internal > 0:
                self.num_internal_fragmentation_slots += internal
        self._block_tables[request_id] = table
        holder = self._needs.admit(request_id, table, len(table) * bs, num_tokens, num_kv_tokens)
        if self.enable_prefix_caching:
            # (_hash_state, written out with the id read above: a call read it again, generically)
            hashes = self._hashes
            state = hashes.get(request_id)
            if state is None:
                state = hashes[request_id] = RequestHashes(request)
            state.num_cached_blocks = num_hit
            state.table = table
            holder.state = state  # (a decode run reaches it from the holder: _cache_run)
            self._cache_blocks(state, table, min(num_tokens, seq_tokens))
        return Fit.NOW

    def _append_new_blocks(self, num_kv_tokens: int, table: list[int], num_new_blocks: int) -> None:
        """``num_new_blocks`` new blocks at the end of ``table``, a request's that will ever write ``num_kv_tokens``."""
        before = len(table) * self.block_size - num_kv_tokens
        table.extend(self.block_pool.get_new_blocks(num_new_blocks))
        self._num_table_entries += num_new_blocks
        # Internal fragmentation: the slots of the request's blocks beyond the last token it will ever write.
        after = len(table) * self.block_size - num_kv_tokens
        if after > 0:
            self.num_internal_fragmentation_slots += after - max(before, 0)

    def _get_hit_blocks(self, request: Request, num_hit_blocks: int) -> list[int]:
        hashes = self._extend_block_hashes(request, num_hit_blocks)
        blocks = [self._cached_pool.get_cached_block(block_hash) for block_hash in hashes[:num_hit_blocks]]
        hits = [block for block in blocks if block is not None]
        assert len(hits) == len(blocks), "prefix-cache hit no longer cached: call get_num_cached_tokens just before"
        return hits

    def _cache_blocks(self, state: RequestHashes, table: list[int], num_tokens: int) -> None:
        """Hash every block now full of (scheduled) tokens of the request whose state is ``state`` and whose block table
        is ``table``; vLLM's ``cache_blocks``. A step's allocation calls it, which kvlab.offload overrides to store
        them; a decode run calls ``_cache_state``. (The state, not the request: compiled, its lookup by the request's
        id, read generically, cost ~600 instructions a call; benchmarks/README.md, the seventeenth step.)"""
        self._cache_state(state, table, num_tokens)

    def _cache_state(self, state: RequestHashes, table: list[int], num_tokens: int) -> None:
        """``_cache_blocks`` for the request whose state is ``state`` and whose block table is ``table``."""
        num_full_blocks = num_tokens // self.block_size
        num_cached_blocks = state.num_cached_blocks
        if num_full_blocks <= num_cached_blocks:
            return
        hashes = state.block_hashes
        if len(hashes) < num_full_blocks:
            hashes = self._extend_state_hashes(state, num_full_blocks)
        self._cached_pool.cache_full_blocks(table, hashes, num_cached_blocks, num_full_blocks)
        state.num_cached_blocks = num_full_blocks

    def _extend_block_hashes(self, request: Request, num_blocks: int) -> list[BlockHash]:
        """The request's block hashes, computed up to at least ``num_blocks`` blocks (vLLM's block_hashes)."""
        return self._extend_state_hashes(self._hash_state(request), num_blocks)

    def _extend_state_hashes(self, state: RequestHashes, num_blocks: int) -> list[BlockHash]:
        """``_extend_block_hashes`` for the request whose state is ``state`` (where the caller holds it: a lookup of
        the state by request id cost ~1.1k instructions a call compiled, benchmarks/README.md, the sixteenth step)."""
        hashes = state.block_hashes
        j = len(hashes)
        if j >= num_blocks:
            return hashes
        request = state.request
        num_shared_blocks = min(num_blocks, request.num_shared_prefix_tokens // self.block_size)
        interned = self._prefix_block_hashes
        while j < num_shared_blocks:
            key = self._shared_block_key(request, hashes[j - 1] if j else None, j)
            block_hash = interned.get(key)
            if block_hash is None:
                block_hash = interned[key] = len(interned)
            hashes.append(block_hash)
            j += 1
        if j < num_blocks:
            # Private blocks (request_id and k packed in a negative int: private_block_hash), all that the request
            # will fill at once: a decode run's blocks then find theirs here.
            end = max(num_blocks, request.num_kv_tokens // self.block_size)
            base = private_block_hash(request.request_id, 0)
            # (+=, not extend: compiled, extend is a slice assignment, which first copies a range into a list of its
            # own; += fills the list from the range's iterator: 6.3k -> 5.0k instructions a request, callgrind. Nor a
            # comprehension or a loop of appends: each boxes its ints one by one, 6.1k -> 7.7k, the fifteenth step)
            hashes += range(base - j, base - end, -1)
        return hashes

    def _hash_state(self, request: Request) -> RequestHashes:
        """The request's prefix-caching state, made on first use (a lookup before admission makes it)."""
        state = self._hashes.get(request.request_id)
        if state is None:
            state = self._hashes[request.request_id] = RequestHashes(request)
        return state

    def _shared_block_key(self, request: Request, parent: BlockHash | None, j: int) -> tuple:
        """What names block ``j`` of a shared prefix: its parent's hash, then the prefix ids covering its tokens
        and where in the first of them it starts (vLLM's hash_block_tokens over the parent hash and the tokens)."""
        start = j * self.block_size
        chunk_len = request.prefix_chunk_len
        first_chunk = start // chunk_len
        last_chunk = (start + self.block_size - 1) // chunk_len
        return parent, chunk_len, request.prefix_hashes[first_chunk : last_chunk + 1], start - first_chunk * chunk_len

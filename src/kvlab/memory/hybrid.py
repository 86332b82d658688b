"""Paged KV memory for a model of several KV cache groups: one pool of blocks, one block table per group and request.

A hybrid model (Mamba / linear-attention layers beside full attention, or sliding-window layers beside full ones:
kvlab.sizing's ``kv_cache_groups``) keeps, in vLLM, ONE pool of blocks of the groups' common block size, and a
request takes blocks in every group (vllm/v1/core/kv_cache_coordinator.py HybridKVCacheCoordinator over one
single_type_kv_cache_manager.py manager per group):

full attention, MLA
    ``cdiv(tokens, block_size)`` blocks, growing with the request (FullAttentionManager).
Mamba (linear attention too: MambaSpec)
    ``state_blocks`` blocks taken at the first allocation and kept (the running state, not its tokens): one.
    ``mamba_align``: vLLM's mamba_cache_mode 'align' (prefix caching on; MambaManager's align branch), a table indexed
    by token position, one entry a block of tokens, null but for the running state's block (``cdiv(tokens,
    block_size) - 1``) and, until the allocation of the step after a request crosses a block boundary, the previous
    state's (remove_skipped_blocks frees it first). Its scheduler cuts prefill chunks at block boundaries
    (kvlab.sched.batching.mamba_aligned_chunk). A Mamba2 mixer's prefill checkpoint block (0.32.0) is not simulated.
sliding window
    a table as long as the full one, whose blocks wholly before the window are given back and replaced by the
    null block before each allocation (SlidingWindowManager.remove_skipped_blocks, called at the start of
    KVCacheManager.allocate_slots): a token ``t`` is skipped once ``t < computed - window + 1``.

An allocation is all or nothing over the groups: it fits when the sum of every group's new blocks fits the free
ones (get_num_blocks_to_allocate, summed by the coordinator). A request being admitted must also fit its whole
``num_tokens`` in every group (vLLM's ``scheduler_reserve_full_isl``, as ``PagedAllocator``), a sliding group's
blocks capped there at its window and in-flight tokens (``GroupSpec.admission_blocks``, vLLM's admission cap).

The free queue is kvlab's ``BlockPool`` (memory/block_pool.py), the one ``PagedAllocator`` uses: new blocks from its
front; a request's blocks go back group by group, each group's tail first; a sliding window's skipped blocks go
back newest first. Block 0 is the null block.

Slot accounting (kvlab.memory.base's five states): a slot is a ``block_size``-th of a block. The first full
attention (or MLA) group holds the request's tokens, so its blocks are the ``allocated`` slots (token, reserved,
internal fragmentation exactly as in ``PagedAllocator``); the other groups' blocks (Mamba states, sliding windows,
further full groups) and the null block are ``overhead``: memory the hybrid takes beyond one table of tokens.

Prefix caching: without ``mamba_align`` not simulated (``enable_prefix_caching`` is False: every lookup misses, a
strategy with prefix caching shares nothing, and the run says so: config/resolve.py). With it (vLLM's default
``prefix_cache_retention_interval`` 0) the blocks vLLM hashes go back to the back of the free queue, the others to the
front (``PrefixCachingBlockPool``): a full group's full blocks of computed tokens, one Mamba state (the prompt's last
block boundary, or the junction of a longer full-group hit found at admission); and a preempted request's own blocks
still cached are its hit at readmission (``_cache_hit``), the only hits simulated. Not simulated: speculative
decoding's lookahead slots and KV
offload (those keep the single-pool approximation: config/resolve.py). Pure Python (not in setup.py's compiled
engine): it runs for hybrid models only. A decode run is planned only at its events, the iterations where a request
takes a block in some group or a sliding window gives one back (``allocate_decode_run``): the others change nothing
but the token counts. ``allocate_decode_run_stepwise``, every request planned at every iteration, is the definition
tests/test_hybrid_decode_run.py holds it to (benchmarks/hybrid_run.py times both). In 'align' mode both stop before
an iteration past the run's first (its ``first`` + t > 0) in which a request takes or frees a block: a state block
comes the iteration a request crosses a block boundary and the previous one goes the next, which the run's growth
(token slots) does not carry, so every block of a run goes out in its first iteration, and the overhead its row
holds is every iteration's (kvlab.metrics.RunRow). The scheduler's next schedule begins there (sched/runs.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import NamedTuple

from kvlab.errors import KvlabError
from kvlab.memory.base import Admission, BlockSnapshot, DecodeRun, Fit, Sequence, check_slot_states, num_blocks_for
from kvlab.memory.block_pool import NULL_BLOCK_ID, BlockPool, PrefixCachingBlockPool
from kvlab.workload.request import Request

MAMBA = "mamba"
SLIDING = "sliding_attention"
NEVER = 1 << 62  # (a token count no request reaches: _Held.change_at's "no change ever")
TOKEN_KINDS = ("full_attention", "mla")  # groups whose table holds every token
GROUP_KINDS = (*TOKEN_KINDS, SLIDING, MAMBA)


class GroupSpec(NamedTuple):
    """One KV cache group as the allocator needs it (kvlab.sizing.KVCacheSpec, reduced to plain data):
    ``kind`` one of GROUP_KINDS, ``state_blocks`` the blocks a Mamba group holds per request, ``sliding_window`` the
    window in tokens of a sliding group (0 otherwise), ``admission_blocks`` a sliding group's cap on the blocks the
    whole-prompt admission check counts (vLLM's SlidingWindowSpec.max_admission_blocks_per_request: the window and
    the in-flight tokens, + 1; kvlab.sizing.KVCacheSpec.max_num_blocks_per_request), 0: none."""

    kind: str
    state_blocks: int = 1
    sliding_window: int = 0
    admission_blocks: int = 0
    block_size: int = 0  # the tokens one of its blocks holds (0: the allocator's; Gemma 4's sliding groups hold 32 beside 16)


class _Held:
    """One request's blocks: a table per group (block ids in token order; a sliding table starts with null blocks,
    ``nulls`` of them), the tokens it has slots for since its last allocation, the tokens it will ever write."""

    __slots__ = ("tables", "nulls", "num_tokens", "num_kv_tokens", "request_id", "replay_block", "junction_block",
                 "change_at")

    def __init__(self, num_groups: int, num_kv_tokens: int, request_id: int = -1, replay_block: int = -1) -> None:
        self.request_id = request_id
        # ('align') the Mamba state blocks vLLM hashes (prefix_cache_retention_interval 0): the one at the prompt's last
        # block boundary, and the one at the end of a longer hit its full groups found at admission (a junction)
        self.replay_block = replay_block
        self.junction_block = -1
        self.tables: list[list[int]] = [[] for _ in range(num_groups)]
        self.nulls = [0] * num_groups
        self.num_tokens = 0
        self.num_kv_tokens = num_kv_tokens
        # the first token count at which a decode step may take or free a block with these tables
        # (HybridAllocator._change_at: NEVER if none), -1 until it is counted again after they change
        self.change_at = -1


class _States(dict):
    """``_decode_events``' states of the requests ``order`` (their held blocks), each ``(lens, nulls, tokens)`` made
    when first looked up by its index: a run looks up only the requests it plans."""

    def __init__(self, order: list[_Held]) -> None:
        super().__init__()
        self.order = order

    def __missing__(self, i: int) -> tuple[list[int], list[int], int]:
        held = self.order[i]
        state = self[i] = ([len(t) for t in held.tables], held.nulls, held.num_tokens)
        return state


class _Plan(NamedTuple):
    """What one allocation does to a request's groups: blocks freed from sliding windows, new blocks per group, and
    each sliding table's null prefix after it."""

    num_freed: int
    new: tuple[int, ...]
    nulls: tuple[int, ...]


def check_groups(groups: Iterable[GroupSpec | tuple]) -> tuple[GroupSpec, ...]:
    """The groups as GroupSpecs, checked: known kinds, a positive window for a sliding group, state blocks >= 1 for
    a Mamba group, and a full attention or MLA group among them (it holds the tokens)."""
    specs = tuple(GroupSpec(*g) for g in groups)
    if not specs:
        raise KvlabError("a hybrid KV cache needs at least one KV cache group")
    for g in specs:
        if g.kind not in GROUP_KINDS:
            raise KvlabError(f"unknown KV cache group kind {g.kind!r}: expected one of {', '.join(GROUP_KINDS)}")
        if g.kind == SLIDING and g.sliding_window < 1:
            raise KvlabError(f"a sliding-window group needs a window of at least 1 token, got {g.sliding_window}")
        if g.kind == MAMBA and g.state_blocks < 1:
            raise KvlabError(f"a Mamba group needs at least 1 state block per request, got {g.state_blocks}")
    if not any(g.kind in TOKEN_KINDS for g in specs):
        raise KvlabError("the hybrid allocator needs a full attention (or MLA) group among the KV cache groups: "
                         f"got {', '.join(g.kind for g in specs)}")
    return specs


class HybridAllocator:
    """The KVAllocator interface over one pool of ``num_blocks`` blocks of ``block_size`` slots shared by the
    KV cache ``groups`` (GroupSpec or plain ``(kind, state_blocks, sliding_window, admission_blocks)`` tuples).
    Prefix-cache hits are not simulated (``enable_prefix_caching`` is False)."""

    def __init__(self, num_blocks: int, block_size: int, groups: Iterable[GroupSpec | tuple], *,
                 max_model_len: int | None = None, scheduler_reserve_full_isl: bool = True,
                 mamba_align: bool = False) -> None:
        if block_size < 1:
            raise KvlabError(f"block_size must be at least 1, got {block_size}")
        if num_blocks < 2:
            raise KvlabError(
                f"a paged KV cache needs at least 2 blocks (block 0 is vLLM's null block), got num_blocks={num_blocks}")
        self.groups = check_groups(groups)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.scheduler_reserve_full_isl = scheduler_reserve_full_isl
        self.num_slots = num_blocks * block_size
        # With prefix caching ('align') vLLM hashes a request's blocks as their tokens are computed, and a freed block
        # with a hash goes to the back of the free queue, one without to the front: the pool that orders them so
        # (each such block marked with one private hash that nothing looks up: no hit is simulated)
        self.block_pool: BlockPool | PrefixCachingBlockPool = (
            PrefixCachingBlockPool(num_blocks) if mamba_align else BlockPool(num_blocks))
        self._token_group = next(i for i, g in enumerate(self.groups) if g.kind in TOKEN_KINDS)
        # each group's tokens per block: one pool of blocks of one page size, a group whose layers' pages are smaller
        # holds proportionally more tokens in each (vLLM's unify_kv_cache_spec_page_size; kvlab.sizing)
        self._bs = tuple(g.block_size or block_size for g in self.groups)
        if self._bs[self._token_group] != block_size:
            raise KvlabError(f"the token group's blocks hold {self._bs[self._token_group]} tokens, but the allocator's "
                             f"block_size is {block_size}: they must be the same")
        # vLLM's mamba_cache_mode 'align' (prefix caching on): a Mamba group's table is indexed by token position
        # (one entry a block of tokens, null but for the running state's block and, for a step, the previous one),
        # and the scheduler cuts prefill chunks at block boundaries (``mamba_align_block_size``: 0 when off)
        self._align = tuple(mamba_align and g.kind == MAMBA for g in self.groups)
        if any(self._align) and any(bs != block_size for bs, a in zip(self._bs, self._align) if a):
            raise KvlabError("mamba_cache_mode 'align' needs the Mamba groups' blocks to hold block_size tokens")
        self.mamba_align_block_size = block_size if any(self._align) else 0
        self.enable_prefix_caching = mamba_align  # (its only hits: a preempted request's own blocks, _cache_hit)
        # request id -> (group, block index) -> (block id, the private hash it was freed with): its freed blocks
        # that vLLM had hashed, a hit while the block keeps that hash (not handed out again)
        self._hashes: dict[int, dict[tuple[int, int], tuple[int, int]]] = {}
        self._next_hash = -1
        self._held: dict[int, _Held] = {}  # request id -> its blocks, in admission order
        self._num_token_blocks = 0  # blocks in the token group's tables
        self._num_other_blocks = 0  # blocks (not the null block) in the other groups' tables
        self.num_internal_fragmentation_slots = 0

    # Counters (slots) ---------------------------------------------------------------------------------------

    @property
    def num_allocated_slots(self) -> int:
        """The token group's blocks: they hold the requests' tokens."""
        return self._num_token_blocks * self.block_size

    @property
    def num_overhead_slots(self) -> int:
        """The null block and every other group's blocks (states, windows, further full groups)."""
        return (1 + self._num_other_blocks) * self.block_size

    @property
    def num_duplicate_token_slots(self) -> int:
        return 0  # nothing is shared: no prefix caching

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    # Planning -----------------------------------------------------------------------------------------------

    def _plan(self, lens: list[int], nulls: list[int], computed: int, num_tokens: int, capped: bool = False) -> _Plan:
        """An allocation for ``num_tokens`` tokens of a request that computed ``computed`` and holds tables of
        ``lens`` entries (``nulls`` of them a sliding table's null prefix): vLLM's remove_skipped_blocks then
        get_num_blocks_to_allocate, group by group. ``capped``: the whole-prompt admission check's count, a sliding
        group's blocks capped at its ``admission_blocks`` (vLLM's apply_admission_cap)."""
        freed, new, new_nulls = 0, [], []
        for g, bs, length, k, align in zip(self.groups, self._bs, lens, nulls, self._align):
            num_required = -(-num_tokens // bs)
            if align:  # a position-indexed table; k: its first held block (the previous state, or the running one)
                if k < length - 1 and k < (computed - 1) // bs:  # the tokens computed are past the previous state
                    freed += 1
                    k = length - 1
                new.append(1 if num_required > length else 0)  # (at most one: vLLM's physical block cap)
                new_nulls.append(k if length else max(0, num_required - 1))
            elif g.kind == MAMBA:
                new.append(max(0, g.state_blocks - length))
                new_nulls.append(k)
            elif g.kind == SLIDING:
                skipped = max(0, computed - g.sliding_window + 1) // bs  # blocks wholly before the window
                removable = min(skipped, length)
                freed += max(0, removable - k)
                required = min(num_required, g.admission_blocks) if capped and g.admission_blocks else num_required
                new.append(max(0, required - max(length, skipped)))
                new_nulls.append(max(k, skipped))
            else:
                new.append(max(0, num_required - length))
                new_nulls.append(k)
        return _Plan(freed, tuple(new), tuple(new_nulls))

    def _plan_held(self, held: _Held, computed: int, num_tokens: int) -> _Plan:
        return self._plan([len(t) for t in held.tables], held.nulls, computed, num_tokens)

    def _capped(self, num_tokens: int) -> int:
        return num_tokens if self.max_model_len is None else min(num_tokens, self.max_model_len)

    # Applying -----------------------------------------------------------------------------------------------

    def _remove_skipped(self, held: _Held, plan: _Plan) -> None:
        """The sliding windows' skipped blocks back to the pool (newest first, as vLLM's remove_skipped_blocks
        collects them), replaced by the null block."""
        held.change_at = -1
        removed: list[int] = []
        where: list[tuple[int, int, int]] = []
        for g, (table, k, new_k) in enumerate(zip(held.tables, held.nulls, plan.nulls)):
            if self._align[g]:  # the previous state block, once past it (a first allocation: its null prefix)
                if new_k > k and k < len(table) and table[k] != NULL_BLOCK_ID:
                    removed.append(table[k])
                    if k == held.replay_block or k == held.junction_block:
                        where.append((g, k, table[k]))
                    table[k] = NULL_BLOCK_ID
                held.nulls[g] = new_k
                continue
            if self.groups[g].kind != SLIDING:
                continue
            for i in range(min(new_k, len(table)) - 1, k - 1, -1):
                removed.append(table[i])
                table[i] = NULL_BLOCK_ID
            held.nulls[g] = new_k
        if removed:
            if self.mamba_align_block_size:
                self._mark_hashed(held.request_id, where)
            self.block_pool.free_blocks(removed)
            self._num_other_blocks -= len(removed)

    def _take_hit(self, held: _Held, tables: list[list[int]], num_cached_tokens: int) -> None:
        """A request's hit blocks (``_cache_hit``) as its first blocks: out of the free queue (vLLM's touch)."""
        pool = self.block_pool
        assert isinstance(pool, PrefixCachingBlockPool)
        held.change_at = -1
        for g, table in enumerate(tables):
            blocks = [b for b in table if b != NULL_BLOCK_ID]
            pool.touch(blocks)
            held.tables[g][:] = table
            held.nulls[g] = len(table) - 1 if self._align[g] else 0
            if g == self._token_group:
                self._num_token_blocks += len(blocks)
            else:
                self._num_other_blocks += len(blocks)
        held.num_tokens = num_cached_tokens

    def _mark_hashed(self, request_id: int, blocks: list[tuple[int, int, int]]) -> None:
        """Blocks about to be freed that vLLM hashed (prefix caching on), ``(group, index, block id)`` each: to the
        back of the free queue, each with a private hash of its own (a block hit again keeps its first), recorded for
        the request's hits (``_cache_hit``)."""
        pool = self.block_pool
        assert isinstance(pool, PrefixCachingBlockPool)
        records = self._hashes.setdefault(request_id, {})
        for g, j, block_id in blocks:
            if pool.block_hash[block_id] is None:
                pool.cache_full_block(block_id, self._next_hash)
                self._next_hash -= 1
            records[g, j] = (block_id, pool.block_hash[block_id] or 0)

    def _grow(self, held: _Held, plan: _Plan) -> int:
        """The plan's new blocks, group by group; returns the token group's new slots."""
        pool, token_group = self.block_pool, self._token_group
        held.change_at = -1
        internal_before = self._internal(held)
        new_token_blocks = 0
        for g, (table, num_new) in enumerate(zip(held.tables, plan.new)):
            if len(table) < held.nulls[g]:  # (a sliding window admitted past its start; an 'align' state's position)
                table.extend([NULL_BLOCK_ID] * (held.nulls[g] - len(table)))
            if num_new:
                table.extend(pool.get_new_blocks(num_new))
                if g == token_group:
                    new_token_blocks = num_new
                else:
                    self._num_other_blocks += num_new
        self._num_token_blocks += new_token_blocks
        self.num_internal_fragmentation_slots += self._internal(held) - internal_before
        return new_token_blocks * self.block_size

    def _internal(self, held: _Held) -> int:
        """Slots of the request's token blocks beyond the last token it will ever write."""
        return max(0, len(held.tables[self._token_group]) * self.block_size - held.num_kv_tokens)

    def _num_held_blocks(self, held: _Held) -> int:
        return sum(len(t) - k - t[k:].count(NULL_BLOCK_ID) if a else len(t) - k
                   for t, k, a in zip(held.tables, held.nulls, self._align))

    def _place_states(self, held: _Held, plan: _Plan, num_tokens: int) -> None:
        """'align': a Mamba group's new state block goes at the position of the block of tokens that ends with
        ``num_tokens``, null entries before it (a prefill chunk that crossed more than one block boundary)."""
        held.change_at = -1
        for g, align in enumerate(self._align):
            table = held.tables[g]
            end = -(-num_tokens // self._bs[g]) - 1
            if align and plan.new[g] and len(table) < end:
                table.extend([NULL_BLOCK_ID] * (end - len(table)))

    # The KVAllocator interface ------------------------------------------------------------------------------

    def get_num_cached_tokens(self, seq: Sequence) -> int:
        return self._cache_hit(seq)[0]

    def _cache_hit(self, seq: Sequence) -> tuple[int, list[list[int]], int]:
        """A preempted request's hit on its own blocks still cached (prefix caching, 'align': the only hits
        simulated, as vLLM's HybridKVCacheCoordinator finds them for full attention and Mamba groups): the full
        groups' blocks cached from the first, up to ``num_tokens - 1`` tokens, and the last block boundary among them
        where every Mamba group kept its state. Its tokens and each group's table of hit blocks (a Mamba group's
        nulls but for that state), and the junction: the full groups' longer hit (vLLM's shared_prefix_boundary), 0
        if none."""
        records = self._hashes.get(seq.request.request_id)
        if not records or any(g.kind == SLIDING for g in self.groups):
            return 0, [], 0
        block_hash, bs = self.block_pool.block_hash if isinstance(self.block_pool, PrefixCachingBlockPool) else [], \
            self.block_size
        def cached(g: int, j: int) -> bool:
            entry = records.get((g, j))
            return entry is not None and block_hash[entry[0]] == entry[1]
        num_hit = (seq.num_tokens - 1) // bs
        for g, align in enumerate(self._align):
            if not align:
                num_hit = next((j for j in range(num_hit) if not cached(g, j)), num_hit)
        aligned = [g for g, align in enumerate(self._align) if align]
        num_full_hit = num_hit
        num_hit = next((j + 1 for j in range(num_hit - 1, -1, -1) if all(cached(g, j) for g in aligned)), 0)
        junction = num_full_hit * bs if num_full_hit > num_hit else 0
        if not num_hit:
            return 0, [], junction
        tables = [[NULL_BLOCK_ID] * (num_hit - 1) + [records[g, num_hit - 1][0]] if align
                  else [records[g, j][0] for j in range(num_hit)] for g, align in enumerate(self._align)]
        return num_hit * bs, tables, junction

    def peek_num_cached_tokens(self, request: Request) -> int:
        return 0

    def watermark_blocks(self, watermark: float) -> int:
        """``int(watermark x num_blocks)``, the null block counted (as PagedAllocator)."""
        return int(watermark * self.num_blocks)

    def _admission_blocks(self, computed: int, num_tokens: int, num_full_tokens: int) -> int:
        """Blocks a request holding nothing must find free: this step's, and its whole ``num_full_tokens``
        (reserve_full_isl: vLLM's full_sequence_must_fit check, counted with the sliding groups' admission cap)."""
        empty, zeros = [0] * len(self.groups), [0] * len(self.groups)
        need = sum(self._plan(empty, zeros, computed, num_tokens).new)
        if num_full_tokens:
            need = max(need, sum(self._plan(empty, zeros, computed, num_full_tokens, capped=True).new))
        return need

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int = 0,
                       watermark_blocks: int = 0) -> Fit:
        """Room for ``num_computed_tokens + num_new_tokens`` tokens in every group (no prefix-cache hits here)."""
        request_id = seq.request.request_id
        held = self._held.get(request_id)
        computed = seq.num_computed_tokens + num_cached_tokens
        if held is None:
            num_tokens = self._capped(computed + num_new_tokens)
            num_full = self._capped(seq.num_tokens) if self.scheduler_reserve_full_isl else 0
            _, hit, junction = self._cache_hit(seq) if self._hashes and not seq.num_computed_tokens else (0, [], 0)
            if not num_cached_tokens:
                hit = []
            # (a Mamba group's hit block, free, is counted among the blocks it takes: vLLM's evictable ones)
            need = self._admission_blocks(computed, num_tokens, num_full) + (sum(self._align) if hit else 0)
            if need > self.num_blocks - 1:
                return Fit.NEVER
            if need > self.block_pool.num_free_blocks - watermark_blocks:
                return Fit.LATER
            held = self._held[request_id] = _Held(len(self.groups), seq.request.num_kv_tokens, request_id,
                                                  (seq.request.prompt_len - 1) // self.block_size - 1)
            held.junction_block = junction // self.block_size - 1
            if hit:
                self._take_hit(held, hit, num_cached_tokens)
            plan = self._plan_held(held, computed, num_tokens)
            self._remove_skipped(held, plan)  # (nothing held yet: a window past its start gets its null prefix)
            if self.mamba_align_block_size:
                self._place_states(held, plan, num_tokens)
            self._grow(held, plan)
            held.num_tokens = num_tokens
            return Fit.NOW
        num_tokens = computed + num_new_tokens
        if num_new_tokens == 1 and computed < self._change_at(held):  # (a decode step that takes and frees nothing)
            held.num_tokens = num_tokens
            return Fit.NOW
        plan = self._plan_held(held, computed, num_tokens)
        self._remove_skipped(held, plan)  # (vLLM frees them before it counts, fit or not)
        need = sum(plan.new)
        if need > self.block_pool.num_free_blocks:
            return Fit.NEVER if self._num_held_blocks(held) + need > self.num_blocks - 1 else Fit.LATER
        if self.mamba_align_block_size:
            self._place_states(held, plan, num_tokens)
        self._grow(held, plan)
        held.num_tokens = num_tokens
        return Fit.NOW

    def _decode_step(self, held: _Held) -> int:
        """``allocate_slots(seq, 1)`` for a decoding request that fits; its token group's new slots."""
        plan = self._plan_held(held, held.num_tokens, held.num_tokens + 1)
        self._remove_skipped(held, plan)
        slots = self._grow(held, plan)
        held.num_tokens += 1
        return slots

    def _iteration_fits(self, order: list[_Held]) -> bool:
        """Whether one decode iteration of ``order`` (in running order) finds every block it takes free, each
        request's skipped blocks freed just before its own allocation, handing out nothing."""
        free = self.block_pool.num_free_blocks
        for held in order:
            plan = self._plan_held(held, held.num_tokens, held.num_tokens + 1)
            free += plan.num_freed - sum(plan.new)
            if free < 0:
                return False
        return True

    def _iteration_changes(self, order: list[_Held]) -> bool:
        """Whether some request of ``order`` takes or frees a block in the next decode iteration."""
        return any(_changes(self._plan_held(held, held.num_tokens, held.num_tokens + 1)) for held in order)

    def allocate_decode_run_stepwise(self, seqs: Iterable[Sequence], max_iterations: int, first: int = 0) -> DecodeRun:
        """``allocate_decode_run`` one iteration at a time, every request planned at every iteration: the definition
        the event-driven run is checked against (tests/test_hybrid_decode_run.py)."""
        order = [held for held in (self._held.get(seq.request.request_id) for seq in seqs) if held is not None]
        growth: list[int] = []
        num_iterations = 0
        cut = max(0, 1 - first) if self.mamba_align_block_size else max_iterations  # (see _decode_events)
        while (num_iterations < max_iterations and self._iteration_fits(order)
               and not (num_iterations >= cut and self._iteration_changes(order))):
            internal = self.num_internal_fragmentation_slots
            slots = sum(self._decode_step(held) for held in order)
            if slots:
                growth += (first + num_iterations, slots, self.num_internal_fragmentation_slots - internal)
            num_iterations += 1
        return DecodeRun(num_iterations, tuple(growth))

    def _change_at(self, held: _Held) -> int:
        """``_next_change`` of the request's tables from 0 tokens (NEVER for None): no decode step from fewer
        computed tokens takes or frees a block. Kept on the request until its tables change."""
        n = held.change_at
        if n < 0:
            first = self._next_change([len(t) for t in held.tables], held.nulls, 0)
            n = held.change_at = NEVER if first is None else first
        return n

    def _next_change(self, lens: list[int], nulls: list[int], tokens: int) -> int | None:
        """The first token count ``n >= tokens`` at which a decoding request holding tables of ``lens`` entries
        (``nulls`` of them a sliding table's null prefix) may find ``_plan(lens, nulls, n, n + 1)`` changing its
        tables: a full or sliding table one block short of ``n + 1`` tokens, a sliding window's start past a block
        beyond its null prefix, a Mamba table short of its state blocks; None: never. Never later than the first
        such ``n`` (a ``n`` where the plan changes nothing is harmless: it is applied as a no-op)."""
        first: int | None = None
        n: int | None
        for i, (g, bs, length, k) in enumerate(zip(self.groups, self._bs, lens, nulls)):
            if g.kind == MAMBA and self._align[i]:  # a new state at a block boundary, the previous one freed after
                n = length * bs if k == length - 1 else min(length * bs, (k + 1) * bs + 1)
            elif g.kind == MAMBA:
                n = tokens if length < g.state_blocks else None
            elif g.kind == SLIDING:  # new when n + 1 > length * bs; skipped > k when n - window + 1 >= (k + 1) * bs
                n = min(length * bs, (k + 1) * bs + g.sliding_window - 1)
            else:
                n = length * bs
            if n is not None and (first is None or n < first):
                first = n
        return None if first is None else max(tokens, first)

    def _decode_events(self, states: list[tuple[list[int], list[int], int]] | _States, max_iterations: int, free: int,
                       apply: Callable[[int, _Plan], tuple[int, int]], first: int = 0,
                       heap: list[tuple[int, int]] | None = None) -> tuple[int, list[tuple[int, int, int]]]:
        """A decode run of the requests' ``(lens, nulls, tokens)`` (in running order) iteration by iteration as
        ``_iteration_fits`` and ``_decode_step`` do it, but only at the iterations where some request's ``_plan``
        may change something (``_next_change``): in the others every plan is empty, so they fit and change
        nothing. ``apply(i, plan)`` carries out request ``i``'s plan (``states[i]``'s lens and nulls must follow
        it), the requests of one iteration in running order, once the whole iteration is known to fit from
        ``free`` blocks; it returns the token slots it handed out and the internal fragmentation it added. Returns
        the iterations that fit and, per iteration where some plan was applied, ``(iteration, slots, internal)``
        summed over its requests. 'align' (the module doc): the run also stops before an iteration past its
        caller's run's first (``first`` + t > 0) in which some block is taken or freed. ``heap``: each request's
        first such iteration and index, when the caller has them (``_change_at``), unordered: then only the
        requests planned are looked up in ``states``."""
        if heap is None:
            heap = []
            for i, (lens, nulls, tokens) in enumerate(states):
                n = self._next_change(lens, nulls, tokens)
                if n is not None:
                    heap.append((n - tokens, i))
        heapq.heapify(heap)
        done: list[tuple[int, int, int]] = []
        cut = max(0, 1 - first) if self.mamba_align_block_size else max_iterations  # (the first t that may cut)
        while heap and heap[0][0] < max_iterations:
            t = heap[0][0]
            batch: list[tuple[int, _Plan]] = []
            while heap and heap[0][0] == t:  # (popped in running order: ties break on the index)
                i = heapq.heappop(heap)[1]
                lens, nulls, tokens = states[i]
                plan = self._plan(lens, nulls, tokens + t, tokens + t + 1)
                free += plan.num_freed - sum(plan.new)
                if free < 0:
                    return t, done
                batch.append((i, plan))
            if t >= cut and any(_changes(plan) for _, plan in batch):
                return t, done
            slots = internal = 0
            for i, plan in batch:
                new_slots, new_internal = apply(i, plan)
                slots, internal = slots + new_slots, internal + new_internal
                lens, nulls, tokens = states[i]
                n = self._next_change(lens, nulls, tokens + t + 1)
                if n is not None:
                    heapq.heappush(heap, (n - tokens, i))
            done.append((t, slots, internal))
        return max_iterations, done

    def allocate_decode_run(self, seqs: Iterable[Sequence], max_iterations: int, first: int = 0) -> DecodeRun:
        """Decode iterations for as many of ``max_iterations`` as every block of each fits (in 'align' mode, up to
        the first past the run's first that takes or frees a block: the module doc): the blocks, frees and
        growth of ``allocate_decode_run_stepwise``, planned only at the iterations where a request takes or gives
        back a block (``_decode_events``)."""
        order = [held for held in (self._held.get(seq.request.request_id) for seq in seqs) if held is not None]
        states = _States(order)
        heap: list[tuple[int, int]] = []
        for i, held in enumerate(order):
            n = held.change_at if held.change_at >= 0 else self._change_at(held)  # (a call only when not kept)
            if n != NEVER:
                heap.append((n - held.num_tokens if n > held.num_tokens else 0, i))

        def apply(i: int, plan: _Plan) -> tuple[int, int]:
            held = order[i]
            self._remove_skipped(held, plan)
            internal = self.num_internal_fragmentation_slots
            slots = self._grow(held, plan)
            states[i][0][:] = [len(t) for t in held.tables]
            return slots, self.num_internal_fragmentation_slots - internal

        num_iterations, done = self._decode_events(states, max_iterations, self.block_pool.num_free_blocks, apply,
                                                   first, heap)
        growth = [x for t, slots, internal in done if slots for x in (first + t, slots, internal)]
        for held in order:
            held.num_tokens += num_iterations
        return DecodeRun(num_iterations, tuple(growth))

    def decode_run_slots(self, num_iterations: int) -> int | None:
        """The token slots ``allocate_decode_run`` would hand out over ``num_iterations`` iterations of every
        request holding blocks (in admission order), handing out nothing; None when they do not all fit (or, in
        'align' mode, the run would stop before them: the module doc)."""
        states = [([len(t) for t in h.tables], list(h.nulls), h.num_tokens) for h in self._held.values()]
        token_group = self._token_group

        def apply(i: int, plan: _Plan) -> tuple[int, int]:
            lens, nulls, _ = states[i]
            lens[:] = [n + k for n, k in zip(lens, plan.new)]
            nulls[:] = plan.nulls
            return plan.new[token_group] * self.block_size, 0

        fitted, done = self._decode_events(states, num_iterations, self.block_pool.num_free_blocks, apply)
        return sum(slots for _, slots, _ in done) if fitted == num_iterations else None

    def allocate_decode_iteration(self, evict: Callable[[], Sequence]) -> DecodeRun:
        """One decode iteration of every request holding blocks, in running order, as the running loop does it when
        the free blocks run out: a request that finds too few preempts the newest (``evict()``), until it fits or
        it evicted itself."""
        internal = self.num_internal_fragmentation_slots
        slots = 0
        for request_id in list(self._held):
            held = self._held.get(request_id)
            if held is None:
                continue  # evicted for a request before it
            plan = self._plan_held(held, held.num_tokens, held.num_tokens + 1)
            self._remove_skipped(held, plan)
            while sum(plan.new) > self.block_pool.num_free_blocks:
                if evict().request.request_id == request_id:
                    break
            if request_id not in self._held:
                break  # it evicted itself: everyone after it went first
            slots += self._grow(held, plan)
            held.num_tokens += 1
        growth = (0, slots, self.num_internal_fragmentation_slots - internal) if slots else ()
        return DecodeRun(1, growth)

    def free(self, seq: Sequence) -> None:
        """Every block of the request back, group by group, each group's tail first."""
        held = self._held.pop(seq.request.request_id, None)
        if held is None:
            return
        self.num_internal_fragmentation_slots -= self._internal(held)
        for g, (table, k) in enumerate(zip(held.tables, held.nulls)):
            if self.mamba_align_block_size:  # (prefix caching: the blocks whose tokens were all computed have a hash)
                self._mark_hashed(held.request_id, [(g, j, table[j]) for j in range(k, held.num_tokens // self._bs[g])
                                                    if table[j] != NULL_BLOCK_ID
                                                    and (not self._align[g] or j in (held.replay_block, held.junction_block))])
            blocks = [b for b in table[k:] if b != NULL_BLOCK_ID] if self._align[g] else table[k:]
            if g == self._token_group:
                self._num_token_blocks -= len(blocks)
            else:
                self._num_other_blocks -= len(blocks)
            self.block_pool.free_table(blocks)
        if self._hashes and seq.num_computed_tokens >= seq.request.num_kv_tokens:
            self._hashes.pop(held.request_id, None)  # (finished: it never comes back for them)

    def get_num_slots(self, request_id: int) -> int:
        held = self._held.get(request_id)
        return 0 if held is None else len(held.tables[self._token_group]) * self.block_size

    def admission(self, seq: Sequence) -> Admission:
        """Blocks in every group for all its tokens so far, anywhere, against the free blocks."""
        num_tokens = self._capped(seq.num_tokens)
        num_blocks = self._admission_blocks(seq.num_computed_tokens, num_tokens, num_tokens)
        return Admission(num_tokens, num_blocks * self.block_size, self.block_pool.num_free_blocks * self.block_size,
                         False)

    def why_never_fits(self, request: Request) -> str | None:
        """Too large when admitting it, or holding its longest context, takes more than the usable blocks: admitted
        again after a preemption, its whole sequence so far is checked (a sliding group up to its admission cap), so
        the check is at its longest context, not its prompt (a request that passed at its prompt could never be
        admitted again, and the run would stop). The reason is one text for every such request of a run (so that
        the run's reasons count them together): the groups, their Mamba state blocks and the usable blocks."""
        longest = self._capped(request.num_kv_tokens)
        admit = self._admission_blocks(0, 1, longest)  # (the whole sequence's check; a first chunk takes no more)
        peak = 0
        for g, bs in zip(self.groups, self._bs):
            if g.kind == MAMBA:  # ('align': a second one for the step a request crosses a block boundary)
                peak += 2 if self.mamba_align_block_size else g.state_blocks
            elif g.kind == SLIDING:  # the window (its first token anywhere in a block), the token being written
                peak += min(num_blocks_for(longest, bs), num_blocks_for(g.sliding_window, bs) + 1)
            else:
                peak += num_blocks_for(longest, bs)
        usable = self.num_blocks - 1
        if max(admit, peak) <= usable:
            return None
        states = sum(g.state_blocks for g in self.groups if g.kind == MAMBA)
        return (f"larger than the whole KV cache: at its longest context its blocks over the {len(self.groups)} KV "
                "cache groups" + (f", {states:,} of them Mamba state blocks whatever its length," if states else "")
                + f" are more than the {usable:,} usable (the null block aside)")

    # Inspection ---------------------------------------------------------------------------------------------

    def get_block_ids(self, request_id: int) -> list[list[int]]:
        """The request's block table in each group (null blocks where a window moved on)."""
        return [list(t) for t in self._held[request_id].tables]

    def free_block_ids(self) -> list[int]:
        """The free queue, front (next handed out) to back."""
        return self.block_pool.free_block_ids()

    def snapshot(self, seqs: Iterable[Sequence]) -> BlockSnapshot:
        """Every pool block in block-id order: a token-group block as PagedAllocator shows it, any other group's
        block (and the null block) as overhead, owned by its request."""
        bs, nb = self.block_size, self.num_blocks
        owner, token, reserved = [-1] * nb, [0] * nb, [0] * nb
        internal, overhead = [0] * nb, [0] * nb
        overhead[NULL_BLOCK_ID] = bs
        for seq in seqs:
            request_id = seq.request.request_id
            held = self._held.get(request_id)
            if held is None:
                continue
            for g, table in enumerate(held.tables):
                for j, block_id in enumerate(table):
                    if block_id == NULL_BLOCK_ID:
                        continue
                    owner[block_id] = request_id
                    if g != self._token_group:
                        overhead[block_id] = bs
                        continue
                    token[block_id] = min(bs, max(0, seq.num_computed_tokens - j * bs))
                    written = min(bs, max(0, held.num_kv_tokens - j * bs))
                    reserved[block_id] = written - token[block_id]
                    internal[block_id] = bs - written
        return BlockSnapshot(bs, tuple(owner), tuple(token), tuple(reserved), tuple(internal), tuple(overhead),
                             (False,) * nb)

    def check_invariants(self, seqs: Iterable[Sequence], *, in_running_order: bool = False,
                         all_decoding: bool = False) -> None:
        """For tests: every block but the null block is free or in exactly one table, the counters are a recount,
        the sliding tables' null prefixes are as recorded; ``all_decoding``: each request's tokens are its
        computed ones (a decode run's starting point); ``in_running_order``: ``seqs`` are in admission order."""
        held = [seq for seq in seqs if seq.request.request_id in self._held]
        assert len(held) == len(self._held), "a block table belongs to a request not among seqs"
        free = self.free_block_ids()
        assert len(set(free)) == len(free) == self.block_pool.num_free_blocks, "the free queue is inconsistent"
        assert NULL_BLOCK_ID not in free, "the null block is in the free queue"
        owned: list[int] = []
        num_token = num_other = internal = 0
        for h in self._held.values():
            for g, (table, k) in enumerate(zip(h.tables, h.nulls)):
                assert all(b == NULL_BLOCK_ID for b in table[:k]), "a sliding table's null prefix holds a block"
                blocks = table[k:]
                if self._align[g]:
                    blocks = [b for b in blocks if b != NULL_BLOCK_ID]
                    assert not table or table[-1] != NULL_BLOCK_ID != table[k] and len(blocks) <= 2, \
                        "an 'align' Mamba table holds other than its state and, for a step, the previous one"
                else:
                    assert NULL_BLOCK_ID not in blocks, "a null block past a table's null prefix"
                owned += blocks
                if g == self._token_group:
                    num_token += len(blocks)
                else:
                    num_other += len(blocks)
                if self.groups[g].kind == MAMBA and not self._align[g]:
                    assert len(table) == self.groups[g].state_blocks, "a Mamba table is not its state blocks"
            internal += self._internal(h)
            if h.change_at >= 0:
                first = self._next_change([len(t) for t in h.tables], h.nulls, 0)
                assert h.change_at == (NEVER if first is None else first), "a request's change_at is stale"
        assert len(set(owned)) == len(owned), "a block is in two tables"
        assert not set(owned) & set(free), "a block is both held and free"
        assert len(owned) + len(free) == self.num_blocks - 1, "blocks were lost or made"
        assert (num_token, num_other) == (self._num_token_blocks, self._num_other_blocks)
        assert internal == self.num_internal_fragmentation_slots
        for seq in held:
            h = self._held[seq.request.request_id]
            assert seq.num_computed_tokens <= len(h.tables[self._token_group]) * self.block_size, "tokens without slots"
            if all_decoding:
                assert h.num_tokens == seq.num_computed_tokens, "a decode run would start from other tokens"
        if in_running_order:
            ids = [seq.request.request_id for seq in held]
            assert ids == [i for i in self._held if i in set(ids)], "the running requests are not in admission order"
        check_slot_states(self, held)


def _changes(plan: _Plan) -> bool:
    """The plan takes or frees a block."""
    return bool(plan.num_freed) or any(plan.new)

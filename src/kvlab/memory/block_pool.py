"""The paged allocator's block pool: free blocks in eviction order, reference counts, cached block hashes.

Semantics of vLLM V1 (vllm/v1/core/block_pool.py, kv_cache_utils.py), written for integer block ids:

- Block 0 is the null block, never handed out; the free queue starts as blocks ``1 .. num_blocks - 1``.
- ``get_new_blocks`` takes blocks from the front of the free queue.
- ``free_blocks`` takes blocks ordered by eviction priority (a request's blocks reversed: tail first). Blocks
  whose reference count drops to 0 go back to the free queue: without a block hash to the *front* (reused
  first, LIFO), with a block hash to the *back* (kept as long as possible for prefix-cache hits, LRU).
- With prefix caching, a free block keeps its hash until it is popped for reuse (eviction); a hit on a free
  block takes it out of the middle of the queue (``touch``).

Two pools, one interface: ``BlockPool`` without prefix caching, where every freed block goes to the front and
the free queue is therefore a stack (a plain list, the fast path); ``PrefixCachingBlockPool`` with it, whose
free queue is a doubly linked list held in two lists indexed by block id, as vLLM's ``FreeKVCacheBlockQueue``
links its blocks (O(1) popleft, append, prepend and removal from the middle)::

    next_free:  0 -> front -> ... -> back -> 0      a ring through the null block 0, which is never free
    prev_free:  0 -> back  -> ... -> front -> 0     (an empty queue: next_free[0] == prev_free[0] == 0)
"""

from __future__ import annotations

from typing import Any, Final, cast

# A block's content: an interned shared-prefix hash (0, 1, ...) or a request's private block (negative: paged.py),
# which only its own request can hit: it enters cached_block_hash_to_block only when that request is preempted.
BlockHash = int

NULL_BLOCK_ID: Final = 0  # (Final: compiled, a constant, not a lookup in the module's dict at each use)


class BlockPool:
    """Blocks without prefix caching: nothing is shared, every owned block has ref_cnt 1.

    vLLM prepends every freed block (none has a hash) and pops from the front, so its free queue behaves as a
    stack; here the stack is a list whose *end* is the queue's front.
    """

    enable_caching = False

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, NULL_BLOCK_ID, -1))
        # len(self._free), kept as a plain attribute: the allocator reads it on every admission, and a property
        # costs a call each time.
        self.num_free_blocks = len(self._free)

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        free = self._free
        if num_blocks > len(free):
            raise ValueError(f"cannot get {num_blocks} blocks: only {len(free)} free")
        self.num_free_blocks -= num_blocks
        if num_blocks == 1:
            return [free.pop()]
        blocks = free[-num_blocks:]
        del free[-num_blocks:]
        blocks.reverse()
        return blocks

    def append_new_blocks(self, block_tables: list[list[int]], num_blocks: int) -> None:
        """One block from the front of the free queue appended to each of these ``num_blocks`` block tables, in
        order (as ``get_new_blocks`` would hand them out). The scheduler's decode runs hand out blocks this way,
        ~20 per request: without an intermediate list. The caller has checked that enough are free."""
        pop = self._free.pop
        for table in block_tables:
            table.append(pop())
        self.num_free_blocks -= num_blocks

    def free_blocks(self, ordered_blocks: list[int]) -> None:
        """Free blocks ordered by eviction priority: the first is reused first."""
        self.free_table(ordered_blocks[::-1])

    def free_table(self, table: list[int]) -> None:
        """A request's blocks, in token order, freed tail first (``free_blocks(table[::-1])`` without the copy)."""
        self._free.extend(table)
        self.num_free_blocks += len(table)

    def free_block_ids(self) -> list[int]:
        """The free queue, front (next handed out) to back."""
        return self._free[::-1]


class PrefixCachingBlockPool:
    """Blocks with reference counts and block hashes, for prefix caching."""

    enable_caching = True

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        # The free queue (the module's diagram), blocks 1 .. num_blocks - 1 in order. A block's entries are
        # meaningful only while it is free (ref_cnt 0). (Lists, not an OrderedDict: 339k -> 300k instructions per
        # request compiled, 592k -> 546k pure, benchmarks/count_instructions.py --case vllm.)
        self.next_free = list(range(NULL_BLOCK_ID + 1, num_blocks)) + [NULL_BLOCK_ID]
        self.prev_free = [num_blocks - 1] + list(range(NULL_BLOCK_ID, num_blocks - 1))
        # The queue's length, a plain attribute (BlockPool's).
        self.num_free_blocks = num_blocks - 1
        # block_hash -> block id, or {block id: None} in insertion order when several full blocks have equal
        # content (vLLM does not deduplicate: block tables stay append-only); a lookup returns the oldest.
        self.cached_block_hash_to_block: dict[BlockHash, int | dict[int, None]] = {}
        # Private hashes (negative) among its keys: while there are none, evicting a private block looks nothing up
        # (most evictions are of finished requests' private blocks, never registered: register_private).
        self.num_private_entries = 0

    def get_cached_block(self, block_hash: BlockHash) -> int | None:
        blocks = self.cached_block_hash_to_block.get(block_hash)
        if blocks is None or isinstance(blocks, int):
            return blocks
        return next(iter(blocks))

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"cannot get {num_blocks} blocks: only {self.num_free_blocks} free")
        next_free, block_hashes, ref_cnt = self.next_free, self.block_hash, self.ref_cnt
        # (the ids handed out as the objects the queue holds, as free_table writes its links: compiled, an id read as
        # an int is boxed anew when stored, an allocation above 256, about one a block admitted)
        next_obj: list[Any] = next_free
        blocks: list[int] = []
        blocks_obj: list[Any] = blocks
        item = next_obj[NULL_BLOCK_ID]
        block_id: int = item
        for _ in range(num_blocks):
            blocks_obj.append(item)
            item = next_obj[block_id]
            block_id = item
        next_obj[NULL_BLOCK_ID] = item  # (the new front)
        self.prev_free[block_id] = NULL_BLOCK_ID
        self.num_free_blocks -= num_blocks
        for block_id in blocks:
            block_hash = block_hashes[block_id]
            if block_hash is not None:  # (an eviction, as in append_new_blocks)
                block_hashes[block_id] = None
                if block_hash >= 0 or self.num_private_entries:
                    self._evict(block_id, block_hash)
            ref_cnt[block_id] = 1
        return blocks

    def append_new_blocks(self, block_tables: list[list[int]], num_blocks: int) -> None:
        """``BlockPool.append_new_blocks``: one block from the front of the free queue appended to each table, in
        order, evicting its cached hash if it has one. The caller has checked that enough are free."""
        next_free, block_hashes, ref_cnt = self.next_free, self.block_hash, self.ref_cnt
        # (ids appended as the objects the queue holds: see free_table. Casts here, not annotations as there: compiled,
        # the annotated form cost twice the instructions, benchmarks/README.md)
        next_obj = cast("list[object]", next_free)
        cached = self.cached_block_hash_to_block
        block_id = NULL_BLOCK_ID  # (the block before the front: none taken yet)
        for table in block_tables:
            item = next_obj[block_id]
            block_id = cast(int, item)
            block_hash = block_hashes[block_id]
            if block_hash is not None:
                # The block is reused, so its old content can no longer be hit: its hash goes, and the block from
                # its entry. (Written out, one lookup: almost every block a decode run takes was cached; with
                # cache_full_block's setdefault, 754k -> 737k instructions per request, count_instructions.py --case vllm.)
                # A private block's hash is looked up only while some private hash is registered: most are never.
                block_hashes[block_id] = None
                if block_hash >= 0 or self.num_private_entries:
                    entry = cached.pop(block_hash, None)  # (None: a private block never registered)
                    if entry is not None:
                        if entry != block_id:
                            self._evict_other(block_id, block_hash, entry)
                        elif block_hash < 0:
                            self.num_private_entries -= 1
            ref_cnt[block_id] = 1
            cast("list[object]", table).append(item)
        front = next_free[block_id]
        next_free[NULL_BLOCK_ID] = front
        self.prev_free[front] = NULL_BLOCK_ID
        self.num_free_blocks -= num_blocks

    def _evict(self, block_id: int, block_hash: BlockHash) -> None:
        """Block ``block_id``, reused, leaves its hash's entry (``append_new_blocks`` writes this out)."""
        entry = self.cached_block_hash_to_block.pop(block_hash, None)  # (None: a private block never registered)
        if entry is not None:
            if entry != block_id:
                self._evict_other(block_id, block_hash, entry)
            elif block_hash < 0:
                self.num_private_entries -= 1

    def _evict_other(self, block_id: int, block_hash: BlockHash, entry: int | dict[int, None]) -> None:
        """The rest of an eviction whose hash's entry (``entry``, popped) holds other blocks: several with equal
        content, or, for a private block never registered, the one its request left cached in an earlier life
        (``register_private``). The others keep the hash, whose entry is put back."""
        if isinstance(entry, int):
            self.cached_block_hash_to_block[block_hash] = entry
            return
        entry.pop(block_id, None)
        self.cached_block_hash_to_block[block_hash] = next(iter(entry)) if len(entry) == 1 else entry

    def touch(self, block_ids: list[int]) -> None:
        """A prefix-cache hit: one more reference; a free (ref_cnt 0) block leaves the free queue."""
        ref_cnt, next_free, prev_free = self.ref_cnt, self.next_free, self.prev_free
        for block_id in block_ids:
            if ref_cnt[block_id] == 0:
                before, after = prev_free[block_id], next_free[block_id]
                next_free[before] = after
                prev_free[after] = before
                self.num_free_blocks -= 1
            ref_cnt[block_id] += 1

    def cache_full_blocks(self, block_ids: list[int], block_hashes: list[BlockHash], start: int, end: int) -> None:
        """Give blocks ``block_ids[start:end]``, which just became full of computed tokens, their hashes
        ``block_hashes[start:end]``, so later requests can hit them. (By index, each ``cache_full_block`` written
        out: without the slices, the zip and a call per block, 723k -> 704k instructions per request,
        benchmarks/count_instructions.py --case vllm.)"""
        hash_of, cached = self.block_hash, self.cached_block_hash_to_block
        # (each hash stored as the object the request's list holds: compiled, a private hash read as an int is boxed
        # anew for the store, an allocation; see free_table)
        hash_obj: list[Any] = hash_of
        hashes_obj: list[Any] = block_hashes
        for i in range(start, end):
            block_id, hash_item = block_ids[i], hashes_obj[i]
            block_hash: int = hash_item
            assert hash_of[block_id] is None, f"block {block_id} is already cached"
            hash_obj[block_id] = hash_item
            if block_hash < 0:
                continue  # a private block: registered only if its request is preempted (register_private)
            blocks = cached.setdefault(block_hash, block_id)
            if isinstance(blocks, int):
                if blocks != block_id:
                    cached[block_hash] = {blocks: None, block_id: None}
            else:
                blocks[block_id] = None

    def cache_full_block(self, block_id: int, block_hash: Any) -> None:
        """``cache_full_blocks`` for one block. (``block_hash``, an int, typed ``Any``: the object the request's list
        holds, stored as it is: compiled, an int parameter is boxed anew for the store, an allocation for a private
        hash; see cache_full_blocks.)"""
        assert self.block_hash[block_id] is None, f"block {block_id} is already cached"
        hash_obj: list[Any] = self.block_hash
        hash_obj[block_id] = block_hash
        if block_hash >= 0:  # (a private block: registered only if its request is preempted, register_private)
            self._index(block_hash, block_id)

    def _index(self, block_hash: BlockHash, block_id: int) -> None:
        """Make ``block_id`` findable by ``block_hash`` (the newest block cached with it). cache_full_blocks writes
        this out in its loop (its hot path)."""
        cached = self.cached_block_hash_to_block
        blocks = cached.setdefault(block_hash, block_id)  # (one lookup where the hash is new, as it mostly is)
        if isinstance(blocks, int):
            if blocks != block_id:
                cached[block_hash] = {blocks: None, block_id: None}
        else:
            blocks[block_id] = None

    def free_blocks(self, ordered_blocks: list[int]) -> None:
        """Free blocks ordered by eviction priority: the first is reused (or evicted) first."""
        self.free_table(ordered_blocks[::-1])

    def register_private(self, block_ids: list[int], block_hashes: list[BlockHash], start: int, end: int) -> None:
        """Make the private blocks among ``block_ids[start:end]`` (cached, with hashes ``block_hashes[start:end]``)
        findable by their hashes: their request was preempted and may come back for them. A private block's hash
        names one request's content, so nobody else can hit it: it is set on the block (which keeps its place in
        the free queue) but left out of the dict until then (most requests finish, and their blocks are evicted
        without ever being looked up)."""
        num_entries = len(self.cached_block_hash_to_block)
        for i in range(start, end):
            if block_hashes[i] < 0:  # (as cache_full_blocks would have: it is the newest block cached with the hash)
                self._index(block_hashes[i], block_ids[i])
        self.num_private_entries += len(self.cached_block_hash_to_block) - num_entries

    def free_table(self, table: list[int]) -> None:
        """A request's blocks, in token order, freed tail first (``free_blocks(table[::-1])`` without the copy):
        those with a hash to the back of the queue as they come, the others to the front, the tail first."""
        ref_cnt, block_hash, next_free, prev_free = self.ref_cnt, self.block_hash, self.next_free, self.prev_free
        # The links written as the objects the table holds (compiled, a block id read as an int is boxed anew for
        # each store, an allocation above 256): the same lists seen as lists of objects, each id read once as both.
        # (Annotations, not typing.cast: in the pure engine a cast is a function call per block.)
        next_obj: list[Any] = next_free
        prev_obj: list[Any] = prev_free
        items: list[Any] = table
        back = prev_free[NULL_BLOCK_ID]
        back_obj = prev_obj[NULL_BLOCK_ID]
        first = last = NULL_BLOCK_ID  # the blocks going to the front, chained first .. last (none yet)
        first_obj = last_obj = back_obj
        num_freed = 0
        for i in range(len(items) - 1, -1, -1):  # (tail first; not reversed(): mypyc 2.4 fails on a list[Any]'s)
            item = items[i]
            block_id: int = item
            count = ref_cnt[block_id] - 1
            ref_cnt[block_id] = count
            if count == 0:
                num_freed += 1
                if block_hash[block_id] is not None:
                    next_obj[back] = item
                    prev_obj[block_id] = back_obj
                    back, back_obj = block_id, item
                elif first == NULL_BLOCK_ID:
                    first = last = block_id
                    first_obj = last_obj = item
                else:
                    next_obj[last] = item
                    prev_obj[block_id] = last_obj
                    last, last_obj = block_id, item
        next_free[back] = NULL_BLOCK_ID
        prev_obj[NULL_BLOCK_ID] = back_obj
        if first != NULL_BLOCK_ID:
            front = next_free[NULL_BLOCK_ID]
            next_obj[last] = next_obj[NULL_BLOCK_ID]
            prev_obj[front] = last_obj
            next_obj[NULL_BLOCK_ID] = first_obj
            prev_free[first] = NULL_BLOCK_ID
        self.num_free_blocks += num_freed

    def free_block_ids(self) -> list[int]:
        """The free queue, front (next handed out) to back."""
        next_free, blocks = self.next_free, []
        block_id = next_free[NULL_BLOCK_ID]
        while block_id != NULL_BLOCK_ID:
            blocks.append(block_id)
            block_id = next_free[block_id]
        return blocks

"""When each request holding blocks will next need a new one, if it only decodes from now on.

A decoding request computes one token per iteration, so with ``s`` slots held after its tokens so far ``t`` it
fills them in ``s - t`` iterations and needs a new block in the one after, then one every ``block_size``
iterations. Blocks are handed out just in time, so ``s - t < block_size`` once the prompt is computed (static
batching reserves a whole prompt before computing it in chunks: such a request waits outside the buckets, and
no decode run happens while it is not decoding). During a decode run every running
request decodes, so all of them move towards their next block at the same pace: on one clock
(``num_decode_iterations``, advanced by each run), a request needs blocks at the iterations of one residue
modulo ``block_size``, its phase, for as long as it only decodes. The requests are kept in one bucket per phase,
so a run of ``k`` iterations reads ``k`` buckets instead of every running request (runs are short, and most
requests need nothing in a given one). Its last block, whose slots beyond its last token are internal
fragmentation, falls at a known iteration too.

Within a bucket the requests are in admission order (a stamp that grows with each first allocation), which is
the running queue's order (admitted at the back, preempted from the back): the order steps hand blocks out in is
by iteration, then running order.

Each request held is one ``Holder`` (its block table, stamp, bucket and tokens as attributes): the buckets and a
run's order hold these, so a run reaches its requests' block tables without a dict lookup by request id (compiled,
the lookups through ``map(tables.__getitem__, ids)`` were ~350 instructions a block, benchmarks/README.md).
"""

from __future__ import annotations

from bisect import insort
from typing import Any

from kvlab.memory.base import num_blocks_for


class Holder:
    """A request holding blocks, as ``BlockNeeds`` tracks it from its admission to its ``forget``."""

    __slots__ = ("request_id", "table", "state", "kv_tokens", "stamp", "phase", "tokens", "last", "waste", "far",
                 "pending", "pending_slots", "pending_tokens")

    def __init__(self, request_id: Any, table: list[int], stamp: int, kv_tokens: int) -> None:
        # (the id as the object the caller holds, typed Any: compiled, an int attribute is boxed anew at each read,
        # an allocation for each dict lookup by it)
        self.request_id: Any = request_id
        self.table = table  # the allocator's block table for it (the same list: a run appends to it)
        self.state: Any = None  # the allocator's own record of the request, if it keeps one (paged: RequestHashes)
        # The slots it will ever write (Request.num_kv_tokens): here, not in a dict by request id beside the holders
        # (compiled, a store, a lookup and a delete per request, ~300 instructions each; benchmarks/README.md, the
        # seventeenth step)
        self.kv_tokens = kv_tokens
        self.stamp = stamp  # admission order
        self.phase = -1  # its bucket: the clock iterations of its blocks mod block_size (-1: not placed)
        self.tokens = 0  # its tokens when the clock read 0 (tokens - clock), while placed
        # The clock iteration in which it gets its last block, while placed in a bucket (-1: none, or without internal
        # fragmentation), and that block's slots beyond its last token.
        self.last = -1
        self.waste = 0
        self.far = False  # holding a block or more beyond its tokens: not decoding (placed, in no bucket)
        # Given slots or tokens since the clock last moved (in BlockNeeds._pending), to be placed with these when it
        # next does.
        self.pending = False
        self.pending_slots = 0
        self.pending_tokens = 0


def _stamp_of(holder: Holder) -> int:
    return holder.stamp


class BlockNeeds:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.num_decode_iterations = 0  # the clock: decode-run iterations so far
        self._buckets: list[list[Holder]] = [[] for _ in range(block_size)]  # phase -> requests, admission order
        # request_id -> its Holder, for every request admitted and not forgotten, in admission order (the running
        # queue's: a request admitted again is forgotten first, so it goes to the end)
        self.holders: dict[int, Holder] = {}
        self._num_far = 0  # requests holding a block or more beyond their tokens: not decoding (Holder.far)
        self._num_stamps = 0
        # The requests given slots or tokens since the clock last moved, placed when it next does (a prompt computed
        # in chunks over single iterations is placed once, not after every chunk), with what they were given last on
        # their holders (Holder.pending_slots, pending_tokens): not a dict of tuples by request id (compiled, a tuple
        # and a store per request and step, and a lookup of each holder to place it; benchmarks/README.md, the
        # seventeenth step).
        self._pending: list[Holder] = []

    def admit(self, request_id: Any, table: list[int], num_slots: int, num_tokens: int, num_kv_tokens: int
              ) -> Holder:
        """A request got its first blocks, ``table`` (the list a run appends its blocks to): ``num_slots`` held,
        ``num_tokens`` filled once this iteration ran, ``num_kv_tokens`` to be written over its life. Returns its
        holder."""
        if request_id in self.holders:  # (admitted again without a forget: its old place goes)
            self.forget(request_id)
        self._num_stamps += 1
        holder = self.holders[request_id] = Holder(request_id, table, self._num_stamps, num_kv_tokens)
        self.update_holder(holder, num_slots, num_tokens)
        return holder

    def update(self, request_id: int, num_slots: int, num_tokens: int) -> None:
        """Its slots or its tokens changed outside a decode run (a step's allocate_slots)."""
        self.update_holder(self.holders[request_id], num_slots, num_tokens)

    def update_holder(self, holder: Holder, num_slots: int, num_tokens: int) -> None:
        """``update`` for a request whose holder the caller has."""
        holder.pending_slots = num_slots
        holder.pending_tokens = num_tokens
        if not holder.pending:
            holder.pending = True
            self._pending.append(holder)

    def forget(self, request_id: Any) -> None:
        # (request ids typed Any here, in admit and in _settle, an int the dicts hold as it is: compiled, an int
        # parameter is boxed anew for each dict access, an allocation each)
        holder = self.holders.get(request_id)
        if holder is not None:
            self.forget_holder(holder)

    def forget_holder(self, holder: Holder) -> None:
        """``forget`` for a request whose holder the caller has (the allocator's free: no second lookup by id)."""
        if holder.pending:
            holder.pending = False
            self._pending.remove(holder)  # (a Holder equals only itself)
        if holder.phase >= 0:
            self._remove(holder)
        del self.holders[holder.request_id]

    def stamp(self, request_id: int) -> int:
        return self.holders[request_id].stamp

    def num_tokens(self, request_id: int) -> int:
        """The tokens the request has filled once the iterations given so far ran: those it was given last, and
        one more for each decode iteration since (the allocator hashes a run's blocks from this count: the
        scheduler's counters may lag behind a run)."""
        holder = self.holders[request_id]
        if holder.pending:
            return holder.pending_tokens
        return self.num_decode_iterations + holder.tokens

    def next_block_iteration(self, request_id: int) -> int:
        """For checks: the decode-run iteration from now (1: the next) in which the request needs a block."""
        self._settle()
        return (self.holders[request_id].phase - self.num_decode_iterations - 1) % self.block_size + 1

    def _settle(self) -> None:
        """Place the requests given since the clock last moved (on the clock as it still is)."""
        for holder in self._pending:
            holder.pending = False
            if holder.phase >= 0:
                self._remove(holder)
            self._place(holder, holder.pending_slots, holder.pending_tokens, holder.kv_tokens)
        self._pending.clear()

    def due(self, max_iterations: int, num_free_blocks: int, first: int = 0
            ) -> tuple[int, list[list[int]], list[int], int]:
        """A run of up to ``max_iterations`` iterations, as many as ``num_free_blocks`` cover: (iterations, the
        block tables of the requests that get a block, in step order (a table once per block it gets), per
        iteration (counted from ``first``) the slots and the internal fragmentation slots its new blocks add,
        flat: three ints an entry (``DecodeRun.growth``), and those internal slots in all). The clock advances by
        the run."""
        self._ready_to_decode()
        clock, bs, buckets = self.num_decode_iterations, self.block_size, self._buckets
        tables: list[list[int]] = []
        growth: list[int] = []
        lasts: list[int] = []  # (growth entries of last blocks, in clock order)
        internal = 0
        num_iterations = max_iterations
        nxt = clock + 1  # the clock iteration of the run's first
        for j in range(max_iterations):
            bucket = buckets[(nxt + j) % bs]
            if bucket:
                num_blocks = len(bucket)
                if num_blocks > num_free_blocks:
                    num_iterations = j  # the first iteration whose blocks are not all free: stop before it
                    break
                num_free_blocks -= num_blocks
                # (the tables appended one by one, not the holders by extend and their tables in a second pass:
                # compiled, extend of a list ~210 instructions a call for ~2 holders a bucket, benchmarks/README.md,
                # the sixteenth step; appends, not += of a list and of a tuple: += is the generic in-place concat,
                # and the tuple an allocation)
                # Last blocks: their slots beyond the requests' last tokens, an entry after all the iterations' blocks
                # (read off the holders visited here: a heap of the iterations with last blocks and a dict of each
                # one's requests cost ~5.9k instructions a request more compiled, heapq's calls generic;
                # benchmarks/README.md, the sixteenth step)
                at, waste = nxt + j, 0
                for holder in bucket:
                    tables.append(holder.table)
                    if holder.last == at:
                        waste += holder.waste
                        holder.last = -1
                growth.append(first + j)
                growth.append(bs * num_blocks)
                growth.append(0)
                if waste:
                    lasts.append(first + j)
                    lasts.append(0)
                    lasts.append(waste)
                    internal += waste
        if lasts:
            growth.extend(lasts)
        end = clock + num_iterations
        self.num_decode_iterations = end
        return num_iterations, tables, growth, internal

    def filling(self, num_iterations: int) -> list[list[Holder]]:
        """After a decode run of ``num_iterations`` < ``block_size`` iterations (``due``'s): the requests that filled
        a block in it, iteration by iteration, each iteration's in admission order (``in_admission_order`` sorts
        them all), as the buckets themselves, one list per iteration (not copied: read them before anyone is placed
        or removed again; extending one list with them cost ~210 instructions a bucket compiled, benchmarks/README.md,
        the sixteenth step). A decoding request fills its last block in the iteration before the one it needs a new
        block in: those due a block in the run's iterations 2 .. n + 1, one block each."""
        bs, buckets, end = self.block_size, self._buckets, self.num_decode_iterations
        filled: list[list[Holder]] = []
        for at in range(end - num_iterations + 2, end + 2):
            bucket = buckets[at % bs]
            if bucket:
                filled.append(bucket)
        return filled

    @staticmethod
    def in_admission_order(holders: list[Holder]) -> None:
        """Sort requests holding blocks by admission, the running queue's order, in place."""
        holders.sort(key=_stamp_of)

    def num_blocks_due(self, num_iterations: int) -> int:
        """The blocks the next ``num_iterations`` decode iterations take (``due``'s, the free blocks aside), the
        clock left where it is: a reader's look into a run it does not end (kvlab.sim ``Simulation.read_at``)."""
        self._ready_to_decode()
        bs, nxt, buckets = self.block_size, self.num_decode_iterations + 1, self._buckets
        cycles, part = divmod(num_iterations, bs)
        num_blocks = cycles * sum(map(len, buckets)) if cycles else 0
        return num_blocks + sum(len(buckets[(nxt + j) % bs]) for j in range(part))

    def next_needs(self) -> list[Holder]:
        """The requests that need a block in the next decode iteration, in step order (a copy)."""
        self._ready_to_decode()
        return list(self._buckets[(self.num_decode_iterations + 1) % self.block_size])

    def _ready_to_decode(self) -> None:
        """Every request placed on the clock, as decoding needs (nobody still computing a prompt)."""
        if self._pending:
            self._settle()
        assert not self._num_far, "a decode iteration while a request is still computing its prompt"

    def _place(self, holder: Holder, num_slots: int, num_tokens: int, num_kv_tokens: int) -> None:
        bs = self.block_size
        # A decoding request writes one token an iteration: it needs its next block (num_blocks_for(tokens) passes
        # the blocks it holds) in the first iteration whose token finds no slot, num_slots - num_tokens + 1 from
        # now, and then every block_size iterations.
        at = self.num_decode_iterations + num_slots - num_tokens + 1
        holder.phase = at % bs
        holder.tokens = num_tokens - self.num_decode_iterations
        if at - self.num_decode_iterations > bs:
            holder.far = True
            self._num_far += 1
            return
        bucket = self._buckets[at % bs]
        if bucket and bucket[-1].stamp > holder.stamp:
            insort(bucket, holder, key=_stamp_of)
        else:  # the newest in its bucket (a request just admitted always is): no search
            bucket.append(holder)
        num_blocks_to_come = num_blocks_for(num_kv_tokens, bs) - num_slots // bs
        waste = -num_kv_tokens % bs
        if num_blocks_to_come > 0 and waste:
            holder.last = at + bs * (num_blocks_to_come - 1)  # (due reads it off the holder in its bucket)
            holder.waste = waste

    def _remove(self, holder: Holder) -> None:
        phase = holder.phase
        holder.phase = -1
        if holder.far:
            holder.far = False
            self._num_far -= 1
            return
        # (found by identity, not list.remove: a Holder equals only itself, but compiled, remove compares each holder
        # before it generically, ~100 instructions each; benchmarks/README.md, the eighteenth step)
        bucket = self._buckets[phase]
        i = 0
        while bucket[i] is not holder:
            i += 1
        bucket.pop(i)
        holder.last = -1

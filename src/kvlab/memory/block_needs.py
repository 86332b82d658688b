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
"""

from __future__ import annotations

from bisect import insort
from heapq import heappop, heappush
from typing import Any

from kvlab.memory.base import num_blocks_for


class BlockNeeds:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.num_decode_iterations = 0  # the clock: decode-run iterations so far
        self._buckets: list[list[int]] = [[] for _ in range(block_size)]  # phase -> request ids, admission order
        self._phase: dict[int, int] = {}  # request_id -> its bucket: the clock iterations of its blocks mod block_size
        self._stamp: dict[int, int] = {}  # request_id -> admission stamp
        self._tokens: dict[int, int] = {}  # request_id -> its tokens when the clock read 0 (tokens - clock)
        self._last: dict[int, dict[int, int]] = {}  # clock iteration -> {request_id: internal slots of its last block}
        self._last_of: dict[int, int] = {}  # request_id -> the key of its entry in _last
        self._last_heap: list[int] = []  # the keys of _last (and some of removed entries: skipped)
        self._far: set[int] = set()  # requests holding a block or more beyond their tokens: not decoding
        self._num_stamps = 0
        # request_id -> (slots, tokens, KV tokens) given since the clock last moved, placed when it next does (a
        # prompt computed in chunks over single iterations is placed once, not after every chunk).
        self._pending: dict[int, tuple[int, int, int]] = {}

    def admit(self, request_id: int, num_slots: int, num_tokens: int, num_kv_tokens: int) -> None:
        """A request got its first blocks: ``num_slots`` held, ``num_tokens`` filled once this iteration ran,
        ``num_kv_tokens`` to be written over its life."""
        self._num_stamps += 1
        self._stamp[request_id] = self._num_stamps
        self._pending[request_id] = (num_slots, num_tokens, num_kv_tokens)

    def update(self, request_id: int, num_slots: int, num_tokens: int, num_kv_tokens: int) -> None:
        """Its slots or its tokens changed outside a decode run (a step's allocate_slots)."""
        self._pending[request_id] = (num_slots, num_tokens, num_kv_tokens)

    def forget(self, request_id: Any) -> None:
        # (request ids typed Any here and in _place and _remove, an int the dicts and buckets hold as it is: compiled,
        # an int parameter is boxed anew for each dict access, an allocation each; a dozen in each placing)
        if request_id in self._stamp:
            if request_id in self._pending:  # (not dict.pop: see _remove)
                del self._pending[request_id]
            if request_id in self._phase:
                self._remove(request_id)
            del self._stamp[request_id]

    def stamp(self, request_id: int) -> int:
        return self._stamp[request_id]

    def num_tokens(self, request_id: int) -> int:
        """The tokens the request has filled once the iterations given so far ran: those it was given last, and
        one more for each decode iteration since (the allocator hashes a run's blocks from this count: the
        scheduler's counters may lag behind a run)."""
        if self._pending:  # (empty after a run's blocks are handed out, when the allocator hashes them: one lookup)
            pending = self._pending.get(request_id)
            if pending is not None:
                return pending[1]
        return self.num_decode_iterations + self._tokens[request_id]

    def next_block_iteration(self, request_id: int) -> int:
        """For checks: the decode-run iteration from now (1: the next) in which the request needs a block."""
        self._settle()
        return (self._phase[request_id] - self.num_decode_iterations - 1) % self.block_size + 1

    def _settle(self) -> None:
        """Place the requests given since the clock last moved (on the clock as it still is)."""
        pending: dict[Any, tuple[int, int, int]] = self._pending  # (the ids as the dict holds them: see forget)
        for request_id, (num_slots, num_tokens, num_kv_tokens) in pending.items():
            if request_id in self._phase:
                self._remove(request_id)
            self._place(request_id, num_slots, num_tokens, num_kv_tokens)
        self._pending.clear()

    def due(self, max_iterations: int, num_free_blocks: int, first: int = 0
            ) -> tuple[int, list[int], list[int], int]:
        """A run of up to ``max_iterations`` iterations, as many as ``num_free_blocks`` cover: (iterations, the
        request ids that get a block, in step order, per iteration (counted from ``first``) the slots and the
        internal fragmentation slots its new blocks add, flat: three ints an entry (``DecodeRun.growth``), and
        those internal slots in all). The clock advances by the run."""
        self._ready_to_decode()
        clock, bs, buckets = self.num_decode_iterations, self.block_size, self._buckets
        order: list[int] = []
        growth: list[int] = []
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
                order += bucket
                growth += (first + j, bs * num_blocks, 0)
        end = clock + num_iterations
        internal = 0
        while self._last_heap and self._last_heap[0] <= end:
            at = heappop(self._last_heap)
            wastes = self._last.get(at)  # (get and del, not dict.pop: see _remove)
            if wastes is not None:
                del self._last[at]
            if wastes:  # last blocks: their slots beyond the request's last token
                waste = sum(wastes.values())
                growth += (first + at - clock - 1, 0, waste)
                internal += waste
                for request_id in wastes:
                    del self._last_of[request_id]
        self.num_decode_iterations = end
        return num_iterations, order, growth, internal

    def filling(self, num_iterations: int) -> list[int]:
        """After a decode run of ``num_iterations`` < ``block_size`` iterations (``due``'s): the requests that filled
        a block in it, iteration by iteration, each iteration's in admission order (``in_admission_order`` sorts
        them all). A decoding request fills its last block in the iteration before the one it needs a new block in:
        those due a block in the run's iterations 2 .. n + 1, one block each."""
        bs, buckets, end = self.block_size, self._buckets, self.num_decode_iterations
        ids: list[int] = []
        for at in range(end - num_iterations + 2, end + 2):
            bucket = buckets[at % bs]
            if bucket:
                ids += bucket
        return ids

    def in_admission_order(self, request_ids: list) -> None:
        """Sort request ids (holding blocks) by admission, the running queue's order, in place."""
        request_ids.sort(key=self._stamp.__getitem__)

    def num_blocks_due(self, num_iterations: int) -> int:
        """The blocks the next ``num_iterations`` decode iterations take (``due``'s, the free blocks aside), the
        clock left where it is: a reader's look into a run it does not end (kvlab.sim ``Simulation.read_at``)."""
        self._ready_to_decode()
        bs, nxt, buckets = self.block_size, self.num_decode_iterations + 1, self._buckets
        cycles, part = divmod(num_iterations, bs)
        num_blocks = cycles * sum(map(len, buckets)) if cycles else 0
        return num_blocks + sum(len(buckets[(nxt + j) % bs]) for j in range(part))

    def next_needs(self) -> list[int]:
        """The requests that need a block in the next decode iteration, in step order (a copy)."""
        self._ready_to_decode()
        return list(self._buckets[(self.num_decode_iterations + 1) % self.block_size])

    def _ready_to_decode(self) -> None:
        """Every request placed on the clock, as decoding needs (nobody still computing a prompt)."""
        if self._pending:
            self._settle()
        assert not self._far, "a decode iteration while a request is still computing its prompt"

    def _place(self, request_id: Any, num_slots: int, num_tokens: int, num_kv_tokens: int) -> None:
        bs = self.block_size
        # A decoding request writes one token an iteration: it needs its next block (num_blocks_for(tokens) passes
        # the blocks it holds) in the first iteration whose token finds no slot, num_slots - num_tokens + 1 from
        # now, and then every block_size iterations.
        at = self.num_decode_iterations + num_slots - num_tokens + 1
        self._phase[request_id] = at % bs
        self._tokens[request_id] = num_tokens - self.num_decode_iterations
        if at - self.num_decode_iterations > bs:
            self._far.add(request_id)
            return
        bucket, stamps = self._buckets[at % bs], self._stamp
        if bucket and stamps[bucket[-1]] > stamps[request_id]:
            insort(bucket, request_id, key=stamps.__getitem__)
        else:  # the newest in its bucket (a request just admitted always is): no search
            bucket.append(request_id)
        num_blocks_to_come = num_blocks_for(num_kv_tokens, bs) - num_slots // bs
        waste = -num_kv_tokens % bs
        if num_blocks_to_come > 0 and waste:
            last = at + bs * (num_blocks_to_come - 1)
            wastes = self._last.get(last)
            if wastes is None:
                self._last[last] = wastes = {}
                heappush(self._last_heap, last)
            wastes[request_id] = waste
            self._last_of[request_id] = last

    def _remove(self, request_id: Any) -> None:
        # (indexing and del, not dict.pop: compiled, pop is a generic method call, several times the instructions)
        phase = self._phase[request_id]
        del self._phase[request_id]
        del self._tokens[request_id]
        if request_id in self._far:
            self._far.remove(request_id)
            return
        self._buckets[phase].remove(request_id)
        last = self._last_of.get(request_id)
        if last is not None:
            del self._last_of[request_id]
            wastes = self._last[last]
            del wastes[request_id]
            if not wastes:
                del self._last[last]

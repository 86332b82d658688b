"""The CPU block pool: vLLM's LRU offloading manager (vllm/v1/kv_offload/lru_manager.py, LRUOffloadingManager; the
CPU backend's, vllm/v1/kv_offload/cpu.py) over kvlab's block hashes.

    lookup(hashes)         how many of the hashes, from the first, are stored (a prefix: a load is consecutive)
    prepare_store(hashes)  store those not stored yet, evicting the least recently used to make room; None when
                           there is not room for all of them (vLLM skips the store then and retries next step)
    touch(hashes)          they were used: to the most recent end (a load touches what it loads)

vLLM keeps a reference count per CPU block while a transfer is in flight (such a block is not evicted); kvlab's
transfers complete within the iteration that starts them, so every stored block may be evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class CPUOffloadingManager:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.blocks: OrderedDict[Hashable, None] = OrderedDict()  # least recently used first
        self.num_stored_blocks = 0
        self.num_evicted_blocks = 0

    def lookup(self, hashes: Sequence[Hashable]) -> int:
        blocks = self.blocks
        for i, block_hash in enumerate(hashes):
            if block_hash not in blocks:
                return i
        return len(hashes)

    def touch(self, hashes: Sequence[Hashable]) -> None:
        move = self.blocks.move_to_end
        for block_hash in hashes:
            if block_hash in self.blocks:
                move(block_hash)

    def prepare_store(self, hashes: Sequence[Hashable]) -> list[Hashable] | None:
        """The hashes stored now (those not stored yet, in order), or None when they do not fit."""
        blocks = self.blocks
        new = [h for h in dict.fromkeys(hashes) if h not in blocks]
        if len(new) > self.num_blocks:
            return None
        for _ in range(len(blocks) + len(new) - self.num_blocks):
            blocks.popitem(last=False)
            self.num_evicted_blocks += 1
        for block_hash in new:
            blocks[block_hash] = None
        self.num_stored_blocks += len(new)
        return new

    def stored_hashes(self) -> list[Hashable]:
        """For tests: the stored hashes, least recently used first (a private block's as ``(request_id, j)``)."""
        from kvlab.memory.paged import private_block_key

        return [private_block_key(h) if isinstance(h, int) and h < 0 else h for h in self.blocks]

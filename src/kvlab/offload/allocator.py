"""Paged memory with a CPU tier behind it: vLLM's OffloadingConnector, scheduler side
(vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py, OffloadingConnectorScheduler).

    store   ``_get_reqs_to_store``: at every step, each scheduled request's blocks that are full once the step's
            tokens are computed, from the last one stored (``_next_stored_block_idx``), go to the CPU tier
            (``prepare_store``: those already there skipped, the least recently used evicted for room). Blocks are
            stored as they fill: nothing more happens when a GPU block is evicted from the prefix cache or a
            request completes (vLLM only holds a finished request's blocks until its stores are done).
    lookup  ``get_num_new_matched_tokens``: a request being admitted finds, after its GPU prefix-cache hit, the
            blocks that follow it in the CPU tier, consecutive, full blocks only (and, as on the GPU, never its
            last token: it is computed again for its logits).
    load    ``update_state_after_alloc``: the scheduler allocates GPU blocks for those tokens as computed
            (vLLM's allocate_slots(num_new_tokens + num_external_computed_tokens, num_new_local_computed_tokens));
            the worker copies them in; they count as computed and are cached on the GPU too; stores resume after
            them.

Here the tier is the allocator's: the scheduler sees one prefix-cache hit (GPU + CPU) through
``get_num_cached_tokens``, as vLLM's scheduler sees local + external computed tokens, and the counters keep the
two apart. The bytes loaded in a step are taken by the simulator (``take_load_bytes``) and priced over the host
link in that step; stores overlap the forward pass (vLLM copies on a separate CUDA stream) and cost no step time.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvlab.memory.base import DecodeRun, Fit, Sequence
from kvlab.memory.paged import PagedAllocator, RequestHashes
from kvlab.offload.manager import CPUOffloadingManager


class OffloadingPagedAllocator(PagedAllocator):
    def __init__(self, num_blocks: int, block_size: int, *, num_cpu_blocks: int, block_bytes: int = 0,
                 max_model_len: int | None = None):
        super().__init__(num_blocks, block_size, enable_prefix_caching=True, max_model_len=max_model_len)
        self.cpu = CPUOffloadingManager(num_cpu_blocks)
        self.block_bytes = block_bytes
        self._next_stored_block_idx: dict[int, int] = {}
        self._gpu_hit: dict[int, int] = {}  # request_id -> the GPU part of its last lookup, in tokens
        self._in_decode_run = False  # (a decode run stores the blocks it fills in step order: allocate_decode_run)
        self.num_gpu_hit_tokens = 0
        self.num_cpu_hit_tokens = 0
        self.num_loaded_blocks = 0
        self._load_bytes = 0

    # -- lookup and load ----------------------------------------------------------------------------------------

    def get_num_cached_tokens(self, seq: Sequence) -> int:
        """The GPU prefix-cache hit, and after it the blocks the CPU tier holds (vLLM: local + external)."""
        gpu = super().get_num_cached_tokens(seq)
        request = seq.request
        max_num_blocks = (seq.num_tokens - 1) // self.block_size
        first = gpu // self.block_size
        hashes = self._extend_block_hashes(request, max_num_blocks)[first:max_num_blocks]
        self._gpu_hit[request.request_id] = gpu
        return gpu + self.cpu.lookup(hashes) * self.block_size

    def _allocate_first(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int,
                        watermark_blocks: int = 0) -> Fit:
        request_id = seq.request.request_id
        gpu = self._gpu_hit.pop(request_id, 0) if num_cached_tokens else 0
        cpu = num_cached_tokens - gpu
        bs = self.block_size
        # Stores resume after what was loaded; a request that loads nothing stores from its first block.
        self._next_stored_block_idx[request_id] = num_cached_tokens // bs if cpu else 0
        fit = super()._allocate_first(seq, num_new_tokens + cpu, gpu, watermark_blocks)
        if fit is not Fit.NOW:
            del self._next_stored_block_idx[request_id]
            return fit
        self.num_gpu_hit_tokens += gpu
        if cpu:
            loaded = self._hashes[request_id].block_hashes[gpu // bs:num_cached_tokens // bs]
            self.cpu.touch(loaded)
            self.num_cpu_hit_tokens += cpu
            self.num_loaded_blocks += len(loaded)
            self._load_bytes += len(loaded) * self.block_bytes
        return fit

    def peek_load_bytes(self) -> int:
        """``take_load_bytes``' answer, taking nothing (the simulator prices a run's first iteration before it ends)."""
        return self._load_bytes

    def take_load_bytes(self) -> int:
        """Bytes loaded from the CPU tier since the last call (the simulator prices them in the step)."""
        num_bytes, self._load_bytes = self._load_bytes, 0
        return num_bytes

    # -- store --------------------------------------------------------------------------------------------------

    def _cache_blocks(self, state: RequestHashes, table: list[int], num_tokens: int) -> None:
        super()._cache_blocks(state, table, num_tokens)
        if not self._in_decode_run:
            self._store(state.request.request_id, state.num_cached_blocks)

    def _store(self, request_id: int, num_blocks: int) -> None:
        start = self._next_stored_block_idx.get(request_id, 0)
        if num_blocks > start and self.cpu.prepare_store(self._hashes[request_id].block_hashes[start:num_blocks]) is not None:
            self._next_stored_block_idx[request_id] = num_blocks

    def allocate_decode_run(self, seqs: Iterable[Sequence], max_iterations: int, first: int = 0) -> DecodeRun:
        """The run's blocks, and the blocks it fills stored as its steps would store them: by the iteration in which
        each fills, then in running order."""
        seqs = list(seqs)
        before = {seq.request.request_id: self._hashes[seq.request.request_id].num_cached_blocks for seq in seqs}
        self._in_decode_run = True
        try:
            run = super().allocate_decode_run(seqs, max_iterations, first)
        finally:
            self._in_decode_run = False
        bs, fills = self.block_size, []
        for index, seq in enumerate(seqs):
            request_id = seq.request.request_id
            num_computed = self._needs.num_tokens(request_id) - run.num_iterations  # (the counters may lag)
            for j in range(before[request_id], self._hashes[request_id].num_cached_blocks):
                fills.append(((j + 1) * bs - num_computed, index, request_id, j + 1))
        for _, _, request_id, num_blocks in sorted(fills):
            self._store(request_id, num_blocks)
        return run

    def free(self, seq: Sequence) -> None:
        super().free(seq)
        self._next_stored_block_idx.pop(seq.request.request_id, None)
        self._gpu_hit.pop(seq.request.request_id, None)

    # -- counters -----------------------------------------------------------------------------------------------

    def offload_stats(self) -> dict:
        """The JSON summary's fields: prefix hits from each tier, and what moved."""
        cpu = self.cpu
        return {
            "num_cpu_blocks": cpu.num_blocks,
            "gpu_prefix_hit_tokens": self.num_gpu_hit_tokens,
            "cpu_prefix_hit_tokens": self.num_cpu_hit_tokens,
            "offload_stored_blocks": cpu.num_stored_blocks,
            "offload_loaded_blocks": self.num_loaded_blocks,
            "offload_evicted_blocks": cpu.num_evicted_blocks,
            "offload_stored_bytes": cpu.num_stored_blocks * self.block_bytes,
            "offload_loaded_bytes": self.num_loaded_blocks * self.block_bytes,
        }

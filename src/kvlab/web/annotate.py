"""What the lab writes on its figures, read from the simulator's public state between two frames.

Per grid and frame: who was evicted since the last frame (so the page can flash their pages out), the free memory
and its largest gap, and the conversation at the head of the queue with what it needs (so the page can say
"99 blocks free, the next conversation needs 128"). Nothing here changes the simulation; it reads block snapshots
(owner and token columns), the counters, and the workload's requests.

Evictions are not named by the engine's counters, only counted. Between two frames a conversation that stops
holding memory has either finished or been evicted; when the eviction counter rose by d, the d that left with the
most of their answer still to write are the evicted ones (a finishing conversation leaves with almost nothing left).
"""

from __future__ import annotations

import math

import numpy as np


def slab_slots(allocator: str, prompt_len: int, num_output_tokens: int, max_tokens: int | None,
               max_model_len: int) -> int:
    """Slots a contiguous allocator reserves at admission (the vLLM paper's §6.1 baselines), before the buddy
    allocator rounds the slab up to a power of two."""
    if allocator == "max":
        return max_model_len if max_tokens is None else min(max_model_len, prompt_len + max_tokens)
    if allocator == "pow2":
        return min(max_model_len, prompt_len + (1 << max(0, num_output_tokens - 1).bit_length()))
    return min(max_model_len, prompt_len + num_output_tokens)  # oracle


def free_gaps(cols: dict[str, np.ndarray]) -> tuple[int, int, int]:
    """(free blocks, largest run of consecutive free blocks, where it starts); start -1 when nothing is free."""
    free = (cols["owner"] < 0) & (cols["overhead"] == 0) & (cols["token"] == 0) & (cols["reserved"] == 0)
    num_free = int(np.count_nonzero(free))
    if not num_free:
        return 0, 0, -1
    edges = np.flatnonzero(np.diff(free, prepend=False, append=False))
    starts, ends = edges[::2], edges[1::2]
    i = int(np.argmax(ends - starts))
    return num_free, int(ends[i] - starts[i]), int(starts[i])


def held_tokens(cols: dict[str, np.ndarray]) -> dict[int, int]:
    """Tokens each conversation holds, by request id."""
    owner = cols["owner"]
    mask = owner >= 0
    if not mask.any():
        return {}
    ids = owner[mask]
    if ids.max() > 64 * len(owner):  # sparse ids: sort them rather than count into a huge array
        uniq, inverse = np.unique(ids, return_inverse=True)
        sums = np.bincount(inverse, weights=cols["token"][mask]).astype(np.int64)
        return dict(zip(uniq.tolist(), sums.tolist()))
    counts = np.bincount(ids)
    sums = np.bincount(ids, weights=cols["token"][mask]).astype(np.int64)
    present = np.flatnonzero(counts)
    return dict(zip(present.tolist(), sums[present].tolist()))


class Annotator:
    """One grid's notes, frame after frame. ``requests`` are the workload's, in arrival order."""

    def __init__(self, requests, allocator: str, block_size: int, max_model_len: int, start_time: float):
        self.requests = list(requests)
        self.by_id = {r.request_id: r for r in self.requests}
        self.allocator = allocator
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.start_time = start_time
        self.seen: set[int] = set()  # ever held memory
        self.readmit: list[tuple[int, int]] = []  # evicted, back at the head of the queue: (id, tokens to redo)
        self.next_index = 0  # the first request in arrival order that has never held memory
        self.prev_held: dict[int, int] = {}
        self.prev_preemptions = 0
        # Evictions named so far, and the answer tokens those conversations had generated (which recomputation
        # computes again): read off their pages in the frame before they left, so only whole when every
        # eviction fell between two frames of its own.
        self.num_evictions_seen = 0
        self.num_recomputed_output_tokens = 0

    def note(self, cols: dict[str, np.ndarray], counters: dict, now: float) -> dict:
        held = held_tokens(cols)
        evicted = self._evicted(held, counters["num_preemptions"])
        self.seen.update(held)
        # vLLM puts a preempted request back at the head of the queue; of several preempted together (newest
        # first) the oldest ends up in front.
        self.readmit = [(rid, self.prev_held[rid]) for rid in evicted] + [
            (rid, n) for rid, n in self.readmit if rid not in held and rid not in evicted]
        self.prev_held = held
        num_free, gap, gap_start = free_gaps(cols)
        out = {"evicted": evicted, "free_blocks": num_free, "gap_blocks": gap, "gap_start": gap_start,
               "evictions_seen": self.num_evictions_seen,
               "recomputed_output_tokens": self.num_recomputed_output_tokens}
        if counters["num_waiting"] > 0:
            out.update(self._next(now))
        return out

    def _evicted(self, held: dict[int, int], num_preemptions: int) -> list[int]:
        rose = num_preemptions - self.prev_preemptions
        self.prev_preemptions = num_preemptions
        if rose <= 0:
            return []
        gone = [rid for rid in self.prev_held if rid not in held]

        def left_to_write(rid: int) -> int:
            r = self.by_id[rid]
            return r.prompt_len + r.num_output_tokens - self.prev_held[rid]

        evicted = sorted(sorted(gone, key=left_to_write, reverse=True)[:rose])
        self.num_evictions_seen += len(evicted)
        self.num_recomputed_output_tokens += sum(
            max(0, self.prev_held[rid] - self.by_id[rid].prompt_len) for rid in evicted)
        return evicted

    def _next(self, now: float) -> dict:
        """The head of the queue: an evicted conversation first (vLLM puts it back in front), else the earliest
        arrival that has never held memory; and the blocks it needs to be admitted."""
        if self.readmit:
            rid, tokens = self.readmit[0]
            return {"next_id": rid, "next_blocks": math.ceil(tokens / self.block_size), "next_readmit": True}
        while self.next_index < len(self.requests) and self.requests[self.next_index].request_id in self.seen:
            self.next_index += 1
        if self.next_index >= len(self.requests):
            return {}
        r = self.requests[self.next_index]
        if r.arrival_time > now:
            return {}
        if self.allocator == "paged":
            slots = r.prompt_len
        else:
            # The slab, placed by a buddy allocator: a chunk of the next power of two (memory/contiguous.py).
            slab = slab_slots(self.allocator, r.prompt_len, r.num_output_tokens, r.max_tokens, self.max_model_len)
            slots = 1 << (slab - 1).bit_length()
        return {"next_id": r.request_id, "next_blocks": math.ceil(slots / self.block_size), "next_readmit": False}

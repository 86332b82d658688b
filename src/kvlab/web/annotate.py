"""What the lab writes on its figures, read from the engine's own objects at the frame it annotates.

Nothing here keeps a copy of an engine fact or guesses one; each note names its source:

    the head of the queue    ``sim.scheduler.waiting[0]``, the request the scheduler tries next
    what it needs            ``allocator.admission(seq)``: a slab's buddy chunk in one piece, or its blocks anywhere,
                             beside the room there is now (kvlab/memory/base.py)
    why it waits             the batching policy (static: the batch runs to its end), the seats
                             (``max_num_seqs``), or that memory
    who was evicted          the ``preempted_req_ids`` of the SchedulerOutputs the engine ran since the last frame
                             (``Simulation.run_until`` and ``step`` return them)
    what evictions cost      tokens dropped and waiting to be computed again (``Seq.num_lost_tokens`` of the queue),
                             and those recomputed so far (the scheduler's counter)
    a conversation's table   the allocator's block ids (pages) or slab (reserve-the-max), in token order

Where the lab outlines a free piece on the grid, it is the one the allocator would hand out: the lowest aligned
run of free blocks of the largest free chunk's size (the buddy allocator places lowest-address first).
"""

from __future__ import annotations

import numpy as np

from kvlab.sched.seq import SeqStatus


def free_mask(cols: dict[str, np.ndarray]) -> np.ndarray:
    return (cols["owner"] < 0) & (cols["overhead"] == 0) & (cols["token"] == 0) & (cols["reserved"] == 0)


def free_piece(free: np.ndarray, num_blocks: int) -> int:
    """The first block of the lowest run of ``num_blocks`` free blocks starting at a multiple of ``num_blocks``
    (where a buddy chunk of that many blocks lies); -1 if there is none."""
    if num_blocks < 1 or num_blocks > len(free):
        return -1
    m = len(free) // num_blocks
    whole = free[: m * num_blocks].reshape(m, num_blocks).all(axis=1)
    hits = np.flatnonzero(whole)
    return int(hits[0]) * num_blocks if len(hits) else -1


def head_of_queue(sim) -> dict | None:
    """The request the scheduler tries next, what admitting it takes, and what keeps it waiting ("" if nothing:
    it joins at the next iteration)."""
    sched = sim.scheduler
    if not sched.waiting:
        return None
    seq = sched.waiting[0]
    need = sim.allocator.admission(seq)
    if sim.strategy.batching == "static" and sched.running:
        waits = "batch"
    elif len(sched.running) >= sched.config.max_num_seqs:
        waits = "seats"
    elif need.num_slots > need.num_room_slots:
        waits = "memory"
    else:
        waits = ""
    return {
        "id": seq.request_id,
        "evicted": seq.status is SeqStatus.PREEMPTED,
        "num_tokens": seq.num_tokens,
        "asked_slots": need.num_asked_slots,
        "slots": need.num_slots,
        "room_slots": need.num_room_slots,
        "one_piece": need.in_one_piece,
        "waits": waits,
    }


def block_table(sim, request_id: int, block_size: int) -> dict:
    """Where conversation ``request_id``'s KV lies, logical block j -> display block: its page table (pages) or
    its slab (one piece, consecutive blocks); or where it is if it holds no memory."""
    seq = sim.seqs.get(request_id)
    status = seq.status.value if seq is not None else "not arrived"
    out: dict = {"id": request_id, "status": status, "blocks": []}
    if seq is None or sim.allocator.get_num_slots(request_id) == 0:
        return out
    out["num_computed_tokens"] = seq.num_computed_tokens
    out["num_tokens"] = seq.num_tokens
    if sim.strategy.allocator == "paged":
        out["blocks"] = sim.allocator.get_block_ids(request_id)
    else:
        slab = sim.allocator.get_slab(request_id)
        first = slab.address // block_size
        out["blocks"] = list(range(first, -(-(slab.address + slab.num_slots) // block_size)))
        out["slab_slots"] = slab.num_slots
        out["chunk_slots"] = slab.chunk_size
    return out


def note(sim, cols: dict[str, np.ndarray], evicted: list[int], block_size: int) -> dict:
    """One grid's note for one frame (``cols``: the frame's snapshot columns; ``evicted``: the ids the engine
    preempted since the last frame, in order)."""
    free = free_mask(cols)
    out: dict = {"evicted": evicted, "free_blocks": int(np.count_nonzero(free)),
                 # what each still has to compute again (0 if it came back and recomputed before this frame)
                 "evicted_tokens": [sim.seqs[rid].num_lost_tokens for rid in evicted],
                 "tokens_to_recompute": sum(seq.num_lost_tokens for seq in sim.scheduler.waiting)}
    reasons = sim.counters.reject_reasons
    if reasons:  # turned away on arrival: how many, and the engine's commonest reason (kvlab.sim admission)
        reason = max(reasons, key=reasons.get)
        out["rejected"] = {"count": sim.counters.num_rejected, "reason": reason}
    head = head_of_queue(sim)
    if head is not None:
        out["head"] = head
        if head["one_piece"] and head["room_slots"] >= block_size:
            # The free chunk the allocator would hand out, outlined on the grid.
            size = head["room_slots"] // block_size
            out["piece"] = [free_piece(free, size), size]
    return out

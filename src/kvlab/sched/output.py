"""What the scheduler decided: one immutable value per run of iterations, read by the cost model, the metrics,
the trace and the animation (vLLM's SchedulerOutput, reduced to what a simulator needs, plus runs).

A run is ``num_iterations >= 1`` iterations of the same batch. For more than one, every scheduled request is
decoding (it computes the one token it sampled last, once per iteration), so iteration ``j`` (from 0) reads
``num_context_tokens + j * num_decode_tokens`` tokens of KV, and as many attention pairs. Stepping is a run of
one iteration: every field then describes that iteration alone.
"""

from __future__ import annotations

from typing import NamedTuple


class SchedulerOutput(NamedTuple):
    """(A named tuple: as immutable as a frozen dataclass, and built several times per simulated request.)"""

    step: int  # the engine step of the run's first iteration (vLLM counts one per iteration)
    # request_id -> tokens computed for it in each iteration, in schedule order (running first, then admitted).
    num_scheduled_tokens: dict[int, int]
    new_req_ids: tuple[int, ...]  # admitted this iteration (new or resumed after preemption)
    preempted_req_ids: tuple[int, ...]  # evicted this iteration, newest first
    num_prefill_tokens: int  # tokens of prompts (or of recomputation) computed in the (first) iteration
    num_decode_tokens: int  # one per request generating its next token
    num_context_tokens: int  # KV read by attention in the first iteration: sum of (computed + new) per request
    num_attention_pairs: int  # sum of new × (computed + (new + 1) / 2) in the first iteration
    num_swap_bytes: int = 0  # KV moved between GPU and CPU memory (swap preemption; single iterations only)
    num_iterations: int = 1
    # Made by the scheduler's run path (every request decodes; it may still be one iteration long): the
    # scheduler applies it to its requests as a run (see Scheduler.sync).
    is_decode_run: bool = False
    # A single iteration in which every request running before it decodes (their blocks from the allocator's
    # decode-run call) and the batching policy admits ``new_req_ids``: the decoders advance on the scheduler's
    # clock, as in a run of one, and only the admitted are visited.
    decodes_in_bulk: bool = False
    # Memory handed out during the run, per block: (iteration from 0, slots, internal fragmentation slots)
    # (the allocator's DecodeRun.growth); the allocator's counters already include all of it.
    kv_growth: tuple[tuple[int, int, int], ...] = ()

    @property
    def total_num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_seqs(self) -> int:
        return len(self.num_scheduled_tokens)

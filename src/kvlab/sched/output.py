"""What the scheduler decided for one iteration: one immutable value, read by the cost model, the metrics,
the trace and the animation (vLLM's SchedulerOutput, reduced to what a simulator needs)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    step: int
    # request_id -> tokens computed for it this iteration, in schedule order (running first, then admitted).
    num_scheduled_tokens: dict[int, int]
    new_req_ids: tuple[int, ...]  # admitted this iteration (new or resumed after preemption)
    preempted_req_ids: tuple[int, ...]  # evicted this iteration, newest first
    num_prefill_tokens: int  # tokens of prompts (or of recomputation) computed this iteration
    num_decode_tokens: int  # one per request generating its next token
    num_context_tokens: int  # KV read by attention: sum over scheduled requests of (computed + new)
    num_attention_pairs: int  # sum of new × (computed + (new + 1) / 2): token pairs attention multiplies
    num_swap_bytes: int = 0  # KV moved between GPU and CPU memory this iteration (swap preemption)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_seqs(self) -> int:
        return len(self.num_scheduled_tokens)

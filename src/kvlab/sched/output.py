"""What the scheduler decided: one immutable value per run of iterations, read by the cost model, the metrics,
the trace and the animation (vLLM's SchedulerOutput, reduced to what a simulator needs, plus runs).

A run is ``num_iterations >= 1`` iterations of the same batch. The fields describe its first iteration; from the
second on, every scheduled request is decoding (it computes the one token it sampled last, once per iteration),
so iteration ``j >= 1`` reads ``num_context_tokens + j * num_seqs`` tokens of KV, and as many attention pairs.
The first iteration is a decode too (``is_decode_run``), or it admits ``new_req_ids`` beside the decoders
(``decodes_in_bulk``), who then decode with them. Stepping is a run of one iteration: every field then describes
that iteration alone.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

# What the caller's clock said of a run when the scheduler asked it how many iterations fit (the horizon,
# kvlab/sim.py): (their durations, a list or a numpy array; the clock at their end; whether the run may go past
# arrivals, the queue's head waiting for a finish). Opaque to the scheduler, which carries it back to the caller in
# the run's output. (A plain tuple, unpacked by name where it is read: a named tuple's constructor cost 1% of a
# light load's instructions, benchmarks/count_instructions.py.)
RunTiming = tuple[Any, float, bool]


class SchedulerOutput(NamedTuple):
    """(A named tuple: as immutable as a frozen dataclass, and built several times per simulated request. The
    scheduler makes it with ``scheduler_output(step=..., ...)``: calling the class sends the keywords through a
    dict first (CPython's type call), about 5k instructions more an output, 2-3% of a simulated request, and even
    its ``__new__`` is a Python function, a frame per output, ~2k instructions compiled; benchmarks/README.md.)"""

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
    # A first iteration in which every request running before it decodes (their blocks from the allocator's
    # decode-run call) and the batching policy admits ``new_req_ids``: the decoders advance on the scheduler's
    # clock, as in a run of one, and only the admitted are visited. When it is longer, each admitted request
    # computed all its tokens in the first iteration, and the whole batch decodes in the others.
    decodes_in_bulk: bool = False
    # Memory handed out during the run: (iteration from 0, slots, internal fragmentation slots), one entry per
    # iteration that hands out blocks or fills last blocks, flat (three ints an entry: the allocator's
    # DecodeRun.growth); the allocator's counters already include all of it.
    kv_growth: tuple[int, ...] = ()
    # A run's iterations as the caller's horizon priced them (RunTiming: durations, end, past arrivals), or None:
    # each is priced from the fields. The run may be shorter than the horizon's count (the blocks ran out): its
    # first num_iterations durations are the run's.
    timing: RunTiming | None = None

    @property
    def total_num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_seqs(self) -> int:
        return len(self.num_scheduled_tokens)

    def scheduled_in(self, iteration: int) -> dict[int, int]:
        """request_id -> tokens computed in iteration ``iteration`` (from 0) of the run."""
        return self.num_scheduled_tokens if iteration == 0 else dict.fromkeys(self.num_scheduled_tokens, 1)


# tuple.__new__, bound once: a named tuple made by it directly is one C call (the named tuple's own __new__ is a
# Python function, which the compiled engine calls through a frame).
new_tuple: Final = tuple.__new__


def scheduler_output(step: int, num_scheduled_tokens: dict[int, int], new_req_ids: tuple[int, ...],
                     preempted_req_ids: tuple[int, ...], num_prefill_tokens: int, num_decode_tokens: int,
                     num_context_tokens: int, num_attention_pairs: int, num_swap_bytes: int = 0,
                     num_iterations: int = 1, is_decode_run: bool = False, decodes_in_bulk: bool = False,
                     kv_growth: tuple[int, ...] = (), timing: RunTiming | None = None) -> SchedulerOutput:
    """``SchedulerOutput(...)``, the fields in its order (its defaults: tests/test_sched_output.py checks them)."""
    return new_tuple(SchedulerOutput, (step, num_scheduled_tokens, new_req_ids, preempted_req_ids, num_prefill_tokens,
                                       num_decode_tokens, num_context_tokens, num_attention_pairs, num_swap_bytes,
                                       num_iterations, is_decode_run, decodes_in_bulk, kv_growth, timing))


def attention_work(num_computed_tokens: int, num_new_tokens: int) -> tuple[int, int]:
    """What attention reads and computes for a request computing ``num_new_tokens`` after ``num_computed_tokens``:
    the context tokens of KV it reads (all of them, its new ones included) and its attention pairs (each new
    token attends to the tokens before it and to itself): (computed + new, new × computed + new × (new + 1) / 2).
    A decode (one new token) is (computed + 1, computed + 1): a decode iteration of every running request reads
    the requests' computed tokens plus one each, ``decode_context``."""
    return (num_computed_tokens + num_new_tokens,
            num_new_tokens * num_computed_tokens + num_new_tokens * (num_new_tokens + 1) // 2)


def decode_context(num_computed_tokens: int, num_seqs: int) -> int:
    """Context tokens (and attention pairs) of a decode iteration of ``num_seqs`` requests that hold
    ``num_computed_tokens`` computed tokens between them: ``attention_work(c, 1)`` summed over the requests."""
    return num_computed_tokens + num_seqs

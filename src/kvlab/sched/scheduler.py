"""The scheduler: which requests run in the next iteration, and how many tokens each computes.

It follows vLLM V1's Scheduler.schedule() (vllm/v1/core/sched/scheduler.py): there are no prefill and decode
phases; every request's ``num_computed_tokens`` catches up with its ``num_tokens`` under one token budget per
iteration (``max_num_batched_tokens``), running requests first, then waiting ones in FCFS order.

    running loop   for each running request, in order: num_new = num_tokens - num_computed_tokens, capped by
                   the budget (and by max_model_len); allocate_slots; when memory runs out, preempt the newest
                   running request (it may be the request itself) and retry.
    waiting loop   only if nobody was preempted this iteration: admit from the front of the queue while the
                   budget lasts, ``max_num_seqs`` allows, and the allocator says the request fits now.

What differs between batching policies (when may a waiting request join?) lives in ``kvlab.sched.batching``;
what differs between preemption modes (what happens to the evicted request's KV?) in ``kvlab.sched.preemption``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvlab.memory.base import Fit, KVAllocator
from kvlab.sched.output import SchedulerOutput
from kvlab.sched.seq import FINISHED, PREEMPTED, RUNNING, Seq


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    enable_chunked_prefill: bool = True
    batching: str = "continuous"  # a key of kvlab.sched.batching.BATCHING
    preemption_mode: str = "recompute"  # a key of kvlab.sched.preemption.PREEMPTION
    swap_space_bytes: int = 0  # CPU memory for swapped-out KV (swap preemption)
    kv_bytes_per_token: int = 0  # whole model, all GPUs: what one token's KV costs to swap


class Scheduler:
    def __init__(self, config: SchedulerConfig, allocator: KVAllocator):
        from kvlab.sched.batching import BATCHING
        from kvlab.sched.preemption import PREEMPTION

        self.config = config
        self.allocator = allocator
        self.batching = BATCHING[config.batching]
        self.preemption = PREEMPTION[config.preemption_mode](config)
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.step = 0
        # Sum of num_computed_tokens over the requests whose KV is in GPU memory (see memory.base.slot_usage).
        self.num_resident_computed_tokens = 0
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0
        self.num_swapped_bytes = 0
        self.num_sampled_tokens = 0  # output tokens generated (recomputation samples nothing new)
        self.admission_blocked = False

    # -- the iteration ---------------------------------------------------------------------------------

    def add_request(self, seq: Seq) -> None:
        self.waiting.append(seq)

    def schedule(self) -> SchedulerOutput:
        self.step += 1
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        scheduled: dict[int, int] = {}
        prefill = decode = context = pairs = 0
        preempted: list[Seq] = []
        swap_bytes = 0

        chunked = cfg.enable_chunked_prefill
        max_computed = cfg.max_model_len - 1
        allocate_slots = self.allocator.allocate_slots
        now_fit = Fit.NOW  # (a local: see kvlab.memory.paged)
        i = 0
        running = self.running
        while i < len(running) and budget > 0:
            seq = running[i]
            computed = seq.num_computed_tokens
            num_tokens = seq.num_tokens
            num_new = num_tokens - computed
            if not chunked and num_new > budget:
                # Only reachable under static batching, which admits a whole batch at once: without chunked
                # prefill a prompt is computed in one piece, so it waits for an iteration with room.
                i += 1
                continue
            # min(num_new, budget, max_model_len - 1 - computed)
            if num_new > budget:
                num_new = budget
            if num_new > max_computed - computed:
                num_new = max_computed - computed
            if num_new <= 0:
                i += 1
                continue
            while True:
                fit = allocate_slots(seq, num_new)
                if fit is now_fit:
                    break
                victim = running.pop()  # FCFS: the newest running request goes first
                swap_bytes += self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not RUNNING:
                break  # it preempted itself: nobody after it can be scheduled either
            scheduled[seq.request_id] = num_new
            if num_new == 1 and computed == num_tokens - 1 and seq.num_output_tokens > 0:
                decode += 1
            else:
                prefill += num_new
            context += computed + num_new
            pairs += num_new * computed + num_new * (num_new + 1) // 2
            budget -= num_new
            i += 1

        new_ids: list[int] = []
        # Whether the queue is still waiting after an admission attempt (the simulator's jump test).
        self.admission_blocked = False
        if not preempted:  # vLLM admits nobody in an iteration that preempted
            new_ids, num_prefill, num_context, num_pairs, swapped_in = self.schedule_waiting(budget, scheduled)
            prefill += num_prefill
            context += num_context
            pairs += num_pairs
            swap_bytes += swapped_in

        return SchedulerOutput(
            step=self.step,
            num_scheduled_tokens=scheduled,
            new_req_ids=tuple(new_ids),
            preempted_req_ids=tuple(s.request_id for s in preempted),
            num_prefill_tokens=prefill,
            num_decode_tokens=decode,
            num_context_tokens=context,
            num_attention_pairs=pairs,
            num_swap_bytes=swap_bytes,
        )

    def schedule_waiting(self, budget: int, scheduled: dict[int, int]) -> tuple[list[int], int, int, int, int]:
        """The waiting loop of ``schedule``: admit from the front of the queue as the batching policy allows
        within ``budget`` tokens, adding the admitted to ``scheduled``. Returns (new_req_ids, prefill tokens,
        context tokens, attention pairs, bytes swapped in). The simulator calls it directly in an iteration
        whose running requests all decode (its jumps account for those)."""
        new_ids: list[int] = []
        prefill = context = pairs = swap_bytes = 0
        for seq, num_new, num_cached in self.batching(self, budget):
            if seq.swapped:  # its KV comes back from the CPU
                swapped_in = self.preemption.on_resume(seq)
                swap_bytes += swapped_in
                self.num_swapped_bytes += swapped_in
                seq.swapped = False
            if seq.num_lost_tokens:
                # What preemption dropped is computed again, less what the prefix cache still held.
                self.num_recomputed_tokens += max(0, seq.num_lost_tokens - num_cached)
                seq.num_lost_tokens = 0
            new_ids.append(seq.request_id)
            if num_new == 0:
                continue  # admitted (memory reserved) but its first tokens wait for budget
            scheduled[seq.request_id] = num_new
            computed = seq.num_computed_tokens
            prefill += num_new
            context += computed + num_new
            pairs += num_new * computed + num_new * (num_new + 1) // 2
        self.admission_blocked = bool(self.waiting)
        return new_ids, prefill, context, pairs, swap_bytes

    def admit(self, seq: Seq, num_new_tokens: int, num_cached_tokens: int) -> None:
        """Move the head of the waiting queue to running (called by the batching policy after allocating)."""
        popped = self.waiting.popleft()
        assert popped is seq
        seq.status = RUNNING
        self.running.append(seq)
        if num_cached_tokens:
            seq.num_computed_tokens = num_cached_tokens
        # KV that is in GPU memory again: prefix hits, or everything a swapped-out request brings back.
        self.num_resident_computed_tokens += seq.num_computed_tokens

    def update_from_output(self, output: SchedulerOutput, now: float) -> list[Seq]:
        """Advance every scheduled request by its tokens; a request whose computed tokens caught up samples one
        token. Returns the requests that finished (their memory is already freed)."""
        finished: list[Seq] = []
        by_id = {s.request_id: s for s in self.running}
        advance = self.advance
        for req_id, num_new in output.num_scheduled_tokens.items():
            seq = by_id[req_id]
            if advance(seq, num_new, now):
                finished.append(seq)
        if finished:
            for seq in finished:
                self.finish(seq, now)
            done = {s.request_id for s in finished}
            self.running = [s for s in self.running if s.request_id not in done]
        return finished

    def advance(self, seq: Seq, num_new_tokens: int, now: float) -> bool:
        """``seq`` computed ``num_new_tokens`` in the iteration that ended at ``now``; if its computed tokens
        caught up, it samples one token. Returns whether that was its last."""
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = now
        seq.num_computed_tokens += num_new_tokens
        self.num_resident_computed_tokens += num_new_tokens
        if seq.num_computed_tokens < seq.request.prompt_len + seq.num_output_tokens:  # (seq.num_tokens, inlined)
            return False  # a chunk of a prompt: nothing sampled yet
        seq.num_output_tokens += 1
        self.num_sampled_tokens += 1
        if seq.first_token_time is None:
            seq.first_token_time = now
        return seq.num_output_tokens >= seq.request.num_output_tokens

    def finish(self, seq: Seq, now: float) -> None:
        """Free a finished request's memory (it stays in ``running`` until the caller removes it)."""
        self.allocator.free(seq)  # (_free, inlined: once per request)
        self.num_resident_computed_tokens -= seq.num_computed_tokens
        seq.status = FINISHED
        seq.finish_time = now

    # -- helpers ---------------------------------------------------------------------------------------

    def _free(self, seq: Seq) -> None:
        self.allocator.free(seq)
        self.num_resident_computed_tokens -= seq.num_computed_tokens

    def _preempt(self, seq: Seq) -> int:
        """Evict ``seq`` whole and put it at the front of the waiting queue. Returns bytes swapped out."""
        self.num_preemptions += 1
        seq.num_preemptions += 1
        self._free(seq)
        swap_bytes = self.preemption.on_preempt(seq)
        if not seq.swapped:
            seq.num_lost_tokens += seq.num_computed_tokens
            seq.num_computed_tokens = 0
        seq.status = PREEMPTED
        self.waiting.appendleft(seq)
        self.num_swapped_bytes += swap_bytes
        return swap_bytes

    @property
    def num_unfinished(self) -> int:
        return len(self.running) + len(self.waiting)

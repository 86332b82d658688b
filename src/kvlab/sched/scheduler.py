"""The scheduler: which requests run next, and how many tokens each computes. The stepping reference.

It follows vLLM V1's Scheduler.schedule() (vllm/v1/core/sched/scheduler.py): there are no prefill and decode
phases; every request's ``num_computed_tokens`` catches up with its ``num_tokens`` under one token budget per
iteration (``max_num_batched_tokens``), running requests first, then waiting ones in the policy's order.

    running loop   for each running request, in order: num_new = num_tokens - num_computed_tokens, capped by
                   the budget (and by max_model_len); allocate_slots; when memory runs out, preempt the policy's
                   victim (it may be the request itself) and retry.
    waiting loop   only if nobody was preempted this iteration: admit from the front of the queue as the
                   batching policy allows (budget, ``max_num_seqs``, memory).
    update         each scheduled request computed its tokens; one that caught up samples a token; one whose
                   answer is complete (``seq.num_tokens_to_finish``, vLLM's check_stop) finishes, freeing its
                   memory.

This class schedules one iteration per call, every time. ``kvlab.sched.runs.RunScheduler`` extends it (as vLLM's
AsyncScheduler extends Scheduler) with runs of many iterations whose outcome is known; tests/test_runs.py proves
both give the same records, logs, block tables and free queues. What differs between batching policies (when may
a waiting request join?) lives in ``kvlab.sched.batching``; between preemption modes (what happens to the evicted
request's KV?) in ``kvlab.sched.preemption``; between scheduling policies (the waiting order, the victim) in
``kvlab.sched.policy``. Time never enters the scheduler: it counts iterations and tokens; the caller stamps times.
"""

from __future__ import annotations

from typing import ClassVar

from mypy_extensions import mypyc_attr

from kvlab.config.engine import CacheConfig, SchedulerConfig
from kvlab.memory.base import Fit, KVAllocator
from kvlab.memory.contiguous import ContiguousAllocator
from kvlab.memory.paged import PagedAllocator
from kvlab.sched import batching
from kvlab.sched.batching import BATCHING, mamba_aligned_chunk
from kvlab.sched.output import SchedulerOutput, scheduler_output
from kvlab.sched.policy import POLICIES
from kvlab.sched.preemption import PREEMPTION, PreemptionMode
from kvlab.sched.seq import Seq, SeqStatus


# (batching.Scheduler: what the batching policies read of it, declared there so that they read it natively)
@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (mypyc), subclassed by kvlab.spec's SpecScheduler
class Scheduler(batching.Scheduler):
    # What a request is tracked as (speculative decoding's SpecSeq keeps its drafts: kvlab.spec.scheduler).
    seq_class: ClassVar[type[Seq]] = Seq

    def __init__(self, config: SchedulerConfig, allocator: KVAllocator, cache_config: CacheConfig | None = None):
        """``cache_config`` gives swap preemption its budget (without it, a swapping scheduler recomputes)."""
        self.config = config
        # (copies of the frozen config's fields the batching policies read at each pass: see batching.Scheduler)
        self.max_num_seqs = config.max_num_seqs
        self.enable_chunked_prefill = config.enable_chunked_prefill
        self.watermark = config.watermark
        self.allocator = allocator
        # The allocator when it is the paged allocator itself (no subclass): the hot calls go to it natively
        # (compiled, a call through the KVAllocator Protocol is a generic method call, several hundred instructions
        # more; benchmarks/README.md, the fourteenth step), the others through the Protocol.
        self.paged_allocator = (
            allocator if isinstance(allocator, PagedAllocator) and type(allocator) is PagedAllocator else None)
        # (the same for the slabs' allocator: benchmarks/README.md, issue 34's twentieth step)
        self.contiguous_allocator = (
            allocator if isinstance(allocator, ContiguousAllocator) and type(allocator) is ContiguousAllocator else None)
        self.mamba_align_block_size = getattr(allocator, "mamba_align_block_size", 0)  # (HybridAllocator's)
        self.batching = BATCHING[config.batching]
        self.preemption: PreemptionMode = PREEMPTION[config.preemption_mode or "recompute"](cache_config)
        self.policy = POLICIES[config.scheduling_policy]
        # A deque in FCFS order, or the priority policy's heap behind a deque's names (kvlab.sched.policy).
        self.waiting = self.policy.make_queue()
        self.running = []
        self.step = 0
        # Sum of num_computed_tokens over the requests whose KV is in GPU memory (see memory.base.slot_usage).
        self.num_resident_computed_tokens = 0
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0
        self.num_swapped_bytes = 0
        self.num_sampled_tokens = 0  # output tokens generated (recomputation samples nothing new)

    @property
    def num_unfinished(self) -> int:
        return len(self.running) + len(self.waiting)

    def add_request(self, seq: Seq) -> None:
        self.waiting.append(seq)  # (FCFS: at the back; priority: in its place)

    def sync(self) -> None:
        """Bring every running request's counters up to date: stepping keeps them current (runs do not)."""

    # -- the iteration ---------------------------------------------------------------------------------

    def schedule(self, max_iterations: int = 1, horizon=None) -> SchedulerOutput:
        """The next iteration (the reference takes one at a time: ``max_iterations`` and ``horizon`` are for
        ``RunScheduler``)."""
        return self._schedule_iteration()

    def _schedule_iteration(self) -> SchedulerOutput:
        self.step += 1
        budget = self.config.max_num_batched_tokens
        scheduled: dict[int, int] = {}
        preempted: list[Seq] = []
        budget, totals, swap_bytes = self._running_loop(budget, scheduled, preempted)
        new_ids: list[int] = []
        if not preempted:  # vLLM admits nobody in an iteration that preempted
            new_ids, waiting_totals, swapped_in = self._waiting_loop(budget, scheduled)
            totals = [a + b for a, b in zip(totals, waiting_totals)]
            swap_bytes += swapped_in
        prefill, decode, context, pairs = totals
        return scheduler_output(  # (see SchedulerOutput)
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

    def _running_loop(self, budget: int, scheduled: dict[int, int], preempted: list[Seq]) -> tuple[int, list[int], int]:
        """The running requests, in order, under the budget; preempting the policy's victim when memory runs out.
        Returns (budget left, [prefill, decode, context, pairs], bytes swapped out). (``RunScheduler`` decides it
        in bulk when everyone decodes.)"""
        cfg = self.config
        prefill = decode = context = pairs = swap_bytes = 0
        max_computed = cfg.max_model_len - 1
        running = self.running
        paged = self.paged_allocator  # (called natively when it is one: see __init__)
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            computed = seq.num_computed_tokens
            # vLLM's num_tokens_with_spec: the draft tokens proposed last iteration are verified in this one (without
            # speculative decoding the same property as num_tokens: kvlab.spec.scheduler.SpecSeq adds the drafts).
            num_new = seq.num_tokens_with_spec - computed
            if not self.enable_chunked_prefill and num_new > budget:  # (the config's copy, read natively)
                # Only reachable under static batching, which admits a whole batch at once: without chunked
                # prefill a prompt is computed in one piece, so it waits for an iteration with room.
                i += 1
                continue
            # (two comparisons, not min() of three: compiled, a three-argument min is a generic call of the builtin,
            # ~200 instructions; the same result, the first of the smallest)
            if budget < num_new:
                num_new = budget
            if max_computed - computed < num_new:
                num_new = max_computed - computed
            if self.mamba_align_block_size and num_new > 0:
                num_new = mamba_aligned_chunk(seq, computed, num_new, self.mamba_align_block_size,
                                              cfg.max_num_batched_tokens)
            if num_new <= 0:
                i += 1
                continue
            while (paged.allocate_slots(seq, num_new) if paged is not None
                   else self.allocator.allocate_slots(seq, num_new)) is not Fit.NOW:
                index = self.policy.victim_index(running)
                victim = running[index]
                if index < i:  # (priority only: scheduled earlier in this iteration; vLLM takes it back)
                    i -= 1
                    if victim.request_id in scheduled:
                        undone = _work(victim, scheduled.pop(victim.request_id))
                        budget += undone[0] + undone[1]
                        prefill, decode = prefill - undone[0], decode - undone[1]
                        context, pairs = context - undone[2], pairs - undone[3]
                swap_bytes += self._evict(index)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                break  # it preempted itself: nobody after it can be scheduled either
            scheduled[seq.request_id] = num_new
            if computed == seq.num_tokens - 1 and seq.num_output_tokens > 0:
                decode += num_new  # the token it sampled last, and the drafts after it (speculative decoding)
            else:
                prefill += num_new
            # attention_work(computed, num_new), summed (written out here and in the waiting loop: a call per
            # request and step was 1% of static+paged's bytecodes, benchmarks/count_instructions.py)
            context += computed + num_new
            pairs += num_new * computed + num_new * (num_new + 1) // 2
            budget -= num_new
            i += 1
        return budget, [prefill, decode, context, pairs], swap_bytes

    def _waiting_loop(self, budget: int, scheduled: dict[int, int]) -> tuple[list[int], list[int], int]:
        """Admit from the front of the queue as the batching policy allows within ``budget`` tokens, adding the
        admitted to ``scheduled``. Returns (new_req_ids, [prefill, decode, context, pairs], bytes swapped in). (Both
        loops' results annotated: compiled, untyped, the run scheduler unpacked and added them generically.)"""
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
            prefill += num_new
            computed = seq.num_computed_tokens  # (attention_work, summed: see the running loop)
            context += computed + num_new
            pairs += num_new * computed + num_new * (num_new + 1) // 2
        return new_ids, [prefill, 0, context, pairs], swap_bytes

    def admit(self, seq: Seq, num_new_tokens: int, num_cached_tokens: int) -> None:
        """Move the head of the waiting queue to running (called by the batching policy after allocating)."""
        popped = self.waiting.popleft()
        assert popped is seq
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        if num_cached_tokens:
            seq.num_computed_tokens = num_cached_tokens
        if seq.num_cached_tokens is None:  # (vLLM's scheduler counts the hit of a request's first admission)
            seq.num_cached_tokens = num_cached_tokens
        # KV that is in GPU memory again: prefix hits, or everything a swapped-out request brings back.
        self.num_resident_computed_tokens += seq.num_computed_tokens

    # -- after the iteration ran -----------------------------------------------------------------------

    def update_from_output(self, output: SchedulerOutput, now: float, started: float | None = None,
                           first_end: float | None = None) -> list[Seq]:
        """Advance every scheduled request by its tokens, in the iteration from ``started`` to ``now``; a request
        whose computed tokens caught up samples one token. Returns the requests that finished (their memory is
        already freed, and they have left ``running``)."""
        finished = self._advance_iteration(output, now if started is None else started, now)
        self._remove_finished(finished, now)
        return finished

    def _remove_finished(self, finished: list[Seq], now: float) -> None:
        running = self.running
        for seq in finished:
            self.finish(seq, now)
            # (found by identity, not list.remove: compiled, remove compares each request before it generically, ~100
            # instructions each, ~1k a request; benchmarks/README.md, the eighteenth step)
            i = 0
            while running[i] is not seq:
                i += 1
            running.pop(i)

    def _advance_iteration(self, output: SchedulerOutput, started: float, now: float) -> list[Seq]:
        """The scheduled requests computed their tokens in the iteration from ``started`` to ``now``; those whose
        computed tokens caught up sampled one token. Returns those for which it was the last (``num_tokens_to_finish``)."""
        scheduled = output.num_scheduled_tokens
        if len(scheduled) == len(self.running):  # all of them, in running order (admitted at the back)
            pairs = zip(self.running, scheduled.values())
        else:
            by_id = {seq.request_id: seq for seq in self.running}
            pairs = ((by_id[request_id], num_new) for request_id, num_new in scheduled.items())  # type: ignore[assignment]
        compute = self._compute
        # (num_tokens_to_finish, written out: the call cost 8k instructions/request with the heap's copy, static+paged
        # 349k against 341k, benchmarks/count_instructions.py --requests 3000; finished: sampled, none left)
        return [seq for seq, num_new in pairs
                if compute(seq, num_new, started, now) and seq.final_output_tokens - seq.num_output_tokens == 0]

    def _compute(self, seq: Seq, num_new: int, started: float, now: float) -> bool:
        """``seq`` computed ``num_new`` tokens in the iteration from ``started`` to ``now``. True when its computed
        tokens caught up and it sampled one (False: a chunk of a prompt, nothing sampled yet)."""
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = started
        seq.num_computed_tokens += num_new
        self.num_resident_computed_tokens += num_new
        if seq.num_computed_tokens < seq.prompt_len + seq.num_output_tokens:
            return False
        seq.num_output_tokens += 1
        self.num_sampled_tokens += 1
        if seq.first_token_time is None:
            seq.first_token_time = now
        return True

    def finish_requests(self, seqs: list[Seq], now: float) -> list[Seq]:
        """Abort requests from outside (a client gave up), as vLLM's Scheduler.finish_requests with
        FINISHED_ABORTED: running ones leave the batch (its order kept) and free their blocks, waiting ones leave the
        queue; those already finished are skipped. Returns the aborted. What they had computed is wasted work
        (their ``num_computed_tokens`` and the ``num_lost_tokens`` preemption dropped)."""
        unique = {id(seq): seq for seq in seqs}.values()  # (vLLM takes a set of ids)
        aborted = [seq for seq in unique if seq.status in (SeqStatus.RUNNING, SeqStatus.WAITING, SeqStatus.PREEMPTED)]
        if not aborted:
            return aborted
        leaving = {id(seq) for seq in aborted}
        self.running[:] = [seq for seq in self.running if id(seq) not in leaving]
        self.waiting.remove_requests(leaving)
        for seq in aborted:
            if seq.status is SeqStatus.RUNNING:
                self._free(seq)
            elif seq.swapped:
                self.preemption.on_resume(seq)  # (its copy on the CPU is dropped: the swap space is free again)
                seq.swapped = False
            seq.status = SeqStatus.ABORTED
            seq.finish_time = now
        return aborted

    def finish(self, seq: Seq, now: float) -> None:
        """Free a finished request's memory (it stays in ``running`` until the caller removes it)."""
        self._free(seq, True)
        seq.status = SeqStatus.FINISHED
        seq.finish_time = now

    # -- preemption ------------------------------------------------------------------------------------

    def _free(self, seq: Seq, finished: bool = False) -> None:
        """The allocator's ``free``; ``finished``: the request has finished (a PagedAllocator itself then frees it
        without reading whether it has: ``free_finished``)."""
        paged, contiguous = self.paged_allocator, self.contiguous_allocator
        if paged is not None:
            if finished:
                paged.free_finished(seq)
            else:
                paged.free(seq)
        elif contiguous is not None:
            contiguous.free(seq)
        else:
            self.allocator.free(seq)
        self.num_resident_computed_tokens -= seq.num_computed_tokens

    def _evict(self, index: int) -> int:
        """Take ``running[index]`` (the policy's victim) out of the batch and preempt it. Returns bytes swapped
        out."""
        return self._preempt(self.running.pop(index))

    def _preempt(self, seq: Seq) -> int:
        """Evict ``seq`` whole and put it back in the waiting queue (vLLM's _preempt_request: prepend_request, the
        front under FCFS, its place under priority). Returns bytes swapped out."""
        self.num_preemptions += 1
        seq.num_preemptions += 1
        self._free(seq)
        swap_bytes = self.preemption.on_preempt(seq)  # (what the request loses, or moves: the mode's)
        seq.status = SeqStatus.PREEMPTED
        self.waiting.appendleft(seq)
        self.num_swapped_bytes += swap_bytes
        return swap_bytes


def _work(seq: Seq, num_new: int) -> tuple[int, int, int, int]:
    """What ``seq`` scheduled for ``num_new`` tokens adds to an iteration's totals, as the running loop counts it:
    (prefill, decode, context, pairs). (Read only to take a request's tokens back, as vLLM's priority victims.)"""
    computed = seq.num_computed_tokens
    is_decode = computed == seq.num_tokens - 1 and seq.num_output_tokens > 0
    return ((0 if is_decode else num_new), (num_new if is_decode else 0), computed + num_new,
            num_new * computed + num_new * (num_new + 1) // 2)

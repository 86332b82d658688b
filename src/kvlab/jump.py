"""Jumps: running the iterations whose outcome is known without scheduling them one by one.

One iteration at a time is exact but slow: a request decodes hundreds of tokens and nothing interesting happens
in most iterations. Once every running request is decoding (it computes the one token it sampled last), the
iterations that follow are known in advance: ``_jump`` runs them without scheduling them one by one, keeping
each request's state as "its tokens at the jump's start plus the iterations since". Within a jump only events
cost work: a finish (its memory freed), a new block (handed out later, in the order a step would hand it out),
an arrival or a finish that lets the queue in (admitted by the scheduler's own waiting loop), a request that
finds no free block (the newest evicted, as the step's running loop does). Between events an iteration is its
duration and nothing else; long stretches of them are numpy arrays (``_decode_stretch``). The jump gives up, and
steps take over, where it does not follow the batch (a prompt computed in chunks, a queue left behind for want
of budget, prefix caching running out of blocks). A run with jumps is identical to one without: same
allocations in the same order, same durations, same records, integrals and log (tests/test_sim.py checks it on
random workloads).

``Jumps`` is a part of ``kvlab.sim.Simulation`` kept in its own file: it reads and writes the simulation's state
(scheduler, allocator, clock, iteration buffer) directly. If the scheduler's rules change, the jump may need the
same change; the jump = step test says so.
"""

from __future__ import annotations

from array import array
from heapq import heappop, heappush
from itertools import islice
from struct import Struct

from kvlab.cost import PCIE_BANDWIDTH
from kvlab.sched.output import SchedulerOutput
from kvlab.memory.base import Fit
from kvlab.sched.seq import RUNNING, Seq

INF = float("inf")
NOW = Fit.NOW  # (a module global: see kvlab.memory.paged)
# A stretch of a jump with nothing but the clock changing runs as numpy arrays when at least this long (below,
# numpy's per-call cost exceeds the Python loop's ~1-2 µs per iteration).
VECTOR_MIN_ITERATIONS = 64
# Decode iterations are taken as memory-bound when their memory time exceeds their compute time by this factor
# (far more than rounding could change).
MEMORY_BOUND_MARGIN = 1.000001
# Ints per run of iterations in the buffer (see Simulation._flush_iterations), and their packing.
RUN_FIELDS = 15
RUN = Struct(f"{RUN_FIELDS}q")
# Iterations kept before they are added to the integral and the log (in one numpy pass). Not more: the pass's
# temporaries then outgrow what the C allocator keeps mapped (65,536: 16.5 ms a flush here, half of it mapping
# and faulting in fresh memory, which glibc returns after each flush; 32,768: ~4 ms).
BUFFER_ITERATIONS = 32768


class Jumps:
    """The jumping half of ``Simulation`` (see the module doc)."""

    def _may_jump_after(self, out: SchedulerOutput, num_finished: int) -> bool:
        """Whether the iteration after this one is known to run every running request's next token with nobody
        preempted, and to admit only requests that arrive (see ``_jump``)."""
        sched = self.scheduler
        running = sched.running
        if out.preempted_req_ids or not running:
            return False
        if self._admits_while_running and sched.waiting:
            # The queue's head was tried in a pure decode iteration and did not fit: as long as nobody finishes,
            # the iterations that follow have the same budget and seats and no more free memory.
            return (
                not num_finished
                and not out.new_req_ids
                and out.num_prefill_tokens == 0
                and out.num_decode_tokens == len(running)
                and sched.admission_blocked
            )
        num_before = len(running) + num_finished
        if out.num_decode_tokens == num_before:
            return True  # everybody decoded, so everybody still running decodes again
        if out.num_decode_tokens + len(out.new_req_ids) == num_before:
            # Everybody else decoded: did the newcomers compute their whole prompt (and sample a token)?
            check = [seq for rid in out.new_req_ids if (seq := self.seqs[rid]).status is RUNNING]
        else:
            check = running
        return all(seq.num_tokens - seq.num_computed_tokens == 1 and seq.num_output_tokens for seq in check)

    def _jump(self, limit_time: float) -> int:
        """Run the iterations that follow without scheduling them one by one, while every running request
        computes the token it sampled last (see the module doc). Returns how many it ran (0: step instead).

        Iteration s = 1, 2, ... of the jump: running request p computes token ``base_c[p] + s - 1`` and samples
        the next (``base_c``, ``base_o``: its computed and output tokens less the iteration it joined at); it
        finishes after iteration ``end``. A paged request needs a new block before each iteration whose token
        starts one, every ``block_size`` iterations: ``bucket[s % block_size]`` lists who does, in running order
        (a contiguous slab holds every token already). The jump counts those blocks as it goes and hands them
        out (``replay``) before anything else touches the allocator (a finish frees, an arrival is admitted, the
        jump ends), in the order a step would: by iteration, then running order.

        Between a finish and an arrival an iteration only advances the clock: the loop computes its duration
        and keeps it with the allocated slots; ``_flush_iterations`` turns them into the integral and the log
        later, in the same order and with the same arithmetic as for a step.

        Events: an arrival, or a finish or preemption with a queue, is followed by an iteration that tries the
        queue with the scheduler's own waiting loop (``Scheduler.schedule_waiting``); an iteration whose blocks
        the free blocks do not cover evicts the newest running requests as the step's running loop does
        (``Scheduler._preempt``) and admits nobody. The jump stops after an iteration that leaves the batch in a
        state it does not follow: a newcomer that did not compute its whole prompt, or a queue left behind that
        the next iteration's larger budget might let in; with prefix caching, before an iteration that would
        preempt. Steps take over from there."""
        sched = self.scheduler
        running = sched.running
        n = len(running)
        cfg = self.config
        waiting = sched.waiting
        admits = self._admits_while_running
        if n == 0 or n > cfg.max_num_batched_tokens or (admits and waiting and not sched.admission_blocked):
            return 0
        allocator = self.allocator
        bs = cfg.block_size
        caching = self._prefix_caching
        append_blocks = None if caching else getattr(allocator, "append_blocks", None)
        get_num_slots = allocator.get_num_slots
        allocate_slots = allocator.allocate_slots

        seqs: list[Seq] = []  # by position: running order, newcomers appended
        base_c: list[int] = []
        base_o: list[int] = []
        key_of: list[int] = []  # bucket of each position, -1: needs no more blocks
        end_of: list[int] = []  # the iteration after which it finishes
        last_block_of: list[tuple[int, int]] = []  # (iteration, internal fragmentation) of its last block
        pos_of: dict[int, int] = {}  # request id -> position
        bucket: list[list[int]] = [[] for _ in range(bs)]  # request ids needing a block before s ≡ key
        bsize = array("q", bytes(8 * bs))  # (an array: a snapshot of it is a memcpy, see below)
        fill: list[list[int]] = [[] for _ in range(bs)] if caching else []  # prefix caching: who fills a block
        finish_at: dict[int, list[int]] = {}  # iteration -> positions finishing after it
        finish_iters: list[int] = []  # heap of finish_at's iterations
        last_block_at: dict[int, int] = {}  # iteration -> internal fragmentation the last blocks it hands out add
        last_block_iters: list[int] = []  # heap of last_block_at's iterations
        num_event_seqs = 0
        sum_c = 0

        def join(seq: Seq, s: int) -> bool:
            """Track ``seq`` from iteration s + 1 on (it has computed everything but its last sampled token)."""
            nonlocal num_event_seqs, sum_c
            computed = seq.num_computed_tokens
            remaining = seq.request.num_output_tokens - seq.num_output_tokens
            rid = seq.request_id
            held = get_num_slots(rid)
            first = held - computed + 1  # the first iteration (counted from s) whose token has no slot
            if first > bs and first <= remaining:
                return False  # holds more blocks than its tokens need (never in practice): step instead
            p = len(seqs)
            seqs.append(seq)
            base_c.append(computed - s)
            base_o.append(seq.num_output_tokens - s)
            end = s + remaining
            end_of.append(end)
            pos_of[rid] = p
            if end in finish_at:
                finish_at[end].append(p)
            else:
                finish_at[end] = [p]
                heappush(finish_iters, end)
            if first <= remaining:
                key = (s + first) % bs
                key_of.append(key)
                bucket[key].append(rid)
                bsize[key] += 1
                num_event_seqs += 1
                # Its last block: the slots beyond its last token become internal fragmentation (as
                # PagedAllocator._append_new_blocks counts them in a step; append_blocks takes them from here).
                num_kv = seq.request.num_kv_tokens
                last_start = (num_kv - 1) // bs * bs
                waste = last_start + bs - num_kv
                if last_start >= held and waste > 0:
                    at = s + last_start - computed + 1
                    last_block_of.append((at, waste))
                    if at in last_block_at:
                        last_block_at[at] += waste
                    else:
                        last_block_at[at] = waste
                        heappush(last_block_iters, at)
                else:
                    last_block_of.append((0, 0))
            else:
                key_of.append(-1)
                last_block_of.append((0, 0))
            if caching:
                fill[-(computed - s) % bs].append(rid)
            sum_c += computed - s
            return True

        for seq in running:
            if not join(seq, 0):
                return 0

        replayed = 0  # blocks are handed out for iterations up to this one
        pending: list[int] = []  # without prefix caching: who gets a block, in step order, since then
        add_pending = pending.extend if append_blocks is not None else None

        def replay(upto: int, internal: int) -> None:
            """Hand out the blocks of iterations replayed + 1 .. upto: by iteration, then running order.
            ``internal``: the internal fragmentation the jump counts once they are out (the slots of the last
            blocks among them beyond their request's last token, which append_blocks takes from the caller)."""
            nonlocal replayed
            start, replayed = replayed + 1, upto
            if append_blocks is not None:
                if pending:
                    append_blocks(pending, internal - allocator.num_internal_fragmentation_slots)
                    pending.clear()
                return
            if not num_event_seqs and not caching:
                return
            for t in range(start, upto + 1):
                new_block, filled = bucket[t % bs], (fill[t % bs] if caching else ())
                if new_block or filled:
                    ids = sorted({*new_block, *filled}, key=pos_of.__getitem__) if new_block and filled else (
                        new_block or filled
                    )
                    for rid in ids:
                        p = pos_of[rid]
                        seq = seqs[p]
                        seq.num_computed_tokens = base_c[p] + t - 1
                        seq.num_output_tokens = base_o[p] + t - 1
                        allocator.allocate_slots(seq, 1)

        cost = cfg.cost
        fixed_s, kv_token_s, flops_per_token, flops_per_pair, flops, overhead_s = cost.coefficients
        # Decode iterations of fewer requests than this are memory-bound whatever their context: reading the
        # weights takes longer than computing n tokens, and a context token takes longer to read than to attend
        # over (so the gap only grows with the context). Their loop skips the compute time, which never wins.
        if kv_token_s <= flops_per_pair / flops * MEMORY_BOUND_MARGIN:
            max_memory_bound_n = 0.0
        elif flops_per_token > 0:
            max_memory_bound_n = (fixed_s - overhead_s) / (flops_per_token / flops * MEMORY_BOUND_MARGIN)
        else:
            max_memory_bound_n = INF
        slot_counters = getattr(allocator, "slot_counters", None) or (lambda: _slot_counters(allocator))
        alloc, internal, ovh, dup, free_blocks = slot_counters()  # free blocks: only paged requests need them
        # What each iteration leaves for _flush_iterations (see there).
        dts, runs, snapshots = self._dts, self._runs, self._bucket_snapshots
        add_dt, add_internal_change = dts.append, self._internal_changes.fromlist
        # A run's ints packed by struct (array.fromlist converts each int through PyArg_Parse: ~1.5x the cost).
        add_run_bytes, pack_run = runs.frombytes, RUN.pack
        snap: int | None = None  # index of the current bucket sizes in snapshots (None: not taken yet)
        if len(dts) >= BUFFER_ITERATIONS:
            self._flush_iterations()
        now = self.now
        if not dts or now != self._clock_end:
            self._clock_starts.append((len(dts), now))
        num_decoded = 0  # tokens computed by requests that were decoding (each samples one)
        num_done = 0
        next_finish = finish_iters[0]
        next_last_block = last_block_iters[0] if last_block_iters else INF
        next_arrival = self._next_arrival_time
        max_num_seqs = cfg.max_num_seqs
        max_batched = cfg.max_num_batched_tokens
        arrivals_matter = admits and n < max_num_seqs and n < max_batched
        chunked = cfg.enable_chunked_prefill
        can_jump_after = False
        attempt_next = False  # the queue may be let in at the next iteration
        preempting = False  # the next iteration's blocks are not all free: it preempts
        can_preempt = append_blocks is not None  # (with prefix caching, a step does it)
        s = 0
        while True:
            if now >= limit_time:
                # The next call goes on from here, unless the queue is to be tried first: a step does that.
                can_jump_after = not attempt_next
                break
            if len(dts) >= BUFFER_ITERATIONS:
                # The next jump starts afresh (after a flush): its bookkeeping covers only the requests since.
                can_jump_after = not attempt_next
                break
            admitting = attempt_next
            attempt_next = False
            if next_arrival <= now:
                was_empty = not waiting
                self.now = now
                self._arrive()
                next_arrival = self._next_arrival_time
                if arrivals_matter and was_empty and waiting:
                    admitting = True

            finishes = None  # (iteration, clock at its end) after which requests finish
            later_runs = None  # a stretch's runs after each of its finishes (their slot counters to set)
            num_preempted = 0
            if not preempting and bsize[(s + 1) % bs] > free_blocks:
                preempting = True
            if preempting:
                if not can_preempt:
                    break  # a step preempts
                # The step's running loop when memory runs out: a request that needs a block and finds none
                # evicts the newest running request (maybe itself), until one is free; nobody is admitted.
                preempting = False
                s += 1
                replay(s - 1, internal)
                swap_bytes = 0
                for rid in list(bucket[s % bs]):
                    seq = seqs[pos_of[rid]]
                    if seq is None:
                        continue  # evicted already, by someone before it
                    while allocator.num_free_blocks < 1:
                        victim = running.pop()
                        p = pos_of[victim.request_id]
                        victim.num_computed_tokens = base_c[p] + s - 1
                        victim.num_output_tokens = base_o[p] + s - 1
                        swap_bytes += sched._preempt(victim)
                        num_preempted += 1
                        # It leaves the jump: its blocks, its finish, its last block.
                        key = key_of[p]
                        if key >= 0:
                            bucket[key].remove(victim.request_id)
                            bsize[key] -= 1
                            num_event_seqs -= 1
                            key_of[p] = -1
                        finishing = finish_at[end_of[p]]
                        finishing.remove(p)
                        if not finishing:
                            del finish_at[end_of[p]]
                        at, waste = last_block_of[p]
                        if at >= s and at in last_block_at:
                            last_block_at[at] -= waste
                            if not last_block_at[at] and at > s:
                                del last_block_at[at]  # nobody gets a last block then any more
                        sum_c -= base_c[p]
                        n -= 1
                        seqs[p] = None  # (if it is admitted again, it joins at a new position)
                        if victim is seq:
                            break
                    if seq.status is not RUNNING:
                        break  # it evicted itself: nobody after it is left
                    at, waste = last_block_of[pos_of[rid]]
                    append_blocks([rid], waste if at == s else 0)  # (its last block: internal fragmentation)
                replayed = s
                while finish_iters and finish_iters[0] not in finish_at:
                    heappop(finish_iters)  # everyone finishing then was evicted
                next_finish = finish_iters[0] if finish_iters else INF
                last_block_at.pop(s, None)  # internal fragmentation is read from the allocator below
                while last_block_iters and last_block_iters[0] not in last_block_at:
                    heappop(last_block_iters)
                next_last_block = last_block_iters[0] if last_block_iters else INF
                alloc, internal, ovh, dup, free_blocks = slot_counters()
                ctx = sum_c + s * n
                dt = cost.iteration_times(n, 0, n, ctx, ctx)
                if swap_bytes:
                    dt += swap_bytes / PCIE_BANDWIDTH
                add_run_bytes(pack_run(1, n, ctx, dup, ovh, alloc, internal, n, len(running), len(waiting), 0, n,
                                       num_preempted, s, -1))
                add_dt(dt)
                num_decoded += n
                now += dt
                if s == next_finish:
                    finishes = [(s, now)]
                admitting = False
            elif admitting:
                # One iteration: the running requests decode (their blocks go first), then the step's waiting
                # loop admits from the queue.
                s += 1
                key = s % bs
                if bsize[key]:
                    free_blocks -= bsize[key]  # (covered: checked above)
                    if add_pending is not None:
                        add_pending(bucket[key])
                if s == next_last_block:
                    heappop(last_block_iters)
                    internal += last_block_at.pop(s, 0)
                    while last_block_iters and last_block_iters[0] not in last_block_at:
                        heappop(last_block_iters)  # (its only request was evicted)
                    next_last_block = last_block_iters[0] if last_block_iters else INF
                replay(s, internal)
                ctx = sum_c + s * n  # context of the decoding requests (each reads it; also their attention pairs)
                head = waiting[0] if len(waiting) == 1 else None
                if (head is not None and not caching and not head.num_output_tokens and not head.num_computed_tokens
                        and not head.num_lost_tokens and not head.swapped  # (never run, or lost nothing)
                        and head.request.prompt_len <= max_batched - n and len(running) < max_num_seqs):
                    # The common case, a new request alone in the queue whose prompt fits the budget and a seat:
                    # the scheduler's waiting loop (continuous batching) comes down to this.
                    prompt_len = head.request.prompt_len
                    if allocate_slots(head, prompt_len, 0) is NOW:
                        sched.admit(head, prompt_len, 0)
                        admitted = [(head, prompt_len)]
                        num_prefill = num_context = prompt_len
                        num_pairs = prompt_len * (prompt_len + 1) // 2
                    else:
                        admitted, num_prefill, num_context, num_pairs = [], 0, 0, 0
                    sched.admission_blocked = bool(waiting)
                    num_new_seqs = len(admitted)
                    swapped_in = resident_new = 0  # (a new request holds no computed tokens before it runs)
                else:
                    scheduled: dict[int, int] = {}
                    new_ids, num_prefill, num_context, num_pairs, swapped_in = sched.schedule_waiting(
                        max_batched - n, scheduled
                    )
                    admitted = [(self.seqs[rid], num_new) for rid, num_new in scheduled.items()]
                    num_new_seqs = len(new_ids)  # (some may compute nothing yet)
                    resident_new = sum(self.seqs[rid].num_computed_tokens for rid in new_ids)  # prefix hits
                # cost.iteration_time(n + num_prefill, ctx + num_context, ctx + num_pairs), inlined (as below)
                t_mem = fixed_s + (ctx + num_context) * kv_token_s
                t_compute = overhead_s + (
                    flops_per_token * (n + num_prefill) + flops_per_pair * (ctx + num_pairs)
                ) / flops
                dt = t_mem if t_mem >= t_compute else t_compute
                if swapped_in:
                    dt += swapped_in / PCIE_BANDWIDTH
                alloc, internal, ovh, dup, free_blocks = slot_counters()
                # Computed tokens held during the iteration: the decoders' and the newcomers' (prefix hits too).
                resident = sum_c + (s - 1) * n + resident_new
                add_run_bytes(pack_run(1, 0, resident + n + num_prefill, dup, ovh, alloc, internal, n + len(admitted),
                                       len(running), len(waiting), num_prefill, n, 0, s, -1))
                add_dt(dt)
                num_decoded += n
                now += dt
                if s == next_finish:
                    finishes = [(s, now)]
            else:
                # Iterations that only advance the clock, up to the next finish or until an arrival or the
                # limit is due.
                first = s + 1
                next_time = next_arrival if next_arrival < limit_time else limit_time
                # Without admissions (static batching), every finish up to the batch's last is known.
                last = next_finish if admits or num_event_seqs else max(finish_at)
                # (With prefix caching, blocks filled on the way are hashed in step order: no stretches.)
                if not num_event_seqs and not caching and last - s >= VECTOR_MIN_ITERATIONS:
                    stops = sorted(f for f in finish_at if f <= last)
                    ran, now, ends, later_runs = self._decode_stretch(
                        first, [(f, len(finish_at[f]), sum(base_c[p] for p in finish_at[f])) for f in stops],
                        n, sum_c, dup, alloc, internal, ovh, now, limit_time,
                        next_arrival if arrivals_matter and not waiting else INF, n < max_memory_bound_n,
                    )
                    next_arrival = self._next_arrival_time
                    s += ran
                    replayed = s
                    num_decoded += ran * n - sum(  # requests that finished on the way stop decoding
                        len(finish_at[f]) * (s - f) for f in stops if f <= s
                    )
                    finishes = list(zip(stops, ends))
                    if not finishes:
                        continue
                else:
                    ctx = sum_c + s * n
                    flops_n = flops_per_token * n
                    memory_bound = n < max_memory_bound_n
                    if snap is None:
                        if num_event_seqs:
                            snapshots.extend(bsize)  # (array to array: a memcpy)
                            snap = len(snapshots) // bs - 1
                        else:
                            snap = -1
                    queue = len(waiting)
                    run_first = first
                    free_before = free_blocks  # at the start of the run
                    internal_growth = 0  # last blocks handed out during the run
                    out_of_blocks = False
                    for s in range(first, next_finish + 1):
                        key = s % bs
                        blocks = bsize[key]
                        if blocks:
                            if blocks > free_blocks:
                                out_of_blocks = True
                                break
                            if add_pending is not None:
                                add_pending(bucket[key])
                            if s == next_last_block:
                                # Someone's last block: internal fragmentation grows from this iteration on.
                                heappop(last_block_iters)
                                waste = last_block_at.pop(s, 0)
                                if waste:
                                    add_internal_change([len(dts), waste])
                                    internal_growth += waste
                                while last_block_iters and last_block_iters[0] not in last_block_at:
                                    heappop(last_block_iters)  # (its only request was evicted)
                                next_last_block = last_block_iters[0] if last_block_iters else INF
                            free_blocks -= blocks
                        ctx += n
                        # CostModel.iteration_time(n, ctx, ctx), inlined: the same arithmetic in the same order.
                        if memory_bound:
                            dt = fixed_s + ctx * kv_token_s
                        else:
                            t_mem = fixed_s + ctx * kv_token_s
                            t_compute = overhead_s + (flops_n + flops_per_pair * ctx) / flops
                            dt = t_mem if t_mem >= t_compute else t_compute
                        add_dt(dt)
                        now += dt
                        if now >= next_time:
                            break
                    if out_of_blocks:
                        s -= 1
                    if s >= run_first:
                        add_run_bytes(pack_run(s - run_first + 1, n, sum_c + run_first * n, dup, ovh, alloc, internal,
                                               n, n, queue, 0, n, 0, run_first, snap))
                        alloc += bs * (free_before - free_blocks)  # append_blocks: block_size slots a block
                        internal += internal_growth
                    if out_of_blocks:
                        num_decoded += (s - first + 1) * n
                        preempting = True
                        continue  # the next iteration preempts
                    num_decoded += (s - first + 1) * n
                    if s != next_finish:
                        continue
                    finishes = [(s, now)]

            changed = finished_now = stop_after = False
            if finishes:
                for f, end_time in finishes:
                    while finish_iters and finish_iters[0] <= f:
                        heappop(finish_iters)
                    replay(f, internal)
                    finishing = finish_at.pop(f)
                    for p in finishing:
                        seq = seqs[p]
                        seq.num_computed_tokens = base_c[p] + f
                        seq.num_output_tokens = base_o[p] + f
                        sched.finish(seq, end_time)
                        running.remove(seq)
                        key = key_of[p]
                        if key >= 0:
                            bucket[key].remove(seq.request_id)
                            bsize[key] -= 1
                            num_event_seqs -= 1
                        if caching:
                            fill[-base_c[p] % bs].remove(seq.request_id)
                        sum_c -= base_c[p]
                    n -= len(finishing)
                    num_done += len(finishing)
                    self.last_finish_time = end_time
                    if later_runs:
                        # The stretch's runs after this finish hold what the allocator holds now.
                        alloc, internal, ovh, dup, free_blocks = slot_counters()
                        for index in later_runs.pop(0):
                            at = index * RUN_FIELDS + 3  # (count, n, context, *dup, ovh, alloc, internal*, ...)
                            runs[at:at + 4] = array("q", (dup, ovh, alloc, internal))
                while finish_iters and finish_iters[0] not in finish_at:
                    heappop(finish_iters)  # everyone finishing then was evicted
                next_finish = finish_iters[0] if finish_iters else INF
                changed = finished_now = True
            if admitting:
                # Left in the queue with budget to spare and chunked prefill: its head did not fit in memory or
                # the seats; until a finish, later iterations have neither more memory nor more seats.
                still_blocked = chunked and max_batched - n - num_prefill > 0
                for seq, num_new in admitted:
                    if sched.advance(seq, num_new, now):
                        sched.finish(seq, now)
                        running.remove(seq)
                        num_done += 1
                        self.last_finish_time = now
                        finished_now = True
                    elif (seq.num_output_tokens  # sampled its first token, and computed all but it:
                          and seq.request.prompt_len + seq.num_output_tokens - seq.num_computed_tokens == 1
                          and join(seq, s)):
                        n += 1
                    else:
                        stop_after = True  # a chunk of a prompt: the next iteration is not pure decode
                if len(admitted) < num_new_seqs or (num_new_seqs and waiting and not still_blocked):
                    # Admitted without tokens yet, or a queue left behind maybe for want of budget: a step decides.
                    stop_after = True
                while finish_iters and finish_iters[0] not in finish_at:
                    heappop(finish_iters)  # everyone finishing then was evicted
                next_finish = finish_iters[0] if finish_iters else INF
                while last_block_iters and last_block_iters[0] not in last_block_at:
                    heappop(last_block_iters)  # (its only request was evicted)
                next_last_block = last_block_iters[0] if last_block_iters else INF
                changed = True
            if num_preempted:
                changed = True
            if changed:
                snap = None  # the buckets changed
                if admits and waiting and (finished_now or num_preempted):
                    attempt_next = True  # the freed memory and seats may let the queue in
                if finished_now:  # (admissions and preemptions read the counters already)
                    alloc, internal, ovh, dup, free_blocks = slot_counters()
                if n == 0 or stop_after:
                    break
                arrivals_matter = admits and n < max_num_seqs and n < max_batched

        replay(s, internal)
        self.now = self._clock_end = now
        self._can_jump = can_jump_after
        if s == 0:
            return 0
        self.counters.num_finished += num_done
        for p, seq in enumerate(seqs):
            if seq is not None and seq.status is RUNNING:
                seq.num_computed_tokens = base_c[p] + s
                seq.num_output_tokens = base_o[p] + s
        sched.num_resident_computed_tokens = sum(seq.num_computed_tokens for seq in running)
        sched.num_sampled_tokens += num_decoded
        sched.step += s
        return s

    def _decode_stretch(
        self, s0: int, stops: list[tuple[int, int, int]], n: int, sum_c: int, dup: int, alloc: int, internal: int,
        ovh: int, now: float, limit_time: float, cut_time: float, memory_bound: bool,
    ) -> tuple[int, float, list[float], list[list[int]]]:
        """Iterations s0 .. the last of ``stops`` of a jump in which nothing but the clock changes, no block
        handed out, as numpy arrays: the same elementwise arithmetic as the loop, and the clock accumulated left
        to right as ``now += dt`` does, so every float is the same. ``stops``: (iteration, requests finishing
        after it, the sum of their ``base_c``), in order; the batch shrinks after each. Stops before the first
        iteration starting at or after ``limit_time`` or ``cut_time`` (an arrival that may be admitted);
        arrivals that only join the queue join. Buffers the iterations; returns (iterations run, clock, the
        clock at the end of each stop reached, and per stop the indices in ``_runs`` of the runs after it: what
        the allocator holds after a finish is for the caller to set there, once it has freed them).
        ``memory_bound``: the batch is small enough that every iteration is (see ``_jump``)."""
        import numpy as np

        end = stops[-1][0]
        num = end - s0 + 1
        ctx = np.arange(s0, end + 1, dtype=np.int64)
        if len(stops) == 1:
            batch = n
            ctx *= n
            ctx += sum_c
            starts_of_stretches = [0]
        else:
            lengths = np.diff(np.array([s0 - 1] + [f for f, _, _ in stops], dtype=np.int64))
            gone = np.cumsum([0] + [k for _, k, _ in stops[:-1]])
            gone_c = np.cumsum([0] + [c for _, _, c in stops[:-1]])
            batch = np.repeat(n - gone, lengths)
            ctx *= batch
            ctx += np.repeat(sum_c - gone_c, lengths)
            starts_of_stretches = (np.cumsum(lengths) - lengths).tolist()
        if memory_bound:  # (np.maximum would pick the memory time: the same floats, fewer passes)
            fixed_s, kv_token_s = self.config.cost.coefficients[:2]
            durations = ctx * kv_token_s
            durations += fixed_s
        else:
            durations = self.config.cost.iteration_times(batch, 0, batch, ctx, ctx)
        times = np.empty(num + 1)
        times[0] = now
        times[1:] = durations
        np.add.accumulate(times, out=times)  # times[j]: start of iteration j; sequential, as `now += dt`
        ran = num
        stop = limit_time if limit_time < cut_time else cut_time
        if stop <= times[num - 1]:
            ran = int(np.searchsorted(times[:num], stop, side="left"))
            if ran == 0:
                return 0, now, [], []
        starts = times[:ran]
        waiting = self.scheduler.waiting
        num_waiting = len(waiting)
        bounds = {j for j in starts_of_stretches if j < ran}
        counts = None
        if self._next_arrival_time <= starts[-1]:
            # Arrivals during the stretch join the queue (or are rejected): a run per queue length.
            self.now = float(starts[-1])
            self._arrive()
            if len(waiting) > num_waiting:
                joined = np.fromiter(  # the newcomers, at the queue's back (it may be long)
                    (seq.request.arrival_time for seq in islice(reversed(waiting), len(waiting) - num_waiting)),
                    dtype=np.float64,
                )[::-1]
                counts = np.searchsorted(joined, starts, side="right")
                # (the queue grows at the first iteration starting at or after each newcomer's arrival)
                bounds.update(j for j in np.searchsorted(starts, joined, side="left").tolist() if 0 < j < ran)
        bounds = sorted(bounds)
        runs = self._runs
        ctx_list = ctx.tolist() if len(bounds) > 1 else None
        later_runs: list[list[int]] = [[] for _ in stops]
        stretch = 0
        for a, b in zip(bounds, bounds[1:] + [ran]):
            while stretch + 1 < len(starts_of_stretches) and starts_of_stretches[stretch + 1] <= a:
                stretch += 1
            if stretch:
                later_runs[stretch - 1].append(len(runs) // RUN_FIELDS)
            size = n if len(stops) == 1 else int(batch[a])
            queue = num_waiting if counts is None else num_waiting + int(counts[a])
            first_ctx = ctx_list[a] if ctx_list is not None else int(ctx[a])
            runs.frombytes(RUN.pack(b - a, size, first_ctx, dup, ovh, alloc, internal, size, size, queue, 0, size, 0,
                                    s0 + a, -1))
        self._dts.frombytes(durations[:ran].tobytes())
        ends = [float(times[f - s0 + 1]) for f, _, _ in stops if f - s0 < ran]
        return ran, float(times[ran]), ends, later_runs


def _slot_counters(allocator) -> tuple[int, int, int, int, int]:
    """What PagedAllocator.slot_counters gives, for an allocator without the method."""
    return (
        allocator.num_allocated_slots,
        allocator.num_internal_fragmentation_slots,
        allocator.num_overhead_slots,
        allocator.num_duplicate_token_slots,
        getattr(allocator, "num_free_blocks", 0),
    )

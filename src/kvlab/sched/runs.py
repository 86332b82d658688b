"""Runs: many iterations scheduled at once, where the stepping reference's outcome is known in advance.

``RunScheduler`` extends the reference ``Scheduler`` (kvlab/sched/scheduler.py) as vLLM's AsyncScheduler extends
its Scheduler: same loops, same decisions, fewer visits. Asked for up to ``max_iterations`` iterations, it returns
a run of several when every running request is decoding (``_decoding``), the waiting loop cannot admit anyone
until something finishes (``_admission_blocked``, or an empty queue), and no request finishes or runs out of
memory before the run's last iteration. (The caller's horizon ends a run where a request arrives, unless the
queue's head waits and arrivals join behind it, FCFS: an arrival then changes nothing before the run ends.) Then
each of those iterations is what the running loop would decide anyway (every request computes one token), and the
allocator hands out the run's blocks in one call (``allocate_decode_run``), in the order the steps would.

When everyone decodes and the queue's head may fit, the decoders' blocks come from that call and the batching
policy decides: if it admits nobody, that iteration begins a run; if it admits someone, only the admitted are
visited, and when they compute their whole prompts and nobody is left waiting, the iteration begins a run in which
the whole batch decodes (``_schedule_decode_and_admit``, ``_after_admission``). When everyone decodes and the free
blocks run out under FCFS, the iteration that preempts is decided in bulk as well (``_schedule_evicting_decode``):
the allocator visits only those needing a block and evicts the newest through the scheduler. Anything else is the
reference's iteration. (A hybrid in vLLM's mamba_cache_mode 'align': the allocator's runs stop before any
iteration past their first in which a block is taken or freed, kvlab.memory.hybrid, and the queue's head is tried
again at every schedule: ``schedule``.)

Its state, beside the reference's: the decode clock (iterations in which every running request decoded, run in
bulk) and whether some request's counters lag behind it (``sync``); who finishes when on it (``_finishes``, kept
from a bulk iteration to the next); the admission stamps (the running queue's order); the decoders' schedule
(``_decoders``); and the two facts above (``_decoding``, ``_admission_blocked``).
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import Final, NamedTuple, Protocol

from mypy_extensions import mypyc_attr

from kvlab.config.engine import CacheConfig, SchedulerConfig
from kvlab.memory.base import KVAllocator
from kvlab.sched.output import RunTiming, SchedulerOutput, decode_context, new_tuple, scheduler_output
from kvlab.sched.scheduler import Scheduler
from kvlab.sched.seq import Seq, SeqStatus, num_tokens_to_finish

# A finish-heap entry is one int, ``clock iteration of its last token << STAMP_BITS | admission stamp``: the heap
# orders by both as it did tuples ``(clock, stamp, request)``, but compares ints (a tuple's comparison compared two or
# three ints generically, a heap pop ~1.9k instructions compiled, now ~0.9k); the request is found by its stamp
# (``RunScheduler._finishing``), a dict that costs about what the pops saved (benchmarks/README.md, the sixteenth
# step: about even, to be tried without it). Stamps count admissions, each of a request the run
# holds in memory: 2**32 of them are out of reach (``admit`` checks).
STAMP_BITS: Final = 32
STAMP_MASK: Final = (1 << STAMP_BITS) - 1


class FirstIteration(NamedTuple):
    """A run's first iteration when it admits (the cost model's arguments, in its order)."""

    num_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_context_tokens: int
    num_attention_pairs: int


class Horizon(Protocol):
    """How many iterations of a run start before the caller's next event: called with the batch size of its
    decode iterations, the context tokens of the first decode iteration and the most iterations the scheduler
    would run; returns (at most that many, what the caller priced them at: a RunTiming carried back to it in the
    run's output, or None). With ``first``, the run begins with that iteration (it admits), the decode iterations
    follow it, and both counts include it. With ``queue_waits``, the queue's head waits until something
    finishes (the run ends before), so a request arriving meanwhile, which joins behind it, changes nothing in
    the run: it need not end there. The scheduler sees counts only; what the caller's clock made of them it
    carries back unread."""

    def __call__(self, num_seqs: int, num_context_tokens: int, max_iterations: int,
                 first: FirstIteration | None = None, queue_waits: bool = False) -> tuple[int, RunTiming | None]: ...


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (mypyc), subclassed by kvlab.sim's Simulation
class Clock:
    """A caller that owns the clock, given to ``schedule`` in place of a ``Horizon``: its ``_horizon`` is one, with
    the same arguments and answer. (Compiled, a method of a native class is called natively, where a ``Horizon``,
    any callable, is called generically: its arguments boxed and parsed, ~1k instructions a call; benchmarks/README.md,
    the fifteenth step.)"""

    def _horizon(self, num_seqs: int, num_context_tokens: int, max_iterations: int,
                 first: FirstIteration | None = None, queue_waits: bool = False) -> tuple[int, RunTiming | None]:
        raise NotImplementedError


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (mypyc), subclassed by kvlab.spec's SpecRunScheduler
class RunScheduler(Scheduler):
    def __init__(self, config: SchedulerConfig, allocator: KVAllocator, cache_config: CacheConfig | None = None):
        super().__init__(config, allocator, cache_config)
        # The token budget, read natively (the config is frozen: compiled, a read of its field is a generic attribute
        # lookup, ~160 instructions, once or twice a step; benchmarks/README.md, the eighteenth step).
        self._max_num_batched_tokens = config.max_num_batched_tokens
        # request_id -> 1 for each running request, in running order: what a decode iteration schedules, kept
        # beside ``running`` (admitted at the back, preempted or finished out of it) and copied for each run:
        # rebuilding it from ``running`` cost 7% of a saturated simulation (benchmarks/README.md).
        self._decoders: dict[int, int] = {}
        # Every running request computes the one token it sampled last in the next iteration.
        self._decoding = False
        # The waiting loop stopped with a queue in an iteration in which every running request decoded, and
        # nothing has freed memory or seats since: until something does, it would stop at the same request.
        self._admission_blocked = False
        # The decode clock, whether some request's counters lag behind it, who finishes when on it (None after a
        # single iteration, which may change the batch in other ways), and the admission stamps.
        self._clock = 0
        self._synced = True
        self._finishes: list[int] | None = None  # (the keys: STAMP_BITS)
        self._finishing: dict[int, Seq] = {}  # stamp -> the request of each key in _finishes
        # At least the entries of _finishes that are stale (``_stale``): its requests preempted or aborted since it was
        # built, or more. While 0, its first entry is not looked up to be checked (a dict lookup each check).
        self._num_stale = 0
        self._num_stamps = 0
        self._fcfs = self.policy.arrivals_join_behind

    @property
    def is_decoding(self) -> bool:
        """Every running request computes the one token it sampled last in the next iteration."""
        return self._decoding

    def add_request(self, seq: Seq) -> None:
        Scheduler.add_request(self, seq)
        if not self._fcfs:
            self._admission_blocked = False  # (under priority an arrival may go ahead of the head that waits)

    def sync(self) -> None:
        """Bring every running request's ``num_computed_tokens`` and ``num_output_tokens`` up to date.

        A run of ``k`` iterations adds ``k`` to each decoding request; rather than visiting every running request
        after every run, the scheduler advances its decode clock and each request remembers the clock it was
        last brought up to date at (``Seq.synced_clock``). They are caught up here: before a single iteration
        (which reads them) and whenever someone outside looks (the simulator's snapshots and results). The sums
        the metrics read (``num_resident_computed_tokens``, ``num_sampled_tokens``) are always current."""
        if not self._synced:
            for seq in self.running:
                self._sync_one(seq)
            self._synced = True

    def _sync_one(self, seq: Seq) -> None:
        lag = self._clock - seq.synced_clock
        if lag:
            seq.num_computed_tokens += lag
            seq.num_output_tokens += lag
            seq.synced_clock = self._clock

    # -- the iterations --------------------------------------------------------------------------------

    def schedule(self, max_iterations: int = 1, horizon: Horizon | Clock | None = None) -> SchedulerOutput:
        """The next run of iterations: one, or up to ``max_iterations`` when their outcome is known (see the
        module doc). ``horizon`` cuts a run where the caller's next event (an arrival) falls (a ``Clock``: its
        ``_horizon``)."""
        # (_runs, written out: a call in every step cost 1% of benchmarks/count_instructions.py --case vllm)
        if max_iterations > 1 and self._decoding and 0 < len(self.running) <= self._max_num_batched_tokens:
            if not self.waiting or self._admission_blocked:
                out = self._schedule_run(max_iterations, horizon)
            else:
                out = self._schedule_decode_and_admit(max_iterations, horizon)
            if out is None and self._fcfs and not self.allocator.enable_prefix_caching:
                out = self._schedule_evicting_decode()  # (the decoders' blocks are not all free)
            if out is not None:
                if self.mamba_align_block_size:
                    self._admission_blocked = False  # (see below)
                return out
        # A single iteration: the reference's (its counters current, the finish heap rebuilt after it, as the
        # batch and its counters may change in other ways than a run's).
        self.sync()
        self._finishes = None
        num_running = len(self.running)
        out = self._schedule_iteration()
        # The queue's head did not fit while everyone decoded: later iterations of decoders only have less room. Not
        # so in mamba_cache_mode 'align': the iteration after a request crosses a block boundary frees its previous
        # state blocks, and a block taken may be a preempted request's cached hit (its admission then counts fewer):
        # the allocator's runs stop before any iteration past their first that takes or frees a block
        # (kvlab.memory.hybrid), so a run's later iterations change nothing its first one's waiting loop saw, but
        # whatever follows a run or a single iteration may, and tries the queue's head again.
        self._admission_blocked = (bool(self.waiting) and not out.preempted_req_ids and not out.new_req_ids
                                   and out.num_decode_tokens == num_running and not self.mamba_align_block_size)
        return out

    def next_decode_run(self, max_iterations: int) -> tuple[int, int, int] | None:
        """The decode run ``schedule(max_iterations, horizon)`` would begin now, before its horizon cuts it and its
        blocks are handed out: (its batch size, its first iteration's context tokens, its most iterations, up to
        the first finish); None when the next schedule is something else. Nothing the next schedule reads changes
        (the counters caught up and the finish heap built are what it would catch up and build)."""
        if not (self._runs(max_iterations) and (not self.waiting or self._admission_blocked)):
            return None
        num_seqs = len(self.running)
        return num_seqs, decode_context(self.num_resident_computed_tokens, num_seqs), self._until_finish(max_iterations)

    def _runs(self, max_iterations: int) -> bool:
        """Every running request decodes, within the token budget: the next iterations may be a run."""
        # ('align': not foreseen, as its runs stop where a block is taken or freed and the queue's head is tried
        # again there: see schedule)
        return (max_iterations > 1 and not self.mamba_align_block_size and self._decoding
                and 0 < len(self.running) <= self._max_num_batched_tokens)

    def _until_finish(self, max_iterations: int) -> int:
        """Iterations of a decode run from now up to the first in which a request finishes, at most ``max_iterations``."""
        return min(max_iterations, (self._finish_heap()[0] >> STAMP_BITS) - self._clock)

    def _running_loop(self, budget: int, scheduled: dict[int, int], preempted: list[Seq]) -> tuple[int, list[int], int]:
        num_running = len(self.running)
        if self._decoding and 0 < num_running <= budget and self._decode_run(1)[0]:
            # Everyone decodes and this iteration's blocks are free: the running loop's outcome, in bulk.
            scheduled.update(self._decoders)
            num_context = decode_context(self.num_resident_computed_tokens, num_running)
            return budget - num_running, [0, num_running, num_context, num_context], 0
        return Scheduler._running_loop(self, budget, scheduled, preempted)

    def _decode_run(self, max_iterations: int, first: int = 0) -> tuple[int, tuple[int, ...]]:
        """The allocator's ``allocate_decode_run`` for the running requests, its two fields (iterations, growth) as a
        plain tuple (natively from a PagedAllocator or a ContiguousAllocator itself, ``decode_run_fields``: see
        ``Scheduler.paged_allocator``)."""
        paged, contiguous = self.paged_allocator, self.contiguous_allocator
        if paged is not None:
            return paged.decode_run_fields(self.running, max_iterations, first)
        if contiguous is not None:
            return contiguous.decode_run_fields(self.running, max_iterations, first)
        run = self.allocator.allocate_decode_run(self.running, max_iterations, first)
        return run.num_iterations, run.growth

    def _schedule_evicting_decode(self) -> SchedulerOutput:
        """An iteration in which every running request decodes and the free blocks run out: what the running
        loop decides (each takes a block if it needs one; when none is free, the newest running request is
        preempted, perhaps the one asking), with only those needing a block visited and the others advanced on
        the decode clock. Nobody is admitted in an iteration that preempted. (FCFS: the victim is the newest.)"""
        preempted: list[tuple[Seq, int]] = []  # (victim, bytes swapped out)

        def evict() -> Seq:
            victim = self.running[-1]
            preempted.append((victim, self._evict(len(self.running) - 1)))
            return victim

        self._finish_heap()  # (before anyone leaves: the heap skips the evicted from then on)
        growth = self.allocator.allocate_decode_iteration(evict).growth
        self._admission_blocked = False
        return self._run_output(1, growth, preempted_req_ids=tuple(s.request_id for s, _ in preempted),
                                num_swap_bytes=sum(nbytes for _, nbytes in preempted))

    def _schedule_run(self, max_iterations: int, horizon: Horizon | Clock | None) -> SchedulerOutput | None:
        """Iterations in which every running request decodes, up to the first in which one finishes. None when
        not even the first iteration's blocks are free (a single iteration then preempts)."""
        num_context = decode_context(self.num_resident_computed_tokens, len(self.running))
        num_iterations, timing = self._run_length(max_iterations, horizon, num_context)
        run_iterations, run_growth = self._decode_run(num_iterations)
        if run_iterations == 0:
            return None
        return self._run_output(run_iterations, run_growth, timing=timing, num_context=num_context)

    def _schedule_decode_and_admit(self, max_iterations: int, horizon: Horizon | Clock | None
                                   ) -> SchedulerOutput | None:
        """Every running request decodes and the queue's head may fit: what the running loop and the waiting
        loop would decide, with the decoders' blocks in one call. When the batching policy admits nobody, the
        head waits until something finishes (its contract), so the iteration is the first of a run. None when
        the decoders' blocks are not all free."""
        running = self.running
        num_seqs = len(running)
        self._finish_heap()  # (before the admitted join: it holds the decoders only)
        first_iterations, first_growth = self._decode_run(1)
        if not first_iterations:
            return None
        num_context = decode_context(self.num_resident_computed_tokens, num_seqs)
        scheduled = self._handed_decoders()
        budget = self._max_num_batched_tokens - num_seqs
        new_ids, (prefill, _, context, pairs), swap_bytes = self._waiting_loop(budget, scheduled)
        if new_ids:
            first = new_tuple(FirstIteration,  # (FirstIteration(...) without its __new__'s frame: see SchedulerOutput)
                              (len(scheduled), prefill, num_seqs, num_context + context, num_context + pairs))
            num_iterations, growth, timing = 1, first_growth, None
            if max_iterations > 1 and not swap_bytes:
                num_rest = self._admitted_run_length(len(new_ids), scheduled, max_iterations - 1)
                if num_rest > 0:
                    num_iterations, growth, timing = self._after_admission(num_rest, horizon, first, growth)
            self.step += 1
            out = scheduler_output(  # (see SchedulerOutput)
                step=self.step,
                num_scheduled_tokens=scheduled,
                new_req_ids=tuple(new_ids),
                preempted_req_ids=(),
                num_prefill_tokens=prefill,
                num_decode_tokens=num_seqs,
                num_context_tokens=first.num_context_tokens,
                num_attention_pairs=first.num_attention_pairs,
                num_swap_bytes=swap_bytes,
                num_iterations=num_iterations,
                decodes_in_bulk=True,
                kv_growth=growth,
                timing=timing,
            )
            self.step += num_iterations - 1
            return out
        self._admission_blocked = True
        growth = first_growth
        num_iterations, timing = self._run_length(max_iterations, horizon, num_context)  # (the same context)
        # (unpacked, not ``*``: compiled, a call with a starred argument is a generic call, ~500 instructions)
        num_iterations, growth = self._after_first(num_iterations, growth)
        return self._run_output(num_iterations, growth, timing=timing, num_context=num_context)

    def _admitted_run_length(self, num_admitted: int, scheduled: dict[int, int], max_rest: int) -> int:
        """After this iteration, will everyone decode, with nobody finishing and nobody left to admit? If so, the
        decode iterations that can follow it as far as the requests just admitted go (at most ``max_rest``): up to
        the first of them to finish. 0 when not: the queue is not empty, a request just admitted does not compute
        all its tokens now (it samples none), or one finishes now."""
        if self.waiting:
            return 0
        num_rest = max_rest
        for seq in self.running[len(self.running) - num_admitted:]:
            if scheduled.get(seq.request_id) != seq.num_tokens - seq.num_computed_tokens:
                return 0  # admitted for want of budget with no tokens yet, or a chunk of its prompt
            num_rest = min(num_rest, num_tokens_to_finish(seq) - 1)  # (it samples one now: 0 if its last)
        return num_rest

    def _after_admission(self, num_rest: int, horizon: Horizon | Clock | None, first: FirstIteration,
                         growth: tuple[int, ...]
                         ) -> tuple[int, tuple[int, ...], RunTiming | None]:
        """A run whose first iteration admits (``first``: its batch size, prefill and decode tokens, context and
        attention pairs) and whose later iterations, at most ``num_rest`` (``_admitted_run_length``), are decodes
        of the whole batch, as the running loop would schedule them: up to the first finish (of a decoder, or of
        someone just admitted), cut by the horizon and by the free blocks. Returns (iterations, the run's growth,
        the horizon's timing)."""
        clock = self._clock + 1  # the decode clock after the first iteration
        assert self._finishes  # (the decoders': _schedule_decode_and_admit made it)
        num_rest = min(num_rest, (self._finishes[0] >> STAMP_BITS) - clock)
        if num_rest <= 0:
            return 1, growth, None
        num_seqs = len(self.running)
        if horizon is None:
            num_iterations, timing = 1 + num_rest, None
        else:  # (after the first iteration everyone decodes, each over one more token of context)
            num_context = decode_context(first.num_context_tokens, num_seqs)
            if isinstance(horizon, Clock):  # (natively: see Clock)
                num_iterations, timing = horizon._horizon(num_seqs, num_context, 1 + num_rest, first)
            else:
                num_iterations, timing = horizon(num_seqs, num_context, 1 + num_rest, first)
        num_iterations, growth = self._after_first(num_iterations, growth)  # (unpacked: a starred tuple is built generically)
        return num_iterations, growth, timing

    def _after_first(self, num_iterations: int, growth: tuple[int, ...]
                     ) -> tuple[int, tuple[int, ...]]:
        """A run's first iteration (its blocks handed out, ``growth``) followed by decode iterations of the whole
        batch, up to ``num_iterations`` in all as far as the free blocks go: (iterations, the run's growth)."""
        if num_iterations <= 1:
            return 1, growth
        rest_iterations, rest_growth = self._decode_run(num_iterations - 1, 1)
        return 1 + rest_iterations, growth + rest_growth

    def _run_length(self, max_iterations: int, horizon: Horizon | Clock | None,
                    num_context: int) -> tuple[int, RunTiming | None]:
        """Iterations of a decode run from now (its first reading ``num_context`` tokens of KV): up to the first
        finish, cut by the caller's horizon."""
        num_iterations = min(max_iterations, (self._finish_heap()[0] >> STAMP_BITS) - self._clock)  # (_until_finish)
        if horizon is None:
            return num_iterations, None
        queue_waits = bool(self.waiting) and self._admission_blocked and self._fcfs
        if isinstance(horizon, Clock):  # (natively: see Clock)
            return horizon._horizon(len(self.running), num_context, num_iterations, None, queue_waits)
        return horizon(len(self.running), num_context, num_iterations, None, queue_waits)

    def _finish_heap(self) -> list[int]:
        """For every running request, the clock iteration of its last token and its stamp (one int: STAMP_BITS),
        soonest first (and entries of requests preempted since, skipped: ``_stale``)."""
        if self._finishes is None:
            self.sync()
            clock = self._clock
            self._finishing = {s.stamp: s for s in self.running}
            self._num_stale = 0
            # (num_tokens_to_finish, written out: with _advance_iteration's copy, 8k instructions/request on
            # static+paged, benchmarks/count_instructions.py --requests 3000)
            self._finishes = [(clock + s.final_output_tokens - s.num_output_tokens) << STAMP_BITS | s.stamp
                              for s in self.running]
            heapify(self._finishes)
        finishes, finishing = self._finishes, self._finishing
        while finishes and self._num_stale:
            stamp = finishes[0] & STAMP_MASK
            if not _stale(stamp, finishing[stamp]):
                break
            heappop(finishes)
            del finishing[stamp]
            self._num_stale -= 1
        return finishes

    def _run_output(self, num_iterations: int, growth: tuple[int, ...],
                    preempted_req_ids: tuple[int, ...] = (), num_swap_bytes: int = 0,
                    timing: RunTiming | None = None, num_context: int | None = None) -> SchedulerOutput:
        """Everyone running decodes, ``num_iterations`` times (those preempted for this run's blocks are gone);
        ``num_context``: its first iteration's context, when the caller has it."""
        running = self.running
        num_seqs = len(running)
        if num_context is None:
            num_context = decode_context(self.num_resident_computed_tokens, num_seqs)
        self.step += 1
        out = scheduler_output(  # (see SchedulerOutput)
            step=self.step,
            num_scheduled_tokens=self._handed_decoders(),
            new_req_ids=(),
            preempted_req_ids=preempted_req_ids,
            num_prefill_tokens=0,
            num_decode_tokens=num_seqs,
            num_context_tokens=num_context,
            num_attention_pairs=num_context,  # one new token each: computed + 1 pairs
            num_swap_bytes=num_swap_bytes,
            num_iterations=num_iterations,
            is_decode_run=True,
            kv_growth=growth,
            timing=timing,
        )
        self.step += num_iterations - 1
        return out

    def _handed_decoders(self) -> dict[int, int]:
        """A dict equal to ``_decoders`` (the same items in the same order) for an output to keep: ``_decoders``
        itself, replaced by its copy. (A dict that lost items keeps their empty entries, and CPython copies such a
        dict item by item, ~200 instructions each, against a block copy for a compact one: the copy kept here is
        compact, so the next copies are mostly block copies; callgrind, benchmarks/README.md, the fourteenth step.)"""
        decoders = self._decoders
        self._decoders = decoders.copy()
        return decoders

    def admit(self, seq: Seq, num_new_tokens: int, num_cached_tokens: int) -> None:
        Scheduler.admit(self, seq, num_new_tokens, num_cached_tokens)
        self._num_stamps += 1
        assert self._num_stamps <= STAMP_MASK, "2**32 admissions: a finish-heap key's stamp has 32 bits"
        seq.stamp = self._num_stamps
        seq.synced_clock = self._clock
        self._decoders[seq.request_id] = 1

    # -- after the iterations ran --------------------------------------------------------------------------

    def update_from_output(self, output: SchedulerOutput, now: float, started: float | None = None,
                           first_end: float | None = None) -> list[Seq]:
        """Advance every scheduled request by its tokens, in each iteration of the run that began at
        ``started``, whose first iteration ended at ``first_end`` and whose last ended at ``now``; a request
        whose computed tokens caught up samples one token. Returns the requests that finished (their memory
        is already freed)."""
        started = now if started is None else started
        num_sampled = self.num_sampled_tokens
        if output.is_decode_run:
            finished = self._advance_run(output.num_iterations, output.num_decode_tokens)
        elif output.decodes_in_bulk:
            first_end = now if first_end is None else first_end
            finished = self._advance_run(1, output.num_decode_tokens) + self._advance_admitted(output, started,
                                                                                                first_end)
            if output.num_iterations > 1:  # then the whole batch decodes (nobody finished in the first)
                finished += self._advance_run(output.num_iterations - 1, len(self.running))
        else:
            finished = self._advance_iteration(output, started, now)
        if not output.is_decode_run:
            # Every running request computed its tokens and sampled one: next, each decodes the one it sampled.
            self._decoding = (output.num_iterations > 1
                              or self.num_sampled_tokens - num_sampled == len(self.running))
        if finished:
            self._remove_finished(finished, now)
            self._admission_blocked = False  # memory and a seat were freed
        return finished

    def _remove_finished(self, finished: list[Seq], now: float) -> None:
        Scheduler._remove_finished(self, finished, now)
        for seq in finished:
            del self._decoders[seq.request_id]

    def _advance_run(self, num_iterations: int, num_decoders: int) -> list[Seq]:
        """The ``num_decoders`` requests running before the run decoded ``num_iterations`` tokens each (nobody
        finishes before its end): the clock advances and they are caught up later (``sync``), but for those
        finishing now."""
        assert self._finishes is not None
        self._clock += num_iterations
        self._synced = False
        num_tokens = num_iterations * num_decoders
        self.num_resident_computed_tokens += num_tokens
        self.num_sampled_tokens += num_tokens
        finished = []
        finishes, finishing = self._finishes, self._finishing
        while finishes and finishes[0] >> STAMP_BITS == self._clock:  # (a run ends at the heap's first)
            stamp = heappop(finishes) & STAMP_MASK
            seq = finishing[stamp]
            del finishing[stamp]
            if not _stale(stamp, seq):
                self._sync_one(seq)
                finished.append(seq)
            else:
                self._num_stale -= 1
        return finished

    def _advance_admitted(self, output: SchedulerOutput, started: float, now: float) -> list[Seq]:
        """The requests admitted in a bulk iteration (at the back of the running queue) computed their tokens;
        those that caught up sampled one and join the finish heap. Returns those for which it was the last."""
        assert self._finishes is not None
        scheduled, clock = output.num_scheduled_tokens, self._clock
        running = self.running
        finished = []
        for seq in running[len(running) - len(output.new_req_ids):]:
            seq.synced_clock = clock
            num_new = scheduled.get(seq.request_id, 0)
            # (Admitted with no tokens yet for want of budget, or a chunk of its prompt: not decoding, so the next
            # iteration is a single one.)
            if not num_new or not self._compute(seq, num_new, started, now):
                continue
            left = num_tokens_to_finish(seq)
            if not left:
                finished.append(seq)
            else:
                heappush(self._finishes, (clock + left) << STAMP_BITS | seq.stamp)
                self._finishing[seq.stamp] = seq
        return finished

    def finish_requests(self, seqs: list[Seq], now: float) -> list[Seq]:
        self.sync()  # (the aborted leave with their counters current; the finish heap skips them: _stale)
        aborted = Scheduler.finish_requests(self, seqs, now)
        self._num_stale += len(aborted)  # (their entries in the finish heap, if any, are stale)
        for seq in aborted:
            self._decoders.pop(seq.request_id, None)
        if aborted:
            self._admission_blocked = False  # memory and seats were freed
        return aborted

    def _preempt(self, seq: Seq) -> int:
        self._num_stale += 1  # (its entry in the finish heap, if any, is stale)
        self._sync_one(seq)
        del self._decoders[seq.request_id]
        return Scheduler._preempt(self, seq)


def _stale(stamp: int, seq: Seq) -> bool:
    """A finish-heap entry (its stamp and request) of a request preempted since it was pushed (running again, it has
    a new stamp)."""
    return seq.status is not SeqStatus.RUNNING or stamp != seq.stamp

"""The event loop: schedule, cost, advance the clock, update, record.

    arrivals ─▶ Scheduler.schedule() ─▶ SchedulerOutput ─▶ CostModel ─▶ clock += dt ─▶ update_from_output
                                              │ (a run of k ≥ 1 iterations)       └──▶ IterationRecorder
                                              └─ horizon: how many start before the next arrival

``step()`` runs the next run of iterations: one, or many when the scheduler knows their outcome (see
kvlab/sched/runs.py); ``max_iterations=1`` steps one engine iteration at a time, with the same results.
The simulator owns the clock: it tells the scheduler where a run must stop (the next arrival, or the
``run_until`` limit) and prices each iteration with the cost model.
"""

from __future__ import annotations

import gc
import operator
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, replace
from heapq import heappop, heappush
from itertools import accumulate, islice
from typing import Any, Final, NamedTuple

from mypy_extensions import mypyc_attr

from kvlab.config.engine import SimConfig
from kvlab.cost.model import CostModel, swap_seconds
from kvlab.errors import KvlabError
from kvlab.memory import make_allocator
from kvlab.memory.base import BlockSnapshot, KVAllocator, SlotUsage, slot_usage
from kvlab.memory.paged import PagedAllocator
from kvlab.metrics import Counters, IterationLog, IterationRecorder, RequestRecord, UsageIntegral, summarize
from kvlab.sched.output import RunTiming, SchedulerOutput, new_tuple
from kvlab.sched.runs import Clock, FirstIteration, RunScheduler
from kvlab.sched.seq import Seq, SeqStatus
from kvlab.spec.cost import draft_seconds
from kvlab.strategies import Strategy
from kvlab.workload import Request, Workload

INF: Final = float("inf")  # (Final: compiled, a constant, not a lookup in the module's dict)
# The longest run the simulator asks for (a run also ends where a request finishes, so this rarely binds).
MAX_RUN_ITERATIONS = 1 << 16


@dataclass
class SimResult:
    strategy: Strategy
    config: SimConfig
    workload_name: str
    records: list[RequestRecord]
    counters: Counters
    integral: UsageIntegral
    log: IterationLog | None
    makespan: float

    def summary(self) -> dict:
        return summarize(self.strategy.name, self.integral, self.records, self.counters, self.makespan)


class RunInFlight(NamedTuple):
    """A decode run a simulation would begin (``Simulation.read_at``), not begun: where the simulation stood
    (clock, step, requests given), its batch, its first iteration's context, its most iterations (up to the first
    finish), and the starts of the iterations priced so far (the first the clock; the last, the next unpriced
    one's)."""

    key: tuple[float, int, int]
    num_seqs: int
    num_context: int
    num_iterations: int
    starts: list[float]


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (mypyc), subclassed by kvlab.disagg's PrefillSimulation
class Simulation(Clock):
    def __init__(
        self,
        strategy: Strategy,
        config: SimConfig,
        workload: Workload,
        *,
        record_iterations: bool = True,
        max_iterations: int = MAX_RUN_ITERATIONS,
        start_time: float | None = None,
        allocator: KVAllocator | None = None,
    ):
        if max_iterations < 1:
            raise KvlabError(f"max_iterations must be at least 1, got {max_iterations}")
        self.strategy = strategy
        self.config = config
        # The cost model, typed here (the config is frozen): compiled, ``self.config.cost`` is a generic read of the
        # config's field at every call of the clock (~170 instructions; benchmarks/README.md, the eighteenth step).
        self._cost: CostModel = config.cost
        self.workload = workload
        self.max_iterations = max_iterations
        cache = config.cache
        # The strategy's batching and preemption mode (the config's --preemption-mode, when set, overrides it).
        scheduler_config = replace(config.scheduler, batching=strategy.batching,
                                   preemption_mode=config.scheduler.preemption_mode or strategy.preemption_mode)
        if scheduler_config.preemption_mode == "swap" and cache.swap_space_bytes <= 0:
            raise KvlabError(f"strategy {strategy.name!r} swaps, but there is no swap space: give --swap-space GiB > 0")
        self.allocator = _make_allocator(config, strategy, scheduler_config.max_model_len, allocator)
        self.scheduler = _make_scheduler(config, scheduler_config, self.allocator, strategy)
        # The allocator when it is the paged allocator itself (no subclass): _row reads its counters natively.
        allocator = self.allocator
        self._paged: PagedAllocator | None = (
            allocator if isinstance(allocator, PagedAllocator) and type(allocator) is PagedAllocator else None)
        self._max_model_len = config.scheduler.max_model_len  # (admission's: see there)
        self.requests, times = _in_arrival_order(workload.requests)
        # Their arrival times, in the same order (the loop reads them from a list of floats natively: compiled, a
        # Request's field is a generic read, and the comparison of it generic too; benchmarks/README.md, the
        # sixteenth step). add_request appends to both.
        self._arrival_times: list[float] = times
        # The clock starts at the first arrival, or where a fleet's shared clock starts (requests come later).
        if start_time is None:
            start_time = self.requests[0].arrival_time if self.requests else 0.0
        # (typed: the first arrival's time is read off an untyped list, and mypy would take the clock for Any, which
        # compiled is a boxed float, each comparison of it generic; benchmarks/README.md, the eighteenth step)
        self.start_time: float = start_time
        self.now: float = self.start_time
        self.seqs: dict[int, Seq] = {}
        self.counters = Counters()
        self.recorder = IterationRecorder(cache.num_slots, self.start_time, keep_log=record_iterations)
        self.last_finish_time: float = self.start_time
        self._next_arrival = 0
        self._limit = INF  # run_until's: no iteration starts at or after it
        # Client deadlines: (arrival + timeout, request id) of requests whose client gives up (Request.timeout).
        self._deadlines: list[tuple[float, int]] = []
        self._extra_seconds = (self._feature_seconds if config.speculative is not None or config.offload is not None
                               else None)
        self._new_seq = self.scheduler.seq_class
        # read_at looks into a plain decode run (no deadlines to end it, no drafts, no CPU tier, runs at all).
        self._reads_plans = self._extra_seconds is None and max_iterations > 1
        self._timed_out = False
        if any(r.timeout is not None for r in self.requests):
            self._watch_deadlines()

    # -- public ----------------------------------------------------------------------------------------

    @property
    def integral(self) -> UsageIntegral:
        """Σ state × dt over the iterations so far (see metrics.UsageIntegral)."""
        self.recorder.flush()
        return self.recorder.integral

    @property
    def log(self) -> IterationLog | None:
        """One row per iteration so far, or None when the simulation was made with record_iterations=False."""
        self.recorder.flush()
        return self.recorder.log

    @property
    def done(self) -> bool:
        return self._next_arrival >= len(self.requests) and self.scheduler.num_unfinished == 0

    @property
    def next_arrival_time(self) -> float:
        times = self._arrival_times
        return times[self._next_arrival] if self._next_arrival < len(times) else INF

    def step(self) -> SchedulerOutput | None:
        """The next run of iterations (one when stepping). Returns what was scheduled, or None when every request
        is done (or, within ``run_until``, when idle until its limit or later)."""
        sched = self.scheduler
        self._arrive()
        if self._deadlines and self._deadlines[0][0] <= self.now:
            self._abandon()
        while not sched.num_unfinished:  # idle until an arrival (everything arriving may be rejected)
            if self._next_arrival >= len(self.requests) or self.next_arrival_time >= self._limit:
                return None
            self.now = max(self.now, self.next_arrival_time)
            self._arrive()
        # (the simulation itself as the horizon, a Clock: its _horizon called natively, and no bound method made)
        out = sched.schedule(self.max_iterations, self if self.max_iterations > 1 else None)
        # (out.total_num_scheduled_tokens, written out: compiled, a named tuple's property is a generic attribute
        # read and a call, its fields native reads)
        if not out.num_prefill_tokens + out.num_decode_tokens and not out.new_req_ids and not out.preempted_req_ids:
            raise RuntimeError(f"no progress in iteration {out.step}: {sched.running!r} {list(sched.waiting)[:3]!r}")
        start = self.now
        durations, self.now = self._timing(out, start)
        row = self._row(out)
        joined: tuple[int, ...] = ()
        timing = out.timing  # (durations, end, past arrivals)
        if out.num_iterations > 1 and timing is not None and timing[2] and self.next_arrival_time < self.now:
            joined = self._arrive_during(start, durations)
        self.recorder.add(row, durations, start, self.now, out.kv_growth, joined)
        if out.num_iterations == 1:
            first_end = self.now
        elif isinstance(durations, list):  # (a short run's: its first read natively, where float() is a generic call)
            first_dt: float = durations[0]
            first_end = start + first_dt
        else:  # (a long run's, a numpy array)
            first_end = start + float(durations[0])
        finished = sched.update_from_output(out, self.now, start, first_end)
        if finished:
            self.counters.num_finished += len(finished)
            self.last_finish_time = self.now
        return out

    def run_until(self, t: float) -> list[SchedulerOutput]:
        """Advance to ``t`` (seconds): every iteration that starts before it runs, none that starts at or after it
        (idle until a later arrival, the clock stays where the last iteration ended). Returns what was scheduled
        meanwhile (who was admitted, who was preempted), in order."""
        self._limit = t
        outputs = []
        try:
            while self.now < t and not self.done:
                out = self.step()
                if out is None:
                    break
                outputs.append(out)
        finally:
            self._limit = INF
        return outputs

    def read_at(self, t: float, run: RunInFlight | None = None) -> tuple[int, RunInFlight | None]:
        """For a reader of the state at ``t`` (a fleet's router): ``run_until(t)``, but a decode run that starts
        before ``t`` and goes on past it is not begun, so nothing cuts it. Returns the slots that run's iterations
        starting before ``t`` take and the run (0 and None when none is left pending): with those slots the
        allocator's count is what ``run_until(t)`` would leave, and the requests are (nobody finishes before a
        run's last iteration, and nothing arrives in it: every request given has arrived). ``run``: the one the
        last read returned, priced as far as that read went (used while the simulation has not moved since). A
        request given at ``t`` then ends the run there (``run_until(t)``), where an arrival ends any run: the
        iterations are those of stepping (tests/test_runs.py)."""
        planned = run is not None and run.key == (self.now, self.scheduler.step, len(self.requests))
        if planned and run is not None:
            slots = self._slots_before(run, t)
            if slots is not None:
                return slots, run
        self._limit = t
        try:
            while self.now < t and not self.done:
                if planned:  # (that run, planned again, would not be left pending: the step begins it)
                    planned = False
                elif self._reads_plans and (run := self._run_in_flight()) is not None:
                    slots = self._slots_before(run, t)
                    if slots is not None:
                        return slots, run
                if self.step() is None:
                    break
        finally:
            self._limit = INF
        return 0, None

    def _run_in_flight(self) -> RunInFlight | None:
        """The decode run the next step would begin, not begun; None when the next step is anything else."""
        if self._next_arrival < len(self.requests) or self._deadlines or not self.scheduler.num_unfinished:
            return None
        plan = self.scheduler.next_decode_run(self.max_iterations)
        if plan is None:
            return None
        return RunInFlight((self.now, self.scheduler.step, len(self.requests)), *plan, [self.now])

    def _slots_before(self, run: RunInFlight, t: float) -> int | None:
        """The slots of ``run``'s iterations starting before ``t``, when it goes past ``t`` and their blocks are
        free; None when it does not (it runs). Its iterations are priced up to ``t`` as ``_horizon`` prices a run
        (from where the last read stopped: as a run cut there and the one after it)."""
        starts = run.starts
        priced = self._price(run, t)
        num_iterations = bisect_left(starts, t, 0, priced)  # those starting before t
        if num_iterations >= run.num_iterations:
            return None  # its last iteration starts before t: it runs whole
        return self.allocator.decode_run_slots(num_iterations)

    def _price(self, run: RunInFlight, t: float) -> int:
        """Prices ``run``'s iterations starting before ``t`` (its starts extended); how many are priced."""
        starts = run.starts
        priced = len(starts) - 1
        if t > starts[-1] and priced < run.num_iterations:
            durations, _ = self._decode_durations(run.num_seqs, run.num_context + priced * run.num_seqs,
                                                  run.num_iterations - priced, starts[-1], t)
            starts += islice(accumulate(durations if isinstance(durations, list) else durations.tolist(),
                                        initial=starts[-1]), 1, None)
            priced = len(starts) - 1
        return priced

    def first_finish_start(self, run: RunInFlight) -> float:
        """For a reader of loads: no request finishes in an iteration that starts before this. ``run``, pending
        (``read_at``), finishes nobody before its last iteration, and nothing else happens before it when the free
        blocks cover the iterations before that one (priced whole then); else the first not priced, as far as the
        reads went."""
        if self.allocator.decode_run_slots(run.num_iterations - 1) is None:
            return run.starts[-1]
        self._price(run, INF)
        return run.starts[run.num_iterations - 1]

    def add_request(self, request: Request) -> None:
        """A request that comes after the simulation was made (a fleet's router hands them out as they arrive).
        It joins the requests still to arrive, last: arrivals come in order, and no iteration may have started after
        it (advance with ``run_until(request.arrival_time)`` at most before adding it)."""
        if self.requests and request.arrival_time < self.requests[-1].arrival_time:
            raise KvlabError(f"request {request.request_id} arrives at {request.arrival_time:g} s, before request "
                             f"{self.requests[-1].request_id} ({self.requests[-1].arrival_time:g} s): add them in "
                             "arrival order")
        self.requests.append(request)
        self._arrival_times.append(request.arrival_time)
        if request.timeout is not None and not self._timed_out:
            self._watch_deadlines()

    def _watch_deadlines(self) -> None:
        """Some request given (at construction or by ``add_request``: a fleet's replicas start empty) has a client
        deadline: from now on every arrival ends a run (it may bring a deadline that falls inside it), so does the
        earliest deadline (``_horizon``), and no run is read ahead (``read_at``)."""
        self._timed_out = True
        self._reads_plans = False

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        """Run to the end. ``progress(num_done, num_requests)`` is called now and then."""
        total = len(self.requests)
        # A run makes no reference cycles, so the cyclic garbage collector has nothing to free; left on, it
        # scans the millions of live requests of a long run (benchmarks/README.md: ~10% of its time).
        collecting = gc.isenabled()
        gc.disable()
        try:
            tick = 0
            while not self.done:
                tick += 1
                if progress is not None and tick % 256 == 0:
                    progress(self.counters.num_finished + self.counters.num_rejected, total)
                if self.step() is None:
                    break
            if progress is not None:
                progress(total, total)
            return self.result()
        finally:
            _keep_as_old()
            if collecting:
                gc.enable()

    def counters_now(self) -> dict:
        sched = self.scheduler
        elapsed = self.now - self.start_time
        return {
            "time": self.now - self.start_time,
            "step": sched.step,
            "num_running": len(sched.running),
            "num_waiting": len(sched.waiting),
            "num_finished": self.counters.num_finished,
            "num_rejected": self.counters.num_rejected,
            "num_preemptions": sched.num_preemptions,
            "num_recomputed_tokens": sched.num_recomputed_tokens,
            "num_swapped_bytes": sched.num_swapped_bytes,
            "num_output_tokens": sched.num_sampled_tokens,
            "throughput_tps": sched.num_sampled_tokens / elapsed if elapsed > 0 else 0.0,
        }

    def slot_usage(self) -> SlotUsage:
        return slot_usage(self.allocator, self.scheduler.num_resident_computed_tokens)

    def snapshot(self) -> BlockSnapshot:
        self.scheduler.sync()
        return self.allocator.snapshot(list(self.scheduler.running))

    def result(self) -> SimResult:
        sched = self.scheduler
        sched.sync()
        self.counters.num_preemptions = sched.num_preemptions
        self.counters.num_recomputed_tokens = sched.num_recomputed_tokens
        self.counters.num_swapped_bytes = sched.num_swapped_bytes
        self.counters.num_output_tokens = sched.num_sampled_tokens
        if self.config.speculative is not None:
            self.counters.spec_decoding = sched.spec_stats.summary()  # type: ignore[attr-defined]
        if self.config.offload is not None:
            self.counters.kv_offload = self.allocator.offload_stats()
        records = [_record_of(seq) for seq in self.seqs.values()]
        return SimResult(
            strategy=self.strategy,
            config=self.config,
            workload_name=self.workload.name,
            records=records,
            counters=self.counters,
            integral=self.integral,
            log=self.log,
            makespan=self.last_finish_time - self.start_time,
        )

    # -- internals -------------------------------------------------------------------------------------

    def _horizon(self, num_seqs: int, num_context_tokens: int, max_iterations: int,
                 first: FirstIteration | None = None, queue_waits: bool = False) -> tuple[int, RunTiming | None]:
        """How many iterations of a run start before the next arrival (or ``run_until``'s limit): an arrival
        joins the queue before the first iteration starting at or after it (with ``queue_waits`` it changes
        nothing in the run, and joins after it: ``_arrive_during``). The run's decode iterations have
        ``num_seqs`` requests and the first of them reads ``num_context_tokens`` tokens of KV; with ``first``,
        that iteration (which admits) comes before them. Their durations and the clock at their end travel back
        in the run's output (``_timing`` reads them there)."""
        stop = self._limit if queue_waits else min(self.next_arrival_time, self._limit)
        if self._timed_out:  # (a deadline ends a run as an arrival does; an arrival may bring one: runs stop there)
            deadline = self._deadlines[0][0] if self._deadlines else INF
            stop, queue_waits = min(self.next_arrival_time, self._limit, deadline), False
        now = self.now
        lead: list[float] = []
        if first is not None:
            # (the fields by name, not *first: compiled, a star call goes through the generic call machinery, ~600
            # instructions more a call than the native one)
            # (typed: one iteration's time is a float, and compiled the additions below are then native)
            dt: float = self._cost.iteration_times(first.num_seqs, first.num_prefill_tokens, first.num_decode_tokens,
                                                   first.num_context_tokens, first.num_attention_pairs)
            if self._extra_seconds is not None and self.config.offload is not None:  # its loads (taken in _timing)
                dt += self.config.offload.seconds(self.allocator.peek_load_bytes())
            lead, now = [dt], now + dt
            max_iterations -= 1
        if now >= stop or max_iterations <= 0:
            return len(lead), (lead, now, queue_waits)
        durations, end = self._decode_durations(num_seqs, num_context_tokens, max_iterations, now, stop)
        if lead:
            durations = lead + durations if isinstance(durations, list) else _prepend(lead[0], durations)
        return len(durations), (durations, end, queue_waits)

    def _decode_durations(self, num_seqs: int, num_context_tokens: int, max_iterations: int, now: float,
                          stop: float) -> tuple[Any, float]:
        """The durations of the decode iterations that start before ``stop`` (at least one, the first starting
        at ``now``), and the clock at their end (``CostModel.decode_run``: a short run's priced and added up in one
        loop that stops there; benchmarks/README.md, issue 34's twenty-second step)."""
        return self._cost.decode_run(num_seqs, num_context_tokens, max_iterations, now, stop)

    def _timing(self, out: SchedulerOutput, start: float) -> tuple[Any, float]:
        """Each iteration's duration and the clock at the run's end: the cost model's, plus the time a swap
        moves KV over PCIe."""
        k = out.num_iterations
        if k > 1:  # a run: the horizon priced it (a single iteration is priced below, run or not)
            if self._extra_seconds is not None and self.config.offload is not None:
                self.allocator.take_load_bytes()  # (its first iteration's loads, priced by _horizon)
            # (a run's timing always has durations, at least k: it may stop short of the horizon)
            durations, end, _ = out.timing  # type: ignore[misc]
            if len(durations) == k:
                return durations, end
            durations = durations[:k]  # (the blocks ran out before the horizon)
            end = start
            for duration in durations if isinstance(durations, list) else durations.tolist():
                end += duration
            return durations, end
        # (typed, as in _horizon; out.num_seqs written out: the named tuple's property is a generic read and a call)
        dt: float = self._cost.iteration_times(len(out.num_scheduled_tokens), out.num_prefill_tokens,
                                               out.num_decode_tokens, out.num_context_tokens, out.num_attention_pairs)
        if out.num_swap_bytes:
            dt += swap_seconds(out.num_swap_bytes)
        if self._extra_seconds is not None:
            dt += self._extra_seconds(out)
        return [dt], start + dt

    def _feature_seconds(self, out: SchedulerOutput) -> float:
        """What speculative decoding's drafter (kvlab.spec.cost) and the CPU tier's loads (kvlab.offload) add to a
        single iteration; made ``_extra_seconds`` only when either is on, so the plain path checks one attribute."""
        config, dt = self.config, 0.0
        if config.speculative is not None:
            dt += draft_seconds(config.speculative, config.cost, out)
        if config.offload is not None:  # blocks loaded from the CPU tier for the requests admitted
            dt += config.offload.seconds(self.allocator.take_load_bytes())
        return dt

    def _row(self, out: SchedulerOutput) -> tuple[int, ...]:
        """The run's memory and queues as the metrics read them (the allocator already holds all its blocks): its
        ``RunRow``'s fields, in their order, as a plain tuple (the recorder only appends them to its list: a
        ``RunRow`` made by ``tuple.__new__`` was ~800 instructions more a run compiled, a generic call)."""
        sched = self.scheduler
        # (out.num_seqs, written out: the named tuple's property is a generic attribute read and a call compiled)
        decode, num_seqs = out.num_decode_tokens, len(out.num_scheduled_tokens)
        # The allocator's four counters: read natively from a PagedAllocator itself (compiled, each read through the
        # KVAllocator Protocol is a generic attribute lookup, ~250 instructions; benchmarks/README.md, the
        # fourteenth step), through the Protocol from any other.
        paged = self._paged
        if paged is not None:
            duplicate, allocated = paged.num_duplicate_token_slots, paged.num_allocated_slots
            internal, overhead = paged.num_internal_fragmentation_slots, paged.num_overhead_slots
        else:
            allocator = self.allocator
            duplicate, allocated = allocator.num_duplicate_token_slots, allocator.num_allocated_slots
            internal, overhead = allocator.num_internal_fragmentation_slots, allocator.num_overhead_slots
        token = sched.num_resident_computed_tokens + out.num_prefill_tokens + decode - duplicate
        if self.recorder.log is None:  # (the integral's fields only: metrics.INTEGRAL_FIELDS)
            return out.num_iterations, num_seqs, token, allocated, internal, overhead
        # (allocated: the recorder takes the run's growth off)
        return (out.num_iterations, num_seqs, token, allocated, internal, overhead, len(sched.running),
                len(sched.waiting), out.num_prefill_tokens, decode, len(out.preempted_req_ids))

    def _arrive(self) -> None:
        """Requests whose arrival time has come join the waiting queue, or are rejected with a reason."""
        requests, times = self.requests, self._arrival_times
        while self._next_arrival < len(times) and times[self._next_arrival] <= self.now:
            self._next_arrival += 1
            self._arrival(requests[self._next_arrival - 1])

    def _arrive_during(self, start: float, durations) -> tuple[int, ...]:
        """The requests that arrived during a run that went past arrivals, from its start to its last iteration's
        start, join the queue (or are rejected) as they would have between its iterations: before the first
        iteration starting at or after the arrival. Returns that iteration (from 0) for each that joined."""
        # Each iteration's start as `now += dt` advanced the clock, left to right (as np.add.accumulate added them:
        # the same floats), walked beside the arrivals, both in order: no numpy call a run and no search an arrival
        # (benchmarks/README.md, issue 34's twenty-third step).
        steps: list[float] = durations if isinstance(durations, list) else durations.tolist()
        last = len(steps) - 1
        times, requests = self._arrival_times, self.requests
        joined: list[int] = []
        iteration, begins = 0, start  # an iteration and its start
        while self._next_arrival < len(times):
            arrival: float = times[self._next_arrival]
            while begins < arrival and iteration < last:
                begins += steps[iteration]
                iteration += 1
            if begins < arrival:  # after the run's last iteration started: it joins after the run
                break
            self._next_arrival += 1
            if self._arrival(requests[self._next_arrival - 1]):
                joined.append(iteration)
        return tuple(joined)

    def admission(self, request: Request) -> tuple[Request, str | None]:
        """The request as this engine serves it (its answer stopped at max_model_len, as vLLM stops it) and why it
        would reject it on arrival (None: it joins the queue)."""
        # (the frozen config's max_model_len kept natively, each field of the request read once: compiled, a read of
        # either dataclass is a generic attribute lookup)
        max_model_len, prompt_len = self._max_model_len, request.prompt_len
        if prompt_len >= max_model_len:
            return request, "prompt longer than max_model_len"
        room = max_model_len - prompt_len
        if request.num_output_tokens > room:
            request = replace(request, max_tokens=room)  # vLLM stops a request at max_model_len
        paged = self._paged  # (natively from a PagedAllocator itself: see _row)
        return request, (paged.why_never_fits(request) if paged is not None else self.allocator.why_never_fits(request))

    def _arrival(self, request) -> bool:
        """One request arrives: it joins the waiting queue (True), or is rejected with a reason."""
        request, reason = self.admission(request)
        # (a plain Seq made natively: compiled, calling the class held in an attribute is a generic call)
        new_seq = self._new_seq
        seq = Seq(request) if new_seq is Seq else new_seq(request)
        self.seqs[seq.request_id] = seq  # (the Seq's copy of the id, read natively: see Seq)
        if reason is None:
            self.scheduler.add_request(seq)
            # (read only when some request given has a deadline, _watch_deadlines: a Request's field is a generic read)
            if self._timed_out and request.timeout is not None:
                heappush(self._deadlines, (request.arrival_time + request.timeout, request.request_id))
                self.counters.num_with_deadline += 1
            return True
        seq.status = SeqStatus.REJECTED
        seq.reject_reason = reason
        self.counters.num_rejected += 1
        self.counters.reject_reasons[reason] = self.counters.reject_reasons.get(reason, 0) + 1
        return False

    def _abandon(self) -> None:
        """Client deadlines (issue 32): the requests whose client's deadline has passed, and that have not finished,
        are aborted before the next iteration, as vLLM aborts them between engine steps (EngineCore.abort_requests,
        Scheduler.finish_requests). What they had computed is wasted work."""
        due = []
        while self._deadlines and self._deadlines[0][0] <= self.now:
            due.append(self.seqs[heappop(self._deadlines)[1]])
        aborted = self.scheduler.finish_requests(due, self.now)
        self.counters.num_aborted += len(aborted)
        self.counters.num_wasted_tokens += sum(seq.num_computed_tokens + seq.num_lost_tokens for seq in aborted)


def _make_allocator(config: SimConfig, strategy: Strategy, max_model_len: int, given: KVAllocator | None = None):
    """The strategy's allocator over the cache, or with a CPU tier (--kv-offloading-size) the paged allocator with
    vLLM's offloading connector behind it (kvlab.offload), chosen once; ``given`` (a disaggregated fleet's side,
    kvlab.disagg) in their place."""
    if given is not None:
        return given
    cache = config.cache
    lookahead = config.speculative.num_lookahead_tokens if config.speculative is not None else 0
    if config.offload is None and not lookahead:
        return make_allocator(strategy.allocator, num_slots=cache.num_slots, block_size=cache.block_size,
                              max_model_len=max_model_len, enable_prefix_caching=strategy.enable_prefix_caching,
                              kv_cache_groups=cache.kv_cache_groups,
                              mamba_align=strategy.enable_prefix_caching and cache.mamba_align)
    if strategy.allocator != "paged":
        if config.offload is not None:
            raise KvlabError(f"KV offload to CPU (--kv-offloading-size) needs paged memory with prefix caching, as "
                             f"vLLM's; strategy {strategy.name!r} reserves slabs: valid: vllm, vllm+prefix")
        raise KvlabError(f"speculative decoding needs paged memory, as vLLM's; strategy {strategy.name!r} reserves "
                         "slabs: valid: vllm, vllm+prefix, continuous+paged, static+paged")
    num_blocks = cache.num_slots // cache.block_size
    if config.offload is None:  # (the EAGLE family's lookahead slots: kvlab.spec.lookahead)
        from kvlab.spec.lookahead import LookaheadPagedAllocator

        allocator = LookaheadPagedAllocator(num_blocks, cache.block_size, strategy.enable_prefix_caching,
                                            max_model_len=max_model_len)
        allocator.num_lookahead_tokens = lookahead
        return allocator
    if not strategy.enable_prefix_caching:
        raise KvlabError(f"KV offload needs prefix caching (vLLM's offloading connector finds blocks by their hashes); "
                         f"strategy {strategy.name!r} has none: valid: vllm (prefix caching on, as vllm serve)")
    from kvlab.offload.allocator import OffloadingPagedAllocator
    from kvlab.spec.lookahead import LookaheadOffloadingAllocator

    if not lookahead:
        return OffloadingPagedAllocator(num_blocks, cache.block_size, num_cpu_blocks=config.offload.num_cpu_blocks,
                                        block_bytes=config.offload.block_bytes, max_model_len=max_model_len)
    offloading = LookaheadOffloadingAllocator(num_blocks, cache.block_size,
                                              num_cpu_blocks=config.offload.num_cpu_blocks,
                                              block_bytes=config.offload.block_bytes, max_model_len=max_model_len)
    offloading.num_lookahead_tokens = lookahead
    return offloading


def _make_scheduler(config: SimConfig, scheduler_config, allocator, strategy: Strategy) -> RunScheduler:
    """The run scheduler, or with speculative decoding its variant (kvlab.spec.scheduler), chosen once: the plain
    path pays nothing for the feature."""
    if config.speculative is None:
        return RunScheduler(scheduler_config, allocator, config.cache)
    if strategy.allocator != "paged":
        raise KvlabError(f"speculative decoding needs paged memory, as vLLM's; strategy {strategy.name!r} reserves "
                         "slabs: valid: vllm, vllm+prefix, continuous+paged, static+paged")
    from kvlab.spec.scheduler import SpecRunScheduler

    return SpecRunScheduler(scheduler_config, allocator, config.cache, speculative=config.speculative)


def _keep_as_old() -> None:
    """The objects a run leaves (a ``Seq`` and a record a request) moved to the collector's oldest generation, as
    they are, in O(1): made with the collector off, they sat in its youngest, and its first passes after the run
    (the youngest, then the middle one, at the next allocations) walked all of them, two a request spread over
    hundreds of MB, their cost per request growing with the run's length (benchmarks/README.md, issue 34's
    twenty-third step). A full collection still visits them, as any long-lived data. ``freeze`` moves every
    tracked object to the permanent generation and ``unfreeze`` all of them to the oldest: the caller's young
    objects go along (a cycle among them is freed at the next full collection, not the next young one); skipped
    when the caller froze objects itself (``unfreeze`` would release them)."""
    if not gc.get_freeze_count():
        gc.freeze()
        gc.unfreeze()


def _prepend(value: float, values):
    import numpy as np

    return np.concatenate(([value], values))


def _in_arrival_order(requests) -> tuple[list, list[float]]:
    """Requests sorted by (arrival_time, request_id), and their arrival times in that order. A workload usually is
    already, its arrival times rising: that is checked first, without a key per request (a tuple each, allocated
    before the run turns the garbage collector off: its collections fell in the run, benchmarks/count_instructions.py)."""
    times = [r.arrival_time for r in requests]
    if all(map(operator.lt, times, islice(times, 1, None))):
        return list(requests), times
    ordered = sorted(requests, key=lambda r: (r.arrival_time, r.request_id))
    return ordered, [r.arrival_time for r in ordered]


def _record_of(seq: Seq) -> RequestRecord:
    status = seq.status
    request = seq.request
    return new_tuple(RequestRecord, (  # (the fields in RequestRecord's order; one C call: see SchedulerOutput)
        seq.request_id,
        request.arrival_time,
        seq.prompt_len,  # (the Seq's copy: see Seq)
        seq.num_output_tokens,
        "finished" if status is SeqStatus.FINISHED else status.value,  # status
        seq.first_scheduled_time,
        seq.first_token_time,
        seq.finish_time,
        seq.num_preemptions,
        seq.reject_reason,
    ))

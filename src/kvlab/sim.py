"""The event loop: schedule, cost, advance the clock, update, record.

    arrivals ─▶ Scheduler.schedule() ─▶ SchedulerOutput ─▶ CostModel ─▶ clock += dt ─▶ update_from_output
                                                      └──▶ slot usage, iteration log, counters

``step()`` runs one engine iteration. ``run()`` and ``run_until()`` also jump over the iterations whose outcome is
known (kvlab/jump.py), with the same results as stepping. Iterations are buffered and added to the integral
and the log in one numpy pass (``_flush_iterations``), left to right as one by one would: the same floats.
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import islice
from operator import attrgetter, gt, lt

from kvlab.cost import PCIE_BANDWIDTH, CostModel
from kvlab.errors import KvlabError
from kvlab.jump import BUFFER_ITERATIONS, INF, RUN, RUN_FIELDS, Jumps
from kvlab.memory import make_allocator
from kvlab.memory.base import BlockSnapshot, SlotUsage, slot_usage
from kvlab.metrics import ITERATION_COLUMNS, Counters, IterationLog, RequestRecord, UsageIntegral, summarize
from kvlab.sched.batching import ADMITS_WHILE_RUNNING
from kvlab.sched.output import SchedulerOutput
from kvlab.sched.scheduler import Scheduler, SchedulerConfig
from kvlab.sched.seq import FINISHED, REJECTED, Seq
from kvlab.strategies import PREEMPTION_MODES, Strategy
from kvlab.workload import Workload



@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything a run needs besides the strategy and the workload, as plain numbers.

    ``num_slots`` is the KV cache's capacity in tokens (``kvlab size``'s "GPU KV cache size").
    ``from_options`` builds one from a model, a GPU and vLLM's flags."""

    num_slots: int
    cost: CostModel
    block_size: int = 16
    max_model_len: int = 2048
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    preemption_mode: str | None = None  # overrides the strategy's when set
    swap_space_bytes: int = 4 * 2**30  # vLLM's old default: 4 GiB of CPU swap per GPU
    kv_bytes_per_token: int = 0  # whole model: what one token's KV costs to swap
    model: str = ""
    gpu: str = ""

    def __post_init__(self) -> None:
        for name in ("num_slots", "block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) <= 0:
                raise KvlabError(f"{name} must be positive, got {getattr(self, name)}")
        if self.block_size > self.max_model_len:
            raise KvlabError(
                f"--block-size {self.block_size} is larger than --max-model-len {self.max_model_len}: "
                f"a block must fit in a sequence"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise KvlabError(
                f"--max-num-batched-tokens ({self.max_num_batched_tokens}) must be at least --max-num-seqs "
                f"({self.max_num_seqs}), as vLLM requires: every running request needs a token each iteration"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise KvlabError(
                f"without chunked prefill, --max-num-batched-tokens ({self.max_num_batched_tokens}) must be at least "
                f"--max-model-len ({self.max_model_len}), as vLLM requires: a whole prompt is computed in one iteration"
            )
        if self.preemption_mode is not None and self.preemption_mode not in PREEMPTION_MODES:
            raise KvlabError(f"--preemption-mode {self.preemption_mode!r}: valid are {', '.join(PREEMPTION_MODES)}")
        if self.preemption_mode == "swap" and self.swap_space_bytes <= 0:
            raise KvlabError("--preemption-mode swap needs CPU swap space: give --swap-space GiB > 0")

    @classmethod
    def from_options(
        cls,
        *,
        model: str = "opt-13b",
        gpu: str = "a100-40gb",
        gpu_memory_gib: float | None = None,
        available_kv_gib: float | None = None,
        num_gpu_blocks: int | None = None,
        gpu_memory_utilization: float = 0.9,
        block_size: int = 16,
        dtype: str = "auto",
        kv_cache_dtype: str = "auto",
        tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        enable_chunked_prefill: bool = True,
        preemption_mode: str | None = None,
        swap_space_gib: float = 4.0,
        cost: str | None = None,
    ) -> SimConfig:
        """Size the KV cache as vLLM would (``kvlab size``) and build the cost model for ``model`` on ``gpu``.

        ``num_gpu_blocks`` fixes the pool (vLLM's ``num_gpu_blocks_override``); ``available_kv_gib`` fixes the
        budget vLLM printed; otherwise kvlab's estimate of the budget is used. ``cost`` is a cost profile's name or
        file (``kvlab cost``; default ``roofline``)."""
        from kvlab.catalog import get_gpu, get_model
        from kvlab.cost.profiles import get_profile
        from kvlab.sizing import GIB, SizingConfig, size_kv_cache

        model_spec = get_model(model)
        gpu_spec = get_gpu(gpu)
        profile = get_profile(cost)  # first: a bad --cost fails before anything is sized
        for name, value in (("--gpu-memory-gib", gpu_memory_gib), ("--available-kv-gib", available_kv_gib),
                            ("--num-gpu-blocks", num_gpu_blocks), ("--swap-space", swap_space_gib)):
            if value is not None and value < 0 or (value == 0 and name != "--swap-space"):
                raise KvlabError(f"{name} must be positive, got {value}")
        sizing = size_kv_cache(
            model_spec,
            SizingConfig(
                gpu_memory_bytes=int((gpu_memory_gib * GIB) if gpu_memory_gib else gpu_spec.memory_bytes),
                gpu_memory_utilization=gpu_memory_utilization,
                block_size=block_size,
                dtype=dtype,
                kv_cache_dtype=kv_cache_dtype,
                tensor_parallel_size=tensor_parallel_size,
                pipeline_parallel_size=pipeline_parallel_size,
                max_model_len=max_model_len,
                max_num_batched_tokens=max_num_batched_tokens,
                max_num_seqs=max_num_seqs,
                available_kv_bytes=int(available_kv_gib * GIB) if available_kv_gib else None,
                gpu_name=gpu_spec.id,
            ),
        )
        tp = tensor_parallel_size
        num_slots = num_gpu_blocks * block_size if num_gpu_blocks else sizing.num_tokens
        if num_slots < block_size * 2:
            raise KvlabError(
                f"{model_spec.id} on {gpu_spec.id} leaves a KV cache of {num_slots} token slots: too small to serve"
            )
        # Per TP rank, all layers: pipeline stages run one after the other, so an iteration reads every layer.
        kv_bytes_per_token_per_rank = sizing.kv_bytes_per_token_per_gpu * pipeline_parallel_size
        cost = profile.cost_model(
            weights_bytes=sizing.weights_bytes_total / tp,
            kv_bytes_per_token=kv_bytes_per_token_per_rank,
            flops_per_token=2.0 * model_spec.num_active_params / tp,
            attention_flops_per_pair=4.0 * model_spec.num_hidden_layers * model_spec.num_attention_heads
            * model_spec.head_dim / tp,
            gpu=gpu_spec,
            model_id=model_spec.id,
        )
        return cls(
            num_slots=num_slots,
            cost=cost,
            block_size=block_size,
            max_model_len=sizing.max_model_len,
            max_num_seqs=sizing.max_num_seqs,
            max_num_batched_tokens=sizing.max_num_batched_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
            preemption_mode=preemption_mode,
            swap_space_bytes=int(swap_space_gib * GIB * tp),
            kv_bytes_per_token=sizing.kv_bytes_per_token,
            model=model_spec.id,
            gpu=gpu_spec.id,
        )


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


class Simulation(Jumps):
    def __init__(
        self,
        strategy: Strategy,
        config: SimConfig,
        workload: Workload,
        *,
        record_iterations: bool = True,
        jump: bool = True,
    ):
        self.strategy = strategy
        self.config = config
        self.workload = workload
        preemption_mode = config.preemption_mode or strategy.preemption_mode
        if preemption_mode == "swap" and config.swap_space_bytes <= 0:
            raise KvlabError(f"strategy {strategy.name!r} swaps, but there is no swap space: give --swap-space GiB > 0")
        self.allocator = make_allocator(
            strategy.allocator,
            num_slots=config.num_slots,
            block_size=config.block_size,
            max_model_len=config.max_model_len,
            enable_prefix_caching=strategy.enable_prefix_caching,
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_model_len=config.max_model_len,
                enable_chunked_prefill=config.enable_chunked_prefill,
                batching=strategy.batching,
                preemption_mode=preemption_mode,
                swap_space_bytes=config.swap_space_bytes,
                kv_bytes_per_token=config.kv_bytes_per_token,
            ),
            self.allocator,
        )
        self.requests = _in_arrival_order(workload.requests)
        self.start_time = self.requests[0].arrival_time if self.requests else 0.0
        self.now = self.start_time
        self.seqs: dict[int, Seq] = {}
        self.counters = Counters()
        self._integral = UsageIntegral()
        self._log = IterationLog() if record_iterations else None
        # Iterations not yet added to the integral and the log (see _flush_iterations): durations, runs of
        # RUN_FIELDS ints and bucket sizes of block_size ints, one after the other. Flat arrays rather than lists
        # of objects: tens of thousands of live floats and tuples, scattered over the heap, cost more to convert
        # and free at each flush than the arrays' appends cost.
        self._dts = array("d")
        self._runs = array("q")
        self._bucket_snapshots = array("q")
        self._internal_changes = array("q")  # (iteration in the buffer, slots added from it on), pairs of ints
        # (index, clock) where the buffered iterations start and where they resume after the clock jumped
        # (idle until an arrival); in between, each starts when the one before ends.
        self._clock_starts: list[tuple[int, float]] = []
        self._clock_end = self.now  # when the last buffered iteration ended
        self.jump = jump
        self.last_finish_time = self.start_time
        self._next_arrival = 0
        self._next_arrival_time = self.requests[0].arrival_time if self.requests else INF
        # Whether the next iteration is known to be pure decode (see _may_jump_after); _jump then runs it.
        self._can_jump = False
        self._admits_while_running = ADMITS_WHILE_RUNNING[strategy.batching]
        self._prefix_caching = bool(getattr(self.allocator, "enable_prefix_caching", False))

    # -- public ----------------------------------------------------------------------------------------

    @property
    def integral(self) -> UsageIntegral:
        """Σ state × dt over the iterations so far (see metrics.UsageIntegral)."""
        self._flush_iterations()
        return self._integral

    @property
    def log(self) -> IterationLog | None:
        """One row per iteration so far, or None when the simulation was made with record_iterations=False."""
        self._flush_iterations()
        return self._log

    @property
    def done(self) -> bool:
        return self._next_arrival >= len(self.requests) and self.scheduler.num_unfinished == 0

    def step(self) -> SchedulerOutput | None:
        """One engine iteration. Returns what was scheduled, or None when every request is done."""
        sched = self.scheduler
        if self._next_arrival_time <= self.now:
            self._arrive()
        if not sched.running and not sched.waiting:
            if self._next_arrival >= len(self.requests):
                return None
            self.now = max(self.now, self._next_arrival_time)  # idle until the next arrival
            self._arrive()
            if not sched.waiting:
                return self.step()  # everything that arrived was rejected
        out = sched.schedule()
        num_tokens = out.num_prefill_tokens + out.num_decode_tokens
        if not num_tokens and not out.new_req_ids and not out.preempted_req_ids:
            raise RuntimeError(f"no progress in iteration {out.step}: {sched.running!r} {list(sched.waiting)[:3]!r}")
        dt = self.config.cost.iteration_times(out.num_seqs, out.num_prefill_tokens, out.num_decode_tokens,
                                             out.num_context_tokens, out.num_attention_pairs)
        if out.num_swap_bytes:
            dt += out.num_swap_bytes / PCIE_BANDWIDTH
        usage = slot_usage(self.allocator, sched.num_resident_computed_tokens + num_tokens)
        if not self._dts or self.now != self._clock_end:
            self._clock_starts.append((len(self._dts), self.now))
        self._dts.append(dt)
        self._runs.frombytes(RUN.pack(
            1, 0, usage.token, 0, usage.overhead, usage.token + usage.reserved + usage.internal_fragmentation,
            usage.internal_fragmentation, len(out.num_scheduled_tokens), len(sched.running), len(sched.waiting),
            out.num_prefill_tokens, out.num_decode_tokens, len(out.preempted_req_ids), 0, -1,
        ))
        if len(self._dts) >= BUFFER_ITERATIONS:
            self._flush_iterations()
        self.now += dt
        self._clock_end = self.now
        finished = sched.update_from_output(out, self.now)
        if finished:
            self.counters.num_finished += len(finished)
            self.last_finish_time = self.now
        self._can_jump = self._may_jump_after(out, len(finished))
        return out

    def run_until(self, t: float) -> None:
        """Advance until the clock reaches ``t`` (seconds) or every request is done."""
        while self.now < t and not self.done:
            if self.jump and self._can_jump and self._jump(t):
                continue
            if self.step() is None:
                break

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        """Run to the end. ``progress(num_done, num_requests)`` is called now and then."""
        total = len(self.requests)
        tick = 0
        # A run makes no reference cycles, so the cyclic garbage collector has nothing to free; left on, it
        # spends ~10% of a large run scanning the millions of live requests. Paused for the run.
        collecting = gc.isenabled()
        gc.disable()
        try:
            while not self.done:
                tick += 1
                if progress is not None and tick % 256 == 0:
                    progress(self.counters.num_finished + self.counters.num_rejected, total)
                if self.jump and self._can_jump and self._jump(INF):
                    continue
                if self.step() is None:
                    break
            if progress is not None:
                progress(total, total)
            return self.result()
        finally:
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
        return self.allocator.snapshot(list(self.scheduler.running))

    def result(self) -> SimResult:
        sched = self.scheduler
        self.counters.num_preemptions = sched.num_preemptions
        self.counters.num_recomputed_tokens = sched.num_recomputed_tokens
        self.counters.num_swapped_bytes = sched.num_swapped_bytes
        self.counters.num_output_tokens = sched.num_sampled_tokens
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

    def _arrive(self) -> None:
        """Requests whose arrival time has come join the waiting queue, or are rejected with a reason."""
        requests = self.requests
        num_requests = len(requests)
        cfg = self.config
        now = self.now
        seqs = self.seqs
        add_request = self.scheduler.add_request
        can_ever_fit = self.allocator.can_ever_fit
        i = self._next_arrival
        while i < num_requests and requests[i].arrival_time <= now:
            request = requests[i]
            i += 1
            reason = None
            if request.prompt_len >= cfg.max_model_len:
                reason = "prompt longer than max_model_len"
            else:
                room = cfg.max_model_len - request.prompt_len
                if request.num_output_tokens > room:
                    # vLLM stops a request at max_model_len (finish reason "length").
                    request = replace(request, max_tokens=room)
                if not can_ever_fit(request):
                    reason = "larger than the whole KV cache"
            seq = Seq(request)
            seqs[request.request_id] = seq
            if reason is not None:
                seq.status = REJECTED
                seq.reject_reason = reason
                self.counters.num_rejected += 1
                self.counters.reject_reasons[reason] = self.counters.reject_reasons.get(reason, 0) + 1
                continue
            add_request(seq)
        self._next_arrival = i
        self._next_arrival_time = requests[i].arrival_time if i < num_requests else INF

    def _flush_iterations(self) -> None:
        """Add the buffered iterations (steps' and jumps') to the integral and the log.

        The buffer holds each iteration's duration (``_dts``) and, per run of iterations (``_runs``): (count,
        n, context tokens of the first, duplicate token slots, overhead slots, allocated slots before the first,
        internal fragmentation, num_seqs, num_running, num_waiting, num_prefill_tokens, num_decode_tokens,
        num_preemptions, jump iteration of the first, bucket sizes). Within a run the context grows by n per
        iteration, and a paged jump's run hands out ``bucket sizes[s % block_size]`` blocks before iteration s
        (-1: none). From them: the slot states (``slot_usage``'s arithmetic, over arrays) times the duration,
        summed left to right onto the running totals as ``UsageIntegral.add`` would, so the floats are the same
        however the simulation went."""
        dts = self._dts
        if not dts:
            return
        import numpy as np

        num = len(dts)
        dt = np.frombuffer(dts, dtype=np.float64)  # (views: dropped before the buffers are emptied below)
        table = np.frombuffer(self._runs, dtype=np.int64).reshape(-1, RUN_FIELDS)
        counts = table[:, 0].copy()
        # Slot counts as floats from here on: whole numbers far below 2**53, so every sum and product of them is
        # exact, and the products with the durations below need no conversion pass.
        per_run = table.astype(np.float64)
        log = self._log

        def expand(values):
            """A value per run -> the value in each of its iterations."""
            return np.repeat(values, counts)

        run_starts = np.cumsum(counts) - counts

        def cumsum_within_runs(values):
            """Per iteration, the sum of ``values`` over its run's iterations up to it."""
            total = np.cumsum(values)
            total -= expand((total - values)[run_starts])
            return total

        # (Arithmetic per run first, then expanded: one pass over the iterations per array, not one per field.)
        offsets = np.arange(num, dtype=np.int64) - expand(run_starts)
        token = expand(per_run[:, 2] - per_run[:, 3]) + expand(per_run[:, 1]) * offsets
        alloc = expand(per_run[:, 5])
        snapshots = self._bucket_snapshots
        if snapshots:
            # Blocks handed out before each iteration: its run's bucket sizes at its jump iteration modulo the block
            # size; a run without (a step's, a stretch's) reads an extra row of zeros.
            bs = self.config.block_size
            sizes = np.concatenate((np.frombuffer(snapshots, dtype=np.int64), np.zeros(bs, dtype=np.int64)))
            rows = np.where(table[:, 14] >= 0, table[:, 14], len(snapshots) // bs)
            blocks = sizes[expand(rows * bs) + (expand(table[:, 13]) + offsets) % bs]
            alloc += bs * cumsum_within_runs(blocks)
        internal = expand(per_run[:, 6])
        changes = self._internal_changes
        if changes:
            where = np.frombuffer(changes, dtype=np.int64)
            # (the iterations of the changes, and their slots, one after the other; summed per iteration)
            added = np.bincount(where[0::2], weights=where[1::2], minlength=num)
            del where
            internal += cumsum_within_runs(added)
        overhead = expand(per_run[:, 4])
        reserved = alloc - token - internal
        free = self.allocator.num_slots - alloc - overhead
        integral = self._integral
        sums = np.empty((6, num))
        for row, state in enumerate((token, reserved, internal, overhead, free)):
            np.multiply(state, dt, out=sums[row])
        sums[5] = dt
        sums[:, 0] += (integral.token, integral.reserved, integral.internal_fragmentation, integral.overhead,
                       integral.free, integral.busy_time)
        np.add.accumulate(sums, axis=1, out=sums)  # left to right along each row
        (integral.token, integral.reserved, integral.internal_fragmentation, integral.overhead, integral.free,
         integral.busy_time) = sums[:, -1].tolist()
        integral.num_iterations += num
        integral.sum_batch_size += int(counts @ table[:, 7])
        if log is not None:
            block = np.empty((len(ITERATION_COLUMNS), num))
            # time: the clock at each iteration's start, as `now += dt` advanced it from each clock start.
            times = block[0]
            times[1:] = dt[:-1]
            starts = self._clock_starts
            times[[i for i, _ in starts]] = [t for _, t in starts]
            bounds = [i for i, _ in starts] + [num]
            for a, b in zip(bounds, bounds[1:]):
                np.add.accumulate(times[a:b], out=times[a:b])
            times -= self.start_time
            block[1] = dt
            block[2:8] = np.repeat(per_run[:, 7:13], counts, axis=0).T  # num_seqs .. num_preemptions
            block[8] = token
            block[9] = reserved
            block[10] = internal
            block[11] = overhead
            block[12] = free
            log.extend(block)
        del dt, table  # (the views of the buffers)
        del dts[:]
        del self._runs[:]
        del snapshots[:]
        del changes[:]
        self._clock_starts.clear()


def _in_arrival_order(requests) -> list:
    """Requests sorted by (arrival_time, request_id); a workload usually is already, so check first."""
    times = list(map(attrgetter("arrival_time"), requests))
    if all(map(lt, times, islice(times, 1, None))):
        return list(requests)  # strictly increasing times: in order whatever the ids
    key = attrgetter("arrival_time", "request_id")
    keys = list(map(key, requests))
    if any(map(gt, keys, islice(keys, 1, None))):
        return sorted(requests, key=key)
    return list(requests)


def _record_of(seq: Seq) -> RequestRecord:
    status = seq.status
    return RequestRecord(  # (positional: a million of these in a long run)
        seq.request_id,
        seq.request.arrival_time,
        seq.request.prompt_len,
        seq.num_output_tokens,
        "finished" if status is FINISHED else ("rejected" if status is REJECTED else status.value),
        seq.first_scheduled_time,
        seq.first_token_time,
        seq.finish_time,
        seq.num_preemptions,
        seq.reject_reason,
    )

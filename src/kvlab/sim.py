"""The event loop: schedule, cost, advance the clock, update, record.

    arrivals ─▶ Scheduler.schedule() ─▶ SchedulerOutput ─▶ CostModel ─▶ clock += dt ─▶ update_from_output
                                                      └──▶ slot usage, iteration log, counters

One iteration at a time is exact but slow: a request decodes hundreds of tokens and nothing interesting happens
in most iterations. So when the last iteration was "pure decode" (every running request computed its one next
token; nobody joined, left or was preempted), the next iterations are known in advance until one of these:
a request finishes, an arrival could be admitted, or the allocator would run out of memory. ``_jump`` runs
those iterations without scheduling them one by one: same allocations in the same order, same durations, same
records, so a run with jumps is identical to one without (tests/test_sim.py checks it on random workloads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import islice
from operator import attrgetter, gt

from kvlab.cost import CostModel
from kvlab.errors import KvlabError
from kvlab.memory import make_allocator
from kvlab.memory.base import BlockSnapshot, SlotUsage, slot_usage
from kvlab.metrics import ITERATION_COLUMNS, Counters, IterationLog, RequestRecord, UsageIntegral, summarize
from kvlab.sched.batching import ADMITS_WHILE_RUNNING
from kvlab.sched.output import SchedulerOutput
from kvlab.sched.scheduler import Scheduler, SchedulerConfig
from kvlab.sched.seq import Seq, SeqStatus
from kvlab.strategies import PREEMPTION_MODES, Strategy
from kvlab.workload import Workload

PCIE_BANDWIDTH = 25e9  # bytes/s a swap moves between GPU and CPU memory (PCIe 4.0 x16, in practice)
INF = float("inf")
# A stretch of a jump with nothing but the clock changing runs as numpy arrays when at least this long (below,
# numpy's per-call cost exceeds the Python loop's ~1-2 µs per iteration).
VECTOR_MIN_ITERATIONS = 32


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
    ) -> SimConfig:
        """Size the KV cache as vLLM would (``kvlab size``) and build the cost model for ``model`` on ``gpu``.

        ``num_gpu_blocks`` fixes the pool (vLLM's ``num_gpu_blocks_override``); ``available_kv_gib`` fixes the
        budget vLLM printed; otherwise kvlab's estimate of the budget is used."""
        from kvlab.catalog import get_gpu, get_model
        from kvlab.sizing import GIB, SizingConfig, size_kv_cache

        model_spec = get_model(model)
        gpu_spec = get_gpu(gpu)
        if gpu_spec.memory_bandwidth_bytes_per_s is None or gpu_spec.peak_flops is None:
            raise KvlabError(
                f"the catalogue has no memory bandwidth or FLOP/s for {gpu_spec.id}, which the cost model needs; "
                f"pick a GPU that has both (kvlab gpus)"
            )
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
        cost = CostModel(
            weights_bytes=sizing.weights_bytes_total / tp,
            kv_bytes_per_token=kv_bytes_per_token_per_rank,
            flops_per_token=2.0 * model_spec.num_active_params / tp,
            attention_flops_per_pair=4.0 * model_spec.num_hidden_layers * model_spec.num_attention_heads
            * model_spec.head_dim / tp,
            memory_bandwidth=float(gpu_spec.memory_bandwidth_bytes_per_s),
            peak_flops=float(gpu_spec.peak_flops),
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


class Simulation:
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
        self.integral = UsageIntegral()
        self.log = IterationLog() if record_iterations else None
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
        dt = self.config.cost.iteration_time(num_tokens, out.num_context_tokens, out.num_attention_pairs)
        if out.num_swap_bytes:
            dt += out.num_swap_bytes / PCIE_BANDWIDTH
        usage = slot_usage(self.allocator, sched.num_resident_computed_tokens + num_tokens)
        num_seqs = len(out.num_scheduled_tokens)
        self.integral.add(usage, dt, num_seqs)
        if self.log is not None:
            self.log.append(
                self.now - self.start_time, dt, num_seqs, len(sched.running), len(sched.waiting),
                out.num_prefill_tokens, out.num_decode_tokens, len(out.preempted_req_ids),
                usage.token, usage.reserved, usage.internal_fragmentation, usage.overhead, usage.free,
            )
        self.now += dt
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
                seq.status = SeqStatus.REJECTED
                seq.reject_reason = reason
                self.counters.num_rejected += 1
                self.counters.reject_reasons[reason] = self.counters.reject_reasons.get(reason, 0) + 1
                continue
            add_request(seq)
        self._next_arrival = i
        self._next_arrival_time = requests[i].arrival_time if i < num_requests else INF

    def _may_jump_after(self, out: SchedulerOutput, num_finished: int) -> bool:
        """Whether the iteration after this one is pure decode: every running request computes the one token it
        sampled last, nobody is admitted or preempted. Then ``_jump`` may run it and the ones after."""
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
        if out.num_prefill_tokens == 0 and out.num_decode_tokens == len(running) + num_finished:
            return True  # everybody decoded, so everybody still running decodes again
        return all(seq.num_tokens - seq.num_computed_tokens == 1 and seq.num_output_tokens for seq in running)

    def _jump(self, limit_time: float) -> int:
        """Run the pure-decode iterations that follow without scheduling them one by one; see the module doc.
        Returns how many iterations it ran (0: the next iteration must be stepped).

        Iteration s = 1, 2, ... of a jump: running request i computes token ``computed[i] + s - 1`` (the one it
        sampled last) and samples the next; it finishes after iteration ``remaining[i]``. A paged request needs
        a new block before the iteration whose token starts one, every ``block_size`` iterations, so the
        requests needing a block before iteration s are those in ``alloc_events[s % block_size]`` (a
        contiguous slab already holds every token). The jump stops before an iteration that a step would
        schedule differently: an arrival that could be admitted, allocations the free blocks do not cover
        (a step would preempt), or, after a finish, a queue that the freed memory might let in."""
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
        seqs = running[:]
        computed = [seq.num_computed_tokens for seq in seqs]
        outputs = [seq.num_output_tokens for seq in seqs]
        finish_at: dict[int, list[int]] = {}
        alloc_events: dict[int, list[int]] = {}  # s % block_size -> positions needing a new block before s
        fill_events: dict[int, list[int]] = {}  # prefix caching: s % block_size -> positions filling a block in s
        alloc_key: list[int | None] = [None] * n
        get_num_slots = allocator.get_num_slots
        for i, seq in enumerate(seqs):
            remaining = seq.request.num_output_tokens - outputs[i]
            if remaining in finish_at:
                finish_at[remaining].append(i)
            else:
                finish_at[remaining] = [i]
            first = get_num_slots(seq.request_id) - computed[i] + 1  # the first iteration without a slot
            if first <= remaining:
                if first > bs:
                    return 0  # holds more blocks than its tokens need (never in practice): step instead
                key = first % bs
                alloc_key[i] = key
                alloc_events.setdefault(key, []).append(i)
            if caching:
                fill_events.setdefault(-computed[i] % bs, []).append(i)
        num_event_seqs = n - alloc_key.count(None)
        rids = [seq.request_id for seq in seqs]
        append_blocks = None if caching else getattr(allocator, "append_blocks", None)

        cost = cfg.cost
        weights, kv_bytes, bandwidth, flops_per_token, flops_per_pair, flops, overhead_s = cost.coefficients
        integral = self.integral
        i_tok, i_res, i_int, i_ovh, i_free, busy = (
            integral.token, integral.reserved, integral.internal_fragmentation, integral.overhead, integral.free,
            integral.busy_time,
        )
        num_slots = allocator.num_slots
        alloc = allocator.num_allocated_slots
        internal = allocator.num_internal_fragmentation_slots
        ovh = allocator.num_overhead_slots
        dup = allocator.num_duplicate_token_slots
        log = self.log
        if log is not None:
            (a_time, a_duration, a_num_seqs, a_num_running, a_num_waiting, a_num_prefill, a_num_decode,
             a_num_preempted, a_token, a_reserved, a_internal, a_overhead, a_free) = (
                log.columns[name].append for name in ITERATION_COLUMNS
            )
        start_time = self.start_time
        now = self.now
        sum_c = sum(computed)
        num_decoded = 0  # tokens computed by the jump (each samples one)
        num_done = 0
        resident_freed = 0
        finish_iters = sorted(finish_at)
        fi = 0
        next_finish = finish_iters[0]
        next_arrival = self._next_arrival_time
        max_num_seqs = cfg.max_num_seqs
        max_batched = cfg.max_num_batched_tokens
        arrivals_matter = admits and n < max_num_seqs and n < max_batched
        can_jump_after = False
        s = 0
        while True:
            if now >= limit_time:
                can_jump_after = True  # nothing changed: the next call goes on from here
                break
            if next_arrival <= now:
                if arrivals_matter and not waiting:
                    break  # it may be admitted: a step decides
                self.now = now
                self._arrive()
                next_arrival = self._next_arrival_time
            if not num_event_seqs and next_finish - s > VECTOR_MIN_ITERATIONS:
                # Nothing but the clock changes until the next finish: run those iterations as arrays.
                (integral.token, integral.reserved, integral.internal_fragmentation, integral.overhead,
                 integral.free, integral.busy_time) = i_tok, i_res, i_int, i_ovh, i_free, busy
                num = next_finish - 1 - s
                ran, now, cut = self._decode_segment(
                    s + 1, num, n, sum_c, dup, alloc, internal, ovh, now, limit_time,
                    next_arrival if arrivals_matter and not waiting else INF,
                )
                i_tok, i_res, i_int, i_ovh, i_free, busy = (
                    integral.token, integral.reserved, integral.internal_fragmentation, integral.overhead,
                    integral.free, integral.busy_time,
                )
                next_arrival = self._next_arrival_time
                s += ran
                num_decoded += ran * n
                if cut:
                    can_jump_after = now >= limit_time  # else an arrival that may be admitted: a step decides
                    break
                continue
            s += 1
            key = s % bs
            if num_event_seqs:
                new_block = alloc_events.get(key)
                if new_block and len(new_block) > allocator.num_free_blocks:
                    s -= 1
                    break  # a step would preempt
                if caching:
                    fill = fill_events.get(key)
                    if new_block or fill:
                        for i in sorted({*(new_block or ()), *(fill or ())}):
                            seq = seqs[i]
                            seq.num_computed_tokens = computed[i] + s - 1
                            seq.num_output_tokens = outputs[i] + s - 1
                            allocator.allocate_slots(seq, 1)
                        alloc = allocator.num_allocated_slots
                        internal = allocator.num_internal_fragmentation_slots
                elif new_block:
                    if append_blocks is not None:
                        append_blocks([rids[i] for i in new_block])
                    else:
                        for i in new_block:
                            seq = seqs[i]
                            seq.num_computed_tokens = computed[i] + s - 1
                            allocator.allocate_slots(seq, 1)
                    alloc = allocator.num_allocated_slots
                    internal = allocator.num_internal_fragmentation_slots
            # The iteration: n decodes, each attending over its context (the same arithmetic as
            # CostModel.iteration_time and UsageIntegral.add, in the same order, so the floats are identical).
            ctx = sum_c + s * n
            t_mem = (weights + ctx * kv_bytes) / bandwidth
            t_compute = (flops_per_token * n + flops_per_pair * ctx) / flops
            dt = (t_mem if t_mem >= t_compute else t_compute) + overhead_s
            token = ctx - dup
            i_tok += token * dt
            i_res += (alloc - token - internal) * dt
            i_int += internal * dt
            i_ovh += ovh * dt
            i_free += (num_slots - alloc - ovh) * dt
            busy += dt
            if log is not None:
                a_time(now - start_time)
                a_duration(dt)
                a_num_seqs(n)
                a_num_running(n)
                a_num_waiting(len(waiting))
                a_num_prefill(0)
                a_num_decode(n)
                a_num_preempted(0)
                a_token(token)
                a_reserved(alloc - token - internal)
                a_internal(internal)
                a_overhead(ovh)
                a_free(num_slots - alloc - ovh)
            now += dt
            num_decoded += n
            if s == next_finish:
                finishing = finish_at[s]
                for i in finishing:
                    seq = seqs[i]
                    seq.num_computed_tokens = computed[i] + s
                    seq.num_output_tokens = outputs[i] + s
                    seq.status = SeqStatus.FINISHED
                    seq.finish_time = now
                    allocator.free(seq)
                    resident_freed += computed[i] + s
                    sum_c -= computed[i]
                    if alloc_key[i] is not None:
                        alloc_events[alloc_key[i]].remove(i)
                        num_event_seqs -= 1
                    if caching:
                        fill_events[-computed[i] % bs].remove(i)
                n -= len(finishing)
                num_done += len(finishing)
                self.last_finish_time = now
                alloc = allocator.num_allocated_slots
                internal = allocator.num_internal_fragmentation_slots
                ovh = allocator.num_overhead_slots
                dup = allocator.num_duplicate_token_slots
                fi += 1
                next_finish = finish_iters[fi] if fi < len(finish_iters) else INF
                if n == 0 or (admits and waiting):
                    break  # the freed memory and seats may let the queue in: a step decides
                arrivals_matter = admits and n < max_num_seqs and n < max_batched

        (integral.token, integral.reserved, integral.internal_fragmentation, integral.overhead, integral.free,
         integral.busy_time) = i_tok, i_res, i_int, i_ovh, i_free, busy
        self.now = now
        self._can_jump = can_jump_after
        if s == 0:
            return 0
        integral.num_iterations += s
        integral.sum_batch_size += num_decoded
        if num_done:
            self.counters.num_finished += num_done
            running[:] = [seq for seq in seqs if seq.status is SeqStatus.RUNNING]
        k = s
        if num_done:
            for i, seq in enumerate(seqs):
                if seq.status is SeqStatus.RUNNING:
                    seq.num_computed_tokens = computed[i] + k
                    seq.num_output_tokens = outputs[i] + k
        else:
            for i, seq in enumerate(seqs):
                seq.num_computed_tokens = computed[i] + k
                seq.num_output_tokens = outputs[i] + k
        sched.num_resident_computed_tokens += num_decoded - resident_freed
        sched.num_sampled_tokens += num_decoded
        sched.step += k
        return k

    def _decode_segment(
        self, s0: int, num: int, n: int, sum_c: int, dup: int, alloc: int, internal: int, ovh: int,
        now: float, limit_time: float, cut_time: float,
    ) -> tuple[int, float, bool]:
        """Iterations s0 .. s0 + num - 1 of a jump in which nothing but the clock changes (no allocation, no
        finish), as numpy arrays: the same elementwise arithmetic as the loop, and the running sums
        (clock, integrals) accumulated left to right as the loop does, so every float is the same. Stops
        before the first iteration starting at or after ``limit_time`` or ``cut_time`` (an arrival that may be
        admitted); arrivals that only join the queue join. Returns (iterations run, clock, whether cut)."""
        import numpy as np

        ctx = np.arange(s0, s0 + num, dtype=np.int64)
        ctx *= n
        ctx += sum_c
        dts = self.config.cost.iteration_times(n, ctx, ctx)
        times = np.empty(num + 1)
        times[0] = now
        times[1:] = dts
        np.add.accumulate(times, out=times)  # times[j]: start of iteration j; sequential, as `now += dt`
        starts = times[:num]
        ran = num
        stop = min(limit_time, cut_time)
        if stop <= times[num - 1]:
            ran = int(np.searchsorted(starts, stop, side="left"))
        if ran < num:
            ctx, dts, starts = ctx[:ran], dts[:ran], starts[:ran]
        if ran == 0:
            return 0, now, True
        log = self.log
        waiting = self.scheduler.waiting
        num_waiting = len(waiting)
        if self._next_arrival_time <= starts[-1]:
            # Arrivals during the segment join the queue (or are rejected); the queue length per iteration
            # counts those that arrived by its start.
            self.now = float(starts[-1])
            self._arrive()
            if log is not None and len(waiting) > num_waiting:
                # The queue grew at its back: read only the newcomers (the queue may be long).
                joined = np.fromiter(
                    (seq.request.arrival_time for seq in islice(reversed(waiting), len(waiting) - num_waiting)),
                    dtype=np.float64,
                )[::-1]
                num_waiting = num_waiting + np.searchsorted(joined, starts, side="right")
        token = ctx - dup
        reserved = alloc - token - internal
        free = self.allocator.num_slots - alloc - ovh
        integral = self.integral
        integral.token = _accumulate(integral.token, token * dts)
        integral.reserved = _accumulate(integral.reserved, reserved * dts)
        integral.internal_fragmentation = _accumulate(integral.internal_fragmentation, internal * dts)
        integral.overhead = _accumulate(integral.overhead, ovh * dts)
        integral.free = _accumulate(integral.free, free * dts)
        integral.busy_time = _accumulate(integral.busy_time, dts.copy())
        if log is not None:
            log.extend(
                ran, time=starts - self.start_time, duration=dts, num_seqs=n, num_running=n, num_waiting=num_waiting,
                num_prefill_tokens=0, num_decode_tokens=n, num_preemptions=0, token=token, reserved=reserved,
                internal_fragmentation=internal, overhead=ovh, free=free,
            )
        return ran, float(times[ran]), ran < num


def _accumulate(total: float, values) -> float:
    """``total + values[0] + values[1] + ...`` added left to right (numpy's accumulate is sequential; its sum is
    pairwise and would round differently from a loop)."""
    import numpy as np

    values[0] = total + values[0]
    return float(np.add.accumulate(values)[-1])


def _in_arrival_order(requests) -> list:
    """Requests sorted by (arrival_time, request_id); a workload usually is already, so check first."""
    key = attrgetter("arrival_time", "request_id")
    keys = list(map(key, requests))
    if any(map(gt, keys, keys[1:])):
        return sorted(requests, key=key)
    return list(requests)


def _record_of(seq: Seq) -> RequestRecord:
    return RequestRecord(
        request_id=seq.request_id,
        arrival_time=seq.request.arrival_time,
        prompt_len=seq.request.prompt_len,
        num_output_tokens=seq.num_output_tokens,
        status="rejected" if seq.status is SeqStatus.REJECTED else (
            "finished" if seq.status is SeqStatus.FINISHED else seq.status.value
        ),
        first_scheduled_time=seq.first_scheduled_time,
        first_token_time=seq.first_token_time,
        finish_time=seq.finish_time,
        num_preemptions=seq.num_preemptions,
        reject_reason=seq.reject_reason,
    )

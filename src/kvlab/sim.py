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

import heapq
from collections.abc import Callable
from dataclasses import dataclass, replace

from kvlab.cost import CostModel
from kvlab.errors import KvlabError
from kvlab.memory import make_allocator
from kvlab.memory.base import BlockSnapshot, SlotUsage, slot_usage
from kvlab.metrics import Counters, IterationLog, RequestRecord, UsageIntegral, summarize
from kvlab.sched.batching import ADMITS_WHILE_RUNNING
from kvlab.sched.output import SchedulerOutput
from kvlab.sched.scheduler import Scheduler, SchedulerConfig
from kvlab.sched.seq import Seq, SeqStatus
from kvlab.strategies import PREEMPTION_MODES, Strategy
from kvlab.workload import Workload

PCIE_BANDWIDTH = 25e9  # bytes/s a swap moves between GPU and CPU memory (PCIe 4.0 x16, in practice)


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
        self.requests = sorted(workload.requests, key=lambda r: (r.arrival_time, r.request_id))
        self.start_time = self.requests[0].arrival_time if self.requests else 0.0
        self.now = self.start_time
        self.seqs: dict[int, Seq] = {}
        self.counters = Counters()
        self.integral = UsageIntegral()
        self.log = IterationLog() if record_iterations else None
        self.jump = jump
        self.last_finish_time = self.start_time
        self._next_arrival = 0
        self._last_pure_decode = False
        self._admits_while_running = ADMITS_WHILE_RUNNING[strategy.batching]

    # -- public ----------------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self._next_arrival >= len(self.requests) and self.scheduler.num_unfinished == 0

    def step(self) -> SchedulerOutput | None:
        """One engine iteration. Returns what was scheduled, or None when every request is done."""
        sched = self.scheduler
        self._arrive()
        if sched.num_unfinished == 0:
            if self._next_arrival >= len(self.requests):
                return None
            self.now = max(self.now, self.requests[self._next_arrival].arrival_time)  # idle until the next arrival
            self._arrive()
            if sched.num_unfinished == 0:
                return self.step()  # everything that arrived was rejected
        out = sched.schedule()
        if not out.num_scheduled_tokens and not out.new_req_ids and not out.preempted_req_ids:
            raise RuntimeError(f"no progress in iteration {out.step}: {sched.running!r} {list(sched.waiting)[:3]!r}")
        dt = self.config.cost.iteration_time(
            out.total_num_scheduled_tokens, out.num_context_tokens, out.num_attention_pairs
        )
        if out.num_swap_bytes:
            dt += out.num_swap_bytes / PCIE_BANDWIDTH
        usage = slot_usage(self.allocator, sched.num_resident_computed_tokens + out.total_num_scheduled_tokens)
        self._record(dt, out.num_seqs, out.num_prefill_tokens, out.num_decode_tokens, len(out.preempted_req_ids), usage)
        self.now += dt
        finished = sched.update_from_output(out, self.now)
        if finished:
            self.counters.num_finished += len(finished)
            self.last_finish_time = self.now
        self._last_pure_decode = (
            not finished
            and not out.preempted_req_ids
            and not out.new_req_ids
            and out.num_prefill_tokens == 0
            and out.num_decode_tokens == len(sched.running)
        )
        return out

    def run_until(self, t: float) -> None:
        """Advance until the clock reaches ``t`` (seconds) or every request is done."""
        while self.now < t and not self.done:
            if self.jump and self._last_pure_decode and self._jump(t):
                continue
            if self.step() is None:
                break

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        """Run to the end. ``progress(num_done, num_requests)`` is called now and then."""
        total = len(self.requests)
        tick = 0
        while not self.done:
            if self.jump and self._last_pure_decode and self._jump(float("inf")):
                continue
            if self.step() is None:
                break
            tick += 1
            if progress is not None and tick % 256 == 0:
                progress(self.counters.num_finished + self.counters.num_rejected, total)
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
        cfg = self.config
        while self._next_arrival < len(requests) and requests[self._next_arrival].arrival_time <= self.now:
            request = requests[self._next_arrival]
            self._next_arrival += 1
            reason = None
            if request.prompt_len >= cfg.max_model_len:
                reason = "prompt longer than max_model_len"
            else:
                room = cfg.max_model_len - request.prompt_len
                if request.num_output_tokens > room:
                    # vLLM stops a request at max_model_len (finish reason "length").
                    request = replace(request, max_tokens=room)
                if not self.allocator.can_ever_fit(request):
                    reason = "larger than the whole KV cache"
            seq = Seq(request)
            self.seqs[request.request_id] = seq
            if reason is not None:
                seq.status = SeqStatus.REJECTED
                seq.reject_reason = reason
                self.counters.num_rejected += 1
                self.counters.reject_reasons[reason] = self.counters.reject_reasons.get(reason, 0) + 1
                continue
            self.scheduler.add_request(seq)

    def _record(self, dt: float, num_seqs: int, prefill: int, decode: int, preempted: int, usage: SlotUsage) -> None:
        self.integral.add(usage, dt, num_seqs)
        if self.log is not None:
            sched = self.scheduler
            self.log.append(
                self.now - self.start_time, dt, num_seqs, len(sched.running), len(sched.waiting),
                prefill, decode, preempted,
                usage.token, usage.reserved, usage.internal_fragmentation, usage.overhead, usage.free,
            )

    def _jump(self, limit_time: float) -> int:
        """Run the pure-decode iterations that follow without scheduling them one by one; see the module doc.
        Returns how many iterations it ran (0: the next iteration must be stepped)."""
        sched = self.scheduler
        running = sched.running
        n = len(running)
        if sched.waiting and not sched.admission_blocked:
            return 0
        k_max = min(seq.num_remaining_outputs for seq in running) - 1  # the finishing iteration is stepped
        if k_max <= 0:
            return 0
        allocator = self.allocator
        computed = [seq.num_computed_tokens for seq in running]
        held = [allocator.get_num_slots(seq.request_id) for seq in running]
        block_size = self.config.block_size
        k_max = _steps_memory_allows(computed, held, block_size, allocator, k_max)
        if k_max <= 0:
            return 0

        # Allocation events: (iteration s, position i in running): seq i needs a new block before iteration s.
        events = [(h - c + 1, i) for i, (c, h) in enumerate(zip(computed, held)) if h - c + 1 <= k_max]
        heapq.heapify(events)
        arrivals_matter = (
            self._admits_while_running
            and n < self.config.max_num_seqs
            and n < self.config.max_num_batched_tokens
        )
        cost = self.config.cost.iteration_time
        total_computed = sum(computed)
        resident = sched.num_resident_computed_tokens
        requests = self.requests
        k = 0
        for s in range(1, k_max + 1):
            if self.now >= limit_time:
                break
            if self._next_arrival < len(requests) and requests[self._next_arrival].arrival_time <= self.now:
                if arrivals_matter and not sched.waiting:
                    break  # it might be admitted: step for real
                self._arrive()
            while events and events[0][0] == s:
                _, i = heapq.heappop(events)
                seq = running[i]
                seq.num_computed_tokens = computed[i] + s - 1
                allocator.allocate_slots(seq, 1)
                if s + block_size <= k_max:
                    heapq.heappush(events, (s + block_size, i))
            context = total_computed + s * n
            dt = cost(n, context, context)
            self._record(dt, n, 0, n, 0, slot_usage(allocator, resident + s * n))
            self.now += dt
            sched.step += 1
            k = s
        if k == 0:
            return 0
        for i, seq in enumerate(running):
            # The last iteration also records (caches) the blocks it filled; let the allocator see it.
            seq.num_computed_tokens = computed[i] + k - 1
            allocator.allocate_slots(seq, 1)
            seq.num_computed_tokens = computed[i] + k
            seq.num_output_tokens += k
        sched.num_resident_computed_tokens = resident + k * n
        sched.num_sampled_tokens += k * n
        return k


def _steps_memory_allows(computed: list[int], held: list[int], block_size: int, allocator, k_max: int) -> int:
    """The most decode iterations (≤ k_max) whose new blocks the free blocks cover. Before iteration s a
    request with c computed tokens and h slots needs room for c + s tokens. (A contiguous slab already holds
    every token its request will write, so only a paged allocator is ever asked for its free blocks.)"""

    def need(s: int) -> int:
        total = 0
        for c, h in zip(computed, held):
            over = c + s - h
            if over > 0:
                total += (over + block_size - 1) // block_size
        return total

    if need(k_max) == 0:
        return k_max
    num_free_blocks = allocator.num_free_blocks
    if need(k_max) <= num_free_blocks:
        return k_max
    lo, hi = 0, k_max  # need(lo) fits, need(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if need(mid) <= num_free_blocks:
            lo = mid
        else:
            hi = mid
    return lo


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

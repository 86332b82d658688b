"""The engine's configuration in vLLM's shape: a few frozen sub-configs, built once and passed down.

    options: CLI flags, the lab's parameters, a sweep point, a library call's keywords (vLLM's EngineArgs)
       │
       └─▶ SimConfig.from_options(**options)   sizes the KV cache once (kvlab.sizing), builds the cost model once
              SimConfig                        (vLLM's VllmConfig)
                ├── model: ModelConfig          which model, in which dtype
                ├── cache: CacheConfig          the KV cache: token slots, block size, swap space
                ├── scheduler: SchedulerConfig  seats, token budget, max_model_len, chunked prefill
                ├── cost: CostModel             the clock (kvlab.cost)
                └── gpu                         the GPU's name, as the reports print it
       │
       └─▶ Simulation(strategy, config, workload)
              allocator ◀── config.cache                 (make_allocator takes plain numbers)
              Scheduler ◀── config.scheduler, with the strategy's batching and preemption mode (dataclasses.replace),
                            and config.cache for swap preemption's budget

vLLM's refusals of scheduler settings are checked in one place, ``SchedulerConfig.__post_init__`` (vLLM's
SchedulerConfig.verify_max_model_len), whoever builds one: ``from_options``, kvlab's sizing and the real-engine
settings (kvlab/vllm/job.py). What needs two sub-configs (a block longer than a sequence; swap preemption without
swap space) is checked by ``SimConfig.__post_init__``, as vLLM's VllmConfig checks what spans its parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvlab.errors import KvlabError
from kvlab.strategies import BATCHING_NAMES, check_preemption_mode

if TYPE_CHECKING:
    from kvlab.cost import CostModel

GIB = 2**30


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Which model is served, in vLLM's names. (``max_model_len`` lives in SchedulerConfig: the scheduler reads it.)"""

    model: str = ""  # the catalogue id (kvlab catalog), or the config.json the model was read from
    dtype: str = "auto"  # the weights' and activations' dtype, resolved from --dtype (e.g. float16)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The KV cache as sized: ``num_slots`` is its capacity in tokens (`kvlab size`'s "GPU KV cache size")."""

    num_slots: int
    block_size: int = 16
    kv_cache_dtype: str = "auto"  # resolved from --kv-cache-dtype (auto: the model's dtype)
    kv_bytes_per_token: int = 0  # whole model, every GPU: what one token's KV costs to swap
    swap_space_bytes: int = 4 * GIB  # CPU memory for swapped-out KV, every GPU (vLLM's old default: 4 GiB per GPU)

    def __post_init__(self) -> None:
        _check_positive(self, "num_slots", "block_size")

    @property
    def num_gpu_blocks(self) -> int:
        """Blocks of ``block_size`` slots (a paged pool's block 0 among them, vLLM's null block)."""
        return self.num_slots // self.block_size


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """What the scheduler may schedule per iteration, in vLLM's names. ``batching`` and ``preemption_mode`` are a
    strategy's (kvlab.strategies); ``preemption_mode`` None means "the strategy's own" (recompute when none)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    enable_chunked_prefill: bool = True
    batching: str = "continuous"  # a key of kvlab.sched.batching.BATCHING
    preemption_mode: str | None = None  # a key of kvlab.sched.preemption.PREEMPTION; None: the strategy's

    def __post_init__(self) -> None:
        """vLLM's refusals (config/scheduler.py, SchedulerConfig.verify_max_model_len), in `kvlab run`'s words."""
        _check_positive(self, "max_model_len", "max_num_seqs", "max_num_batched_tokens")
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
        if self.batching not in BATCHING_NAMES:
            raise KvlabError(f"batching {self.batching!r}; valid: {', '.join(BATCHING_NAMES)}")
        if self.preemption_mode is not None:
            check_preemption_mode(self.preemption_mode)


def min_num_gpu_blocks(max_model_len: int, block_size: int) -> int:
    """The fewest blocks vLLM starts with: one request of ``max_model_len`` tokens, plus the null block
    (vllm/v1/core/kv_cache_utils.py: _check_enough_kv_cache_memory)."""
    return -(-max_model_len // block_size) + 1


def check_block_size(block_size: int, max_model_len: int) -> None:
    """A block longer than the longest sequence is never filled: refused by `kvlab run` and `kvlab size` alike."""
    if block_size > max_model_len:
        raise KvlabError(f"--block-size {block_size} is larger than --max-model-len {max_model_len}: a block "
                         f"must fit in a sequence; valid: a block size of at most {max_model_len:,}")


def _check_positive(config: object, *names: str) -> None:
    for name in names:
        if getattr(config, name) <= 0:
            raise KvlabError(f"{name} must be positive, got {getattr(config, name)}")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything a run needs besides the strategy and the workload (vLLM's VllmConfig).

    ``from_options`` builds one from a model, a GPU and vLLM's flags; a test may build one from plain numbers:
    ``SimConfig(CacheConfig(num_slots=32, block_size=4), cost, SchedulerConfig(max_model_len=32, ...))``."""

    cache: CacheConfig
    cost: CostModel
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    gpu: str = ""

    def __post_init__(self) -> None:
        check_block_size(self.cache.block_size, self.scheduler.max_model_len)
        if self.scheduler.preemption_mode == "swap" and self.cache.swap_space_bytes <= 0:
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
        from kvlab.sizing import SizingConfig, size_kv_cache

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
        num_slots = num_gpu_blocks * block_size if num_gpu_blocks else sizing.num_pool_slots
        if num_slots < block_size * 2:
            raise KvlabError(
                f"{model_spec.id} on {gpu_spec.id} leaves a KV cache of {num_slots} token slots: too small to serve"
            )
        return cls(
            cache=CacheConfig(num_slots=num_slots, block_size=block_size, kv_cache_dtype=sizing.kv_cache_dtype,
                              kv_bytes_per_token=sizing.kv_bytes_per_token,
                              swap_space_bytes=int(swap_space_gib * GIB * tp)),
            cost=_cost_model(profile, model_spec, gpu_spec, sizing, tp, pipeline_parallel_size),
            scheduler=SchedulerConfig(max_num_seqs=sizing.max_num_seqs,
                                      max_num_batched_tokens=sizing.max_num_batched_tokens,
                                      max_model_len=sizing.max_model_len,
                                      enable_chunked_prefill=enable_chunked_prefill, preemption_mode=preemption_mode),
            model=ModelConfig(model=model_spec.id, dtype=sizing.dtype),
            gpu=gpu_spec.id,
        )


def _cost_model(profile, model_spec, gpu_spec, sizing, tp: int, pp: int) -> CostModel:
    """The cost profile's model for this model's weights, KV and FLOPs per tensor-parallel rank."""
    return profile.cost_model(
        weights_bytes=sizing.weights_bytes_total / tp,
        # Per TP rank, all layers: pipeline stages run one after the other, so an iteration reads every layer.
        kv_bytes_per_token=sizing.kv_bytes_per_token_per_gpu * pp,
        flops_per_token=2.0 * model_spec.num_active_params / tp,
        attention_flops_per_pair=4.0 * model_spec.num_hidden_layers * model_spec.num_attention_heads
        * model_spec.head_dim / tp,
        gpu=gpu_spec,
        model_id=model_spec.id,
    )

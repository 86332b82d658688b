"""What the engine reads, in vLLM's shape: a few frozen sub-configs, passed down (config/resolve.py builds them).

    SimConfig                        what a Simulation takes (KvlabConfig.engine; a test builds one from numbers)
      ├── model: ModelConfig          which model, in which dtype
      ├── cache: CacheConfig          the KV cache: token slots, block size, swap space
      ├── scheduler: SchedulerConfig  seats, token budget, max_model_len, chunked prefill
      ├── cost: CostModel             the clock (kvlab.cost)
      └── gpu                         the GPU's name, as the reports print it

       └─▶ Simulation(strategy, config, workload)
              allocator ◀── config.cache                 (make_allocator takes plain numbers)
              Scheduler ◀── config.scheduler, with the strategy's batching and preemption mode (dataclasses.replace),
                            and config.cache for swap preemption's budget

vLLM's refusals of scheduler settings are checked in one place, ``SchedulerConfig.__post_init__`` (vLLM's
SchedulerConfig.verify_max_model_len), whoever builds one: ``resolve``, kvlab's sizing and the real-engine
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
    from kvlab.offload.config import OffloadConfig
    from kvlab.spec.config import SpeculativeConfig

GIB = 2**30


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Which model is served, in vLLM's names. (``max_model_len`` lives in SchedulerConfig: the scheduler reads it.)"""

    model: str = ""  # the catalogue id (kvlab catalog), or the config.json the model was read from
    dtype: str = "auto"  # the weights' and activations' dtype, resolved from --dtype (e.g. float16)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The KV cache as sized: ``num_slots`` is its capacity in token slots (blocks x block size; `kvlab size`'s "GPU KV
    cache size" counts as vLLM prints it, which differs for sliding-window and hybrid models: report.setup)."""

    num_slots: int
    block_size: int = 16
    kv_cache_dtype: str = "auto"  # resolved from --kv-cache-dtype (auto: the model's dtype)
    kv_bytes_per_token: int = 0  # whole model, every GPU: what one token's KV costs to swap
    swap_space_bytes: int = 4 * GIB  # CPU memory for swapped-out KV, every GPU (vLLM's old default: 4 GiB per GPU)
    # What the pool was sized from (config/resolve.py): the share of GPU memory vLLM may use and the KV budget
    # that left (vLLM's "Available KV cache memory", or kvlab's estimate of it), per GPU.
    gpu_memory_utilization: float = 0.9
    available_kv_bytes: int = 0
    # What a run should know about how the pool stands for vLLM's (config/resolve.py: a hybrid model's groups).
    notes: tuple[str, ...] = ()
    # A hybrid model's KV cache groups, (kind, state_blocks, sliding_window, admission_blocks, block_size) each, when the paged
    # strategies give each request blocks in every group from vLLM's one pool (kvlab.memory.hybrid.GroupSpec); then
    # ``block_size`` is vLLM's (the groups' common one) and ``num_slots`` its blocks times it.
    # Empty: one pool of tokens (every single-group model).
    kv_cache_groups: tuple[tuple[str, int, int, int, int], ...] = ()
    # A hybrid with state layers whose groups are pooled (no kv_cache_groups): vLLM's pool without and with prefix caching
    # (its printed token figure: 'align' keeps more state blocks a request), where they differ, for each strategy to
    # take its own (KvlabConfig.for_strategy); ``num_slots`` is the version's default's. Empty: one pool for all.
    prefix_caching_slots: tuple[int, ...] = ()
    # A hybrid with kv_cache_groups whose Mamba groups vLLM runs in mamba_cache_mode 'align' with prefix caching on
    # (kvlab.vllm_rules.mamba_cache_mode, from 0.16.0): a strategy with prefix caching gives them vLLM's 'align'
    # tables and block-aligned prefill chunks (kvlab.memory.hybrid, mamba_align). False: one state block a request.
    mamba_align: bool = False

    def __post_init__(self) -> None:
        _check_positive(self, "num_slots", "block_size")

    @property
    def num_gpu_blocks(self) -> int:
        """Blocks of ``block_size`` slots (a paged pool's block 0 among them, vLLM's null block)."""
        return self.num_slots // self.block_size

    @property
    def prefix_caching_simulated(self) -> bool | str:
        """How far a strategy's prefix caching is simulated on this pool: True (fully), "own hits" (a hybrid in 'align'
        mode: a preempted request's own blocks still cached are the only hits) or False (a hybrid: every lookup
        misses)."""
        if not self.kv_cache_groups:
            return True
        return "own hits" if self.mamba_align else False


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
    # vLLM's --watermark: the fraction of the KV cache's blocks a waiting or preempted request must leave free to
    # be admitted while others run (vllm/v1/core/kv_cache_manager.py: allocate_slots). 0, V1's default, is off;
    # V0 (and Vidur) kept 0.01 always.
    watermark: float = 0.0
    # vLLM's --scheduling-policy: fcfs, or priority (the waiting order and the preemption victim by each request's
    # priority, smaller first; a key of kvlab.sched.policy.POLICIES).
    scheduling_policy: str = "fcfs"

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
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise KvlabError(f"--scheduling-policy {self.scheduling_policy!r}; valid: fcfs, priority")
        if not 0.0 <= self.watermark < 1.0:  # (vLLM's range: config/scheduler.py, SchedulerConfig.watermark)
            raise KvlabError(f"--watermark {self.watermark!r} is out of range; valid: a fraction from 0 (off, vLLM V1's "
                             "default) to less than 1 (V0 kept 0.01)")


def min_num_gpu_blocks(max_model_len: int, block_size: int) -> int:
    """The fewest blocks vLLM starts with: one request of ``max_model_len`` tokens, plus the null block
    (vllm/v1/core/kv_cache_utils.py: _check_enough_kv_cache_memory)."""
    return -(-max_model_len // block_size) + 1


def check_block_size(block_size: int, max_model_len: int) -> None:
    """A block longer than the longest sequence is never filled: refused by `kvlab run` and `kvlab size` alike."""
    if block_size > max_model_len:
        raise KvlabError(f"--block-size {block_size} is larger than --max-model-len {max_model_len}: a block "
                         "must fit in a sequence (kvlab's rule: a block longer than the longest sequence is never "
                         f"filled); valid: --max-model-len {block_size} or more, or a --block-size of at most "
                         f"{max_model_len:,}")


def _check_positive(config: object, *names: str) -> None:
    for name in names:
        if getattr(config, name) <= 0:
            raise KvlabError(f"{name} must be positive, got {getattr(config, name)}")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """What a Simulation needs besides the strategy and the workload: ``kvlab.config.resolve(...).engine`` builds
    one from a model, a GPU and vLLM's flags; a test may build one from plain numbers:
    ``SimConfig(CacheConfig(num_slots=32, block_size=4), cost, SchedulerConfig(max_model_len=32, ...))``."""

    cache: CacheConfig
    cost: CostModel
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    gpu: str = ""
    # vLLM's --speculative-config (kvlab.spec): None, off.
    speculative: SpeculativeConfig | None = None
    # vLLM's --kv-offloading-size: a CPU tier behind the KV cache (kvlab.offload); None, off.
    offload: OffloadConfig | None = None

    def __post_init__(self) -> None:
        check_block_size(self.cache.block_size, self.scheduler.max_model_len)
        if self.scheduler.preemption_mode == "swap" and self.cache.swap_space_bytes <= 0:
            raise KvlabError("--preemption-mode swap needs CPU swap space: give --swap-space GiB > 0")

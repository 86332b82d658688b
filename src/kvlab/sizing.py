"""vLLM's KV cache arithmetic, forward and reverse.

Forward: a GPU budget -> blocks, token slots and maximum concurrency, as vLLM 0.32 prints them at startup::

    requested        = total_gpu_memory x gpu_memory_utilization                  (gpu_worker.py)
    available        = requested - weights - peak activation - non-torch - CUDA graphs
    page_size_bytes  = num_kv_heads_per_gpu x block_size x (head_size + head_size_v) x dtype_bytes
                       (= 2 x block_size x heads x head_dim x bytes; MLA: 1 x block_size x 576 x bytes)
    bytes_per_block  = page_size_bytes x layers in the widest KV cache group on the GPU
    num_blocks       = available // bytes_per_block              (minimum over pipeline stages)
    max_concurrency  = num_blocks / blocks one max_model_len request needs, summed over groups
    GPU KV cache size (tokens) = int(max_concurrency x max_model_len)

(v1/kv_cache_interface.py: AttentionSpec.page_size_bytes, FullAttentionSpec / SlidingWindowSpec
.max_memory_usage_bytes; v1/core/kv_cache_utils.py: get_kv_cache_groups, get_kv_cache_config_from_groups,
get_max_concurrency_for_kv_cache_config, get_kv_cache_capacity.)

Reverse: the longest context for N requests, the most requests at context L, the fewest GPUs that hold the
weights and one full-length request, whether a workload of N requests of L tokens fits, and how many
replicas (and GPUs: replicas x TP x PP) hold it at once when one does not.

Every size here is per GPU unless its name says otherwise. No I/O.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from kvlab.catalog.gpus import GpuSpec, card_id, compute_capability, get_gpu, list_gpus, marketing_label_warning
from kvlab.catalog.hybrid import LINEAR_ATTENTION, MAMBA, attention_block_size
from kvlab.catalog.models import DTYPE_BYTES, FULL_ATTENTION, SLIDING_ATTENTION, ModelSpec
from kvlab.catalog.quant import expert_layout
from kvlab.catalog.rope import rope_bytes
from kvlab.catalog.vision import Gemma4Video, qwen3_video_dummy
from kvlab.config.engine import SchedulerConfig, check_block_size
from kvlab.config.options import OPTIONS
from kvlab.errors import KvlabError
from kvlab.memory_profile import (
    SAMPLERS,
    V2_SAMPLER_NO_FLOAT32_COPY_SINCE,
    EncoderInputs,
    MemoryProfile,
    ProfileInputs,
    Term,
    activation_bytes,
    cuda_graph_bytes,
    model_family,
    non_torch_bytes,
    with_kept_runner_state,
)
from kvlab.vllm_rules import (
    MODEL_RUNNERS,
    VllmRules,
    architecture_note,
    encoder_cache_rows,
    gemma4_vision_batched,
    mamba_cache_mode,
    mamba_state_blocks,
    model_runner,
    mrope_positions_factor,
    pipeline_buffer_counted,
    qwen3_vl_profiles_video,
    resolve_version,
    rules_for,
    runner_estimates_graphs,
    version_key,
)

GIB = 2**30

MODEL_DTYPES = OPTIONS["dtype"].choices
# --kv-cache-dtype values kvlab models, and their bytes; 'auto' means the model's dtype (config/cache.py CacheDType).
KV_CACHE_DTYPES = {"auto": None, "float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
assert tuple(KV_CACHE_DTYPES) == OPTIONS["kv_cache_dtype"].choices
# vLLM's CUDA attention backends (FlashAttention, FlashInfer, Triton, FlexAttention) take kernel blocks that are
# multiples of 16 tokens (get_supported_kernel_block_sizes); any other --block-size finds no backend there. The
# arithmetic holds for any block size, and the simulator runs any: a report notes it (cuda_block_size_note).
BLOCK_SIZE_MULTIPLE = 16


def cuda_block_size_note(block_size: int) -> str | None:
    """What vLLM's CUDA backends would say of this block size, or None when they take it."""
    if block_size % BLOCK_SIZE_MULTIPLE == 0:
        return None
    return (f"--block-size {block_size}: vLLM's CUDA attention backends take multiples of {BLOCK_SIZE_MULTIPLE} and "
            "would refuse it; the arithmetic and the simulator take any block size")

def format_gib(num_bytes: int) -> str:
    """GiB as vLLM's format_gib prints them: round(x, 2) through str(), so '12.0' and '6.51'."""
    return f"{round(num_bytes / GIB, 2)}"


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


def batch_defaults_memory(gpu_memory_bytes: int | None, gpu_name: str | None) -> int:
    """The total EngineArgs.get_batch_defaults goes by: NVML's, or 0 on a unified-memory GPU, where NVML reports none
    (catalog.gpus.UNIFIED_MEMORY_GPUS)."""
    from kvlab.catalog.gpus import is_unified_memory

    return 0 if is_unified_memory(gpu_name) else gpu_memory_bytes or 0


def default_max_num_batched_tokens(gpu_memory_bytes: int | None, gpu_name: str | None) -> int:
    """`vllm serve`'s default token budget per step (EngineArgs.get_batch_defaults, OPENAI_API_SERVER)."""
    memory = batch_defaults_memory(gpu_memory_bytes, gpu_name)
    if memory >= 160 * GIB:
        return 16384
    if memory >= 70 * GIB and "a100" not in (gpu_name or "").lower():
        return 8192
    return 2048


def default_max_num_seqs(gpu_memory_bytes: int | None, gpu_name: str | None) -> int:
    memory = batch_defaults_memory(gpu_memory_bytes, gpu_name)
    if memory >= 160 * GIB or (memory >= 70 * GIB and "a100" not in (gpu_name or "").lower()):
        return 1024
    return 256


@dataclass(frozen=True)
class SizingConfig:
    """The serving settings that decide the KV cache, in vLLM's names (per GPU where it matters).

    ``available_kv_bytes`` replaces kvlab's estimate of the budget with the figure vLLM printed as
    "Available KV cache memory"; with it the token count is vLLM's exactly. ``max_model_len``,
    ``max_num_batched_tokens`` and ``max_num_seqs`` default (None) to vLLM's defaults for the model and GPU.
    """

    gpu_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    available_kv_bytes: int | None = None
    # One printed budget per pipeline stage, where a log's workers printed different ones (each stage holds its own
    # layers and weights); vLLM keeps the fewest blocks of any worker (unify_kv_cache_configs). None: the one above.
    available_kv_bytes_by_stage: tuple[int, ...] | None = None
    gpu_name: str | None = None
    vllm_version: str | None = None  # whose rules apply; None: the newest kvlab knows (kvlab.vllm_rules)
    enforce_eager: bool = False
    quantization: str | None = None  # --quantization: the checkpoint's weight format when config.json names none
    sampler: str | None = None  # top-k/top-p implementation of the profiling run; None: the version's default
    # VLLM_USE_V2_MODEL_RUNNER as a runner: "v2" (=1) or "v1" (=0); None (unset): the one the version picks for the
    # model (kvlab.vllm_rules.model_runner)
    model_runner: str | None = None
    # --decode-context-parallel-size: the TP ranks of a DCP group each keep every DCP-th token's KV, so a request of
    # L tokens takes cdiv(L, DCP) tokens' blocks on each GPU (AttentionSpec.max_memory_usage_bytes)
    decode_context_parallel_size: int = 1
    # --enable-expert-parallel: a MoE layer's routed experts are dealt out whole, E / TP to each GPU, instead of each
    # expert's width split over the TP ranks (vLLM's FusedMoE with EP; the shared experts and the rest stay TP)
    enable_expert_parallel: bool = False
    # vLLM's --speculative-config: its method (SPECULATIVE_METHODS; None: none) and num_speculative_tokens. An MTP
    # drafter's layers take KV cache beside the target's, and a hybrid's state blocks grow (speculative_layers).
    speculative_method: str | None = None
    num_speculative_tokens: int = 3
    # --enable-prefix-caching; None: vLLM's default (for a hybrid: off up to 0.27, on from 0.28.0,
    # vllm_rules.HYBRID_PREFIX_CACHING_DEFAULT_SINCE). Only a hybrid's sizing reads it: prefix caching sets its
    # mamba_cache_mode, and 'align' keeps more state blocks a request (vllm_rules.mamba_state_blocks).
    enable_prefix_caching: bool | None = None

    def __post_init__(self):
        if not 0 < self.gpu_memory_utilization <= 1:
            raise KvlabError(f"gpu_memory_utilization {self.gpu_memory_utilization} is outside (0, 1]: it is the "
                             "fraction of GPU memory vLLM may use, e.g. 0.9")
        for name in ("gpu_memory_bytes", "available_kv_bytes", "max_model_len", "max_num_batched_tokens",
                     "max_num_seqs"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise KvlabError(f"{name} must be positive, got {value}")
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "decode_context_parallel_size"):
            if getattr(self, name) < 1:
                flag = "-dcp" if name == "decode_context_parallel_size" else f"--{name.replace('_', '-')}"  # (vLLM's and kvlab's)
                raise KvlabError(f"{name} must be at least 1, got {getattr(self, name)} ({flag}: "
                                 "a whole number of GPUs, 1 for none)")
        by_stage = self.available_kv_bytes_by_stage
        if by_stage is not None and (len(by_stage) != self.pipeline_parallel_size or min(by_stage) <= 0):
            raise KvlabError(f"available_kv_bytes_by_stage {by_stage} must give one positive budget for each of the "
                             f"{self.pipeline_parallel_size} pipeline stages")
        tp, dcp = self.tensor_parallel_size, self.decode_context_parallel_size
        if tp % dcp:
            valid = ", ".join(str(d) for d in range(1, tp + 1) if tp % d == 0)
            raise KvlabError(f"-dcp {dcp} must divide --tensor-parallel-size {tp} (DCP "
                             f"groups are made of TP ranks); valid: {valid}")
        if self.block_size <= 0:
            raise KvlabError(f"--block-size {self.block_size} must be positive; valid: 16, 32, 64, 128, ... (vLLM's "
                             "CUDA block sizes), or any whole number from 1 for the arithmetic and the simulator")
        if self.dtype not in MODEL_DTYPES:
            raise KvlabError(f"--dtype {self.dtype!r} is not a model dtype; valid: {', '.join(MODEL_DTYPES)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise KvlabError(f"--kv-cache-dtype {self.kv_cache_dtype!r} is not modelled (fp8_ds_mla and the 4-bit "
                             f"formats are not); valid: {', '.join(KV_CACHE_DTYPES)}")
        rules_for(self.vllm_version)  # an unknown version is refused here, naming the known ones
        check_speculative(self.speculative_method, self.num_speculative_tokens)
        if self.sampler is not None and self.sampler not in SAMPLERS:
            raise KvlabError(f"--sampler {self.sampler!r} is not one kvlab knows; valid: {', '.join(SAMPLERS)}")
        if self.model_runner is not None and self.model_runner not in MODEL_RUNNERS:
            raise KvlabError(f"--model-runner {self.model_runner!r} is not a vLLM GPU model runner; valid: "
                             f"{', '.join(MODEL_RUNNERS)} (VLLM_USE_V2_MODEL_RUNNER=0 or 1)")
        if self.quantization is not None:
            from kvlab.catalog.quant import requested_method

            # frozen: normalise once, so none/auto size exactly as no --quantization does
            object.__setattr__(self, "quantization", requested_method(self.quantization, "--quantization"))

    @classmethod
    def for_gpu(cls, gpu: GpuSpec, **settings) -> SizingConfig:
        return cls(gpu_memory_bytes=gpu.memory_bytes, gpu_name=gpu.id, **settings)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def resolved_max_num_batched_tokens(self) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return default_max_num_batched_tokens(self.gpu_memory_bytes, self.gpu_name)

    @property
    def resolved_max_num_seqs(self) -> int:
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        return default_max_num_seqs(self.gpu_memory_bytes, self.gpu_name)

    @property
    def rules(self) -> VllmRules:
        return rules_for(self.vllm_version)

    @property
    def num_spec_tokens(self) -> int:
        """The draft tokens per step of the speculative config; 0 without one."""
        return self.num_speculative_tokens if self.speculative_method else 0

    @property
    def max_in_flight_tokens(self) -> int:
        """Tokens a sliding-window layer keeps beyond its window when vLLM counts a request's blocks: one batch
        (SlidingWindowSpec.max_memory_usage_bytes, up to 0.20), or (PP + 1) batches with async scheduling
        (VllmConfig's max in-flight tokens, later releases)."""
        if self.rules.sliding_in_flight == "one_batch":
            return self.resolved_max_num_batched_tokens
        return (self.pipeline_parallel_size + 1) * self.resolved_max_num_batched_tokens


@dataclass(frozen=True)
class KVCacheSpec:
    """The KV cache of one layer on one GPU (vLLM's FullAttentionSpec / SlidingWindowSpec / MLAAttentionSpec)."""

    kind: str  # full_attention | sliding_attention | mla | mamba (linear attention and Mamba: vLLM's MambaSpec)
    block_size: int
    num_kv_heads: int
    head_size: int
    head_size_v: int  # 0 for MLA: one latent, no separate V
    dtype_bytes: int
    sliding_window: int | None = None
    state_page_bytes: int = 0  # mamba: one request's state, padded to the attention page
    state_blocks: int = 1  # mamba: blocks one request holds (vllm_rules.mamba_state_blocks)

    @property
    def page_size_bytes(self) -> int:
        """One block of one layer: heads x block_size x (K + V values) x bytes (AttentionSpec.page_size_bytes);
        a state layer's page is its padded state (MambaSpec.page_size_bytes with mamba_page_size_padded)."""
        if self.kind == "mamba":
            return self.state_page_bytes
        return self.num_kv_heads * self.block_size * (self.head_size + self.head_size_v) * self.dtype_bytes

    def max_num_blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        """Blocks one request of ``max_model_len`` tokens can hold in this layer's group.

        Full attention and MLA: every token (FullAttentionSpec.max_memory_usage_bytes). Sliding window: the
        window plus the in-flight tokens, + 1 because the window need not start at a block boundary
        (SlidingWindowSpec.max_admission_blocks_per_request).
        """
        if self.kind == SLIDING_ATTENTION:
            num_tokens = min(self.sliding_window - 1 + max_in_flight_tokens, max_model_len)
            return cdiv(num_tokens, self.block_size) + 1
        if self.kind == "mamba":
            return self.state_blocks  # MambaSpec.max_memory_usage_bytes: one state, + speculative / 'align' blocks
        return cdiv(max_model_len, self.block_size)


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share one block table (vLLM's KVCacheGroupSpec); ``layers`` are model layer indices."""

    spec: KVCacheSpec
    layers: tuple[int, ...]


def layer_kv_specs(model: ModelSpec, config: SizingConfig, kv_dtype_bytes: int,
                   act_dtype_bytes: int = 2) -> list[KVCacheSpec | None]:
    """Each layer's cache spec (None: a layer without one: Nemotron-H's MLP blocks, Gemma 4's layers that read an
    earlier layer's cache). A hybrid with linear-attention or Mamba layers gets one page size for all: the attention
    block grows until its page holds a state, and the state is padded to it (kvlab.catalog.hybrid). Attention layers
    of different pages (Gemma 4: head size 512 beside 256) are unified after (unify_page_sizes)."""
    tp = config.tensor_parallel_size
    heads = model.num_kv_heads_per_gpu(tp)
    block_size, state_page, state_blocks = config.block_size, 0, 1
    if model.state is not None:
        per_token = model.kv_bytes_per_token_per_layer(kv_dtype_bytes) // model.num_kv_heads_cached * heads
        state = model.state.state_bytes(tp, act_dtype_bytes, config.num_spec_tokens)
        block_size = attention_block_size(state, per_token, block_size)
        state_page, state_blocks = block_size * per_token, hybrid_state_blocks(model, config)
    specs: list[KVCacheSpec | None] = []
    for i, layer_type in enumerate(model.layer_types):
        if layer_type in (LINEAR_ATTENTION, MAMBA):
            specs.append(KVCacheSpec("mamba", block_size, 0, 0, 0, act_dtype_bytes, state_page_bytes=state_page,
                                     state_blocks=state_blocks))
        elif layer_type not in (FULL_ATTENTION, SLIDING_ATTENTION) or model.kv_sharing_target(i) is not None:
            specs.append(None)
        elif model.is_mla:
            specs.append(KVCacheSpec("mla", block_size, 1, model.kv_head_size, 0, kv_dtype_bytes))
        else:
            # Attention.get_kv_cache_spec with this layer's heads and head size (Gemma 4's differ by layer type)
            heads, head = max(1, model.layer_num_kv_heads(i) // tp), model.layer_head_dim(i)
            window = model.sliding_window if layer_type == SLIDING_ATTENTION else None
            specs.append(KVCacheSpec(layer_type, block_size, heads, head, head, kv_dtype_bytes, window))
    drafter = speculative_layers(model, config)
    if drafter:  # the MTP layers are full-attention layers of the target's shape (e.g. Qwen3_5MultiTokenPredictor)
        full = next(s for i, s in enumerate(specs) if s is not None and model.layer_types[i] == FULL_ATTENTION)
        specs += [full] * drafter
    return unify_page_sizes(specs)


SPECULATIVE_METHODS = ("ngram", "mtp")  # the --speculative-method values whose cache kvlab sizes
SPECULATIVE_NOT_SIZED = ("eagle", "draft_model")  # the simulator's other methods: their drafter is another checkpoint


def check_speculative(method: str | None, num_speculative_tokens: int) -> None:
    """Refuse a speculative config kvlab cannot size, in one line."""
    if method is None:
        return
    if method in SPECULATIVE_NOT_SIZED:
        raise KvlabError(f"--speculative-method {method} is not sized: its drafter's layers and weights come from "
                         f"another checkpoint, which kvlab does not read; valid: {', '.join(SPECULATIVE_METHODS)}")
    if method not in SPECULATIVE_METHODS:
        raise KvlabError(f"--speculative-method {method!r} is not one kvlab sizes; valid: "
                         f"{', '.join(SPECULATIVE_METHODS)}")
    if num_speculative_tokens < 1:
        raise KvlabError(f"--num-speculative-tokens {num_speculative_tokens} must be at least 1 (draft tokens per "
                         "request and step)")


def speculative_layers(model: ModelSpec, config: SizingConfig) -> int:
    """Attention layers the drafter adds to the KV cache: an MTP drafter's are the checkpoint's own MTP layers
    (vLLM builds n_predict = num_nextn_predict_layers / mtp_num_hidden_layers of them, reused for every draft token,
    and gpu_model_runner.get_kv_cache_spec gives each a cache like the target's); ngram adds none."""
    if config.speculative_method != "mtp":
        return 0
    if not model.num_nextn_predict_layers:
        raise KvlabError(f"--speculative-method mtp needs a model with MTP layers (config.json's "
                         f"num_nextn_predict_layers or mtp_num_hidden_layers); {model.id} has none; valid: ngram")
    return model.num_nextn_predict_layers


def hybrid_state_blocks(model: ModelSpec, config: SizingConfig) -> int:
    """Blocks one request's state takes in each state group of a hybrid (vllm_rules.mamba_state_blocks) in the
    mamba_cache_mode prefix caching puts it in (hybrid_cache_mode): 'align' adds a block (two for a Mamba2 mixer from
    0.32.0), 'all' is refused, not modelled."""
    assert model.state is not None
    mode, _ = hybrid_cache_mode(model, config)
    return mamba_state_blocks(config.vllm_version, config.num_spec_tokens, mode, model.state.kind)


def hybrid_cache_mode(model: ModelSpec, config: SizingConfig) -> tuple[str, str]:
    """(vLLM's mamba_cache_mode for a hybrid ``model``, why in words): --enable-prefix-caching as given, else the
    version's default (vllm_rules.mamba_cache_mode: on for hybrids from 0.28.0); ("", "") for a model without state
    layers."""
    if model.state is None:
        return "", ""
    return mamba_cache_mode(config.vllm_version, config.enable_prefix_caching, model.state.prefix_caching_mode == "all")


def unify_page_sizes(specs: list[KVCacheSpec | None]) -> list[KVCacheSpec | None]:
    """vLLM's unify_kv_cache_spec_page_size (v1/core/kv_cache_utils.py, read in 0.19.0 and 0.29.0): the one pool
    hands out blocks of one size, so a layer whose page is smaller than the largest holds proportionally more tokens
    per block (block_size x largest page / its page). Gemma 4 E2B: full-attention pages of 1 KV head x 512 are twice
    the sliding ones of 1 x 256, so its sliding layers take blocks of 32 tokens beside full ones of 16; in the
    26B-A4B, 8 x 256 against 2 x 512, the full-attention layers take the 32."""
    pages = {spec.page_size_bytes for spec in specs if spec is not None}
    if len(pages) <= 1:
        return specs
    largest = max(pages)
    unified: list[KVCacheSpec | None] = []
    for spec in specs:
        if spec is None or spec.page_size_bytes == largest:
            unified.append(spec)
        elif spec.kind != "mamba" and largest % spec.page_size_bytes == 0:
            unified.append(replace(spec, block_size=spec.block_size * (largest // spec.page_size_bytes)))
        else:  # 0.19 refuses to start; later releases pad the page (page_size_padded), which kvlab does not model
            raise KvlabError(f"a {spec.kind} layer's KV page of {spec.page_size_bytes:,} bytes does not divide the "
                             f"largest page, {largest:,} bytes, so vLLM cannot unify them by block size; kvlab does "
                             "not model the padding later releases apply")
    return unified


def group_layers(specs: list[KVCacheSpec | None]) -> tuple[KVCacheGroup, ...]:
    """Group layers as vLLM's get_kv_cache_groups does for layers of one page size.

    One kind of layer: one group. Several (hybrid, e.g. Gemma 3's 5 sliding : 1 full): bucket layers by spec,
    take the smallest bucket as the group size (the largest if all buckets are within 1.5x of it), and split
    each bucket into groups of that size by striding (layers[i::num_groups]), the last ones possibly short
    (vLLM pads them). Every group then needs its own blocks per request from the one shared pool.
    (_get_kv_cache_groups_uniform_page_size.)
    """
    buckets: dict[KVCacheSpec, list[int]] = {}
    for i, spec in enumerate(specs):
        if spec is not None:
            buckets.setdefault(spec, []).append(i)
    if len(buckets) == 1:
        spec, layers = next(iter(buckets.items()))
        return (KVCacheGroup(spec, tuple(layers)),)
    sizes = [len(layers) for layers in buckets.values()]
    group_size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups = []
    for spec, layers in buckets.items():
        num_groups = cdiv(len(layers), group_size)
        groups += [KVCacheGroup(spec, tuple(layers[i::num_groups])) for i in range(num_groups)]
    return tuple(groups)


def attention_group(groups: tuple[KVCacheGroup, ...]) -> KVCacheGroup:
    """The first group of attention layers (a hybrid's state groups hold no KV heads)."""
    return next((g for g in groups if g.spec.kind != "mamba"), groups[0])


def pipeline_stages(num_layers: int, pipeline_parallel_size: int) -> list[range]:
    """Layers per pipeline stage as vLLM's get_pp_indices splits them: the remainder goes to the stages before
    the last, counting back from the second-to-last."""
    sizes = [num_layers // pipeline_parallel_size] * pipeline_parallel_size
    for i in range(2, num_layers % pipeline_parallel_size + 2):
        sizes[-i] += 1
    stages, start = [], 0
    for size in sizes:
        stages.append(range(start, start + size))
        start += size
    return stages


def blocks_per_request(groups: tuple[KVCacheGroup, ...], num_tokens: int, max_in_flight_tokens: int,
                       decode_context_parallel_size: int = 1) -> int:
    """Blocks one request of ``num_tokens`` takes from one GPU's shared pool: the sum over groups
    (get_max_concurrency_for_kv_cache_config), of the cdiv(num_tokens, DCP) tokens each GPU of a DCP group keeps
    (AttentionSpec.max_memory_usage_bytes)."""
    tokens = cdiv(num_tokens, decode_context_parallel_size)
    return sum(g.spec.max_num_blocks_per_request(tokens, max_in_flight_tokens) for g in groups)


def printed_kv_tokens(rules: VllmRules, num_blocks: int, groups: tuple[KVCacheGroup, ...], per_request: int,
                      max_model_len: int, dcp: int = 1) -> int:
    """vLLM's "GPU KV cache size: N tokens" for ``num_blocks`` blocks (``per_request``: one max_model_len request's,
    blocks_per_request). Up to 0.20 (kv_cache_utils._report_kv_cache_config): num_blocks // groups x the smallest
    block size, x the DCP size ('Multiplying the GPU KV cache size by the dcp_world_size'); later
    (get_kv_cache_capacity): int(max_concurrency * max_model_len), in this order of float operations."""
    if rules.tokens_line == "blocks":
        return num_blocks // len(groups) * min(g.spec.block_size for g in groups) * dcp
    return int(num_blocks / per_request * max_model_len)


def profile_family(model: ModelSpec, quantization: str | None = None) -> str:
    """The family whose fitted activation scale applies (kvlab.memory_profile.model_family); 4-bit GPTQ/AWQ/AutoRound
    linear layers run on vLLM's Marlin kernels."""
    fmt = model.weight_format_for(quantization)
    int4 = fmt is not None and fmt.bits == 4 and fmt.scope == "linear" and fmt.method in ("gptq", "awq", "auto-round")
    return model_family(model.state is not None, model.is_moe, int4)


def profile_runner(model: ModelSpec, config: SizingConfig) -> str:
    """The GPU model runner vLLM profiles this model with: the one --model-runner names, else the version's pick."""
    quantized = model.weight_format_for(config.quantization) is not None
    return config.model_runner or model_runner(config.vllm_version, model.architecture, model.is_moe,
                                               model.state is not None, quantized)


def profile_inputs(model: ModelSpec, config: SizingConfig, act_dtype_bytes: int, num_layers: int,
                   last_stage: bool = True, first_stage: bool = True, weights_bytes: int = 0) -> ProfileInputs:
    """The numbers the memory profile's estimates read, for one GPU of a stage (``weights_bytes``: what the stage's
    GPU holds when vLLM profiles, for the encoders whose run depends on the free memory)."""
    tp = config.tensor_parallel_size
    inputs = dict(hidden_size=model.hidden_size, vocab_size=model.vocab_size, num_layers=num_layers,
                  act_dtype_bytes=act_dtype_bytes, max_num_batched_tokens=config.resolved_max_num_batched_tokens,
                  max_num_seqs=config.resolved_max_num_seqs, tensor_parallel_size=tp, last_stage=last_stage,
                  first_stage=first_stage, num_speculative_tokens=config.num_spec_tokens,
                  pipeline_buffer_in=pipeline_buffer_counted(config.rules, profile_runner(model, config)),
                  qkv_width_per_gpu=(model.num_attention_heads + 2 * model.num_key_value_heads) * model.head_dim // tp,
                  family=profile_family(model, config.quantization),
                  sampler=config.sampler or config.rules.default_sampler,
                  model_runner=profile_runner(model, config),
                  v2_float32_copy=version_key(resolve_version(config.vllm_version))
                  < version_key(V2_SAMPLER_NO_FLOAT32_COPY_SINCE),
                  logit_soft_cap=model.final_logit_softcapping is not None,
                  encoder=encoder_inputs(model, config, weights_bytes) if first_stage else None)  # the tower's stage
    if model.is_moe:
        width = model.moe_intermediate_size or model.intermediate_size
        return ProfileInputs(mlp_width_per_gpu=(model.num_shared_experts or 0) * width // tp,
                             moe_top_k=model.experts_per_token,
                             moe_width_per_gpu=width if config.enable_expert_parallel else width // tp, **inputs)
    return ProfileInputs(mlp_width_per_gpu=model.widest_mlp // tp, **inputs)


def encoder_inputs(model: ModelSpec, config: SizingConfig, weights_bytes: int = 0) -> EncoderInputs | None:
    """The encoder profiling run vLLM makes for a Qwen-VL model (gpu_model_runner.profile_run): items of the modality
    with the most tokens per item, as many as the encoder budget max(max_num_batched_tokens, tokens per item) holds
    (compute_mm_encoder_budget; 'profiled with N image items of the maximum feature size'). The image of most
    features is vision.MAX_PIXELS. From 0.11 a Qwen3-VL video counts 12.5 prompt tokens per vision token, so the
    video always wins: its dummy is derived (vision.qwen3_video_dummy, seq_len max_model_len). For Qwen2/2.5-VL a
    video's dummy takes the frames that fit max_model_len less one image (get_num_frames_with_most_features,
    temporal patches of 2 frames), so from 3 x the image's tokens on the video is larger; kvlab does not derive that
    one and says so. Gemma 4: gemma4_encoder_inputs."""
    if model.gemma4_video is not None:
        return gemma4_encoder_inputs(model.gemma4_video, config, weights_bytes)
    tower = model.vision_tower
    if tower is None:
        return None
    tp, batched = config.tensor_parallel_size, config.resolved_max_num_batched_tokens
    shared = dict(values_per_patch=tower.values_per_patch, out_width=tower.out_width, hidden_size=tower.hidden_size,
                  mlp_width_per_gpu=tower.mlp_width // tp, mlp_tensors=tower.mlp_tensors)
    max_len = config.max_model_len or model.max_position_embeddings
    if tower.model_type.startswith("qwen3") and qwen3_vl_profiles_video(config.vllm_version):
        video = qwen3_video_dummy(tower, max_len)
        if video.budget_tokens > tower.max_tokens_per_image:
            budget = max(batched, video.budget_tokens)
            return EncoderInputs(items=max(1, budget // video.budget_tokens), patches_per_item=video.patches,
                                 tokens_per_item=video.tokens, modality="video", budget_tokens=budget,
                                 frames=video.frames, side=video.side,
                                 cache_rows=encoder_cache_rows(config.vllm_version, budget, video.budget_tokens),
                                 **shared)
    tokens = tower.max_tokens_per_image
    budget = max(batched, tokens)
    return EncoderInputs(items=max(1, budget // tokens), patches_per_item=tower.max_patches, tokens_per_item=tokens,
                         budget_tokens=budget, side=tower.image_side, video_instead=max_len >= 3 * tokens,
                         cache_rows=encoder_cache_rows(config.vllm_version, budget, tokens), **shared)


def gemma4_encoder_inputs(video: Gemma4Video, config: SizingConfig, weights_bytes: int = 0) -> EncoderInputs:
    """Gemma 4's encoder profiling run (catalog/vision.py Gemma4Video): as many dummy videos as the encoder budget
    max(max_num_batched_tokens, 2,496 prompt tokens a video) holds, their frames' pixel_values padded to 630 patches;
    the tower is transformers' Gemma4VisionModel, whole on every GPU, with a gated MLP. From
    vllm_rules.GEMMA4_VISION_BATCHED_SINCE the frames go through it in chunks whose size gemma4_mm.py derives from the
    free memory (taken here as the GPU's total less ``weights_bytes``; the CUDA context is not subtracted, which
    matters only where the weights fill more than about 80% of the card; without a GPU size, one frame a call), before
    that one frame at a time.

    The position embeddings are counted as a lookup (transformers' Gemma4VisionPatchEmbedder after
    huggingface/transformers#46176, merged 2026-05-24); before it a one-hot of patches x 2 x position_embedding_size
    int64 values, and its cast, were alive at the tower's peak, which kvlab does not count (the transformers version
    is not vLLM's)."""
    budget = max(config.resolved_max_num_batched_tokens, video.prompt_tokens)
    items = max(1, budget // video.prompt_tokens)
    batched = gemma4_vision_batched(config.vllm_version)
    total = config.gpu_memory_bytes or 0
    chunk = min(items * video.frames, video.chunk_frames(max(0, total - weights_bytes), total)) if batched else 1
    return EncoderInputs(items=items, patches_per_item=video.patches, values_per_patch=video.values_per_patch,
                         tokens_per_item=video.soft_tokens, out_width=video.out_width, hidden_size=video.hidden_size,
                         mlp_width_per_gpu=video.mlp_width, mlp_tensors=3, modality="video", budget_tokens=budget,
                         frames=video.frames, chunk_frames=chunk, hidden_held=batched)


def load_buffer_bytes(model: ModelSpec, version: str | None, batched: int, act_bytes: int) -> tuple[int, str]:
    """(bytes, words) of the tensors vLLM ``version`` allocates on every GPU when it builds the model, beside its
    weights, with ``batched`` max_num_batched_tokens: the rotary embeddings' cos/sin caches (catalog/rope.py), Gemma
    4's per-layer-embedding staging buffer (catalog/vision.py PleStaging), and a Qwen-VL model's M-RoPE cache and
    Qwen3-VL's deepstack input buffers (catalog/vision.py LoadBuffers); (0, "") where there are none."""
    total, text = 0, ""
    if model.rope_caches:
        total = rope_bytes(model.rope_caches, act_bytes)
        shapes = " + ".join(c.text for c in model.rope_caches)
        plural = "s" if len(model.rope_caches) > 1 else ""
        text = f" + {total / GIB:.2f} GiB RoPE cos/sin cache{plural} ({shapes} x {act_bytes} B)"
    if model.ple_staging is not None:
        ple = model.ple_staging.bytes(batched, act_bytes)
        total += ple
        text += (f" + {ple / GIB:.2f} GiB per-layer-embedding staging buffer ({batched:,} batched tokens x "
                 f"{model.ple_staging.layers} layers x {model.ple_staging.width} x {act_bytes} B)")
    b = model.load_buffers
    if b is None:
        return total, text + (", allocated at load on every GPU" if text else "")
    factor = mrope_positions_factor(version, b.model_type)
    rope = b.rope_bytes(factor, act_bytes)
    text += f" + {rope / GIB:.2f} GiB M-RoPE cache ({b.max_positions:,} x {factor} positions x {b.rope_width} x {act_bytes} B)"
    deepstack = b.deepstack_bytes(batched, act_bytes)
    if deepstack:
        text += (f" + {deepstack / GIB:.2f} GiB deepstack buffers ({b.deepstack_levels} x {batched:,} batched tokens x "
                 f"{b.text_hidden:,} x {act_bytes} B)")
    return total + rope + deepstack, text + ", allocated at load on every GPU"


def requested_memory_bytes(config: SizingConfig) -> int | None:
    """total x gpu_memory_utilization, rounded up (v1/worker/utils.py request_memory)."""
    if config.gpu_memory_bytes is None:
        return None
    return math.ceil(config.gpu_memory_bytes * config.gpu_memory_utilization)


def stage_profiles(model: ModelSpec, config: SizingConfig, stages: list[range], act_bytes: int) -> list[MemoryProfile]:
    """vLLM's memory profile of one GPU of each pipeline stage (kvlab.memory_profile): total, requested, weights and
    the estimates of the terms vLLM measures; without a GPU size the total and requested terms are 0."""
    requested = requested_memory_bytes(config) or 0
    total = config.gpu_memory_bytes or 0
    version = resolve_version(config.vllm_version)
    rules = config.rules
    non_torch = non_torch_bytes(config.tensor_parallel_size, config.gpu_name)
    # is_device_capability_family(100): any 10.x part
    blackwell = int(compute_capability(config.gpu_name) or 0) == 10
    max_graph_size = rules.max_graph_size_blackwell if blackwell else 512
    buffers, buffers_source = load_buffer_bytes(model, config.vllm_version, config.resolved_max_num_batched_tokens,
                                                act_bytes)
    profiles = []
    for index, layers in enumerate(stages):
        first, last = index == 0, index == len(stages) - 1
        weights = model.weights_bytes_for(layers, dtype_bytes=act_bytes,
                                          tensor_parallel_size=config.tensor_parallel_size,
                                          first_stage=first, last_stage=last, quantization=config.quantization,
                                          expert_layout=expert_layout(
                                              model.weight_format_for(config.quantization),
                                              compute_capability(config.gpu_name), rules.mxfp4_hopper_layout),
                                          expert_parallel=config.enable_expert_parallel)
        drafter, drafter_source = drafter_weights_bytes(model, config, act_bytes) if last else (0, "")
        weights += drafter
        inputs = profile_inputs(model, config, act_bytes, len(layers), last, first, weights + buffers)
        profiles.append(MemoryProfile(
            total=Term("total", total, "GPU memory as CUDA reports it"),
            requested=Term("requested", requested, f"total x gpu_memory_utilization {config.gpu_memory_utilization}"),
            weights=Term("weights", weights + buffers,
                         model.weights_source(config.quantization) + drafter_source + buffers_source),
            activation=activation_bytes(inputs),
            non_torch=with_kept_runner_state(non_torch, inputs, rules.consumed_from_free_memory),
            cuda_graphs=cuda_graph_bytes(config.resolved_max_num_seqs, rules.cuda_graphs_deducted,
                                         config.enforce_eager, version, max_graph_size=max_graph_size,
                                         runner_estimates=runner_estimates_graphs(config.vllm_version,
                                                                                  inputs.model_runner))))
    return profiles


def drafter_weights_bytes(model: ModelSpec, config: SizingConfig, act_bytes: int) -> tuple[int, str]:
    """(bytes, words) of an MTP drafter's weights on one GPU of the last stage: its decoder layers, each the shape of
    the target's last full-attention layer in the checkpoint's format, its fc (eh_proj: 2 x hidden -> hidden, split
    over TP, counted in the model's dtype) and three norms. Its embedding and lm_head are the target's
    (llm_base_proposer._maybe_share_embeddings / _maybe_share_lm_head: 'Detected MTP model. Sharing ...')."""
    layers = speculative_layers(model, config)
    if not layers:
        return 0, ""
    tp, h = config.tensor_parallel_size, model.hidden_size
    full = max(i for i, t in enumerate(model.layer_types) if t == FULL_ATTENTION)
    layout = expert_layout(model.weight_format_for(config.quantization), compute_capability(config.gpu_name),
                           config.rules.mxfp4_hopper_layout)
    one = model.weights_bytes_for(range(full, full + 1), dtype_bytes=act_bytes, tensor_parallel_size=tp,
                                  first_stage=False, last_stage=False, quantization=config.quantization,
                                  expert_layout=layout, expert_parallel=config.enable_expert_parallel)
    total = layers * one + 2 * h * h // tp * act_bytes + 3 * h * act_bytes
    return total, (f" + {total / GIB:.2f} GiB MTP drafter ({layers} layer{'s' if layers > 1 else ''} like layer {full}, "
                   "fc 2 x hidden -> hidden, norms; embedding and lm_head shared with the target)")


def stage_budgets(model: ModelSpec, config: SizingConfig, stages: list[range],
                  act_bytes: int) -> list[tuple[int, int, int | None]]:
    """(weights, activation estimate, estimated KV budget) for one GPU of each pipeline stage.

    The budget is None without a GPU size; it may be zero or negative when the GPU is too small.
    """
    return [(p.weights.bytes, p.activation.bytes, None if config.gpu_memory_bytes is None else p.available_bytes)
            for p in stage_profiles(model, config, stages, act_bytes)]


BF16_MIN_CAPABILITY = 8.0  # vLLM's CUDA platform lists bfloat16 among its supported dtypes from compute capability 8.0
# vLLM's Fp8Config.get_min_capability (vllm/model_executor/layers/quantization/fp8.py): 80 in the two versions of
# the file read (commits 0071b24b and 1436674b, 2025); 75 at v0.30.0, after Marlin's FP8 kernels gained Turing
# (vLLM PR #29901, Dec 2025). The release that lowered it is not pinned down, so kvlab notes it rather than refuse.
FP8_MIN_CAPABILITY_OLDER, FP8_MIN_CAPABILITY_NEWER = 8.0, 7.5


# vLLM's _FLOAT16_NOT_SUPPORTED_MODELS (vllm/config/model.py): model types vLLM never runs in float16 ("Numerical
# instability. Please use bfloat16 or float32 instead."): --dtype auto leaves float16 out of their choices and an
# explicit float16 is refused (_check_valid_dtype).
FLOAT16_NOT_SUPPORTED_MODEL_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text", "plamo2", "glm4"})


def supported_dtypes(model: ModelSpec, gpu_name: str | None = None) -> list[str]:
    """The dtypes vLLM may serve this model in on this GPU, preferred first: its CUDA platform's supported_dtypes
    (bfloat16 only from compute capability 8.0) less float16 for the model types that refuse it."""
    capability = compute_capability(gpu_name)
    platform = ["float16", "float32"] if capability is not None and capability < BF16_MIN_CAPABILITY else [
        "bfloat16", "float16", "float32"]
    return [d for d in platform if not (d == "float16" and model.model_type in FLOAT16_NOT_SUPPORTED_MODEL_TYPES)]


def resolve_dtype(model: ModelSpec, dtype: str, gpu_name: str | None = None) -> str:
    """vLLM's --dtype (ModelConfig._resolve_auto_dtype and _check_valid_dtype, vllm/config/model.py). auto: the
    checkpoint's dtype, a float32 checkpoint served in the preferred dtype (bfloat16); a dtype the GPU or the model
    type does not support falls back to the preferred one ("Your device ... doesn't support torch.bfloat16. Falling
    back to ..."): float16 on a GPU below compute capability 8.0 (e.g. T4), float32 there for Gemma-2/3, PLaMo-2
    and GLM-4. An explicit float16 for those model types is refused, as vLLM refuses it; so is an explicit bfloat16 on
    a GPU below compute capability 8.0 (the worker's _check_if_gpu_supports_dtype: "Bfloat16 is only supported on
    GPUs with compute capability of at least 8.0")."""
    supported = supported_dtypes(model, gpu_name)
    if dtype == "auto":
        wanted = supported[0] if model.dtype == "float32" else model.dtype
        return wanted if wanted in supported else supported[0]
    resolved = resolve_alias(dtype)
    if resolved == "bfloat16" and "bfloat16" not in supported:
        raise KvlabError(f"--dtype {dtype}: {card_id(gpu_name)} has compute capability {compute_capability(gpu_name):g} "
                         f"and vLLM runs bfloat16 only from {BF16_MIN_CAPABILITY:.1f}; valid: "
                         f"{' or '.join(supported)} (or auto: {supported[0]} here)")
    if resolved == "float16" and model.model_type in FLOAT16_NOT_SUPPORTED_MODEL_TYPES:
        valid = [d for d in MODEL_DTYPES if resolve_alias(d) != "float16"]
        raise KvlabError(f"--dtype {dtype}: vLLM refuses float16 for model type {model.model_type!r} ({model.id}; "
                         f"numerical instability); valid: {', '.join(valid)}")
    return resolved


# The KV cache dtypes vLLM's CUDA attention backends store below compute capability 8.0 (T4, RTX 20xx, TITAN RTX),
# from vLLM 0.24.0 on. There FlashAttention (flash_attn.py: supports_compute_capability, >= 8.0) and FlashInfer
# (flashinfer.py: raised from 7.5 to 8.0, "currently broken on SM75", vllm-project/vllm#45375; the 0.24.0 release per
# issue #47549) are not valid, so backend selection (platforms/cuda.py get_valid_backends) leaves TRITON_ATTN (or
# TRITON_MLA for MLA), whose Impl.__init__ raises for any fp8* KV cache below 8.9 ("native FP8 (fp8e4nv) requires
# SM89+", vllm-project/vllm#43914) and for a bfloat16 one below 8.0 (triton_attn.py and mla/triton_mla.py, read in
# vLLM 0.32.0's source). FlexAttention, after Triton, takes only auto/float16/bfloat16. Before 0.24.0 FlashInfer ran
# on 7.5 and took fp8, fp8_e4m3 and fp8_e5m2, so kvlab refuses only from 0.24.0. An MLA model had only TRITON_MLA
# there before 0.24.0 too; the release that gave it the guard is not pinned down, so it is refused from 0.24.0 alike.
# A non-MLA bfloat16 KV cache below 8.0 before 0.24.0 is taken, not refused (trial 51, checked in vLLM's source): its only
# bf16-KV guards are Triton's (`kv_cache_dtype == "bfloat16" and not has_device_capability(80)`, triton_attn.py, #43914;
# triton_mla.py, #47060); FlashInfer, still valid on 7.5 then, lists "bfloat16" in its supported_kv_cache_dtypes with
# no such guard (in the 2026 copies of flashinfer.py read; 0.23.0's own tag was not to hand); and the platform's
# "Bfloat16 is only supported on GPUs with compute capability of at least 8.0" (platforms/cuda.py,
# check_if_supports_dtype) is called on the model dtype, not the cache's.
TRITON_ONLY_BELOW_CAPABILITY, TRITON_ONLY_SINCE = 8.0, "0.24.0"
TRITON_ONLY_KV_CACHE_DTYPES = ("auto", "float16")


def check_kv_cache_dtype(model: ModelSpec, config: SizingConfig) -> None:
    """Refuse a --kv-cache-dtype that vLLM's attention backend refuses on the GPU (TRITON_ONLY_KV_CACHE_DTYPES)."""
    capability = compute_capability(config.gpu_name)
    version = resolve_version(config.vllm_version)
    if (capability is None or capability >= TRITON_ONLY_BELOW_CAPABILITY
            or config.kv_cache_dtype in TRITON_ONLY_KV_CACHE_DTYPES
            or version_key(version) < version_key(TRITON_ONLY_SINCE)):
        return
    fp8 = config.kv_cache_dtype.startswith("fp8")
    backend = "Triton MLA" if model.is_mla else "Triton attention"
    # Its guard tests the prefix (`kv_cache_dtype.startswith("fp8")`, TritonAttentionImpl.__init__, vllm-project/vllm
    # #43914), so fp8_e5m2 is refused too, in the same words, though they name e4m3's Triton type (fp8e4nv).
    quoted = "\"native FP8 (fp8e4nv) requires SM89+\""
    if config.kv_cache_dtype == "fp8_e5m2":
        quoted = f"fp8_e5m2 included: its check refuses every fp8 dtype, though its message, {quoted}, names e4m3's Triton type"
    needs = (f"an fp8 KV cache only from compute capability 8.9 ({quoted})" if fp8
             else "a bfloat16 KV cache only from compute capability 8.0")
    before = (f" (vLLM before {TRITON_ONLY_SINCE} took fp8 there through FlashInfer)" if fp8 and not model.is_mla
              else "")
    raise KvlabError(f"--kv-cache-dtype {config.kv_cache_dtype}: on {card_id(config.gpu_name)} (compute capability "
                     f"{capability:g}) vLLM {version} has only its {backend} backend (its FlashAttention and "
                     f"FlashInfer ones need {TRITON_ONLY_BELOW_CAPABILITY:.1f} or more), which stores {needs}; valid "
                     f"here: {' or '.join(TRITON_ONLY_KV_CACHE_DTYPES)}{before}")


def check_dtypes(model: ModelSpec, config: SizingConfig) -> str:
    """The dtype vLLM serves ``model`` in on the config's GPU (resolve_dtype), once the GPU takes both it and the KV
    cache dtype: the refusals that no parallelism changes."""
    dtype = resolve_dtype(model, config.dtype, config.gpu_name)
    check_kv_cache_dtype(model, config)
    return dtype


def resolve_alias(dtype: str) -> str:
    """vLLM's names for the same dtype: half is float16, float is float32."""
    return {"half": "float16", "float": "float32"}.get(dtype, dtype)


def expert_parallel_note(model: ModelSpec, config: SizingConfig) -> str | None:
    """--enable-expert-parallel where it changes nothing: a model without routed experts, or one GPU."""
    if not config.enable_expert_parallel:
        return None
    if not model.is_moe:
        return f"--enable-expert-parallel changes nothing: {model.id} has no routed experts to deal out"
    if config.tensor_parallel_size == 1:
        return "--enable-expert-parallel changes nothing on one GPU: it holds every expert either way"
    return None


def quantization_note(model: ModelSpec, quantization: str | None) -> str | None:
    """A --quantization of none (or auto) on a quantized checkpoint, said in one line: vLLM does not refuse it, and
    does not unquantize either: ModelConfig._verify_quantization (vllm/config/model.py) reads the checkpoint's
    quantization_config whatever the argument, and with no method given takes the checkpoint's. ``quantization`` is
    the value as given, before SizingConfig normalises none and auto away."""
    from kvlab.catalog.quant import NOT_QUANTIZED

    own = model.weight_format
    if quantization is None or str(quantization).lower() not in NOT_QUANTIZED or own is None:
        return None
    return (f"--quantization {quantization}: {model.id} is a quantized checkpoint ({own.method}, its config.json's "
            f"quantization_config), and vLLM reads that whatever --quantization says, so it is served and sized in "
            f"{own.method}, not unquantized")


def gpu_notes(model: ModelSpec, config: SizingConfig) -> list[str]:
    """One line each on the catalogue GPU: a total that is only its marketing label, and what vLLM changes, or may
    refuse, because of its compute capability; first, a vLLM release older than the first to register the model's
    architecture (vllm_rules.architecture_note), whatever the GPU."""
    registered = architecture_note(config.vllm_version, model.architecture, model.model_type)
    return ([registered] if registered else []) + card_notes(model, config)


def card_notes(model: ModelSpec, config: SizingConfig) -> list[str]:
    """gpu_notes' lines on the catalogue GPU."""
    gpu = card_id(config.gpu_name)
    try:
        card = get_gpu(gpu) if gpu else None
    except KvlabError:
        card = None
    if card is None:
        return []
    notes = []
    warning = marketing_label_warning(card) if config.gpu_memory_bytes == card.memory_bytes else None
    if warning:
        notes.append(warning)
    capability = compute_capability(card.id)
    if capability is None:
        return notes
    served = resolve_dtype(model, config.dtype, card.id) if config.dtype == "auto" else None
    if served is not None and served != resolve_dtype(model, "auto"):
        notes.append(f"{card.id} (compute capability {capability:g}) has no bfloat16: vLLM serves the bfloat16 "
                     + ("checkpoint in float16 (2 bytes a value as well, so no number here changes)"
                        if served == "float16" else
                        f"checkpoint in {served}, as vLLM runs model type {model.model_type!r} in neither float16 "
                        f"nor bfloat16 here ({DTYPE_BYTES[served]} bytes a value: weights and KV cache double)"))
    fmt = model.weight_format_for(config.quantization)
    if fmt is not None and fmt.method == "fp8" and capability < FP8_MIN_CAPABILITY_OLDER:
        notes.append(f"fp8 weights need compute capability {FP8_MIN_CAPABILITY_OLDER:.1f} in older vLLM releases "
                     f"(Fp8Config.get_min_capability: start-up refuses {card.id}, {capability:g}) and "
                     f"{FP8_MIN_CAPABILITY_NEWER:.1f} in recent ones (weight-only FP8 through Marlin): check yours")
    return notes


@dataclass(frozen=True)
class SizingResult:
    """What vLLM would allocate and print, and where each number comes from (sizes per GPU)."""

    model_id: str
    gpu_name: str | None
    gpu_memory_bytes: int | None
    gpu_memory_utilization: float
    block_size: int
    dtype: str
    kv_cache_dtype: str
    kv_dtype_bytes: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_in_flight_tokens: int
    kv_bytes_per_token: int  # whole model, every layer, before any split
    kv_bytes_per_token_per_gpu: int  # the layers and KV heads one GPU holds
    page_size_bytes: int  # one layer, one block, one GPU
    num_layers_per_gpu: int
    num_kv_heads_per_gpu: int
    bytes_per_block: int  # page_size_bytes x layers of the widest group on the limiting GPU
    kv_cache_groups: tuple[KVCacheGroup, ...]
    num_params: int
    weights_bytes: int  # on the limiting GPU
    weights_bytes_total: int  # the whole model
    requested_memory_bytes: int | None  # gpu_memory_bytes x gpu_memory_utilization
    activation_bytes: int  # estimate
    non_torch_bytes: int  # estimate
    cuda_graph_bytes: int  # estimate
    available_kv_bytes: int
    available_kv_source: str  # "estimated" or "given"
    num_blocks: int
    blocks_per_request: int  # at max_model_len
    num_tokens: int
    max_concurrency: float
    estimated_max_model_len: int  # longest request one GPU's cache holds (vLLM's estimate_max_model_len)
    vllm_version: str = ""  # whose rules were applied (kvlab.vllm_rules)
    vllm_rules_since: str = ""  # the first release of those rules
    profile_terms: tuple[Term, ...] = ()  # the memory profile, term by term, with sources (limiting GPU)
    enforce_eager: bool = False
    quantization: str | None = None  # --quantization given (None: the checkpoint's own)
    decode_context_parallel_size: int = 1  # a request's tokens are spread over this many GPUs' caches
    enable_expert_parallel: bool = False  # routed experts dealt out whole (SizingConfig.enable_expert_parallel)
    sampler: str | None = None  # --sampler given (None: the version's default)
    model_runner: str | None = None  # --model-runner given (None: the one the version picks for the model)
    speculative_method: str | None = None  # the speculative config sized (SizingConfig.speculative_method)
    num_speculative_tokens: int = 0  # its draft tokens per step (0 without one)
    enable_prefix_caching: bool | None = None  # as given (None: vLLM's default); a hybrid's state blocks read it
    # a hybrid's: vLLM's mamba_cache_mode ('none', 'align') and why, in words (hybrid_cache_mode); "" otherwise
    mamba_cache_mode: str = ""
    mamba_cache_mode_why: str = ""
    drafter_layers: int = 0  # an MTP drafter's layers in the KV cache (speculative_layers), on the last stage
    drafter_weights: str = ""  # its weights on the last stage, in words (drafter_weights_bytes); "" without one
    # With pipeline stages: each stage's KV budget and blocks (one GPU of it), and which stage binds (the fewest
    # blocks: vLLM sizes every worker's cache with the smallest count, kv_cache_utils.get_kv_cache_configs); the terms
    # above are the binding stage's. Empty with one stage.
    stage_available_kv_bytes: tuple[int, ...] = ()
    stage_num_blocks: tuple[int, ...] = ()
    limiting_stage: int = 0

    @property
    def printed_available_kv_bytes(self) -> int:
        """The budget vLLM's 'Available KV cache memory' line prints: with pipeline stages the first stage's (in
        0.26.0's and 0.27.1's source only the worker of local rank 0, a first-stage worker, logs it: logger.info_once's
        'local' scope; the corpus's 0.9.2 build prints every worker's, the first stage's first), else the one budget."""
        return self.stage_available_kv_bytes[0] if self.stage_available_kv_bytes else self.available_kv_bytes

    @property
    def binding_stage_text(self) -> str:
        """With pipeline stages, in one line: which stage's GPU binds (its terms are the ones shown), the others' blocks,
        and whose budget vLLM prints; "" with one stage."""
        if not self.stage_num_blocks:
            return ""
        n, i = len(self.stage_num_blocks), self.limiting_stage
        others = ", ".join(f"stage {j + 1}: {blocks:,} blocks" for j, blocks in enumerate(self.stage_num_blocks) if j != i)
        text = (f"the fewest of the {n} pipeline stages: stage {i + 1}'s (the terms above are its; {others}); vLLM "
                "gives every stage this count")
        return text + (" and prints this stage's budget" if i == 0 else f" and prints stage 1's budget, "
                       f"{self.printed_available_kv_bytes / GIB:.2f} GiB, as 'Available KV cache memory'")

    @property
    def other_estimate_bytes(self) -> int:
        """kvlab's estimate of activation + non-torch + CUDA graph memory."""
        return self.activation_bytes + self.non_torch_bytes + self.cuda_graph_bytes

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes vLLM allocates for the cache: whole blocks only."""
        return self.num_blocks * self.bytes_per_block

    @property
    def num_usable_blocks(self) -> int:
        """Blocks requests can use: the block pool keeps one block back as the null block."""
        return max(0, self.num_blocks - 1)

    @property
    def num_pool_slots(self) -> int:
        """Token slots of the block pool as the simulator serves it. With one KV cache group, the blocks times the
        block size: what the block pool holds, whatever ``num_tokens`` (vLLM's "GPU KV cache size", whole
        max_model_len requests' worth) rounds away when max_model_len is not a multiple of the block size. With
        several (sliding-window layers beside full attention), a request takes blocks in each and the simulator's
        one pool stands for them: then vLLM's token figure."""
        if len(self.kv_cache_groups) == 1:
            return self.num_blocks * self.block_size
        return self.num_tokens

    @property
    def fits_max_model_len(self) -> bool:
        """Whether vLLM would start: one max_model_len request must fit in the usable blocks
        (kv_cache_utils._check_enough_kv_cache_memory)."""
        return self.blocks_per_request <= self.num_usable_blocks

    @property
    def memory_split(self) -> dict | None:
        """The GPU's memory by use (the paper's Figure 1): weights, KV cache, everything else."""
        if self.gpu_memory_bytes is None:
            return None
        other = self.gpu_memory_bytes - self.weights_bytes - self.kv_cache_bytes
        return {
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "weights_bytes": self.weights_bytes, "kv_cache_bytes": self.kv_cache_bytes, "other_bytes": other,
            "weights_share": self.weights_bytes / self.gpu_memory_bytes,
            "kv_cache_share": self.kv_cache_bytes / self.gpu_memory_bytes,
            "other_share": other / self.gpu_memory_bytes,
        }

    @property
    def vllm_log_lines(self) -> tuple[str, str, str]:
        """The three startup lines vLLM prints (gpu_worker.py, kv_cache_utils.update_kv_cache_capacity). The budget
        as gpu_worker.py's determine_available_memory formats it, "Available KV cache memory: %.2f GiB" (two
        decimals: 49 of the startup-log corpus's 50 such lines, 0.9.2 to 0.29.0, print '8.60 GiB'; the other is a
        blog post's copy, '21.5 GiB')."""
        return (f"Available KV cache memory: {self.printed_available_kv_bytes / GIB:.2f} GiB",
                f"GPU KV cache size: {self.num_tokens:,} tokens",
                f"Maximum concurrency for {self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x")

    def to_dict(self) -> dict:
        data = asdict(self)
        data["kv_cache_groups"] = [{"kind": g.spec.kind, "num_layers": len(g.layers),
                                    "sliding_window": g.spec.sliding_window, "page_size_bytes": g.spec.page_size_bytes,
                                    "layers": list(g.layers)} for g in self.kv_cache_groups]
        data.update(other_estimate_bytes=self.other_estimate_bytes, kv_cache_bytes=self.kv_cache_bytes,
                    num_usable_blocks=self.num_usable_blocks, fits_max_model_len=self.fits_max_model_len,
                    memory_split=self.memory_split, vllm_log_lines=list(self.vllm_log_lines))
        return data


def tensor_parallel_refusal(model: ModelSpec, tensor_parallel_size: int, expert_parallel: bool = False) -> str | None:
    """Why vLLM cannot split ``model`` over ``tensor_parallel_size`` GPUs, or None when it can. vLLM's checks:
    the attention heads divide evenly (ModelConfig.verify_with_parallel_config, vllm/config/model.py); each
    layer's KV heads divide evenly, or TP is a multiple of them and they are replicated (QKVParallelLinear's
    divide() calls, vllm/model_executor/layers/linear.py; MLA keeps one latent and is not split); a dense MLP's
    intermediate_size divides evenly (MergedColumnParallelLinear's assert, ColumnParallelLinear's divide(), same
    file); routed experts' width divides evenly too (FusedMoE.__init__'s `assert intermediate_size % self.tp_size
    == 0`, vllm/model_executor/layers/fused_moe/layer.py, in every version read; expert parallelism
    (``expert_parallel``) keeps each expert whole), and so does the shared experts' MLP (its count x the expert width,
    a dense MLP)."""
    tp = tensor_parallel_size
    if model.num_attention_heads % tp:
        return f"total number of attention heads ({model.num_attention_heads}) of {model.id} must be divisible by " \
            f"tensor parallel size ({tp})"
    if not model.is_mla:
        attention = (FULL_ATTENTION, SLIDING_ATTENTION)
        for heads in sorted({model.layer_num_kv_heads(i) for i, kind in enumerate(model.layer_types)
                             if kind in attention}):
            if heads % tp and tp % heads:
                return f"the {heads} KV heads of {model.id} can be neither split nor replicated evenly over tensor " \
                    f"parallel size ({tp}): vLLM needs {tp} to divide {heads} or be a multiple of it"
    dense_mlp = (not model.is_moe or (model.first_k_dense_replace or 0) > 0
                 or (model.gemma4 is not None and model.gemma4.enable_moe_block))
    if dense_mlp and model.intermediate_size % tp:
        return f"the MLP width (intermediate_size {model.intermediate_size}) of {model.id} must be divisible by " \
            f"tensor parallel size ({tp})"
    if model.is_moe:
        expert = model.moe_intermediate_size or model.intermediate_size
        routed = () if expert_parallel else (("expert", expert),)
        for what, width in (*routed, ("shared experts' MLP", (model.num_shared_experts or 0) * expert)):
            if width % tp:
                return f"the {what} width ({width}) of {model.id} must be divisible by tensor parallel size ({tp}): " \
                    "vLLM's FusedMoE splits each expert's intermediate_size over the TP ranks"
    return _block_refusal(model, tp, dense_mlp, expert_parallel)


def _block_refusal(model: ModelSpec, tp: int, dense_mlp: bool, expert_parallel: bool) -> str | None:
    """A block-quantized checkpoint (FP8's weight_block_size) keeps each block's output channels on one rank: each
    MLP's and expert's width per TP rank must be a multiple of the block's rows (vLLM's validate_fp8_block_shape for
    the linear layers, Fp8MoEMethod.create_weights for the experts, vllm/model_executor/layers/quantization/fp8.py
    and utils/fp8_utils.py; only when tp > 1)."""
    fmt = model.weight_format
    if fmt is None or tp == 1:
        return None
    expert = model.moe_intermediate_size or model.intermediate_size
    widths = [("mlp", "MLP width (intermediate_size", model.intermediate_size)] if dense_mlp else []
    if model.is_moe:
        widths += [] if expert_parallel else [("experts", "expert width (moe_intermediate_size", expert)]
        widths += [("mlp", "shared experts' MLP width (n_shared_experts x moe_intermediate_size",
                    (model.num_shared_experts or 0) * expert)]
    for part, what, width in widths:
        held = fmt.for_part(part)  # (None: that part is in the model dtype, unquantized)
        block = held.block_n if held is not None else None
        if block and width and (width // tp) % block:
            return (f"the {what} {width}) of {model.id} over tensor parallel size {tp} leaves {width // tp} output "
                    f"channels a rank, not a multiple of its FP8 weight blocks' {block} rows: vLLM refuses a split "
                    f"that cuts a block (\"not divisible by weight quantization block_n = {block}\")"
                    + ("" if part == "mlp" else "; --enable-expert-parallel keeps each expert whole on one GPU"))
    return None


def valid_tensor_parallel_sizes(model: ModelSpec, decode_context_parallel_size: int = 1,
                                expert_parallel: bool = False) -> list[int]:
    """TP sizes vLLM accepts for this model (tensor_parallel_refusal: at most its attention heads), and multiples of
    the DCP size (DCP groups are made of TP ranks)."""
    return [tp for tp in range(1, model.num_attention_heads + 1)
            if tp % decode_context_parallel_size == 0 and tensor_parallel_refusal(model, tp, expert_parallel) is None]


def dcp_limit(model: ModelSpec, tensor_parallel_size: int) -> int:
    """The largest --decode-context-parallel-size vLLM takes for ``model`` at ``tensor_parallel_size`` (GQA/MQA:
    tensor_parallel_size // KV heads, the copies of the KV heads that TP beyond their number makes; MLA, whose one
    latent every rank keeps: the TP size)."""
    if model.is_mla:
        return tensor_parallel_size
    return max(tensor_parallel_size // model.num_key_value_heads, 1)


def valid_decode_context_parallel_sizes(model: ModelSpec, expert_parallel: bool = False) -> list[int]:
    """The DCP sizes some tensor-parallel size vLLM accepts for ``model`` takes: a DCP size divides the TP size (DCP
    groups are made of TP ranks) and is at most dcp_limit there."""
    sizes = valid_tensor_parallel_sizes(model, expert_parallel=expert_parallel)
    return [dcp for dcp in range(1, sizes[-1] + 1)
            if any(tp % dcp == 0 and dcp <= dcp_limit(model, tp) for tp in sizes)]


def decode_context_parallel_refusal(model: ModelSpec, config: SizingConfig) -> str | None:
    """Why no tensor-parallel size vLLM accepts for ``model`` takes the config's DCP size (fit's search of the TP
    size has nowhere to go), naming the DCP sizes it can use; None when some TP size takes it."""
    dcp, ep = config.decode_context_parallel_size, config.enable_expert_parallel
    if dcp == 1:  # (no DCP: TP 1 always takes it)
        return None
    valid = valid_decode_context_parallel_sizes(model, ep)
    if dcp in valid:
        return None
    sizes = valid_tensor_parallel_sizes(model, expert_parallel=ep)
    multiples = [tp for tp in sizes if tp % dcp == 0]
    if not multiples:
        why = (f"DCP groups are made of TP ranks, and no tensor-parallel size vLLM accepts for {model.id} "
               f"({', '.join(map(str, sizes))}) is a multiple of {dcp}")
    else:
        heads, tp = model.num_key_value_heads, multiples[-1]
        why = (f"vLLM's DCP splits by token only the copies of {model.id}'s {heads} KV heads that tensor parallelism "
               f"beyond their number makes (at most tensor_parallel_size // {heads}), and even its largest "
               f"tensor-parallel size, {tp}, takes at most {dcp_limit(model, tp)}")
    return (f"-dcp {dcp}: {why}; valid -dcp for {model.id}: "
            f"{', '.join(map(str, valid))}")


def check_model_config(model: ModelSpec, config: SizingConfig) -> int:
    """Model-dependent checks vLLM makes at startup; returns the resolved max_model_len."""
    refusal = tensor_parallel_refusal(model, config.tensor_parallel_size, config.enable_expert_parallel)
    if refusal:
        sizes = ", ".join(map(str, valid_tensor_parallel_sizes(model, expert_parallel=config.enable_expert_parallel)))
        raise KvlabError(f"{refusal}; valid --tensor-parallel-size: {sizes}")
    dcp, tp, heads = config.decode_context_parallel_size, config.tensor_parallel_size, model.num_key_value_heads
    if dcp > dcp_limit(model, tp):
        # vLLM's ModelConfig.verify_with_parallel_config (GQA/MQA): DCP splits by token the KV heads that TP beyond
        # their number replicates, so it needs tp > KV heads and dcp <= tp // KV heads (docs/serving/
        # context_parallel_deployment.md: "dcp size is upper bounded by tp_size / H")
        most = tp // heads
        valid = ", ".join(str(d) for d in range(1, max(most, 1) + 1) if tp % d == 0) if most > 1 else "1 (no DCP)"
        raise KvlabError(f"-dcp {dcp}: {model.id}'s {heads} KV heads over tensor parallel "
                         f"size {tp} are {'replicated ' + str(most) + ' times' if most > 1 else 'not replicated'}, "
                         f"and vLLM's DCP splits only those copies by token (at most tensor_parallel_size // KV "
                         f"heads); valid -dcp here: {valid}")
    if config.pipeline_parallel_size > model.num_hidden_layers:
        raise KvlabError(f"--pipeline-parallel-size {config.pipeline_parallel_size} exceeds the "
                         f"{model.num_hidden_layers} layers of {model.id}; valid: 1 to {model.num_hidden_layers}")
    max_model_len = config.max_model_len or model.max_position_embeddings
    if max_model_len > model.max_position_embeddings:
        raise KvlabError(f"--max-model-len {max_model_len:,} is greater than {model.id}'s max_position_embeddings "
                         f"({model.max_position_embeddings:,}); vLLM refuses it (use at most "
                         f"{model.max_position_embeddings:,})")
    # The same refusals as `kvlab run`'s, from the one place that makes them (kvlab.config).
    check_block_size(config.block_size, max_model_len)
    SchedulerConfig(max_num_seqs=config.resolved_max_num_seqs,
                    max_num_batched_tokens=config.resolved_max_num_batched_tokens, max_model_len=max_model_len)
    return max_model_len


@dataclass(frozen=True)
class KVLayout:
    """The per-token and per-block numbers, which need no GPU size: dtypes, groups, pages, layers per GPU."""

    max_model_len: int
    dtype: str
    act_dtype_bytes: int
    kv_cache_dtype: str
    kv_dtype_bytes: int
    kv_cache_groups: tuple[KVCacheGroup, ...]
    stages: tuple[range, ...]
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int  # on the stage with the most layers
    page_size_bytes: int
    num_kv_heads_per_gpu: int
    weights_bytes: int  # the heaviest stage's GPU
    weights_bytes_total: int

    @property
    def num_layers_per_gpu(self) -> int:
        return max(len(stage) for stage in self.stages)


def kv_layout(model: ModelSpec, config: SizingConfig) -> KVLayout:
    """Everything about the KV cache's shape on one GPU that does not depend on the memory budget."""
    max_model_len = check_model_config(model, config)
    dtype = check_dtypes(model, config)
    act_bytes = DTYPE_BYTES[dtype]
    kv_dtype_bytes = KV_CACHE_DTYPES[config.kv_cache_dtype] or act_bytes
    tp = config.tensor_parallel_size
    groups = group_layers(layer_kv_specs(model, config, kv_dtype_bytes, act_bytes))
    stages = tuple(pipeline_stages(model.num_hidden_layers, config.pipeline_parallel_size))
    budgets = stage_budgets(model, config, list(stages), act_bytes)
    return KVLayout(
        max_model_len=max_model_len, dtype=dtype, act_dtype_bytes=act_bytes,
        kv_cache_dtype=dtype if config.kv_cache_dtype == "auto" else config.kv_cache_dtype,
        kv_dtype_bytes=kv_dtype_bytes, kv_cache_groups=groups, stages=stages,
        kv_bytes_per_token=model.kv_bytes_per_token(kv_dtype_bytes),
        kv_bytes_per_token_per_gpu=model.kv_bytes_per_token_per_gpu(kv_dtype_bytes, tp,
                                                                    max(len(s) for s in stages)),
        page_size_bytes=groups[0].spec.page_size_bytes, num_kv_heads_per_gpu=attention_group(groups).spec.num_kv_heads,
        weights_bytes=max(weights for weights, _, _ in budgets), weights_bytes_total=model.weights_bytes(act_bytes),
    )


def size_kv_cache(model: ModelSpec, config: SizingConfig) -> SizingResult:
    """The KV cache vLLM would allocate for ``model`` under ``config``, and the numbers it would print."""
    if config.gpu_memory_bytes is None and config.available_kv_bytes is None:
        raise KvlabError("give the GPU (gpu_memory_bytes) or the KV budget vLLM printed (available_kv_bytes)")
    layout = kv_layout(model, config)
    max_model_len, act_bytes, kv_dtype_bytes = layout.max_model_len, layout.act_dtype_bytes, layout.kv_dtype_bytes
    tp = config.tensor_parallel_size
    groups, page_size = layout.kv_cache_groups, layout.page_size_bytes
    stages = layout.stages
    profiles = stage_profiles(model, config, list(stages), act_bytes)
    requested = requested_memory_bytes(config)
    worst = None  # (num_blocks, stage index, available, bytes_per_block)
    budgets, blocks = [], []
    for index, (layers, profile) in enumerate(zip(stages, profiles)):
        weights = profile.weights.bytes
        if config.available_kv_bytes_by_stage is not None:
            available = config.available_kv_bytes_by_stage[index]
        elif config.available_kv_bytes is not None:
            _check_given_budget(model, config, weights)
            available = config.available_kv_bytes
        else:
            available = profile.available_bytes
            if available <= 0:
                raise_too_small(model, config, weights, requested, profile.other_bytes)
        layer_set = set(layers)
        if index == len(stages) - 1:  # the drafter's layers (speculative_layers) sit on the last stage
            layer_set |= set(range(len(model.layer_types), len(model.layer_types) + speculative_layers(model, config)))
        bytes_per_block = max(sum(i in layer_set for i in g.layers) for g in groups) * page_size
        num_blocks = available // bytes_per_block
        budgets.append(available)
        blocks.append(num_blocks)
        if worst is None or num_blocks < worst[0]:
            worst = (num_blocks, index, available, bytes_per_block)
    num_blocks, index, available, bytes_per_block = worst
    profile = profiles[index]

    in_flight = config.max_in_flight_tokens
    dcp = config.decode_context_parallel_size
    per_request = blocks_per_request(groups, max_model_len, in_flight, dcp)
    max_concurrency = num_blocks / per_request
    rules = config.rules
    num_tokens = printed_kv_tokens(rules, num_blocks, groups, per_request, max_model_len, dcp)
    mode, why = hybrid_cache_mode(model, config)
    return SizingResult(
        model_id=model.id, gpu_name=config.gpu_name, gpu_memory_bytes=config.gpu_memory_bytes,
        gpu_memory_utilization=config.gpu_memory_utilization, block_size=attention_group(groups).spec.block_size,
        dtype=layout.dtype,
        kv_cache_dtype=layout.kv_cache_dtype, kv_dtype_bytes=kv_dtype_bytes, tensor_parallel_size=tp,
        pipeline_parallel_size=config.pipeline_parallel_size, max_model_len=max_model_len,
        max_num_batched_tokens=config.resolved_max_num_batched_tokens, max_num_seqs=config.resolved_max_num_seqs,
        max_in_flight_tokens=in_flight,
        kv_bytes_per_token=layout.kv_bytes_per_token,
        kv_bytes_per_token_per_gpu=model.kv_bytes_per_token_per_gpu(kv_dtype_bytes, tp, len(stages[index])),
        page_size_bytes=page_size, num_layers_per_gpu=len(stages[index]),
        num_kv_heads_per_gpu=layout.num_kv_heads_per_gpu, bytes_per_block=bytes_per_block, kv_cache_groups=groups,
        num_params=model.num_params, weights_bytes=profile.weights.bytes,
        weights_bytes_total=layout.weights_bytes_total,
        requested_memory_bytes=requested, activation_bytes=profile.activation.bytes,
        non_torch_bytes=profile.non_torch.bytes, cuda_graph_bytes=profile.cuda_graphs.bytes,
        available_kv_bytes=available,
        available_kv_source="given" if config.available_kv_bytes is not None
        or config.available_kv_bytes_by_stage is not None else "estimated",
        num_blocks=num_blocks, blocks_per_request=per_request,
        num_tokens=num_tokens, max_concurrency=max_concurrency,
        vllm_version=resolve_version(config.vllm_version), vllm_rules_since=rules.since,
        profile_terms=profile.terms, enforce_eager=config.enforce_eager, quantization=config.quantization,
        sampler=config.sampler, model_runner=config.model_runner,
        estimated_max_model_len=_longest(groups, num_blocks - 1, 1, max_model_len, in_flight, dcp),
        decode_context_parallel_size=dcp, enable_expert_parallel=config.enable_expert_parallel,
        speculative_method=config.speculative_method, num_speculative_tokens=config.num_spec_tokens,
        enable_prefix_caching=config.enable_prefix_caching, drafter_layers=speculative_layers(model, config),
        mamba_cache_mode=mode, mamba_cache_mode_why=why,
        drafter_weights=drafter_weights_bytes(model, config, act_bytes)[1].removeprefix(" + "),
        stage_available_kv_bytes=tuple(budgets) if len(stages) > 1 else (),
        stage_num_blocks=tuple(blocks) if len(stages) > 1 else (), limiting_stage=index,
    )


def gpu_words(config: SizingConfig) -> str | None:
    """The GPU as an error names it: the catalogue card, and the --gpu-memory-gib that replaced its memory (as
    'A100-80GB with --gpu-memory-gib 20'), whichever face built the config."""
    if not config.gpu_name:
        return None
    name = card_id(config.gpu_name)
    try:
        catalogued = get_gpu(name).memory_bytes
    except KvlabError:
        return config.gpu_name
    if config.gpu_memory_bytes is None or config.gpu_memory_bytes == catalogued:
        return name
    return f"{name} with --gpu-memory-gib {config.gpu_memory_bytes / GIB:g}"


def _check_given_budget(model: ModelSpec, config: SizingConfig, weights: int) -> None:
    """A KV budget larger than the whole GPU less the weights cannot have been printed by vLLM."""
    if config.gpu_memory_bytes is None:
        return
    room = config.gpu_memory_bytes - weights
    if config.available_kv_bytes > room:
        gpu = gpu_words(config) or f"a {format_gib(config.gpu_memory_bytes)} GiB GPU"
        raise KvlabError(f"--available-kv-gib {config.available_kv_bytes / GIB:g} is more than {gpu} can hold for "
                         f"the KV cache of {model.id}: {format_gib(config.gpu_memory_bytes)} GiB of memory - "
                         f"{format_gib(weights)} GiB of weights = {format_gib(max(room, 0))} GiB; valid: at most "
                         f"{format_gib(max(room, 0))}, or no --gpu/--gpu-memory-gib to size the budget alone")


def _longest(groups, usable_blocks: int, num_requests: int, upper: int, in_flight: int, dcp: int = 1) -> int:
    """Largest L <= upper with num_requests x blocks_per_request(L) <= usable_blocks; 0 if none (binary search,
    as vLLM's estimate_max_model_len)."""
    def fits(length: int) -> bool:
        return num_requests * blocks_per_request(groups, length, in_flight, dcp) <= usable_blocks

    if not fits(1):
        return 0
    low, high = 1, upper
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def raise_too_small(model: ModelSpec, config: SizingConfig, weights: int, requested: int, other: int) -> None:
    """The GPU cannot hold the weights (or leaves nothing for the cache): say by how much and what would fit."""
    short = weights + other - requested
    gpu = gpu_words(config) or f"a {format_gib(config.gpu_memory_bytes)} GiB GPU"
    fmt = model.weight_format_for(config.quantization)
    held = fmt.method if fmt is not None else resolve_dtype(model, config.dtype, card_id(config.gpu_name))
    if weights > requested:
        head = (f"{model.id} does not fit on {gpu}: its weights ({held}) need {format_gib(weights)} GiB per GPU but "
                f"{format_gib(config.gpu_memory_bytes)} GiB x {config.gpu_memory_utilization} = "
                f"{format_gib(requested)} GiB is requested, {format_gib(short)} GiB short (with "
                f"{format_gib(other)} GiB estimated for activations and other memory)")
    else:
        head = (f"no memory left for the KV cache of {model.id} on {gpu}: weights {format_gib(weights)} GiB + "
                f"estimated activations and other {format_gib(other)} GiB exceed the requested "
                f"{format_gib(requested)} GiB by {format_gib(short)} GiB")
    hints = []
    # (tensor parallelism within a node only: beyond it `kvlab size` proposes pipeline stages, fewer GPUs or as many,
    # after the hints on as many GPUs as asked; trial 60, finding 9g: TP 128 came before a 72-GPU TP 8 x PP 9)
    node = node_gpus(config.gpu_name)
    for tp in valid_tensor_parallel_sizes(model, config.decode_context_parallel_size,
                                          expert_parallel=config.enable_expert_parallel):
        if tp <= config.tensor_parallel_size or tp > node:
            continue
        trial = replace(config, tensor_parallel_size=tp)
        if _weights_fit(model, trial):
            hints.append(_tensor_parallel_hint(model, trial))
            break
    bigger = _larger_gpus(model, config)
    if bigger:
        hints.append(f"a larger GPU at the same parallelism: {', '.join(bigger[:3])}")
    utilization = smallest_utilization(model, config)
    if utilization is not None:
        default = OPTIONS["gpu_memory_utilization"].default
        hints.append(f"--gpu-memory-utilization {utilization:.2f}" + (
            f" or more (the default {default:g} fits)" if utilization < default else ""))
    why = "".join(f" ({note})" for note in gpu_notes(model, config) if "weights and KV cache double" in note)
    largest = max(tp for tp in valid_tensor_parallel_sizes(model) if tp <= max(node, config.tensor_parallel_size))
    raise KvlabError(head + why + (". Would fit: " + "; ".join(hints) if hints else
                                   f". Nothing in the catalogue fits at this parallelism, nor at any tensor-parallel "
                                   f"size up to {largest} on this GPU (a node's {node} GPU{'s' * (node != 1)}); split the "
                                   "layers too (--pipeline-parallel-size) or quantize the weights (--quantization)"))


def _larger_gpus(model: ModelSpec, config: SizingConfig) -> list[str]:
    """The catalogue's GPUs larger than ``config``'s that hold the weights at its parallelism: those vLLM starts on
    (one max_model_len request fits, as `kvlab size` checks), then those it starts on only at a shorter
    max_model_len, named with that length (in vLLM's word, not the flag: the lab's endpoints pass the line on and cut
    advice that names a flag); the three smallest of each, in that order."""
    named = card_id(config.gpu_name)
    starts, shorter = [], []
    for g in sorted(list_gpus(), key=lambda g: g.memory_bytes):
        trial = replace(config, gpu_memory_bytes=g.memory_bytes, gpu_name=g.id, available_kv_bytes=None)
        if g.memory_bytes <= (config.gpu_memory_bytes or 0) or config.tensor_parallel_size > node_gpus(g.id) \
                or not _weights_fit(model, trial):  # (no GB10 at TP 8: one GPU a machine)
            continue
        name = g.id if g.id != named else f"{g.id} with its whole {format_gib(g.memory_bytes)} GiB"
        try:
            result = size_kv_cache(model, trial)
        except KvlabError:
            continue
        if result.fits_max_model_len:
            starts.append(name)
        elif result.estimated_max_model_len:
            shorter.append(f"{name} at a max_model_len of {result.estimated_max_model_len:,} or less")
    return (starts + shorter)[:3]


def smallest_utilization(model: ModelSpec, config: SizingConfig, most: int = 95) -> float | None:
    """The smallest --gpu-memory-utilization, in hundredths up to ``most``, above the one given, at which the
    weights and activations leave room for one max_model_len request's KV cache, so vLLM starts (the room grows
    with the fraction); None if none does."""
    def fits(hundredths: int) -> bool:
        trial = replace(config, gpu_memory_utilization=hundredths / 100)
        if not _weights_fit(model, trial):
            return False
        try:
            return size_kv_cache(model, trial).fits_max_model_len
        except KvlabError:
            return False

    lo = math.floor(config.gpu_memory_utilization * 100 + 1e-9) + 1
    if lo > most or config.gpu_memory_bytes is None or not fits(most):
        return None
    hi = most
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo / 100


def _tensor_parallel_hint(model: ModelSpec, config: SizingConfig) -> str:
    """The hint for a tensor-parallel size whose GPUs hold the weights: with the --max-model-len vLLM would then
    start with, where one max_model_len request does not fit (its own check refuses to start)."""
    hint = f"--tensor-parallel-size {config.tensor_parallel_size} on this GPU"
    try:
        result = size_kv_cache(model, config)
    except KvlabError:
        return hint
    if result.fits_max_model_len:
        return hint
    if not result.estimated_max_model_len:
        return hint + " holds the weights but no request's KV cache"
    return hint + f" with --max-model-len {result.estimated_max_model_len} (one {result.max_model_len:,}-token request " \
        f"needs {result.blocks_per_request:,} blocks, {result.num_usable_blocks:,} are usable there)"


def _weights_fit(model: ModelSpec, config: SizingConfig) -> bool:
    """Whether weights and the activation estimate leave a positive KV budget on every pipeline stage."""
    if model.num_attention_heads % config.tensor_parallel_size:
        return False
    stages = pipeline_stages(model.num_hidden_layers, config.pipeline_parallel_size)
    act_bytes = DTYPE_BYTES[resolve_dtype(model, config.dtype, config.gpu_name)]
    return all(available > 0 for _, _, available in stage_budgets(model, config, stages, act_bytes))


# --- reverse questions ----------------------------------------------------------------------------------

def max_context_len(model: ModelSpec, config: SizingConfig, num_requests: int = 1) -> int:
    """Longest context (tokens per request, up to the max_model_len vLLM runs with: --max-model-len where given,
    else max_position_embeddings; vLLM rejects a longer request) at which ``num_requests`` requests fit in the cache
    at once; 0 if not even one token each."""
    if num_requests < 1:
        raise KvlabError(f"number of concurrent requests must be at least 1, got {num_requests}")
    result = size_kv_cache(model, config)
    return _longest(result.kv_cache_groups, result.num_usable_blocks, num_requests, result.max_model_len,
                    result.max_in_flight_tokens, result.decode_context_parallel_size)


def max_num_requests(model: ModelSpec, config: SizingConfig, context_len: int) -> int:
    """Most requests of ``context_len`` tokens whose KV caches fit at once (whole blocks, null block excluded)."""
    result = size_kv_cache(model, config)
    check_context_len(model, result, context_len)
    per_request = blocks_per_request(result.kv_cache_groups, context_len, result.max_in_flight_tokens,
                                     result.decode_context_parallel_size)
    return result.num_usable_blocks // per_request


def check_context_len(model: ModelSpec, result: SizingResult, context_len: int) -> None:
    if context_len < 1:
        raise KvlabError(f"context length must be at least 1 token, got {context_len}")
    if context_len > result.max_model_len:
        most = model.max_position_embeddings  # (vLLM refuses a --max-model-len above it: raising cannot pass it)
        fix = (f"raise --max-model-len, up to {most:,}" if context_len <= most else
               f"no --max-model-len reaches it: {most:,}, the model's max_position_embeddings, is the most vLLM "
               f"takes; valid: a context length of at most {most:,}")
        raise KvlabError(f"context length {context_len:,} exceeds max_model_len {result.max_model_len:,} of "
                         f"{model.id}: vLLM rejects such requests ({fix})")


def on_gpu(config: SizingConfig, gpu: GpuSpec, tensor_parallel_size: int) -> SizingConfig:
    """``config`` on ``tensor_parallel_size`` of ``gpu``, its KV budget estimated (as vLLM would size it there)."""
    return replace(config, tensor_parallel_size=tensor_parallel_size, gpu_memory_bytes=gpu.memory_bytes,
                   gpu_name=gpu.id, available_kv_bytes=None)


def _starts(model: ModelSpec, config: SizingConfig) -> SizingResult | None:
    """The sizing, when vLLM would start with ``config``: the weights fit and one max_model_len request does."""
    try:
        result = size_kv_cache(model, config)
    except KvlabError:
        return None
    return result if result.fits_max_model_len else None


def settings_of(result: SizingResult) -> SizingConfig:
    """The settings ``result`` was sized with (its defaults resolved): to ask the reverse questions of a run's
    engine (kvlab.config's ``sizing``)."""
    return SizingConfig(
        gpu_memory_bytes=result.gpu_memory_bytes, gpu_memory_utilization=result.gpu_memory_utilization,
        block_size=result.block_size, dtype=result.dtype, kv_cache_dtype=result.kv_cache_dtype,
        tensor_parallel_size=result.tensor_parallel_size, pipeline_parallel_size=result.pipeline_parallel_size,
        max_model_len=result.max_model_len, max_num_batched_tokens=result.max_num_batched_tokens,
        max_num_seqs=result.max_num_seqs, gpu_name=result.gpu_name, vllm_version=result.vllm_version or None,
        enforce_eager=result.enforce_eager, quantization=result.quantization, sampler=result.sampler,
        model_runner=result.model_runner, decode_context_parallel_size=result.decode_context_parallel_size,
        enable_expert_parallel=result.enable_expert_parallel, speculative_method=result.speculative_method,
        num_speculative_tokens=result.num_speculative_tokens or 3, enable_prefix_caching=result.enable_prefix_caching,
        available_kv_bytes=result.available_kv_bytes if result.available_kv_source == "given" else None)


def fewest_gpus(model: ModelSpec, gpu: GpuSpec, config: SizingConfig) -> tuple[int, SizingResult]:
    """Smallest tensor-parallel size on ``gpu`` that holds the weights and one max_model_len request. A dtype the GPU
    refuses is refused first, in its own words: no tensor-parallel size would change it."""
    check_dtypes(model, on_gpu(config, gpu, config.tensor_parallel_size))
    refusal = decode_context_parallel_refusal(model, config)
    if refusal:
        raise KvlabError(refusal)
    sizes = valid_tensor_parallel_sizes(model, config.decode_context_parallel_size,
                                        expert_parallel=config.enable_expert_parallel)
    for tp in sizes:
        result = _starts(model, on_gpu(config, gpu, tp))
        if result is not None:
            return tp, result
    _raise_if_refused_everywhere(model, [on_gpu(config, gpu, tp) for tp in sizes])
    largest = valid_tensor_parallel_sizes(model, expert_parallel=config.enable_expert_parallel)[-1]
    why = (f"the most its {model.num_attention_heads} attention heads allow" if largest == model.num_attention_heads
           else "the largest tensor-parallel size vLLM accepts for it")
    if model.is_moe and not config.enable_expert_parallel:
        wider = valid_tensor_parallel_sizes(model, config.decode_context_parallel_size, expert_parallel=True)[-1]
        if wider > largest:
            why += f"; with --enable-expert-parallel, which keeps experts whole, up to {wider}"
    raise KvlabError(f"{model.id} does not fit on up to {largest} x {gpu.id} with tensor parallelism ({why}) with one "
                     f"{config.max_model_len or model.max_position_embeddings:,}-token request"
                     f"{_within_a_node(model, gpu, config, sizes)}lower --max-model-len or pick a larger GPU")


def _within_a_node(model: ModelSpec, gpu: GpuSpec, config: SizingConfig, sizes: list[int]) -> str:
    """What fewest_gpus' refusal proposes, tensor parallelism kept within a node as `kvlab size`'s refusal keeps it
    (node_gpus; trial 61: fit proposed --tensor-parallel-size 128 on T4s): the largest size within it that holds the
    weights (_tensor_parallel_hint), and the fewest GPUs with pipeline stages too (fewest_gpus_pipelined)."""
    node = node_gpus(gpu.id)
    inside = [tp for tp in sizes if tp <= node]
    widest = on_gpu(config, gpu, inside[-1]) if inside else None
    held = f"; {_tensor_parallel_hint(model, widest)}" if widest is not None and _weights_fit(model, widest) else ""
    piped = fewest_gpus_pipelined(model, gpu, config) if config.pipeline_parallel_size == 1 else None
    if piped is None:
        return f"{held}; add pipeline parallelism, "
    tp, pp, _ = piped
    return (f"{held}; with pipeline stages too, tensor parallelism within a node's {node} GPU{'s' * (node != 1)}: "
            f"--tensor-parallel-size {tp} --pipeline-parallel-size {pp} ({tp * pp} x {gpu.id}) hold it; or ")


# The catalogue has no node size: tensor parallelism is kept within 8 GPUs, the usual node (8 x H100/A100/L4 ...);
# more GPUs than that are pipeline stages, as vLLM deployments across nodes take them.
NODE_GPUS = 8
# The cards sold one to a machine (NVIDIA's DGX Spark: one GB10 superchip), whose tensor parallelism is therefore 1.
NODE_GPUS_BY_CARD = {"GB10": 1}


def node_gpus(gpu_name: str | None) -> int:
    """The GPUs of one node of ``gpu_name``'s (a catalogue id, or a --gpu-memory-gib label): NODE_GPUS unless the card
    comes one to a machine."""
    return NODE_GPUS_BY_CARD.get(card_id(gpu_name), NODE_GPUS)


def fewest_gpus_pipelined(model: ModelSpec, gpu: GpuSpec, config: SizingConfig,
                          node_gpus: int | None = None) -> tuple[int, int, SizingResult] | None:
    """The fewest GPUs (tensor x pipeline parallel) on ``gpu`` that hold the weights and one max_model_len request,
    tensor parallelism within ``node_gpus``; among equal counts, the fewest pipeline stages (the largest tensor-parallel
    size). None where none does (up to one stage per layer). Each tensor-parallel size's fewest stages by doubling, then
    bisection: more stages hold fewer layers per GPU, so where some count starts every larger one does."""
    best: tuple[int, int, SizingResult] | None = None
    node = NODE_GPUS_BY_CARD.get(gpu.id, NODE_GPUS) if node_gpus is None else node_gpus
    sizes = [tp for tp in valid_tensor_parallel_sizes(model, config.decode_context_parallel_size,
                                                      expert_parallel=config.enable_expert_parallel) if tp <= node]
    for tp in reversed(sizes):
        tried: dict[int, SizingResult | None] = {}

        def starts(pp: int, tp: int = tp, tried: dict = tried) -> SizingResult | None:
            if pp not in tried:
                tried[pp] = _starts(model, replace(on_gpu(config, gpu, tp), pipeline_parallel_size=pp))
            return tried[pp]

        # (the most stages worth trying: fewer GPUs than the best so far)
        most = model.num_hidden_layers if best is None else min(model.num_hidden_layers, (best[0] * best[1] - 1) // tp)
        if best is not None and (most < 1 or starts(most) is None):
            continue
        low, high = 1, 1
        while high < most and starts(high) is None:
            low, high = high + 1, min(2 * high, most)
        if starts(high) is None:  # (not even ``most`` stages)
            continue
        while low < high:  # (high starts)
            mid = (low + high) // 2
            low, high = (low, mid) if starts(mid) is not None else (mid + 1, high)
        found = starts(high)
        best = (tp, high, found) if found is not None else best
    return best


def _raise_if_refused_everywhere(model: ModelSpec, configs: list[SizingConfig]) -> None:
    """Where vLLM refuses every one of ``configs`` before it sizes memory (kv_layout's checks: a --block-size larger
    than --max-model-len, too many pipeline stages, ...), no number of GPUs helps: raise the first refusal, in the
    words `kvlab size` gives it."""
    refusals = []
    for config in configs:
        try:
            kv_layout(model, config)
        except KvlabError as exc:
            refusals.append(exc)
        else:
            return
    if refusals:
        raise refusals[0]


@dataclass(frozen=True)
class FitSizing:
    """The configuration `kvlab fit` answers at, one vLLM starts with, and how it was reached (``notes``)."""

    config: SizingConfig
    result: SizingResult
    fewest: tuple[int, SizingResult] | None  # fewest_gpus on the GPU asked about, where there is one and it holds
    notes: tuple[str, ...]


def fit_sizing(model: ModelSpec, config: SizingConfig, gpu: GpuSpec | None, tensor_parallel_given: bool,
               context_len: int | None = None) -> FitSizing:
    """Where `kvlab fit`'s answers are sized: never at a configuration vLLM refuses to start. The asked one (the
    start of the search, TP 1 or the DCP size, when ``tensor_parallel_given`` is False); where it does not start at
    all (weights, or a DCP the KV heads refuse), the fewest GPUs that hold the model;
    where one max_model_len request does not fit, the longest --max-model-len that does (unless --max-model-len was
    given, or it is shorter than ``context_len``), else the fewest GPUs that hold one (unless TP was given). Where
    the settings given leave nothing vLLM starts with, one line naming them and what is valid."""
    refusal = None if tensor_parallel_given else decode_context_parallel_refusal(model, config)
    if refusal:  # (no TP size the search could reach takes this DCP size)
        raise KvlabError(refusal)
    registered = architecture_note(config.vllm_version, model.architecture, model.model_type)
    notes: list[str] = [registered] if registered else []
    fewest = None
    if gpu is not None:
        try:
            fewest = fewest_gpus(model, gpu, config)
        except KvlabError as exc:
            notes.append(str(exc))
    try:
        result = size_kv_cache(model, config)
    except KvlabError:
        if tensor_parallel_given or (fewest is None and not notes):
            raise
        if fewest is None:  # (fit's own question has no answer either: say why, not the size's)
            raise KvlabError(notes[-1]) from None
        # The weights do not fit one GPU: answer the other questions at the fewest GPUs that hold the model.
        config = replace(config, tensor_parallel_size=fewest[0])
        notes.append(f"the other answers use --tensor-parallel-size {fewest[0]}, the fewest at which vLLM starts")
        result = size_kv_cache(model, config)
    if result.fits_max_model_len:
        return FitSizing(config, result, fewest, tuple(notes))
    return _fit_where_vllm_starts(model, config, result, fewest, notes, tensor_parallel_given, context_len)


def _fit_where_vllm_starts(model: ModelSpec, config: SizingConfig, result: SizingResult,
                           fewest: tuple[int, SizingResult] | None, notes: list[str], tensor_parallel_given: bool,
                           context_len: int | None) -> FitSizing:
    """fit_sizing where one max_model_len request does not fit ``config``'s cache (vLLM refuses to start)."""
    longest, tp = result.estimated_max_model_len, config.tensor_parallel_size
    budget = config.available_kv_bytes is not None or not config.gpu_name
    where = (f"the KV budget of {format_gib(result.available_kv_bytes)} GiB at --tensor-parallel-size {tp}" if budget
             else f"{tp} x {gpu_words(config)}")
    why = (f"one {result.max_model_len:,}-token request needs {result.blocks_per_request:,} blocks but {where} has "
           f"{result.num_usable_blocks:,} usable, so vLLM would refuse to start")
    if config.max_model_len is None and longest >= (context_len or 1):
        lowered = replace(config, max_model_len=longest)
        sized = _starts(model, lowered)  # (None where vLLM refuses that length too: a block larger than it)
        if sized is not None:
            notes.append(f"{why}: the answers use --max-model-len {longest}, the longest at which it starts")
            return FitSizing(lowered, sized, fewest, tuple(notes))
    # (the fewest GPUs, sized again with the settings given: a budget given is each GPU's whatever the count)
    wider = replace(config, tensor_parallel_size=fewest[0]) if fewest is not None and fewest[0] != tp else None
    wider_sized = _starts(model, wider) if wider is not None else None
    if not tensor_parallel_given and wider is not None and wider_sized is not None:
        notes.append(f"{why}: the answers use --tensor-parallel-size {wider.tensor_parallel_size}, the fewest GPUs "
                     "that hold one")
        return FitSizing(wider, wider_sized, fewest, tuple(notes))
    given = (f"--max-model-len {result.max_model_len:,}" if config.max_model_len is not None else
             f"max_model_len {result.max_model_len:,} (the model's max_position_embeddings)")
    valid = [f"--max-model-len {longest} or less" if longest >= (context_len or 1) else None,
             f"--tensor-parallel-size {wider.tensor_parallel_size} (the fewest GPUs that hold one)"
             if wider is not None and wider_sized is not None else None]
    shown = [v for v in valid if v] or [("a larger --available-kv-gib" if config.available_kv_bytes is not None
                                         else "more GPUs, a larger one, or a smaller model")]
    short = (f" (the longest request that fits is {longest:,} tokens, shorter than --context-len {context_len:,})"
             if context_len and longest < context_len else "")
    raise KvlabError(f"{given}: {why}; valid: {', or '.join(shown)}{short}")


@dataclass(frozen=True)
class WorkloadFit:
    """Whether ``num_requests`` conversations of ``context_len`` tokens fit in the KV cache at once (per GPU)."""

    num_requests: int
    context_len: int
    blocks_per_request: int
    num_blocks_needed: int
    num_usable_blocks: int
    bytes_per_block: int
    max_num_requests: int  # at context_len
    max_context_len: int  # at num_requests

    @property
    def fits(self) -> bool:
        return self.num_blocks_needed <= self.num_usable_blocks

    @property
    def kv_bytes_needed(self) -> int:
        return self.num_blocks_needed * self.bytes_per_block

    @property
    def kv_bytes_usable(self) -> int:
        return self.num_usable_blocks * self.bytes_per_block

    @property
    def spare_blocks(self) -> int:
        """Blocks left over (negative: blocks missing)."""
        return self.num_usable_blocks - self.num_blocks_needed

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(fits=self.fits, kv_bytes_needed=self.kv_bytes_needed, kv_bytes_usable=self.kv_bytes_usable,
                    spare_blocks=self.spare_blocks, spare_bytes=self.spare_blocks * self.bytes_per_block)
        return data


def workload_fit(model: ModelSpec, config: SizingConfig, num_requests: int, context_len: int) -> WorkloadFit:
    """How much KV cache ``num_requests`` requests of ``context_len`` tokens need, and whether it is there."""
    if num_requests < 1:
        raise KvlabError(f"concurrency must be at least 1 request, got {num_requests}")
    result = size_kv_cache(model, config)
    check_context_len(model, result, context_len)
    groups, in_flight = result.kv_cache_groups, result.max_in_flight_tokens
    dcp = result.decode_context_parallel_size
    per_request = blocks_per_request(groups, context_len, in_flight, dcp)
    return WorkloadFit(
        num_requests=num_requests, context_len=context_len, blocks_per_request=per_request,
        num_blocks_needed=num_requests * per_request, num_usable_blocks=result.num_usable_blocks,
        bytes_per_block=result.bytes_per_block, max_num_requests=result.num_usable_blocks // per_request,
        max_context_len=_longest(groups, result.num_usable_blocks, num_requests, result.max_model_len, in_flight, dcp),
    )


@dataclass(frozen=True)
class WorkloadReplicas:
    """Replicas of one engine (each ``tensor_parallel_size`` × ``pipeline_parallel_size`` GPUs) whose KV caches hold
    ``num_requests`` requests of ``context_len`` tokens at once, each replica at most ``max_num_requests`` of them:
    what memory alone needs, whatever the rate."""

    num_requests: int
    context_len: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_num_requests: int  # per replica, at context_len (WorkloadFit.max_num_requests)
    num_replicas: int  # ceil(num_requests / max_num_requests)

    @property
    def num_gpus_per_replica(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def num_gpus(self) -> int:
        return self.num_replicas * self.num_gpus_per_replica

    def to_dict(self) -> dict:
        return {**asdict(self), "num_gpus_per_replica": self.num_gpus_per_replica, "num_gpus": self.num_gpus}


def workload_replicas(model: ModelSpec, config: SizingConfig, num_requests: int, context_len: int,
                      gpu: GpuSpec | None = None) -> list[WorkloadReplicas]:
    """For ``num_requests`` requests of ``context_len`` tokens at once: the replicas each tensor-parallel size
    needs (workload_fit's max_num_requests per replica). Without ``gpu``, only ``config``'s (a given KV budget);
    with it, every size vLLM allows that starts on ``gpu`` (as fewest_gpus tries them), smallest first, up to the
    first whose one replica has as many GPUs as the fewest found so far (no larger size can need fewer)."""
    if gpu is None:
        trials = [config]
    else:
        trials = [on_gpu(config, gpu, tp) for tp in valid_tensor_parallel_sizes(
            model, config.decode_context_parallel_size, expert_parallel=config.enable_expert_parallel)]
    options: list[WorkloadReplicas] = []
    for trial in trials:
        if options and trial.world_size >= min(o.num_gpus for o in options):
            break
        if gpu is not None and _starts(model, trial) is None:
            continue
        most = workload_fit(model, trial, num_requests, context_len).max_num_requests
        if most:
            options.append(WorkloadReplicas(num_requests, context_len, trial.tensor_parallel_size,
                                            trial.pipeline_parallel_size, most, cdiv(num_requests, most)))
    return options


def fewest_gpus_for_workload(options: list[WorkloadReplicas]) -> WorkloadReplicas | None:
    """The option with the fewest GPUs (among equals, the smallest tensor-parallel size); None if none holds one
    request of the length."""
    return min(options, key=lambda o: (o.num_gpus, o.tensor_parallel_size), default=None)

"""Which vLLM version's rules a sizing follows: what changed in the startup arithmetic from one release to the next.

Each ``VllmRules`` applies from its ``since`` release until the next one's. A version is matched to the newest rules
at or below it; versions before the V1 engine's sizing (0.9.0) or after the newest kvlab knows are refused, because
their arithmetic is not modelled. docs/sizing.md lists the epochs and the evidence for each boundary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvlab.errors import KvlabError

# The newest release kvlab's rules were checked against (kvlab's own vLLM environment, kvlab/vllm/install.py).
NEWEST_KNOWN = "0.32.0"


@dataclass(frozen=True)
class VllmRules:
    """The startup arithmetic of the releases from ``since`` on.

    ``tokens_line``: how "GPU KV cache size: N tokens" is computed. ``"blocks"``: num_blocks // number of KV cache
    groups x the (smallest) attention block size (kv_cache_utils._report_kv_cache_config up to 0.20);
    ``"capacity"``: int(max concurrency x max_model_len) (kv_cache_utils.get_kv_cache_capacity).
    ``cuda_graphs_deducted``: the estimated CUDA-graph memory is subtracted from the KV budget before the cache is
    allocated (gpu_worker.determine_available_memory with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on by default).
    ``sliding_in_flight_batches``: batches whose tokens a sliding-window layer keeps beyond its window when vLLM
    counts a request's blocks: 1 (max_num_batched_tokens, SlidingWindowSpec.max_memory_usage_bytes) or "pp+1"
    (async scheduling keeps (PP + 1) batches in flight, VllmConfig's max in-flight tokens).
    """

    since: str
    tokens_line: str
    cuda_graphs_deducted: bool
    sliding_in_flight: str  # "one_batch" | "pp_plus_one"
    # How vLLM lays out MXFP4 experts from compute capability 9.0: "marlin" or "triton" (their bytes:
    # kvlab.catalog.quant.mxfp4_layer_bytes); before 9.0 Marlin's throughout (quant.expert_layout).
    mxfp4_hopper_layout: str
    # The top-k/top-p sampler assumed when the log does not say (--sampler): "pytorch" where pip installs of these
    # releases came without FlashInfer, "flashinfer" where it ships with vLLM.
    default_sampler: str
    changes: str
    # The largest batch vLLM captures a CUDA graph for when --max-cudagraph-capture-size is not given, on compute
    # capability 10.x (B200, B300) and elsewhere (VllmConfig._set_cudagraph_sizes: min(2 x max_num_seqs, this)).
    max_graph_size_blackwell: int = 512
    # What is left besides the cache is measured as the fall in free memory from the worker's first snapshot to after
    # profiling (mem_utils.memory_profiling's total_consumed, printed as 'consumed memory (weights + non-torch)'),
    # so tensors the worker allocates after that snapshot and keeps count; before, it was weights + the torch peak
    # increase of the profiling run + the non-torch increase, and such tensors were in none of those terms.
    consumed_from_free_memory: bool = False

    @property
    def key(self) -> tuple[int, int, int]:
        return version_key(self.since)


RULES = (
    VllmRules("0.9.0", "blocks", False, "one_batch", "marlin", "pytorch",
              "V1 engine sizing: available = requested - (weights + torch peak increase + non-torch increase); "
              "CUDA graphs captured after the cache is allocated, not deducted; hybrid models' tokens printed as "
              "num_blocks // groups x block_size; MXFP4 experts in Marlin's layout on every GPU: 0.10.1 takes "
              "Marlin on Hopper too, its torch 2.7.1 being older than the 2.8.0 the triton_kernels path needs "
              "(quantization/mxfp4.py _should_use_marlin, requirements/cuda.txt; the H100 log prints "
              "marlin_utils_fp4's warning) (gpt-oss-120b: 65.90 GiB against 65.97 printed on H100 with 0.10.1)"),
    VllmRules("0.14.0", "blocks", False, "one_batch", "triton", "flashinfer",
              "MXFP4 experts on Hopper in triton_kernels' layout (0.14.1's get_mxfp4_backend with torch 2.9.1 and "
              "triton_kernels built in; its H100 log prints 'Using Triton backend'): width padded to 64, float32 "
              "biases, the scales held twice, loaded and swizzled (gpt-oss-120b on H100 with 0.14.1: 64.30 GiB "
              "against 64.38 printed); kvlab puts the change at 0.14.0 (0.11 and 0.13 "
              "logs in the corpus print no weights). FlashInfer's sampler assumed where the log names none (the "
              "0.15.1 log of Llama-3.1-8B measures what it takes; the 0.11.2 log of Qwen3-0.6B what PyTorch's "
              "does)"),
    VllmRules("0.21.0", "capacity", True, "one_batch", "triton", "flashinfer",
              "CUDA-graph memory profiled and deducted by default (the log says 'default since v0.21.0'); tokens "
              "printed as int(max concurrency x max_model_len) (seen in 0.24, not yet in 0.20.1: kvlab puts the "
              "change here; 0.20.0's source archive already defaults VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS to 1 "
              "and 0.20.1's prints the capacity, docs/sizing.md); sliding windows still counted with one batch "
              "(SlidingWindowSpec.max_memory_usage_bytes reads max_num_batched_tokens in 0.21.0, 0.22.0, 0.24.0 "
              "and 0.25.0)"),
    VllmRules("0.26.0", "capacity", True, "pp_plus_one", "triton", "flashinfer",
              "sliding windows counted with the (PP + 1) batches async scheduling keeps in flight "
              "(SlidingWindowSpec.max_memory_usage_bytes reads VllmConfig.max_in_flight_tokens in 0.26.0's, "
              "0.27.0's, 0.29.0's and 0.32.0's source archives, max_num_batched_tokens in 0.25.0's)"),
    VllmRules("0.27.0", "capacity", True, "pp_plus_one", "triton", "flashinfer",
              "memory other than the cache measured as the fall in free memory since the worker's first snapshot "
              "(utils/mem_utils.py memory_profiling's total_consumed, absent from 0.26.0's source, present in 0.27.0's "
              "and 0.28.0's): tensors allocated after that snapshot and kept count, Model Runner V2's penalty state "
              "among them (memory_profile.with_kept_runner_state)",
              consumed_from_free_memory=True),
    VllmRules("0.32.0", "capacity", True, "pp_plus_one", "triton", "flashinfer",
              "CUDA graphs captured up to 1,024 tokens by default on compute capability 10.x (B200: 83 piecewise + 83 "
              "full graphs at 1,024 sequences, against 51 + 51), 512 elsewhere (config/vllm.py _set_cudagraph_sizes, "
              "read in 0.32.0's source; the corpus has no Blackwell log to place the change earlier)",
              max_graph_size_blackwell=1024, consumed_from_free_memory=True),
)


# vLLM's default --gpu-memory-utilization (CacheConfig.gpu_memory_utilization, which EngineArgs and LLM take): 0.9
# up to 0.19.1, 0.92 from 0.20.0 (read in the source archives on PyPI: 0.18.0's, 0.19.0's and 0.19.1's
# vllm/config/cache.py say 0.9; 0.20.0's, 0.21.0's, 0.22.0's, 0.23.0's, 0.24.0's, 0.25.0's and 0.32.0's say 0.92, as
# does 0.20.0's LLM(...) signature). The corpus agrees: 0.26.0 and 0.27.1 logs with none set print "(0.92, ...)".
# The startup-log benchmark sizes a log whose utilization is not recorded at its version's default; kvlab's own faces
# still take 0.9 unless told (OPTIONS' default: moving it moves every default pool, docs/sizing.md Defaults).
GPU_MEMORY_UTILIZATION_DEFAULTS = (("0.9.0", 0.9), ("0.20.0", 0.92))


def default_gpu_memory_utilization(version: str | None) -> float:
    """The share of GPU memory vLLM ``version`` (None: the newest kvlab knows) may use when none is given."""
    key = version_key(resolve_version(version))
    return [share for since, share in GPU_MEMORY_UTILIZATION_DEFAULTS if version_key(since) <= key][-1]


# A model-specific rule that changes inside an epoch: from 0.11 (vllm-project/vllm#25648) vLLM counts a Qwen3-VL video
# item as 12.5 prompt tokens per vision token, so its encoder is profiled on a dummy video, not the image
# (catalog/vision.py qwen3_video_dummy; the 0.11.0 corpus log prints the budget this gives). Where it stops is unknown.
QWEN3_VL_VIDEO_PROFILING_SINCE = "0.11.0"

# Where the encoder cache held an item's scattered embeddings (its whole placeholder, markers and timestamps included)
# rather than the encoder's output, vLLM's profile_run widened each dummy output to that length with new_zeros before
# keeping it through the text dummy run (gpu_model_runner.profile_run, vllm-project/vllm#25810, in 0.11.0: its
# 'expanded = output.new_zeros(' line is in 0.11.0 tracebacks). 0.11 widens every item to the whole encoder budget;
# #29386 ('Fix overallocation in MM profiling') to the item's own length, which kvlab places at 0.12.0; #30475
# (merged 2025-12-11, between 0.12.0 and 0.13.0) makes the cache hold the outputs only, so kvlab ends the rule at
# 0.13.0 (0.32.0's profile_run keeps the outputs as they are). The corpus has no 0.12 log to check either boundary.
ENCODER_CACHE_SCATTERED = ("0.11.0", "0.13.0")
ENCODER_CACHE_ITEM_LENGTH_SINCE = "0.12.0"


# Which GPU model runner vLLM picks when VLLM_USE_V2_MODEL_RUNNER is unset (VllmConfig.use_v2_model_runner; 1 forces
# Model Runner V2, vllm/v1/worker/gpu/, and 0 the V1 runner, gpu_model_runner.py). The two profile the sampler
# differently (memory_profile.with_sampler): V1's dummy sampler run applies top-k and top-p to max_num_seqs rows of
# logits, V2's runs its sampler over the same rows with no sampling parameter set: a Gumbel-max sample of the logits,
# copied to float32 first only up to 0.25 (memory_profile.v2_sampler_run_bytes).


@dataclass(frozen=True)
class RunnerEpoch:
    """Which models vLLM runs on Model Runner V2 by default from release ``since`` on (config/vllm.py's oracle,
    _is_default_v2_model_runner_model): the architectures of DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES, every model that
    is neither MoE nor hybrid (``dense``), or every model (``every``); ``quantized``: quantized checkpoints too."""

    since: str
    architectures: tuple[str, ...]
    dense: bool
    quantized: bool
    every: bool = False


MODEL_RUNNER_EPOCHS = (
    # Qwen3 dense models, unquantized (vllm-project/vllm#39337, the 0.22.0 release notes)
    RunnerEpoch("0.22.0", ("Qwen3ForCausalLM",), dense=False, quantized=False),
    # + Llama and Mistral dense models (#43458, 0.23.0's notes)
    RunnerEpoch("0.23.0", ("Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"), dense=False, quantized=False),
    # + DeepSeek-V2 and Qwen2-MoE (#42667, held out of 0.23.0 in its review) and quantized models (0.25.0's notes:
    # "building on quantized-model support from the previous release")
    RunnerEpoch("0.24.0", ("Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM", "DeepseekV2ForCausalLM",
                           "Qwen2MoeForCausalLM"), dense=False, quantized=True),
    # every model that is neither MoE nor hybrid, with the MoE architectures above (#44443, 0.25.0's notes)
    RunnerEpoch("0.25.0", ("DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM"), dense=True, quantized=True),
    # every model (#53183, approved on 2026-08-26, after 0.28.0's release; a summary of 0.29.0's notes: "MRV2 is now
    # the default runner for all models"; one plugin's comment says 0.30, kvlab follows the notes)
    RunnerEpoch("0.29.0", (), dense=True, quantized=True, every=True),
)
MODEL_RUNNERS = ("v1", "v2")
# The first release that ships Model Runner V2 at all (vllm/v1/worker/gpu/, vllm-project/vllm#25266, opt-in through
# VLLM_USE_V2_MODEL_RUNNER=1; vllm-ascend's MRV2 framework was built against v0.12.0): --model-runner v2 with an
# older --vllm-version names a runner that release did not have. It is the default only from the epochs above.
MODEL_RUNNER_V2_SINCE = "0.12.0"


# Model Runner V2's CUDA-graph estimate: up to 0.28 its profile_cudagraph_memory returns 0 ('NOTE(woosuk): It is TBD
# whether we keep this API or not', read in 0.22.0's, 0.25.0's, 0.26.0's, 0.27.1's and 0.28.0's source archives), so
# gpu_worker.determine_available_memory deducts nothing for the graphs of a model V2 runs and prints 0 in its peak
# activation; 0.29.0's captures the graphs into a throwaway pool and measures them (v1/worker/gpu/cudagraph_utils.py
# profile_cudagraph_memory), as the V1 runner's does. The corpus's 0.27.1 logs on V2 print 0.0 GiB for the estimate.
MODEL_RUNNER_V2_GRAPH_ESTIMATE_SINCE = "0.29.0"


# Where a pipeline stage's memory holds tensors the runner allocates after the worker's first snapshot and keeps
# (read in 0.22.0's, 0.26.0's, 0.27.1's and 0.32.0's source archives):
# - a non-first stage's intermediate-tensor buffer (hidden_states and residual for max_num_batched_tokens tokens,
#   make_empty_intermediate_tensors): the V1 runner allocates it in its first dummy run, inside the profiling run
#   (gpu_model_runner._dummy_run), so vLLM counts it in every release, in the torch peak increase before the rules of
#   0.27.0 and in 'consumed memory' from them; Model Runner V2 allocates it in load_model, after 'Model loading took'
#   is measured and before profiling, so only the fall in free memory of 0.27.0's rules counts it;
# - the last stage's Model Runner V2 sampler state: the penalty state (sample/penalties.py) and the structured
#   outputs' grammar bitmask (structured_outputs.py StructuredOutputsWorker, max_num_seqs x (1 + draft tokens) rows
#   of cdiv(vocab, 32) int32 words), both allocated after the snapshot and counted from 0.27.0's rules. The V1
#   runner builds its bitmask per step from the scheduler's (structured_output.utils.apply_grammar_bitmask).


def pipeline_buffer_counted(rules: VllmRules, runner: str) -> str:
    """Which term of vLLM's budget holds a non-first pipeline stage's intermediate-tensor buffer under ``rules`` and
    GPU model ``runner``: 'activation' (the V1 runner before consumed memory: the torch peak increase), 'consumed'
    (the fall in free memory since the first snapshot), or '' (Model Runner V2 before it: no term counts it)."""
    if rules.consumed_from_free_memory:
        return "consumed"
    return "" if runner == "v2" else "activation"


def runner_estimates_graphs(version: str | None, runner: str) -> bool:
    """Whether the GPU model ``runner`` of vLLM ``version`` (None: the newest kvlab knows) estimates its CUDA-graph
    memory before the cache is sized: V1 always, V2 from MODEL_RUNNER_V2_GRAPH_ESTIMATE_SINCE."""
    if runner != "v2":
        return True
    return version_key(resolve_version(version)) >= version_key(MODEL_RUNNER_V2_GRAPH_ESTIMATE_SINCE)


def check_model_runner(runner: str | None, version: str | None) -> None:
    """Refuse --model-runner v2 with a vLLM release before Model Runner V2 existed (MODEL_RUNNER_V2_SINCE)."""
    if runner != "v2" or version is None:
        return
    if version_key(version) < version_key(MODEL_RUNNER_V2_SINCE):
        raise KvlabError(f"--model-runner v2 needs vLLM {MODEL_RUNNER_V2_SINCE} or newer (--vllm-version {version} "
                         "has only the V1 runner); valid: --model-runner v1, or a --vllm-version from "
                         f"{MODEL_RUNNER_V2_SINCE}")


def model_runner(version: str | None, architecture: str, is_moe: bool, is_hybrid: bool, quantized: bool) -> str:
    """'v2' where vLLM ``version`` (None: the newest kvlab knows) runs this model on Model Runner V2 when
    VLLM_USE_V2_MODEL_RUNNER is unset, else 'v1'. Features V2 lacks (LoRA, some speculative methods) make vLLM fall
    back to V1; kvlab sizes neither, so it does not check them."""
    key = version_key(resolve_version(version))
    epochs = [e for e in MODEL_RUNNER_EPOCHS if version_key(e.since) <= key]
    if not epochs:
        return "v1"
    epoch = epochs[-1]
    if epoch.every:
        return "v2"
    if quantized and not epoch.quantized:
        return "v1"
    if architecture in epoch.architectures:
        return "v2"
    return "v2" if epoch.dense and not is_moe and not is_hybrid else "v1"


def qwen3_vl_profiles_video(version: str | None) -> bool:
    """Whether vLLM ``version`` (None: the newest kvlab knows) profiles Qwen3-VL's encoder on its dummy video."""
    return version_key(resolve_version(version)) >= version_key(QWEN3_VL_VIDEO_PROFILING_SINCE)


def encoder_cache_rows(version: str | None, budget_tokens: int, item_tokens: int) -> int:
    """The rows vLLM ``version``'s profile_run widens each dummy encoder output to before keeping it in the encoder
    cache (ENCODER_CACHE_SCATTERED): the encoder budget in 0.11, the item's placeholder length (``item_tokens``, in
    prompt tokens) in 0.12; 0 where the outputs are kept as they are."""
    key = version_key(resolve_version(version))
    since, until = ENCODER_CACHE_SCATTERED
    if not version_key(since) <= key < version_key(until):
        return 0
    return item_tokens if key >= version_key(ENCODER_CACHE_ITEM_LENGTH_SINCE) else budget_tokens


# A hybrid model's state blocks per request (MambaSpec.max_memory_usage_bytes): from 0.16.0 one state block plus one
# per speculative token (num_speculative_blocks = num_speculative_tokens whenever a speculative config is set,
# layers/mamba/abstract.py get_kv_cache_spec), and one more in mamba_cache_mode 'align' (the state of the last block
# boundary kept beside the running one). Read in 0.16.0, 0.17.0, 0.19.0, 0.20.1, 0.21.0, 0.22.0, 0.24.0, 0.25.0,
# 0.27.0, 0.29.0 and 0.32.0. In 0.14.0 a state took cdiv(max_model_len, mamba block size) pages, one without prefix
# caching and with no speculative blocks. 0.15 ships no source archive and is not read.
MAMBA_SPECULATIVE_BLOCKS_SINCE = "0.16.0"
# From 0.32.0 'align' also keeps a prefill-checkpoint block for a Mamba2 mixer (mamba_mixer2.py get_kv_cache_spec:
# num_prefill_checkpoint_blocks=1, counted by MambaSpec.max_memory_usage_bytes as 2 + speculative + checkpoint
# blocks); MambaSpec has the field from 0.29.0, but no Mamba2 mixer sets it in 0.29.0's source archive or 0.30.0's
# and 0.31.0's wheels (only Kimi K3's KDA layers, which kvlab does not size). Gated DeltaNet and Mamba1 set none.
MAMBA2_PREFILL_CHECKPOINT_SINCE = "0.32.0"

# Prefix caching's default for a generative hybrid model (Mamba, Mamba2, Gated DeltaNet layers beside attention),
# and the mamba_cache_mode it puts the state in (vllm-project/vllm#50991):
# - up to 0.27: off (engine/arg_utils.py _set_default_chunked_prefill_and_prefix_caching_args:
#   'is_prefix_caching_supported and not model_config.is_hybrid' in 0.26.0's and 0.27.1's source archives; in 0.22.0's
#   and 0.25.0's ModelConfig.is_prefix_caching_supported itself is False for hybrids). Turned on by hand, it put a model
#   that supports Mamba prefix caching (the Mamba1/Mamba2 families: catalog/hybrid.py StateLayout.prefix_caching_mode)
#   in mode 'all' (a state block per block of tokens, not modelled) and the others (Gated DeltaNet) in 'align'
#   (models/config.py MambaModelConfig, the same in 0.22.0, 0.25.0, 0.26.0 and 0.27.1);
# - from 0.28.0: on (the default is is_prefix_caching_supported, True for a generative hybrid, in 0.28.0's and 0.29.0's
#   source archives and 0.30.0's, 0.31.0's and 0.32.0's wheels), and MambaModelConfig turns mode 'none' into 'align'
#   for every hybrid; 'all' only where --mamba-cache-mode all is given (0.32.0 no longer has it: config/cache.py
#   MambaCacheMode is 'align' or 'none').
HYBRID_PREFIX_CACHING_DEFAULT_SINCE = "0.28.0"


def hybrid_prefix_caching_default(version: str | None) -> bool:
    """Whether `vllm serve` of ``version`` (None: the newest kvlab knows) turns prefix caching on for a generative hybrid
    when neither --enable-prefix-caching nor --no-enable-prefix-caching is given (HYBRID_PREFIX_CACHING_DEFAULT_SINCE)."""
    return version_key(resolve_version(version)) >= version_key(HYBRID_PREFIX_CACHING_DEFAULT_SINCE)


def mamba_cache_mode(version: str | None, enable_prefix_caching: bool | None, mamba_prefix_caching: bool
                     ) -> tuple[str, str]:
    """(vLLM ``version``'s mamba_cache_mode for a generative hybrid, why in words) under --enable-prefix-caching
    ``enable_prefix_caching`` (None: the version's default, HYBRID_PREFIX_CACHING_DEFAULT_SINCE): 'none' without
    prefix caching, 'align' or, before the default turned on, 'all' for a model that supports Mamba prefix caching
    (``mamba_prefix_caching``: kvlab.catalog.hybrid.StateLayout.prefix_caching_mode == 'all')."""
    release = resolve_version(version)
    newer = hybrid_prefix_caching_default(release)
    if enable_prefix_caching is None:
        why = (f"prefix caching {'on' if newer else 'off'}, vLLM {release}'s default for a hybrid model ("
               + (f"on from {HYBRID_PREFIX_CACHING_DEFAULT_SINCE}, vllm-project/vllm#50991)" if newer else
                  f"on only from {HYBRID_PREFIX_CACHING_DEFAULT_SINCE}, vllm-project/vllm#50991)"))
        enable_prefix_caching = newer
    else:
        why = f"prefix caching {'on' if enable_prefix_caching else 'off'}, as given"
    if not enable_prefix_caching:
        return "none", why
    if not newer and mamba_prefix_caching:
        return "all", why
    return "align", why


# vLLM refuses to start a hybrid in mamba_cache_mode 'align' without chunked prefill: MambaModelConfig asserts
# chunked prefill in that mode (models/config.py, since 'align' came in, vllm-project/vllm
# #30877; read in 0.22.0's, 0.25.0's to 0.29.0's source archives and 0.32.0's wheel). 'align' is where prefix caching
# puts every hybrid from 0.28.0 (on by default) and a Gated DeltaNet one before (turned on by hand); mode 'all' has no
# such check. kvlab models 'align' from MAMBA_SPECULATIVE_BLOCKS_SINCE; before it a run's prefix caching keeps no state
# blocks of its own (kvlab.config.resolve._state_blocks) and nothing is refused. kvlab.config.resolve.KvlabConfig
# .check_prefix_caching applies the rule to each strategy of a run.


def check_align_chunked_prefill(version: str | None, mode: str, enable_chunked_prefill: bool) -> None:
    """Refuse, as vLLM ``version`` does at startup, prefix caching (mamba_cache_mode ``mode``, mamba_cache_mode's)
    on a hybrid with chunked prefill off: 'align' needs it."""
    if mode != "align" or enable_chunked_prefill:
        return
    if version_key(resolve_version(version)) < version_key(MAMBA_SPECULATIVE_BLOCKS_SINCE):
        return
    raise KvlabError(f"vLLM {resolve_version(version)} refuses to start a hybrid model with prefix caching on "
                     "(mamba_cache_mode 'align') and chunked prefill off (--no-enable-chunked-prefill): its 'align' mode "
                     "needs chunked prefill; valid: --enable-chunked-prefill, or prefix "
                     "caching off (the vllm+noprefix strategy, `vllm serve --no-enable-prefix-caching`)")


def mamba_state_blocks(version: str | None, num_speculative_tokens: int, mode: str, mixer: str = "gdn") -> int:
    """Blocks one request's state takes in each linear-attention or Mamba group under vLLM ``version`` in
    mamba_cache_mode ``mode`` (mamba_cache_mode): 1, + the speculative tokens, + 1 in 'align' mode from
    MAMBA_SPECULATIVE_BLOCKS_SINCE, + 1 more for a Mamba2 ``mixer`` in 'align' from MAMBA2_PREFILL_CHECKPOINT_SINCE.
    Mode 'all', and a version before MAMBA_SPECULATIVE_BLOCKS_SINCE with prefix caching or speculative decoding on a
    hybrid, are refused: what they count is not modelled."""
    if mode == "all":
        raise KvlabError(f"vLLM {resolve_version(version)} puts a {mixer} model's state in mamba_cache_mode 'all' with "
                         "prefix caching on (a state block per block of tokens), which kvlab does not model; valid: "
                         f"prefix caching off (--no-enable-prefix-caching), or a --vllm-version from "
                         f"{HYBRID_PREFIX_CACHING_DEFAULT_SINCE} (mode 'align')")
    align = mode == "align"
    key = version_key(resolve_version(version))
    if key >= version_key(MAMBA_SPECULATIVE_BLOCKS_SINCE):
        checkpoint = align and mixer == "mamba2" and key >= version_key(MAMBA2_PREFILL_CHECKPOINT_SINCE)
        return 1 + num_speculative_tokens + int(align) + int(checkpoint)
    if align or num_speculative_tokens:
        raise KvlabError(f"vLLM {version}'s state blocks per request for a hybrid model with prefix caching or "
                         "speculative decoding are not modelled; valid: a --vllm-version from "
                         f"{MAMBA_SPECULATIVE_BLOCKS_SINCE}, or neither")
    return 1


# Gemma 4's vision tower over the dummy video: up to vllm-project/vllm#43169 ('[Perf][Gemma4] Batch vision encoder
# calls for image and video processing', merged 2026-05-21; gemma4_mm.py at commit 49e6e4739167) vLLM ran it one frame
# at a time and projected each frame's output at once; from it, all frames go through the tower in chunks of frames
# (_encoder_chunk at commit 01bae2190e1c) whose last hidden states are kept in a list and concatenated before pooling.
# 0.22.0 was released on 2026-05-29/30 (news summaries of those days); kvlab places the change there, not having read
# whether 0.22.0's branch was cut before the merge. The corpus has Gemma 4 logs of 0.19 and 0.29 only.
GEMMA4_VISION_BATCHED_SINCE = "0.22.0"


def gemma4_vision_batched(version: str | None) -> bool:
    """Whether vLLM ``version`` (None: the newest kvlab knows) runs Gemma 4's dummy video frames through the vision
    tower in chunks (GEMMA4_VISION_BATCHED_SINCE), rather than one frame at a time."""
    return version_key(resolve_version(version)) >= version_key(GEMMA4_VISION_BATCHED_SINCE)


# M-RoPE's cos/sin cache holds max_position_embeddings x 4 positions (MRotaryEmbedding: 'we enlarge
# max_position_embeddings to 4 times' for video positions). 0.32.0's Qwen3-VL passes a factor of 1 unless video pruning
# is on (qwen3_vl.py mrope_positions_factor); Qwen2-VL and Qwen2.5-VL keep the default 4. Where between 0.11 and 0.32
# Qwen3-VL's factor became 1 is not known: kvlab takes 4 below 0.32.0.
QWEN3_VL_MROPE_FACTOR_ONE_SINCE = "0.32.0"


def mrope_positions_factor(version: str | None, model_type: str) -> int:
    """The factor vLLM ``version`` enlarges a Qwen-VL model's M-RoPE cache by (LoadBuffers)."""
    if model_type.startswith("qwen3") and version_key(resolve_version(version)) >= version_key(
            QWEN3_VL_MROPE_FACTOR_ONE_SINCE):
        return 1
    return 4


# The first vLLM release whose model registry (vllm/model_executor/models/registry.py: _TEXT_GENERATION_MODELS or
# _MULTIMODAL_MODELS) names each architecture kvlab sizes, by its config.json's model_type too (a config.json without
# ``architectures``). Read in the source archives of 0.9.0, 0.9.1, 0.9.2, 0.10.0, 0.10.1, 0.10.1.1, 0.10.2, 0.11.0,
# 0.12.0, 0.13.0, 0.14.0, 0.16.0, 0.17.0, 0.18.0, 0.18.1, 0.19.0, 0.20.0, 0.21.0 and 0.22.0 (PyPI has no 0.15 source
# archive; each architecture below is absent from the release named before its first one). The entry is the first
# of those releases that names it: vLLM registers architectures in minor releases, but a patch release between two of
# those read (0.16.x, 0.17.x) was not checked.
ARCHITECTURE_FIRST_RELEASE = (
    # (architecture, model_type, first release; the release read before it, which does not name it)
    ("NemotronHForCausalLM", "nemotron_h", "0.9.1"),  # absent from 0.9.0
    ("GptOssForCausalLM", "gpt_oss", "0.10.1"),  # absent from 0.10.0
    ("Qwen3NextForCausalLM", "qwen3_next", "0.10.2"),  # absent from 0.10.1.1
    ("SeedOssForCausalLM", "seed_oss", "0.10.2"),  # absent from 0.10.1.1
    ("Qwen3VLMoeForConditionalGeneration", "qwen3_vl_moe", "0.11.0"),  # absent from 0.10.2
    ("Qwen3_5ForConditionalGeneration", "qwen3_5", "0.17.0"),  # absent from 0.16.0
    ("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", "0.17.0"),  # absent from 0.16.0
    ("Gemma4ForConditionalGeneration", "gemma4", "0.19.0"),  # absent from 0.18.1
    ("Gemma4ForCausalLM", "gemma4_text", "0.19.0"),  # absent from 0.18.1
)
# Architectures kvlab sizes that 0.9.0's registry already names (the oldest release whose rules kvlab has): no note.
ARCHITECTURES_IN_0_9_0 = (
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration", "GraniteMoeHybridForCausalLM", "Llama4ForConditionalGeneration",
    "LlamaForCausalLM", "LlavaNextForConditionalGeneration", "MistralForCausalLM", "MixtralForCausalLM",
    "OPTForCausalLM", "Phi3ForCausalLM", "Qwen2ForCausalLM", "Qwen2_5_VLForConditionalGeneration", "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
)


def first_release(architecture: str, model_type: str = "") -> tuple[str, str] | None:
    """(the architecture's name, the first release whose registry names it) by ``architecture``, else (a config.json
    that names none) by ``model_type``; None where kvlab has not read it (ARCHITECTURE_FIRST_RELEASE)."""
    name = architecture.split()[0] if architecture.strip() else ""  # (the catalogue may add words after the name)
    for arch, mtype, since in ARCHITECTURE_FIRST_RELEASE:
        if name == arch or (not name and model_type == mtype):
            return arch, since
    return None


def architecture_note(version: str | None, architecture: str, model_type: str = "") -> str | None:
    """A note (not a refusal) where vLLM ``version`` predates the first release that registered the model's
    architecture: that release could not load the model, so its figures are its arithmetic, not a start it made."""
    found = first_release(architecture, model_type)
    if found is None:
        return None
    arch, since = found
    chosen = resolve_version(version)
    if version_key(chosen) >= version_key(since):
        return None
    return (f"vLLM {chosen} does not run {arch}: its model registry (vllm/model_executor/models/registry.py) names it "
            f"from {since} on; these figures apply {chosen}'s startup arithmetic to a model that release cannot load "
            f"(--vllm-version {since} or newer for a start vLLM makes)")


def version_key(version: str) -> tuple[int, int, int]:
    """'0.10.1.1' -> (0, 10, 1); '0.20.1rc1.dev16+g7a1eb8ac2' -> (0, 20, 1); '0.24' -> (0, 24, 0)."""
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        raise KvlabError(f"--vllm-version {version!r} is not a version number; valid: {known_versions_text()}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def known_versions_text() -> str:
    """The versions rules_for takes: from the first epoch to any patch release of the newest minor kvlab knows."""
    major, minor, _ = version_key(NEWEST_KNOWN)
    return f"{RULES[0].since} to {major}.{minor}.x (rules change at {', '.join(r.since for r in RULES)})"


def rules_for(version: str | None) -> VllmRules:
    """The rules of ``version`` (None: the newest kvlab knows)."""
    if version is None:
        return RULES[-1]
    key = version_key(version)
    if key < RULES[0].key or key[:2] > version_key(NEWEST_KNOWN)[:2]:
        raise KvlabError(f"vLLM version {version!r} is not one kvlab knows the startup arithmetic of; valid: "
                         f"{known_versions_text()}")
    return [r for r in RULES if r.key <= key][-1]


def canonical_version(version: str) -> str:
    """A known version as kvlab names it everywhere (a sweep key, a stored row, a report): without a leading v or
    spaces, and with its patch number ('0.32' is 0.32.0, the release vLLM tags for that minor; '0.10.1.1' and
    '0.20.1rc1' are kept as written). A version kvlab does not know is refused (rules_for)."""
    rules_for(version)
    text = version.strip().lstrip("v")
    return f"{text}.0" if re.fullmatch(r"\d+\.\d+", text) else text


def resolve_version(version: str | None) -> str:
    """The version a sizing names: the one given (canonical_version), or the newest kvlab knows."""
    return NEWEST_KNOWN if version is None else canonical_version(version)

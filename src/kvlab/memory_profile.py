"""vLLM's memory profile at startup, term by term: what is left for the KV cache on one GPU.

    requested  = total (as CUDA reports it) x gpu_memory_utilization            gpu_worker.init_device
    available  = requested - (weights + peak activation + non-torch)            gpu_worker.determine_available_memory
                 - CUDA graphs, in the releases that deduct them                (VllmRules.cuda_graphs_deducted)

vLLM measures three of the terms at startup (memory_profiling in vllm/utils: the torch peak increase of the dummy
profiling run, the non-torch increase since the worker's first snapshot, and the graphs' memory); kvlab cannot
measure them before the server starts, so it estimates each from the model and the settings, with the
coefficients in ``FIT`` below, fitted on real startup logs (benchmarks/startup_logs.py --fit says which logs and
how many; docs/sizing.md gives the figures). The weights are computed, not fitted (ModelSpec.weights_bytes_for).

No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class ProfileFit:
    """Coefficients of the estimates, and how many logs each rests on (``basis``)."""

    # Activation of the dummy forward over max_num_batched_tokens tokens, per token: hidden-size tensors alive at
    # the MLP's peak (residual, normed input) and the MLP's own (gate/up output and the activated product: 3 x
    # the MLP width per GPU) plus the q/k/v projection's output (gpu_model_runner.profile_run -> _dummy_run).
    hidden_tensors: float
    mlp_tensors: float
    qkv_tensors: float
    # The dummy sampler run: min(max_num_seqs, max_num_batched_tokens) rows of logits over the vocabulary
    # (_dummy_sampler_run), bytes per logit by the top-k/top-p implementation the log names ('Using FlashInfer for
    # top-p & top-k sampling', or 'Falling back to the PyTorch-native implementation', which sorts: float32
    # values and int64 indices beside the float32 logits and probabilities). The V1 runner's only: Model Runner V2's
    # sampler run is counted, not fitted (with_sampler).
    sampler_bytes_per_logit: dict
    # MoE: the fused experts' intermediate caches, per routed token (each of top-k experts), N the expert width per
    # GPU and K the hidden size: cache1 (the gate/up output, 2 N) and cache3 (the down output, K) are views of one
    # buffer of max(2 N, K), and cache2 (the activated product, N) its own (Triton's fused_moe.fused_experts_impl
    # 'cache13 ... by the time we need cache3, we're done with cache1', since vLLM PR #13625, and Marlin's
    # fused_marlin_moe intermediate_cache13 alike).
    moe_cache_tensors: float
    # Non-torch memory: what the worker holds outside PyTorch's allocator after profiling (cuBLAS/cuDNN
    # workspaces; with TP > 1 NCCL's buffers and the custom all-reduce's, which NVLink SHARP makes large on
    # NVSwitch systems).
    non_torch_base_gib: float
    non_torch_nccl_pcie_gib: float
    non_torch_nccl_nvswitch_gib: float
    # CUDA graphs, where deducted: vLLM's profiler estimates the pool from the graphs it will capture (per mode, the
    # first capture + (graphs - 1) x the second, measured: gpu_model_runner.profile_cudagraph_memory); per graph,
    # fitted on the two corpus logs that print both the counts and the estimate ('Profiling CUDA graph memory:
    # PIECEWISE=51 (largest=512), FULL=19 (largest=128)' -> 0.48 GiB, 0.20.1rc1; PIECEWISE=4, FULL=3 -> 0.05 GiB,
    # 0.19.0). The third log that prints an estimate (gemma-4-e2b-it-bf16-t4-0.29.0: 0.0092 of the card, 0.136 GiB
    # over the 9 graphs kvlab counts) implies 15.45 MiB a graph: no one rate, per graph or per graph and layer, fits
    # the three (`python benchmarks/startup_logs.py --fit` prints them), and a rule for 0.29 would rest on that one log.
    cuda_graph_mib_per_graph: float
    # What the tensor counts above miss, per family (kernels' workspaces, torch.compile's buffers, the allocator's
    # rounding): the measured peak over the estimate, fitted on the fitting half of the corpus (1.0: no fit).
    activation_scale: dict
    basis: str


FIT = ProfileFit(
    hidden_tensors=2.0, mlp_tensors=3.0, qkv_tensors=1.0, moe_cache_tensors=1.0,
    # `python benchmarks/startup_logs.py --fit`, fitting half of the corpus: each on 2 dense logs naming their sampler.
    sampler_bytes_per_logit={"flashinfer": 7.1, "pytorch": 35.3},
    # The three 0.10.2 logs that print vLLM's breakdown ('Actual usage is ... GiB for non-torch memory'): 0.07 GiB on
    # one 80 GB GPU (LLaVA-NeXT), 0.21 with TP 8 over PCIe (Qwen3-235B on L40S), 1.38 with TP 2 on H200.
    non_torch_base_gib=0.07, non_torch_nccl_pcie_gib=0.14, non_torch_nccl_nvswitch_gib=1.31,
    cuda_graph_mib_per_graph=7.05,
    # The same fit: dense not scaled (its sampler fit absorbs the rest); MoE on 3 logs (gpt-oss-120b on 4 x A100
    # and on one H100, gpt-oss-20b on an A100; 0.85 when the MoE caches were counted as 3 N + K), hybrid on 1
    # (Qwen3-Next, 2 x H200: its printed 5.58 GiB; 0.84 with 3 N + K; `--fit` adds Nemotron 3 Nano's GB10 log,
    # whose non-torch term is the host's, and gives 1.39), int4 on 1 (Llama-3-70B-AWQ,
    # 2 x L40S: the awq_marlin forward peaks at 3.4 x the tensors counted; Qwen3-14B-AWQ, whose 0.28 log prints its
    # peak, 1.46 GiB, is of the fitting half too but prints no weights line to fit on). Multimodal models take their
    # text model's family: the encoder's profiling run is its own term (encoder_bytes), not a scale.
    activation_scale={"dense": 1.0, "moe": 1.07, "hybrid": 1.0, "int4": 3.42},
    basis="tensor counts read from vLLM's code; non-torch from the 3 logs that print vLLM's breakdown; the activation "
          "scale per family fitted on the fitting half of tests/data/startup_logs (docs/sizing.md)",
)

# Hopper and Blackwell SXM boards sit on third-generation NVSwitches, where NCCL allocates NVLink SHARP (NVLS) buffers.
NVSWITCH_GPUS = ("H100-SXM", "H200", "B200")


@dataclass(frozen=True)
class ProfileInputs:
    """What the estimates read, in plain numbers (one GPU of the stage sized)."""

    hidden_size: int
    mlp_width_per_gpu: int  # dense MLP width / TP (MoE: shared experts' width / TP)
    qkv_width_per_gpu: int  # (q + k + v) heads x head_dim / TP
    vocab_size: int
    num_layers: int  # layers on this GPU
    act_dtype_bytes: int
    max_num_batched_tokens: int
    max_num_seqs: int
    tensor_parallel_size: int
    last_stage: bool
    first_stage: bool = True
    # where vLLM counts a non-first stage's intermediate-tensor buffer (vllm_rules.pipeline_buffer_counted):
    # 'activation', 'consumed' or '' (in no term)
    pipeline_buffer_in: str = ""
    num_speculative_tokens: int = 0  # draft tokens a step: Model Runner V2's grammar bitmask has a row for each
    moe_top_k: int = 0
    moe_width_per_gpu: int = 0  # one expert's intermediate size on this GPU (N / TP, or N under expert parallelism)
    family: str = "dense"  # dense | moe | hybrid | int4: which fitted scale applies (model_family)
    sampler: str = "pytorch"  # flashinfer | pytorch: the top-k/top-p implementation (SAMPLERS)
    model_runner: str = "v1"  # v1 | v2: the GPU model runner vLLM profiles with (vllm_rules.model_runner)
    v2_float32_copy: bool = False  # Model Runner V2's sampler copies the logits to float32 (up to 0.25)
    logit_soft_cap: bool = False  # config.json's final_logit_softcapping is set (Gemma 2 and 4): LogitsProcessor caps
    encoder: EncoderInputs | None = None  # a multimodal model's encoder profiling run, where kvlab derives it


@dataclass(frozen=True)
class EncoderInputs:
    """The encoder profiling run of a multimodal model, in plain numbers (gpu_model_runner.profile_run: before the
    text dummy run, vLLM runs the encoder over ``items`` dummy items of the modality with the most tokens per item,
    as many as fit the encoder budget max(max_num_batched_tokens, tokens per item), and keeps the outputs in the
    encoder cache while the text dummy run follows)."""

    items: int
    patches_per_item: int
    values_per_patch: int  # one row of pixel_values
    tokens_per_item: int
    out_width: int  # one output token's width
    hidden_size: int  # the tower's
    mlp_width_per_gpu: int  # the tower's MLP width / TP (its linear layers are split as the decoder's)
    mlp_tensors: int  # MLP tensors alive at its peak, in mlp_width (gated 3, else 2)
    modality: str = "image"  # image | video: the dummy vLLM encodes (the modality with the most tokens per item)
    budget_tokens: int = 0  # the encoder budget vLLM prints ('initialized with a budget of N tokens')
    frames: int = 1  # a video dummy's frames
    side: int = 0  # pixels on a side of one (square) frame or image
    video_instead: bool = False  # vLLM profiles a video item here, whose size kvlab does not derive
    cache_rows: int = 0  # rows each output is widened to in the encoder cache (vllm_rules.encoder_cache_rows), 0: none
    # Gemma 4: the tower runs the frames of all items in chunks of chunk_frames (0: every patch at once, as Qwen-VL);
    # hidden_held: each chunk's last hidden states wait in a list, concatenated after the last chunk (vLLM from
    # vllm_rules.GEMMA4_VISION_BATCHED_SINCE), else each frame is pooled and projected before the next.
    chunk_frames: int = 0
    hidden_held: bool = False

    @property
    def described(self) -> str:
        """The dummy in words: '1 image of 65,536 patches -> 16,384 tokens each'."""
        pixels = f" of {self.side}^2 pixels" if self.side else ""
        kind = f"video{'s' if self.items > 1 else ''} of {self.frames:,} frames{pixels}," \
            if self.modality == "video" else f"image{'s' if self.items > 1 else ''} of"
        text = f"{self.items} {kind} {self.patches_per_item:,} patches -> {self.tokens_per_item:,} tokens each"
        if self.chunk_frames:
            text += f", through the tower {self.chunk_frames:,} frame{'s' if self.chunk_frames > 1 else ''} at a time"
        return text


@dataclass(frozen=True)
class Term:
    """One term of the profile: bytes per GPU and where the figure comes from."""

    name: str
    bytes: int
    source: str


def activation_bytes(x: ProfileInputs, fit: ProfileFit = FIT) -> Term:
    """Peak activation of vLLM's profiling run (the torch peak increase it measures), estimated."""
    t = x.max_num_batched_tokens
    per_token = (fit.hidden_tensors * x.hidden_size + fit.mlp_tensors * x.mlp_width_per_gpu
                 + fit.qkv_tensors * x.qkv_width_per_gpu) * x.act_dtype_bytes
    forward = t * per_token
    moe = 0.0
    if x.moe_top_k:
        moe = (fit.moe_cache_tensors * t * x.moe_top_k * (max(2 * x.moe_width_per_gpu, x.hidden_size)
                                                          + x.moe_width_per_gpu) * x.act_dtype_bytes)
    source = (f"estimate: {t:,} batched tokens x ({fit.hidden_tensors:g} x {x.hidden_size:,} hidden + "
              f"{fit.mlp_tensors:g} x {x.mlp_width_per_gpu:,} MLP + {fit.qkv_tensors:g} x {x.qkv_width_per_gpu:,} "
              f"qkv) x {x.act_dtype_bytes} B")
    if x.moe_top_k:
        source += (f" + MoE caches {t:,} x top-{x.moe_top_k} x (max(2 x {x.moe_width_per_gpu:,}, {x.hidden_size:,}) + "
                   f"{x.moe_width_per_gpu:,}) x {x.act_dtype_bytes} B")
    scale = fit.activation_scale.get(x.family, 1.0)
    if scale != 1.0:
        source = source.replace("estimate: ", f"estimate: {scale:.2f} ({x.family} fit) x the forward's ", 1)
    buffer = pipeline_buffer_bytes(x) if x.pipeline_buffer_in == "activation" else 0
    if buffer:
        source += (f" + {buffer / GIB:.2f} GiB of the pipeline's intermediate tensors (2 x {t:,} x "
                   f"{x.hidden_size:,} x {x.act_dtype_bytes} B, allocated in the profiling run)")
    text, source = with_sampler(x, scale * (forward + moe) + buffer, source, fit)
    if x.encoder is None:
        return Term("peak activation", text, source + " (vLLM measures it in its profiling run)")
    encoder, kept = encoder_bytes(x.encoder, x.act_dtype_bytes)
    e = x.encoder
    what = e.described + (f" (the encoder budget vLLM prints: {e.budget_tokens:,} tokens)" if e.budget_tokens else "")
    if e.video_instead:
        what += (" (vLLM profiles a video item at this max_model_len, larger than the image; kvlab does not derive "
                 "its size, so this is a lower bound)")
    held = "pixel_values in the model's dtype and the outputs in the encoder cache"
    if e.cache_rows > e.tokens_per_item:
        held = (f"pixel_values in the model's dtype, the outputs widened to {e.cache_rows:,} rows each with zeros, as the "
                f"encoder cache of this vLLM held scattered embeddings, and the last output, which the widening "
                f"loop's variable keeps")
    if encoder > text + kept:
        return Term("peak activation", encoder, f"estimate: the encoder's profiling run over {what}: "
                    f"pixel_values in the model's dtype, the tower's hidden, normed and MLP tensors per patch and "
                    f"the outputs; above the text run's {text / GIB:.2f} GiB (vLLM measures the peak)")
    return Term("peak activation", text + kept, source + f" + {kept / GIB:.2f} GiB held from the encoder's profiling "
                f"run over {what} ({held}) (vLLM measures it in its profiling run)")


def with_sampler(x: ProfileInputs, forward: float, source: str, fit: ProfileFit = FIT) -> tuple[int, str]:
    """The profiling run's peak with the dummy sampler run on the last stage, over min(max_num_seqs,
    max_num_batched_tokens) rows of logits.

    V1 runner (gpu_model_runner._dummy_sampler_run): top-k and top-p applied to every row, with the implementation's
    fitted bytes per logit added to the forward's estimate; a final-logit soft cap's moment (soft_cap_bytes) where it is
    the larger. Model Runner V2: counted, not fitted (v2_sampler_run_bytes); the peak is the larger of the forward's
    and the sampler run's."""
    if not x.last_stage:
        return int(forward), source
    rows = min(x.max_num_seqs, x.max_num_batched_tokens)
    if x.model_runner != "v2":
        per_logit = fit.sampler_bytes_per_logit[x.sampler]
        text = source + f" + {x.sampler} sampler {rows:,} x {x.vocab_size:,} vocab x {per_logit:g} B"
        capped = soft_cap_bytes(x, rows)
        if capped > rows * x.vocab_size * per_logit:
            return int(forward + capped), source + f" + {soft_cap_words(x, rows)}, above the {x.sampler} sampler's"
        if capped:
            text += f" (above {soft_cap_words(x, rows)})"
        return int(forward + rows * x.vocab_size * per_logit), text
    sampler, what = v2_sampler_run_bytes(x, rows)
    if sampler > forward:
        return sampler, f"estimate: {what}; above the forward's {forward / GIB:.2f} GiB ({source[len('estimate: '):]})"
    return int(forward), source + f"; above {what} ({sampler / GIB:.2f} GiB)"


# ParallelLMHead pads the vocabulary to a multiple of 64 (vocab_parallel_embedding.pad_vocab_size,
# DEFAULT_VOCAB_PADDING_SIZE), and each TP rank computes an equal share of the padded columns; compute_logits then
# slices the padding off, a view.
LM_HEAD_VOCAB_PADDING = 64
# The Gumbel-max kernel of Model Runner V2's sampler (sample/gumbel.py gumbel_sample) reduces each row in blocks of
# this many columns, writing an int64 index and a float32 maximum per block.
GUMBEL_BLOCK_COLUMNS = 1024
# The first release whose Model Runner V2 sampler makes no float32 copy of the dummy run's logits: 0.22.0's and
# 0.25.0's apply_sampling_params copy them unconditionally ('Copy logits to a new FP32 tensor'); 0.26.0's apply the
# sampling parameters in place, and 0.27.1's to 0.32.0's copy only when a request needs logits processing. 0.23,
# 0.24 and 0.25's patch releases were not read.
V2_SAMPLER_NO_FLOAT32_COPY_SINCE = "0.26.0"


def soft_cap_bytes(x: ProfileInputs, rows: int) -> int:
    """The logits alive while a final-logit soft cap is applied, 0 without one. LogitsProcessor.forward (model_executor/
    layers/logits_processor.py, read in 0.22.0's, 0.25.0's, 0.26.0's, 0.27.1's, 0.28.0's, 0.29.0's and 0.32.0's
    sources: the same three lines) runs ``logits = logits / self.soft_cap``, ``logits = torch.tanh(logits)``,
    ``logits = logits * self.soft_cap``, each out of place in the logits' dtype (the model's: the head's dtype is the
    model's unless --hf-overrides sets head_dtype). The division reads _get_logits' slice of the LM head's padded
    output, a view, so the padded logits and the unpadded quotient are alive together; the padded ones are freed when
    the name is rebound, and tanh and the product each hold two unpadded copies. The peak: rows x (padded + vocab)."""
    if not x.logit_soft_cap:
        return 0
    return rows * (padded_vocab(x.vocab_size) + x.vocab_size) * x.act_dtype_bytes


def soft_cap_words(x: ProfileInputs, rows: int) -> str:
    return (f"the final-logit soft cap's moment ({rows:,} x ({padded_vocab(x.vocab_size):,} padded + {x.vocab_size:,}) "
            f"x {x.act_dtype_bytes} B: LogitsProcessor.forward divides, takes tanh and multiplies out of place)")


def padded_vocab(vocab: int) -> int:
    return -(-vocab // LM_HEAD_VOCAB_PADDING) * LM_HEAD_VOCAB_PADDING


def v2_sampler_run_bytes(x: ProfileInputs, rows: int) -> tuple[int, str]:
    """(bytes, words) of Model Runner V2's dummy sampler run (v1/worker/gpu/model_runner.py _dummy_sampler_run, read
    in 0.22.0's, 0.25.0's, 0.26.0's, 0.27.1's, 0.28.0's, 0.29.0's and 0.32.0's sources), the tensors alive at its
    peak. The forward's activations are freed by then; its hidden states (max_num_batched_tokens rows) stay held by
    profile_run, with the ``rows`` gathered for the LM head (hidden_states[logits_indices], a copy). The LM head
    returns ``rows`` x the padded vocabulary in the model's dtype; with TP > 1 compute_logits all-gathers the shards
    (the device communicator's all_gather: an output buffer, then a reshape of its movedim view, which copies), so
    the shard and two whole copies are alive at once, and the shard and the buffer are freed before sampling.
    A final-logit soft cap (Gemma 2 and 4) then holds the padded logits and an unpadded copy for a moment
    (soft_cap_bytes) and leaves the unpadded copy. The sampler then holds the logits, their float32 copy where this
    vLLM makes one (``x.v2_float32_copy``: up to 0.25 apply_sampling_params copies unconditionally; 0.26 applies the
    sampling parameters in place, and from 0.27 copies only for requests that set one, which the dummy requests,
    never added to the sampler's states, do not), and gumbel_sample's partials: an int64 index and a float32 maximum
    per 1,024-column block of each row, then the winning block's index and the sampled token (int64 each). Not
    counted: the per-row index tensors of the dummy input batch (a few dozen bytes a row) and the caching
    allocator's rounding."""
    b, tp, vocab = x.act_dtype_bytes, x.tensor_parallel_size, x.vocab_size
    held = (x.max_num_batched_tokens + rows) * x.hidden_size * b
    padded = padded_vocab(vocab)
    logits = rows * padded * b
    gather = logits + rows * (padded // tp) * b if tp > 1 else 0
    capped = soft_cap_bytes(x, rows)
    copy = rows * vocab * 4 if x.v2_float32_copy else 0
    partials = rows * (-(-vocab // GUMBEL_BLOCK_COLUMNS) * (8 + 4) + 8 + 8)
    sampled = (rows * vocab * b if capped else logits) + copy + partials
    what = (f"Model Runner V2's sampler run: ({x.max_num_batched_tokens:,} + {rows:,}) x {x.hidden_size:,} hidden "
            f"states held + {rows:,} x {padded:,} (padded) vocab logits x {b} B + ")
    peak = max(logits + gather, capped, sampled)
    if gather and peak == logits + gather:
        what += f"a second copy and the {padded // tp:,}-column shard while all-gathered over TP {tp}"
    elif capped and peak == capped:
        what += (f"an unpadded copy ({rows:,} x {vocab:,} x {b} B) while the final logits are soft-capped "
                 "(LogitsProcessor.forward divides, takes tanh and multiplies out of place), above the sampler's "
                 "Gumbel-max partials")
    else:
        what += ((f"their float32 copy ({rows:,} x {vocab:,} x 4 B) + " if copy else "")
                 + "Gumbel-max partials" + ("" if copy else ", no float32 copy (its dummy requests set no sampling "
                                            "parameter)"))
    return held + peak, what


def encoder_bytes(e: EncoderInputs, act_dtype_bytes: int) -> tuple[int, int]:
    """(peak of the encoder's profiling run, what it leaves held during the text dummy run), estimated by counting
    tensors as for the text model: the pixel_values, which vLLM casts to the model's dtype as the HF processor returns
    them (call_hf_processor: 'this emulates output.to(dtype=self.model_config.dtype)'; kept by profile_run until it
    returns, and the tower's own cast to its dtype is then no copy), then per patch the hidden and normed tensors and
    the MLP's; the outputs (tokens x out width, deepstack included) stay in the encoder cache. Where the cache held
    scattered embeddings (``cache_rows``, vLLM 0.11 and 0.12), each output shorter than that was first copied into
    zeros of ``cache_rows`` rows, and those are what stay; both exist while they are filled, and the copying loop's
    variable still holds the last item's output through the text dummy run (profile_run does not delete it)."""
    patches = e.items * e.patches_per_item
    pixels = patches * e.values_per_patch * act_dtype_bytes
    outputs = e.items * e.tokens_per_item * e.out_width * act_dtype_bytes
    per_patch = 2 * e.hidden_size + e.mlp_tensors * e.mlp_width_per_gpu
    forward = pixels + tower_peak_values(e, per_patch) * act_dtype_bytes + outputs
    if e.cache_rows <= e.tokens_per_item:
        return forward, pixels + outputs
    widened = e.items * e.cache_rows * e.out_width * act_dtype_bytes
    last_output = e.tokens_per_item * e.out_width * act_dtype_bytes
    return max(forward, pixels + outputs + widened), pixels + widened + last_output


def tower_peak_values(e: EncoderInputs, per_patch: int) -> int:
    """Values alive at the tower's peak besides the pixel_values and outputs: ``per_patch`` for every patch run at once;
    where the frames go in chunks (``chunk_frames``), those of the largest chunk plus, when ``hidden_held``, the last
    hidden states of the frames before it (hidden size each), or the whole list and its concatenation at the end."""
    patches = e.items * e.patches_per_item
    if not e.chunk_frames:
        return patches * per_patch
    frames = e.items * e.frames
    per_frame = e.patches_per_item // e.frames
    peaks = [(start * e.hidden_size * e.hidden_held + min(e.chunk_frames, frames - start) * per_patch) * per_frame
             for start in range(0, frames, e.chunk_frames)]
    return max(peaks + [2 * patches * e.hidden_size * e.hidden_held])


SAMPLERS = ("flashinfer", "pytorch")


def model_family(is_hybrid: bool, is_moe: bool, is_int4: bool = False) -> str:
    """The family whose fitted activation scale applies: a hybrid's state layers change the peak most, then MoE's
    fused-expert buffers, then the Marlin kernels (awq_marlin, gptq_marlin) vLLM runs 4-bit GPTQ/AWQ/AutoRound linear
    layers with. A multimodal model takes its text model's family (its encoder run is a term of its own)."""
    if is_hybrid:
        return "hybrid"
    return "moe" if is_moe else "int4" if is_int4 else "dense"


def non_torch_bytes(tensor_parallel_size: int, gpu_name: str | None, fit: ProfileFit = FIT) -> Term:
    """Memory outside PyTorch's allocator that vLLM counts (non-torch increase), estimated."""
    from kvlab.catalog.gpus import card_id

    gib = fit.non_torch_base_gib
    source = f"estimate: {fit.non_torch_base_gib:g} GiB of library workspaces"
    if tensor_parallel_size > 1:
        nvswitch = card_id(gpu_name) in NVSWITCH_GPUS
        nccl = fit.non_torch_nccl_nvswitch_gib if nvswitch else fit.non_torch_nccl_pcie_gib
        gib += nccl
        source += (f" + {nccl:g} GiB of NCCL buffers for TP {tensor_parallel_size} "
                   f"({'NVSwitch: NVLink SHARP' if nvswitch else 'PCIe'})")
    from kvlab.catalog.gpus import is_unified_memory

    if is_unified_memory(gpu_name):
        # mem_utils.MemorySnapshot.measure on an integrated GPU: free = psutil's available host memory.
        return Term("non-torch", int(gib * GIB), source + " (vLLM measures it at startup); on this unified-memory GPU vLLM "
                    "takes free memory from the host's available memory, so it also counts the host memory taken during "
                    "startup, which kvlab does not estimate")
    return Term("non-torch", int(gib * GIB), source + " (vLLM measures it at startup, as the fall in free memory since "
                "its first snapshot: what other processes take meanwhile counts too; kvlab assumes none)")


def penalty_state_bytes(max_num_seqs: int, vocab_size: int) -> int:
    """Model Runner V2's penalty state, allocated on the GPU with its sampler when the model loads
    (v1/worker/gpu/sample/penalties.py PenaltiesState): a count per request and vocabulary entry
    (output_bin_counts, int32) and a bit per entry of the prompt (prompt_bin_mask, int32 words of 32 bits)."""
    return max_num_seqs * vocab_size * 4 + max_num_seqs * -(-vocab_size // 32) * 4


def grammar_bitmask_bytes(rows: int, vocab_size: int) -> int:
    """Model Runner V2's grammar bitmask on the last stage (v1/worker/gpu/structured_outputs.py StructuredOutputsWorker):
    a bit per vocabulary entry, in int32 words, for each of ``rows`` logits (max_num_seqs x (1 + draft tokens))."""
    return rows * -(-vocab_size // 32) * 4


def pipeline_buffer_bytes(x: ProfileInputs) -> int:
    """A non-first pipeline stage's intermediate-tensor buffer (make_empty_intermediate_tensors, batch max_num_batched
    tokens): the hidden states and the residual it receives from the stage before, in the model's dtype, hidden size
    wide (not split over TP); 0 on the first stage."""
    if x.first_stage:
        return 0
    return 2 * x.max_num_batched_tokens * x.hidden_size * x.act_dtype_bytes


def kept_runner_tensors(x: ProfileInputs) -> list[tuple[int, str]]:
    """(bytes, words) of the tensors the GPU model runner allocates after the worker's first memory snapshot and keeps
    through profiling, on this stage (vllm_rules.pipeline_buffer_counted says which releases count which): Model
    Runner V2's penalty state and grammar bitmask on the last stage, the only such tensors that grow with the
    vocabulary (its other per-request tables, logit bias, stop and bad-word ids, are some KiB a request; the V1
    runner's input buffers are allocated before the snapshot is compared), and a non-first stage's intermediate-tensor
    buffer where 'consumed memory' counts it."""
    kept = []
    if x.model_runner == "v2" and x.last_stage:
        kept.append((penalty_state_bytes(x.max_num_seqs, x.vocab_size),
                     f"Model Runner V2's penalty state ({x.max_num_seqs:,} requests x {x.vocab_size:,} vocab x 4 B of "
                     "counts + a bit mask)"))
        rows = x.max_num_seqs * (1 + x.num_speculative_tokens)
        kept.append((grammar_bitmask_bytes(rows, x.vocab_size),
                     f"its grammar bitmask ({rows:,} rows x cdiv({x.vocab_size:,}, 32) x 4 B)"))
    if x.pipeline_buffer_in == "consumed" and not x.first_stage:
        kept.append((pipeline_buffer_bytes(x), f"the pipeline's intermediate tensors on this non-first stage (hidden "
                     f"states + residual: 2 x {x.max_num_batched_tokens:,} x {x.hidden_size:,} x {x.act_dtype_bytes} B)"))
    return kept


def with_kept_runner_state(non_torch: Term, x: ProfileInputs, counted: bool) -> Term:
    """``non_torch`` plus the tensors the GPU model runner keeps after the worker's first memory snapshot
    (kept_runner_tensors), where vLLM counts them (``counted``: VllmRules.consumed_from_free_memory, whose 'consumed
    memory' is the fall in free memory since that snapshot)."""
    kept = kept_runner_tensors(x) if counted else []
    if not kept:
        return non_torch
    words = "; + ".join(f"{size / GIB:.2f} GiB of {what}" for size, what in kept)
    return Term(non_torch.name, non_torch.bytes + sum(size for size, _ in kept), non_torch.source + (
        f"; + {words}, allocated after that snapshot and counted in vLLM's 'consumed memory'"))


def capture_sizes(largest: int) -> list[int]:
    """vLLM's default CUDA-graph batch sizes up to ``largest``: 1, 2, 4, then every 8 to 248, then every 16
    (CompilationConfig's default cudagraph_capture_sizes)."""
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, 1025, 16)]
    return [n for n in sizes if n <= largest]


def cuda_graph_bytes(max_num_seqs: int, deducted: bool, enforce_eager: bool, version: str,
                     fit: ProfileFit = FIT, max_graph_size: int = 512, runner_estimates: bool = True) -> Term:
    """CUDA-graph memory deducted from the KV budget: only where the version deducts it and graphs are captured.
    Piecewise graphs for batch sizes up to min(2 x max_num_seqs, max_graph_size), full graphs for decode batches up
    to max_num_seqs (FULL_AND_PIECEWISE), each costing the fitted pool share. ``max_graph_size``: vLLM's default
    ceiling, 512, or 1,024 on compute capability 10.x from 0.32 (VllmRules.max_graph_size_blackwell).
    ``runner_estimates``: False where the model runner's estimate is 0 (vllm_rules.runner_estimates_graphs)."""
    if enforce_eager:
        return Term("CUDA graphs", 0, "none: --enforce-eager captures no graphs")
    if not deducted:
        return Term("CUDA graphs", 0, f"not deducted by vLLM {version} (graphs are captured after the KV cache is "
                                      "allocated, from what is left)")
    if not runner_estimates:
        return Term("CUDA graphs", 0, f"none deducted: Model Runner V2 of vLLM {version} estimates its CUDA-graph "
                                      "memory as 0 (profile_cudagraph_memory, before 0.29.0); the graphs are captured "
                                      "after the KV cache is allocated, from what is left")
    piecewise = len(capture_sizes(min(2 * max_num_seqs, max_graph_size)))
    full = len(capture_sizes(min(max_num_seqs, max_graph_size)))
    size = int(fit.cuda_graph_mib_per_graph * 2**20 * (piecewise + full))
    return Term("CUDA graphs", size, f"estimate: ({piecewise} piecewise + {full} full graphs) x "
                                     f"{fit.cuda_graph_mib_per_graph:g} MiB (vLLM {version} profiles and deducts "
                                     "them)")


@dataclass(frozen=True)
class MemoryProfile:
    """The terms of one GPU's budget; ``available`` is what vLLM prints as 'Available KV cache memory'."""

    total: Term
    requested: Term
    weights: Term
    activation: Term
    non_torch: Term
    cuda_graphs: Term

    @property
    def other_bytes(self) -> int:
        return self.activation.bytes + self.non_torch.bytes + self.cuda_graphs.bytes

    @property
    def available_bytes(self) -> int:
        return self.requested.bytes - self.weights.bytes - self.other_bytes

    @property
    def terms(self) -> tuple[Term, ...]:
        return (self.total, self.requested, self.weights, self.activation, self.non_torch, self.cuda_graphs)

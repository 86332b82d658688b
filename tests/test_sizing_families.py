"""One test per layout family on a real config.json, at exact bytes and blocks; the vLLM version's rules; the
quantized layouts; and the memory profile's terms.

Configs: the catalogue's entries, /work/shared/data/model-configs/ (read from there), and two checked in under
tests/data/sizing_configs/ (README.md there gives their sources). Expected figures are worked out by hand in the
test (the formula beside them), or are published ones (parameter counts) or printed by vLLM in a real startup log
(the corpus id is named).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvlab.catalog import get_gpu, get_model
from kvlab.catalog.config import load_config_path
from kvlab.catalog.models import FULL_ATTENTION
from kvlab.catalog.quant import from_quantization_config
from kvlab.errors import KvlabError
from kvlab.sizing import (
    SizingConfig,
    cdiv,
    max_num_requests,
    size_kv_cache,
    tensor_parallel_refusal,
    valid_tensor_parallel_sizes,
)

GIB = 2**30
DATA = Path(__file__).parent / "data" / "sizing_configs"
SHARED = Path("/work/shared/data/model-configs")


def given(gpu: str, gib: float, **settings) -> SizingConfig:
    """Settings with vLLM's printed budget: every figure after it is exact arithmetic."""
    return SizingConfig.for_gpu(get_gpu(gpu), available_kv_bytes=round(gib * GIB), **settings)


def rounding_blocks(bytes_per_block: int) -> int:
    """Blocks that the 0.005 GiB rounding of a printed 'Available KV cache memory' can hide."""
    return cdiv(int(0.005 * GIB), bytes_per_block)


# --- dense (MHA) and GQA -------------------------------------------------------------------------------------

def test_dense_mha_opt_13b_pages_blocks_and_tokens():
    r = size_kv_cache(get_model("opt-13b"), given("a100-40gb", 12, max_model_len=2048))
    assert r.page_size_bytes == 2 * 16 * 40 * 128 * 2 == 327_680  # K and V x block x heads x head_dim x fp16
    assert r.bytes_per_block == 40 * 327_680
    assert r.num_blocks == 12 * GIB // (40 * 327_680) == 983
    assert r.num_tokens == int(983 / cdiv(2048, 16) * 2048) == 15_728  # the paper's 15.7K slots


def test_gqa_llama_3_1_8b_heads_split_by_tp_and_weights_exact():
    model = get_model("llama-3.1-8b")
    r = size_kv_cache(model, given("h100-sxm", 20, tensor_parallel_size=2, max_model_len=8192))
    assert r.num_kv_heads_per_gpu == 4 and r.page_size_bytes == 2 * 16 * 4 * 128 * 2
    assert r.num_blocks == 20 * GIB // (32 * 2 * 16 * 4 * 128 * 2)
    # 8,030,261,248 parameters (the published count); bf16, vocab-parallel embedding and lm_head split over TP 2,
    # norms (32 x 2 + 1 of 4,096) replicated.
    assert model.num_params == 8_030_261_248
    norms = (32 * 2 + 1) * 4096
    rope = 131072 * 128 * 2  # the RoPE cos/sin cache, whole on each GPU (kvlab.catalog.rope)
    assert r.weights_bytes == int(((8_030_261_248 - norms) / 2 + norms) * 2) + rope


# --- MLA ----------------------------------------------------------------------------------------------------

def test_mla_deepseek_v2_lite_one_latent_not_split_by_tp():
    r = size_kv_cache(get_model("deepseek-v2-lite"), given("h100-sxm", 10, tensor_parallel_size=2,
                                                          max_model_len=32768))
    assert r.page_size_bytes == 16 * (512 + 64) * 2 == 18_432  # block x (kv_lora_rank + rope dim) x bf16, no K/V pair
    assert r.bytes_per_block == 27 * 18_432
    assert r.num_blocks == 10 * GIB // (27 * 18_432)


def test_mla_down_projections_are_whole_on_every_tp_rank():
    # deepseek_v2.py: q_a_proj and kv_a_proj_with_mqa are ReplicatedLinear (a disable_tp fused pair in 0.32), with
    # their norms; q_b/kv_b/o are split. Kimi-K2-Thinking (7,168 hidden, q_lora 1,536, kv_lora 512 + 64 rope):
    # 7,168 x 1,536 + 1,536 + 7,168 x 576 + 512 = 15,140,864 parameters per layer on each of 8 GPUs, not an eighth.
    kimi = load_config_path(str(DATA / "kimi-k2-thinking.json"))
    assert kimi.layer_params(1).kv_projection == 15_140_864
    config = SizingConfig.for_gpu(get_gpu("h200"), tensor_parallel_size=8, vllm_version="0.11.1", max_model_len=262144)
    r = size_kv_cache(kimi, config)
    # 70.95 GiB: 1.51 GiB more than an eighth of the down-projections; + 262,144 x 64 x 2 B of RoPE cache
    assert r.weights_bytes == 76_182_501_376 + 262144 * 64 * 2
    # The corpus log (8 x H200, TP 8, a 0.11.1 nightly) prints 46.80 GiB and 715,072 tokens; kvlab 46.69 and
    # 713,424 (-0.2%; +0.2% with the MoE caches counted as 3 N + hidden, +3.5% with the projections split)
    assert (r.num_blocks, r.num_tokens) == (44_589, 713_424)


# --- sliding window + full, per vLLM version --------------------------------------------------------------------

def test_gpt_oss_sliding_hybrid_prints_as_each_version_does():
    # Corpus log gpt-oss-120b-4xa100-80gb-ray-0.10.1.1: 4 x A100 80GB, TP 4, max_model_len 16,384, 2,048 batched
    # tokens, 'Available KV cache memory: 45.32 GiB', 'GPU KV cache size: 2,640,144 tokens', 'Maximum concurrency
    # for 16,384 tokens per request: 284.25x'.
    model = get_model("gpt-oss-120b")
    settings = dict(tensor_parallel_size=4, max_model_len=16384, max_num_batched_tokens=2048,
                    gpu_memory_utilization=0.8)
    old = size_kv_cache(model, given("a100-80gb", 45.32, vllm_version="0.10.1.1", **settings))
    assert [(g.spec.kind, len(g.layers)) for g in old.kv_cache_groups] == [("sliding_attention", 18),
                                                                            ("full_attention", 18)]
    assert old.bytes_per_block == 18 * 2 * 16 * 2 * 64 * 2  # 18 layers a group x (K, V) x 16 x 8/4 heads x 64 x bf16
    # 0.10.1: a sliding request holds (128 - 1 + 2,048) tokens' blocks + 1, a full one 16,384 / 16.
    assert old.blocks_per_request == cdiv(128 - 1 + 2048, 16) + 1 + 16384 // 16 == 1161
    assert f"{old.max_concurrency:.2f}" == "284.25"
    assert old.num_tokens == old.num_blocks // 2 * 16  # blocks // groups x block size, as 0.10.1 prints it
    assert abs(old.num_tokens - 2_640_144) <= rounding_blocks(old.bytes_per_block) * 16 // 2
    # The newest rules print int(concurrency x max_model_len) and keep (PP + 1) batches in flight: far more tokens.
    new = size_kv_cache(model, given("a100-80gb", 45.32, **settings))
    assert new.blocks_per_request == cdiv(128 - 1 + 2 * 2048, 16) + 1 + 16384 // 16
    assert new.num_tokens == int(new.num_blocks / new.blocks_per_request * 16384) > 1.5 * old.num_tokens


def test_gemma_2_alternates_sliding_and_full_layers():
    model = get_model("gemma-2-9b")
    r = size_kv_cache(model, given("l40s", 8, max_model_len=8192, max_num_batched_tokens=2048))
    kinds = sorted((g.spec.kind, len(g.layers)) for g in r.kv_cache_groups)
    assert kinds == [("full_attention", 21), ("sliding_attention", 21)]
    assert r.blocks_per_request == cdiv(min(4096 - 1 + 2 * 2048, 8192), 16) + 1 + 8192 // 16


# --- linear attention + attention (Gated DeltaNet) ------------------------------------------------------------

def test_qwen3_next_hybrid_unifies_pages_and_matches_its_log():
    model = get_model(str(DATA / "qwen3-next-80b-a3b-instruct.json"))
    assert model.num_params == 79_674_391_296 and model.num_active_params == 3_874_929_408  # published counts
    # Corpus log qwen3-next-80b-a3b-2xh200-0.10.2: 2 x H200, TP 2, 262,144 tokens, 8,192 batched; 'Available KV
    # cache memory: 44.59 GiB', '973,760 tokens', '14.77x'; the log says vLLM set the attention block to 544.
    r = size_kv_cache(model, given("h200", 44.59, tensor_parallel_size=2, max_model_len=262144,
                                   max_num_batched_tokens=8192, vllm_version="0.10.2"))
    conv = (2 * 16 * 128 + 32 * 128) // 2 * 3  # (2 x key dim + value dim) / TP x (kernel - 1)
    ssm = 32 // 2 * 128 * 128  # value heads / TP x key dim x value dim
    state = (conv + ssm) * 2
    per_token = 2 * 1 * 256 * 2  # K and V x 2 KV heads / TP x head_dim 256 x bf16
    assert r.block_size == 16 * cdiv(state, 16 * per_token) == 544
    assert {g.spec.page_size_bytes for g in r.kv_cache_groups} == {544 * per_token}  # the state padded up to it
    assert sorted(g.spec.kind for g in r.kv_cache_groups) == ["full_attention"] + ["mamba"] * 3
    assert r.blocks_per_request == cdiv(262144, 544) + 3  # one state block in each of the 3 linear groups
    assert r.num_tokens == 973_760 and f"{r.max_concurrency:.2f}" == "14.77"
    assert r.num_blocks == 44.59 * GIB // (12 * 544 * per_token)


# --- MoE ----------------------------------------------------------------------------------------------------

def test_moe_mixtral_weights_count_every_expert_split_by_tp():
    config = json.loads((SHARED / "mixtral-8x7b-v0.1" / "config.json").read_text())
    model = get_model(str(SHARED / "mixtral-8x7b-v0.1" / "config.json"))
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    experts = layers * 8 * 3 * h * inter
    attention = layers * (2 * h * h + 2 * h * 1024)  # q, o and k, v of 8 KV heads x 128
    router, norms, vocab = layers * h * 8, (2 * layers + 1) * h, 2 * 32000 * h
    assert model.num_params == experts + attention + router + norms + vocab == 46_702_792_704
    r = size_kv_cache(model, given("h100-sxm", 10, tensor_parallel_size=2, max_model_len=32768))
    assert r.weights_bytes == int(((experts + attention + vocab) / 2 + router + norms) * 2) + 32768 * 128 * 2  # + RoPE


def test_moe_activation_counts_the_fused_experts_caches_as_vllm_allocates_them():
    """The fused experts' intermediate caches per routed token: max(2 N, hidden) + N, N the expert width per GPU (the
    gate/up and down outputs share one buffer, cache13, in Triton's fused_experts_impl and Marlin's fused_marlin_moe;
    the activated product has its own). Qwen3-235B-A22B FP8 as the held-out log qwen3-235b-fp8-8xl40s-0.10.2 started
    it (TP 8 on L40S with --enable-expert-parallel: each GPU holds 16 whole experts, so N is the whole width; 2,048
    batched tokens, 256 sequences, the PyTorch sampler), which prints 'peak activation 1.40 GiB'."""
    from kvlab.memory_profile import FIT

    model = get_model(str(DATA / "qwen3-235b-a22b-instruct-2507-fp8.json"))
    r = size_kv_cache(model, given("l40s", 10.65, tensor_parallel_size=8, max_model_len=262144, vllm_version="0.10.2",
                                   enable_expert_parallel=True))
    n, hidden, qkv = 1536, 4096, (64 + 2 * 4) * 128 // 8  # expert width (whole under EP), hidden, q/k/v heads per GPU
    forward = 2048 * (2 * hidden + qkv) * 2  # no shared experts: no dense MLP term
    caches = 2048 * 8 * (max(2 * n, hidden) + n) * 2  # top-8: 4,096 + 1,536 values a routed token, not 3 x 1,536 + 4,096
    sampler = 256 * 151_936 * FIT.sampler_bytes_per_logit["pytorch"]
    assert r.activation_bytes == int(FIT.activation_scale["moe"] * (forward + caches) + sampler)
    assert round(r.activation_bytes / GIB, 2) == 1.50  # printed 1.40


def test_fp8_blocks_bound_tensor_parallelism_as_vllm_does():
    """A block-quantized FP8 checkpoint keeps each block's 128 output channels on one GPU (vLLM's
    validate_fp8_block_shape and Fp8MoEMethod.create_weights): Qwen3-235B's experts (1,536 wide) split over 8 GPUs
    leave 192 a rank and vLLM refuses ('The output_size of gate's and up's weight = 192 is not divisible by weight
    quantization block_n = 128', as users report it); expert parallelism keeps the experts whole. DeepSeek-V3's dense
    MLP (18,432) over 32 GPUs leaves 576 ('Weight output_partition_size = 576 ...'), with or without EP."""
    model = get_model(str(DATA / "qwen3-235b-a22b-instruct-2507-fp8.json"))
    assert model.weight_format.block_n == 128
    with pytest.raises(KvlabError, match=r"expert width \(moe_intermediate_size 1536\) of .* over tensor parallel size 8 "
                       r"leaves 192 output channels a rank, not a multiple of its FP8 weight blocks' 128 rows.*"
                       r"--enable-expert-parallel keeps each expert whole.*valid --tensor-parallel-size: 1, 2, 4$"):
        size_kv_cache(model, given("h200", 60, tensor_parallel_size=8))
    assert size_kv_cache(model, given("h200", 60, tensor_parallel_size=8, enable_expert_parallel=True)).num_blocks > 0
    assert valid_tensor_parallel_sizes(model, expert_parallel=True) == [1, 2, 4, 8, 16, 32, 64]
    ds = get_model("deepseek-v3")
    assert tensor_parallel_refusal(ds, 16) is None
    for ep in (False, True):
        assert "MLP width (intermediate_size 18432) of deepseek-v3 over tensor parallel size 32 leaves 576 output " \
            "channels" in tensor_parallel_refusal(ds, 32, expert_parallel=ep)
    bf16 = get_model(str(DATA / "qwen3-30b-a3b-fp8.json"))
    assert tensor_parallel_refusal(bf16, 4) is not None and tensor_parallel_refusal(bf16, 2) is None


# --- multimodal ---------------------------------------------------------------------------------------------

def test_qwen2_5_vl_counts_the_vision_tower_and_matches_its_log():
    model = get_model(str(DATA / "qwen2.5-vl-7b-instruct.json"))
    h, inter, depth = 1280, 3420, 32
    block = 4 * (h * h + h) + 3 * h * inter + 2 * inter + h + 2 * h  # qkv+proj with biases, gated MLP, 2 RMSNorms
    merger = h + (4 * h) ** 2 + 4 * h + 4 * h * 3584 + 3584  # RMSNorm, 5120 -> 5120 -> 3584 with biases
    assert model.vision_params == 3 * 2 * 14 * 14 * h + depth * block + merger == 676_550_144
    assert model.num_params + model.vision_params == 8_292_166_656  # the published 8.29B
    # Corpus log qwen2.5-vl-7b-2xl4-tp2-0.9: 2 x L4, TP 2, 8,192 tokens, 10.04 GiB -> 375,968 tokens, 45.89x.
    r = size_kv_cache(model, given("l4", 10.04, tensor_parallel_size=2, max_model_len=8192, vllm_version="0.9.2"))
    assert abs(r.num_tokens - 375_968) <= rounding_blocks(r.bytes_per_block) * 16
    assert abs(r.max_concurrency - 45.89) < 0.05


def test_qwen_vl_encoder_profiling_run_is_derived_from_the_vision_config():
    """vLLM's profile_run encodes the largest dummy image before the text dummy run and keeps its float32
    pixel_values and outputs through it; the peak is the larger of the encoder run and the text run plus those."""
    from kvlab.memory_profile import encoder_bytes
    from kvlab.sizing import encoder_inputs, profile_family

    model = get_model(str(DATA / "qwen2.5-vl-7b-instruct.json"))
    assert profile_family(model) == "dense"  # the text model's family: the encoder is its own term, not a scale
    config = SizingConfig.for_gpu(get_gpu("l4"), tensor_parallel_size=2, max_model_len=8192, vllm_version="0.9.2")
    e = encoder_inputs(model, config)
    # 12,845,056 max pixels / 14^2 = 65,536 patches (256 x 256), / 2^2 = 16,384 tokens; the budget max(2,048
    # batched tokens, 16,384) holds 1 image; 3 x 2 x 14^2 = 1,176 pixel values per patch; gated MLP 3,420 / TP 2.
    assert (e.items, e.patches_per_item, e.tokens_per_item, e.values_per_patch) == (1, 65536, 16384, 1176)
    assert (e.out_width, e.mlp_width_per_gpu, e.mlp_tensors, e.video_instead) == (3584, 1710, 3, False)
    forward, kept = encoder_bytes(e, 2)
    # pixel_values in the model's dtype (vLLM casts the processor's float32 output), so the tower's cast is no copy
    assert kept == 65536 * 1176 * 2 + 16384 * 3584 * 2
    assert forward == kept + 65536 * (2 * 1280 + 3 * 1710) * 2
    # From scratch against corpus log qwen2.5-vl-7b-2xl4-tp2-0.9 (2 x L4, 0.9.2): 375,968 tokens printed.
    r = size_kv_cache(model, config)
    assert abs(r.num_tokens / 375_968 - 1) < 0.02
    # A batch of 16,384 tokens holds the same one image; at 8,192 x 4 tokens per request vLLM would profile a video.
    long = SizingConfig.for_gpu(get_gpu("l4"), tensor_parallel_size=2, max_model_len=49152, vllm_version="0.9.2")
    assert encoder_inputs(model, long).video_instead
    assert "lower bound" in dict((t.name, t.source) for t in size_kv_cache(model, long).profile_terms)[
        "peak activation"]
    qwen3 = get_model(str(DATA / "qwen3-vl-30b-a3b-instruct.json"))
    e3 = encoder_inputs(qwen3, SizingConfig.for_gpu(get_gpu("rtx-3090"), tensor_parallel_size=4,
                                                    max_model_len=65536, vllm_version="0.10.2"))
    # Before 0.11 (Qwen3-VL's first processing code) kvlab keeps the image and says the video is not derived:
    # 16,777,216 / 16^2 = 65,536 patches; outputs 2,048 wide x (1 + 3 deepstack mergers); 65,536 >= 3 x 16,384
    assert (e3.patches_per_item, e3.tokens_per_item, e3.out_width, e3.video_instead) == (65536, 16384, 8192, True)
    # A CLIP tower's run (LLaVA-NeXT) is not derived: no encoder term, and the text run alone is the estimate.
    llava = get_model(str(DATA / "llava-v1.6-mistral-7b-hf.json"))
    assert llava.vision_params and llava.vision_tower is None


def test_qwen3_vl_video_dummy_of_vllm_0_11_is_derived_from_the_processor_rules():
    """vLLM 0.11 profiles Qwen3-VL's encoder with one dummy video: frames added from 2 while the clip's tokens fit
    max_model_len, at most 24,576; the video processor's pixel cap over the whole clip (25,165,824) shrinks the frames
    to 32 x 32; 12.5 prompt tokens per vision token set the budget. Corpus log qwen3-vl-30b-a3b-4xrtx3090-0.11.0 prints
    'a budget of 153600 tokens, and profiled with 1 video items'."""
    from kvlab.catalog.vision import qwen3_video_dummy, qwen3_video_side
    from kvlab.memory_profile import encoder_bytes
    from kvlab.sizing import encoder_inputs

    qwen3 = get_model(str(DATA / "qwen3-vl-30b-a3b-instruct.json"))
    tower = qwen3.vision_tower
    # 2 frames of the 4,096-pixel image: 2 x 4,096^2 > the cap, scaled by sqrt(4/3) and floored to 32: 3,520.
    assert qwen3_video_side(tower, 2, 4096) == 3520
    # 24,576 frames: scaled by sqrt(24,576 x 4,096^2 / 25,165,824) = 128, to one 32-pixel unit.
    assert qwen3_video_side(tower, 24576, 4096) == 32
    video = qwen3_video_dummy(tower, 65536)
    assert (video.frames, video.side, video.patches, video.tokens, video.budget_tokens) == (
        24576, 32, 12288 * 2 * 2, 12288, 153600)
    # vllm-project/vllm#27992 (Qwen3-VL-8B, same tower, vLLM 0.11, --max-model-len 32768) prints the same budget.
    assert qwen3_video_dummy(tower, 32768).budget_tokens == 153600
    # At a max_model_len below the 2-frame clip's 12,100 tokens the dummy stays at 2 frames of 3,520 pixels.
    short = qwen3_video_dummy(tower, 8192)
    assert (short.frames, short.side, short.patches, short.tokens, short.budget_tokens) == (2, 3520, 48400, 12100,
                                                                                             151250)
    config = SizingConfig.for_gpu(get_gpu("rtx-3090"), tensor_parallel_size=4, max_model_len=65536,
                                  vllm_version="0.11.0")
    e = encoder_inputs(qwen3, config)
    assert (e.modality, e.items, e.budget_tokens, e.frames, e.side) == ("video", 1, 153600, 24576, 32)
    assert (e.patches_per_item, e.tokens_per_item, e.values_per_patch, e.video_instead) == (49152, 12288, 1536, False)
    source = dict((t.name, t.source) for t in size_kv_cache(qwen3, config).profile_terms)["peak activation"]
    assert "1 video of 24,576 frames" in source and "153,600 tokens" in source
    # Without the encoder cache's widening (before 0.11, from 0.13) the outputs are kept as the tower returns them.
    e13 = encoder_inputs(qwen3, SizingConfig.for_gpu(get_gpu("rtx-3090"), tensor_parallel_size=4, max_model_len=65536,
                                                     vllm_version="0.13.0"))
    assert e13.cache_rows == 0
    forward, kept = encoder_bytes(e13, 2)
    assert kept == 49152 * 1536 * 2 + 12288 * 8192 * 2
    assert forward == kept + 49152 * (2 * 1152 + 2 * (4304 // 4)) * 2


def test_encoder_cache_of_vllm_0_11_holds_the_dummy_output_widened_to_the_budget():
    """vLLM 0.11's profile_run copies each dummy encoder output shorter than the encoder budget into zeros of the
    budget's rows (the cache then held scattered embeddings, markers and timestamps included) and keeps those through
    the text dummy run: Qwen3-VL-30B-A3B's video, 12,288 tokens of 2,048 x (1 + 3 deepstack) = 8,192 wide, becomes
    153,600 x 8,192 bf16 = 2.34 GiB on every GPU. Corpus log qwen3-vl-30b-a3b-4xrtx3090-0.11.0 leaves 2.31 GiB."""
    from kvlab.memory_profile import encoder_bytes
    from kvlab.sizing import encoder_inputs
    from kvlab.vllm_rules import encoder_cache_rows

    qwen3 = get_model(str(DATA / "qwen3-vl-30b-a3b-instruct.json"))
    config = SizingConfig.for_gpu(get_gpu("rtx-3090"), tensor_parallel_size=4, max_model_len=65536,
                                  vllm_version="0.11.0")
    e = encoder_inputs(qwen3, config)
    assert (e.cache_rows, e.tokens_per_item, e.out_width, e.items) == (153600, 12288, 8192, 1)
    forward, kept = encoder_bytes(e, 2)
    pixels, outputs, widened = 49152 * 1536 * 2, 12288 * 8192 * 2, 153600 * 8192 * 2
    # and the widening loop's variable keeps the last item's own output alive through the text run
    assert kept == pixels + widened + outputs == 2_868_903_936
    # the tower's run, and the copy, when the outputs and the zeros they are copied into both exist
    assert forward == max(pixels + 49152 * (2 * 1152 + 2 * (4304 // 4)) * 2 + outputs,
                          pixels + outputs + widened) == pixels + outputs + widened
    r = size_kv_cache(qwen3, config)
    assert "widened to 153,600 rows" in dict((t.name, t.source) for t in r.profile_terms)["peak activation"]
    # printed: 2.31 GiB, 6,297 blocks (100,752 tokens); without the widening kvlab had 13,084 blocks
    assert r.num_blocks == 6295 and abs(r.available_kv_bytes / GIB - 2.31) < 0.02  # within 0.4% of the tokens
    # 0.11 widens every item to the whole budget, 0.12 to the item's own length; 0.10 and 0.13 do not widen.
    assert encoder_cache_rows("0.11.2", 65536, 16384) == 65536 and encoder_cache_rows("0.12.0", 65536, 16384) == 16384
    assert encoder_cache_rows("0.10.2", 65536, 16384) == 0 == encoder_cache_rows("0.13.0", 65536, 16384)
    # An image as long as the budget is not widened: Qwen2.5-VL's 16,384-token image with 2,048 batched tokens.
    qwen25 = get_model(str(DATA / "qwen2.5-vl-7b-instruct.json"))
    e25 = encoder_inputs(qwen25, SizingConfig.for_gpu(get_gpu("l4"), tensor_parallel_size=2, max_model_len=8192,
                                                      vllm_version="0.11.0"))
    assert e25.cache_rows == 16384 == e25.tokens_per_item
    assert encoder_bytes(e25, 2)[1] == 65536 * 1176 * 2 + 16384 * 3584 * 2


def test_qwen_vl_load_buffers_count_in_the_weights_vllm_prints():
    """Beside its weights a Qwen-VL model allocates at load, on every GPU, the M-RoPE cos/sin cache (max positions x 4
    for video positions, x the rotary dim, in the model's dtype) and, for Qwen3-VL, one deepstack input buffer of
    max_num_batched_tokens x the text hidden size per deepstack level. Corpus log qwen3-vl-30b-a3b-4xrtx3090-0.11.0
    prints 'Model loading took 14.7708 GiB'."""
    from kvlab.sizing import load_buffer_bytes
    from kvlab.vllm_rules import mrope_positions_factor

    qwen3 = get_model(str(DATA / "qwen3-vl-30b-a3b-instruct.json"))
    config = SizingConfig.for_gpu(get_gpu("rtx-3090"), tensor_parallel_size=4, max_model_len=65536,
                                  vllm_version="0.11.0")
    rope, deepstack = 262144 * 4 * 128 * 2, 3 * 2048 * 2048 * 2
    assert load_buffer_bytes(qwen3, "0.11.0", 2048, 2)[0] == rope + deepstack == 293_601_280
    r = size_kv_cache(qwen3, config)
    weights = dict((t.name, t.bytes) for t in r.profile_terms)["weights"]
    assert weights == qwen3.weights_bytes(2, tensor_parallel_size=4) + rope + deepstack
    assert abs(weights / GIB - 14.7708) < 0.02
    # 0.32's Qwen3-VL enlarges its cache only with video pruning; Qwen2.5-VL keeps the 4 x (and has no deepstack).
    assert mrope_positions_factor("0.32.0", "qwen3_vl_moe") == 1 and mrope_positions_factor("0.11.0", "qwen3_vl") == 4
    assert mrope_positions_factor("0.32.0", "qwen2_5_vl") == 4
    qwen25 = get_model(str(DATA / "qwen2.5-vl-7b-instruct.json"))
    tp2 = SizingConfig.for_gpu(get_gpu("l4"), tensor_parallel_size=2, max_model_len=8192, vllm_version="0.9.2")
    assert load_buffer_bytes(qwen25, "0.9.2", 2048, 2)[0] == 128000 * 4 * 128 * 2
    terms = dict((t.name, t) for t in size_kv_cache(qwen25, tp2).profile_terms)
    assert terms["weights"].bytes == qwen25.weights_bytes(2, tensor_parallel_size=2) + 128000 * 4 * 128 * 2
    assert "M-RoPE cache (128,000 x 4 positions x 128 x 2 B)" in terms["weights"].source
    # A text-only model has only its RoPE cos/sin cache (kvlab.catalog.rope); OPT, learned positions, none.
    rope_only = load_buffer_bytes(get_model(str(DATA / "qwen3-0.6b.json")), "0.9.2", 2048, 2)
    assert rope_only[0] == 40960 * 128 * 2 and "RoPE cos/sin cache (40,960 x 128 x 2 B)" in rope_only[1]
    assert load_buffer_bytes(get_model("opt-13b"), "0.9.2", 2048, 2) == (0, "")


def test_decode_context_parallelism_spreads_a_request_over_the_dcp_ranks():
    """--decode-context-parallel-size D: each GPU keeps every D-th token of a request, so one takes
    cdiv(cdiv(L, D), 16) blocks; vLLM 0.9-0.20 prints num_blocks x 16 x D ('Multiplying the GPU KV cache size by the
    dcp_world_size')."""
    model = get_model(str(DATA / "kimi-k2-thinking.json"))
    settings = dict(tensor_parallel_size=8, max_model_len=262144, vllm_version="0.11.1")
    plain = size_kv_cache(model, given("h200", 46.80, **settings))
    dcp = size_kv_cache(model, given("h200", 46.80, decode_context_parallel_size=8, **settings))
    assert dcp.num_blocks == plain.num_blocks and dcp.num_tokens == 8 * plain.num_tokens
    assert dcp.blocks_per_request == cdiv(cdiv(262144, 8), 16) == 2048 and plain.blocks_per_request == 16384
    assert dcp.max_concurrency == pytest.approx(8 * plain.max_concurrency)
    # Corpus logs kimi-k2-thinking-8xh200-tp8(-dcp8)-0.11.1-nightly, both 46.80 GiB: 715,072 and 5,721,088 tokens.
    slack = rounding_blocks(plain.bytes_per_block) * 16
    assert abs(plain.num_tokens - 715_072) <= slack and abs(dcp.num_tokens - 5_721_088) <= 8 * slack
    with pytest.raises(KvlabError, match="-dcp 3 must divide --tensor-parallel-size 8"):
        SizingConfig(tensor_parallel_size=8, decode_context_parallel_size=3)


# --- quantized layouts --------------------------------------------------------------------------------------

QUANT_CONFIGS = {  # quantization_config as the checkpoints publish them
    "gptq": ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}, 0.5 + 2 / 128),
    "awq": ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
            0.5 + (2 + 0.5) / 128),
    "fp8-block": ({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                   "weight_block_size": [128, 128]}, 1 + 4 / 128 ** 2),
    "int8": ({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}}}}, 1.0),
    "nvfp4": ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, 0.5 + 1 / 16),
    "w4a16": ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}}}},
        0.5 + 2 / 128),
}


@pytest.mark.parametrize("name", QUANT_CONFIGS)
def test_quantized_linear_layers_take_their_format_bytes(tmp_path, name):
    qc, bytes_per_param = QUANT_CONFIGS[name]
    assert from_quantization_config(qc, name).bytes_per_param == pytest.approx(bytes_per_param)
    base = json.loads((SHARED / "mistral-nemo-instruct-2407" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(base, quantization_config=qc)))
    quant, plain = get_model(str(tmp_path)), get_model(str(SHARED / "mistral-nemo-instruct-2407" / "config.json"))
    h, layers, vocab = base["hidden_size"], base["num_hidden_layers"], base["vocab_size"]
    kept = 2 * vocab * h + (2 * layers + 1) * h  # embeddings, lm_head and norms stay bf16
    linear = plain.num_params - kept
    assert quant.weights_bytes(2) == int(linear * bytes_per_param + kept * 2)


def mxfp4_experts(width: int, hidden: int, scales: int, bias_bytes: int, experts: int = 128) -> int:
    """One MoE layer's MXFP4 experts on one GPU: gate_up (2 x width rows of hidden) and down (hidden rows of width)
    at half a byte a value, ``scales`` bytes of scales, a bias per output row."""
    return experts * ((2 * width * hidden + hidden * width) // 2 + scales + (2 * width + hidden) * bias_bytes)


def gpt_oss_bf16_bytes(layers: int, experts: int) -> int:
    """Everything of gpt-oss but the routed experts, bf16 on one GPU: embedding and lm_head (201,088 x 2,880), per
    layer q/k/v (64 + 2 x 8 heads of 64) and o with their biases, 64 sinks, two norms and the router with its bias;
    the final norm."""
    attention = (64 + 16) * 64 * 2880 + (64 + 16) * 64 + 64 * 64 * 2880 + 2880 + 64
    return 2 * (2 * 201088 * 2880 + layers * (attention + 2 * 2880 + experts * 2880 + experts) + 2880)


def test_mxfp4_experts_only_and_laid_out_as_each_vllm_version_holds_them():
    model = get_model("gpt-oss-120b")
    fmt = model.weight_format
    assert fmt.method == "mxfp4" and fmt.scope == "experts" and fmt.bytes_per_param == 4.25 / 8
    # 0.10.1 on an H100 takes Marlin (its torch 2.7.1 is older than triton_kernels' 2.8.0; the log prints Marlin's
    # warning): width 2,880 -> 2,944 (x 128), hidden -> 3,072 (x 256), one byte of scale per 32 values, bf16 biases.
    marlin = mxfp4_experts(2944, 3072, (2 * 2944 * 3072 + 3072 * 2944) // 32, 2)
    # 0.14.1 takes triton_kernels ('Using Triton backend'): width and hidden as they are (2,880 = 45 x 64), float32
    # biases; the loaded scales stay on the layer beside the swizzled copy, whose rows go 5,760 -> 5,888 and
    # 2,880 -> 3,072 (x 256) over 2,880 / 32 = 90 columns.
    triton = mxfp4_experts(2880, 2880, 3 * 2880 * 90 + (5888 + 3072) * 90, 4)
    for version, layer, printed in (("0.10.1", marlin, 65.9651), ("0.14.1", triton, 64.38)):
        r = size_kv_cache(model, given("h100-sxm", 1, max_model_len=8192, vllm_version=version))
        rope = 131072 * 64 * 4  # gpt-oss asks get_rope for a float32 cos/sin cache (YaRN: 4,096 x 32 positions)
        assert r.weights_bytes == gpt_oss_bf16_bytes(36, 128) + 36 * layer + rope
        assert abs(r.weights_bytes / GIB - printed) < 0.1  # 'Model loading took ...' (the corpus logs)
    # gpt-oss-20b's config.json on an A100 with 0.19.0 (Marlin below compute capability 9.0): 13.72 GiB printed.
    small = get_model(str(DATA / "gpt-oss-20b.json"))
    r = size_kv_cache(small, given("a100-80gb", 1, max_model_len=8192, vllm_version="0.19.0"))
    assert r.weights_bytes == gpt_oss_bf16_bytes(24, 32) + 24 * mxfp4_experts(
        2944, 3072, 3 * 2944 * 3072 // 32, 2, experts=32) + rope
    assert abs(r.weights_bytes / GIB - 13.72) < 0.1
    # TP 4 on A100 with 0.10.1: width 720 per GPU -> 768; the rest split as without the layout.
    a100 = size_kv_cache(model, given("a100-80gb", 40, tensor_parallel_size=4, max_model_len=16384,
                                      vllm_version="0.10.1"))
    plain = model.weights_bytes_for(range(36), dtype_bytes=2, tensor_parallel_size=4)
    plain_experts = 36 * 128 * (3 * 2880 * 2880 + 3 * 2880) / 4 * 4.25 / 8  # every expert parameter at 4.25 bits
    assert a100.weights_bytes - plain - rope == pytest.approx(
        36 * mxfp4_experts(768, 3072, 3 * 768 * 3072 // 32, 2) - plain_experts, abs=2)
    assert abs(a100.weights_bytes / GIB - 17.2217) < 0.1  # 'Model loading took 17.2217 GiB' (the corpus log)


def test_quantization_flag_sizes_a_plain_checkpoint_in_that_format():
    model = get_model("llama-3.1-70b")
    plain = size_kv_cache(model, SizingConfig.for_gpu(get_gpu("h100-sxm"), tensor_parallel_size=4,
                                                      max_model_len=8192))
    fp8 = size_kv_cache(model, SizingConfig.for_gpu(get_gpu("h100-sxm"), tensor_parallel_size=4, max_model_len=8192,
                                                    quantization="fp8"))
    assert fp8.weights_bytes < 0.55 * plain.weights_bytes and fp8.num_blocks > plain.num_blocks
    assert "fp8 linear layers" in dict((t.name, t.source) for t in fp8.profile_terms)["weights"]


# --- the memory profile, term by term -----------------------------------------------------------------------

def test_profile_terms_add_up_to_the_budget_and_cuda_graphs_follow_the_version():
    model = get_model("qwen3-8b")
    # deducted from 0.21, by the V1 runner; Qwen3 runs on Model Runner V2 from 0.22, whose estimate is 0 before 0.29
    for version, graphs in (("0.9.2", False), ("0.21.0", True), ("0.28.0", False), ("0.29.0", True)):
        r = size_kv_cache(model, SizingConfig.for_gpu(get_gpu("a100-40gb"), max_model_len=40960,
                                                      vllm_version=version))
        terms = {t.name: t.bytes for t in r.profile_terms}
        assert terms["requested"] == r.requested_memory_bytes == -(-get_gpu("a100-40gb").memory_bytes * 9 // 10)
        assert r.available_kv_bytes == (terms["requested"] - terms["weights"] - terms["peak activation"]
                                        - terms["non-torch"] - terms["CUDA graphs"])
        assert (terms["CUDA graphs"] > 0) == graphs
    eager = size_kv_cache(model, SizingConfig.for_gpu(get_gpu("a100-40gb"), max_model_len=40960,
                                                      vllm_version="0.29.0", enforce_eager=True))
    assert {t.name: t.bytes for t in eager.profile_terms}["CUDA graphs"] == 0


def test_vllm_0_32_captures_graphs_up_to_1024_tokens_on_blackwell_only():
    # config/vllm.py _set_cudagraph_sizes in 0.32: min(2 x max_num_seqs, 1024 on compute capability 10.x else 512);
    # B200's defaults are 1,024 sequences: sizes 1, 2, 4, 8..248 by 8, 256..1,024 by 16 = 83, piecewise and full.
    model = get_model("qwen3-8b")

    def graphs(gpu: str, version: str) -> tuple[int, str]:
        r = size_kv_cache(model, SizingConfig.for_gpu(get_gpu(gpu), vllm_version=version))
        term = next(t for t in r.profile_terms if t.name == "CUDA graphs")
        return term.bytes, term.source

    assert graphs("b200", "0.32.0") == (int(7.05 * 2**20 * 166), "estimate: (83 piecewise + 83 full graphs) x 7.05 MiB "
                                        "(vLLM 0.32.0 profiles and deducts them)")
    assert graphs("b200", "0.21.0")[0] == graphs("h200", "0.32.0")[0] == int(7.05 * 2**20 * 102)  # 51 + 51


# --- bad input ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("settings", "message"), [
    ({"vllm_version": "0.8.5"}, "vLLM version '0.8.5' is not one kvlab knows"),
    ({"vllm_version": "9.0"}, "valid: 0.9.0 to 0.32.x"),
    ({"vllm_version": "latest"}, "is not a version number"),
    ({"quantization": "hqq"}, "weight quantization 'hqq' is not modelled; kvlab knows fp8"),
])
def test_bad_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(KvlabError, match=message) as err:
        SizingConfig(gpu_memory_bytes=40 * GIB, **settings)
    assert "\n" not in str(err.value)


def test_an_unknown_quantization_method_in_config_json_is_refused(tmp_path):
    base = json.loads((SHARED / "yi-34b" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(base, quantization_config={"quant_method": "quip"})))
    with pytest.raises(KvlabError, match="'quip' is not modelled"):
        get_model(str(tmp_path))
    # not an object at all (it was ignored: the checkpoint sized as 16-bit without a word)
    (tmp_path / "config.json").write_text(json.dumps(dict(base, quantization_config="fp8")))
    with pytest.raises(KvlabError, match="quantization_config is str 'fp8'; valid: an object with its quant_method"):
        get_model(str(tmp_path))


def test_cli_names_the_bad_value_in_one_line(kvlab):
    for args, message in ((("--vllm-version", "0.7.3"), "0.7.3"), (("--quantization", "hqq"), "hqq"),
                          (("--gpu", "h100"), "H100-SXM and H100-PCIe"), (("--model-runner", "v0"), "v0")):
        result = kvlab("size", "llama-3.1-8b", *(("--gpu", "h100-sxm") if args[0] != "--gpu" else ()), *args)
        output = result.stdout + result.stderr
        assert result.exit_code != 0 and message in output and "Traceback" not in output


def test_cli_prints_each_term_with_its_source_and_the_rules_applied(kvlab):
    out = " ".join(kvlab("size", "qwen3-8b", "--gpu", "a100-40gb", "--vllm-version", "0.10.1").stdout.split())
    assert "vLLM 0.10.1's rules (those of 0.9.0 on" in out
    for label in ("Weights per GPU", "GPU memory requested", "Peak activation", "Non-torch memory", "CUDA graphs"):
        assert label in out
    assert "not deducted by vLLM 0.10.1" in out and "the total CUDA's device query reports" in out


def test_dtype_fp8_is_sized_as_fp8_weights_and_says_so(kvlab):
    args = ("size", "llama-3.1-70b", "--gpu", "h100-sxm", "-tp", "2", "--json")
    dtype, quant = kvlab(*args, "--dtype", "fp8").json(), kvlab(*args, "--quantization", "fp8").json()
    assert dtype["weights_bytes"] == quant["weights_bytes"] and dtype["num_blocks"] == quant["num_blocks"]
    assert dtype["dtype"] == "bfloat16"  # activations stay in the checkpoint's dtype
    note = kvlab(*args[:-1], "--dtype", "fp8").stderr
    assert "--quantization fp8" in " ".join(note.split())


# --- configs added for the startup-log corpus (tests/data/sizing_configs/README.md) ------------------------------

def test_qwen3_vl_counts_its_vision_tower_with_the_deepstack_mergers():
    model = get_model(str(DATA / "qwen3-vl-30b-a3b-instruct.json"))
    h, inter, depth, merged, out = 1152, 4304, 27, 4 * 1152, 2048
    embed = 3 * 2 * 16 * 16 * h + h + 2304 * h  # biased 3-D patch convolution, learned positions
    block = 4 * (h * h + h) + 2 * h * inter + inter + h + 4 * h  # qkv+proj with biases, 2-matrix MLP, 2 LayerNorms
    linears = merged * merged + merged + merged * out + out
    mergers = (2 * h + linears) + 3 * (2 * merged + linears)  # the merger, and 3 deepstack ones normed after shuffle
    assert model.vision_params == embed + depth * block + mergers == 538_631_408
    assert model.num_params == 30_532_110_336 and model.is_moe  # the text model: Qwen3-30B-A3B's
    # 48 layers x 4 KV heads x 128 x K,V x bf16 per token; TP 4 leaves one KV head per GPU
    r = size_kv_cache(model, given("rtx-3090", 2.31, tensor_parallel_size=4, max_model_len=65536,
                                   vllm_version="0.11.0"))
    assert r.kv_bytes_per_token == 48 * 4 * 128 * 2 * 2 and r.num_kv_heads_per_gpu == 1
    # corpus log qwen3-vl-30b-a3b-4xrtx3090-0.11.0: 2.31 GiB -> 100,752 tokens, 1.54x
    assert abs(r.num_tokens - 100_752) <= rounding_blocks(r.bytes_per_block) * 16
    assert abs(r.max_concurrency - 1.54) < 0.01


def test_a_dense_granite_4_is_not_refused_for_its_zero_experts():
    model = get_model(str(DATA / "granite-4.0-micro.json"))
    assert not model.is_moe and model.state is None and model.num_experts is None
    assert model.num_params == 3_402_836_480  # the published 3.4 B
    # corpus log granite-4.0-micro-fp8-l40s-0.11.0: FP8 weights, 35.34 GiB -> 463,136 tokens at 131,072 tokens
    r = size_kv_cache(model, given("l40s", 35.34, quantization="fp8", max_model_len=131072, vllm_version="0.11.0"))
    assert r.kv_bytes_per_token == 40 * 8 * 64 * 2 * 2
    assert abs(r.num_tokens - 463_136) <= rounding_blocks(r.bytes_per_block) * 16


def test_seed_oss_dense_gqa_matches_its_log():
    model = get_model(str(DATA / "seed-oss-36b-instruct.json"))
    # 36,151,104,512 published; kvlab leaves out the q/k/v biases (64 layers x 12,288)
    assert model.num_params == 36_151_104_512 - 64 * 12_288
    r = size_kv_cache(model, SizingConfig.for_gpu(get_gpu("a100-80gb"), tensor_parallel_size=2, max_model_len=65536,
                                                  vllm_version="0.11.2"))
    assert r.num_kv_heads_per_gpu == 4 and r.page_size_bytes == 2 * 16 * 4 * 128 * 2
    # from scratch (no printed budget): the corpus log printed 290,448 tokens, 4.43x
    assert abs(r.num_tokens / 290_448 - 1) < 0.02 and abs(r.max_concurrency / 4.43 - 1) < 0.02


def test_int4_marlin_checkpoints_take_their_fitted_activation_scale():
    from kvlab.memory_profile import FIT
    from kvlab.sizing import profile_family

    awq = get_model(str(DATA / "qwen3-14b-awq.json"))
    assert profile_family(awq) == "int4" and FIT.activation_scale["int4"] > 1
    assert profile_family(get_model("llama-3.1-8b")) == "dense"
    assert profile_family(get_model("llama-3.1-8b"), "gptq") == "int4"
    assert profile_family(get_model("llama-3.1-8b"), "fp8") == "dense"
    plain = size_kv_cache(get_model("llama-3.1-8b"), SizingConfig.for_gpu(get_gpu("l40s")))
    marlin = size_kv_cache(get_model("llama-3.1-8b"), SizingConfig.for_gpu(get_gpu("l40s"), quantization="awq"))
    assert marlin.activation_bytes > plain.activation_bytes


def test_model_runner_v2_penalty_state_counts_as_consumed_from_vllm_0_27():
    # From 0.27 vLLM takes what is not cache as the fall in free memory since the worker's first snapshot
    # (mem_utils.memory_profiling's total_consumed; 0.26 added weights, the profiling run's torch peak increase and the
    # non-torch increase). Model Runner V2's sampler allocates its penalty state after that snapshot, at load
    # (v1/worker/gpu/sample/penalties.py): max_num_seqs x vocab int32 counts + max_num_seqs x ceil(vocab / 32) int32
    # words of prompt bits. Qwen3-14B-AWQ (quantized Qwen3 on V2 from 0.24) on an L40S: 256 sequences (vLLM's
    # default below 70 GiB) x 151,936 x 4 = 155,582,464 + 256 x 4,748 x 4 = 4,861,952 bytes.
    model = get_model(str(DATA / "qwen3-14b-awq.json"))

    def profile(version: str, **settings):
        r = size_kv_cache(model, SizingConfig.for_gpu(get_gpu("l40s"), vllm_version=version, **settings))
        return {t.name: t for t in r.profile_terms}, r.available_kv_bytes

    # With it the grammar bitmask of its structured outputs (v1/worker/gpu/structured_outputs.py): 256 rows x 4,748
    # int32 words = 4,861,952 bytes.
    (after, kv_after), (before, kv_before) = profile("0.28.0"), profile("0.26.0")
    assert after["non-torch"].bytes - before["non-torch"].bytes == 160_444_416 + 4_861_952
    assert kv_before - kv_after == 160_444_416 + 4_861_952
    assert "penalty state (256 requests x 151,936 vocab" in after["non-torch"].source
    assert "grammar bitmask (256 rows x cdiv(151,936, 32) x 4 B)" in after["non-torch"].source
    assert profile("0.28.0", model_runner="v1")[0]["non-torch"].bytes == before["non-torch"].bytes
    assert profile("0.28.0", max_num_seqs=8)[0]["non-torch"].bytes - before["non-torch"].bytes == 8 * (
        151936 + 2 * 4748) * 4


def test_model_runner_v2_deducts_no_cuda_graph_estimate_before_vllm_0_29():
    """Up to 0.28 Model Runner V2's profile_cudagraph_memory returns 0 (read in 0.22.0's to 0.28.0's source), so
    vLLM deducts nothing for its graphs; 0.29.0's measures them. Corpus log qwen2.5-0.5b-rtx4090-wsl2-0.27.1 (a dense
    model, on V2 from 0.25): 'Free memory on device (22.45/23.99 GiB)', utilization (0.92, 22.07 GiB), 1.23 GiB
    consumed, 0.31 GiB peak activation (the estimate included) and 0.0 GiB for CUDA graphs: 'Available KV cache memory:
    20.52 GiB', 1,793,232 tokens."""
    card = replace(get_gpu("rtx-4090"), memory_bytes=round(23.99 * GIB))  # WSL2 reports the whole 24 GiB
    model = get_model("Qwen2.5-0.5B")

    def sized(version: str, **settings):
        return size_kv_cache(model, SizingConfig.for_gpu(card, gpu_memory_utilization=0.92, max_model_len=2048,
                                                         max_num_batched_tokens=8192, dtype="float16",
                                                         vllm_version=version, **settings))

    r = sized("0.27.1")
    graphs = {t.name: t for t in r.profile_terms}["CUDA graphs"]
    assert r.model_runner is None and graphs.bytes == 0 and "Model Runner V2" in graphs.source
    assert abs(r.available_kv_bytes / GIB - 20.52) < 0.2 and abs(r.num_tokens / 1_793_232 - 1) < 0.01
    # the V1 runner of the same release, and V2 from 0.29.0, deduct their estimate
    for other in (sized("0.27.1", model_runner="v1"), sized("0.29.0")):
        assert {t.name: t for t in other.profile_terms}["CUDA graphs"].bytes > 0
    # and 0.26.0, whose V2 runner returns 0 too (a dense model runs on V2 from 0.25)
    assert {t.name: t for t in sized("0.26.0").profile_terms}["CUDA graphs"].bytes == 0


def test_qwen3_32b_tp2_on_rtx_pro_6000_matches_its_log_without_a_graph_estimate():
    """Corpus log qwen3-32b-2xrtxpro6000-tp2-util0.426-0.27.1: 'Model loading took 30.59 GiB', 'Available KV cache
    memory: 8.22 GiB', 67,296 tokens, 2.05x at 32,768. Qwen3 dense runs on Model Runner V2 (0.27.1), which deducts no
    CUDA-graph estimate; with one (the V1 runner's 0.70 GiB) kvlab was 8.8% short. Its activation is the forward's
    0.82 GiB, above V2's sampler run (0.81 GiB: no float32 copy of the logits in 0.27.1's dummy run). kvlab's weights
    are 0.07 GiB under the printed 30.59, which is why its available memory is 0.09 GiB over (+1.1% of tokens); at
    the printed weights the rest of the budget (activation and non-torch) leaves the printed 8.22 GiB to 0.02."""
    r = size_kv_cache(get_model("qwen3-32b"), SizingConfig.for_gpu(
        get_gpu("RTX-PRO-6000-Server"), gpu_memory_utilization=0.426, tensor_parallel_size=2, max_model_len=32768,
        vllm_version="0.27.1"))
    terms = {t.name: t.bytes for t in r.profile_terms}
    assert terms["CUDA graphs"] == 0
    assert terms["peak activation"] == 8192 * (2 * 5120 + 3 * 12800 + 5120) * 2
    assert 0.06 < 30.59 - r.weights_bytes / GIB < 0.08
    assert abs((terms["requested"] - 30.59 * GIB - terms["peak activation"] - terms["non-torch"]) / GIB - 8.22) < 0.03
    assert abs(r.num_tokens / 67_296 - 1) < 0.012 and abs(r.max_concurrency - 2.05) < 0.03


def test_mamba2_hybrid_granite_4_h_1b_matches_its_log():
    """Corpus log granite-4.0-h-1b-util0.6-eager-0.19.0 (vLLM 0.19.0, max_model_len 4,096): 'Setting attention block
    size to 400 tokens', 'Padding mamba page size by 1.59%', 4.09 GiB -> 53,200 tokens, 66.95x, 'Model loading took
    2.72 GiB'. The GPU is not named, so the budget is the printed one."""
    model = get_model(str(DATA / "granite-4.0-h-1b.json"))
    assert model.state.kind == "mamba2" and model.layer_types.count(FULL_ATTENTION) == 4
    # one request's state per Mamba layer: conv (4 - 1) x (3,072 + 2 x 128) + SSM 48 x 64 x 128, bf16
    state = model.state.state_bytes(1, 2)
    assert state == (3 * 3328 + 48 * 64 * 128) * 2 == 806_400
    r = size_kv_cache(model, given("rtx-4090", 4.09, max_model_len=4096, max_num_seqs=2, enforce_eager=True,
                                   vllm_version="0.19.0"))
    # the attention block grows to a multiple of 16 whose page (x 4 KV heads x 128 x K,V x bf16) holds the state
    assert r.block_size == 400 and r.page_size_bytes == 400 * 2 * 4 * 128 * 2 == 819_200
    assert round((r.page_size_bytes / state - 1) * 100, 2) == 1.59  # the log's padding
    # 4 attention layers and 36 Mamba layers in 10 groups of 4 sharing each block; vLLM had 1,339 blocks
    # (66.95 x (11 attention blocks + 9 state blocks) per request), within the printed GiB's rounding
    assert abs(r.num_blocks - 1339) <= rounding_blocks(4 * r.page_size_bytes)
    assert 1339 // 10 * 400 == 53_200 and round(1339 / (cdiv(4096, 400) + 9), 2) == 66.95
    assert abs(r.num_tokens - 53_200) <= 400 and abs(r.max_concurrency - 66.95) < 0.1
    assert abs(r.weights_bytes / GIB - 2.72) < 0.01


def test_nemotron_h_nano_4b_counts_its_published_parameters_and_matches_its_log():
    """Nemotron-H's MLP is ReLU^2 over up_proj and down_proj (vLLM's NemotronHMLP), no gate. Corpus log
    nemotron-3-nano-4b-fp8-gb10-util0.15-0.13.0nv (vLLM 0.13.0, fp8 KV, max_model_len 8,192): 'Setting attention block
    size to 992 tokens', 'Padding mamba page size by 0.35%', 'Add 3 padding layers', 11.15 GiB -> 208,320 tokens, 98.20x."""
    model = get_model(str(DATA / "nemotron-3-nano-4b.json"))
    assert model.num_params == 3_973_556_832  # the published count of nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16
    assert model.layer_types.count(FULL_ATTENTION) == 4 and model.layer_types.count("mamba") == 21
    # one request's state per Mamba layer: conv (4 - 1) x (96 x 80 + 2 x 8 x 128) + SSM 96 x 80 x 128, 16 bit
    state = model.state.state_bytes(1, 2)
    assert state == (3 * 9728 + 96 * 80 * 128) * 2 == 2_024_448
    r = size_kv_cache(model, given("gb10", 11.15, kv_cache_dtype="fp8", max_model_len=8192,
                                   max_num_batched_tokens=2048, vllm_version="0.13.0"))
    assert r.block_size == 992 and r.page_size_bytes == 992 * 2 * 8 * 128 * 1 == 2_031_616
    assert round((r.page_size_bytes / state - 1) * 100, 2) == 0.35  # the log's padding
    # 4 attention layers and 21 Mamba layers (+ 3 padding) in 7 groups of 4 sharing each block: 1,473 blocks of
    # 4 pages, 208,320 tokens = 1,473 // 7 x 992
    assert r.bytes_per_block == 4 * 2_031_616 and r.num_blocks == 1473 and 1473 // 7 * 992 == 208_320
    assert r.num_tokens == 208_320 and round(r.max_concurrency, 2) == 98.20


def test_the_reverse_questions_keep_the_decode_context_parallel_size():
    """settings_of carries DCP, so a run's sizing asks the reverse questions with the DCP it was sized with; the TP
    sizes tried are multiples of it."""
    from kvlab.sizing import settings_of, valid_tensor_parallel_sizes

    model = get_model("deepseek-v2-lite")
    config = SizingConfig(available_kv_bytes=2**30, tensor_parallel_size=2, decode_context_parallel_size=2,
                          max_model_len=4096)
    result = size_kv_cache(model, config)
    assert settings_of(result).decode_context_parallel_size == 2
    assert max_num_requests(model, settings_of(result), 4096) == (result.num_blocks - 1) // 128 == 16
    assert valid_tensor_parallel_sizes(model, 2) == [2, 4, 8, 16] and valid_tensor_parallel_sizes(model)[0] == 1


def test_model_runner_v2_is_picked_by_version_architecture_and_quantization():
    from kvlab.vllm_rules import model_runner

    qwen3, llama, mixtral = ("Qwen3ForCausalLM", False, False), ("LlamaForCausalLM", False, False), \
        ("MixtralForCausalLM", True, False)
    assert [model_runner(v, *qwen3, False) for v in ("0.21.0", "0.22.0", "0.28.0")] == ["v1", "v2", "v2"]
    assert [model_runner(v, *llama, False) for v in ("0.22.0", "0.23.0")] == ["v1", "v2"]
    assert model_runner("0.23.0", *qwen3, True) == "v1" and model_runner("0.24.0", *qwen3, True) == "v2"
    assert model_runner("0.24.0", "OPTForCausalLM", False, False, False) == "v1"
    assert model_runner("0.25.0", "OPTForCausalLM", False, False, False) == "v2"  # every dense model
    assert [model_runner(v, *mixtral, False) for v in ("0.25.0", "0.28.0", "0.29.0")] == ["v1", "v1", "v2"]
    assert model_runner("0.25.0", "Qwen2MoeForCausalLM", True, False, False) == "v2"  # on the allowlist
    assert model_runner("0.28.0", "Qwen3NextForCausalLM", True, True, False) == "v1"  # hybrid
    assert model_runner(None, "Qwen3NextForCausalLM", True, True, False) == "v2"


def test_model_runner_v2_profiles_the_sampler_without_top_k_top_p():
    """Qwen3-14B on an L40S with vLLM 0.28.0 (the corpus log: 11.57 GiB, 75,824 tokens): bf16, 2,048 batched tokens,
    256 sequences. V2's dummy requests were never added to its sampler's states (temperature 0, no penalty, bias or
    top-k/top-p: needs_logits_processing is False), so apply_sampling_params returns the LM head's bf16 logits with no
    float32 copy; the run holds the forward's hidden states, the 256 rows gathered for the LM head, the logits and
    the Gumbel-max kernel's partials (an int64 index and a float32 value per 1,024-column block, then the winning
    block and the sampled token, int64 each). The forward's peak is larger, so it is the activation. The V1 runner adds FlashInfer's fitted 7.1 B a logit to the forward."""
    model = get_model("qwen3-14b")
    forward = 2048 * (2 * 5120 + 3 * 17408 + (40 + 2 * 8) * 128) * 2
    assert forward == 285_212_672
    v2_sampler = (2048 + 256) * 5120 * 2 + 256 * 151_936 * 2 + 256 * (149 * 12 + 16)
    assert v2_sampler == 101_846_016 < forward

    def activation(**settings):
        r = size_kv_cache(model, SizingConfig.for_gpu(get_gpu("l40s"), max_model_len=40960, vllm_version="0.28.0",
                                                      **settings))
        return {t.name: t for t in r.profile_terms}["peak activation"], r

    v2, r2 = activation()
    assert v2.bytes == forward and "Model Runner V2's sampler run" in v2.source
    v1, r1 = activation(model_runner="v1")
    assert v1.bytes == int(forward + 256 * 151_936 * 7.1) == 561_371_545
    # V2 also keeps its penalty state and grammar bitmask, which 0.27 on counts
    # (test_model_runner_v2_penalty_state_counts_as_consumed...), and deducts no CUDA-graph estimate before 0.29, where V1 deducts 7.05 MiB x (51 piecewise + 35 full graphs)
    graphs_v1 = {t.name: t for t in r1.profile_terms}["CUDA graphs"].bytes
    assert graphs_v1 == int(7.05 * 2**20 * 86)
    assert r2.available_kv_bytes - r1.available_kv_bytes == (v1.bytes - v2.bytes - 256 * (151_936 + 2 * 4_748) * 4
                                                             + graphs_v1)
    # printed: 75,824 (these at 0.9, +3.5%; at 0.28.0's own default, 0.92, +11.1%: its unmodelled note)
    assert (r1.num_tokens, r2.num_tokens) == (73_888, 78_448)
    # a small model with a large vocabulary: the sampler run is the peak (Qwen3-0.6B, the same settings)
    small = size_kv_cache(load_config_path(str(DATA / "qwen3-0.6b.json")),
                          SizingConfig.for_gpu(get_gpu("l40s"), max_model_len=40960, vllm_version="0.28.0"))
    peak = {t.name: t for t in small.profile_terms}["peak activation"]
    assert peak.bytes == (2048 + 256) * 1024 * 2 + 256 * 151_936 * 2 + 256 * (149 * 12 + 16) == 82_971_648
    assert peak.source.startswith("estimate: Model Runner V2's sampler run")
    assert "no float32 copy" in peak.source
    with pytest.raises(KvlabError, match="--model-runner 'v3' is not a vLLM GPU model runner; valid: v1, v2"):
        SizingConfig(model_runner="v3")


def test_model_runner_v2_sampler_run_all_gathers_the_logits_over_tp():
    """With TP > 1 compute_logits all-gathers each GPU's vocabulary shard (the device communicator's all_gather: an
    output buffer, then a reshape of its movedim view, which copies), so the shard and two whole copies are alive at
    once; the buffer and the shard are freed before the sampler's Gumbel-max partials exist, so those are not added.
    Qwen3-0.6B at TP 2 on L40S, vLLM 0.28.0 (2,048 tokens, 256 sequences): the shard is 75,968 columns."""
    from kvlab.memory_profile import ProfileInputs, v2_sampler_run_bytes

    x = ProfileInputs(hidden_size=1024, mlp_width_per_gpu=1536, qkv_width_per_gpu=2048, vocab_size=151_936,
                      num_layers=28, act_dtype_bytes=2, max_num_batched_tokens=2048, max_num_seqs=256,
                      tensor_parallel_size=2, last_stage=True, model_runner="v2")
    size, words = v2_sampler_run_bytes(x, 256)
    assert size == (2048 + 256) * 1024 * 2 + 256 * 151_936 * 2 * 2 + 256 * 75_968 * 2 == 199_196_672
    assert "a second copy and the 75,968-column shard while all-gathered over TP 2" in words
    assert v2_sampler_run_bytes(replace(x, tensor_parallel_size=1), 256)[0] == 82_971_648
    # the LM head's output is the vocabulary padded to a multiple of 64 (pad_vocab_size); the sampler's blocks
    # cover the unpadded columns: 32,001 -> 32,064 columns of logits, 32 blocks
    odd = replace(x, vocab_size=32_001, tensor_parallel_size=1)
    assert v2_sampler_run_bytes(odd, 256)[0] == (2048 + 256) * 1024 * 2 + 256 * 32_064 * 2 + 256 * (32 * 12 + 16)


def test_model_runner_v2_sampler_run_copies_the_logits_to_float32_up_to_0_25():
    """0.22.0's and 0.25.0's apply_sampling_params copy the logits to float32 before anything else, whatever the
    requests set; 0.26.0 applies the sampling parameters in place and 0.27 on copies only for requests that need it.
    Qwen3-0.6B on an L40S (V2 from 0.22 for Qwen3 dense): at 0.25.0 the float32 copy (256 x 151,936 x 4 B) is held
    with the bf16 logits and the Gumbel-max partials; at TP 2 it outweighs the all-gather's second copy and shard."""
    from kvlab.memory_profile import ProfileInputs, v2_sampler_run_bytes

    def peak(version):
        r = size_kv_cache(load_config_path(str(DATA / "qwen3-0.6b.json")),
                          SizingConfig.for_gpu(get_gpu("l40s"), max_model_len=40960, vllm_version=version))
        return {t.name: t for t in r.profile_terms}["peak activation"]

    old, new = peak("0.25.0"), peak("0.26.0")
    assert new.bytes == 82_971_648 and "no float32 copy" in new.source
    assert old.bytes == 82_971_648 + 256 * 151_936 * 4 == 238_554_112
    assert "their float32 copy (256 x 151,936 x 4 B)" in old.source
    x = ProfileInputs(hidden_size=1024, mlp_width_per_gpu=1536, qkv_width_per_gpu=2048, vocab_size=151_936,
                      num_layers=28, act_dtype_bytes=2, max_num_batched_tokens=2048, max_num_seqs=256,
                      tensor_parallel_size=2, last_stage=True, model_runner="v2", v2_float32_copy=True)
    assert v2_sampler_run_bytes(x, 256)[0] == 238_554_112


def test_cli_model_runner_is_vllm_use_v2_model_runner(kvlab):
    """Llama-3.1-8B on an H100-SXM at the newest rules (8,192 tokens, 1,024 sequences): on V2 the forward's 0.875 GiB
    is the peak; VLLM_USE_V2_MODEL_RUNNER=0 brings back the V1 runner's FlashInfer sampler, 1,024 x 128,256 x 7.1 B."""
    v2 = kvlab("size", "llama-3.1-8b", "--gpu", "h100-sxm", "--json").json()
    v1 = kvlab("size", "llama-3.1-8b", "--gpu", "h100-sxm", "--model-runner", "v1", "--json").json()
    assert v2["activation_bytes"] == 8192 * (2 * 4096 + 3 * 14336 + 48 * 128) * 2 == 939_524_096
    assert v1["activation_bytes"] == int(939_524_096 + 1024 * 128_256 * 7.1)
    # V2 keeps 1,024 x (128,256 + 4,008) x 4 B = 0.50 GiB of penalty state and 1,024 x 4,008 x 4 B of grammar bitmask
    # (from 0.27, counted)
    assert v2["non_torch_bytes"] - v1["non_torch_bytes"] == 1024 * (128_256 + 2 * 4_008) * 4 == 558_170_112
    assert (v1["num_blocks"], v2["num_blocks"]) == (27_491, 27_670)


def test_gemma_4_e2b_shared_layers_keep_no_cache_and_its_log_is_exact():
    """Gemma 4 E2B: 35 layers, 4 sliding (1 KV head of 256, window 512) : 1 full (1 KV head of 512); the last 20 read
    the cache of the last earlier layer of their type and keep none (vLLM gives them no KVCacheSpec)."""
    model = get_model(str(DATA / "gemma-4-e2b-it.json"))
    assert model.kv_cache_layers == tuple(range(15))
    assert [model.kv_sharing_target(i) for i in (14, 15, 19, 34)] == [None, 13, 14, 14]
    assert model.kv_bytes_per_token(2) == (12 * 2 * 1 * 256 + 3 * 2 * 1 * 512) * 2
    # Corpus log gemma-4-e2b-qat-w4a16-t4-0.29.0: T4, float16, max_model_len 16,384, max_num_seqs 8, default 2,048
    # batched tokens; 'Available KV cache memory: 4.66 GiB', 'GPU KV cache size: 519,681 tokens, Maximum concurrency
    # for 16,384 tokens per request: 31.72x'.
    settings = dict(dtype="float16", max_model_len=16384, max_num_seqs=8, vllm_version="0.29.0")
    r = size_kv_cache(model, given("t4", 4.66, **settings))
    # A full page, 1 head x 16 tokens x (K 512 + V 512) x 2 bytes, is twice a sliding one: the sliding layers take
    # blocks of 32 tokens (unify_kv_cache_spec_page_size); 12 sliding : 3 full layers -> 4 + 1 groups of 3.
    page = 1 * 16 * (512 + 512) * 2
    assert [(g.spec.kind, g.spec.block_size, g.layers) for g in r.kv_cache_groups] == [
        ("sliding_attention", 32, (0, 5, 10)), ("sliding_attention", 32, (1, 6, 11)),
        ("sliding_attention", 32, (2, 7, 12)), ("sliding_attention", 32, (3, 8, 13)),
        ("full_attention", 16, (4, 9, 14))]
    assert page == 1 * 32 * (256 + 256) * 2 and {g.spec.page_size_bytes for g in r.kv_cache_groups} == {page}
    assert r.bytes_per_block == 3 * page == 98_304
    # a sliding group: (512 - 1 + 2 batches of 2,048) tokens' blocks of 32, + 1; the full group 16,384 / 16
    assert r.blocks_per_request == 4 * (cdiv(512 - 1 + 2 * 2048, 32) + 1) + 16384 // 16 == 1604
    assert abs(r.num_blocks - 50_877) <= rounding_blocks(r.bytes_per_block)
    exact = size_kv_cache(model, given("t4", 50_877 * 98_304 / GIB, **settings))
    assert exact.num_tokens == 519_681 and f"{exact.max_concurrency:.2f}" == "31.72"  # as printed
    assert exact.vllm_log_lines[0] == "Available KV cache memory: 4.66 GiB"


def test_gemma_4_e2b_counts_its_vision_and_audio_towers_against_the_checkpoint():
    """Gemma4ForConditionalGeneration (vLLM gemma4_mm.py) builds transformers' Gemma4VisionModel and Gemma4AudioModel
    and one bias-free projection each into the text width; every tensor's shape from config.json."""
    from kvlab.catalog.vision import ple_staging

    config = json.loads((DATA / "gemma-4-e2b-it.json").read_text())
    model = get_model(str(DATA / "gemma-4-e2b-it.json"))
    h, inter, head = 768, 3072, 64  # vision: 16 layers, 12 heads (and 12 KV heads) of 64
    vision = 3 * 16 * 16 * h + 2 * 10240 * h  # patch projection, 2 x 10,240 position rows
    vision += 16 * (4 * h * 12 * head + 2 * head + 3 * h * inter + 4 * h)  # q/k/v/o, q/k norms, gated MLP, 4 norms
    a = 1024  # audio: 12 conformer layers
    front = 1 * 128 * 9 + 128 + 128 * 32 * 9 + 32 + (128 // 4) * 32 * a  # two 3x3 convolutions with norms, input proj
    layer = 2 * (8 * a * a + 2 * a) + (5 * a * a + a // 8) + (3 * a * a + 5 * a + 2 * a) + 3 * a  # FFW x2, attn, conv
    audio = front + 12 * layer + a * 1536 + 1536  # output_proj with its bias
    projections = h * 1536 + 1536 * 1536  # embed_vision, embed_audio (from output_proj_dims)
    assert (vision, audio, projections) == (167_364_608, 304_824_608, 3_538_944)
    assert model.vision_params == vision + audio + projections == 475_728_160
    assert "vision and audio towers" in model.vision_source
    # google/gemma-4-E2B-it's model.safetensors is 10,246,621,918 B: 2 B x every parameter leaves 266,398 B for the
    # header and buffers (clip bounds, layer scalars), and kvlab's bf16 weights are the file's bytes to 0.003%
    assert model.weights_bytes(2) == 2 * (model.num_params + model.vision_params) == 10_246_355_520
    assert 0 < 10_246_621_918 - model.weights_bytes(2) < 300_000
    # vLLM builds the towers from transformers' modules, whole on every tensor-parallel rank
    split = replace(model, vision_whole=False)
    assert model.weights_bytes(2, tensor_parallel_size=2) - split.weights_bytes(2, tensor_parallel_size=2) == (
        model.vision_params)  # 2 B x the half that splitting would leave off each rank
    no_audio = dict(config, audio_config=None)
    assert get_model_from(no_audio).vision_params == vision + h * 1536
    # the PLE staging buffer: 2,048 batched tokens x 35 layers x 256 x 2 B
    staging = ple_staging(config)
    assert staging is not None and staging.bytes(2048, 2) == 2048 * 35 * 256 * 2 == 36_700_160
    # "Model loading took 9.8 GiB" (the bf16 start on a T4, vLLM 0.29.0, the corpus): the weights, the RoPE caches of
    # the sliding (256 wide) and full layers (512: proportional RoPE rotates the whole head), and the staging buffer
    t4 = SizingConfig.for_gpu(get_gpu("t4"), dtype="float16", max_model_len=16384, max_num_seqs=8, vllm_version="0.29.0")
    weights = {t.name: t for t in size_kv_cache(model, t4).profile_terms}["weights"]
    assert weights.bytes == 10_246_355_520 + 131072 * (256 + 512) * 2 + 36_700_160
    assert "RoPE cos/sin caches (131,072 x 256 + 131,072 x 512 x 2 B)" in weights.source
    assert "per-layer-embedding staging buffer (2,048 batched tokens x 35 layers x 256 x 2 B)" in weights.source
    assert abs(weights.bytes / GIB - 9.8) < 0.05
    # the profiling run peaks in a KV-shared layer, whose MLP is twice the configured 6,144 (use_double_wide_mlp)
    assert model.widest_mlp == 2 * 6144
    peak = {t.name: t for t in size_kv_cache(model, t4).profile_terms}["peak activation"]
    assert "3 x 12,288 MLP" in peak.source


def test_gemma_4_e2b_encoder_profiling_run_encodes_one_dummy_video_in_chunks_of_frames():
    """vLLM's profile_run encodes Gemma 4's dummy video (32 frames of 70 soft tokens, 2,496 prompt tokens: more than an
    image's 1,120 at most or the audio's 750) before the text dummy run; from 0.22 the frames go through transformers'
    vision tower in chunks sized from the free memory (gemma4_mm.py _encoder_chunk), before that one at a time."""
    from kvlab.catalog.vision import GEMMA4_AUDIO_SEQ_LENGTH, GEMMA4_IMAGE_MAX_SOFT_TOKENS
    from kvlab.memory_profile import activation_bytes, encoder_bytes
    from kvlab.sizing import encoder_inputs, profile_inputs

    model = get_model(str(DATA / "gemma-4-e2b-it.json"))
    video = model.gemma4_video
    assert video is not None and video.prompt_tokens == 32 * (70 + 2 + 6) == 2496
    assert video.prompt_tokens > max(GEMMA4_IMAGE_MAX_SOFT_TOKENS, GEMMA4_AUDIO_SEQ_LENGTH)
    t4 = get_gpu("t4")
    config = SizingConfig.for_gpu(t4, dtype="float16", max_model_len=16384, max_num_seqs=8, vllm_version="0.29.0")
    weights = {t.name: t for t in size_kv_cache(model, config).profile_terms}["weights"].bytes
    e = encoder_inputs(model, config, weights)
    # the budget max(2,048 batched tokens, 2,496) holds 1 video; 70 x 3^2 = 630 patches a frame of 3 x 16^2 values
    assert (e.items, e.budget_tokens, e.frames, e.patches_per_item, e.values_per_patch) == (1, 2496, 32, 20160, 768)
    assert (e.tokens_per_item, e.out_width, e.hidden_size, e.mlp_width_per_gpu, e.mlp_tensors) == (2240, 1536, 768,
                                                                                                    3072, 3)
    # frames a call: min(free / 2, total / 10) over 630 x 4 x 10,240 x 8 B; on a T4 with 9.8 GiB loaded, total / 10
    assert t4.memory_bytes - weights > 2 * (t4.memory_bytes // 10)
    assert e.chunk_frames == (t4.memory_bytes // 10) // (630 * 4 * 10240 * 8) == 7 and e.hidden_held
    forward, kept = encoder_bytes(e, 2)
    pixels, outputs = 20160 * 768 * 2, 2240 * 1536 * 2
    # the peak at the last full chunk: frames 21-27 through the tower (hidden and normed, gate, up and their
    # product per patch), frames 0-20's last hidden states waiting in the list
    assert forward == pixels + (21 * 630 * 768 + 7 * 630 * (2 * 768 + 3 * 3072)) * 2 + outputs == 153_000_960
    assert kept == pixels + outputs == 37_847_040
    # below the text run, so the profile's peak is the text run's with the pixel_values and outputs still held
    inputs = profile_inputs(model, config, 2, model.num_hidden_layers, weights_bytes=weights)
    text = activation_bytes(replace(inputs, encoder=None)).bytes
    assert forward < text + kept and activation_bytes(inputs).bytes == text + kept
    assert "1 video of 32 frames, 20,160 patches -> 2,240 tokens each, through the tower 7 frames at a time" in (
        activation_bytes(inputs).source)
    # 0.19 (before vllm-project/vllm#43169): one frame at a time, each pooled and projected before the next
    old = encoder_inputs(model, replace(config, vllm_version="0.19.0"), weights)
    assert (old.chunk_frames, old.hidden_held) == (1, False)
    assert encoder_bytes(old, 2) == (pixels + 630 * (2 * 768 + 3 * 3072) * 2 + outputs, kept)
    # a batch of 8,192 tokens holds 3 videos, 96 frames in chunks of 7
    wide = encoder_inputs(model, replace(config, max_num_batched_tokens=8192), weights)
    assert (wide.items, wide.budget_tokens, wide.chunk_frames) == (3, 8192, 7)


def get_model_from(config: dict):
    from kvlab.catalog.config import spec_from_config

    return spec_from_config(config, id="test", where="test", origin="test")


def test_gemma_4_26b_a4b_full_layers_take_the_larger_blocks_at_0_19():
    """Gemma 4 26B-A4B: 25 sliding layers of 8 KV heads of 256 (window 1024), 5 full of 2 KV heads of 512 (keys
    serving as values: num_global_key_value_heads; vLLM still caches K and V)."""
    model = get_model(str(DATA / "gemma-4-26b-a4b.json"))
    assert [model.layer_num_kv_heads(i) for i in (0, 5)] == [8, 2] and model.layer_head_dim(5) == 512
    assert model.max_position_embeddings == 131_072  # not in the stored config: transformers' default, and noted
    assert any("Gemma4TextConfig default" in note for note in model.notes)
    # Corpus log gemma-4-26b-a4b-a100-eager-0.19 prints only 'Available KV cache memory: 21.5 GiB'.
    r = size_kv_cache(model, given("a100-80gb", 21.5, dtype="bfloat16", max_model_len=131072, vllm_version="0.19.0"))
    sliding_page = 8 * 16 * (256 + 256) * 2
    assert sliding_page == 2 * 32 * (512 + 512) * 2  # so the full layers' blocks hold 32 tokens
    assert [(g.spec.kind, g.spec.block_size, len(g.layers)) for g in r.kv_cache_groups] == [
        ("sliding_attention", 16, 5)] * 5 + [("full_attention", 32, 5)]
    assert r.bytes_per_block == 5 * sliding_page and r.num_blocks == int(21.5 * GIB) // (5 * sliding_page)
    # 0.19: one batch of 2,048 tokens beside a sliding window; blocks // 6 groups x 16 printed as tokens
    assert r.blocks_per_request == 5 * (cdiv(1024 - 1 + 2048, 16) + 1) + 131072 // 32 == 5061
    assert r.num_tokens == r.num_blocks // 6 * 16
    # TP 4: 2 sliding heads of 256 and 1 full head of 512 (2 heads over 4 ranks, replicated) make equal pages
    tp4 = size_kv_cache(model, given("a100-80gb", 10, dtype="bfloat16", max_model_len=8192, tensor_parallel_size=4))
    assert {g.spec.block_size for g in tp4.kv_cache_groups} == {16}


def test_per_layer_attention_kvlab_has_not_read_is_refused_in_one_line(tmp_path):
    """Cache sharing outside Gemma 4 (Gemma 3n's fields) is not read from vLLM's source, and pages that do not divide
    each other are not unified by block size (0.19 refuses to start). kvlab sizes neither, and says which, rather than
    a number."""
    gemma4 = json.loads((DATA / "gemma-4-26b-a4b.json").read_text())
    other = dict(gemma4["text_config"], model_type="gemma3n_text", num_kv_shared_layers=10)
    (tmp_path / "gemma3n.json").write_text(json.dumps(other))
    with pytest.raises(KvlabError) as shared:
        get_model(str(tmp_path / "gemma3n.json"))
    assert "the last 10 layers reading earlier layers' KV cache" in str(shared.value)
    odd = dict(gemma4["text_config"], num_key_value_heads=4, num_global_key_value_heads=3)
    (tmp_path / "odd.json").write_text(json.dumps(odd))
    with pytest.raises(KvlabError) as pages:
        size_kv_cache(get_model(str(tmp_path / "odd.json")), given("a100-80gb", 10, max_model_len=8192))
    assert "does not divide the largest page" in str(pages.value)
    assert all("\n" not in str(e.value) for e in (shared, pages))


def test_modelopt_mixed_precision_holds_each_part_in_its_own_format():
    """nvidia/Qwen3.6-35B-A3B-NVFP4 (ModelOpt MIXED_PRECISION; its quantized_layers map as README.md reconstructs it):
    routed and shared experts and lm_head W4A16_NVFP4 (4 bits + an fp8 scale per 16 = 0.5625 B), the attention and
    Gated DeltaNet projections FP8 (1 B), embeddings, router, shared-expert gate and norms bf16. kvlab counts each part
    of a layer (LayerParams) at its part's bytes, the small non-linear tensors inside the attention part (conv1d, A_log,
    dt_bias, norms) with it."""
    model = get_model(str(DATA / "qwen3.6-35b-a3b-nvfp4.json"))
    fmt = model.weight_format
    assert fmt.method == "modelopt_mixed" and [part for part, _ in fmt.parts] == ["attention", "mlp", "experts",
                                                                                     "lm_head"]
    assert fmt.for_part("attention").method == "fp8" and fmt.for_part("lm_head").bytes_per_param == 0.5 + 1 / 16
    # per full-attention layer: q with its output gate 2048 x 2 x 16 x 256, k and v 2048 x 2 x 256 each, o 4096 x
    # 2048, q/k norms 2 x 256; per Gated DeltaNet layer: in_proj_qkv 2048 x (2 x 16 + 32) x 128, in_proj_z 2048 x
    # 4096, in_proj_b/a 2 x 2048 x 32, conv1d 8192 x 4, A_log and dt_bias 2 x 32, norm 128, out_proj 4096 x 2048
    full, linear = 27_263_488, 33_718_464
    assert model.layer_params(3).attention == full and model.layer_params(0).attention == linear
    experts, shared, bf16 = 256 * 3 * 2048 * 512, 3 * 2048 * 512, 2048 * 256 + 2048 + 2 * 2048  # router, gate, norms
    vocab = 248320 * 2048
    expected = 10 * full + 30 * linear + 40 * ((experts + shared) * 0.5625 + bf16 * 2) + vocab * (2 + 0.5625) + 2048 * 2
    # the Qwen3-VL tower Qwen3_5ForConditionalGeneration inherits, in bf16 (catalog/vision.py counts it)
    assert model.vision_params == 446_571_248
    assert model.weights_bytes_for(range(40), dtype_bytes=2) == int(expected) + 2 * 446_571_248
    # the checkpoint with the tower and its unquantized MTP layer (one full-attention layer, 256 experts and the
    # shared expert, fc 2 x 2048^2, three norms) in bf16: 23.40 GB, the 23.4 GB club-3090 publishes for it
    mtp = full + experts + shared + 2048 * 256 + 2048 + 2 * 2048 + 2 * 2048 ** 2 + 3 * 2048
    assert int(expected) == 20_819_982_976
    assert round((20_819_982_976 + 2 * (446_571_248 + mtp)) / 1e9, 1) == 23.4


@pytest.mark.parametrize("layers, message", [
    ({}, "without its quantized_layers map cannot be sized"),
    ({"model.layers.0.mlp.experts": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
      "model.layers.1.mlp.experts": {"quant_algo": "FP8"}}, "routed experts in two formats is not modelled"),
    ({"model.layers.0.mlp.experts": {"quant_algo": "NVFP4"}, "model.layers.1.mlp.experts": {"quant_algo": "NVFP4"},
      "model.layers.0.self_attn.q_proj": {"quant_algo": "FP8"}},
     "attention projections in quantized in 1 of the 2 layers the map names is not modelled"),
    ({"model.layers.0.mlp.experts": {"quant_algo": "INT4_AWQ"}}, "quant_algo 'INT4_AWQ' kvlab does not model"),
    ({"model.embed_tokens": {"quant_algo": "FP8"}}, "'model.embed_tokens'] is a module kvlab does not model"),
])
def test_modelopt_mixed_precision_kvlab_cannot_hold_is_refused_in_one_line(layers, message):
    qc = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": layers}
    with pytest.raises(KvlabError, match=message) as refused:
        from_quantization_config(qc, "config.json")
    assert "\n" not in str(refused.value)


def test_qwen3_6_27b_gated_deltanet_state_and_attention_block():
    """Qwen3.6-27B: 48 Gated DeltaNet layers (16 key and 48 value heads of 128, conv 4, fp32 SSM state) and 16
    full-attention layers of 4 KV heads of 256."""
    model = get_model(str(DATA / "qwen3.6-27b.json"))
    assert model.state.kind == "gdn" and model.state.ssm_dtype_bytes == 4
    assert model.layer_types.count(FULL_ATTENTION) == 16 and model.layer_types.count("linear_attention") == 48
    # per GPU at TP 2: conv (2 x 16 x 128 + 48 x 128) / 2 x 3 in bf16, SSM 24 x 128 x 128 in fp32
    assert model.state.state_bytes(2, 2) == 5120 * 3 * 2 + 24 * 128 * 128 * 4 == 1_603_584
    r = size_kv_cache(model, given("rtx-3090", 11.05, tensor_parallel_size=2, max_model_len=262144,
                                   quantization="gptq", vllm_version="0.24.0"))
    # 16 x ceil(1,603,584 / (16 x 2 x 2 x 256 x 2)) = 784 tokens; the page 784 x 2,048 bytes
    assert r.block_size == 784 and r.page_size_bytes == 784 * 2048


def test_decode_context_parallelism_of_a_gqa_model_splits_only_the_copies_tp_makes():
    """vLLM bounds DCP for GQA/MQA models by tensor_parallel_size // KV heads (ModelConfig.verify_with_parallel_config;
    its context-parallel guide: 'dcp size is upper bounded by tp_size / H'); MLA keeps one latent and takes any DCP
    that divides TP. Trial 49: llama-3.1-8b at TP 8 with DCP 8 came out at 263.66x concurrency instead of 32.96x."""
    model = get_model("llama-3.1-8b")  # 8 KV heads, 32 attention heads
    with pytest.raises(KvlabError, match=r"^-dcp 8: llama-3.1-8b's 8 KV heads over tensor "
                       r"parallel size 8 are not replicated, .*valid -dcp here: 1 \(no DCP\)$"):
        size_kv_cache(model, given("h100-sxm", 40, tensor_parallel_size=8, decode_context_parallel_size=8))
    with pytest.raises(KvlabError, match=r"replicated 4 times, .*valid -dcp here: 1, 2, 4$"):
        size_kv_cache(model, given("h100-sxm", 40, tensor_parallel_size=32, decode_context_parallel_size=8))
    four = size_kv_cache(model, given("h100-sxm", 40, tensor_parallel_size=32, decode_context_parallel_size=4))
    plain = size_kv_cache(model, given("h100-sxm", 40, tensor_parallel_size=32))
    assert four.num_blocks == plain.num_blocks and four.blocks_per_request == cdiv(plain.blocks_per_request, 4)


def test_expert_parallelism_holds_whole_experts_on_the_busiest_gpu():
    """-ep deals Mixtral's 8 experts out whole: at TP 8 one each (the bytes of 1/8 of every expert, as TP), at TP 16
    and 32 still one whole expert on a GPU that has one (vLLM's determine_expert_map: ceil(E / TP) on the first
    ranks), not 1/16 or 1/32 of them (trial 49: 2.78 GiB at TP 32 where one expert alone is ~10.5 GiB)."""
    from kvlab.sizing import SizingConfig, expert_parallel_note

    model = get_model("mixtral-8x7b-v0.1")
    layers = range(model.num_hidden_layers)

    def weights(tp: int, ep: bool) -> int:
        return model.weights_bytes_for(layers, dtype_bytes=2, tensor_parallel_size=tp, expert_parallel=ep)

    experts = sum(model.layer_params(i).experts for i in layers) * 2  # bf16 bytes of every routed expert
    assert weights(8, True) == weights(8, False)
    for tp in (16, 32):
        assert weights(tp, True) - weights(tp, False) == pytest.approx(experts / 8 - experts / tp, abs=tp)
    assert expert_parallel_note(get_model("llama-3.1-8b"), SizingConfig(enable_expert_parallel=True)).startswith(
        "--enable-expert-parallel changes nothing: llama-3.1-8b has no routed experts")
    assert expert_parallel_note(model, SizingConfig(tensor_parallel_size=2, enable_expert_parallel=True)) is None

"""The vision tower and projector of a multimodal checkpoint: parameters counted from ``vision_config``.

vLLM loads them beside the language model and counts them in "Model loading took"; they stay in the model's dtype
(quantized checkpoints leave them unquantized, as their ``ignore`` lists say). Counted per family from the modeling
code vLLM runs:

- CLIP (LLaVA, LLaVA-NeXT; vllm/model_executor/models/clip.py): patch convolution, class and position embeddings,
  a pre-LayerNorm, and only the layers up to ``vision_feature_layer`` (-2: all but the last); each layer q/k/v/o
  with biases, a two-matrix MLP with biases, two LayerNorms. Projector: two linear layers with biases
  (multi_modal_projector), and LLaVA-NeXT's image_newline.
- SigLIP (Gemma 3, PaliGemma; siglip.py): as CLIP without the class embedding and pre-norm, with a post-LayerNorm;
  Gemma 3's projector is one matrix and an RMSNorm.
- Qwen2-VL / Qwen2.5-VL (qwen2_vl.py, qwen2_5_vl.py): a 3-D patch convolution over temporal_patch_size frames,
  ``depth`` blocks (Qwen2-VL: LayerNorm and a two-matrix MLP of mlp_ratio x; Qwen2.5-VL: RMSNorm and a gated MLP of
  intermediate_size), and the patch merger (a norm, then spatial_merge_size^2 x hidden -> same -> out_hidden_size).
- Qwen3-VL (qwen3_vl.py, also the MoE checkpoints, and Qwen3.5 / Qwen3.6, whose qwen3_5.py
  Qwen3_5ForConditionalGeneration subclasses Qwen3VLForConditionalGeneration, tower and encoder profiling included;
  their processors' pixel caps are taken to be Qwen3-VL's, not read): a biased 3-D patch convolution, learned position embeddings
  (num_position_embeddings), ``depth`` LayerNorm blocks with a two-matrix MLP of intermediate_size, the patch merger
  (LayerNorm over hidden), and one more merger per ``deepstack_visual_indexes`` entry whose LayerNorm is over the
  merged width (use_postshuffle_norm).
- Gemma 4 (gemma4_mm.py builds both towers with transformers' AutoModel, so their modules are transformers'
  models/gemma4/modeling_gemma4.py): the vision and audio towers and their embed_vision/embed_audio projections, in
  ``gemma4_tower_params`` (the layers are listed there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The most pixels an image may keep after the HF processor's smart_resize, which vLLM's processing info reads
# (Qwen2VLProcessingInfo.get_image_size_with_most_features): Qwen2VLImageProcessor's default max_pixels,
# 12,845,056 = 16,384 tokens x (2 x 14)^2, as Qwen2-VL and Qwen2.5-VL checkpoints' preprocessor_config.json keep it;
# Qwen3-VL's processor, size["longest_edge"] 16,777,216 = 16,384 tokens x (2 x 16)^2.
MAX_PIXELS = {"qwen2_vl": 12_845_056, "qwen2_5_vl": 12_845_056, "qwen3_vl": 16_777_216, "qwen3_vl_moe": 16_777_216,
              "qwen3_5": 16_777_216, "qwen3_5_moe": 16_777_216}

# Qwen3-VL's video processor caps the pixels of a whole clip, not of one frame: size["longest_edge"] of the
# checkpoints' video_preprocessor_config.json, 25,165,824 = 12,288 tokens x 2 frames x (2 x 16)^2
# (transformers' Qwen3VLVideoProcessor, whose smart_resize scales every frame by sqrt(frames x area / cap)).
QWEN3_VIDEO_MAX_PIXELS = 25_165_824
# The most frames vLLM 0.11's Qwen3-VL profiling gives one dummy video (qwen3_vl.py's per-video frame cap: the
# 24,576 tokens x 32^2 pixels Qwen recommends, read as frames).
QWEN3_VIDEO_MAX_FRAMES = 24_576
# vLLM 0.11 counts a Qwen3-VL video item as 12.5 prompt tokens per vision token (a '<t seconds>' timestamp of about
# 9.5 tokens, vision start, the token, vision end: get_max_video_tokens), which sets the encoder budget.
QWEN3_VIDEO_PROMPT_TOKENS_PER_TOKEN = 12.5


@dataclass(frozen=True)
class VisionTower:
    """The numbers vLLM's encoder profiling run depends on, for the towers whose dummy input kvlab derives (Qwen2-VL,
    Qwen2.5-VL, Qwen3-VL: the image of most features is a square of the processor's max pixels)."""

    model_type: str
    hidden_size: int
    mlp_width: int  # intermediate size of one block's MLP
    mlp_tensors: int  # MLP tensors alive at its peak per patch, in mlp_width: gated 3 (gate, up, product), else 2
    values_per_patch: int  # in_channels x temporal_patch_size x patch_size^2: one row of pixel_values
    patches_per_token: int  # spatial_merge_size^2
    max_patches: int  # patches of the largest image: max_pixels // patch_size^2, whole merge groups
    out_width: int  # one output token's width: out_hidden_size, x (1 + deepstack mergers) for Qwen3-VL
    patch_size: int = 14
    temporal_patch_size: int = 2

    @property
    def max_tokens_per_image(self) -> int:
        return self.max_patches // self.patches_per_token

    @property
    def image_side(self) -> int:
        """Pixels on a side of the square image of most features."""
        return math.isqrt(self.max_patches) * self.patch_size

    @property
    def merge_size(self) -> int:
        return math.isqrt(self.patches_per_token)


@dataclass(frozen=True)
class VideoDummy:
    """The dummy video of vLLM's profiling run for a Qwen3-VL tower: ``frames`` square frames of ``side`` pixels."""

    frames: int
    side: int
    patches: int  # temporal patches x (side / patch)^2
    tokens: int  # vision tokens: patches / merge^2
    budget_tokens: int  # the prompt tokens vLLM counts for it (x 12.5: timestamps and markers), its encoder budget


def qwen3_video_side(tower: VisionTower, frames: int, side: int) -> int:
    """The frame side Qwen3-VL's video processor resizes ``frames`` square frames of ``side`` pixels to: rounded to
    whole merge units (patch x merge pixels) and, where the clip exceeds the video pixel cap, every frame scaled by
    the square root of clip pixels over the cap, floored to whole units and at least one unit."""
    unit = tower.patch_size * tower.merge_size
    t = round(frames / tower.temporal_patch_size) * tower.temporal_patch_size
    rounded = round(side / unit) * unit
    if t * rounded * rounded <= QWEN3_VIDEO_MAX_PIXELS:
        return rounded
    beta = math.sqrt(frames * side * side / QWEN3_VIDEO_MAX_PIXELS)
    return max(unit, math.floor(side / beta / unit) * unit)


def qwen3_video_patches(tower: VisionTower, frames: int, side: int) -> int:
    """Patches of a clip of ``frames`` frames resized from ``side``: frames padded to whole temporal patches."""
    temporal = max((frames + frames % tower.temporal_patch_size) // tower.temporal_patch_size, 1)
    return temporal * (qwen3_video_side(tower, frames, side) // tower.patch_size) ** 2


def qwen3_video_dummy(tower: VisionTower, seq_len: int) -> VideoDummy:
    """vLLM 0.11's dummy video for Qwen3-VL (Qwen3VLDummyInputsBuilder, frames from
    Qwen2VLProcessingInfo.get_num_frames_with_most_features): from 2 frames of the image of most features, add frames
    while the clip's vision tokens stay within ``seq_len``, at most QWEN3_VIDEO_MAX_FRAMES; the frames are then
    resized as the video processor would (the processor itself is called without resizing)."""
    side, per_token = tower.image_side, tower.patches_per_token
    frames = 2
    while frames < QWEN3_VIDEO_MAX_FRAMES and qwen3_video_patches(tower, frames + 1, side) // per_token <= seq_len:
        frames += 1
    patches = qwen3_video_patches(tower, frames, side)
    tokens = patches // per_token
    return VideoDummy(frames=frames, side=qwen3_video_side(tower, frames, side), patches=patches, tokens=tokens,
                      budget_tokens=int(tokens * QWEN3_VIDEO_PROMPT_TOKENS_PER_TOKEN))


@dataclass(frozen=True)
class LoadBuffers:
    """Tensors a Qwen-VL model allocates on the GPU when vLLM builds it, beside its weights (so inside "Model loading
    took"), replicated on every TP rank:

    - the M-RoPE cos/sin cache (rotary_embedding MRotaryEmbedding, which every text layer shares through get_rope's
      cache): ``rope_positions`` = max_position_embeddings x the positions factor rows of ``rope_width`` (the rotary
      dim) in the model's dtype; the factor is 4 ('we enlarge max_position_embeddings to 4 times' for video
      positions), and 1 for Qwen3-VL in vLLM 0.32 without video pruning (vllm_rules.mrope_positions_factor);
    - Qwen3-VL's deepstack input buffers (Qwen3VLForConditionalGeneration.__init__): one zeros tensor of
      max_num_batched_tokens x the text hidden size per deepstack level, in the model's dtype."""

    model_type: str
    max_positions: int  # the text config's max_position_embeddings
    rope_width: int  # rotary dim: the text head_dim
    deepstack_levels: int
    text_hidden: int

    def rope_bytes(self, factor: int, dtype_bytes: int) -> int:
        return self.max_positions * factor * self.rope_width * dtype_bytes

    def deepstack_bytes(self, max_num_batched_tokens: int, dtype_bytes: int) -> int:
        return self.deepstack_levels * max_num_batched_tokens * self.text_hidden * dtype_bytes


def load_buffers(config: dict) -> LoadBuffers | None:
    """The load-time buffers of a Qwen-VL model whose text model runs M-RoPE (rope_scaling's mrope_section), else
    None."""
    model_type = str(config.get("model_type") or "")
    nested = config.get("text_config")
    text: dict = nested if isinstance(nested, dict) else config
    rope = text.get("rope_scaling") or config.get("rope_scaling") or {}
    if model_type not in MAX_PIXELS or not isinstance(rope, dict) or not rope.get("mrope_section"):
        return None
    hidden = int(text.get("hidden_size") or 0)
    head_dim = int(text.get("head_dim") or hidden // int(text.get("num_attention_heads") or 1))
    vc = config.get("vision_config") or {}
    deepstack = len(vc.get("deepstack_visual_indexes") or ()) if model_type.startswith("qwen3") else 0
    return LoadBuffers(model_type=model_type, max_positions=int(text.get("max_position_embeddings") or 0),
                       rope_width=head_dim, deepstack_levels=deepstack, text_hidden=hidden)


def vision_tower(config: dict) -> VisionTower | None:
    """The profiling geometry of a Qwen-VL tower, or None for other towers (their encoder run is not estimated)."""
    vc, model_type = config.get("vision_config"), str(config.get("model_type") or "")
    if not isinstance(vc, dict) or model_type not in MAX_PIXELS:
        return None
    nested = config.get("text_config")
    text_hidden = int((nested if isinstance(nested, dict) else config).get("hidden_size") or 0)
    qwen3 = model_type.startswith("qwen3")
    h = int((vc.get("embed_dim") if model_type == "qwen2_vl" else vc.get("hidden_size")) or 1280)
    patch, merge = int(vc.get("patch_size", 16 if qwen3 else 14)), int(vc.get("spatial_merge_size", 2))
    gated = model_type == "qwen2_5_vl"
    width = int(h * vc.get("mlp_ratio", 4)) if model_type == "qwen2_vl" else int(vc["intermediate_size"])
    values = int(vc.get("in_channels") or vc.get("in_chans") or 3) * int(vc.get("temporal_patch_size", 2)) * patch ** 2
    side = math.isqrt(MAX_PIXELS[model_type] // patch ** 2) // merge * merge  # grid side of the square image
    out = int(vc.get("out_hidden_size") or text_hidden)
    deepstack = len(vc.get("deepstack_visual_indexes") or ()) if qwen3 else 0
    return VisionTower(model_type=model_type, hidden_size=h, mlp_width=width, mlp_tensors=3 if gated else 2,
                       values_per_patch=values, patches_per_token=merge * merge, max_patches=side * side,
                       out_width=out * (1 + deepstack), patch_size=patch,
                       temporal_patch_size=int(vc.get("temporal_patch_size", 2)))


def _clip_layers(vc: dict, feature_layer) -> int:
    layers = int(vc.get("num_hidden_layers", 24))
    if isinstance(feature_layer, list):
        feature_layer = max(feature_layer)
    if isinstance(feature_layer, int) and feature_layer < 0:
        return layers + feature_layer + 1
    if isinstance(feature_layer, int):
        return feature_layer
    return layers


def _vit_layer(h: int, inter: int, gated: bool = False, norm_bias: bool = True) -> int:
    attention = 4 * (h * h + h)
    mlp = (3 * h * inter + 2 * inter + h) if gated else (2 * h * inter + inter + h)
    return attention + mlp + 2 * h * (2 if norm_bias else 1)


def vision_params(config: dict) -> tuple[int, str]:
    """(parameters of the vision tower and projector, how they were counted); (0, "") for a text-only config, and
    (0, why) for a vision_config kvlab does not know how to count."""
    vc = config.get("vision_config")
    if not isinstance(vc, dict):
        return 0, ""
    model_type = str(config.get("model_type") or "")
    nested = config.get("text_config")
    text: dict = nested if isinstance(nested, dict) else config
    text_hidden = int(text.get("hidden_size") or 0)
    kind = str(vc.get("model_type") or "")
    if model_type in ("qwen2_vl", "qwen2_5_vl"):
        h = int((vc.get("hidden_size") if model_type == "qwen2_5_vl" else vc.get("embed_dim")) or 1280)
        depth = int(vc.get("depth", 32))
        patch = int(vc.get("in_chans", 3)) * int(vc.get("temporal_patch_size", 2)) * int(vc.get("patch_size", 14)) ** 2
        if model_type == "qwen2_5_vl":
            block = _vit_layer(h, int(vc["intermediate_size"]), gated=True, norm_bias=False)
        else:
            block = _vit_layer(h, int(h * vc.get("mlp_ratio", 4)))
        merged = h * int(vc.get("spatial_merge_size", 2)) ** 2
        out = int(vc.get("out_hidden_size") or vc.get("hidden_size") or text_hidden)
        merger = h * (2 if model_type == "qwen2_vl" else 1) + merged * merged + merged + merged * out + out
        return patch * h + depth * block + merger, f"{model_type} vision: {depth} blocks of {h:,}, patch merger"
    if model_type in ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"):
        h, depth = int(vc.get("hidden_size", 1152)), int(vc.get("depth", 27))
        patch = int(vc.get("in_channels", 3)) * int(vc.get("temporal_patch_size", 2)) * int(vc.get("patch_size", 16)) ** 2
        embed = patch * h + h + int(vc.get("num_position_embeddings", 2304)) * h
        block = _vit_layer(h, int(vc["intermediate_size"]))
        merged = h * int(vc.get("spatial_merge_size", 2)) ** 2
        out = int(vc.get("out_hidden_size") or text_hidden)
        linears = merged * merged + merged + merged * out + out
        deepstack = len(vc.get("deepstack_visual_indexes") or ())
        mergers = 2 * h + linears + deepstack * (2 * merged + linears)
        return embed + depth * block + mergers, (f"{model_type} vision: {depth} blocks of {h:,}, patch merger and "
                                                 f"{deepstack} deepstack mergers")
    if kind in ("clip_vision_model", "siglip_vision_model") or model_type in ("llava", "llava_next", "gemma3"):
        h, inter = int(vc.get("hidden_size", 1024)), int(vc.get("intermediate_size", 4096))
        patch, image = int(vc.get("patch_size", 14)), int(vc.get("image_size", 336))
        positions = (image // patch) ** 2
        siglip = kind == "siglip_vision_model" or model_type == "gemma3"
        layers = _clip_layers(vc, None if siglip else config.get("vision_feature_layer", -2))
        embed = 3 * patch * patch * h + (h if siglip else 0) + (positions + (0 if siglip else 1)) * h
        embed += 0 if siglip else h + 2 * h  # class embedding, pre-LayerNorm
        tower = embed + layers * _vit_layer(h, inter) + (2 * h if siglip else 0)
        if model_type == "gemma3":
            projector = h * text_hidden + h
        else:
            projector = h * text_hidden + text_hidden + text_hidden * text_hidden + text_hidden
            projector += text_hidden if model_type == "llava_next" else 0
        name = "SigLIP" if siglip else "CLIP"
        return tower + projector, f"{name} vision tower: {layers} layers of {h:,}, projector to {text_hidden:,}"
    if model_type == "gemma4":
        return gemma4_tower_params(config)
    return 0, f"vision_config of {model_type or kind or 'this model'} NOT counted (kvlab does not know its tower)"


def _gemma4_vision(vc: dict) -> int:
    """Gemma4VisionModel's parameters (modeling_gemma4.py): the patch embedder (a bias-free linear from 3 x patch^2
    pixel values to the hidden size, and a position table of 2 x position_embedding_size x hidden); per layer q/k/v/o
    (bias-free; k and v of num_key_value_heads), RMSNorm scales on the query and key heads (head_dim each; the value
    norm has none), a gated MLP (gate, up, down, bias-free) and four RMSNorms of the hidden size. The pooler holds no
    parameters; the rotary table is computed, not loaded."""
    h, inter = int(vc.get("hidden_size", 768)), int(vc.get("intermediate_size", 3072))
    heads = int(vc.get("num_attention_heads", 12))
    kv_heads = int(vc.get("num_key_value_heads") or heads)
    head_dim = int(vc.get("head_dim") or h // heads)
    patch = int(vc.get("patch_size", 16))
    embed = 3 * patch * patch * h + 2 * int(vc.get("position_embedding_size", 10240)) * h
    attention = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim + 2 * head_dim
    layer = attention + 3 * h * inter + 4 * h
    return embed + int(vc.get("num_hidden_layers", 16)) * layer


def _gemma4_audio(ac: dict) -> int:
    """Gemma4AudioModel's parameters (modeling_gemma4.py), a conformer: the subsampling front end (two bias-free 3x3
    convolutions, 1 -> c0 -> c1 channels of subsampling_conv_channels, each with a bias-free LayerNorm scale, then a
    bias-free linear from c0 / 4 x c1 to the hidden size); per layer two feed-forward blocks (hidden -> 4 x hidden ->
    hidden, bias-free, with pre and post RMSNorms), attention (q, k, v, post and the relative-position key projection,
    hidden x hidden each, and a per-dimension query scale of head_dim), a light convolution block (hidden -> 2 x
    hidden for the GLU, a depthwise causal convolution of conv_kernel_size, hidden -> hidden, two RMSNorms) and three
    more RMSNorms; finally output_proj, hidden -> output_proj_dims with a bias. The sinusoidal position table is
    computed, not loaded."""
    h, layers = int(ac.get("hidden_size", 1024)), int(ac.get("num_hidden_layers", 12))
    c0, c1 = (int(c) for c in ac.get("subsampling_conv_channels") or (128, 32))
    out = int(ac.get("output_proj_dims") or h)
    front = 9 * c0 + c0 + 9 * c0 * c1 + c1 + (c0 // 4) * c1 * h
    feed_forward = 8 * h * h + 2 * h
    attention = 5 * h * h + h // int(ac.get("num_attention_heads", 8))
    light_conv = 3 * h * h + int(ac.get("conv_kernel_size", 5)) * h + 2 * h
    layer = 2 * feed_forward + attention + light_conv + 3 * h
    return front + layers * layer + h * out + out


def gemma4_tower_params(config: dict) -> tuple[int, str]:
    """Parameters of Gemma 4's vision and audio towers and their projections into the text model, as vLLM builds
    them: Gemma4ForConditionalGeneration (vllm/model_executor/models/gemma4_mm.py) creates both towers with
    transformers' AutoModel.from_config (transformers models/gemma4/modeling_gemma4.py: Gemma4VisionModel,
    Gemma4AudioModel), the audio tower only where config.json has an audio_config, and one bias-free projection per
    tower (Gemma4MultimodalEmbedder: the tower's width, audio's output_proj_dims, to the text hidden size; its norm has
    no scale). vLLM loads them unquantized unless the checkpoint quantizes them (quantized checkpoints' ignore lists
    keep them), in the model's dtype, and replicated on every TP rank (ReplicatedLinear).

    Counted: parameters only. Not counted, being buffers: the clip bounds of the towers' clipped linears (four scalars
    each when use_clipped_linears, 832 for E2B) and the vision tower's std_bias/std_scale (2 x hidden, when
    ``standardize``); together under 4 KB for E2B. Google's bf16 google/gemma-4-E2B-it checks the count: its
    model.safetensors is 10,246,621,918 B, and 2 B x (kvlab's 4,647,449,600 text parameters, k/v on every layer, +
    these 475,728,160) is 10,246,355,520 B; the remaining 266,398 B are the safetensors header (about 2,000 tensor
    entries), the towers' buffers and 291 text values kvlab does not count (35 layer_scalar buffers, the 256 of the
    PLE projection norm)."""
    vc = config.get("vision_config") or {}
    ac = config.get("audio_config")
    nested = config.get("text_config")
    text_hidden = int((nested if isinstance(nested, dict) else config).get("hidden_size") or 0)
    vision = _gemma4_vision(vc) + int(vc.get("hidden_size", 768)) * text_hidden
    text = (f"gemma4 vision and audio towers: vision {int(vc.get('num_hidden_layers', 16))} layers of "
            f"{int(vc.get('hidden_size', 768)):,} ({vision / 1e6:,.2f} M with embed_vision)")
    if not isinstance(ac, dict):
        return vision, text + ", no audio tower (no audio_config)"
    audio = _gemma4_audio(ac) + int(ac.get("output_proj_dims") or ac.get("hidden_size", 1024)) * text_hidden
    return vision + audio, (text + f", audio {int(ac.get('num_hidden_layers', 12))} conformer layers of "
                            f"{int(ac.get('hidden_size', 1024)):,} ({audio / 1e6:,.2f} M with embed_audio)")


@dataclass(frozen=True)
class PleStaging:
    """Gemma 4's per-layer-embedding staging buffer: Gemma4ForConditionalGeneration.__init__ (gemma4_mm.py) allocates
    ``per_layer_embeddings``, zeros of [max_num_batched_tokens, num_hidden_layers, hidden_size_per_layer_input], on
    the GPU while building the model (for CUDA graphs), so it falls inside "Model loading took". Both versions of
    gemma4_mm.py read (vllm-project/vllm commits 49e6e4739167 and 01bae2190e1c) allocate it with this shape, in the
    dtype of the embedding weight (the older) or the model's dtype (the newer), the same for an unquantized
    embedding; which releases carry which commit was not established. It is counted for the multimodal wrapper
    only (whether the text-only Gemma4ForCausalLM of gemma4.py allocates one was not read), and only where
    hidden_size_per_layer_input is set and above 0."""

    layers: int
    width: int  # hidden_size_per_layer_input

    def bytes(self, max_num_batched_tokens: int, dtype_bytes: int) -> int:
        return max_num_batched_tokens * self.layers * self.width * dtype_bytes


def towers_whole(config: dict) -> bool:
    """Whether every tensor-parallel rank holds the towers whole: Gemma 4's, which vLLM builds from transformers'
    modules (gemma4_tower_params); the other towers are split as the decoder is."""
    return str(config.get("model_type") or "") == "gemma4"


def ple_staging(config: dict) -> PleStaging | None:
    """The PLE staging buffer of a Gemma 4 multimodal config.json (model_type gemma4), else None."""
    nested = config.get("text_config")
    if str(config.get("model_type") or "") != "gemma4" or not isinstance(nested, dict):
        return None
    width = int(nested.get("hidden_size_per_layer_input") or 0)
    return PleStaging(layers=int(nested.get("num_hidden_layers") or 0), width=width) if width > 0 else None


# Gemma 4's dummy for vLLM's encoder profiling run (gemma4_mm.py, read at vllm-project/vllm commits 49e6e4739167 and
# 01bae2190e1c): Gemma4ProcessingInfo.get_mm_max_tokens_per_item gives an image default_output_length soft tokens (280
# by default, at most 1,120, the largest of _SUPPORTED_SOFT_TOKENS), audio the processor's audio_seq_length (750,
# transformers' Gemma4Processor default) and a video _VIDEO_MAX_FRAMES = 32 frames of _VIDEO_MAX_SOFT_TOKENS = 70 soft
# tokens, counted as 70 + 2 (boi, eoi) + 6 (timestamp) prompt tokens each: 2,496, so a video is always the modality
# profile_run encodes ('profiled with 1 video items'). Each frame is padded to 70 x pooling_kernel_size^2 patches.
GEMMA4_VIDEO_FRAMES = 32
GEMMA4_VIDEO_SOFT_TOKENS = 70
GEMMA4_VIDEO_FRAME_MARKERS = 8  # boi, eoi and about 6 timestamp tokens per frame, as get_mm_max_tokens_per_item counts
GEMMA4_IMAGE_MAX_SOFT_TOKENS = 1120
GEMMA4_AUDIO_SEQ_LENGTH = 750
# gemma4_mm.py's _encoder_chunk (commit 01bae2190e1c): frames per vision-tower call are bounded so that transformers'
# one-hot position lookup, patches x 4 x position_embedding_size x 8 B per frame, fits min(free / 2, total / 10).
GEMMA4_CHUNK_SHARE_OF_TOTAL = 10


@dataclass(frozen=True)
class Gemma4Video:
    """The dummy video vLLM's encoder profiling run gives a Gemma 4 model, and its vision tower's widths."""

    frames: int
    patches_per_frame: int  # soft tokens x pooling_kernel_size^2: each frame's pixel_values rows, padding included
    soft_tokens_per_frame: int  # pooled outputs per frame
    values_per_patch: int  # 3 x patch_size^2
    prompt_tokens: int  # what vLLM counts for one video: frames x (soft tokens + markers); sets the encoder budget
    hidden_size: int  # the vision tower's
    mlp_width: int  # its gated MLP's intermediate size
    out_width: int  # the text hidden size embed_vision projects to
    position_embedding_size: int

    @property
    def patches(self) -> int:
        return self.frames * self.patches_per_frame

    @property
    def soft_tokens(self) -> int:
        return self.frames * self.soft_tokens_per_frame

    def chunk_frames(self, free_bytes: int, total_bytes: int) -> int:
        """Frames per vision-tower call in the batched video path (gemma4_mm.py _encoder_chunk): the budget
        min(free / 2, total / 10) over patches x 4 x position_embedding_size x 8 B a frame, at least 1."""
        budget = min(free_bytes // 2, total_bytes // GEMMA4_CHUNK_SHARE_OF_TOTAL)
        cost = self.patches_per_frame * 4 * self.position_embedding_size * 8
        return max(1, budget // cost) if budget > 0 else 1


def gemma4_video(config: dict) -> Gemma4Video | None:
    """The dummy video of a Gemma 4 multimodal config.json (model_type gemma4), else None."""
    if str(config.get("model_type") or "") != "gemma4":
        return None
    vc = config.get("vision_config") or {}
    nested = config.get("text_config")
    text_hidden = int((nested if isinstance(nested, dict) else config).get("hidden_size") or 0)
    pooling, patch = int(vc.get("pooling_kernel_size", 3)), int(vc.get("patch_size", 16))
    return Gemma4Video(frames=GEMMA4_VIDEO_FRAMES, patches_per_frame=GEMMA4_VIDEO_SOFT_TOKENS * pooling ** 2,
                       soft_tokens_per_frame=GEMMA4_VIDEO_SOFT_TOKENS, values_per_patch=3 * patch ** 2,
                       prompt_tokens=GEMMA4_VIDEO_FRAMES * (GEMMA4_VIDEO_SOFT_TOKENS + GEMMA4_VIDEO_FRAME_MARKERS),
                       hidden_size=int(vc.get("hidden_size", 768)), mlp_width=int(vc.get("intermediate_size", 3072)),
                       out_width=text_hidden, position_embedding_size=int(vc.get("position_embedding_size", 10240)))

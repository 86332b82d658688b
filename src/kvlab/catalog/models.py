"""Models as frozen specs: architecture numbers, per-layer attention types and a parameter count.

A ``ModelSpec`` is built from a dict that uses Hugging Face ``config.json`` names, so the bundled catalogue
(data/models.json) and a user's own config.json go through the same code (``spec_from_fields``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from kvlab.catalog.hybrid import LINEAR_ATTENTION, MAMBA, NO_CACHE, StateLayout, hybrid_layer_types, state_layout
from kvlab.catalog.quant import DEFAULTS as QUANT_DEFAULTS
from kvlab.catalog.quant import (
    WeightFormat,
    check_method,
    from_quantization_config,
    mxfp4_layer_bytes,
    requested_method,
)
from kvlab.catalog.rope import RopeCache, rope_caches
from kvlab.catalog.vision import Gemma4Video, LoadBuffers, PleStaging, VisionTower
from kvlab.errors import KvlabError

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"

# Bytes per element of a dtype name as config.json and vLLM's --dtype / --kv-cache-dtype spell them.
DTYPE_BYTES = {
    "float32": 4, "float": 4,
    "float16": 2, "half": 2, "bfloat16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}



@dataclass(frozen=True)
class Traits:
    """What a model family adds to the plain transformer when counting parameters.

    Read from each family's modeling code in transformers/vLLM: OPT has biases everywhere, LayerNorm with a
    bias, learned positions (with an offset of 2) and a two-matrix MLP; Qwen2 biases q/k/v; Qwen3 and Gemma 3
    normalise q and k per head; Gemma 2/3 have four norms per layer; gpt-oss biases its projections and
    experts and keeps one attention sink per head.
    """

    gated_mlp: bool = True
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    norm_params_per_dim: int = 1  # RMSNorm: weight; LayerNorm: weight + bias
    norms_per_layer: int = 2
    qk_norm: bool = False
    learned_position_offset: int | None = None
    attention_sinks: bool = False
    tie_word_embeddings_default: bool = False
    attn_output_gate: bool = False  # q_proj also outputs a per-head gate for the attention output (Qwen3-Next)
    shared_expert_gate: bool = False


TRAITS = {
    "opt": Traits(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, norm_params_per_dim=2,
                  learned_position_offset=2, tie_word_embeddings_default=True),
    "qwen2": Traits(qkv_bias=True),
    "qwen3": Traits(qk_norm=True),
    "gemma": Traits(tie_word_embeddings_default=True),
    "gemma2": Traits(norms_per_layer=4, tie_word_embeddings_default=True),
    "gemma3": Traits(norms_per_layer=4, qk_norm=True, tie_word_embeddings_default=True),
    "gemma3_text": Traits(norms_per_layer=4, qk_norm=True, tie_word_embeddings_default=True),
    "gemma4": Traits(norms_per_layer=4, qk_norm=True, tie_word_embeddings_default=True),
    "gemma4_text": Traits(norms_per_layer=4, qk_norm=True, tie_word_embeddings_default=True),
    "gpt_oss": Traits(qkv_bias=True, o_bias=True, mlp_bias=True, attention_sinks=True),
    "qwen3_moe": Traits(qk_norm=True),
    "qwen2_moe": Traits(qkv_bias=True, shared_expert_gate=True),
    "qwen2_vl": Traits(qkv_bias=True),
    "qwen2_5_vl": Traits(qkv_bias=True),
    "qwen3_next": Traits(qk_norm=True, attn_output_gate=True, shared_expert_gate=True),
    "qwen3_5": Traits(qk_norm=True, attn_output_gate=True),
    "qwen3_5_text": Traits(qk_norm=True, attn_output_gate=True),
    "qwen3_5_moe": Traits(qk_norm=True, attn_output_gate=True, shared_expert_gate=True),
    "qwen3_5_moe_text": Traits(qk_norm=True, attn_output_gate=True, shared_expert_gate=True),
    # Nemotron-H: a ReLU^2 MLP of up_proj and down_proj, no gate, in its '-' blocks and its experts (vLLM's
    # nemotron_h.py NemotronHMLP; FusedMoE with activation_without_mul)
    "nemotron_h": Traits(gated_mlp=False),
}
DEFAULT_TRAITS = Traits()


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one decoder layer, split by where they live (for TP splits and quantized formats)."""

    attention: int  # projections (+ biases, q/k norms, sinks)
    # The part of ``attention`` that is replicated rather than split: K and V projections once TP exceeds the KV heads;
    # MLA's down-projections and their norms on every rank.
    kv_projection: int
    mlp: int  # dense MLP, or the shared experts of an MoE layer
    experts: int  # routed experts, all of them
    active_experts: int  # routed experts one token passes through
    router: int
    norms: int

    @property
    def total(self) -> int:
        return self.attention + self.mlp + self.experts + self.router + self.norms

    @property
    def active(self) -> int:
        return self.attention + self.mlp + self.active_experts + self.router + self.norms


@dataclass(frozen=True)
class Gemma4Layout:
    """What Gemma 4's config.json adds to one attention shape for every layer (vLLM's gemma4.py, Gemma4DecoderLayer and
    Gemma4Attention; 0.29's transformers_utils/configs/gemma4.py gemma4_layer_config says the same per layer).

    Full-attention layers have head size ``global_head_dim``, and with ``attention_k_eq_v`` (keys serving as values)
    ``num_global_key_value_heads`` KV heads; vLLM still loads K into both halves of qkv_proj and caches K and V as for
    any layer, so k_eq_v changes the KV head count, not the bytes per head. The last ``num_kv_shared_layers`` layers
    read the cache of the last earlier layer of their type (kv_sharing_target_layer_name) and keep none of their own.
    """

    global_head_dim: int | None = None
    num_global_key_value_heads: int | None = None  # used where attention_k_eq_v
    attention_k_eq_v: bool = False
    num_kv_shared_layers: int = 0
    hidden_size_per_layer_input: int = 0  # per-layer embeddings (E2B/E4B): their width per layer
    vocab_size_per_layer_input: int = 0
    use_double_wide_mlp: bool = False  # the KV-shared layers' MLP twice as wide
    enable_moe_block: bool = False  # an MoE block beside the dense MLP in every layer (26B-A4B)


@dataclass(frozen=True)
class ModelSpec:
    """One model's architecture, as vLLM reads it from config.json.

    ``head_dim`` is the explicit config value when there is one (Qwen3-32B: 128, not 5120 / 64 = 80).
    ``layer_types`` gives each layer's attention: full, or sliding over ``sliding_window`` tokens.
    MLA models (DeepSeek-V2/V3) cache one latent of ``kv_lora_rank + qk_rope_head_dim`` values per token and
    layer instead of K and V per KV head.
    """

    id: str
    hf_repo: str | None
    model_type: str
    architecture: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    dtype: str
    tie_word_embeddings: bool
    layer_types: tuple[str, ...]
    sliding_window: int | None = None
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    num_experts: int | None = None
    experts_per_token: int | None = None
    moe_intermediate_size: int | None = None
    num_shared_experts: int | None = None
    first_k_dense_replace: int | None = None
    quantization: str | None = None
    weight_format: WeightFormat | None = None  # the checkpoint's quantized layout (kvlab.catalog.quant)
    state: StateLayout | None = None  # linear-attention / Mamba layers' state (kvlab.catalog.hybrid)
    gemma4: Gemma4Layout | None = None  # per-layer-type attention and cache sharing (Gemma 4)
    # Multi-token prediction layers in the checkpoint (config.json's num_nextn_predict_layers: DeepSeek-V3, MiMo,
    # GLM-4.5, Qwen3-Next; Qwen3.5's mtp_num_hidden_layers); vLLM's --speculative-method mtp drafts with them and
    # refuses a model without them.
    num_nextn_predict_layers: int = 0
    # config.json's final_logit_softcapping (Gemma 2 and 4: 30.0; Gemma 3 writes null): vLLM's LogitsProcessor caps the
    # logits out of place (logits / cap, tanh, * cap), a moment's copy that the dummy sampler run's peak can hold
    final_logit_softcapping: float | None = None
    vision_params: int = 0  # vision tower and projector (multimodal checkpoints), kept in the model's dtype
    vision_whole: bool = False  # the towers kept whole on every TP rank (Gemma 4: transformers' modules, unsplit)
    vision_source: str = ""
    vision_tower: VisionTower | None = None  # what vLLM's encoder profiling run reads (Qwen-VL towers only)
    load_buffers: LoadBuffers | None = None  # tensors vLLM allocates at load beside the weights (Qwen-VL M-RoPE)
    rope_caches: tuple[RopeCache, ...] = ()  # the rotary embeddings' cos/sin caches (kvlab.catalog.rope)
    ple_staging: PleStaging | None = None  # Gemma 4's per-layer-embedding staging buffer (multimodal wrapper)
    gemma4_video: Gemma4Video | None = None  # the dummy video of Gemma 4's encoder profiling run (multimodal wrapper)
    aliases: tuple[str, ...] = ()
    num_params_card: float | None = None
    num_active_params_card: float | None = None
    params_total_card: str | None = None
    params_active_card: str | None = None
    origin: str = "catalogue"  # catalogue | config.json | huggingface
    notes: tuple[str, ...] = ()
    source: tuple[str, ...] = field(default=(), compare=False)

    # --- attention and KV cache -------------------------------------------------------------------------

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None and self.kv_lora_rank > 0

    @property
    def attention(self) -> str:
        """MHA, GQA, MQA or MLA."""
        if self.is_mla:
            return "MLA"
        if self.num_key_value_heads == self.num_attention_heads:
            return "MHA"
        return "MQA" if self.num_key_value_heads == 1 else "GQA"

    @property
    def kv_head_size(self) -> int:
        """Values cached per KV head per token per layer for K (and again for V unless MLA).

        MLA: the latent plus the decoupled RoPE key, kv_lora_rank + qk_rope_head_dim (576 for DeepSeek),
        as vLLM's MLAAttentionSpec with head_size_v = 0.
        """
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.head_dim

    @property
    def num_kv_heads_cached(self) -> int:
        """KV heads cached per layer for the whole model: 1 latent for MLA (vLLM's get_num_kv_heads)."""
        return 1 if self.is_mla else self.num_key_value_heads

    @property
    def kv_factor(self) -> int:
        """2 for K and V; 1 for MLA's single latent."""
        return 1 if self.is_mla else 2

    def kv_bytes_per_token_per_layer(self, kv_dtype_bytes: int) -> int:
        return self.kv_factor * self.num_kv_heads_cached * self.kv_head_size * kv_dtype_bytes

    def kv_bytes_per_token(self, kv_dtype_bytes: int = 2) -> int:
        """KV cache bytes one token needs in every attention layer that keeps a cache (sliding layers included: this
        is per token; linear-attention and Mamba layers keep a fixed state per request instead)."""
        if self.gemma4 is None:
            return self.num_attention_layers * self.kv_bytes_per_token_per_layer(kv_dtype_bytes)
        return sum(2 * self.layer_num_kv_heads(i) * self.layer_head_dim(i) * kv_dtype_bytes
                   for i in self.kv_cache_layers)

    def layer_head_dim(self, layer: int) -> int:
        """One layer's cached head size: Gemma 4's full-attention layers have global_head_dim."""
        g = self.gemma4
        if g is not None and g.global_head_dim and self.layer_types[layer] == FULL_ATTENTION:
            return g.global_head_dim
        return self.kv_head_size

    def layer_num_kv_heads(self, layer: int) -> int:
        """One layer's KV heads (the whole model's, before a TP split): Gemma 4's full-attention layers have
        num_global_key_value_heads where keys serve as values."""
        g = self.gemma4
        if (g is not None and g.attention_k_eq_v and g.num_global_key_value_heads
                and self.layer_types[layer] == FULL_ATTENTION):
            return g.num_global_key_value_heads
        return self.num_key_value_heads

    def kv_sharing_target(self, layer: int) -> int | None:
        """The earlier layer whose cache this one reads, or None when it keeps its own: in Gemma 4 each of the last
        num_kv_shared_layers layers reads the last layer of its type before them (gemma4.py Gemma4Attention)."""
        g = self.gemma4
        first = self.num_hidden_layers - (g.num_kv_shared_layers if g is not None else 0)
        if layer < first:
            return None
        kind = self.layer_types[layer]
        return max((i for i in range(first) if self.layer_types[i] == kind), default=None)

    def per_layer_kv_text(self, kv_dtype_bytes: int, tensor_parallel_size: int) -> tuple[str, str]:
        """How kv_bytes_per_token adds up where the layers' shapes differ (Gemma 4): the whole model's, one GPU's."""
        shapes: dict[tuple[str, int, int], int] = {}
        for i in self.kv_cache_layers:
            key = (self.layer_types[i].split("_")[0], self.layer_num_kv_heads(i), self.layer_head_dim(i))
            shapes[key] = shapes.get(key, 0) + 1
        whole = " + ".join(f"{n} {kind} layers x {heads} KV heads x {dim}" for (kind, heads, dim), n in shapes.items())
        per_gpu = " + ".join(f"{n} {kind} layers x {max(1, heads // tensor_parallel_size)} KV heads x {dim}"
                             for (kind, heads, dim), n in shapes.items())
        shared = self.num_attention_layers - len(self.kv_cache_layers)
        note = f"; {shared} layers read an earlier layer's cache and keep none (num_kv_shared_layers)" if shared else ""
        return f"2 (K and V) x ({whole}) x {kv_dtype_bytes} B{note}", per_gpu

    @property
    def kv_cache_layers(self) -> tuple[int, ...]:
        """Attention layers that keep a KV cache: not those reading another layer's (vLLM gives them no
        KVCacheSpec, gpu_model_runner.get_kv_cache_spec, so nothing is allocated for them)."""
        return tuple(i for i, t in enumerate(self.layer_types)
                     if t in (FULL_ATTENTION, SLIDING_ATTENTION) and self.kv_sharing_target(i) is None)

    @property
    def num_attention_layers(self) -> int:
        return sum(t in (FULL_ATTENTION, SLIDING_ATTENTION) for t in self.layer_types)

    @property
    def num_state_layers(self) -> int:
        """Linear-attention and Mamba layers: a fixed-size state per request."""
        return sum(t in (LINEAR_ATTENTION, MAMBA) for t in self.layer_types)

    def num_kv_heads_per_gpu(self, tensor_parallel_size: int) -> int:
        """vLLM's ModelConfig.get_num_kv_heads: MLA is not split; GQA heads are split, replicated below 1."""
        if self.is_mla:
            return 1
        return max(1, self.num_key_value_heads // tensor_parallel_size)

    def kv_bytes_per_token_per_gpu(self, kv_dtype_bytes: int = 2, tensor_parallel_size: int = 1,
                                   num_layers: int | None = None) -> int:
        if self.gemma4 is not None:
            whole = sum(2 * max(1, self.layer_num_kv_heads(i) // tensor_parallel_size) * self.layer_head_dim(i)
                        * kv_dtype_bytes for i in self.kv_cache_layers)
            if num_layers is None or num_layers >= self.num_hidden_layers:
                return whole
            return round(whole * num_layers / self.num_hidden_layers)
        layers = self.num_attention_layers if num_layers is None else round(
            num_layers * self.num_attention_layers / self.num_hidden_layers)
        return (layers * self.kv_factor * self.num_kv_heads_per_gpu(tensor_parallel_size)
                * self.kv_head_size * kv_dtype_bytes)

    @property
    def num_sliding_layers(self) -> int:
        return sum(t == SLIDING_ATTENTION for t in self.layer_types)

    @property
    def num_full_layers(self) -> int:
        return sum(t == FULL_ATTENTION for t in self.layer_types)

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    # --- parameters -------------------------------------------------------------------------------------

    @property
    def traits(self) -> Traits:
        return TRAITS.get(self.model_type, DEFAULT_TRAITS)

    def layer_params(self, layer: int) -> LayerParams:
        t = self.traits
        h = self.hidden_size
        heads = self.num_attention_heads
        kind = self.layer_types[layer]
        mixer_only = self.model_type == "nemotron_h"  # Nemotron-H: each block is one mixer, or one MLP
        if kind in (LINEAR_ATTENTION, MAMBA, NO_CACHE):
            mixer = self.state.params(h) if kind != NO_CACHE else 0
            mlp_params = self._mlp_params(layer) if not (mixer_only and kind != NO_CACHE) else LayerParams(
                0, 0, 0, 0, 0, 0, 0)
            norms = (1 if mixer_only else t.norms_per_layer) * h * t.norm_params_per_dim
            return LayerParams(mixer, 0, mlp_params.mlp, mlp_params.experts, mlp_params.active_experts,
                               mlp_params.router, norms)
        if self.is_mla:
            # DeepSeek-V2/V3 (modeling_deepseek): q through an optional low-rank q_a/q_b pair; one joint
            # kv_a projection to the latent + RoPE key, its norm, kv_b back to per-head K_nope and V.
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * qk_head
            else:
                q = h * heads * qk_head
            kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
                  + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim))
            o = heads * self.v_head_dim * h
            # vLLM keeps the down-projections whole on every TP rank (deepseek_v2.py DeepseekV2MLAAttention: q_a_proj
            # and kv_a_proj_with_mqa are ReplicatedLinear, fused as a MergedColumnParallelLinear with disable_tp=True
            # in 0.32, beside q_a_layernorm and kv_a_layernorm); q_b/kv_b split by heads, o_proj by rows.
            down = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            if self.q_lora_rank:
                down += h * self.q_lora_rank + self.q_lora_rank
            attention, kv_projection = q + kv + o, down
        else:
            d, kv_heads = self.layer_head_dim(layer), self.layer_num_kv_heads(layer)
            q = h * heads * d
            # Gemma 4's k_eq_v layers: the checkpoint has no v_proj, but vLLM loads K into qkv_proj's V slot too
            kv_projection = 2 * h * kv_heads * d
            o = heads * d * h
            attention = q + kv_projection + o
            if t.qkv_bias:
                attention += (heads + 2 * kv_heads) * d
                kv_projection += 2 * kv_heads * d
            if t.o_bias:
                attention += h
            if t.qk_norm:
                attention += 2 * d
            if t.attention_sinks:
                attention += heads
            if t.attn_output_gate:
                attention += h * heads * d
        if mixer_only:
            return LayerParams(attention, kv_projection, 0, 0, 0, 0, h * t.norm_params_per_dim)
        m = self._mlp_params(layer)
        norms = t.norms_per_layer * h * t.norm_params_per_dim
        router = m.router
        if self.gemma4 is not None:
            g = self.gemma4
            norms += 3 * h if g.enable_moe_block else 0  # the MoE block's pre/post norms
            # per-layer embeddings' gate and projection (ReplicatedLinear, so counted with the replicated router)
            router += 2 * h * g.hidden_size_per_layer_input
            norms += h if g.hidden_size_per_layer_input else 0
        return LayerParams(attention, kv_projection, m.mlp, m.experts, m.active_experts, router, norms)

    def _mlp_params(self, layer: int) -> LayerParams:
        """The MLP or MoE part of a layer (the other fields zero)."""
        t = self.traits
        h = self.hidden_size
        mlp = experts = active_experts = router = 0
        matrices = 3 if t.gated_mlp else 2
        if self.is_moe and layer >= (self.first_k_dense_replace or 0):
            inter = self.moe_intermediate_size or self.intermediate_size
            one_expert = matrices * h * inter + ((matrices - 1) * inter + h if t.mlp_bias else 0)
            experts = self.num_experts * one_expert
            active_experts = self.experts_per_token * one_expert
            mlp = (self.num_shared_experts or 0) * matrices * h * inter
            router = h * self.num_experts + (self.num_experts if t.mlp_bias else 0)
            if t.shared_expert_gate and self.num_shared_experts:
                router += h  # Qwen2-MoE / Qwen3-Next: a sigmoid gate on the shared expert's output
        else:
            mlp = matrices * h * self.intermediate_size
            if t.mlp_bias:
                mlp += (matrices - 1) * self.intermediate_size + h
        g = self.gemma4
        if g is not None and g.enable_moe_block:
            mlp += matrices * h * self.intermediate_size  # Gemma 4 26B-A4B: a dense MLP beside the experts
        elif g is not None and g.use_double_wide_mlp and self.kv_sharing_target(layer) is not None:
            mlp *= 2  # the KV-shared layers' MLP is twice as wide (gemma4.py use_double_wide_mlp)
        return LayerParams(0, 0, mlp, experts, active_experts, router, 0)

    @property
    def num_embedding_params(self) -> int:
        positions = 0
        if self.traits.learned_position_offset is not None:
            positions = (self.max_position_embeddings + self.traits.learned_position_offset) * self.hidden_size
        per_layer = 0
        if self.gemma4 is not None and self.gemma4.hidden_size_per_layer_input:
            # Gemma 4 E2B/E4B: an embedding of num_layers x width per token, and its projection from the hidden state
            width = self.num_hidden_layers * self.gemma4.hidden_size_per_layer_input
            per_layer = (self.gemma4.vocab_size_per_layer_input or self.vocab_size) * width + self.hidden_size * width
        return self.vocab_size * self.hidden_size + positions + per_layer

    @property
    def num_head_params(self) -> int:
        """Final norm and lm_head (zero extra when lm_head is tied to the token embedding)."""
        final_norm = self.hidden_size * self.traits.norm_params_per_dim
        return final_norm + (0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size)

    @property
    def num_params(self) -> int:
        """All parameters: embeddings, attention (GQA or MLA), MLP or every MoE expert, norms, lm_head unless tied."""
        return (self.num_embedding_params + self.num_head_params
                + sum(self.layer_params(i).total for i in range(self.num_hidden_layers)))

    @property
    def widest_mlp(self) -> int:
        """The widest dense MLP of any layer: Gemma 4's KV-shared layers run one twice the configured width
        (use_double_wide_mlp), which is the one vLLM's profiling run peaks on."""
        g = self.gemma4
        if g is not None and g.use_double_wide_mlp and not g.enable_moe_block and any(
                self.kv_sharing_target(i) is not None for i in range(self.num_hidden_layers)):
            return 2 * self.intermediate_size
        return self.intermediate_size

    @property
    def num_active_params(self) -> int:
        """Parameters one token passes through: ``num_params`` minus the routed experts it does not use."""
        return (self.num_embedding_params + self.num_head_params
                + sum(self.layer_params(i).active for i in range(self.num_hidden_layers)))

    def weight_format_for(self, quantization: str | None = None) -> WeightFormat | None:
        """The format the weights are held in: the checkpoint's own, or ``quantization`` (--quantization) for a
        checkpoint that names none. A --quantization that differs from the checkpoint's own is refused, as vLLM
        refuses it at start-up (ModelConfig's check: the method in the model config does not match the argument)."""
        name = requested_method(quantization, "--quantization")
        if name is not None:
            own = self.weight_format
            if own is not None and own.method != name:
                raise KvlabError(f"--quantization {quantization!r}: {self.id}'s config.json names its own weight "
                                 f"format, {own.method!r}, and vLLM refuses a --quantization that does not match it; "
                                 f"valid: {own.method} or no --quantization")
            return own if own is not None else QUANT_DEFAULTS[name]
        return self.weight_format

    def weights_source(self, quantization: str | None = None) -> str:
        fmt = self.weight_format_for(quantization)
        text = f"{self.num_params / 1e9:,.2f} B parameters counted from config.json's architecture"
        if self.is_moe:
            text += f" (all {self.num_experts} experts)"
        if self.vision_params:
            text += f" + {self.vision_params / 1e9:,.2f} B of vision tower and projector ({self.vision_source})"
        elif self.vision_source:
            text += f"; {self.vision_source}"
        if fmt is not None and fmt.scope == "experts" and not self.is_moe:
            # vLLM's Mxfp4Config.get_quant_method (quantization/mxfp4.py) quantizes FusedMoE layers only; linear
            # layers fall back to UnquantizedLinearMethod and attention is left alone
            text += (f"; {self.id} has no routed experts, so --quantization {fmt.method} changes nothing: vLLM "
                     "quantizes only MoE expert layers with it and keeps every weight here in the model dtype")
        elif fmt is not None:
            rest = "embeddings, norms, router" + ("" if fmt.for_part("lm_head") else " and lm_head")
            text += f"; {fmt.text}; {rest} and the parts not named in the model dtype" if fmt.parts else \
                f"; {fmt.text}; {rest} in the model dtype"
        if self.tie_word_embeddings:
            text += "; lm_head tied to the embedding (one copy)"
        return text

    def weights_bytes_for(self, layers: range, *, dtype_bytes: int, tensor_parallel_size: int = 1,
                          first_stage: bool = True, last_stage: bool = True, quantization: str | None = None,
                          expert_layout: str | None = None, expert_parallel: bool = False) -> int:
        """Weight bytes one GPU holds for ``layers`` (a pipeline stage) under tensor parallelism.

        vLLM splits embeddings (vocab-parallel), attention heads, MLP columns and experts across TP ranks;
        norms and routers are replicated, and K/V projections are replicated once TP exceeds the KV heads.
        With pipeline parallelism the first stage holds the embedding and the vision tower (replicated on each
        TP rank) and the last the final norm and lm_head (a second copy of the embedding when tied). Quantized
        formats (kvlab.catalog.quant) change the bytes of the linear layers or only of the routed experts;
        ``expert_layout`` (quant.expert_layout) counts MXFP4 experts as vLLM lays them out, padding, scales and
        biases included (quant.mxfp4_layer_bytes), rather than at the format's bytes per parameter. With
        ``expert_parallel`` the routed experts are dealt out whole, not split: the busiest GPU holds ceil(E / TP) of
        them (vLLM's determine_expert_map gives the first E mod TP ranks one more), one each where TP exceeds E.
        """
        tp = tensor_parallel_size
        fmt = self.weight_format_for(quantization)
        held = {part: (part_fmt.bytes_per_param if (part_fmt := fmt and fmt.for_part(part)) else dtype_bytes)
                for part in ("attention", "mlp", "experts", "lm_head")}
        expert_bytes = held["experts"]
        kv_replicas = max(1, tp // self.num_key_value_heads) if not self.is_mla else tp  # (LayerParams.kv_projection)
        # The share of a MoE layer's routed experts one GPU holds: 1 / TP of each, or ceil(E / TP) whole ones
        local = -(-self.num_experts // tp) / self.num_experts if expert_parallel and self.is_moe else 1 / tp
        laid_out = None  # one MoE layer's experts on one GPU in vLLM's layout
        if self.is_moe and expert_layout is not None:
            width = (self.moe_intermediate_size or self.intermediate_size) // (1 if expert_parallel else tp)
            num_local = -(-self.num_experts // tp) if expert_parallel else self.num_experts
            laid_out = mxfp4_layer_bytes(expert_layout, num_local, self.hidden_size, width, dtype_bytes)
        total = 0.0
        for i in layers:
            p = self.layer_params(i)
            attention = (p.attention - p.kv_projection) / tp + p.kv_projection * kv_replicas / tp
            experts = laid_out if laid_out is not None and p.experts else p.experts * local * expert_bytes
            total += attention * held["attention"] + p.mlp / tp * held["mlp"] + experts
            total += (p.router + p.norms) * dtype_bytes
        vocab_matrix = self.vocab_size * self.hidden_size
        if first_stage:
            # The vision tower's linear layers are split across TP ranks as the decoder's are, unless vLLM builds it
            # from transformers' own modules (Gemma 4: gemma4_mm.py), which every rank holds whole.
            if self.vision_whole:
                total += (self.num_embedding_params / tp + self.vision_params) * dtype_bytes
            else:
                total += (self.num_embedding_params + self.vision_params) / tp * dtype_bytes
        if last_stage:
            total += self.hidden_size * self.traits.norm_params_per_dim * dtype_bytes
            if not self.tie_word_embeddings or not first_stage:
                total += vocab_matrix / tp * held["lm_head"]
        return int(total)

    def weights_bytes(self, dtype_bytes: int | None = None, tensor_parallel_size: int = 1) -> int:
        """Bytes of all weights on one GPU with TP only (no pipeline stages)."""
        return self.weights_bytes_for(range(self.num_hidden_layers),
                                      dtype_bytes=self.dtype_bytes if dtype_bytes is None else dtype_bytes,
                                      tensor_parallel_size=tensor_parallel_size)


# --- building specs from config.json-style dicts -------------------------------------------------------

REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")

# config.json spells some fields differently per family; vLLM/transformers read these aliases.
FIELD_ALIASES = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"),
    "intermediate_size": ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"),
    "num_experts": ("num_experts", "num_local_experts", "n_routed_experts"),
    "experts_per_token": ("experts_per_token", "num_experts_per_tok", "num_experts_per_token", "top_k_experts"),
    "num_shared_experts": ("num_shared_experts", "n_shared_experts"),
    "dtype": ("dtype", "torch_dtype"),
}


# Every field of a config.json that kvlab reads as a whole number, wherever it sits (top level, text_config,
# vision_config, audio_config, quantization_config and its groups, rope_scaling): the REQUIRED and optional sizes under
# all their aliases, and those the hybrid, Gemma 4, vision, RoPE and quantization readers take. A string, a fraction or
# a bool there is refused (check_integer_fields), not converted: Hugging Face writes them as JSON integers, and
# transformers and vLLM do arithmetic on them as they are.
INTEGER_FIELDS = frozenset(
    {alias for name, aliases in FIELD_ALIASES.items() if name != "dtype" for alias in aliases}
    | {"head_dim", "sliding_window", "sliding_window_pattern", "max_window_layers", "kv_lora_rank", "q_lora_rank",
       "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "moe_intermediate_size", "first_k_dense_replace",
       "vocab_size", "num_nextn_predict_layers", "mtp_num_hidden_layers", "num_kv_shared_layers",
       "hidden_size_per_layer_input", "vocab_size_per_layer_input", "global_head_dim", "num_global_key_value_heads",
       "shared_expert_intermediate_size", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
       "linear_value_head_dim", "linear_conv_kernel_dim", "mamba_d_state", "mamba_d_conv", "mamba_expand",
       "mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_num_heads", "mamba_head_dim", "ssm_state_size",
       "n_groups", "conv_kernel", "attn_layer_period", "attn_layer_offset", "full_attention_interval", "depth",
       "patch_size", "temporal_patch_size", "spatial_merge_size", "out_hidden_size", "position_embedding_size",
       "output_proj_dims", "in_channels", "in_chans", "image_size", "pooling_kernel_size", "num_position_embeddings",
       "conv_kernel_size", "bits", "num_bits", "group_size", "original_max_position_embeddings"})


JSON_KINDS = {bool: "a bool", str: "a string", float: "a decimal number"}


def integer_example(value: object) -> str:
    """' such as 32' where ``value`` ("32", 32.0) reads as that integer, else ''."""
    try:
        number = float(value) if isinstance(value, (str, float)) else None
    except ValueError:
        return ""
    return f" such as {int(number)}" if number is not None and number.is_integer() else ""


def check_integer_fields(config: object, where: str, path: str = "") -> None:
    """Refuse, with one line naming the field, its value and what is valid, the first of INTEGER_FIELDS in ``config``
    (nested objects included) whose value is not a JSON integer: a string ("32"), a decimal number (32.5 or 32.0) or a bool
    (true is 1 to Python, not a size). null is left to the readers (a missing field)."""
    items = config.items() if isinstance(config, dict) else enumerate(config) if isinstance(config, list) else ()
    for key, value in items:
        at = f"{path}.{key}" if path and isinstance(key, str) else f"{path}[{key}]" if path else str(key)
        if isinstance(value, (dict, list)):
            check_integer_fields(value, where, at)
        elif key in INTEGER_FIELDS and value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            kind = JSON_KINDS.get(type(value), f"a {type(value).__name__}")
            raise KvlabError(f"{where}: {at} {value!r} is {kind}, not a whole number written as a JSON integer; "
                             f"valid: a JSON integer{integer_example(value)}, without quotes or a decimal point (true "
                             "and false are not integers)")


def _get(fields: dict, name: str):
    for key in FIELD_ALIASES.get(name, (name,)):
        if fields.get(key) is not None:
            return fields[key]
    return None


def _mtp_layers(fields: dict) -> int:
    """config.json's num_nextn_predict_layers, or Qwen3.5's mtp_num_hidden_layers (which vLLM's SpeculativeConfig
    takes as the MTP drafter's n_predict); 0 where missing or not a whole number above 0."""
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        value = fields.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _softcap(fields: dict, where: str) -> float | None:
    """config.json's final_logit_softcapping: a number above 0, or None where missing or null (vLLM reads it with
    getattr(config, 'final_logit_softcapping', None) for Gemma 4, config.final_logit_softcapping for Gemma 2 and 3)."""
    value = fields.get("final_logit_softcapping")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise KvlabError(f"{where}: final_logit_softcapping {value!r} is not a soft cap; valid: a number above 0 (Gemma "
                         "2 and 4 write 30.0), or null for none")
    return float(value)


def derive_layer_types(fields: dict, model_type: str, num_layers: int, sliding_window: int | None,
                       where: str) -> tuple[str, ...]:
    """Each layer's attention type, as vLLM decides it.

    An explicit ``layer_types`` list wins. Otherwise a ``sliding_window_pattern`` P makes every P-th layer
    full (Gemma 3: 5 local : 1 global); Gemma 2 alternates (transformers' default layer_types); and a
    plain ``sliding_window`` with no per-layer list makes every layer slide, because vLLM then copies the
    window into CacheConfig.sliding_window for all layers (engine/arg_utils.py, create_engine_config).
    """
    explicit = fields.get("layer_types")
    if explicit is not None:
        # Granite 4 spells them 'attention' and 'mamba'; Qwen3.5 'full_attention' and 'linear_attention'.
        explicit = [FULL_ATTENTION if t == "attention" else t for t in explicit]
        if len(explicit) != num_layers:
            raise KvlabError(f"{where}: layer_types has {len(explicit)} entries but num_hidden_layers is "
                             f"{num_layers}")
        known = (FULL_ATTENTION, SLIDING_ATTENTION, LINEAR_ATTENTION, MAMBA)
        unknown = sorted({t for t in explicit if t not in known})
        if unknown:
            raise KvlabError(f"{where}: layer type {unknown[0]!r} is not modelled; kvlab sizes {', '.join(known)} "
                             "layers")
        if SLIDING_ATTENTION in explicit and sliding_window is None:
            raise KvlabError(f"{where}: layer_types has sliding layers but sliding_window is missing")
        return tuple(explicit)
    hybrid = hybrid_layer_types(fields, model_type, num_layers)
    if hybrid is not None:
        return hybrid
    if sliding_window is None:
        return (FULL_ATTENTION,) * num_layers
    pattern = fields.get("sliding_window_pattern")
    if pattern is None and model_type == "gemma2":
        pattern = 2
    if pattern is None and model_type == "gpt_oss":
        pattern = 2
    if model_type == "qwen2" and fields.get("max_window_layers") is not None:
        # Qwen2 with use_sliding_window: layers from max_window_layers on slide (transformers' Qwen2Config).
        first = fields["max_window_layers"]
        return tuple(SLIDING_ATTENTION if i >= first else FULL_ATTENTION for i in range(num_layers))
    if pattern:
        return tuple(FULL_ATTENTION if i % pattern == pattern - 1 else SLIDING_ATTENTION for i in range(num_layers))
    return (SLIDING_ATTENTION,) * num_layers


def refuse_per_layer_attention(fields: dict, where: str) -> None:
    """A one-line refusal for attention whose shape differs from layer to layer beyond sliding vs full (Gemma 4:
    full-attention layers of another head size and KV head count, keys doubling as values, the last layers reading
    an earlier layer's cache); kvlab sizes one head size and one cache per attention layer, so it does not guess."""
    head_dim, global_dim = fields.get("head_dim"), fields.get("global_head_dim")
    kv_heads, global_kv = fields.get("num_key_value_heads"), fields.get("num_global_key_value_heads")
    shared = fields.get("num_kv_shared_layers") or 0
    why = []
    if global_dim is not None and global_dim != head_dim:
        why.append(f"full-attention layers of head size {global_dim} beside sliding ones of {head_dim}")
    if global_kv is not None and global_kv != kv_heads:
        why.append(f"{global_kv} KV heads in full-attention layers against {kv_heads}")
    if fields.get("attention_k_eq_v"):
        why.append("keys that serve as values (attention_k_eq_v)")
    if shared:
        why.append(f"the last {shared} layers reading earlier layers' KV cache (num_kv_shared_layers)")
    if why:
        raise KvlabError(f"{where}: this attention layout is not modelled ({fields.get('model_type') or 'model'}: "
                         f"{'; '.join(why)}); kvlab sizes one head size and one KV cache per attention layer")


# transformers' Gemma4TextConfig default (configuration_gemma4.py, transformers 5.19), what vLLM reads when a Gemma 4
# config.json leaves max_position_embeddings out
GEMMA4_MAX_POSITION_EMBEDDINGS = 131_072


def gemma4_layout(fields: dict, model_type: str, where: str) -> Gemma4Layout | None:
    """Gemma 4's per-layer-type attention and cache sharing, as vLLM reads them; other models with such fields are
    refused (refuse_per_layer_attention), their layouts not having been read in vLLM's source."""
    if not model_type.startswith("gemma4"):
        refuse_per_layer_attention(fields, where)
        return None
    return Gemma4Layout(
        global_head_dim=fields.get("global_head_dim"), num_global_key_value_heads=fields.get("num_global_key_value_heads"),
        attention_k_eq_v=bool(fields.get("attention_k_eq_v")),
        num_kv_shared_layers=int(fields.get("num_kv_shared_layers") or 0),
        hidden_size_per_layer_input=int(fields.get("hidden_size_per_layer_input") or 0),
        vocab_size_per_layer_input=int(fields.get("vocab_size_per_layer_input") or 0),
        use_double_wide_mlp=bool(fields.get("use_double_wide_mlp")),
        enable_moe_block=bool(fields.get("enable_moe_block")))


def gemma4_defaults(fields: dict, notes: tuple[str, ...]) -> tuple[dict, tuple[str, ...]]:
    """A Gemma 4 config.json without max_position_embeddings takes transformers' default, and the notes say so."""
    if _get(fields, "max_position_embeddings") is not None:
        return fields, notes
    return ({**fields, "max_position_embeddings": GEMMA4_MAX_POSITION_EMBEDDINGS},
            (*notes, "max_position_embeddings not in config.json: transformers' Gemma4TextConfig default, "
                     f"{GEMMA4_MAX_POSITION_EMBEDDINGS:,}"))


def _shared_from_width(fields: dict, moe_width: int | None) -> int | None:
    """Qwen2-MoE / Qwen3-Next give one shared expert's width (shared_expert_intermediate_size) instead of a count:
    as a count of routed-expert widths, which is how the parameters are counted."""
    width = fields.get("shared_expert_intermediate_size")
    if not width or not moe_width:
        return None
    return max(1, round(width / moe_width))


def _card_number(text: str | None) -> float | None:
    """'15.7B (...)' -> 15.7e9; '13B' -> 13e9; None when the card gives no figure."""
    if not text:
        return None
    match = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)\s*B", text)
    return float(match.group(1)) * 1e9 if match else None


def _weight_format(fields: dict, where: str) -> WeightFormat | None:
    """The checkpoint's quantized layout: its config.json's quantization_config, else the catalogue's
    ``quantization`` name's default layout; None for 16-bit weights."""
    qc = fields.get("quantization_config")
    if qc is not None and not isinstance(qc, dict):
        raise KvlabError(f"{where}: quantization_config is {type(qc).__name__} {str(qc)[:40]!r}; valid: an object "
                         "with its quant_method (as Hugging Face checkpoints write it), or no such field")
    if isinstance(qc, dict):
        return from_quantization_config(qc, where)
    quantization = fields.get("quantization")
    return QUANT_DEFAULTS[check_method(quantization, where)] if quantization is not None else None


def spec_from_fields(fields: dict, *, id: str, where: str, origin: str, hf_repo: str | None = None,
                     source: tuple[str, ...] = (), notes: tuple[str, ...] = (),
                     aliases: tuple[str, ...] = ()) -> ModelSpec:
    """Build a ModelSpec from config.json-named fields; a missing needed field is named in the error."""
    gemma4 = gemma4_layout(fields, fields.get("model_type") or "", where)
    fields, notes = gemma4_defaults(fields, notes) if gemma4 is not None else (fields, notes)
    for name in REQUIRED:
        if _get(fields, name) is None:
            raise KvlabError(f"{where}: missing field {name!r} (needed to size the KV cache)")
    from kvlab.validate import ModelFields, model_fields

    # the weight format first: a format kvlab does not model is the reason given, whatever else the config lacks
    weight_format = _weight_format(fields, where)
    quantization = weight_format.method if weight_format is not None else fields.get("quantization")
    model_type = fields.get("model_type") or ""
    # A dense checkpoint of a MoE family says so with zeros (Granite 4.0 micro: num_local_experts 0,
    # num_experts_per_tok 0): no experts, nothing to check of them.
    dense = not _get(fields, "num_experts")
    if not dense and _get(fields, "intermediate_size") is None and fields.get("moe_intermediate_size") \
            and not fields.get("first_k_dense_replace") and not fields.get("mlp_only_layers"):
        # Qwen3.5-MoE's text_config names no dense MLP width: every layer is sparse (vLLM's qwen3_5_moe.py builds
        # no dense MLP), so the width is never read; the expert's stands in for it
        fields = {**fields, "intermediate_size": fields["moe_intermediate_size"]}
    numbers = model_fields({name: value for name in ModelFields.model_fields
                            if (value := _get(fields, name)) is not None
                            and not (dense and name == "experts_per_token")}, where)
    num_layers, hidden, heads = numbers.num_hidden_layers, numbers.hidden_size, numbers.num_attention_heads
    kv_heads = heads if numbers.num_key_value_heads is None else numbers.num_key_value_heads
    head_dim = hidden // heads if numbers.head_dim is None else numbers.head_dim
    kv_lora_rank = numbers.kv_lora_rank or None
    if kv_lora_rank is not None:
        for name in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if fields.get(name) is None:
                raise KvlabError(f"{where}: missing field {name!r} (needed for MLA, kv_lora_rank is set)")
    intermediate, max_pos = numbers.intermediate_size, numbers.max_position_embeddings
    dtype = _get(fields, "dtype") or "float32"  # transformers' default when config.json names none
    dtype = str(dtype).removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise KvlabError(f"{where}: dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    sliding_window = numbers.sliding_window or None  # vLLM turns 0 into None
    if fields.get("use_sliding_window") is False or (model_type.startswith("qwen")
                                                     and not fields.get("use_sliding_window")):
        sliding_window = None  # Qwen2/3: the window is present but off unless use_sliding_window is true
    num_experts = numbers.num_experts or None
    experts_per_token = numbers.experts_per_token
    if num_experts and experts_per_token is None:
        raise KvlabError(f"{where}: missing field 'num_experts_per_tok' (the model has {num_experts} experts)")
    tie = fields.get("tie_word_embeddings")
    if tie is None:
        tie = TRAITS.get(model_type, DEFAULT_TRAITS).tie_word_embeddings_default
    layer_types = derive_layer_types(fields, model_type, num_layers, sliding_window, where)
    state = state_layout(fields, model_type, where)
    if state is None and any(t in (LINEAR_ATTENTION, MAMBA) for t in layer_types):
        raise KvlabError(f"{where}: the model has linear-attention or Mamba layers but no state sizes kvlab knows")
    if SLIDING_ATTENTION not in layer_types:
        sliding_window = None
    return ModelSpec(
        id=id, hf_repo=hf_repo, model_type=model_type,
        architecture=fields.get("architecture") or ((fields.get("architectures") or [""])[0]),
        num_hidden_layers=num_layers, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, intermediate_size=intermediate, vocab_size=numbers.vocab_size,
        max_position_embeddings=max_pos, dtype=dtype, tie_word_embeddings=bool(tie),
        layer_types=layer_types, sliding_window=sliding_window,
        kv_lora_rank=kv_lora_rank, q_lora_rank=numbers.q_lora_rank or None,
        qk_rope_head_dim=numbers.qk_rope_head_dim, qk_nope_head_dim=numbers.qk_nope_head_dim,
        v_head_dim=numbers.v_head_dim,
        num_experts=num_experts, experts_per_token=experts_per_token if num_experts else None,
        moe_intermediate_size=numbers.moe_intermediate_size,
        num_shared_experts=numbers.num_shared_experts if numbers.num_shared_experts is not None else
        _shared_from_width(fields, numbers.moe_intermediate_size),
        first_k_dense_replace=numbers.first_k_dense_replace, quantization=quantization, weight_format=weight_format,
        state=state, gemma4=gemma4, num_nextn_predict_layers=_mtp_layers(fields),
        final_logit_softcapping=_softcap(fields, where),
        rope_caches=rope_caches(fields, model_type, head_dim, max_pos, layer_types), aliases=aliases,
        num_params_card=_card_number(fields.get("params_total_card")),
        num_active_params_card=_card_number(fields.get("params_active_card")),
        params_total_card=fields.get("params_total_card"), params_active_card=fields.get("params_active_card"),
        origin=origin, notes=notes, source=source,
    )


# Families sized with the default (Llama-style) traits, checked on config.jsons outside the catalogue against
# vLLM's startup figures (tests/data/sizing_configs: Seed-OSS, Granite 4.0 micro): the only ones named here.
CHECKED_DEFAULT_TRAITS = ("granitemoehybrid", "seed_oss")


def checked_model_types() -> tuple[str, ...]:
    """The model_type values kvlab has checked its sizing on: the catalogue's families, those with traits of their
    own (TRAITS), the MLA families (kvlab.catalog.rope), the vision-language ones (kvlab.catalog.vision, with
    their text configs' '_text' types) and CHECKED_DEFAULT_TRAITS."""
    from kvlab.catalog.rope import MLA_TYPES
    from kvlab.catalog.vision import MAX_PIXELS

    return tuple(sorted({e["model_type"] for e in catalogue_entries()} | set(TRAITS) | MLA_TYPES | set(MAX_PIXELS)
                        | {f"{t}_text" for t in MAX_PIXELS} | set(CHECKED_DEFAULT_TRAITS)))


def unchecked_family_note(spec: ModelSpec) -> str | None:
    """A note for a config.json whose model_type is none of checked_model_types (trial 58, finding 9: sized as a
    Llama-style decoder without a word); None for a checked family, a hybrid (its state layers are read from the
    config's own fields) or a catalogue model."""
    if spec.origin == "catalogue" or spec.model_type in checked_model_types() or spec.state is not None:
        return None
    named = f"model_type {spec.model_type!r}" if spec.model_type else "the config.json names no model_type and"
    return (f"{named} is none of the families kvlab has checked ({', '.join(checked_model_types())}): its weights are "
            "counted as a Llama-style decoder's (a gated MLP, no biases), and the KV cache follows from its heads, "
            "head size and layers; check against vLLM's startup log (kvlab vllm log) before relying on it")


# --- the bundled catalogue -----------------------------------------------------------------------------

@cache
def catalogue_entries() -> tuple[dict, ...]:
    """The raw entries of data/models.json (package data; read once)."""
    text = resources.files("kvlab.catalog").joinpath("data/models.json").read_text(encoding="utf-8")
    return tuple(json.loads(text)["models"])


@cache
def list_models() -> tuple[ModelSpec, ...]:
    return tuple(
        spec_from_fields(e, id=e["id"], where=f"catalogue entry {e['id']}", origin="catalogue",
                         hf_repo=e.get("hf_repo"), source=tuple(e["source"]), notes=tuple(e["notes"]),
                         aliases=tuple(e.get("aliases", ())))
        for e in catalogue_entries()
    )


def name_key(name: str) -> str:
    """Forgiving name matching: case, spaces, underscores and hyphens do not matter ('A100_40GB' = 'a100-40gb')."""
    return re.sub(r"[^a-z0-9.]", "", name.strip().lower())


@cache
def _model_index() -> dict[str, ModelSpec]:
    index: dict[str, ModelSpec] = {}
    for spec in list_models():
        names = [spec.id, *spec.aliases]
        if spec.hf_repo:
            names += [spec.hf_repo, spec.hf_repo.split("/")[-1]]
        for name in names:
            index.setdefault(name_key(name), spec)
    return index


def find_catalogue_model(name: str) -> ModelSpec | None:
    return _model_index().get(name_key(name))


def closest_model_names(name: str, n: int = 3) -> list[str]:
    import difflib

    names = {spec.id: spec.id for spec in list_models()}
    for spec in list_models():
        for alias in (*spec.aliases, spec.hf_repo or ""):
            if alias:
                names.setdefault(alias.lower(), spec.id)
    hits = difflib.get_close_matches(name.strip().lower(), list(names), n=8, cutoff=0.5)
    ordered = list(dict.fromkeys(names[h] for h in hits))
    return ordered[:n]

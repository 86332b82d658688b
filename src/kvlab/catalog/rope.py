"""The rotary embedding's cos/sin caches: tensors vLLM builds on the GPU with the model, beside its weights.

vLLM's ``get_rope`` (vllm/model_executor/layers/rotary_embedding/__init__.py) builds one rotary embedding per distinct
(head size, rotary dim, max position, style, scaling, dtype) and every layer that asks for the same one shares it
(its ``_ROPE_DICT``). Each holds a ``cos_sin_cache`` buffer of ``rows`` positions x ``rotary_dim`` values (cos and sin
halves side by side, base.py), created on the GPU when the model is built, so it is inside "Model loading took", on
every tensor-parallel rank (it is not split). Its dtype is the model's (``torch.get_default_dtype()`` while the model
is built) unless the model asks for another (gpt-oss: float32, gpt_oss.py).

How many rows, by the scaling's ``rope_type`` (rotary_embedding/*.py):

- default, llama3, ntk, dynamic with ``alpha``: ``max_position_embeddings``;
- linear (linear_scaling_rope.py) and dynamic with ``factor``: ``max_position_embeddings x factor``;
- yarn (yarn_scaling_rope.py) and deepseek_yarn (deepseek_scaling_rope.py): ``original_max_position_embeddings x
  factor``, rounded up;
- longrope (Phi-3): a short and a long cache, ``original_max_position_embeddings + max_position_embeddings``.

The rotary dim is ``head_dim x partial_rotary_factor`` (Qwen3-Next: 0.25), the MLA models' ``qk_rope_head_dim``, and,
for Gemma 4's "proportional" RoPE of its full-attention layers, the whole head (gemma4_rope.py rotates every dim,
the ones past the partial factor by an angle of 0). Gemma 3 builds two (a local base for its sliding layers, the
global one with the config's scaling), Gemma 4 one per layer type.

Not counted, each because vLLM builds no such cache or kvlab counts it elsewhere: models without rotary positions
(OPT's learned positions, Nemotron-H's and Jamba's attention, Granite 4.0 hybrids unless position_embedding_type is
"rope"), and M-RoPE (Qwen-VL: catalog/vision.py LoadBuffers, which enlarges it for video). Not modelled: later
vLLM releases keep DeepSeek's YaRN cache in float32 where FlashInfer applies it (a 64-wide cache, 2 bytes a value
more); kvlab counts it in the model's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Model types whose attention uses no rotary embedding (vLLM builds no cos/sin cache for them).
NO_ROPE = frozenset({"opt", "gpt2", "bloom", "mpt", "jamba", "mamba", "mamba2", "nemotron_h"})
FLOAT32 = frozenset({"gpt_oss"})  # models that ask get_rope for a float32 cache
MLA_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_vl"})


@dataclass(frozen=True)
class RopeCache:
    """One cos/sin cache: ``rows`` positions x ``width`` (the rotary dim) values."""

    rows: int
    width: int
    float32: bool = False  # float32 whatever the model's dtype (gpt-oss)

    def bytes(self, dtype_bytes: int) -> int:
        return self.rows * self.width * (4 if self.float32 else dtype_bytes)

    @property
    def text(self) -> str:
        return f"{self.rows:,} x {self.width}" + (" (float32)" if self.float32 else "")


def _scaling(fields: dict) -> dict:
    scaling = fields.get("rope_scaling") or fields.get("rope_parameters") or {}
    return scaling if isinstance(scaling, dict) else {}


def _number(value, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else default


def _rows(scaling: dict, max_positions: int) -> int:
    """Positions one cache holds under ``scaling`` (a config's rope_scaling / rope_parameters)."""
    kind = str(scaling.get("rope_type") or scaling.get("type") or "default")
    factor = _number(scaling.get("factor"), 1.0)
    original = int(_number(scaling.get("original_max_position_embeddings"), max_positions))
    if kind == "linear" or (kind == "dynamic" and "alpha" not in scaling):
        return int(max_positions * factor)
    if kind in ("yarn", "deepseek_yarn", "deepseek_llama_scaling"):
        return math.ceil(original * factor)
    if kind == "longrope":
        return original + max_positions
    return max_positions


def _gemma(fields: dict, model_type: str, head_dim: int, max_positions: int, layer_types: tuple[str, ...]):
    """Gemma 3's two caches and Gemma 4's one per layer type, or None for other models."""
    if model_type.startswith("gemma4"):
        given = fields.get("rope_parameters")
        params: dict = given if isinstance(given, dict) else {}
        caches = []
        for kind in dict.fromkeys(layer_types):
            entry = params.get(kind)
            scaling: dict = entry if isinstance(entry, dict) else {}
            proportional = scaling.get("rope_type") == "proportional"
            width = int(fields.get("global_head_dim") or head_dim) if kind == "full_attention" else head_dim
            width = width if proportional else int(width * _number(scaling.get("partial_rotary_factor"), 1.0))
            caches.append(RopeCache(_rows(scaling if not proportional else {}, max_positions), width))
        return tuple(dict.fromkeys(caches))
    if model_type in ("gemma3", "gemma3_text"):
        # the sliding layers' local base (default scaling), then the global layers' with the config's scaling
        return (RopeCache(max_positions, head_dim), RopeCache(_rows(_scaling(fields), max_positions), head_dim))
    return None


def rope_caches(fields: dict, model_type: str, head_dim: int, max_positions: int,
                layer_types: tuple[str, ...] = ()) -> tuple[RopeCache, ...]:
    """The cos/sin caches vLLM builds for a model of config.json ``fields`` (the text model's), one per distinct
    rotary embedding; () where it builds none or kvlab counts it elsewhere (M-RoPE)."""
    scaling = _scaling(fields)
    if model_type in NO_ROPE or "mrope_section" in scaling or max_positions <= 0:
        return ()
    if model_type == "granitemoehybrid" and fields.get("position_embedding_type") != "rope":
        return ()
    gemma = _gemma(fields, model_type, head_dim, max_positions, layer_types)
    if gemma is not None:
        return gemma
    if model_type in MLA_TYPES and fields.get("qk_rope_head_dim"):
        width = int(fields["qk_rope_head_dim"])
    else:
        partial = _number(fields.get("partial_rotary_factor", scaling.get("partial_rotary_factor")), 1.0)
        width = int(head_dim * min(partial, 1.0))
    return (RopeCache(_rows(scaling, max_positions), width, float32=model_type in FLOAT32),)


def rope_bytes(caches: tuple[RopeCache, ...], dtype_bytes: int) -> int:
    return sum(c.bytes(dtype_bytes) for c in caches)

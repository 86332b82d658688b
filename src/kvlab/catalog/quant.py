"""Quantized weight layouts: the bytes one parameter takes in a checkpoint's format, read from ``quantization_config``.

A linear layer of ``rows x cols`` parameters quantized to ``bits`` with one scale per ``group_size`` values (and a
zero point per group when asymmetric) takes::

    rows x cols x (bits / 8  +  (scale_bytes + zero_point_bits / 8) / group_size)

e.g. GPTQ/AWQ INT4 with groups of 128 and fp16 scales: 0.5 + 2 / 128 (+ 0.5 / 128 with AWQ's zero points) bytes per
parameter; MXFP4: 4 bits + one 8-bit scale per 32 = 4.25 bits; NVFP4: 4 bits + one fp8 scale per 16 = 4.5 bits;
FP8 with 128 x 128 block scales: 1 + 4 / 16384. Per-channel and per-tensor scales (one per output row or one per
matrix) are below a thousandth of the weights and not counted. What is never quantized: embeddings, norms, the MoE
router, and the lm_head unless the format says so (vLLM's quant methods skip them: UnquantizedEmbeddingMethod,
``modules_to_not_convert`` / ``ignore``). vLLM repacks INT4 and FP8 into Marlin's layout on GPUs whose tensor cores
lack the format (FP8 before Ada, FP4 before Blackwell): the same bits and scales, so the same bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvlab.errors import KvlabError


@dataclass(frozen=True)
class WeightFormat:
    """How a checkpoint stores its quantized weights. ``scope``: "linear" (every linear layer of the decoder) or
    "experts" (only the routed experts, gpt-oss's MXFP4)."""

    method: str
    bits: int
    group_size: int | None = None  # values per scale; None: per channel or per tensor (not counted)
    scale_bytes: float = 0.0
    zero_point_bits: int = 0
    scope: str = "linear"
    # A mixed-precision checkpoint (ModelOpt MIXED_PRECISION): one format per part of the model (PARTS), a part not
    # named held in the model dtype; the fields above then describe the routed experts' format.
    parts: tuple[tuple[str, WeightFormat], ...] = ()
    # Block quantization (FP8's weight_block_size, compressed-tensors' block strategy): the block's rows, the output
    # channels one scale covers, which a tensor-parallel split must keep whole (kvlab.sizing.tensor_parallel_refusal).
    block_n: int | None = None

    @property
    def bytes_per_param(self) -> float:
        overhead = 0.0 if not self.group_size else (self.scale_bytes + self.zero_point_bits / 8) / self.group_size
        return self.bits / 8 + overhead

    def for_part(self, part: str) -> WeightFormat | None:
        """The format ``part`` (one of PARTS) is held in; None for the model dtype. A single-format checkpoint
        quantizes its routed experts, and its attention and MLP linears unless its scope is the experts only; its
        lm_head stays in the model dtype."""
        if self.parts:
            return dict(self.parts).get(part)
        if part == "experts" or (part in ("attention", "mlp") and self.scope == "linear"):
            return self
        return None

    @property
    def layout_text(self) -> str:
        """The bits and scales of one parameter, e.g. '4 bits, a 1-B scale per 16 values = 0.5625 B per parameter'."""
        groups = f", a {self.scale_bytes:g}-B scale" if self.group_size else ""
        if self.group_size:
            groups += f"{' + ' + str(self.zero_point_bits) + '-bit zero point' if self.zero_point_bits else ''} " \
                      f"per {self.group_size:,} values"
        return f"{self.bits} bits{groups} = {self.bytes_per_param:.4g} B per parameter"

    @property
    def text(self) -> str:
        if self.parts:
            held = "; ".join(f"{PARTS[part]} in {fmt.method}, {fmt.layout_text}" for part, fmt in self.parts)
            return f"{self.method}: {held}"
        where = "routed experts" if self.scope == "experts" else "linear layers"
        return f"{self.method} {where}: {self.layout_text}"


# The parts of a decoder a mixed-precision checkpoint may hold in different formats (WeightFormat.parts), as kvlab
# counts them (kvlab.catalog.models.LayerParams): attention (self-attention or linear-attention projections), mlp (a
# dense MLP or the shared experts), experts (the routed experts), lm_head.
PARTS = {"attention": "attention projections", "mlp": "dense MLP / shared experts", "experts": "routed experts",
         "lm_head": "lm_head"}


# The format each method name means when nothing more is said (--quantization, or a config naming only the method).
DEFAULTS = {
    "fp8": WeightFormat("fp8", 8),
    "fbgemm_fp8": WeightFormat("fbgemm_fp8", 8),
    "int8": WeightFormat("int8", 8),
    "gptq": WeightFormat("gptq", 4, 128, 2.0),
    "awq": WeightFormat("awq", 4, 128, 2.0, 4),
    "auto-round": WeightFormat("auto-round", 4, 128, 2.0),
    "mxfp4": WeightFormat("mxfp4", 4, 32, 1.0, scope="experts"),
    "nvfp4": WeightFormat("nvfp4", 4, 16, 1.0),
    "bitsandbytes": WeightFormat("bitsandbytes", 4, 64, 4.0),
}
# Names vLLM and checkpoints use for the same methods.
SPELLINGS = {"gptq_marlin": "gptq", "awq_marlin": "awq", "auto_round": "auto-round", "autoround": "auto-round",
             "modelopt_fp4": "nvfp4", "w8a8": "int8", "ptpc_fp8": "fp8", "fp8_e4m3": "fp8", "gpt_oss_mxfp4": "mxfp4"}


def expert_layout(fmt: WeightFormat | None, capability: float | None, hopper_layout: str) -> str | None:
    """How vLLM lays out the routed experts (mxfp4_layer_bytes), or None where the format's plain bytes per
    parameter hold: MXFP4 experts take Marlin's layout below compute capability 9.0 (0.10.1's _should_use_marlin and
    0.14.1's get_mxfp4_backend pick Marlin there; kvlab keeps that for the releases between and after) and the
    version's ``hopper_layout`` (kvlab.vllm_rules) from 9.0 on, and on a GPU kvlab does not know."""
    if fmt is None or fmt.method != "mxfp4":
        return None
    if capability is not None and capability < 9.0:
        return "marlin"
    return hopper_layout


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def mxfp4_layer_bytes(layout: str, num_experts: int, hidden: int, width: int, act_bytes: int) -> int:
    """Bytes of one MoE layer's MXFP4 experts on one GPU as vLLM holds them after loading, ``width`` the expert
    width (intermediate size) per GPU. Each expert has gate_up (2 x width rows of hidden) and down (hidden rows of
    width) at 4 bits, one 8-bit scale per 32 values along each row, and a bias per output row
    (Mxfp4MoEMethod.create_weights in vllm/model_executor/layers/quantization/mxfp4.py, read in 0.10.1 and 0.14.1).

    ``"marlin"``: the width padded to a multiple of 128 and hidden to 256 ("n % 256 == 0 and k % 128 == 0");
    prepare_moe_fp4_layer_for_marlin (quantization/utils/marlin_utils_fp4.py) repacks weights and scales into new
    tensors of the same bytes (scales back to float8_e8m0, 1 B) and the biases in the model dtype.
    ``"triton"`` (triton_kernels on Hopper, 0.14.1): the width padded to 64, hidden unpadded; the biases become
    float32; _swizzle_mxfp4 (quantization/utils/mxfp4_utils.py) copies the scales into triton_kernels'
    HopperMXScaleLayout, rows (2 x width and hidden) padded to 2 x num_warps 8 x 2 x 8 = 256 and columns to 2,
    kept in the method's precision config, while the loaded scales stay registered on the layer (only w13_weight
    and w2_weight are deleted), so both count. The value layout re-packs the weights without padding at gpt-oss's
    shapes (16 rows, 32 bytes: triton_kernels' hopper_value.py of the (shape, mx_axis) interface 0.14.1 calls).
    """
    if layout == "marlin":
        width, hidden = _round_up(width, 128), _round_up(hidden, 256)
        scales, bias_bytes = 2 * width * hidden // 32 + hidden * width // 32, act_bytes
    elif layout == "triton":
        width = _round_up(width, 64)
        loaded = 2 * width * hidden // 32 + hidden * width // 32
        swizzled = (_round_up(2 * width, 256) * _round_up(hidden // 32, 2)
                    + _round_up(hidden, 256) * _round_up(width // 32, 2))
        scales, bias_bytes = loaded + swizzled, 4
    else:
        raise KvlabError(f"MXFP4 expert layout {layout!r} is not modelled; kvlab knows marlin and triton")
    values = 2 * width * hidden // 2 + hidden * width // 2
    return num_experts * (values + scales + (2 * width + hidden) * bias_bytes)


# Spellings of "no --quantization": the checkpoint's own format, 16-bit weights where config.json names none.
NOT_QUANTIZED = ("none", "auto")


def check_method(method: str, where: str) -> str:
    """The canonical method name, or a one-line refusal naming the known ones."""
    name = SPELLINGS.get(str(method).lower(), str(method).lower())
    if name not in DEFAULTS:
        raise KvlabError(f"{where}: weight quantization {method!r} is not modelled; kvlab knows "
                         f"{', '.join(DEFAULTS)} (and compressed-tensors / modelopt configs naming one of them), or "
                         "none (no --quantization: the checkpoint's own format, unquantized when config.json names "
                         "none)")
    return name


def requested_method(method: str | None, where: str) -> str | None:
    """A --quantization value as sized: None for none/auto (the checkpoint's own format), else the canonical name."""
    if method is None or str(method).lower() in NOT_QUANTIZED:
        return None
    return check_method(method, where)


def _group(value) -> int | None:
    return None if value in (None, -1, 0) else int(value)


def from_quantization_config(qc: dict, where: str) -> WeightFormat:
    """The weight format a config.json's ``quantization_config`` describes."""
    method = str(qc.get("quant_method") or qc.get("quant_algo") or "").lower()
    if method == "fp8":
        block = qc.get("weight_block_size")
        return WeightFormat("fp8", 8, block[0] * block[1] if block else None, 4.0 if block else 0.0,
                            block_n=int(block[0]) if block else None)
    if method in ("gptq", "gptq_marlin", "auto-round", "auto_round", "autoround"):
        bits = int(qc.get("bits", 4))
        sym = qc.get("sym", True)
        name = "gptq" if method.startswith("gptq") else "auto-round"
        return WeightFormat(name, bits, _group(qc.get("group_size", 128)), 2.0, 0 if sym else bits)
    if method in ("awq", "awq_marlin"):
        bits = int(qc.get("bits", qc.get("w_bit", 4)))
        zero = qc.get("zero_point", True)
        return WeightFormat("awq", bits, _group(qc.get("group_size", qc.get("q_group_size", 128))), 2.0,
                            bits if zero else 0)
    if method == "mxfp4":
        return DEFAULTS["mxfp4"]
    if method in ("modelopt", "modelopt_fp4", "nvfp4"):
        algo = str(qc.get("quant_algo") or (qc.get("quantization") or {}).get("quant_algo") or "NVFP4").upper()
        if algo == "MIXED_PRECISION":
            inner = qc.get("quantization")
            return _modelopt_mixed(inner if isinstance(inner, dict) else qc, where)
        if "FP8" in algo:
            return WeightFormat("fp8", 8)
        if "FP4" in algo:
            return WeightFormat("nvfp4", 4, int(qc.get("group_size", 16)), 1.0)
        raise KvlabError(f"{where}: modelopt quant_algo {algo!r} is not modelled; kvlab knows FP8, NVFP4 and "
                         "MIXED_PRECISION")
    if method == "compressed-tensors":
        return _compressed_tensors(qc, where)
    if method == "bitsandbytes":
        if qc.get("load_in_8bit"):
            return WeightFormat("bitsandbytes", 8)
        return DEFAULTS["bitsandbytes"]
    if method == "fbgemm_fp8":
        return DEFAULTS["fbgemm_fp8"]
    return DEFAULTS[check_method(method or "(none)", f"{where} quantization_config.quant_method")]


def _compressed_tensors(qc: dict, where: str) -> WeightFormat:
    """llm-compressor's format: the first config group's weights (num_bits, type, strategy, group_size)."""
    groups = qc.get("config_groups") or {}
    if not groups:
        raise KvlabError(f"{where}: compressed-tensors quantization_config without config_groups cannot be sized")
    weights = next(iter(groups.values())).get("weights") or {}
    bits, kind = int(weights.get("num_bits", 8)), weights.get("type", "int")
    fmt = str(qc.get("format", ""))
    if "nvfp4" in fmt or (bits == 4 and kind == "float"):
        return WeightFormat("nvfp4", 4, int(weights.get("group_size") or 16), 1.0)
    group = _group(weights.get("group_size")) if weights.get("strategy") == "group" else None
    block_n = None
    if weights.get("strategy") == "block" and weights.get("block_structure"):
        rows, cols = weights["block_structure"]
        group, block_n = rows * cols, int(rows)
    method = "fp8" if kind == "float" else ("int8" if bits == 8 else "gptq")
    zero = 0 if weights.get("symmetric", True) else bits
    scale = 2.0 if kind == "int" and bits < 8 else 4.0
    # An ignore list that leaves attention and the shared experts unquantized (Kimi-K2's INT4): routed experts only.
    ignore = " ".join(str(x) for x in qc.get("ignore") or [])
    scope = "experts" if "self_attn" in ignore and "shared_expert" in ignore else "linear"
    return WeightFormat(method, bits, group, scale if group else 0.0, zero if group else 0, scope, block_n=block_n)


# The per-layer algorithms of a ModelOpt MIXED_PRECISION map kvlab counts, and the bytes each holds a weight in
# (vLLM's ModelOptMixedPrecisionConfig hands each to the FP8, NVFP4 or MXFP8 method of the same name): FP8 with one
# scale per tensor or per output channel (not counted); NVFP4 (W4A4 or weight-only W4A16) 4 bits and one fp8 scale
# per group; MXFP8 8 bits and one 8-bit scale per 32.
def _mixed_algo(algo: str, group_size: int) -> WeightFormat | None:
    if algo in ("FP8", "FP8_PER_CHANNEL_PER_TOKEN"):
        return WeightFormat("fp8", 8)
    if algo in ("NVFP4", "W4A16_NVFP4"):
        return WeightFormat("nvfp4", 4, group_size, 1.0)
    if algo == "MXFP8":
        return WeightFormat("mxfp8", 8, 32, 1.0)
    return None


def _mixed_part(name: str) -> str | None:
    """The part (PARTS) a quantized_layers key names; "" for modules kvlab leaves aside (the MTP drafter, which vLLM
    loads only for speculative decoding, and the vision tower); None for one it cannot place."""
    if name.startswith("mtp") or any(word in name for word in ("visual", "vision")):
        return ""
    if name == "lm_head" or name.endswith(".lm_head"):
        return "lm_head"
    if re.search(r"\.(experts)(\.|$)", name):
        return "experts"
    if "shared_expert" in name and "shared_expert_gate" not in name or re.search(r"\.mlp\.\w+_proj$", name):
        return "mlp"
    if re.search(r"\.(self_attn|linear_attn|attn)\.", name):
        return "attention"
    return None


def _modelopt_mixed(qc: dict, where: str) -> WeightFormat:
    """A ModelOpt MIXED_PRECISION checkpoint: its ``quantized_layers`` map (config.json's quantization_config, or
    hf_quant_config.json's "quantization") names each quantized module's quant_algo; vLLM
    (ModelOptMixedPrecisionConfig.get_quant_method) looks each linear layer, the lm_head and the routed experts up in
    it and keeps a module it does not list in the model dtype. kvlab holds each part (PARTS) in one format in every
    layer, so a map that gives one part two formats, or quantizes it in only some layers, is refused."""
    layers = qc.get("quantized_layers")
    if not isinstance(layers, dict) or not layers:
        raise KvlabError(f"{where}: modelopt MIXED_PRECISION without its quantized_layers map cannot be sized (vLLM "
                         "refuses it too); valid: a quantization_config whose quantized_layers names each quantized "
                         "module's quant_algo, as the checkpoint's config.json or hf_quant_config.json has it")
    formats: dict[str, set[WeightFormat]] = {}
    covered: dict[str, set[int]] = {}
    for name, info in layers.items():
        part = _mixed_part(str(name))
        algo = str((info or {}).get("quant_algo") or "").upper()
        fmt = _mixed_algo(algo, int((info or {}).get("group_size") or qc.get("group_size") or 16))
        if part is None or fmt is None:
            what = f"quant_algo {algo!r}" if fmt is None else "a module"
            raise KvlabError(f"{where}: quantized_layers[{name!r}] is {what} kvlab does not model; valid: FP8, "
                             "FP8_PER_CHANNEL_PER_TOKEN, NVFP4, W4A16_NVFP4 or MXFP8 on attention, MLP, expert and "
                             "lm_head layers")
        if part:
            formats.setdefault(part, set()).add(fmt)
            number = re.search(r"layers\.(\d+)\.", str(name))
            covered.setdefault(part, set()).update([int(number.group(1))] if number else [])
    everywhere = set().union(*covered.values())
    for part, held in formats.items():
        if len(held) > 1 or (part != "lm_head" and covered[part] != everywhere):
            why = ("two formats" if len(held) > 1 else
                   f"quantized in {len(covered[part])} of the {len(everywhere)} layers the map names")
            raise KvlabError(f"{where}: modelopt MIXED_PRECISION with {PARTS[part]} in {why} is not modelled; kvlab "
                             "holds each part (attention, MLP, routed experts, lm_head) in one format in every layer")
    parts = tuple((part, next(iter(formats[part]))) for part in PARTS if part in formats)
    if not parts:
        raise KvlabError(f"{where}: modelopt MIXED_PRECISION whose quantized_layers name only the MTP drafter or the "
                         "vision tower leaves the decoder in the model dtype; kvlab sizes it as unquantized only "
                         "without a quantization_config")
    bulk = dict(parts).get("experts") or parts[0][1]
    return WeightFormat("modelopt_mixed", bulk.bits, bulk.group_size, bulk.scale_bytes, scope="mixed", parts=parts)

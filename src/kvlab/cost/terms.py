"""The physical quantities behind the clock's terms, from the model, the GPU and the parallelism (per GPU).

Each is what a term costs at 100% of the catalogue's figure; a cost profile's efficiencies scale them
(kvlab/cost/profiles.py). Sources are in docs/cost.md, "Terms".

Tensor-parallel all-reduce. vLLM's row-parallel layers (attention's output projection and the MLP's down
projection) end with an all-reduce of the layer's output, 2 per decoder layer, ``hidden_size`` activations of
``activation_bytes`` each per token. On one node vLLM runs them with its custom all-reduce (cuda_communicator.py's
``all_reduce`` tries it before torch's symmetric memory and NCCL), and at a decode step's message size that is
the one-shot kernel (csrc/custom_all_reduce.cuh: ``cross_device_reduce_1stage`` always at tp 2, and at tp <= 4
below 512 KB): each GPU reads the whole message from each of its tp − 1 peers and sums, so per scheduled token
and per iteration

    allreduce_bytes_per_token = num_layers × 2 × (tp − 1) × hidden_size × activation_bytes
    t_allreduce               = num_tokens × allreduce_bytes_per_token / (link_bandwidth × link_efficiency)
                                + 2 × num_layers × (tp − 1) × allreduce_latency_s     (once per iteration)

``allreduce_latency_s`` is per call and per peer read. Larger messages (prefill chunks at tp 4: the two-stage
kernel) and GPUs without NVLink at tp > 2 (NCCL's ring) move 2 (tp − 1) / tp of the message instead (Patarasuk &
Yuan 2009); kvlab prices them as one-shot, too high by tp / 2 there (docs/cost.md, "Tensor parallelism").

Mixture of experts. Routed experts are read only when a token picks them; with E experts, k per token and
uniform routing, the expected number of distinct experts T tokens touch is E × (1 − (1 − k/E)^T).

The sampler. Every sequence that samples a token in an iteration hands the sampler a row of logits over the whole
vocabulary (vLLM's V1 Sampler, vllm/v1/sample/sampler.py: the logits in float32, penalties, temperature, top-k /
top-p (a sort over the vocabulary where top-p is asked for), the draw), on every TP rank after the logits are
gathered, so its work per sequence grows with ``vocab_size``, not divided by TP: a profile's ``sampler_logit_s``
(seconds per sequence per vocabulary entry) adds ``vocab_size × sampler_logit_s`` to each scheduled sequence's time.

Weight formats. FP8 (and the catalogue's other formats) sets the bytes per weight (kvlab.catalog.models:
QUANTIZED_LINEAR_BYTES); an FP8 model's matrix multiplies run at the GPU's FP8 rate where it has one (W8A8,
vLLM's fp8 dynamic quantization), else at its bf16 rate (weight-only: the GPU dequantizes).
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIVATION_BYTES = 2  # bf16/fp16 activations: what the all-reduce moves


@dataclass(frozen=True, slots=True)
class Terms:
    """Per-GPU quantities of one model on one GPU at one tensor-parallel size."""

    dense_weights_bytes: float  # weights read every iteration: all but the routed experts
    expert_bytes: float  # one routed expert's weights over every MoE layer (0: a dense model)
    num_experts: int
    experts_per_token: int
    matmul_peak_flops: float  # FP8 rate for an FP8 model on a GPU that has one, else bf16
    attention_peak_flops: float  # attention runs in the activations' dtype
    allreduce_bytes_per_token: float  # read from the peers; 0 at tp 1
    num_allreduce_calls: int  # per iteration, each counted once per peer it reads (tp − 1); 0 at tp 1
    link_bandwidth: float | None  # bytes/s per direction (None: the catalogue has none)
    vocab_size: int = 0  # logits the sampler works over per sampled sequence (every rank: gathered over TP)


def terms_for(model_spec, gpu_spec, weights_bytes: float, tp: int) -> Terms:
    """``weights_bytes``: this GPU's share of all the weights (as the KV sizing counts them)."""
    fmt = model_spec.weight_format  # the checkpoint's quantized layout (kvlab.catalog.quant), None for 16-bit
    expert_bytes = 0.0
    num_experts = experts_per_token = 0
    if model_spec.is_moe:
        per_param = fmt.bytes_per_param if fmt is not None else model_spec.dtype_bytes
        num_experts, experts_per_token = model_spec.num_experts, model_spec.experts_per_token
        routed = sum(model_spec.layer_params(i).experts for i in range(model_spec.num_hidden_layers))
        expert_bytes = routed / num_experts * per_param / tp
    bf16_peak = float(gpu_spec.peak_flops or 0.0)
    fp8 = fmt is not None and fmt.method == "fp8" and fmt.scope == "linear" and gpu_spec.peak_flops_fp8
    layers = model_spec.num_hidden_layers
    return Terms(
        dense_weights_bytes=weights_bytes - num_experts * expert_bytes,
        expert_bytes=expert_bytes,
        num_experts=num_experts,
        experts_per_token=experts_per_token,
        matmul_peak_flops=float(gpu_spec.peak_flops_fp8) if fp8 else bf16_peak,
        attention_peak_flops=bf16_peak,
        allreduce_bytes_per_token=layers * 2 * (tp - 1) * model_spec.hidden_size * ACTIVATION_BYTES,
        num_allreduce_calls=2 * layers * (tp - 1),
        link_bandwidth=float(gpu_spec.link_bandwidth_bytes_per_s) if gpu_spec.link_bandwidth_bytes_per_s else None,
        vocab_size=int(model_spec.vocab_size),
    )

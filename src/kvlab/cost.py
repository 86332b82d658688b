"""How long one engine iteration takes, term by term: a roofline.

An iteration reads every weight once and the K/V of every context token it attends over, and does
2 FLOPs per parameter per token plus the attention's own FLOPs. Whichever of memory traffic and compute takes
longer sets the time (a roofline), plus a fixed overhead for everything else a real engine does per step
(scheduling, sampling, kernel launches, Python):

    t_mem      = (weights_bytes + kv_read_bytes) / (bandwidth × bandwidth_efficiency)
    t_compute  = (2 × active_params × num_tokens + attention_flops) / (peak_flops × flops_efficiency)
    t          = max(t_mem, t_compute) + overhead

    kv_read_bytes   = num_context_tokens × kv_bytes_per_token           (each scheduled sequence reads its context)
    attention_flops = 4 × num_layers × num_heads × head_dim × num_attention_pairs
                      (QKᵀ and AV, 2 FLOPs per multiply-add; a pair is one new token attending to one context token)

Tensor parallelism splits weights, KV and FLOPs over the GPUs; every number here is per GPU.
The efficiency factors are stated, not fitted: 0.8 of peak bandwidth and 0.5 of peak FLOP/s are what well-tuned
decode and prefill kernels reach on A100-class GPUs. The overhead default (3 ms per iteration) is of the order of
vLLM's per-step CPU time reported for its 2023 engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BANDWIDTH_EFFICIENCY = 0.8
FLOPS_EFFICIENCY = 0.5
ITERATION_OVERHEAD_S = 0.003
PCIE_BANDWIDTH = 25e9  # bytes/s a swap moves between GPU and CPU memory (PCIe 4.0 x16, in practice)


@dataclass(frozen=True, slots=True)
class IterationCost:
    """The terms of one iteration's time, in seconds. ``total = max(weights + kv, compute) + overhead``."""

    weights: float
    kv: float
    compute: float
    overhead: float

    @property
    def total(self) -> float:
        return max(self.weights + self.kv, self.compute) + self.overhead

    @property
    def bound(self) -> str:
        return "memory" if self.weights + self.kv >= self.compute else "compute"


@dataclass(frozen=True, slots=True)
class CostModel:
    """Plain numbers per GPU; ``from_sizing`` builds one from a model and a GPU."""

    weights_bytes: float
    kv_bytes_per_token: float
    flops_per_token: float  # 2 × active parameters (per GPU)
    attention_flops_per_pair: float  # 4 × layers × heads × head_dim (per GPU)
    memory_bandwidth: float  # bytes/s
    peak_flops: float  # FLOP/s
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    flops_efficiency: float = FLOPS_EFFICIENCY
    overhead_s: float = ITERATION_OVERHEAD_S
    # (weights read + overhead in seconds, seconds to read one context token's KV, flops_per_token,
    # attention_flops_per_pair, effective FLOP/s, overhead_s): what ``iteration_times`` computes with, for the
    # simulator's jumps, which inline it: ``fixed + context * per_token`` against ``overhead + (flops_per_token *
    # tokens + per_pair * pairs) / flops``, the larger. (A decode iteration is memory-bound at any batch size below
    # some limit: its time is then two float operations.)
    coefficients: tuple[float, float, float, float, float, float] = field(init=False, repr=False, compare=False)

    def terms(self, num_seqs, num_prefill_tokens, num_decode_tokens, num_context_tokens,
              num_attention_pairs) -> IterationCost:
        """The iteration's time, term by term (``total`` is ``iteration_times`` up to the last bit)."""
        del num_seqs  # (no per-sequence term in this model)
        bandwidth = self.memory_bandwidth * self.bandwidth_efficiency
        num_tokens = num_prefill_tokens + num_decode_tokens
        flops = self.flops_per_token * num_tokens + self.attention_flops_per_pair * num_attention_pairs
        return IterationCost(
            weights=self.weights_bytes / bandwidth,
            kv=num_context_tokens * self.kv_bytes_per_token / bandwidth,
            compute=flops / (self.peak_flops * self.flops_efficiency),
            overhead=self.overhead_s,
        )

    def iteration_times(self, num_seqs, num_prefill_tokens, num_decode_tokens, num_context_tokens,
                        num_attention_pairs):
        """How long iterations take, in seconds: the one cost function of the simulator.

        Each argument is a number (one iteration: a float comes back, computed with plain Python arithmetic)
        or a numpy array (one iteration per element: an array comes back). The same operations in the same
        order either way, so an element equals the scalar result bit for bit. Arranged for speed (the overhead
        added to both sides before the larger is taken, reading the weights counted with the overhead), so it
        may differ from ``terms(...).total`` in the last bit."""
        del num_seqs  # (no per-sequence term in this model)
        fixed_s, kv_token_s, flops_per_token, flops_per_pair, flops, overhead_s = self.coefficients
        t_mem = fixed_s + num_context_tokens * kv_token_s
        t_compute = overhead_s + (
            flops_per_token * (num_prefill_tokens + num_decode_tokens) + flops_per_pair * num_attention_pairs
        ) / flops
        if t_mem.__class__ is float:
            return t_mem if t_mem >= t_compute else t_compute
        import numpy as np

        # The larger of two positive numbers: np.maximum picks the same one as the scalar `if`.
        return np.maximum(t_mem, t_compute)

    def __post_init__(self) -> None:
        bandwidth = self.memory_bandwidth * self.bandwidth_efficiency
        object.__setattr__(self, "coefficients", (
            self.weights_bytes / bandwidth + self.overhead_s,
            self.kv_bytes_per_token / bandwidth,
            self.flops_per_token,
            self.attention_flops_per_pair,
            self.peak_flops * self.flops_efficiency,
            self.overhead_s,
        ))

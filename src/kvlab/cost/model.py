"""How long one engine iteration takes, term by term: a roofline with overheads.

An iteration reads every weight once and the K/V of every context token it attends over, and does
2 FLOPs per parameter per token plus the attention's own FLOPs. Whichever of memory traffic and compute takes
longer sets the time (a roofline), plus the CPU's share of a step (scheduling, sampling, kernel launches, Python):
a fixed overhead per iteration, one per scheduled sequence and one per prefill token:

    t_mem      = weights_bytes / (bandwidth × bandwidth_efficiency)
                 + kv_read_bytes / (bandwidth × attention_bandwidth_efficiency)
    t_compute  = 2 × active_params × num_tokens / (peak_flops × flops_efficiency)
                 + attention_flops / (peak_flops × attention_flops_efficiency)
    t          = max(t_mem, t_compute) + overhead + num_seqs × seq_overhead
                 + num_prefill_tokens × prefill_token_overhead + num_tokens × token_overhead

    token_overhead  = what each scheduled token costs outside the roofline: the tensor-parallel all-reduces'
                      transfer (kvlab/cost/terms.py: 2 per layer, each peer's copy read over the link)

A mixture-of-experts model reads its dense weights every iteration, and of its routed experts only those its
tokens choose: with E experts, k per token and routing taken as uniform, T tokens touch
E × (1 − (1 − k/E)^T) distinct experts on average (kvlab/cost/terms.py), so

    t_mem     += expert_read × E × (1 − (1 − k/E)^num_tokens)      (expert_read: one routed expert's weights)

    kv_read_bytes   = num_context_tokens × kv_bytes_per_token           (each scheduled sequence reads its context)
    attention_flops = 4 × num_layers × num_heads × head_dim × num_attention_pairs
                      (QKᵀ and AV, 2 FLOPs per multiply-add; a pair is one new token attending to one context token)

Tensor parallelism splits weights, KV and FLOPs over the GPUs; every number here is per GPU. The constants come
from a cost profile (kvlab/cost/profiles.py: ``kvlab cost`` lists them with their sources); the defaults here are
the ``roofline`` profile's. A profile fitted in absolute times (seconds per context token, ...) rather than as
efficiencies of a catalogue GPU builds its model with ``CostModel.from_seconds``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

INF: Final = float("inf")  # (Final here and below: compiled, a constant, not a lookup in the module's dict)

BANDWIDTH_EFFICIENCY = 0.8
FLOPS_EFFICIENCY = 0.5
ITERATION_OVERHEAD_S = 0.003
PCIE_BANDWIDTH = 25e9  # bytes/s a swap moves between GPU and CPU memory (PCIe 4.0 x16, in practice)
# A decode run's durations come from numpy from this many iterations on (below, a Python list is faster).
VECTOR_MIN_ITERATIONS = 32
# A run's durations for the clock (``decode_run``, which adds them up as it prices them) in a list below this many
# times VECTOR_MIN_ITERATIONS (benchmarks/README.md, issue 34's twenty-second step).
RUN_LIST_FACTOR = 3
# How far apart (relative) the two sides of the roofline must be at both ends of a decode run for the run to be
# priced on one side only: far above the few ulps either side's rounding may move it (see decode_times).
_SIDE_MARGIN: Final = 1e-9


def swap_seconds(num_bytes: int) -> float:
    """Time a swap takes to move KV between GPU and CPU memory over PCIe (the vLLM paper's §4.5 swapping), added
    to the iteration that swaps."""
    return num_bytes / PCIE_BANDWIDTH


@dataclass(frozen=True, slots=True)
class IterationCost:
    """The terms of one iteration's time, in seconds.

    ``total = max(weights + kv, compute) + overhead + seqs + prefill`` (``seqs``: the per-sequence overhead of the
    iteration's sequences; ``prefill``: the per-token overhead of its prefill tokens)."""

    weights: float
    kv: float
    compute: float
    overhead: float
    seqs: float = 0.0
    prefill: float = 0.0

    @property
    def total(self) -> float:
        return max(self.weights + self.kv, self.compute) + self.overhead + self.seqs + self.prefill

    @property
    def bound(self) -> str:
        return "memory" if self.weights + self.kv >= self.compute else "compute"


@dataclass(frozen=True, slots=True)
class CostModel:
    """Plain numbers per GPU; ``SimConfig.from_options`` builds one from a model, a GPU and a cost profile.

    ``attention_bandwidth_efficiency`` and ``attention_flops_efficiency`` default to ``bandwidth_efficiency`` and
    ``flops_efficiency`` (None: the attention kernel is as efficient as the rest)."""

    weights_bytes: float
    kv_bytes_per_token: float
    flops_per_token: float  # 2 × active parameters (per GPU)
    attention_flops_per_pair: float  # 4 × layers × heads × head_dim (per GPU)
    memory_bandwidth: float  # bytes/s
    peak_flops: float  # FLOP/s
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    flops_efficiency: float = FLOPS_EFFICIENCY
    overhead_s: float = ITERATION_OVERHEAD_S
    attention_bandwidth_efficiency: float | None = None
    attention_flops_efficiency: float | None = None
    seq_overhead_s: float = 0.0
    prefill_token_overhead_s: float = 0.0
    # Per scheduled token, outside the roofline: the tensor-parallel all-reduces' transfer (kvlab/cost/terms.py).
    token_overhead_s: float = 0.0
    # MoE: seconds to read one routed expert's weights (every MoE layer, this GPU's share), the routed experts and
    # how many each token picks; weights_bytes then holds the rest (dense layers, attention, shared experts).
    expert_read_s: float = 0.0
    num_experts: int = 0
    experts_per_token: int = 0
    # Time outside the engine (HTTP, the API server, queues between processes), once per request: not an
    # iteration's; a request reaches the scheduler this much later than it arrived (kvlab/cost/latency.py).
    request_latency_s: float = 0.0
    # vLLM's async scheduling: iterations a request that reaches a busy engine waits beyond a synchronous
    # scheduler's admission, put on its first token and end (kvlab/cost/latency.py); not an iteration's either.
    admission_lag_iterations: float = 0.0
    # The lag's spread: a seeded exponential draw per request, this many of its decode iterations on average, on its
    # first token and end, for every request (kvlab/cost/latency.py; an experiment, off in every built-in profile).
    lag_jitter_iterations: float = 0.0
    # The lag's step: with this probability (a seeded draw per request) one more of its decode iterations on its
    # first token and end (kvlab/cost/latency.py; an experiment, off in every built-in profile).
    lag_step_probability: float = 0.0
    profile: str = field(default="roofline", compare=False)  # the cost profile's name (``kvlab cost``)
    notes: tuple[str, ...] = field(default=(), compare=False)  # what was assumed building it (profile mismatches)
    # (weights read + overhead in seconds, seconds to read one context token's KV, flops_per_token,
    # attention FLOPs per pair at the matmul efficiency, effective FLOP/s, overhead_s): what ``iteration_times``
    # computes with: ``fixed + context * per_token`` against ``overhead + (flops_per_token * tokens + per_pair *
    # pairs) / flops``, the larger.
    coefficients: tuple[float, float, float, float, float, float] = field(init=False, repr=False, compare=False)
    # Whether the per-sequence or per-token terms are non-zero (the common roofline skips them).
    has_cpu_terms: bool = field(init=False, repr=False, compare=False)
    # Whether routed experts are read by the iteration's tokens (an MoE model with expert_read_s > 0).
    has_experts: bool = field(init=False, repr=False, compare=False)

    @classmethod
    def from_seconds(cls, *, weights_read_s: float, context_token_s: float, token_s: float, attention_pair_s: float,
                     overhead_s: float, seq_overhead_s: float = 0.0, prefill_token_overhead_s: float = 0.0,
                     request_latency_s: float = 0.0, profile: str = "", notes: tuple[str, ...] = ()) -> CostModel:
        """A model in absolute times, as a profile fitted on the machine itself gives them (no catalogue GPU):
        the same expression with unit bandwidth and FLOP/s, so each "byte" or "FLOP" is a second."""
        return cls(weights_bytes=weights_read_s, kv_bytes_per_token=context_token_s, flops_per_token=token_s,
                   attention_flops_per_pair=attention_pair_s, memory_bandwidth=1.0, peak_flops=1.0,
                   bandwidth_efficiency=1.0, flops_efficiency=1.0, overhead_s=overhead_s,
                   seq_overhead_s=seq_overhead_s, prefill_token_overhead_s=prefill_token_overhead_s,
                   request_latency_s=request_latency_s, profile=profile, notes=notes)

    def terms(self, num_seqs, num_prefill_tokens, num_decode_tokens, num_context_tokens,
              num_attention_pairs) -> IterationCost:
        """The iteration's time, term by term (``total`` is ``iteration_times`` up to the last bit)."""
        bandwidth = self.memory_bandwidth * self.bandwidth_efficiency
        num_tokens = num_prefill_tokens + num_decode_tokens
        _, kv_token_s, _, flops_per_pair, flops, _ = self.coefficients
        return IterationCost(
            weights=self.weights_bytes / bandwidth + (self.experts_read_s(num_tokens) if self.has_experts else 0.0),
            kv=num_context_tokens * kv_token_s,
            compute=(self.flops_per_token * num_tokens + flops_per_pair * num_attention_pairs) / flops,
            overhead=self.overhead_s,
            seqs=num_seqs * self.seq_overhead_s,
            prefill=num_prefill_tokens * self.prefill_token_overhead_s + num_tokens * self.token_overhead_s,
        )

    def experts_read_s(self, num_tokens):
        """Seconds to read the distinct routed experts ``num_tokens`` tokens touch (a number or an array)."""
        if num_tokens.__class__ is int or num_tokens.__class__ is float:
            return self.expert_read_s * self.num_experts * (1.0 - (1.0 - self.experts_per_token / self.num_experts)
                                                            ** num_tokens)
        import numpy as np

        return self.expert_read_s * self.num_experts * (1.0 - np.power(1.0 - self.experts_per_token
                                                                       / self.num_experts, num_tokens))

    def iteration_times(self, num_seqs, num_prefill_tokens, num_decode_tokens, num_context_tokens,
                        num_attention_pairs) -> Any:
        """How long iterations take, in seconds: the one cost function of the simulator.

        Each argument is a number (one iteration: a float comes back, computed with plain Python arithmetic)
        or a numpy array (one iteration per element: an array comes back). The same operations in the same
        order either way, so an element equals the scalar result bit for bit. Arranged for speed (the overhead
        added to both sides before the larger is taken, reading the weights counted with the overhead), so it
        may differ from ``terms(...).total`` in the last bit."""
        # (``-> Any`` makes the function typed: without an annotation mypy takes every local for Any, and compiled the
        # coefficients were boxed into a tuple and unpacked through a generic iterator, ~1k instructions a call,
        # benchmarks/README.md, the nineteenth step. They unpack as floats now; the experts' read, which may be an
        # array, goes on a variable of its own.)
        fixed_s, kv_token_s, flops_per_token, flops_per_pair, flops, overhead_s = self.coefficients
        fixed: Any = fixed_s
        if self.has_experts:
            fixed = fixed_s + self.experts_read_s(num_prefill_tokens + num_decode_tokens)
        t_mem = fixed + num_context_tokens * kv_token_s
        t_compute = overhead_s + (
            flops_per_token * (num_prefill_tokens + num_decode_tokens) + flops_per_pair * num_attention_pairs
        ) / flops
        if type(t_mem) is float:  # (type(), not __class__: compiled, a native read where __class__ is a generic one)
            t = t_mem if t_mem >= t_compute else t_compute  # noqa: PLR1730, FURB136 (max() costs a call)
        else:
            import numpy as np

            # The larger of two positive numbers: np.maximum picks the same one as the scalar `if`.
            t = np.maximum(t_mem, t_compute)
        if self.has_cpu_terms:
            return t + (num_seqs * self.seq_overhead_s + num_prefill_tokens * self.prefill_token_overhead_s
                        + (num_prefill_tokens + num_decode_tokens) * self.token_overhead_s)
        return t

    def decode_times(self, num_seqs: int, num_context_tokens: int, num_iterations: int, seconds: float = INF):
        """The durations of consecutive decode iterations of ``num_seqs`` requests, the first reading
        ``num_context_tokens`` tokens of KV and each one after it ``num_seqs`` more: ``num_iterations`` of them,
        or fewer when ``seconds`` is given (no more than can start within that time, plus one to spare).

        Each is ``iteration_times(num_seqs, 0, num_seqs, context, context)`` bit for bit: the first iteration's two
        sides are its expressions, in typed floats (compiled, a call of iteration_times, whose untyped arithmetic is
        generic, cost ~2.9k instructions; benchmarks/README.md), the larger taken as it takes it. Both sides of the
        roofline grow linearly with the context, so when one side is the larger at both ends of the run by far more
        than either side's rounding at its end, it is the larger throughout, and only that side is computed (the
        same expression as iteration_times', two float operations an iteration; benchmarks/README.md): in a list
        for a short run, in numpy from VECTOR_MIN_ITERATIONS on (an array comes back). A cost of zero (every
        constant 0) leaves ``seconds`` no bound."""
        num_iterations, first, fixed_s, tokens, cpu, sides = self._decode_plan(num_seqs, num_context_tokens,
                                                                               num_iterations, seconds)
        if num_iterations <= 1:
            return [first]
        if num_iterations >= VECTOR_MIN_ITERATIONS:
            return self._decode_times_array(num_seqs, num_context_tokens, num_context_tokens + num_seqs * num_iterations,
                                            fixed_s, tokens, sides > 0, sides < 0)
        times, _ = self._decode_list(num_seqs, num_context_tokens, num_iterations, first, fixed_s, tokens, cpu, sides,
                                     0.0, INF)
        return times

    def decode_run(self, num_seqs: int, num_context_tokens: int, num_iterations: int, now: float,
                   stop: float) -> tuple[Any, float]:
        """``decode_times``' iterations that start before ``stop`` (at least one, the first starting at ``now``),
        and the clock at their end, advanced as ``now += dt``, left to right: the first end at or past ``stop`` is
        the last. A short run's list is built and added up in one loop, which stops at ``stop`` (not priced in full,
        then read again and sliced: benchmarks/README.md, issue 34's twenty-second step), and a list goes up to
        RUN_LIST_FACTOR times VECTOR_MIN_ITERATIONS (numpy's fixed cost a call beats the list's per iteration
        only beyond; the same floats either way)."""
        num_iterations, first, fixed_s, tokens, cpu, sides = self._decode_plan(num_seqs, num_context_tokens,
                                                                               num_iterations, stop - now)
        if num_iterations < 1:  # (decode_times gives the first iteration even then)
            num_iterations = 1
        if num_iterations < RUN_LIST_FACTOR * VECTOR_MIN_ITERATIONS:
            return self._decode_list(num_seqs, num_context_tokens, num_iterations, first, fixed_s, tokens, cpu, sides,
                                     now, stop)
        import numpy as np

        durations = self._decode_times_array(num_seqs, num_context_tokens,
                                             num_context_tokens + num_seqs * num_iterations, fixed_s, tokens,
                                             sides > 0, sides < 0)
        end_array = np.add.accumulate(np.concatenate(([now], durations)))
        num_iterations = int(end_array[:-1].searchsorted(stop, side="left"))
        return durations[:num_iterations], float(end_array[num_iterations])

    def _decode_plan(self, num_seqs: int, num_context_tokens: int, num_iterations: int,
                     seconds: float) -> tuple[int, float, float, float, float, int]:
        """A decode run's pricing, before its iterations: (its iterations, bounded by ``seconds``; the first one's
        duration; the memory side's fixed seconds and the compute side's FLOPs an iteration, as the iterations'
        expressions read them; the per-sequence and per-token seconds an iteration; 1 when the memory side is the
        larger throughout, -1 the compute side, 0 when they cross within the run)."""
        fixed_s, kv_token_s, flops_per_token, flops_per_pair, flops, overhead_s = self.coefficients
        if self.has_experts:  # (num_seqs tokens every iteration: the same experts' read, as iteration_times adds it)
            fixed_s = fixed_s + self.experts_read_s(0 + num_seqs)
        tokens = flops_per_token * (0 + num_seqs)
        memory_first = fixed_s + num_context_tokens * kv_token_s
        compute_first = overhead_s + (tokens + flops_per_pair * num_context_tokens) / flops
        first = memory_first if memory_first >= compute_first else compute_first  # (iteration_times' choice)
        cpu = 0.0
        if self.has_cpu_terms:
            cpu = (num_seqs * self.seq_overhead_s + 0 * self.prefill_token_overhead_s
                   + (0 + num_seqs) * self.token_overhead_s)
            first = first + cpu
        if seconds < INF and first > 0:
            # An iteration takes at least as long as the one before (its context is longer).
            bound = int(seconds / first) + 2
            if bound < num_iterations:
                num_iterations = bound
        if num_iterations <= 1:
            return num_iterations, first, fixed_s, tokens, cpu, 0
        last = num_context_tokens + num_seqs * (num_iterations - 1)
        memory_last, compute_last = fixed_s + last * kv_token_s, overhead_s + (tokens + flops_per_pair * last) / flops
        gap_first, gap_last = memory_first - compute_first, memory_last - compute_last
        # Each side's rounding is a few ulps of its value, and no iteration is longer than the last: a margin
        # of the last iteration's larger side bounds the rounding of every iteration between (max(), written out).
        margin = _SIDE_MARGIN * (compute_last if compute_last > memory_last else memory_last)
        if gap_first > margin and gap_last > margin:
            return num_iterations, first, fixed_s, tokens, cpu, 1
        if gap_first < -margin and gap_last < -margin:
            return num_iterations, first, fixed_s, tokens, cpu, -1
        return num_iterations, first, fixed_s, tokens, cpu, 0

    def _decode_list(self, num_seqs: int, num_context_tokens: int, num_iterations: int, first: float, fixed_s: float,
                     tokens: float, cpu: float, sides: int, now: float, stop: float) -> tuple[list[float], float]:
        """A short decode run's durations in a list (``_decode_plan``'s), left to right up to the first whose end,
        the clock advanced from ``now`` as ``now += dt``, is at or past ``stop``; and that end. On one side
        throughout, every iteration (the first included) is that side's expression over its context
        (``num_context_tokens + i * num_seqs``), plus ``cpu`` when the model has those terms; where the sides cross,
        ``first``, then ``iteration_times`` for each."""
        _, kv_token_s, _, flops_per_pair, flops, overhead_s = self.coefficients
        has_cpu = self.has_cpu_terms
        times: list[float] = []
        end, i = now, 0
        while i < num_iterations and end < stop:
            if sides > 0:  # memory-bound throughout
                dt: float = fixed_s + (num_context_tokens + i * num_seqs) * kv_token_s
            elif sides < 0:  # compute-bound throughout
                dt = overhead_s + (tokens + flops_per_pair * (num_context_tokens + i * num_seqs)) / flops
            elif i:  # the sides cross within the run: both, iteration by iteration
                context = num_context_tokens + i * num_seqs
                dt = self.iteration_times(num_seqs, 0, num_seqs, context, context)
            else:
                dt = first
            if has_cpu and sides:
                dt = dt + cpu
            times.append(dt)
            end += dt
            i += 1
        return times, end

    def _decode_times_array(self, num_seqs: int, num_context_tokens: int, end: int, fixed_s: float, tokens: float,
                            memory_bound: bool, compute_bound: bool):
        """``decode_times``' long run, every iteration in numpy (its first included): on one side of the roofline
        when that side is the larger throughout, as the short run's list (three numpy calls, not nine: numpy's cost
        is per call, a decode run of static+max's ~90 iterations priced in a fifth of its instructions, compiled)."""
        import numpy as np

        context_array = np.arange(num_context_tokens, end, num_seqs, dtype=np.int64)
        _, kv_token_s, _, flops_per_pair, flops, overhead_s = self.coefficients
        if memory_bound:
            times = fixed_s + context_array * kv_token_s
        elif compute_bound:
            times = overhead_s + (tokens + flops_per_pair * context_array) / flops
        else:
            return self.iteration_times(num_seqs, 0, num_seqs, context_array, context_array)
        if self.has_cpu_terms:
            times = times + (num_seqs * self.seq_overhead_s + 0 * self.prefill_token_overhead_s
                             + (0 + num_seqs) * self.token_overhead_s)
        return times

    def __post_init__(self) -> None:
        bandwidth = self.memory_bandwidth * self.bandwidth_efficiency
        kv_bandwidth = self.memory_bandwidth * (self.attention_bandwidth_efficiency or self.bandwidth_efficiency)
        # Attention FLOPs at their own efficiency, expressed at the matmuls' (x * (e / e) is x exactly: the
        # default leaves the roofline's arithmetic as it was, bit for bit).
        attention_flops_eff = self.attention_flops_efficiency or self.flops_efficiency
        object.__setattr__(self, "coefficients", (
            self.weights_bytes / bandwidth + self.overhead_s,
            self.kv_bytes_per_token / kv_bandwidth,
            self.flops_per_token,
            self.attention_flops_per_pair * (self.flops_efficiency / attention_flops_eff),
            self.peak_flops * self.flops_efficiency,
            self.overhead_s,
        ))
        object.__setattr__(self, "has_cpu_terms", bool(self.seq_overhead_s or self.prefill_token_overhead_s
                                                        or self.token_overhead_s))
        object.__setattr__(self, "has_experts", bool(self.expert_read_s and self.num_experts))

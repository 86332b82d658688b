"""An efficiency profile fitted on measured runs by least squares across runs (``kvlab calibrate --runs FILE``).

Each run (kvlab/cost/measured.py) is replayed with its own settings: its model and GPU from the catalogue, its
tensor-parallel size, KV blocks, limits, chunked prefill and prefix caching (``vllm+prefix``), and its workload
(kvlab/workload/inference_perf.py). An iteration's time is the cost model's (kvlab/cost/model.py), linear in the
profile's constants once the side of the roofline is known:

    θ = (1/bandwidth_efficiency, 1/attention_bandwidth_efficiency, 1/flops_efficiency, overhead_s,
         allreduce_latency_s, seq_overhead_s, prefill_token_overhead_s, 1/allreduce_link_efficiency)
    t_iteration = Φ_iteration · θ         Φ: each term at 100% of the catalogue's figure (kvlab/cost/terms.py)

A request is in the engine from its arrival at the scheduler to its last token; every iteration it overlaps adds
its share (the overlapped fraction) of Φ, so with F(t) the running sum of Φ over the iterations up to time t:

    E2E_r  = request_latency_s + θ · (F(finish_r) − F(arrival_r + request_latency_s))
    TTFT_r = request_latency_s + θ · (F(first_token_r) − F(arrival_r + request_latency_s))
    ITL    = (mean E2E − mean TTFT) / (output_len − 1)          (the calibration set's definition)

The means over each load stage's requests are then linear in (θ, request_latency_s): one equation per run, stage
and metric (E2E, TTFT and ITL means), weighted by 1 / measured (relative errors), solved by bounded linear least
squares (scipy's lsq_linear: efficiencies in (0, 1], seconds >= 0). The schedule (which requests share which
iteration) depends on the clock, so the fit is a fixed point: replay every run under the constants, fit,
replay under the new constants, until they move less than 0.1% (or ``max_iterations``). Each constant's
uncertainty is the fit's σ² (AᵀA)⁻¹ at the fixed point (delta method for an efficiency: σ(1/θ) = σ_θ / θ²).

Leave-one-out: each run is predicted by constants fitted on the other runs' equations (the schedules of those runs
as the all-runs fixed point replayed them: re-replaying twelve runs per fold would cost 12x more and moves the
constants by far less than their σ) and replayed under them; its errors are what the profile's error means.
"""

from __future__ import annotations

import gc
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from kvlab.cost.measured import METRICS, MeasuredRun, catalogue_model, sent_workload
from kvlab.errors import KvlabError

# The fitted constants, in θ's order, and whether θ holds the constant or its inverse (an efficiency).
CONSTANTS = ("bandwidth_efficiency", "attention_bandwidth_efficiency", "flops_efficiency", "overhead_s",
             "allreduce_latency_s", "seq_overhead_s", "prefill_token_overhead_s", "allreduce_link_efficiency",
             "sampler_logit_s", "request_latency_s")
INVERTED = ("bandwidth_efficiency", "attention_bandwidth_efficiency", "flops_efficiency", "allreduce_link_efficiency")
FITTED_METRICS = ("e2e_mean", "ttft_mean", "itl_mean")
JITTER_NAME = "lag_jitter_iterations"  # (JITTER below)
STEP = "lag_step_probability"  # (the lag's step, latency.py: fitted like the spread, on its own grid, STEP_GRID)
# What data identifies each constant (the message when the runs cannot).
FIT_HINTS = {
    "bandwidth_efficiency": "runs whose decode iterations read the weights (any run below saturation)",
    "attention_bandwidth_efficiency": "runs with long contexts in decode (long prompts or answers, large batches)",
    "flops_efficiency": "runs with prefill chunks large enough to be compute-bound (long prompts not in the cache)",
    "overhead_s": "runs of different models (the fixed step time against the weights' read)",
    "allreduce_latency_s": "runs at tensor-parallel size 2 or more, beside runs at 1",
    "seq_overhead_s": "runs whose batch sizes differ (different rates or output lengths)",
    "prefill_token_overhead_s": "runs whose prompts differ in length",
    "allreduce_link_efficiency": "runs at tensor-parallel size 2 or more with different tokens per iteration",
    "sampler_logit_s": "runs of models whose vocabularies differ, at different batch sizes",
    "request_latency_s": "any runs (TTFT and E2E carry it, ITL does not)",
    JITTER_NAME: "runs whose TTFT p90 and p99 are published (it spreads each request's time outside the engine)",
    STEP: "runs whose TTFT p90 and p99 are published (it delays a few requests by one more iteration)",
    "request_latency_per_prompt_token_s": "runs whose prompts differ in length (TTFT and E2E carry it, ITL does not)",
    "request_latency_per_weight_gb_s": "runs of models of different sizes (TTFT and E2E carry it, ITL does not)",
    "admission_lag_iterations": "runs that found the engine busy, at different decode iteration times (it delays a "
                                "busy request by its own iterations)",
}
# Where the fixed point starts: the stated roofline's efficiencies, no CPU terms, all-reduce at 80% of the link.
# Held, not fitted, by default (each stays at its start: START's, or --start's profile's):
# - flops_efficiency, at Vidur's H100 matmul fit (vidur-h100): these runs' prefills are mostly cached prefixes, too
#   little compute to identify it (its σ was 10x its value when fitted).
# - prefill_token_overhead_s, at 0. Fitted, it came out 0.23 ms a token: nearly every prompt here is cached but for
#   its last 3-15 tokens, so it was a cost per admitted request in disguise, and it priced a whole 1,071-token prompt
#   at ~270 ms, ten times its compute (the reasoning-lite runs' p99 TTFT, their 23 first rounds, at 2-5x the
#   measured: benchmarks/real_vllm.py --reads). Held at 0 with the one-shot all-reduce priced (vllm-h100 refitted
#   from itself with the term at 0; request_latency_s takes the per-admission time), benchmarks/real_vllm.py's
#   leave-one-out medians went from E2E mean 6.0%, p90 5.6%, p99 8.1%, TTFT mean 6.4%, p90 7.1%, p99 28.3%, ITL 5.9%
#   to 5.5%, 4.8%, 8.4%, 8.1%, 7.1%, 24.8%, 5.6% (docs/cost.md, "The fit"): the TTFT mean worse, within its 10%
#   target, for a clock that does not overprice long uncached prompts. (Before the one-shot all-reduce, holding it
#   at 0 lost on every mean: E2E 6.6% -> 8.5%.)
# (sampler_logit_s only where asked for, --fit: fitted on the 13 runs it came to 0.09 ± 0.32 ns, not identified;
# docs/cost.md, "Terms tried and not kept")
DEFAULT_FIT = tuple(k for k in CONSTANTS if k not in ("flops_efficiency", "prefill_token_overhead_s", "sampler_logit_s"))
START = {"bandwidth_efficiency": 0.8, "attention_bandwidth_efficiency": 0.8, "flops_efficiency": 0.609,
         "overhead_s": 0.003, "allreduce_latency_s": 0.0, "seq_overhead_s": 0.0, "prefill_token_overhead_s": 0.0,
         "allreduce_link_efficiency": 0.8, "sampler_logit_s": 0.0, "request_latency_s": 0.0}
# The identification rule, asked for (kvlab calibrate --runs --hold-unidentified; off by default since 5 December):
# a constant is fitted only where the runs identify it: fitted with the others, its standard error must be below
# this fraction of its value (a constant at its bound of 0 is not identified, nor, since a user's trial asked,
# an efficiency at 1), else it is held at its start. Off by default because what it holds keeps its start: from the
# roofline's, kvlab calibrate --runs trainval.json held overhead_s at 3 ms and its leave-one-out came to 19.5% E2E
# mean, where fitting every constant from the same start reproduces vllm-h100 (5.5%); and on the calibration set its
# leave-one-out gain was a leak, now closed (leave_one_out; docs/cost.md, "The fit").
IDENTIFIED = 1.0
# The lag's spread (latency.py; an experiment, fitted only where asked): not a linear constant, so fitted on a grid,
# each value with the linear constants refitted on the means' equations, and judged on what it moves: each run's
# E2E and TTFT means, p90s and p99s (sum of squared relative errors), each request's time θ · its row.
JITTER = JITTER_NAME
JITTER_STEP = 0.025  # (its "σ" in [fit.sigma] is this step: the grid's resolution, not a standard error)
JITTER_GRID = tuple(round(JITTER_STEP * k, 3) for k in range(61))  # (0 to 1.5 iterations on average)
JITTER_METRICS = ("e2e_mean", "e2e_p90", "e2e_p99", "ttft_mean", "ttft_p90", "ttft_p99")
# The lag's step (latency.py; an experiment, fitted only where asked) is fitted the same way: q from 0 to 0.3.
STEP_STEP = 0.01
STEP_GRID = tuple(round(STEP_STEP * k, 3) for k in range(31))
STRATEGY = "vllm+prefix"
# The arrivals a run is replayed with: inference-perf's constant timer draws its requests' times (exponential gaps
# scaled to each stage's duration; kvlab.workload.inference_perf.arrival_times), and the runs' own draws are not
# published, so a run is replayed once per seed here and the replays' requests pooled (replay): one draw's p90s and
# p99s move by points from seed to seed, the pool's by about 1/sqrt(K) of that (docs/cost.md, "The arrivals the client
# drew", says how K was chosen). EVEN: evenly spaced at each stage's rate instead, one replay (kvlab's replay before
# 7 December; for comparison: prepare(arrival_seeds=None), --arrivals even).
ARRIVAL_SEEDS = (0, 1, 2, 3)
EVEN: tuple[int | None, ...] = (None,)
# vLLM's async scheduling (the default since 0.14): a request that reaches a busy engine joins one iteration later.
ADMISSION_LAG_ITERATIONS = 1.0
# The admission lag itself, fitted only where asked (an experiment, docs/cost.md): like the spread, on a grid, the
# linear constants refitted at each value (the lag multiplies a busy request's own mean decode iteration, not θ).
# 0 to 3 iterations in steps of 1/8. Its rows are exact for an open-loop replay: the schedule does not depend on the
# lag (latency.py); a closed-loop replay's send times do, and are those of the lag it was replayed with.
LAG = "admission_lag_iterations"
LAG_STEP = 0.125
LAG_GRID = tuple(LAG_STEP * k for k in range(25))
SPREADS = {JITTER: (JITTER_GRID, JITTER_STEP), STEP: (STEP_GRID, STEP_STEP),
           LAG: (LAG_GRID, LAG_STEP)}  # (each one's grid and "σ": fitted one at a time, fit_spread)
# Two of them fitted together, on the product of their grids (fit_spread; an experiment, docs/cost.md): the
# admission lag with its step.
JOINT = ({LAG, STEP},)
GIVEN = {JITTER: "jitter", STEP: "step", LAG: "lag"}  # (each one's keyword in Replay.extra, request_rows, _rows)
# A profile's constants that are not in θ but price its replays: a fit carries them from its start (``fixed``) into
# every replay, fold and fitted profile, as given (the admission lag: ADMISSION_LAG_ITERATIONS where the start names
# none, profile_document; the lag's spread and step: 0 where none, unless fitted, fit_spread).
CARRIED = (LAG, JITTER, STEP)


# Lag terms that grow with the run (an experiment, fitted only where asked: benchmarks/real_vllm.py --lag-per;
# docs/cost.md, "Terms tried and not kept"): the time outside the engine core as request_latency_s plus a time per
# prompt token (tokenization, the front end's handling of the prompt) and/or per GB of the model's weights (all of
# its GPUs'), each a linear constant in the TTFT and E2E rows (not ITL's), fitted on the training folds only. Every
# request of a shared_prefix run has the same prompt, so within a run either term is one time for every request:
# the run's schedule is only translated, and a replay carries it as its ``shift_s``.
LAG_TERMS = {"request_latency_per_prompt_token_s": lambda p: float(p.spec.prompt_len),
             "request_latency_per_weight_gb_s": lambda p: p.config.sizing.weights_bytes_total / 1e9}
LAG_TERM_CHOICES = {"prompt": ("request_latency_per_prompt_token_s",), "size": ("request_latency_per_weight_gb_s",),
                    "both": tuple(LAG_TERMS)}


# The calibration set's hardware names (the sim-to-real benchmark's) for cards kvlab's catalogue has two of. The set
# says only "H100": taken as the SXM card, as vllm-h100 was fitted (an assumption, not read from the data); its A100
# runs are A100-80GB (../shared/data/real-vllm/README.md).
RUN_HARDWARE = {"H100": "H100-SXM", "A100": "A100-80GB"}


def parse_arrivals(text: str, option: str = "--arrivals") -> tuple[int, ...] | None:
    """``--arrivals``: seeds of inference-perf's drawn arrivals, comma-separated (``0,1,2,3``, or a range ``0-7``), or
    ``even`` (evenly spaced; None)."""
    value = text.strip().lower()
    if value == "even":
        return None
    try:
        if "-" in value and "," not in value:
            low, high = (int(part) for part in value.split("-"))
            seeds = tuple(range(low, high + 1))
        else:
            seeds = tuple(int(part) for part in value.split(","))
    except ValueError:
        seeds = ()
    if not seeds or any(seed < 0 for seed in seeds) or len(set(seeds)) != len(seeds):
        raise KvlabError(f"{option} {text!r} is not a list of arrival seeds; valid: distinct seeds from 0, comma-"
                         f"separated or a range (default {','.join(map(str, ARRIVAL_SEEDS))}: inference-perf's drawn "
                         "arrivals, one replay per seed, pooled), or 'even' (evenly spaced at each stage's rate)")
    return seeds


def arrivals_of(fit: dict) -> tuple[int, ...] | None:
    """How a profile's ``[fit]`` replayed its runs' arrivals (calibration_profile): its seeds, or None (evenly
    spaced: a fit that records none predates the drawn arrivals, or recorded ``arrivals = "even"``); a profile with
    no ``[fit]``, ARRIVAL_SEEDS."""
    if not fit:
        return ARRIVAL_SEEDS
    if fit.get("arrivals") == "drawn":
        return tuple(int(seed) for seed in fit.get("arrival_seeds", ARRIVAL_SEEDS))
    if "arrival_seed" in fit:  # (clock58's one draw)
        return (int(fit["arrival_seed"]),)
    return None


def carried(constants: dict[str, float]) -> dict[str, float]:
    """Those of ``constants`` a fit carries as given (CARRIED)."""
    return {k: constants[k] for k in CARRIED if k in constants}


def profile_document(constants: dict[str, float], name: str, source: str) -> dict:
    """A cost profile (profiles.py's format) with these constants; attention FLOPs at the matmuls' efficiency."""
    c = dict(constants)
    c.setdefault("attention_flops_efficiency", c["flops_efficiency"])
    c.setdefault("admission_lag_iterations", ADMISSION_LAG_ITERATIONS)
    return {"name": name, "kind": "efficiency", "source": source, "constants": c}


@dataclass
class Prepared:
    """A run's configuration and the per-GPU physics its iterations are priced from (independent of θ)."""

    run: MeasuredRun
    config: Any  # KvlabConfig
    model_spec: Any
    gpu_spec: Any
    workload: Any
    weights_s: float  # dense weights read at 100% bandwidth
    expert_s: float  # one routed expert's read at 100% bandwidth
    num_experts: int
    experts_per_token: int
    kv_token_s: float  # one context token's KV at 100% bandwidth
    token_flops_s: float  # one token's matmuls at 100% of the matmul peak
    pair_flops_s: float  # one attention pair at 100% of its peak (bf16: attention runs in the activations' dtype)
    allreduce_token_s: float  # one token's all-reduce bytes at 100% of the link (0 at tp 1)
    num_allreduce_calls: int
    closed_loop: bool = False  # replay multi-turn users as inference-perf's client serialises them (replay)
    spec: Any = None  # the workload replayed: the run's as published, or the one its client sent (``sent``)
    draws: tuple = ()  # one workload per arrival draw (prepare's ``arrival_seeds``; ``workload`` is the first)
    seeds: tuple = EVEN  # their seeds (None: evenly spaced)

    def engine(self, constants: dict[str, float] | None = None, profile=None):
        """The run's engine under these constants, or under a profile (kvlab.cost.profiles.CostProfile)."""
        from kvlab.config.resolve import cost_model_for
        from kvlab.cost.profiles import profile_from_dict

        if profile is None:
            assert constants is not None
            profile = profile_from_dict(profile_document(constants, "fitting", "kvlab.cost.fit"), "fitting")
        tp = self.run.tensor_parallel_size
        cost = cost_model_for(profile, self.model_spec, self.gpu_spec, self.config.sizing, tp, 1)
        return replace(self.config.engine, cost=cost)


def prepare(run: MeasuredRun, closed_loop: bool = False, sent: bool = False,
            arrival_seeds: Sequence[int] | None = ARRIVAL_SEEDS) -> Prepared:
    """The run's configuration and physics, and its workload: the users the run names, or with ``sent`` the
    prompts the calibration set's client sent in their place (kvlab.cost.measured.CLIENT_DEFAULTS: 100 prompts,
    single turn; ``closed_loop`` serialises the named multi-turn users, so it keeps them). ``arrival_seeds``: the
    requests arrive as inference-perf's constant timer draws them (exponential gaps scaled to each stage's
    duration, kvlab.workload.inference_perf.arrival_times), one workload per seed, which ``replay`` runs each and
    pools (ARRIVAL_SEEDS); None: one workload, evenly spaced at each stage's rate (EVEN, for comparison)."""
    from kvlab.catalog import get_gpu
    from kvlab.config.resolve import quietly
    from kvlab.cost.terms import terms_for
    from kvlab.workload.inference_perf import shared_prefix_table
    from kvlab.workload.load import _build_requests
    from kvlab.workload.workload import Workload

    model_spec = catalogue_model(run)
    try:
        gpu_spec = get_gpu(RUN_HARDWARE.get(run.gpu, run.gpu),
                           otherwise="; valid: a catalogue GPU as the run's hardware (kvlab gpus lists them)")
    except KvlabError as error:
        raise KvlabError(f"run {run.id!r}: hardware {run.gpu!r}: {error}") from None
    if not (gpu_spec.memory_bandwidth_bytes_per_s and gpu_spec.peak_flops):
        raise KvlabError(f"run {run.id!r}: the catalogue has no bandwidth or FLOP/s for {gpu_spec.id}; an efficiency "
                         "profile is fitted against both")
    if run.workload.prompt_len + run.workload.output_len > run.max_model_len:
        raise KvlabError(f"run {run.id!r}: prompts of {run.workload.prompt_len} + answers of "
                         f"{run.workload.output_len} tokens exceed max_model_len {run.max_model_len}")
    try:
        config = quietly(model=model_spec.id, gpu=gpu_spec.id, tensor_parallel_size=run.tensor_parallel_size,
                         num_gpu_blocks=run.num_gpu_blocks, max_num_seqs=run.max_num_seqs,
                         max_num_batched_tokens=run.max_num_batched_tokens, max_model_len=run.max_model_len,
                         enable_chunked_prefill=True, cost="roofline", kv_offloading_size=run.kv_offloading_size)
    except KvlabError as exc:  # (the run's fields as the options they became: name the run)
        raise KvlabError(f"run {run.id!r}: {exc}") from None
    if config.offload is not None and run.num_cpu_blocks is not None:  # (the tier as the run's log sized it)
        config = replace(config, offload=replace(config.offload, num_cpu_blocks=run.num_cpu_blocks))
    spec = sent_workload(run.workload) if sent and not closed_loop else run.workload
    seeds: tuple[int | None, ...] = EVEN if arrival_seeds is None else tuple(int(s) for s in arrival_seeds)
    if not seeds:
        raise KvlabError("arrival seeds: none given; valid: one or more seeds (inference-perf's drawn arrivals), or "
                         "evenly spaced arrivals")
    workloads = []
    for seed in seeds:
        table = shared_prefix_table(spec, seed=seed)
        assert table.arrival_time is not None
        workloads.append(Workload(name=f"run {run.id}", requests=_build_requests(table, table.arrival_time, None),
                                  description="", source=""))
    workload = workloads[0]
    tp = run.tensor_parallel_size
    terms = terms_for(model_spec, gpu_spec, config.sizing.weights_bytes_total / tp, tp)
    bandwidth = float(gpu_spec.memory_bandwidth_bytes_per_s)
    base = config.cost.model  # (roofline: its per-GPU byte and FLOP counts, not its efficiencies)
    link = terms.link_bandwidth or 25e9
    return Prepared(
        run=run, config=config, model_spec=model_spec, gpu_spec=gpu_spec, workload=workload,
        weights_s=terms.dense_weights_bytes / bandwidth, expert_s=terms.expert_bytes / bandwidth,
        num_experts=terms.num_experts, experts_per_token=terms.experts_per_token,
        kv_token_s=base.kv_bytes_per_token / bandwidth,
        token_flops_s=base.flops_per_token / terms.matmul_peak_flops,
        # (the cost model holds an FP8 model's attention FLOPs rescaled to the matmuls' FP8 rate, so that at the
        # matmul peak they take their bf16 time: divided by the FP8 peak here, as it prices them)
        pair_flops_s=base.attention_flops_per_pair / terms.matmul_peak_flops,
        allreduce_token_s=terms.allreduce_bytes_per_token / link,
        num_allreduce_calls=terms.num_allreduce_calls, closed_loop=closed_loop, spec=spec,
        draws=tuple(workloads), seeds=seeds,
    )


@dataclass
class Replay:
    """One run replayed under one set of constants: its iterations (features) and its requests."""

    prepared: Prepared
    constants: dict[str, float]
    starts: np.ndarray  # each iteration's start (scheduler clock)
    durations: np.ndarray
    phi: np.ndarray  # (iterations, 8): each iteration's features, θ's order without request_latency_s
    arrival: np.ndarray  # client arrival of each request (request_id order); the rest on the scheduler's clock
    first_scheduled: np.ndarray  # when its first iteration started
    lag_iterations: float  # the profile's admission lag (latency.py)
    first_token: np.ndarray
    finish: np.ndarray
    stage: np.ndarray
    num_preemptions: int = 0  # (the simulation's counter: a replay whose KV ran out says so)
    jitter: float = 0.0  # the profile's lag_jitter_iterations (latency.py: the lag's spread, per request)
    step: float = 0.0  # the profile's lag_step_probability (latency.py: the lag's step, per request)
    shift_s: float = 0.0  # the lag terms' time (LAG_TERMS: the same for every request of the run), on TTFT and E2E
    # Each iteration's (num_seqs, prefill, decode, context, attention pairs), as its features were computed from (a
    # term screened beside θ's is a column of these: benchmarks/real_vllm.py --screen).
    fields: Any = field(default=None, repr=False, compare=False)
    within: Any = field(default=None, repr=False, compare=False)  # each request's index in its draw (prepare's seeds)
    _parts: Any = field(default=None, repr=False, compare=False)  # (request_parts, computed once)

    def draws(self) -> np.ndarray:
        """Each request's draw of the lag's spread (latency.jitter_draws; request_id order: the table's)."""
        from kvlab.cost.latency import jitter_draws

        return jitter_draws(np.arange(len(self.arrival)))

    def extra(self, jitter: float | None = None, step: float | None = None, lag: float | None = None) -> np.ndarray:
        """Each request's iterations from the lag's spread and step (latency.spread_iterations; default the
        replay's own), and with ``lag`` those an admission lag of ``lag`` adds to a busy request's over the
        replay's own (request_parts counts those)."""
        from kvlab.cost.latency import spread_iterations

        jitter, step = self.jitter if jitter is None else jitter, self.step if step is None else step
        extra = spread_iterations(np.arange(len(self.arrival)), jitter, step)
        extra = np.zeros(len(self.arrival)) if extra is None else extra
        return extra if lag is None else extra + (lag - self.lag_iterations) * self.busy()

    def cumulative(self, times: np.ndarray) -> np.ndarray:
        """F(t): Σ Φ over the iterations before t, the one under way counted by the fraction elapsed."""
        running = np.vstack([np.zeros(self.phi.shape[1]), np.cumsum(self.phi, axis=0)])
        k = np.searchsorted(self.starts, times, side="right") - 1
        inside = k >= 0
        kk = np.where(inside, k, 0)
        frac = np.clip((times - self.starts[kk]) / np.maximum(self.durations[kk], 1e-30), 0.0, 1.0)
        out = running[kk] + frac[:, None] * self.phi[kk]
        out[~inside] = 0.0
        return out

    def busy(self) -> np.ndarray:
        """Whether each request reached a busy engine (it waited for an iteration under way)."""
        return self.first_scheduled > self.arrival + self.constants["request_latency_s"] + 1e-12

    def request_parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each request's E2E and TTFT as rows over CONSTANTS' θ (request_latency_s last) without the lag's spread,
        and its spread's row for a draw of 1 (its own mean decode iteration): ``request_rows`` adds them."""
        if self._parts is None:
            self._parts = self._request_parts()
        return self._parts

    def _request_parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        at_scheduler = self.arrival + self.constants["request_latency_s"]
        finish, first_token = self.cumulative(self.finish), self.cumulative(self.first_token)
        out_len = self.prepared.run.workload.output_len
        # The admission lag (latency.py): one more iteration, priced as the request's own mean decode iteration.
        iteration = np.hstack([(finish - first_token) / max(1, out_len - 1), np.zeros((len(self.arrival), 1))])
        ones = np.ones((len(self.arrival), 1))
        start = np.hstack([self.cumulative(at_scheduler), np.zeros((len(self.arrival), 1))])
        lag = self.lag_iterations * self.busy()[:, None] * iteration
        return np.hstack([finish, ones]) - start + lag, np.hstack([first_token, ones]) - start + lag, iteration

    def request_rows(self, jitter: float | None = None, step: float | None = None, lag: float | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Each request's E2E and TTFT as rows over CONSTANTS' θ: θ · row is its time, with the lag's spread and
        step (``jitter``, ``step``, default the replay's: ``extra`` of its own mean decode iterations) and the
        admission lag ``lag`` (default the replay's)."""
        e2e, ttft, iteration = self.request_parts()
        extra = self.extra(jitter, step, lag)
        if not extra.any():
            return e2e, ttft
        spread = extra[:, None] * iteration
        return e2e + spread, ttft + spread

    def equations(self, jitter: float | None = None, step: float | None = None, lag: float | None = None
                  ) -> list[tuple[str, str, np.ndarray, float]]:
        """(group, metric, row over CONSTANTS' θ, measured) for each fitted metric of each group."""
        x_e2e, x_ttft = self.request_rows(jitter, step, lag)
        out_len = self.prepared.run.workload.output_len
        rows = []
        for group in self.prepared.run.groups:
            chosen = np.ones(len(self.arrival), bool) if group == "summary" else self.stage == int(group[5:])
            e2e, ttft = x_e2e[chosen].mean(axis=0), x_ttft[chosen].mean(axis=0)
            for metric, vector in (("e2e_mean", e2e), ("ttft_mean", ttft), ("itl_mean", (e2e - ttft) / (out_len - 1))):
                if metric == "itl_mean" and not itl_consistent(self.prepared.run, group):
                    continue  # (its E2E and TTFT already say what the ITL must be)
                rows.append((group, metric, vector, self.prepared.run.measured(group, metric)))
        return rows

    def per_output_token(self) -> np.ndarray:
        """Φ per output token over all requests: Σ over requests of Φ from first token to end, over their output
        tokens after the first. θ · this is the replay's ITL (the admission lag moves TTFT and E2E alike); its
        columns say what a decoded token reads and computes at 100% of each figure (the weights, the KV, ...)."""
        spans = self.cumulative(self.finish) - self.cumulative(self.first_token)
        return spans.mean(axis=0) / max(1, self.prepared.run.workload.output_len - 1)

    def client_ttft(self) -> np.ndarray:
        """Each request's TTFT as the client sees it (arrival to first token, with the admission lag)."""
        out_len = self.prepared.run.workload.output_len
        return self.first_token + self._lag(out_len) - self.arrival + self.shift_s

    def _lag(self, out_len: int):
        from kvlab.cost.latency import admission_lag

        return admission_lag(self.lag_iterations, self.busy(), self.first_token, self.finish, out_len, self.extra())

    def predicted(self) -> dict[str, dict[str, float]]:
        """The metrics a client would have measured, per group (summary and each stage)."""
        out_len = self.prepared.run.workload.output_len
        e2e, ttft = self.finish + self._lag(out_len) - self.arrival + self.shift_s, self.client_ttft()
        groups = {"summary": np.ones(len(e2e), bool)}
        groups.update({f"stage{k}": self.stage == k for k in range(len(self.prepared.run.workload.stages))})
        out = {}
        for group, chosen in groups.items():
            e, t = e2e[chosen], ttft[chosen]
            out[group] = {"e2e_mean": float(e.mean()), "e2e_p90": float(np.percentile(e, 90)),
                          "e2e_p99": float(np.percentile(e, 99)), "ttft_mean": float(t.mean()),
                          "ttft_p90": float(np.percentile(t, 90)), "ttft_p99": float(np.percentile(t, 99)),
                          "itl_mean": float((e.mean() - t.mean()) / (out_len - 1))}
        return out


ITL_TOLERANCE = 0.05


def itl_consistent(run: MeasuredRun, group: str) -> bool:
    """Whether a run's published ITL is (E2E mean − TTFT mean) / (output_len − 1), as the calibration set defines
    it, within ITL_TOLERANCE. Runs of Llama-2-7B are not (their ITL implies ~79% of the answer's tokens: the
    client counted fewer tokens than the engine generated); their ITL is reported, not fitted."""
    implied = (run.measured(group, "e2e_mean") - run.measured(group, "ttft_mean")) / (run.workload.output_len - 1)
    return abs(run.measured(group, "itl_mean") / implied - 1.0) <= ITL_TOLERANCE


def _features(p: Prepared, theta: np.ndarray, n, prefill, decode, context, pairs) -> tuple[np.ndarray, np.ndarray]:
    """Each iteration's Φ (θ's order without request_latency_s) and its side of the roofline under θ."""
    tokens = prefill + decode
    weights = np.full(len(n), p.weights_s)
    if p.num_experts:
        weights = weights + p.expert_s * p.num_experts * (1.0 - (1.0 - p.experts_per_token / p.num_experts) ** tokens)
    kv = context * p.kv_token_s
    compute = tokens * p.token_flops_s + pairs * p.pair_flops_s
    memory_bound = theta[0] * weights + theta[1] * kv >= theta[2] * compute
    phi = np.column_stack([
        np.where(memory_bound, weights, 0.0), np.where(memory_bound, kv, 0.0), np.where(memory_bound, 0.0, compute),
        np.ones(len(n)), np.full(len(n), float(p.num_allreduce_calls)), n, prefill, tokens * p.allreduce_token_s,
        n * float(p.model_spec.vocab_size),
    ])
    return phi, memory_bound


def theta_of(constants: dict[str, float]) -> np.ndarray:
    return np.array([1.0 / constants[k] if k in INVERTED else constants[k] for k in CONSTANTS])


def constants_of(theta: np.ndarray) -> dict[str, float]:
    return {k: (1.0 / v if k in INVERTED else float(v)) for k, v in zip(CONSTANTS, theta)}


def replay(p: Prepared, constants: dict[str, float] | None = None, profile=None) -> Replay:
    """Replay a run under the constants (or a whole profile, whose features are then not θ's), iteration by
    iteration (kvlab.sim's runs of iterations unrolled). Prepared with ``closed_loop``, a multi-turn run whose users'
    rounds would overlap is replayed again with each held round sent when its user's previous answer is in
    (``_closed_loop``); by default every round is sent at its scheduled time (docs/cost.md: the loop fits the
    published runs no better, three of five leave-one-out medians worse)."""
    from kvlab.workload.inference_perf import closed_loop_send_times, stage_of

    engine = p.engine(constants, profile)
    cost = engine.cost
    if constants is None:
        constants = {**START, "request_latency_s": cost.request_latency_s}
    spec = p.spec
    pooled: dict[str, list] = {}
    offset = 0.0
    for workload in p.draws or (p.workload,):
        scheduled = np.array([r.arrival_time for r in workload.requests])  # (request_id order: the table's)
        timeline = _open_loop(p, engine, workload)
        send = scheduled
        if p.closed_loop and spec.enable_multi_turn_chat:
            held = closed_loop_send_times(spec, scheduled, _client_end(cost, scheduled, timeline, spec.output_len))
            if np.any(held > scheduled):
                timeline, send = _closed_loop(p, engine, workload, scheduled)
        # Each draw after the one before, with a gap: F(t) (Replay.cumulative) is then constant between them, so a
        # request's rows hold only its own draw's iterations, and the pool is each draw's requests side by side.
        starts = timeline.starts()
        for name, value in (("starts", starts + offset), ("durations", timeline.durations()),
                            ("fields", np.column_stack(timeline.iterations())), ("arrival", send + offset),
                            ("first_scheduled", timeline.first_scheduled + offset),
                            ("first_token", timeline.first_token + offset), ("finish", timeline.finish + offset),
                            ("stage", stage_of(spec, scheduled - scheduled[0])), ("within", np.arange(len(send))),
                            ("preemptions", np.array([timeline.num_preemptions]))):
            pooled.setdefault(name, []).append(value)
        end = max(float(timeline.finish.max()), float((starts + timeline.durations()).max(initial=0.0)))
        offset += end + 1000.0
    joined = {name: np.concatenate(values) for name, values in pooled.items()}
    fields = tuple(joined["fields"].T) if len(joined["fields"]) else tuple(np.zeros((5, 0)))
    phi, _ = _features(p, theta_of(constants), *fields)
    return Replay(prepared=p, constants=dict(constants), starts=joined["starts"], durations=joined["durations"],
                  phi=phi, arrival=joined["arrival"], first_scheduled=joined["first_scheduled"],
                  lag_iterations=cost.admission_lag_iterations, first_token=joined["first_token"],
                  finish=joined["finish"], stage=joined["stage"], num_preemptions=int(joined["preemptions"].sum()),
                  jitter=cost.lag_jitter_iterations, step=cost.lag_step_probability, fields=fields,
                  within=joined["within"])


_JOBS: list = []  # (replay_all's jobs, inherited by its forked workers)


def replay_all(jobs: Sequence[tuple], workers: int = 1, known: dict[int, Replay] | None = None,
               done: Callable[[int, int], None] | None = None) -> list[Replay]:
    """``replay(prepared, constants, profile)`` for each job (prepared, constants, profile), in ``workers`` forked
    processes (1: here, one after the other); the same replays either way, in the jobs' order. ``known``: replays
    already made, by job index (calibrate_runs' timed first); ``done(n, total)`` after each replay is in."""
    import multiprocessing

    known = known or {}
    todo = [i for i in range(len(jobs)) if i not in known]
    out = dict(known)
    if workers <= 1 or len(todo) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        for i in todo:
            p, c, pr = jobs[i]
            out[i] = replay(p, c, profile=pr)
            if done is not None:
                done(len(out), len(jobs))
        return [out[i] for i in range(len(jobs))]
    _JOBS[:] = jobs
    try:
        with multiprocessing.get_context("fork").Pool(min(workers, len(todo))) as pool:
            for i, r in zip(todo, pool.imap(_replay_job, todo, chunksize=1)):
                out[i] = replace(r, prepared=jobs[i][0])
                if done is not None:
                    done(len(out), len(jobs))
    finally:
        _JOBS.clear()
    return [out[i] for i in range(len(jobs))]


def num_requests(prepared: Prepared) -> int:
    """The requests a replay of ``prepared`` simulates: every arrival draw's."""
    return sum(w.num_requests for w in (prepared.draws or (prepared.workload,)))


def timed_first(prepared: Sequence[Prepared], constants: dict[str, float], max_iterations: int, workers: int,
                progress: Callable[[str], None]) -> dict[int, Replay]:
    """The first round's replay of the run with the most requests, timed, and the plan said before the rest
    (trial 60, finding 8: calibrate --runs ran minutes without a word of how long): how many replays, and about how
    long at that replay's pace per request (the largest: a largest run's fixed costs weigh more on each of its requests;
    a saturated run costs more per request than a light one: an estimate). Round 1 keeps the replay."""
    import time

    largest = max(range(len(prepared)), key=lambda i: num_requests(prepared[i]))
    started = time.perf_counter()
    first = replay(prepared[largest], constants)
    pace = (time.perf_counter() - started) / max(1, num_requests(prepared[largest]))
    requests = sum(num_requests(p) for p in prepared)
    rounds = max_iterations + 1  # (and the leave-one-out's replays, one a run: as many as an iteration's)
    seconds = pace * requests * rounds / min(max(1, workers), len(prepared))
    draws = len(prepared[0].draws) or 1
    progress(f"calibrate: {len(prepared)} runs, each replayed with {draws} arrival draw{'s' * (draws != 1)} "
             f"({requests:,} requests an iteration), up to {max_iterations} iteration{'s' * (max_iterations != 1)} of "
             f"replay and fit (--iterations), then {len(prepared)} leave-one-out replays: up to "
             f"{rounds * len(prepared)} replays, about {_minutes(seconds)} on {workers} worker{'s' * (workers != 1)} "
             f"(run {prepared[largest].run.id} replayed in {time.perf_counter() - started:.1f} s, "
             f"{pace * 1e3:.2f} ms a request)")
    return {largest: first}


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _replay_job(i: int) -> Replay:
    p, c, pr = _JOBS[i]
    return replace(replay(p, c, profile=pr), prepared=None)  # type: ignore[arg-type]  # (the caller's own goes back in)


class _Timeline:
    """What a replay keeps of a simulation: each run of iterations (its end, count, durations and contents as the
    scheduler output gives them), then each request's first iteration, first token and end (request_id order)."""

    def __init__(self, cost) -> None:
        self.cost = cost
        self.ends: list[float] = []
        self.counts: list[int] = []
        self.chunks: list = []
        self.fields: list[tuple] = []

    def add(self, out, end: float) -> None:
        k = out.num_iterations
        if k > 1:
            assert out.timing is not None
            durations = np.array(out.timing[0][:k], dtype=np.float64)
        else:
            durations = np.array([self.cost.iteration_times(out.num_seqs, out.num_prefill_tokens,
                                                            out.num_decode_tokens, out.num_context_tokens,
                                                            out.num_attention_pairs)])
        self.ends.append(end)
        self.counts.append(k)
        self.chunks.append(durations)
        self.fields.append((out.num_seqs, out.num_prefill_tokens, out.num_decode_tokens, out.num_context_tokens,
                            out.num_attention_pairs))

    def close(self, run_id: str, result) -> _Timeline:
        records = sorted(result.records, key=lambda r: r.request_id)
        if any(r.finish_time is None for r in records):
            bad = next(r for r in records if r.finish_time is None)
            raise KvlabError(f"run {run_id!r}: request {bad.request_id} did not finish in the replay "
                             f"({bad.reject_reason or 'rejected'}); its settings cannot serve this workload")
        self.first_scheduled = np.array([r.first_scheduled_time for r in records])
        self.first_token = np.array([r.first_token_time for r in records])
        self.finish = np.array([r.finish_time for r in records])
        self.num_preemptions = result.counters.num_preemptions
        counts = np.array(self.counts)
        self._group = np.repeat(np.arange(len(counts)), counts)
        self._first = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self._durations = np.concatenate(self.chunks)
        return self

    def durations(self) -> np.ndarray:
        return self._durations

    def iterations(self) -> tuple[np.ndarray, ...]:
        """Each iteration's (num_seqs, prefill, decode, context, attention pairs): a run's later iterations decode
        one token of each of its requests, each reading num_seqs more tokens of context than the one before."""
        f = np.array(self.fields, dtype=float)
        group = self._group
        j = np.arange(len(self._durations)) - self._first[group]
        n = f[group, 0]
        later = j > 0
        context = f[group, 3] + j * n
        return (n, np.where(later, 0.0, f[group, 1]), np.where(later, n, f[group, 2]), context,
                np.where(later, context, f[group, 4]))

    def starts(self) -> np.ndarray:
        """Each iteration starts where the run that holds it ended, less the durations from it to that end."""
        cum = np.cumsum(self._durations)
        last = self._first + np.array(self.counts) - 1
        group = self._group
        return np.array(self.ends)[group] - (cum[last[group]] - cum) - self._durations


def _simulation(p: Prepared, engine, requests, start_time: float | None = None):
    from kvlab.cost.latency import delayed
    from kvlab.sim import Simulation
    from kvlab.strategies import parse_strategy

    workload = replace(p.workload, requests=tuple(requests))
    return Simulation(parse_strategy(STRATEGY), engine, delayed(workload, engine.cost.request_latency_s),
                      record_iterations=False, start_time=start_time)


def _open_loop(p: Prepared, engine, workload) -> _Timeline:
    """Every request of ``workload`` (one of the run's draws) sent at its scheduled time."""
    sim = _simulation(p, engine, workload.requests)
    timeline = _Timeline(engine.cost)
    collecting = gc.isenabled()
    gc.disable()
    try:
        while not sim.done:
            out = sim.step()
            if out is None:
                break
            timeline.add(out, sim.now)
        result = sim.result()  # (the scheduler's clock: predicted() puts the client's view on it)
    finally:
        if collecting:
            gc.enable()
    return timeline.close(p.run.id, result)


def _client_end(cost, send: np.ndarray, timeline: _Timeline, output_len: int) -> np.ndarray:
    """When each request's answer is in at its client: its end plus the admission lag (kvlab/cost/latency.py)."""
    from kvlab.cost.latency import admission_lag

    busy = timeline.first_scheduled > send + cost.request_latency_s + 1e-12
    return timeline.finish + admission_lag(cost.admission_lag_iterations, busy, timeline.first_token,
                                           timeline.finish, output_len)


def _closed_loop(p: Prepared, engine, workload, scheduled: np.ndarray) -> tuple[_Timeline, np.ndarray]:
    """The run with inference-perf's multi-turn serialisation (kvlab/workload/inference_perf.py): request i is sent
    at max(its scheduled time, the client's end of request i - N), N the users. The simulation is stepped one
    iteration at a time (``run_until`` just past its clock: the schedule is the same as in runs of iterations,
    tests/test_runs.py) and a request is handed to it (``add_request``) once no later-released round can come
    before it: a round is released at an answer's end plus the time outside the engine, so never earlier than the
    clock plus ``request_latency_s``. Returns the timeline and each request's send time (the client's)."""
    from heapq import heappop, heappush

    from kvlab.cost.latency import admission_lag

    cost = engine.cost
    latency, lag_iterations = cost.request_latency_s, cost.admission_lag_iterations
    spec = p.spec
    num_users, output_len = spec.num_users, spec.output_len
    requests = workload.requests
    send = scheduled.copy()
    pending = [(float(scheduled[i]), i) for i in range(min(num_users, len(requests)))]  # (send time, request id)
    sim = _simulation(p, engine, (), start_time=float(scheduled[0]) + latency)
    timeline = _Timeline(cost)
    in_engine: set[int] = set()
    num_finished = 0
    collecting = gc.isenabled()
    gc.disable()
    try:
        while pending or in_engine:
            num_added = 0
            while pending and (pending[0][0] <= sim.now or not in_engine):
                t, i = heappop(pending)
                sim.add_request(replace(requests[i], arrival_time=t + latency))  # (at the scheduler)
                in_engine.add(i)
                num_added += 1
            # Idle, run to the next arrival; but a round released during the iteration that emptied the engine was
            # added behind the clock (sent before that iteration's end): it is taken now (run_until to a time before
            # the clock runs nothing, and the loop would never move).
            idle = sim.scheduler.num_unfinished == 0
            limit = max(sim.next_arrival_time, sim.now) if idle else sim.now
            outputs = sim.run_until(limit + 1e-9)
            if not outputs and not num_added:  # (each round hands a request over or runs an iteration, or it hangs)
                raise RuntimeError(f"run {p.run.id!r}: the closed loop stopped at {sim.now:g} s with requests "
                                   f"{sorted(in_engine)} in the engine and {len(pending)} held")
            for out in outputs:
                timeline.add(out, sim.now)
            if sim.counters.num_finished == num_finished:
                continue
            num_finished = sim.counters.num_finished
            for i in [i for i in in_engine if i in sim.seqs and sim.seqs[i].finish_time is not None]:
                in_engine.discard(i)
                following = i + num_users
                if following < len(requests):
                    seq = sim.seqs[i]
                    busy = seq.first_scheduled_time > send[i] + latency + 1e-12
                    end = seq.finish_time + admission_lag(lag_iterations, busy, seq.first_token_time,
                                                          seq.finish_time, output_len)
                    send[following] = max(float(scheduled[following]), end)
                    heappush(pending, (float(send[following]), following))
        result = sim.result()
    finally:
        if collecting:
            gc.enable()
    return timeline.close(p.run.id, result), send


@dataclass
class Fit:
    constants: dict[str, float]
    sigma: dict[str, float]
    fitted: tuple[str, ...]
    num_equations: int
    rms_relative_residual: float
    # Asked for but not identified by the runs (IDENTIFIED): held at their start, in the order they were let go.
    held: tuple[str, ...] = ()
    identified: float | None = None  # the rule's threshold (None: every asked constant fitted, as before the rule)
    held_sigma: dict[str, float] = field(default_factory=dict)  # each held constant's σ when it was last fitted
    held_fitted: dict[str, float] = field(default_factory=dict)  # and the value it was fitted to then


def solve(rows: Sequence[tuple[np.ndarray, float]], fitted: Sequence[str], fixed: dict[str, float],
          labels: Sequence[str] = (), identified: float | None = IDENTIFIED) -> Fit:
    """Bounded least squares on relative errors for the ``fitted`` constants the runs identify (the rest held at
    ``fixed``): while a fitted constant's standard error is not below ``identified`` times its value (IDENTIFIED;
    None: no such rule), the least identified is held at ``fixed`` and the rest fitted again."""
    asked = list(fitted)
    held: list[str] = []
    held_sigma: dict[str, float] = {}
    held_fitted: dict[str, float] = {}
    while True:
        fit = _solve_once(rows, asked, fixed, labels)
        if identified is None:
            return fit
        relative = {k: relative_sigma(k, fit.constants[k], fit.sigma[k]) for k in asked}
        worst = max(asked, key=lambda k: relative[k])
        if relative[worst] < identified or len(asked) == 1:
            return replace(fit, held=tuple(held), identified=identified, held_sigma=held_sigma,
                           held_fitted=held_fitted)
        asked.remove(worst)
        held.append(worst)
        held_sigma[worst] = fit.sigma[worst]
        held_fitted[worst] = fit.constants[worst]


def relative_sigma(name: str, value: float, sigma: float) -> float:
    """A fitted constant's standard error over its value, the identification rule's measure: infinite at a bound (a
    time fitted to 0, or an efficiency fitted to 1, all of the peak, is not identified either)."""
    at_bound = value <= 0 or (name in INVERTED and value >= 1.0)
    return math.inf if at_bound else sigma / value


def unidentified(constants: dict[str, float], sigma: dict[str, float], identified: float = IDENTIFIED) -> list[str]:
    """The fitted constants (those with a σ) these runs do not identify, by the rule ``solve`` holds them with."""
    return [k for k in sigma if relative_sigma(k, constants[k], sigma[k]) >= identified]


def _solve_once(rows: Sequence[tuple[np.ndarray, float]], fitted: Sequence[str], fixed: dict[str, float],
                labels: Sequence[str] = (), terms: Sequence[str] = ()) -> Fit:
    """Bounded least squares on relative errors for the ``fitted`` constants (the rest held at ``fixed``); ``terms``:
    lag terms (LAG_TERMS) whose columns follow CONSTANTS' in the rows (``_term_rows``)."""
    from scipy.optimize import lsq_linear

    names = (*CONSTANTS, *terms)
    index = [names.index(k) for k in fitted]
    held = [i for i in range(len(names)) if i not in index]
    theta_fixed = np.concatenate([theta_of({**START, **fixed}), [fixed.get(k, 0.0) for k in terms]])
    a = np.array([row for row, _ in rows])
    b = np.array([measured for _, measured in rows])
    weights = 1.0 / b
    target = (b - a[:, held] @ theta_fixed[held]) * weights
    matrix = a[:, index] * weights[:, None]
    if len(rows) <= len(index):
        raise KvlabError(f"{len(rows)} equations (runs x stages x 3 metrics) cannot fit {len(index)} constants "
                         f"({', '.join(fitted)}); valid: more runs, or fewer constants (--fit)")
    for col, name in enumerate(fitted):
        if not np.any(matrix[:, col]):
            raise KvlabError(f"cannot fit {name}: what it multiplies is 0 in every run "
                             f"({'; '.join(labels[:3]) + ('...' if len(labels) > 3 else '')}); data that would fit "
                             f"it: {FIT_HINTS[name]}; or leave it out (--fit without it: it stays at "
                             f"{START.get(name, 0.0):g})")
    scale = np.linalg.norm(matrix, axis=0)
    singular = np.linalg.svd(matrix / scale, compute_uv=True)
    s, vt = singular[1], singular[2]
    if s[-1] < 1e-9 * s[0]:
        null = np.abs(vt[-1])
        pair = [fitted[i] for i in np.argsort(null)[-2:]]
        raise KvlabError(f"cannot tell {pair[1]} from {pair[0]}: in these runs what they multiply varies in step; "
                         f"data that would fit {pair[1]}: {FIT_HINTS[pair[1]]}")
    lower = np.array([1.0 if k in INVERTED else 0.0 for k in fitted])
    upper = np.array([50.0 if k in INVERTED else 1.0 for k in fitted])
    solution = lsq_linear(matrix / scale, target, bounds=(lower * scale, upper * scale), method="bvls")
    theta = np.clip(solution.x / scale, lower, upper)  # (the solver's last ulp can fall past a bound: -2e-21 s)
    residual = matrix @ theta - target
    dof = max(1, len(rows) - len(index))
    s2 = float(residual @ residual) / dof
    try:
        cov = s2 * np.linalg.inv(matrix.T @ matrix)
        sd = np.sqrt(np.clip(np.diag(cov), 0, None))
    except np.linalg.LinAlgError:
        sd = np.full(len(index), math.inf)
    full = theta_fixed.copy()
    full[index] = theta
    constants = {**carried(fixed), **constants_of(full[:len(CONSTANTS)]),  # (the lag and its spread as replayed)
                 **{k: float(v) for k, v in zip(terms, full[len(CONSTANTS):])}}
    sigma = {}
    for k, t, e in zip(fitted, theta, sd):
        sigma[k] = float(e / t**2) if k in INVERTED else float(e)
    return Fit(constants=constants, sigma=sigma, fitted=tuple(fitted), num_equations=len(rows),
               rms_relative_residual=float(np.sqrt(np.mean(residual**2))))


def _rows(replays: Sequence[Replay], jitter: float | None = None, step: float | None = None, lag: float | None = None
          ) -> tuple[list[tuple[np.ndarray, float]], list[str]]:
    rows, labels = [], []
    for r in replays:
        for group, metric, row, measured in r.equations(jitter, step, lag):
            rows.append((row, measured))
            labels.append(f"run {r.prepared.run.id} {group} {metric}")
    return rows, labels


@dataclass
class Calibration:
    fit: Fit
    replays: list[Replay]  # under the fitted constants
    iterations: int
    history: list[dict[str, float]] = field(default_factory=list)


def calibrate_runs(runs: Sequence[MeasuredRun], fitted: Sequence[str] = DEFAULT_FIT, *,
                   start: dict[str, float] | None = None, max_iterations: int = 4, tolerance: float = 1e-3,
                   progress: Callable[[str], None] | None = None, closed_loop: bool = False,
                   sent: bool = False, identified: float | None = None,
                   arrival_seeds: Sequence[int] | None = ARRIVAL_SEEDS, workers: int = 1,
                   replayed: Callable[[str, int, int], None] | None = None) -> Calibration:
    """The fixed point of (replay under θ, fit θ) over all runs (module doc), damped: each iteration moves θ half
    way to the new fit (a schedule that shifts with the clock made the undamped iteration oscillate); it stops when
    the fit's rms relative residual changes by less than ``tolerance`` or after ``max_iterations``. With ``progress``,
    the plan and its time first (timed_first); ``replayed(round, n, total)`` after each replay."""
    unknown = [k for k in fitted if k not in (*CONSTANTS, *SPREADS)]
    if unknown:
        raise KvlabError(f"--fit {unknown[0]!r} is not a constant kvlab fits on measured runs; valid: "
                         f"{', '.join((*CONSTANTS, *SPREADS))}")
    gridded = [k for k in fitted if k in SPREADS]
    if len(gridded) > 1 and set(gridded) not in JOINT:
        raise KvlabError(f"--fit names {' and '.join(gridded)}: valid: one of {', '.join(SPREADS)}, or {LAG} with {STEP} "
                         "(each is fitted on a grid; those two on the product of their grids)")
    if len(runs) < 2:
        raise KvlabError(f"{len(runs)} measured run: a fit across runs needs at least 2 (and leave-one-out 3)")
    constants = {**START, **(start or {})}
    prepared = [prepare(run, closed_loop, sent, arrival_seeds) for run in runs]
    history = [dict(constants)]
    fit = None
    replays: list[Replay] = []
    previous = math.inf
    known = timed_first(prepared, constants, max_iterations, workers, progress) if progress is not None else {}
    for iteration in range(1, max_iterations + 1):
        replays = replay_all([(p, constants, None) for p in prepared], workers, known if iteration == 1 else None,
                             done=None if replayed is None else partial(replayed, f"iteration {iteration}"))
        rows, labels = _rows(replays)
        fit = fit_spread(replays, fitted, constants, identified) if SPREADS.keys() & set(fitted) else solve(
            rows, fitted, constants, labels, identified)
        if progress is not None:
            progress(f"iteration {iteration}: rms relative residual {replayed_residual(rows, constants):.2%} under "
                     f"the constants the runs were replayed with; {fit.rms_relative_residual:.2%} refitted on those "
                     "replays (the least-squares fit on their schedules, which the next round moves half way to)")
        if abs(previous - fit.rms_relative_residual) < tolerance or iteration == max_iterations:
            break
        previous = fit.rms_relative_residual
        theta = 0.5 * (theta_of(constants) + theta_of(fit.constants))
        constants = {**fit.constants, **constants_of(theta)}  # (CARRIED as given; the spread as fitted)
        history.append(dict(constants))
    assert fit is not None
    # The profile is the fit on the last replays: its σ and residuals are those equations'. Its iterations are the
    # rounds of replay and fit, as progress numbers them (history: the constants each round replayed under).
    return Calibration(fit=fit, replays=replays, iterations=len(history), history=history)


def replayed_residual(rows: Sequence[tuple[np.ndarray, float]], constants: dict[str, float]) -> float:
    """The rms relative error of the fitted means under the constants the rows' replays were run with: the error of
    those constants' own predictions. (What a round of calibrate_runs minimises is the other residual, the fit's on
    the same rows: the least squares on that round's schedules, whose constants are replayed only by the next round,
    half way; it can rise from round to round as the schedules move, while this one falls.)"""
    theta = theta_of({**START, **constants})
    a = np.array([row for row, _ in rows])
    b = np.array([measured for _, measured in rows])
    return float(np.sqrt(np.mean((a @ theta / b - 1.0) ** 2)))


def fit_spread(replays: Sequence[Replay], fitted: Sequence[str], fixed: dict[str, float],
               identified: float | None = None) -> Fit:
    """``solve`` with the lag's spread, its step or the admission lag itself fitted too, whichever ``fitted`` names
    (JITTER's and LAG's comments): the value of its grid (SPREADS) whose fit is nearest the runs' means and tails.
    The admission lag with the step (JOINT) is fitted on the product of their grids: the pair whose fit is nearest."""
    names = [k for k in SPREADS if k in fitted]
    linear = [k for k in fitted if k not in SPREADS]
    parts = [r.request_parts() for r in replays]
    measured = [np.array([r.prepared.run.measured("summary", m) for m in JITTER_METRICS]) for r in replays]
    best: tuple[float, tuple[float, ...], Fit] | None = None
    for values in itertools.product(*(SPREADS[k][0] for k in names)):
        given = {GIVEN[k]: v for k, v in zip(names, values)}
        rows, labels = _rows(replays, **given)
        fit = solve(rows, linear, fixed, labels, identified)
        loss = spread_loss(replays, theta_of(fit.constants), given, parts, measured)
        if best is None or loss < best[0]:
            best = (loss, values, fit)
    assert best is not None
    _, values, fit = best
    return replace(fit, constants={**fit.constants, **{k: float(v) for k, v in zip(names, values)}},
                   fitted=fit.fitted + tuple(names), sigma={**fit.sigma, **{k: SPREADS[k][1] for k in names}})


def spread_loss(replays: Sequence[Replay], theta: np.ndarray, given: dict[str, float], parts=None, measured=None
                ) -> float:
    """What fit_spread minimises: the sum over runs of the squared relative errors of the E2E and TTFT means, p90s
    and p99s (JITTER_METRICS, over all of a run's requests) under θ, with the lag's spread, step or lag ``given``
    (GIVEN's keywords); ``parts`` and ``measured`` are the replays' request_parts and measured values (computed once
    by the caller over a grid)."""
    parts = parts if parts is not None else [r.request_parts() for r in replays]
    if measured is None:
        measured = [np.array([r.prepared.run.measured("summary", m) for m in JITTER_METRICS]) for r in replays]
    loss = 0.0
    for (e2e, ttft, iteration), r, m in zip(parts, replays, measured):
        spread = r.extra(**given)[:, None] * iteration
        e, t = (e2e + spread) @ theta, (ttft + spread) @ theta
        (e90, e99), (t90, t99) = np.percentile(e, (90, 99)), np.percentile(t, (90, 99))
        loss += float(np.sum((np.array([e.mean(), e90, e99, t.mean(), t90, t99]) / m - 1.0) ** 2))
    return loss


def _term_rows(replays: Sequence[Replay], terms: Sequence[str]) -> tuple[list[tuple[np.ndarray, float]], list[str]]:
    """``_rows`` with a column for each lag term (LAG_TERMS) after CONSTANTS': the run's value of what it multiplies in
    its TTFT and E2E rows, 0 in its ITL rows."""
    rows, labels = [], []
    for r in replays:
        values = np.array([LAG_TERMS[k](r.prepared) for k in terms])
        for group, metric, row, measured in r.equations():
            rows.append((np.concatenate([row, values * (metric != "itl_mean")]), measured))
            labels.append(f"run {r.prepared.run.id} {group} {metric}")
    return rows, labels


def leave_one_out_terms(calibration: Calibration, terms: Sequence[str], progress: Callable[[str], None] | None = None,
                        joint: bool = False) -> list[Replay]:
    """``leave_one_out`` with lag terms (LAG_TERMS; an experiment, benchmarks/real_vllm.py --lag-per): each fold fits
    the profile's constants on the other runs' equations as ``leave_one_out`` does, then, the engine's held there,
    ``request_latency_s`` and the terms on those runs' TTFT and E2E equations (ITL's do not carry them), so the terms
    take only what the engine's clock leaves; ``joint``: all of them at once instead. The left-out run, replayed under
    the fold's constants, carries the terms' time as its ``shift_s``."""
    out = []
    fit = calibration.fit
    gridded = [k for k in (*fit.fitted, *fit.held) if k in SPREADS]
    if gridded:
        raise KvlabError(f"the lag terms ({', '.join(terms)}) are fitted with the linear constants only, and this profile's "
                         f"fit names {', '.join(gridded)}, fitted on a grid; valid: a profile whose [fit] fits none of "
                         f"{', '.join(SPREADS)} (vllm-h100), or the grid's own flag without --lag-per")
    for i, held in enumerate(calibration.replays):
        others = [r for j, r in enumerate(calibration.replays) if j != i]
        rows, labels = _term_rows(others, terms)
        try:
            if joint:
                fold = _solve_once(rows, (*fit.fitted, *fit.held, *terms), fit.constants, labels, terms)
            else:
                engine_rows, engine_labels = _rows(others)  # (leave_one_out's fold)
                engine = solve(engine_rows, fit.fitted + fit.held, fit.constants, engine_labels, identified=None)
                lag = [k for k, (_, label) in enumerate(zip(rows, labels)) if not label.endswith("itl_mean")]
                fold = _solve_once([rows[k] for k in lag], ("request_latency_s", *terms), engine.constants,
                                   [labels[k] for k in lag], terms)
        except KvlabError as exc:
            raise KvlabError(f"leave-one-out, the fit without run {held.prepared.run.id!r}: {exc}") from None
        shift = sum(fold.constants[k] * LAG_TERMS[k](held.prepared) for k in terms)
        constants = {k: v for k, v in fold.constants.items() if k not in terms}
        out.append(replace(replay(held.prepared, constants), shift_s=float(shift)))
        if progress is not None:
            progress(f"run {held.prepared.run.id} left out: " + ", ".join(
                f"{k} {fold.constants[k]:.3g}" for k in ("request_latency_s", *terms)) + f"; its lag {shift * 1e3:.2f} ms")
    return out


def leave_one_out(calibration: Calibration, progress: Callable[[str], None] | None = None, workers: int = 1,
                  replayed: Callable[[str, int, int], None] | None = None) -> list[Replay]:
    """Each run replayed under constants fitted on the other runs' equations (module doc): every constant the fit
    was asked for, identified or not. A fold does not apply the identification rule: a constant it would hold stays at
    its start, which here is the fit on every run, the left-out one included, so the fold would predict that run
    with what was fitted on it (docs/cost.md, "The fit": the rule's first leave-one-out figures did so)."""
    folds = fold_constants(calibration)
    if workers > 1:
        return replay_all([(r.prepared, c, None) for r, c in zip(calibration.replays, folds)], workers,
                          done=None if replayed is None else partial(replayed, "leave-one-out"))
    out = []
    for i, (held, constants) in enumerate(zip(calibration.replays, folds)):
        out.append(replay(held.prepared, constants))
        if progress is not None:
            progress(f"leave-one-out {i + 1}/{len(calibration.replays)}: run {held.prepared.run.id} predicted by a "
                     "fit on the others")
    return out


def fold_constants(calibration: Calibration) -> list[dict[str, float]]:
    """Each leave-one-out fold's constants (leave_one_out), in the replays' order: fitted on the other runs' equations."""
    out = []
    fit = calibration.fit
    for i, held in enumerate(calibration.replays):
        others = [r for j, r in enumerate(calibration.replays) if j != i]
        rows, labels = _rows(others)
        try:
            if SPREADS.keys() & set(fit.fitted):
                fold = fit_spread(others, fit.fitted + fit.held, fit.constants)
            else:
                fold = solve(rows, fit.fitted + fit.held, fit.constants, labels, identified=None)
        except KvlabError as exc:
            raise KvlabError(f"leave-one-out, the fit without run {held.prepared.run.id!r}: {exc}; valid: runs such "
                             "that any one left out, the others still fit every constant (or fewer constants: --fit)"
                             ) from None
        out.append(fold.constants)
    return out


def errors(replays: Sequence[Replay]) -> list[dict]:
    """Per run, group and metric: measured, predicted and relative error."""
    rows = []
    for r in replays:
        predicted = r.predicted()
        for group in ("summary",):
            for metric in METRICS:
                measured = r.prepared.run.measured(group, metric)
                rows.append({"run": r.prepared.run.id, "label": r.prepared.run.label, "group": group,
                             "metric": metric, "measured": measured, "predicted": predicted[group][metric],
                             "error": predicted[group][metric] / measured - 1.0})
    return rows


def median_abs_errors(rows: Sequence[dict]) -> dict[str, float]:
    return {m: float(np.median([abs(r["error"]) for r in rows if r["metric"] == m])) for m in METRICS}


def common_gpu(runs: Sequence[MeasuredRun]) -> str:
    """The catalogue GPU every run ran on ("" when they differ)."""
    from kvlab.catalog import get_gpu

    ids = {get_gpu(RUN_HARDWARE.get(run.gpu, run.gpu), otherwise="; valid: a catalogue GPU as the run's hardware "
                   "(kvlab gpus lists them)").id for run in runs}  # (the set's "H100": see RUN_HARDWARE)
    return ids.pop() if len(ids) == 1 else ""


def calibration_profile(runs: Sequence[MeasuredRun], fitted: Sequence[str] = DEFAULT_FIT, *, name: str,
                        source_path, start: dict[str, float] | None = None, max_iterations: int = 4,
                        progress: Callable[[str], None] | None = None, sent: bool = False,
                        identified: float | None = None,
                        arrival_seeds: Sequence[int] | None = ARRIVAL_SEEDS, workers: int = 1,
                        replayed: Callable[[str, int, int], None] | None = None) -> tuple[dict, dict]:
    """Fit, leave one out, and write it all down: (the profile document, the leave-one-out report). ``sent``:
    replay the prompts the runs' client sent (prepare); ``identified``: solve's rule (None: fit every constant);
    ``replayed(what, n, total)``: after each replay (calibrate_runs)."""
    if len(runs) < 3:
        raise KvlabError(f"{source_path.name} holds {len(runs)} measured run{'s' * (len(runs) != 1)} "
                         f"({', '.join(repr(r.id) for r in runs)}): a fit judged by leave-one-out needs at least 3 "
                         "(each run predicted by a fit on at least 2 others); valid: a file of 3 or more runs")
    calibration = calibrate_runs(runs, fitted, start=start, max_iterations=max_iterations, progress=progress,
                                 sent=sent, identified=identified, arrival_seeds=arrival_seeds, workers=workers,
                                 replayed=replayed)
    loo = errors(leave_one_out(calibration, progress=progress, workers=workers, replayed=replayed))
    medians = median_abs_errors(loo)
    fit = calibration.fit
    constants = {k: round_sig(v) for k, v in fit.constants.items()}
    document = profile_document(constants, name, (
        f"Fitted by kvlab calibrate --runs {source_path.name} ({len(runs)} measured runs of real vLLM; the file says "
        "where its numbers come from): least squares across runs on E2E, TTFT and ITL means per load stage, "
        "leave-one-out errors in [fit] (docs/cost.md, 'Fitted on real runs')."))
    gpu = common_gpu(runs)
    if gpu:
        document["gpu"] = gpu
    document["fit"] = {
        "method": "kvlab/cost/fit.py: fixed point of (replay every run, bounded linear least squares on relative "
                  "errors of E2E/TTFT/ITL means per stage)",
        "data": str(source_path.name),
        "runs": [run.id for run in runs],
        "fitted": list(fit.fitted),
        "held": list(fit.held),
        # (the rule: a constant whose σ is this many times its value or more is held; absent: none held so)
        **({"hold_if_sigma_over_value": fit.identified} if fit.identified is not None else {}),
        "held_sigma": {k: round_sig(v) for k, v in fit.held_sigma.items()},
        "held_fitted": {k: round_sig(v) for k, v in fit.held_fitted.items()},
        **({"client_defaults": True} if sent else {}),  # (replayed as their client sent them: prepare's ``sent``)
        # (how the runs' arrivals were replayed, pooled over these draws: a profile is judged the same way)
        **({"arrivals": "even"} if arrival_seeds is None else {"arrivals": "drawn", "arrival_seeds": list(arrival_seeds)}),
        "equations": fit.num_equations,
        "iterations": calibration.iterations,
        "start": {k: round_sig(v) for k, v in calibration.history[0].items()},
        "rms_relative_residual": round_sig(fit.rms_relative_residual),
        "sigma": {k: round_sig(v) for k, v in fit.sigma.items()},
        "loo_median_abs_error": {m: round_sig(v) for m, v in medians.items()},
        "loo_error": {_key(run.id): {r["metric"]: round_sig(r["error"]) for r in loo if r["run"] == run.id}
                      for run in runs},
    }
    return document, {"rows": loo, "median_abs_error": medians}


def _key(run_id: str) -> str:
    """A run's id as a TOML bare key (letters, digits, _ and -)."""
    import re

    return "run_" + re.sub(r"[^A-Za-z0-9_-]", "_", run_id)


def round_sig(value: float, digits: int = 4) -> float:
    """``value`` to ``digits`` significant digits (what a profile file keeps)."""
    if value == 0 or not math.isfinite(value):
        return float(value)
    return float(f"{value:.{digits - 1}e}")

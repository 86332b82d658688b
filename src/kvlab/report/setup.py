"""A run's setup in words, for every report that must state what it answered on: the model and GPUs, the KV
cache, the engine's defaults that change an answer (prefix caching, chunked prefill, the scheduler's limits), the
tensor- and pipeline-parallel communication, the workload and its arrivals, and the cost profile with what its
numbers come from and what it measured of itself (kvlab.config.KvlabConfig.describe's fields)."""

from __future__ import annotations

import re
from typing import Any

from kvlab.config.resolve import engine_setup
from kvlab.cost.profiles import lead_profile
from kvlab.report.text import plural

__all__ = ["engine_defaults_text", "engine_setup", "error_clause", "evidence", "fitted_to", "lead_profile", "lead_text",
           "measured_error", "pool_utilization_clause", "prefix_caching_text", "setup_lines", "utilization_clause"]


def fitted_to(name: str) -> str:
    """What a profile's numbers come from, in a few words."""
    from kvlab.cost.profiles import get_profile

    profile = get_profile(name)
    # (a profile set for a GPU from published figures is not fitted on runs on it: trial 53, finding 12)
    model = f" for {profile.model}" if profile.model else ""
    where = ("stated, not fitted; any GPU" if not profile.gpu else f"fitted on {profile.gpu}{model}"
             if profile.fit.get("runs") else f"set for {profile.model + ' on ' if profile.model else ''}"
             f"{profile.gpu}, not fitted on real runs")
    first = re.sub(r"\s*\([^()]*\)", "", profile.source.split(". ")[0]).strip().rstrip(".")
    return f"{profile.name} ({where}): {_shortened(first, 200)}"


def measured_error(name: str) -> str | None:
    """What a profile fitted on real runs measured of itself (its leave-one-out median errors, kvlab calibrate
    --runs), in words; None for a profile fitted on none."""
    from kvlab.cost.profiles import get_profile

    fit = get_profile(name).fit
    medians = fit.get("loo_median_abs_error")
    if not medians:
        return None
    parts = [f"{label} {medians[key]:.0%}" for key, label in (("ttft_p99", "TTFT p99"), ("ttft_mean", "TTFT mean"),
                                                              ("e2e_mean", "E2E mean"), ("itl_mean", "ITL mean"))
             if key in medians]
    return (f"error on the {len(fit.get('runs', ()))} real vLLM runs it was fitted on, each left out in turn "
            f"(median): {', '.join(parts)}")


def error_clause(name: str) -> str:
    """The accuracy clause every report under a profile states (capacity, size, run, race, sweep): its measured
    error against real runs (measured_error), or that it has none."""
    measured = measured_error(name)
    if measured:
        return measured
    from kvlab.cost.profiles import get_profile

    profile = get_profile(name)
    if profile.fit.get("num_iterations"):  # (kvlab calibrate on bench folders: a real server's steps)
        return ("its error against real serving runs is not measured (it was fitted to a real engine's iterations, "
                f"not to its latencies; kvlab bench --compare --cost {profile.path or name} measures them)")
    return "its error against real serving runs is not measured (none were used to fit it)"


def evidence(name: str) -> str:
    """Why a lead profile is believed: what it is fitted on and its measured error, or that it is stated."""
    return f"{fitted_to(name)}; {error_clause(name)}"


def lead_text(name: str, gpu_id: str, num_clocks: int) -> str:
    """Why an answer leads with this clock (kvlab.cost.profiles.lead_profile's choice), in words."""
    from kvlab.cost.profiles import DEFAULT_PROFILE, default_profile_for

    if name == default_profile_for(gpu_id) != DEFAULT_PROFILE:
        why = "the clock fitted on real runs on this GPU"
    elif name == DEFAULT_PROFILE:
        why = "the stated default: no clock here is fitted on real runs on this GPU"
    else:
        why = "the first clock asked for" if num_clocks > 1 else "the clock asked for"
    return f"Answer under {name}, {why} ({evidence(name)})"


def _shortened(text: str, limit: int) -> str:
    """``text`` cut at the last clause or word that fits ``limit`` characters, with an ellipsis."""
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    for mark in (", ", "; ", " "):
        if mark in cut:
            return cut[:cut.rindex(mark)].rstrip(",;") + " …"
    return cut + "…"


def utilization_clause(utilization: float, version: str | None) -> str:
    """Where vLLM ``version`` (None: the newest kvlab knows) starts at another --gpu-memory-utilization than the
    ``utilization`` kvlab took by default (kvlab.vllm_rules.default_gpu_memory_utilization: 0.92 from 0.20.0), both in
    one clause; else "". `kvlab size` and `fit` say it in a note, run, race and capacity beside their pool (trial 61,
    finding 8)."""
    from kvlab.vllm_rules import default_gpu_memory_utilization, resolve_version

    vllms = default_gpu_memory_utilization(version)
    if vllms == utilization:
        return ""
    return (f"gpu_memory_utilization {utilization:g}, kvlab's default, where vLLM {resolve_version(version)} defaults "
            f"to {vllms:g}")


def pool_utilization_clause(config, stated: bool) -> str:
    """utilization_clause of a run's configuration (kvlab.config.KvlabConfig) where its pool is the blocks kvlab
    estimated at its default utilization: "" where --gpu-memory-utilization was ``stated`` (or given another value),
    or the pool was given (--available-kv-gib, --num-gpu-blocks)."""
    given = dict(config.given)
    if stated or {"gpu_memory_utilization", "num_gpu_blocks"} & set(given) or \
            config.sizing.available_kv_source != "estimated":
        return ""
    return utilization_clause(config.cache.gpu_memory_utilization, config.sizing.vllm_version or None)


def setup_lines(setup: dict[str, Any], *, short: bool = False, utilization: str = "") -> list[str]:
    """A setup (Answer.common_setup) in words, one line per part, only the parts it has (``short``: the cost
    profile by its name, for a figure; ``utilization``: pool_utilization_clause, said of the KV cache)."""
    lines = []
    if "model" in setup and "gpu" in setup:
        parallel = (f" (TP {setup['tensor_parallel_size']}, PP {setup['pipeline_parallel_size']})"
                    if setup.get("num_gpus", 1) > 1 else "")
        replicas = f", {setup['replicas']} replicas" if setup.get("replicas", 1) > 1 else ""
        lines.append(f"{setup['model']} on {setup.get('num_gpus', 1)}× {setup['gpu']}{parallel}{replicas}")
    if "num_gpu_blocks" in setup:
        lines.append(f"KV cache: {setup['num_gpu_blocks']:,} blocks of {setup['block_size']} tokens"
                     + (f" ({utilization})" if utilization else ""))
    if "cpu_tier" in setup:
        tier = setup["cpu_tier"]
        lines.append(f"CPU tier: {tier['size_gib']:g} GiB, {tier['num_cpu_blocks']:,} blocks over {tier['link']} "
                     "(--kv-offloading-size)")
    if "speculative" in setup:
        spec = setup["speculative"]
        drafter = f" drafted by {spec['draft_model']}" if spec.get("draft_model") else ""
        if spec.get("draft_weights_gib"):
            drafter += (f" (its {spec['draft_weights_gib']:.2f} GiB of weights per GPU and its KV counted in the "
                        "cache above)")
        drafts = plural(spec["num_speculative_tokens"], "draft token")
        lines.append(f"speculative decoding: {spec['method']}{drafter}, {drafts} per step, acceptance "
                     f"{spec['acceptance']} (about {spec['expected_tokens_per_step']:.2f} tokens per verify step; "
                     "--speculative-method)")
    limits = [f"{k} {setup[k]:,}" for k in ("max_num_seqs", "max_num_batched_tokens", "max_model_len") if k in setup]
    if "enable_chunked_prefill" in setup:
        limits.append("chunked prefill " + ("on" if setup["enable_chunked_prefill"] else "off"))
    if "prefix_caching" in setup:
        limits.append(prefix_caching_text(setup["prefix_caching"], setup.get("prefix_caching_simulated", True)))
    if limits:
        lines.append("engine: " + ", ".join(limits))
    if setup.get("communication"):
        lines.append("parallel: " + setup["communication"])
    w = setup.get("workload", {})
    words = [str(w["workload"])] if "workload" in w else []
    if "arrival" in w:
        at = f" at {w['rate']:g} req/s" if w.get("rate") is not None else " at the searched rate"
        words.append(f"{w['arrival']} arrivals" + (f" (cv {w['cv']:g})" if w["arrival"] == "gamma" else "") + at)
    if w.get("duration") is not None:
        words.append(f"{w['duration']:g} s of arrivals")
    elif "num_requests" in w:
        n = w["num_requests"]
        scaled = f" (scaled to the engine's {w['num_seats']:,} seats)" if w.get("scaled_to_seats") and "num_seats" in w \
            else ""
        words.append(f"{n:,} request{'' if n == 1 else 's'}{scaled}")
    if "seed" in w:
        words.append(f"seed {w['seed']}")
    if words:
        lines.append("workload: " + ", ".join(words))
    if "cost" in setup:
        lines.append("cost profile: " + (setup["cost"] if short else fitted_to(setup["cost"])))
    return lines


NOT_SIMULATED = " (not simulated for this hybrid model: every lookup misses)"
OWN_HITS_ONLY = (" (for this hybrid model only a preempted request's own blocks still cached hit, as in vLLM's 'align' "
                 "mode; every other lookup misses)")


def prefix_caching_text(by_strategy: dict[str, bool], simulated: bool | str = True) -> str:
    """"prefix caching on" (every strategy), "prefix caching off", or "prefix caching on for vllm, off for
    orca-oracle"; not ``simulated`` (a hybrid model's KV cache groups, kvlab.memory.hybrid: its run's note says so),
    "on" says it is not; "own hits" (a hybrid in 'align' mode, CacheConfig.prefix_caching_simulated), which hits are."""
    states = set(by_strategy.values())
    not_simulated = "" if simulated is True else OWN_HITS_ONLY if simulated == "own hits" else NOT_SIMULATED
    if len(states) == 1:
        return "prefix caching " + ("on" + not_simulated if states.pop() else "off")
    on = [n for n, v in by_strategy.items() if v]
    off = [n for n, v in by_strategy.items() if not v]
    return f"prefix caching on for {', '.join(on)}{not_simulated}, off for {', '.join(off)}"


ENGINE_LIMITS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len")


def engine_defaults_text(settings: list[dict[str, Any]], strategies, simulated: bool | str = True) -> str:
    """The engine settings that change an answer, over several runs' settings (each a dict with ENGINE_LIMITS and
    enable_chunked_prefill, as a sweep's rows or KvlabConfig.describe() have them) and their strategies: "max_num_seqs
    256, max_num_batched_tokens 2,048, max_model_len 2,048, chunked prefill on, prefix caching on for vllm, off for
    orca-max"; a setting that differs between runs is said to vary. Not ``simulated``: prefix caching on is said not
    to be (prefix_caching_text), as on a hybrid model's KV cache groups."""
    words = []
    for key in ENGINE_LIMITS:
        values = {s.get(key) for s in settings} - {None}
        if values:
            words.append(f"{key} {values.pop():,}" if len(values) == 1 else f"{key} varied")
    chunked = {s.get("enable_chunked_prefill") for s in settings} - {None}
    if chunked:
        words.append("chunked prefill " + ("varied" if len(chunked) > 1 else "on" if chunked.pop() else "off"))
    words.append(prefix_caching_text({s.name: s.enable_prefix_caching for s in strategies}, simulated))
    return ", ".join(words)


def model_label(model: str, sizing=None) -> str:
    """A model as a report names it: `kvlab size`'s id (the catalogue's, or a config.json's folder or file name,
    ModelSpec.id) where the run's sizing is at hand, else the configuration's name for it (a catalogue id, a
    config.json's path, a Hugging Face id). Trial 58, finding 16: run named a config.json by its whole path."""
    return sizing.model_id if sizing is not None and getattr(sizing, "model_id", "") else model


def printed_size_row_text(sizing) -> str:
    """How vLLM's printed "GPU KV cache size: N tokens" (`kvlab size`'s row of that name, `fit`'s and the lab's
    calculator's figure) is counted, and where it is not the blocks times their tokens (the pool's token slots, as
    `kvlab run` counts them), that figure beside it: one label for each count (trial 58, finding 1)."""
    formula = (f"int({sizing.num_blocks:,} / {sizing.blocks_per_request:,} x {sizing.max_model_len:,})")
    slots = sizing.num_blocks * sizing.block_size
    if sizing.num_tokens == slots:
        return f"vLLM's startup figure: {formula} = {sizing.num_blocks:,} blocks x {sizing.block_size} tokens"
    return (f"vLLM's startup figure, whole {sizing.max_model_len:,}-token requests' worth: {formula}; not the "
            f"{slots:,} token slots ({sizing.num_blocks:,} blocks x {sizing.block_size} tokens) kvlab run counts")


def printed_size_text(sizing, num_slots: int, block_size: int) -> str | None:
    """How a run's ``num_slots`` token slots relate to the "GPU KV cache size: N tokens" vLLM prints at startup
    (`kvlab size`'s figure) where the two differ for the same blocks: vLLM's counts whole max_model_len requests'
    worth (the blocks over one such request's blocks, times max_model_len; a sliding window's request keeps at most
    its window's blocks, so its figure is above the blocks times their tokens; several KV cache groups take a request's
    blocks in each, so it is below), while the run's counts each block's tokens (trial 58, finding 1). None where
    they agree, where the pool is not vLLM's blocks (--num-gpu-blocks, a draft model's share), or without a sizing."""
    if sizing is None or not sizing.num_tokens or not sizing.blocks_per_request or sizing.num_tokens == num_slots:
        return None
    if num_slots // block_size != sizing.num_blocks or block_size != sizing.block_size:
        return None
    return (f"The same {sizing.num_blocks:,} blocks are vLLM's startup line \"GPU KV cache size: "
            f"{sizing.num_tokens:,} tokens\": it counts whole {sizing.max_model_len:,}-token (max_model_len) requests, "
            f"{sizing.blocks_per_request:,} blocks each (int({sizing.num_blocks:,} / {sizing.blocks_per_request:,} x "
            f"{sizing.max_model_len:,})), where these slots count each block's {block_size} tokens")

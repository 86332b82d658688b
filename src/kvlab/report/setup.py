"""A run's setup in words, for every report that must state what it answered on: the model and GPUs, the KV
cache, the scheduler's limits, the workload and its arrivals, and the cost profile with what its numbers come
from (kvlab.config.KvlabConfig.describe's fields)."""

from __future__ import annotations

import re
from typing import Any


def fitted_to(name: str) -> str:
    """What a profile's numbers come from, in a few words."""
    from kvlab.cost.profiles import get_profile

    profile = get_profile(name)
    where = f"fitted on {profile.gpu}" + (f" for {profile.model}" if profile.model else "") if profile.gpu else \
        "stated, not fitted; any GPU"
    first = re.sub(r"\s*\([^()]*\)", "", profile.source.split(". ")[0]).strip().rstrip(".")
    return f"{profile.name} ({where}): {_shortened(first, 200)}"


def _shortened(text: str, limit: int) -> str:
    """``text`` cut at the last clause or word that fits ``limit`` characters, with an ellipsis."""
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    for mark in (", ", "; ", " "):
        if mark in cut:
            return cut[:cut.rindex(mark)].rstrip(",;") + " …"
    return cut + "…"


def setup_lines(setup: dict[str, Any], *, short: bool = False) -> list[str]:
    """A setup (Answer.common_setup) in words, one line per part, only the parts it has (``short``: the cost
    profile by its name, for a figure)."""
    lines = []
    if "model" in setup and "gpu" in setup:
        parallel = (f" (TP {setup['tensor_parallel_size']}, PP {setup['pipeline_parallel_size']})"
                    if setup.get("num_gpus", 1) > 1 else "")
        replicas = f", {setup['replicas']} replicas" if setup.get("replicas", 1) > 1 else ""
        lines.append(f"{setup['model']} on {setup.get('num_gpus', 1)}× {setup['gpu']}{parallel}{replicas}")
    if "num_gpu_blocks" in setup:
        lines.append(f"KV cache: {setup['num_gpu_blocks']:,} blocks of {setup['block_size']} tokens")
    limits = [f"{k} {setup[k]:,}" for k in ("max_num_seqs", "max_num_batched_tokens", "max_model_len") if k in setup]
    if "enable_chunked_prefill" in setup:
        limits.append("chunked prefill " + ("on" if setup["enable_chunked_prefill"] else "off"))
    if limits:
        lines.append("scheduler: " + ", ".join(limits))
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

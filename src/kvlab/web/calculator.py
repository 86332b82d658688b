"""The lab's calculator: kvlab.sizing's answers for a catalogue model on a catalogue GPU, as the page draws them.

Only catalogue names are accepted here: ``get_model`` would also read a local path or fetch a Hugging Face id,
which a web page must not be able to make the server do.
"""

from __future__ import annotations

from kvlab.errors import KvlabError


def catalogue_model(name: str):
    from kvlab.catalog.models import closest_model_names, find_catalogue_model

    spec = find_catalogue_model(name)
    if spec is None:
        close = closest_model_names(name)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise KvlabError(f"unknown model {name!r}: the lab takes catalogue models (kvlab models).{hint}")
    return spec


def catalog_listing(defaults: dict[str, str]) -> dict:
    """What the page's menus offer: models, GPUs, bundled workloads, named strategies; the defaults by the
    catalogue's own spelling of their names (the menus' values)."""
    from kvlab import defaults as shared
    from kvlab.catalog import get_gpu, list_gpus, list_models
    from kvlab.strategies import STRATEGIES
    from kvlab.workload import WORKLOADS

    return {
        "models": [
            {"name": m.id, "hf_repo": m.hf_repo, "num_layers": m.num_hidden_layers,
             "max_position_embeddings": m.max_position_embeddings}
            for m in list_models()
        ],
        "gpus": [{"name": g.id, "memory_bytes": g.memory_bytes} for g in list_gpus()],
        "workloads": [workload_entry(name, w.summary) for name, w in WORKLOADS.items()],
        "strategies": [{"name": s.name, "description": s.description} for s in STRATEGIES.values()],
        "defaults": {
            "model": catalogue_model(defaults["model"]).id,
            "gpu": get_gpu(defaults["gpu"]).id,
            "workload": defaults["workload"],
            # The runs' defaults: the same as `kvlab race` (kvlab.defaults), so the page and the CLI agree.
            "rate": shared.RATE,
            "num_requests": shared.NUM_REQUESTS,
            "seed": shared.SEED,
            "block_size": shared.BLOCK_SIZE,
            "race": list(shared.RACE_STRATEGIES),
            "story": list(shared.STORY),
        },
    }


def workload_entry(name: str, summary: str) -> dict:
    """A workload in the page's menus; a published trace that is not on this machine says so, and how to get it
    (kvlab.workload.published: the same line a run on it would refuse with)."""
    from kvlab.workload import published

    absent = name in published.TRACES and published.locate(name) is None
    return {"name": name, "description": published.how_to_get(name) if absent else summary, "present": not absent}


def _sized(model: str, gpu: str, gpu_memory_utilization: float, quantization: str | None = None,
           vllm_version: str | None = None, max_model_len: int | None = None):
    from kvlab.service.size import default_sizing_options, sizing_config

    spec = catalogue_model(model)
    gpu_spec, config = sizing_config(**default_sizing_options(gpu=gpu, gpu_memory_utilization=gpu_memory_utilization,
                                                              max_model_len=max_model_len),
                                     quantization=quantization, vllm_version=vllm_version)
    return spec, gpu_spec, config


def least_utilization(*, model: str, gpu: str, gpu_memory_utilization: float, most: float,
                      max_model_len: int | None = None) -> float | None:
    """The least GPU memory utilization above ``gpu_memory_utilization``, in hundredths up to ``most``, at which vLLM
    starts with ``model`` on ``gpu`` (kvlab.sizing.smallest_utilization, the rule `kvlab size`'s advice follows: the
    weights held and one max_model_len request's cache); None where none does."""
    from kvlab.sizing import smallest_utilization

    try:
        spec, _, config = _sized(model, gpu, gpu_memory_utilization, max_model_len=max_model_len)
    except KvlabError:
        return None
    return smallest_utilization(spec, config, most=round(most * 100))


def starts_with(*, model: str, gpu: str, gpu_memory_utilization: float, max_model_len: int | None = None):
    """The sizing where vLLM starts with ``model`` on ``gpu`` at this utilization and max_model_len (None: the
    model's own): the weights held and one max_model_len request's cache in what is left (its own check at
    startup, SizingResult.fits_max_model_len); None where it would refuse."""
    from kvlab.sizing import size_kv_cache

    try:
        spec, _, config = _sized(model, gpu, gpu_memory_utilization, max_model_len=max_model_len)
        result = size_kv_cache(spec, config)
    except KvlabError:
        return None
    return result if result.fits_max_model_len else None


def vllm_starts(*, model: str, gpu: str, gpu_memory_utilization: float, max_model_len: int | None = None) -> bool:
    """Whether vLLM starts with ``model`` on ``gpu`` at this utilization (starts_with)."""
    return starts_with(model=model, gpu=gpu, gpu_memory_utilization=gpu_memory_utilization,
                       max_model_len=max_model_len) is not None


def longest_start(*, model: str, gpu: str, gpu_memory_utilization: float) -> int:
    """The longest max_model_len vLLM starts with for ``model`` on ``gpu`` (its estimate_max_model_len, which `kvlab
    size`'s refusal advises); 0 where the GPU does not hold the weights."""
    from kvlab.sizing import size_kv_cache

    try:
        spec, _, config = _sized(model, gpu, gpu_memory_utilization)
        return size_kv_cache(spec, config).estimated_max_model_len
    except KvlabError:
        return 0


def answer(*, model: str, gpu: str, concurrency: int, context_len: int, gpu_memory_utilization: float,
           quantization: str | None = None, vllm_version: str | None = None, max_model_len: int | None = None) -> dict:
    """``kvlab size MODEL --gpu GPU --gpu-memory-utilization U`` and ``--concurrency N --context-len L`` (and
    ``--quantization``, ``--vllm-version``), in the numbers the page shows (same function, so the same numbers)."""
    from kvlab.report.setup import printed_size_row_text
    from kvlab.service.size import max_num_seqs_cap, start_refusal
    from kvlab.sizing import size_kv_cache, workload_fit

    spec, gpu_spec, config = _sized(model, gpu, gpu_memory_utilization, quantization, vllm_version, max_model_len)
    result = size_kv_cache(spec, config)
    fit = workload_fit(spec, config, concurrency, context_len)
    cap = max_num_seqs_cap(config)  # (vLLM runs at most this many at once, whatever the cache holds: trial 55)
    split = result.memory_split
    return {
        "model": spec.id,
        "gpu": gpu_spec.id,
        "kv_bytes_per_token": result.kv_bytes_per_token,
        "kv_bytes_per_token_per_gpu": result.kv_bytes_per_token_per_gpu,
        "page_size_bytes": result.page_size_bytes,
        "block_size": result.block_size,
        "num_blocks": result.num_blocks,
        "num_tokens": result.num_tokens,  # vLLM's printed "GPU KV cache size", not always the blocks' token slots:
        "num_slots": result.num_blocks * result.block_size,  # (these, `kvlab run`'s count)
        "num_tokens_text": printed_size_row_text(result),  # (how the two relate, `kvlab size`'s row)
        "max_concurrency": result.max_concurrency,
        "max_model_len": result.max_model_len,
        "vllm_starts": result.fits_max_model_len,  # (else the reason, in `kvlab size`'s words: the server words it)
        "refusal": start_refusal(result),
        "weights_bytes": result.weights_bytes,
        "available_kv_bytes": result.available_kv_bytes,
        "kv_cache_bytes": result.kv_cache_bytes,
        "gpu_memory_bytes": split["gpu_memory_bytes"],
        "other_bytes": split["other_bytes"],
        "memory_split": split,
        "log_lines": list(result.vllm_log_lines),
        "vllm_version": result.vllm_version,
        "vllm_rules_since": result.vllm_rules_since,
        "quantization": result.quantization,
        "workload": {
            "concurrency": concurrency,
            "context_len": context_len,
            "num_tokens_needed": concurrency * context_len,
            "kv_bytes_needed": fit.kv_bytes_needed,
            "num_fit": fit.max_num_requests,  # (in the KV cache: `kvlab size`'s max_num_requests)
            "fits": fit.fits,
            "max_num_seqs": cap[0],  # (vLLM's default for the GPU: `kvlab size`'s)
            "num_at_once": min(concurrency, fit.max_num_requests, cap[0]),  # (held by the cache and run by vLLM)
            "spare_blocks": fit.spare_blocks,
        },
    }

"""Sizing: the one builder of a SizingConfig from a face's options, for `kvlab size`, `kvlab fit` and the lab's
calculator (web/calculator.py), so the three size the same GPU the same way.

    options (config/options.py's SIZING_OPTIONS, checked once) ──▶ sizing_config(...) ──▶ (GpuSpec | None, SizingConfig)
                                                                                          ──▶ kvlab.sizing.size_kv_cache
"""

from __future__ import annotations

from dataclasses import replace

from kvlab.catalog import GpuSpec, get_gpu
from kvlab.config.engine import GIB
from kvlab.config.options import OPTIONS, SIZING_OPTIONS, draft_tokens_per_step
from kvlab.sizing import SizingConfig, SizingResult, WorkloadReplicas, cdiv, fewest_gpus_pipelined
from kvlab.validate import check_options


def gpu_label(gpu_id: str, gpu_memory_gib: float | None) -> str:
    """The GPU as kvlab names it: --gpu-memory-gib replaces the memory of --gpu, and the name says so."""
    return gpu_id if gpu_memory_gib is None else f"{gpu_id} with {gpu_memory_gib:g} GiB"


def sizing_config(gpu, gpu_memory_gib, tensor_parallel_size, pipeline_parallel_size, gpu_memory_utilization,
                  block_size, dtype, kv_cache_dtype, max_model_len, max_num_batched_tokens, max_num_seqs,
                  available_kv_gib, speculative_method=None, num_speculative_tokens=None, vllm_version=None,
                  quantization=None, enforce_eager=False, sampler=None, decode_context_parallel_size=1,
                  model_runner=None, enable_expert_parallel=False,
                  search_tensor_parallel=False, mtp_layers=0) -> tuple[GpuSpec | None, SizingConfig]:
    """(GpuSpec or None, SizingConfig) from the sizing options, checked (kvlab.validate). With --gpu and
    --gpu-memory-gib both, the GPU keeps its name and defaults and takes the given memory, as in `kvlab run`.
    Without --tensor-parallel-size the size is vLLM's default, 1; where the face searches it (``search_tensor_parallel``,
    `kvlab fit`), the search starts at the smallest size the DCP size allows (DCP groups are made of TP ranks).
    The speculative config's draft tokens follow `kvlab run`'s rule (config.options.draft_tokens_per_step;
    ``mtp_layers``: the model's MTP layers, the default with mtp)."""
    from kvlab.sizing import SPECULATIVE_METHODS
    from kvlab.vllm_rules import check_model_runner

    check_options(locals())
    tokens = draft_tokens_per_step(speculative_method, num_speculative_tokens, mtp_layers,
                                    " or ".join(SPECULATIVE_METHODS))
    check_model_runner(model_runner, vllm_version)
    spec = get_gpu(gpu) if gpu is not None else None
    if spec is not None and gpu_memory_gib is not None:
        spec = replace(spec, id=gpu_label(spec.id, gpu_memory_gib), memory_bytes=round(gpu_memory_gib * GIB),
                       memory_bytes_source="set by --gpu-memory-gib")
    memory = spec.memory_bytes if spec else (round(gpu_memory_gib * GIB) if gpu_memory_gib is not None else None)
    config = SizingConfig(
        gpu_memory_bytes=memory, gpu_name=spec.id if spec else None,
        gpu_memory_utilization=gpu_memory_utilization, block_size=block_size, dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        tensor_parallel_size=tensor_parallel_size or (max(decode_context_parallel_size, 1) if search_tensor_parallel
                                                    else 1),  # (a DCP size below 1 is refused by its own name)
        pipeline_parallel_size=pipeline_parallel_size, max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        available_kv_bytes=None if available_kv_gib is None else round(available_kv_gib * GIB),
        vllm_version=vllm_version, quantization=quantization, enforce_eager=enforce_eager, sampler=sampler,
        decode_context_parallel_size=decode_context_parallel_size, model_runner=model_runner,
        enable_expert_parallel=enable_expert_parallel,
        **({"speculative_method": speculative_method, "num_speculative_tokens": tokens} if tokens else {}),
    )
    return spec, config


def default_sizing_options(**given) -> dict:
    """The sizing options at their defaults (config/options.py's OPTIONS), with ``given`` put in: what a face that
    asks only some of them (the lab's calculator: a GPU and a memory share) passes to ``sizing_config``."""
    return {**{name: OPTIONS[name].default for name in SIZING_OPTIONS}, **given}


def start_refusal(result) -> str | None:
    """Why vLLM would refuse to start with this sizing (kvlab.sizing.SizingResult.fits_max_model_len: one max_model_len
    request must fit in the usable blocks, its own check at startup), in kvlab size's words; None where it starts.
    `kvlab size` prints it, the lab's calculator answers it (its --max-model-len as the parameter)."""
    if result.fits_max_model_len:
        return None
    return (f"vLLM would refuse to start: one {result.max_model_len:,}-token request needs "
            f"{result.blocks_per_request:,} blocks but {result.num_usable_blocks:,} are usable; the longest that fits "
            f"is {result.estimated_max_model_len:,} tokens (--max-model-len {result.estimated_max_model_len}).")


def max_num_seqs_cap(config: SizingConfig) -> tuple[int, str]:
    """vLLM's cap on the requests it runs at once, whatever the KV cache holds, and where it comes from (trial 55,
    finding 2: 'fits' said of 5,000 requests where vLLM runs 1,024). The one home of the cap for `kvlab size`,
    `kvlab fit` and the lab's calculator."""
    cap = config.resolved_max_num_seqs
    return cap, (f"--max-num-seqs {cap:,}" if config.max_num_seqs is not None
                 else "max_num_seqs: vLLM's default here")


def at_once_text(cap: tuple[int, str]) -> str:
    """"vLLM runs at most 1,024 at once (max_num_seqs, ...)"."""
    return f"vLLM runs at most {cap[0]:,} at once ({cap[1]})"


def running_replicas(options: list[WorkloadReplicas], max_num_seqs: int) -> list[WorkloadReplicas]:
    """kvlab.sizing.workload_replicas' options with each replica running at most ``max_num_seqs`` requests at once,
    however many its KV cache holds: the replicas that run ``num_requests`` at once (trial 55, finding 2: `fit`
    counted the cache's alone). Searching the capped options of workload_replicas' sizes finds the fewest GPUs:
    a larger size it left out has at least as many GPUs per replica as its fewest, and needs at least as many
    replicas under the cap."""
    return [replace(o, num_replicas=cdiv(o.num_requests, min(o.max_num_requests, max_num_seqs))) for o in options]


def fewest_pipelined(model, gpu: GpuSpec, config: SizingConfig,
                     tp_alone: int | None) -> tuple[int, int, SizingResult] | None:
    """The fewest GPUs with pipeline parallelism as well (kvlab.sizing.fewest_gpus_pipelined: TP x PP, tensor
    parallelism within a node), where ``config`` asks for no pipeline stages (PP 1) and the answer differs from
    tensor parallelism alone's (``tp_alone``: its size, None where none holds): fewer GPUs, or as many without
    tensor parallelism across nodes. None otherwise. `kvlab fit` and `kvlab capacity --replicas auto` both ask it
    (trial 54, finding 5: capacity searched TP alone)."""
    if config.pipeline_parallel_size != 1:
        return None
    found = fewest_gpus_pipelined(model, gpu, config)
    if found is None:
        return None
    tp, pp, _ = found
    if tp_alone is not None and (tp * pp > tp_alone or (pp == 1 and tp == tp_alone)):
        return None
    return found

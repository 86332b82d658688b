"""kvlab's sizing against real vLLM startup logs: each term predicted from scratch against what vLLM printed.

    python benchmarks/startup_logs.py            # per log: weights, activation, non-torch, CUDA graphs,
                                                 # available KV, KV tokens, max concurrency; then the shares
    python benchmarks/startup_logs.py --fit      # also the coefficients the logs of the fitting half imply
    python benchmarks/startup_logs.py --write    # also store the summary's KV-token accuracy where `kvlab size`
                                                 # and `kvlab fit` read it (src/kvlab/catalog/data/sizing_accuracy.json)

The corpus is tests/data/startup_logs/index.json (one entry per log: where it comes from, the settings it was
started with, the figures it printed); models the catalogue lacks are read from tests/data/model_configs/. The
printed figures are read again from each log with kvlab's own reader (kvlab.vllm.log) and checked against the
index. Logs are split in two by a hash of their id: the estimates' coefficients (kvlab.memory_profile.FIT) may be
fitted on the "fit" half only; the "held-out" half says how they do on logs they have not seen.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "startup_logs"
CONFIGS = (ROOT / "tests" / "data" / "model_configs", ROOT / "tests" / "data" / "sizing_configs",
           Path("/work/shared/data/model-configs"))
GIB = 2**30
WITHIN = 0.02


def split_of(log_id: str) -> str:
    return "fit" if zlib.crc32(log_id.encode()) % 2 == 0 else "held-out"


def find_model(entry: dict):
    """The model of a log: a config.json the corpus carries for it (index.json's model_config, else its name), else
    the catalogue; None with the reason."""
    from kvlab.catalog.config import load_config_path
    from kvlab.catalog.models import find_catalogue_model
    from kvlab.errors import KvlabError

    model = str(entry.get("model") or "").split(" (")[0]
    names = [entry.get("model_config"), model.split("/")[-1], model.split("/")[-1].lower(), model.replace("/", "--")]
    for folder in (entry["_folder"].parent / "model_configs", *CONFIGS):
        for name in filter(None, names):
            for path in (folder / name, folder / f"{name}.json", folder / name / "config.json"):
                if path.is_file():
                    try:  # a config.json whose layout or format kvlab does not model: its refusal, in one line
                        return load_config_path(str(path)), None
                    except KvlabError as exc:
                        return None, str(exc).replace(f"{ROOT}/", "")
    # model_config may name a catalogue entry of the same shape (a quantized checkpoint of a catalogued model, its
    # format then from the entry's quantization)
    spec = (find_catalogue_model(entry["model_config"]) if entry.get("model_config") else None) \
        or find_catalogue_model(model) or find_catalogue_model(model.split("/")[-1])
    if spec is not None:
        return spec, None
    return None, (f"no config.json for {model.split(' (')[0]!r} in the catalogue, tests/data/model_configs or "
                  "tests/data/sizing_configs")


def gpu_named_in(text: str) -> str | None:
    """The one catalogue GPU whose id or alias the index's GPU text names ('NVIDIA GeForce RTX 3090 (4 cards)'),
    for entries written before the catalogue had the card; None when none or several match."""
    import re

    from kvlab.catalog import list_gpus
    from kvlab.catalog.models import name_key

    words = name_key(re.sub(r"\(.*", "", text))
    hits = {g.id for g in list_gpus() for name in (g.id, *g.aliases)
            if len(name_key(name)) > 4 and name_key(name) in words}
    return hits.pop() if len(hits) == 1 else None


def printed_total_gib(entry: dict) -> float | None:
    """The GPU total the log prints ('Free memory on device (78.66/79.19 GiB)'), or the index's."""
    if entry["printed"].get("total_gib"):
        return entry["printed"]["total_gib"]
    return read_log(entry).get("total_gib")


def sampler_of(entry: dict) -> str | None:
    """The top-k/top-p sampler the log names (vLLM prints which one it uses), or None."""
    try:
        text = (entry["_folder"] / entry["file"]).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    if "Using FlashInfer for top-p & top-k sampling" in text:
        return "flashinfer"
    if "PyTorch-native implementation of top-p & top-k sampling" in text:
        return "pytorch"
    return None


def dcp_of(entry: dict) -> int:
    """--decode-context-parallel-size as the entry's flags state it (1 without)."""
    import re

    m = re.search(r"--decode-context-parallel-size[ =](\d+)", str(entry.get("other_flags") or ""))
    return int(m.group(1)) if m else 1


def expert_parallel_of(entry: dict) -> bool:
    """Whether the entry's flags turn on expert parallelism (--enable-expert-parallel, or its -ep)."""
    import re

    return re.search(r"(^|\s)(--enable-expert-parallel|-ep)(\s|=|$)", str(entry.get("other_flags") or "")) is not None


def quantization_of(entry: dict) -> str | None:
    """The --quantization the entry states, when the model's config does not carry it."""
    text = str(entry.get("quantization") or "").lower()
    for name in ("nvfp4", "mxfp4", "fp8", "awq", "gptq", "auto_round", "autoround", "int4", "int8"):
        if name in text:
            return {"int4": "gptq", "auto_round": "auto-round", "autoround": "auto-round"}.get(name, name)
    return None


def speculative_of(entry: dict) -> dict:
    """The entry's speculative config (index.json's speculative_config, vLLM's --speculative-config) as sizing
    settings; none without one."""
    spec = entry.get("speculative_config")
    if not spec:
        return {}
    return {"speculative_method": spec["method"], "num_speculative_tokens": spec["num_speculative_tokens"]}


@dataclass
class Row:
    entry: dict
    error: str | None = None
    predicted: dict = field(default_factory=dict)
    printed: dict = field(default_factory=dict)
    reader: dict = field(default_factory=dict)


def predict(entry: dict) -> Row:
    from kvlab.catalog import get_gpu
    from kvlab.errors import KvlabError
    from kvlab.sizing import SizingConfig, profile_family, profile_runner, size_kv_cache
    from kvlab.vllm_rules import default_gpu_memory_utilization

    row = Row(entry, printed=dict(entry.get("printed") or {}))
    if entry.get("not_sizable"):  # what the log shows kvlab cannot model (index.json says why), not guessed at
        row.error = entry["not_sizable"]
        return row
    total = printed_total_gib(entry)
    gpu_id = entry.get("gpu_kvlab") or gpu_named_in(str(entry.get("gpu") or ""))
    if not gpu_id and total is None:
        row.error = f"GPU {str(entry.get('gpu'))[:60]!r} is not in kvlab's catalogue and the log prints no total"
        return row
    # A dev build or an unstated version whose range falls in one epoch of the rules: that epoch's release (index.json)
    version = entry.get("vllm_rules_version") or entry.get("vllm_version")
    if not version or not str(version)[:1].isdigit():
        row.error = f"the log states no vLLM version ({entry.get('vllm_version')!r}), and the rules differ by version"
        return row
    model, why = find_model(entry)
    if model is None:
        row.error = why
        return row
    try:
        if gpu_id:
            gpu = get_gpu(gpu_id)
            if entry.get("gpu_memory_gib"):  # this machine's own total, where the index has evidence of it
                from dataclasses import replace

                gpu = replace(gpu, memory_bytes=round(entry["gpu_memory_gib"] * GIB),
                              memory_bytes_source="index.json: " + entry["settings_from"]["gpu_memory_gib"])
        else:  # the card is not named, but vLLM printed its total: size with that memory, as --gpu-memory-gib does
            from kvlab.catalog.gpus import GpuSpec

            gpu = GpuSpec(id=f"a {total} GiB GPU", memory_bytes=round(total * GIB),
                          memory_bytes_source="printed by the log", memory_bandwidth_bytes_per_s=None, peak_flops=None)
        kv_dtype = entry.get("kv_cache_dtype") or "auto"
        dtype = entry.get("dtype") or "auto"
        settings = dict(
            # (not recorded: the version's default, 0.92 from 0.20.0, 0.9 before)
            gpu_memory_utilization=entry.get("gpu_memory_utilization") or default_gpu_memory_utilization(version),
            tensor_parallel_size=entry.get("tensor_parallel_size") or 1,
            pipeline_parallel_size=entry.get("pipeline_parallel_size") or 1,
            max_model_len=entry.get("max_model_len"), max_num_batched_tokens=entry.get("max_num_batched_tokens"),
            max_num_seqs=entry.get("max_num_seqs"), kv_cache_dtype=kv_dtype if kv_dtype != "None" else "auto",
            dtype=dtype if dtype in ("auto", "float16", "bfloat16", "float32") else "auto",
            vllm_version=version, enforce_eager=bool(entry.get("enforce_eager")),
            sampler=sampler_of(entry), decode_context_parallel_size=dcp_of(entry),
            enable_expert_parallel=expert_parallel_of(entry),
            quantization=None if model.weight_format is not None else quantization_of(entry),
            enable_prefix_caching=entry.get("enable_prefix_caching"), **speculative_of(entry))
        config = SizingConfig.for_gpu(gpu, **settings)
        result = size_kv_cache(model, config)
    except KvlabError as exc:
        if "config" in locals() and ("no memory left" in str(exc) or "does not fit" in str(exc)):
            row.predicted = failed_start(model, config)  # vLLM too printed a budget of zero or less, or ran out
            return row
        row.error = str(exc)
        return row
    terms = first_stage_terms(model, config, result)
    row.predicted = {
        **terms, "available_kv_gib": result.printed_available_kv_bytes / GIB, "kv_cache_tokens": result.num_tokens,
        "max_concurrency": result.max_concurrency, "requested_gib": result.requested_memory_bytes / GIB,
        "multimodal": bool(model.vision_params), "rules": result.vllm_rules_since,
        "family": profile_family(model, config.quantization),
        "sampler": sampler_of(entry) or SizingConfig(vllm_version=version).rules.default_sampler,
        "sampler_named": sampler_of(entry) is not None, "logits": (min(result.max_num_seqs, result.max_num_batched_tokens)
                                                 * model.vocab_size),
        "encoder": encoder_of(model, config), "encoder_dummy": encoder_dummy_of(model, config),
        "model_runner": profile_runner(model, config),
    }
    return row


def first_stage_terms(model, config, result) -> dict:
    """The terms of the stage whose budget the log prints: the first pipeline stage's (vLLM's first worker logs its
    own 'Available KV cache memory'), while the tokens are the binding stage's (result.limiting_stage); with one
    stage, the result's."""
    if result.pipeline_parallel_size == 1 or result.limiting_stage == 0:
        return {"weights_gib": result.weights_bytes / GIB, "activation_gib": result.activation_bytes / GIB,
                "non_torch_gib": result.non_torch_bytes / GIB, "cuda_graph_gib": result.cuda_graph_bytes / GIB}
    from kvlab.catalog.models import DTYPE_BYTES
    from kvlab.sizing import pipeline_stages, stage_profiles

    stages = pipeline_stages(model.num_hidden_layers, config.pipeline_parallel_size)
    first = stage_profiles(model, config, stages, DTYPE_BYTES[result.dtype])[0]
    return {"weights_gib": first.weights.bytes / GIB, "activation_gib": first.activation.bytes / GIB,
            "non_torch_gib": first.non_torch.bytes / GIB, "cuda_graph_gib": first.cuda_graphs.bytes / GIB}


def encoder_of(model, config) -> str | None:
    """kvlab's dummy for the encoder's profiling run, in the words of vLLM's log line; None for a text model."""
    from kvlab.sizing import encoder_inputs

    e = encoder_inputs(model, config)
    if e is None:
        return None
    text = f"{e.items} {e.modality} item(s) of {e.tokens_per_item:,} tokens"
    if e.modality == "video":
        text += f" ({e.frames:,} frames{f' of {e.side}^2 pixels' if e.side else ''}), budget {e.budget_tokens:,} tokens"
    return text + (" (vLLM profiles a video here: its size not derived)" if e.video_instead else "")


def encoder_dummy_of(model, config) -> tuple | None:
    """(modality, items, budget tokens) of kvlab's encoder dummy, as vLLM's 'Encoder cache' line states them."""
    from kvlab.sizing import encoder_inputs

    e = encoder_inputs(model, config)
    return None if e is None or e.video_instead else (e.modality, e.items, e.budget_tokens)


def failed_start(model, config) -> dict:
    """The memory profile where kvlab finds no room for the cache (the terms, a budget of zero or less)."""
    from kvlab.catalog.models import DTYPE_BYTES
    from kvlab.sizing import pipeline_stages, profile_family, profile_runner, resolve_dtype, stage_profiles

    stages = pipeline_stages(model.num_hidden_layers, config.pipeline_parallel_size)
    profile = stage_profiles(model, config, stages, DTYPE_BYTES[resolve_dtype(model, config.dtype)])[0]
    return {
        "weights_gib": profile.weights.bytes / GIB, "activation_gib": profile.activation.bytes / GIB,
        "non_torch_gib": profile.non_torch.bytes / GIB, "cuda_graph_gib": profile.cuda_graphs.bytes / GIB,
        "available_kv_gib": profile.available_bytes / GIB, "kv_cache_tokens": None, "max_concurrency": None,
        "requested_gib": profile.requested.bytes / GIB, "multimodal": bool(model.vision_params),
        "rules": config.rules.since, "family": profile_family(model, config.quantization),
        "sampler": config.sampler or config.rules.default_sampler, "sampler_named": config.sampler is not None,
        "logits": min(config.resolved_max_num_seqs, config.resolved_max_num_batched_tokens) * model.vocab_size,
        "model_runner": profile_runner(model, config),
    }


def read_log(entry: dict) -> dict:
    """The figures kvlab's own log reader finds in the log file."""
    from kvlab.errors import KvlabError
    from kvlab.vllm.log import parse_vllm_log

    path = entry["_folder"] / entry["file"]
    try:
        log = parse_vllm_log(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, KvlabError) as exc:
        return {"error": str(exc).splitlines()[0][:100]}
    return {"kv_cache_tokens": log.kv_cache_tokens, "max_concurrency": log.max_concurrency,
            "available_kv_gib": log.available_kv_cache_gib, "model_loading_gib": log.model_weights_gib,
            "activation_gib": log.activation_gib, "non_torch_gib": log.non_torch_gib,
            "cuda_graph_gib": log.cuda_graph_gib, "total_gib": log.total_gpu_memory_gib,
            "weights_and_non_torch_gib": log.weights_and_non_torch_gib,
            "encoder_budget_tokens": log.encoder_budget_tokens, "encoder_profile_items": log.encoder_profile_items,
            "encoder_profile_modality": log.encoder_profile_modality,
            "estimated_cuda_graph_gib": log.estimated_cuda_graph_gib, "cuda_graphs_profiled": log.cuda_graphs_profiled,
            "estimated_cuda_graph_share": log.estimated_cuda_graph_share}


def rel(predicted, printed) -> float | None:
    if predicted is None or not printed:
        return None
    return (predicted - printed) / printed


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def num(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


TERMS = (("weights GiB", "weights_gib", "model_loading_gib"), ("activation GiB", "activation_gib", "activation_gib"),
         ("non-torch GiB", "non_torch_gib", "non_torch_gib"), ("CUDA graphs GiB", "cuda_graph_gib", "cuda_graph_gib"),
         ("available KV GiB", "available_kv_gib", "available_kv_gib"))


def as_printed(p: dict, mine: str) -> float:
    """kvlab's figure for the log's term of that name. Where the version deducts the CUDA-graph estimate (rules of
    0.21.0 on), vLLM reports it inside the peak activation (gpu_worker.determine_available_memory: peak_activation_memory
    = the profiling run's transient peak + the graph estimate applied), so kvlab's activation and graph estimates are
    compared with that figure together."""
    if mine == "activation_gib" and p["cuda_graph_gib"] > 0:
        return p["activation_gib"] + p["cuda_graph_gib"]
    return p[mine]


def graphs_note(p: dict) -> str:
    """Why the log's 'CUDAGraph memory' is not a term of the budget: vLLM measures it while capturing, after the cache
    is allocated (capture_model), whether or not the version deducted an estimate beforehand."""
    if p["cuda_graph_gib"] == 0:
        return "  (printed after the cache was allocated: not deducted)"
    return "  (the capture's own, after the cache; the estimate deducted is inside the printed activation)"


def print_row(row: Row) -> None:
    e = row.entry
    rules = f" (rules of {e['vllm_rules_version']}: {e['settings_from']['vllm_rules_version'][:60]}…)" \
        if e.get("vllm_rules_version") else ""
    print(f"\n{e['id']}  [{split_of(e['id'])}]  vLLM {e.get('vllm_version')}{rules} · {e.get('num_gpus')} x "
          f"{e.get('gpu_kvlab') or e.get('gpu')} · TP {e.get('tensor_parallel_size')} · {', '.join(e.get('layout', []))}")
    mismatch = [f"{k} reader {row.reader.get(k)} vs index {row.printed.get(k)}" for k in
                ("kv_cache_tokens", "max_concurrency", "available_kv_gib", "model_loading_gib", "activation_gib",
                 "non_torch_gib", "cuda_graph_gib", "total_gib")
                if row.reader.get(k) is not None and row.printed.get(k) is not None
                and abs(row.reader[k] - row.printed[k]) > 1e-6 * max(1, abs(row.printed[k]))]
    if "error" in row.reader:
        print(f"  log reader: {row.reader['error']}")
    elif mismatch:
        print("  log reader disagrees with index.json: " + "; ".join(mismatch))
    if row.error:
        print(f"  not sized: {row.error}")
        return
    p, q = row.predicted, row.printed
    print(f"  rules of {p['rules']} on; requested {p['requested_gib']:.2f} GiB")
    for label, mine, theirs in TERMS:
        printed = q.get(theirs)
        note = graphs_note(p) if mine == "cuda_graph_gib" and printed is not None else ""
        mine_value = as_printed(p, mine)
        err = None if printed is None or note else mine_value - printed
        if mine_value != p[mine]:
            label = "activation+graphs"
        print(f"  {label:<18} {mine_value:>10.2f}  printed {num(printed):>8}  error "
              f"{'-' if err is None else f'{err:+.2f} GiB'}{note}")
    consumed = row.reader.get("weights_and_non_torch_gib")
    if consumed is not None:  # later releases print weights and non-torch memory as one 'consumed memory'
        mine_value = p["weights_gib"] + p["non_torch_gib"]
        print(f"  {'weights+non-torch':<18} {mine_value:>10.2f}  printed {consumed:>8.2f}  error "
              f"{mine_value - consumed:+.2f} GiB  (its 'consumed memory': the fall in free memory from the worker's first "
              "snapshot to after profiling, mem_utils.memory_profiling's total_consumed: weights, non-torch and what "
              "profiling left allocated)")
    for label, key, fmt in (("KV tokens", "kv_cache_tokens", ",d"), ("max concurrency", "max_concurrency", ".2f")):
        print(f"  {label:<18} {num(p[key], fmt):>10}  printed {num(q.get(key), fmt):>8}  error "
              f"{pct(rel(p[key], q.get(key)))}")
    if row.reader.get("encoder_profile_items") is not None or p.get("encoder"):
        logged = row.reader.get("encoder_profile_items")
        print(f"  encoder run        kvlab {p.get('encoder') or 'not derived for this tower'}; log "
              + (f"{logged} {row.reader['encoder_profile_modality']} item(s), budget "
                 f"{row.reader['encoder_budget_tokens']:,} tokens" if logged is not None else "does not say")
              + encoder_agreement(p.get("encoder_dummy"), row.reader))


def encoder_agreement(mine: tuple | None, reader: dict) -> str:
    """Whether kvlab's dummy (modality, items, budget) is the one the log says vLLM profiled."""
    if mine is None or reader.get("encoder_profile_items") is None:
        return ""
    logged = (reader["encoder_profile_modality"], reader["encoder_profile_items"], reader["encoder_budget_tokens"])
    return " (the same dummy)" if tuple(mine) == logged else " (NOT the dummy the log names)"


def cause(row: Row) -> str:
    """Which term the error comes from: the largest gap among terms the log prints, else the estimated ones."""
    p, q = row.predicted, row.printed
    gaps = {label: as_printed(p, mine) - q[theirs] for label, mine, theirs in TERMS[:3] if q.get(theirs) is not None}
    if row.reader.get("weights_and_non_torch_gib") is not None:
        gaps["weights+non-torch"] = p["weights_gib"] + p["non_torch_gib"] - row.reader["weights_and_non_torch_gib"]
    budget = None if q.get("available_kv_gib") is None else p["available_kv_gib"] - q["available_kv_gib"]
    if gaps:
        label, gap = max(gaps.items(), key=lambda kv: abs(kv[1]))
        # a printed term explains the error when it is most of the budget's gap (kvlab's term too small: budget high)
        if abs(gap) >= 0.05 and (budget is None or abs(gap) >= 0.5 * abs(budget)):
            return f"{label} off by {gap:+.2f} GiB (printed by the log)"
        if abs(gap) >= 0.05:
            return (f"budget off by {budget:+.2f} GiB, of which {label} {gap:+.2f} GiB (printed by the log); the rest "
                    "in terms the log does not print")
    if budget is None:
        return "the log prints no budget to compare"
    estimated = ", ".join(f"{label.split()[0]} {p[mine]:.2f}" for label, mine, theirs in TERMS[:4]
                          if q.get(theirs) is None)
    text = f"budget off by {budget:+.2f} GiB: the estimated terms ({estimated} GiB), which the log does not print"
    from kvlab.catalog.gpus import is_unified_memory

    if is_unified_memory(row.entry.get("gpu_kvlab") or gpu_named_in(str(row.entry.get("gpu") or ""))):
        text += "; on unified memory vLLM's non-torch term is the fall in the host's available memory, not estimated"
    return text


ACCURACY = ROOT / "src" / "kvlab" / "catalog" / "data" / "sizing_accuracy.json"


def kv_token_accuracy(rows: list[Row]) -> dict:
    """How far kvlab's estimated KV cache tokens are from what vLLM printed, over every sized log of the corpus that
    prints its tokens: what `kvlab size` and `kvlab fit` say beside an estimated budget (kvlab.catalog.accuracy)."""
    sized = [r for r in rows if not r.error and r.predicted.get("kv_cache_tokens") is not None
             and r.printed.get("kv_cache_tokens")]
    errors = sorted((rel(r.predicted["kv_cache_tokens"], r.printed["kv_cache_tokens"]) for r in sized), key=abs)
    halves = {part: [abs(rel(r.predicted["kv_cache_tokens"], r.printed["kv_cache_tokens"])) for r in sized
                     if split_of(r.entry["id"]) == part] for part in ("fit", "held-out")}
    return {"num_logs": len(rows), "num_sized": len(errors), "within": WITHIN,
            "num_within": sum(abs(x) <= WITHIN for x in errors),
            # (the held-out half is the honest score for a model kvlab was not fitted on; "fit" the half fitted on)
            **{f"{part.replace('-', '_')}_{key}": value for part, errs in halves.items() for key, value in
               (("num_sized", len(errs)), ("num_within", sum(x <= WITHIN for x in errs)))},
            "median_abs_error": round(statistics.median(abs(x) for x in errors), 4) if errors else None,
            "largest_error": round(errors[-1], 4) if errors else None,
            # (which way the misses go: a plan counts on the tokens, so an estimate above vLLM's is the costly side)
            "num_above": sum(x > WITHIN for x in errors), "num_below": sum(x < -WITHIN for x in errors),
            "largest_above": round(max(errors), 4) if errors else None,
            "command": "python benchmarks/startup_logs.py --write"}


def summary(rows: list[Row]) -> None:
    print("\n== summary ==")
    acc = kv_token_accuracy(rows)
    if acc["num_sized"]:
        print(f"  KV tokens, all sized logs: {acc['num_within']} of {acc['num_sized']} within {WITHIN:.0%}, median "
              f"|error| {acc['median_abs_error']:.1%}, largest {acc['largest_error']:+.1%} (`kvlab size` "
              "quotes it after the held-out half's, below, beside an estimated budget; --write stores both)")
    for part in ("fit", "held-out", "all"):
        chosen = [r for r in rows if part == "all" or split_of(r.entry["id"]) == part]
        sized = [r for r in chosen if not r.error]
        for label, key in (("KV tokens", "kv_cache_tokens"), ("max concurrency", "max_concurrency")):
            errors = [rel(r.predicted[key], r.printed.get(key)) for r in sized
                      if r.printed.get(key) and r.predicted[key] is not None]
            within = sum(abs(x) <= WITHIN for x in errors)
            print(f"  {part:<8} {label:<16} within 2%: {within} of {len(errors)} sized logs "
                  f"({within / len(errors):.0%})" if errors else f"  {part:<8} {label:<16} no sized log",
                  f"· {len(chosen)} logs in all, {len(chosen) - len(sized)} not sized")
    text_only = [r for r in rows if not r.error and r.printed.get("model_loading_gib") is not None
                 and not r.predicted["multimodal"] and "multimodal" not in r.entry.get("layout", [])]
    errs = [r.predicted["weights_gib"] - r.printed["model_loading_gib"] for r in text_only]
    ok = sum(abs(x) <= 0.1 for x in errs)
    middle = f", median |error| {statistics.median(abs(x) for x in errs):.3f} GiB" if errs else ""
    print(f"  weights (text-only): {ok} of {len(errs)} within 0.1 GiB of 'Model loading took'{middle}; errors "
          + ", ".join(f"{r.entry['id']} {x:+.2f}" for r, x in zip(text_only, errs)))
    outliers = [r for r in rows if not r.error and r.predicted["kv_cache_tokens"] is not None
                and r.printed.get("kv_cache_tokens")
                and abs(rel(r.predicted["kv_cache_tokens"], r.printed["kv_cache_tokens"])) > WITHIN]
    for r in outliers:
        unmodelled = f"; not modelled: {r.entry['unmodelled']}" if r.entry.get("unmodelled") else ""
        print(f"  outlier {r.entry['id']}: tokens {pct(rel(r.predicted['kv_cache_tokens'], r.printed['kv_cache_tokens']))}"
              f"; {cause(r)}{unmodelled}")
    for r in rows:  # the tokens agree but not the concurrency: the blocks one request takes differ
        if r.error or r.predicted["max_concurrency"] is None or not r.printed.get("max_concurrency") or r in outliers:
            continue
        err = rel(r.predicted["max_concurrency"], r.printed["max_concurrency"])
        if abs(err) > WITHIN:
            print(f"  outlier {r.entry['id']}: max concurrency {pct(err)} with tokens "
                  f"{pct(rel(r.predicted['kv_cache_tokens'], r.printed.get('kv_cache_tokens')))}: the blocks one "
                  "request takes differ (its layout: sliding window, hybrid groups)")
    missing = [r for r in rows if r.error]
    if missing:
        print(f"  not sized ({len(missing)}):")
        for r in missing:
            print(f"    {r.entry['id']}: {r.error}")


def fit(rows: list[Row]) -> None:
    """What the fitting half implies. 'Other' memory = requested - weights - available, from printed figures (the
    weights predicted where the log prints none and the model is text-only and unquantized: there kvlab's are
    exact), less kvlab's non-torch and CUDA-graph estimates, is the activation vLLM measured. First the sampler's
    bytes per logit, from dense logs that name their sampler: least squares of (other - forward estimate) on the
    logits. Then each other family's scale on its forward estimate: least squares of (other - sampler) on it."""
    from kvlab.memory_profile import FIT

    print("\n== fit (logs of the fitting half only) ==")
    points = []
    for r in rows:
        if r.error or split_of(r.entry["id"]) != "fit" or r.printed.get("available_kv_gib") is None:
            continue
        q, p = r.printed, r.predicted
        weights = q.get("model_loading_gib")
        if weights is None and (p["multimodal"] or r.entry.get("quantization")):
            continue
        weights = p["weights_gib"] if weights is None else weights
        measured = p["requested_gib"] - weights - q["available_kv_gib"] - p["non_torch_gib"] - p["cuda_graph_gib"]
        if p.get("model_runner") == "v2":  # no top-k/top-p in its profiling: its sampler is counted, not fitted
            print(f"  {r.entry['id']:<46} {p['family']:<10} Model Runner V2 (sampler counted, not fitted)  "
                  f"activation measured {measured:5.2f} GiB; estimate {p['activation_gib']:.2f}")
            continue
        sampler = p["sampler"] + ("" if p["sampler_named"] else " (default)")
        per_logit = FIT.sampler_bytes_per_logit[p["sampler"]]
        logits_gib = p["logits"] / GIB
        scale = FIT.activation_scale.get(p["family"], 1.0)
        forward = (p["activation_gib"] - per_logit * logits_gib) / scale
        points.append((r.entry["id"], p["family"], p["sampler"], measured, forward, logits_gib))
        print(f"  {r.entry['id']:<46} {p['family']:<10} sampler {sampler:<20} activation measured {measured:5.2f} "
              f"GiB; estimate: forward {forward:.2f} + {p['logits'] / 1e6:.1f} M logits")
    fitted = dict(FIT.sampler_bytes_per_logit)
    named = {r.entry["id"] for r in rows if not r.error and r.predicted["sampler_named"]}
    for impl in ("flashinfer", "pytorch"):
        chosen = [pt for pt in points if pt[1] == "dense" and pt[2] == impl and pt[0] in named]
        if chosen:
            value = sum((m - f) * n for _, _, _, m, f, n in chosen) / sum(n * n for *_, n in chosen)
            fitted[impl] = value
            print(f"  sampler_bytes_per_logit[{impl!r}] = {value:.1f}  (on {len(chosen)} dense log"
                  f"{'s' if len(chosen) > 1 else ''}: {', '.join(pt[0] for pt in chosen)})")
    for family in ("moe", "hybrid", "int4"):
        chosen = [pt for pt in points if pt[1] == family]
        if chosen:
            rest = [(m - fitted[impl] * n, f) for _, _, impl, m, f, n in chosen]
            value = sum(x * f for x, f in rest) / sum(f * f for _, f in rest)
            print(f"  activation_scale[{family!r}] = {value:.2f}  (on {len(chosen)} log"
                  f"{'s' if len(chosen) > 1 else ''}: {', '.join(pt[0] for pt in chosen)})")


def graph_estimates(rows: list[Row]) -> None:
    """vLLM's own CUDA-graph estimate on every log that prints it ('Estimated CUDA graph memory: C GiB total', or the
    share of the card its '--gpu-memory-utilization=U is equivalent to ... =E' line gives, times the total), over the
    graphs it profiled ('Profiling CUDA graph memory: PIECEWISE=P, FULL=F', else kvlab's count for the log's
    max_num_seqs), per graph and per graph and layer: whether one rule fits them all. vLLM measures its estimate
    (gpu_model_runner.profile_cudagraph_memory: per mode, the first capture + (graphs - 1) x the second's), so kvlab
    can only carry a rate those logs agree on."""
    from kvlab.catalog import get_gpu
    from kvlab.memory_profile import FIT, capture_sizes

    print("\n== vLLM's CUDA-graph estimate, on every log that prints it ==")
    rates = []
    for r in rows:
        q, e = r.reader, r.entry
        gib, share = q.get("estimated_cuda_graph_gib"), q.get("estimated_cuda_graph_share")
        if gib is None and share is None:
            continue
        total = printed_total_gib(e) or (get_gpu(e["gpu_kvlab"]).memory_gib if e.get("gpu_kvlab") else None)
        source = "printed" if gib is not None else f"{share:g} of {total:.2f} GiB (the utilization line)"
        gib = gib if gib is not None else share * total if total else None
        graphs, counted = q.get("cuda_graphs_profiled"), "printed"
        seqs = e.get("max_num_seqs")
        if graphs is None and seqs:
            graphs = len(capture_sizes(min(2 * seqs, 512))) + len(capture_sizes(min(seqs, 512)))
            counted = f"kvlab's count at max_num_seqs {seqs}"
        if gib is None or not graphs:
            continue
        model, _ = find_model(e)
        layers = model.num_hidden_layers if model is not None else None
        per_graph = gib * 1024 / graphs
        rates.append(per_graph)
        per_layer = f"{per_graph / layers:.3f} MiB per graph and layer ({layers} layers)" if layers else "layers: -"
        print(f"  {e['id']:<46} vLLM {e.get('vllm_version')}: {gib:.3f} GiB ({source}) / {graphs} graphs ({counted}) "
              f"= {per_graph:.2f} MiB per graph; {per_layer}")
    if rates:
        print(f"  per graph: {min(rates):.2f} to {max(rates):.2f} MiB on {len(rates)} logs ({max(rates) / min(rates):.1f}x);"
              f" kvlab's flat rate {FIT.cuda_graph_mib_per_graph:g} MiB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="also print what the fitting half implies")
    parser.add_argument("--corpus", type=Path, default=CORPUS / "index.json")
    parser.add_argument("--write", action="store_true", help=f"store the KV-token accuracy in {ACCURACY.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    if not args.corpus.is_file():
        print(f"no corpus at {args.corpus}: the startup-log corpus (tests/data/startup_logs/index.json) is not here",
              file=sys.stderr)
        return 2
    entries = json.loads(args.corpus.read_text(encoding="utf-8"))
    for entry in entries:
        entry["_folder"] = args.corpus.parent
    rows = []
    for entry in entries:
        row = predict(entry)
        row.reader = read_log(entry)
        print_row(row)
        rows.append(row)
    summary(rows)
    if args.write:
        ACCURACY.write_text(json.dumps(kv_token_accuracy(rows), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {ACCURACY.relative_to(ROOT)}")
    if args.fit:
        fit(rows)
        graph_estimates(rows)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())

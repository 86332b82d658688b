"""The lesson's explanation of a vLLM startup log, and kvlab's own sizing beside vLLM's.

``explain_vllm_log(log, model)`` says what the figures mean (tokens -> blocks of block_size tokens ->
conversations at the full length), and where the model is known puts kvlab's own sizing (kvlab.sizing, the
arithmetic of ``kvlab size``) beside vLLM's, flagging any difference beyond what the log's rounding allows.
"""

from __future__ import annotations

import re
from dataclasses import replace

from kvlab.errors import KvlabError
from kvlab.vllm.log.startup import GIB, StartupLog, blocks_from_tokens, cdiv
from kvlab.vllm_rules import rules_for, version_key

# vLLM prints GiB rounded to 2 decimals (format_gib: round(x, 2); V0: "%.2f"): the true figure is within this.
GIB_ROUNDING = 0.005
DEFAULT_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE

# --- the explanation --------------------------------------------------------------------------------------

def _gib(x: float) -> str:
    return f"{x:,.2f} GiB"


def _memory_line(log: StartupLog, tokens: int | None, blocks: int | None, block_size: int,
                 sized=None) -> str | None:
    if log.available_kv_cache_gib is None or log.refused:
        return None
    per_gpu = " per GPU" if (log.settings.get("tensor_parallel_size") or 1) > 1 else ""
    left = (f"after the model weights ({_gib(log.model_weights_gib)})" if log.model_weights_gib is not None
            else "after the model weights")
    text = (f"Available KV cache memory, {_gib(log.available_kv_cache_gib)}{per_gpu}: what vLLM had left for "
            f"the KV cache {left}, the activations of a profiling run and other memory")
    if log.device == "CPU":
        text = (f"KV cache memory, {_gib(log.available_kv_cache_gib)}: on a CPU vLLM takes it from "
                "--kv-cache-memory-bytes (or VLLM_CPU_KVCACHE_SPACE), else from what is left of the memory it "
                "requested")
    if sized is not None and any(g.spec.kind == "mamba" for g in sized.kv_cache_groups):
        return text + "."  # (a hybrid's blocks hold states as well as tokens: no bytes per token to speak of)
    if tokens:
        # (each KV cache group holds every token in blocks of its own: a token takes a slot in each group)
        groups = len(sized.kv_cache_groups) if sized is not None else 1
        slots = blocks // groups * block_size if blocks else tokens
        per_token = log.available_kv_bytes / slots
        text += (f"; at {per_token:,.0f} bytes of keys and values per token" if per_token == int(per_token)
                 else f"; at about {per_token / 1024:,.1f} KiB of keys and values per token")
        text += f" it holds {slots:,} tokens"
    return text + "."


def _profile_line(log: StartupLog) -> str | None:
    """vLLM's own memory profile, where the log prints its terms (the 'Actual usage' or memory-split lines)."""
    terms = [(label, value) for label, value in (
        ("weights", log.model_weights_gib if log.weights_and_non_torch_gib is None else None),
        ("weights and non-torch memory", log.weights_and_non_torch_gib),
        ("the peak activation of its profiling run", log.activation_gib),
        ("non-torch memory", log.non_torch_gib), ("CUDA graphs", log.cuda_graph_gib)) if value is not None]
    if log.activation_gib is None or len(terms) < 2 or log.refused:
        return None
    requested = ""
    if log.requested_memory_gib is not None:
        requested = f" of the {_gib(log.requested_memory_gib)} it requested"
        if log.total_gpu_memory_gib is not None and log.gpu_memory_utilization is not None:
            requested += f" ({log.gpu_memory_utilization:g} x {_gib(log.total_gpu_memory_gib)})"
    text = f"vLLM's memory profile{requested}: " + ", ".join(f"{label} {_gib(v)}" for label, v in terms)
    before = _in_use_before_start(log)
    if before:
        text += (f"; {_gib(before)} was in use on the device at its startup snapshot ({_gib(log.total_gpu_memory_gib)} "
                 f"total - {_gib(log.free_on_startup_gib)} free: its own CUDA context and any other process's memory)")
        if log.weights_and_non_torch_gib is not None:
            text += (", which its 'consumed memory' (total - free after loading) includes; kvlab size cannot know "
                     "other processes' memory and assumes none")
    return text + " (kvlab size estimates each of these: docs/sizing.md)."


def _in_use_before_start(log: StartupLog) -> float | None:
    """Memory in use on the device at vLLM's startup snapshot (gpu_worker.init_device, after its CUDA context was
    created): total - free on startup, as the log prints them."""
    if log.total_gpu_memory_gib is None or log.free_on_startup_gib is None:
        return None
    return round(log.total_gpu_memory_gib - log.free_on_startup_gib, 2) or None


def _lesson_lines(log: StartupLog, block_size: int, assumed: bool, sized=None) -> list[str]:
    """Tokens -> blocks of block_size tokens -> conversations at the full length, in the log's own figures.
    ``sized``: kvlab.sizing's figures for the log's model and settings (the arithmetic of `kvlab size`), where the
    model is known: a model of several KV cache groups is explained with its groups (_grouped_lines)."""
    out = []
    tokens, blocks, length, device = log.kv_cache_tokens, log.num_gpu_blocks, log.max_model_len, log.device
    grouped = sized is not None and len(sized.kv_cache_groups) > 1
    if grouped:
        block_size = sized.block_size
    if blocks is None and tokens and length and log.format == "v1":
        blocks = (_blocks_for_tokens(sized, tokens, length, log.max_concurrency) if grouped
                  else blocks_from_tokens(tokens, block_size, length))
    memory = _memory_line(log, tokens, blocks, block_size, sized if grouped else None)
    if memory:
        out.append(memory)
    profile = _profile_line(log)
    if profile:
        out.append(profile)
    if log.encoder_profile_items is not None:
        items = f"{log.encoder_profile_items} {log.encoder_profile_modality} item" + (
            "s" if log.encoder_profile_items != 1 else "")
        out.append(f"Before the text model's profiling run vLLM ran the multimodal encoder over {items} of the "
                   f"largest size, with an encoder cache budget of {log.encoder_budget_tokens:,} tokens; that run's "
                   "peak, or its outputs held through the text run, is part of the peak activation.")
    bs_note = f" (block_size {block_size} assumed: the log does not say; it is vLLM's default)" if assumed else ""
    if grouped and block_size != (log.block_size or DEFAULT_BLOCK_SIZE):
        bs_note = (f" (the attention block kvlab size counts for {sized.model_id}: vLLM grows a hybrid's attention "
                   "block until its page holds a request's state)")
    if grouped and tokens and blocks and length and not log.refused:
        return out + _grouped_lines(log, sized, blocks, bs_note) + _refusal_lines(log, block_size, bs_note)
    if tokens and blocks:
        if log.derived.get("kv_cache_tokens"):
            out.append(f"{device} KV cache: {blocks:,} blocks of {block_size} tokens{bs_note} = {tokens:,} tokens "
                       "(the keys and values of that many tokens fit at once).")
        elif tokens == blocks * block_size or not length:
            out.append(f"{device} KV cache size, {tokens:,} tokens: the keys and values of {tokens:,} tokens fit at "
                       f"once. vLLM hands them out in blocks of {block_size} tokens{bs_note}: {tokens:,} / "
                       f"{block_size} = {blocks:,} blocks.")
        else:
            out.append(f"{device} KV cache size, {tokens:,} tokens: vLLM counts conversations at full length x "
                       f"their length ({tokens / length:,.2f} x {length:,}); the cache itself is {blocks:,} blocks "
                       f"of {block_size} tokens{bs_note} = {blocks * block_size:,} token slots, and a "
                       f"{length:,}-token conversation fills {cdiv(length, block_size):,} whole blocks.")
    elif tokens:
        out.append(_tokens_only_line(log, tokens, block_size, bs_note))
    if length and blocks and not log.refused:
        per_request = cdiv(length, block_size)
        fit = blocks / per_request
        text = (f"One conversation at the full length, max_model_len {length:,} tokens, takes {length:,} / "
                f"{block_size} = {per_request:,} blocks{'' if length % block_size == 0 else ' (rounded up)'}, so "
                f"{blocks:,} / {per_request:,} = {fit:,.2f} such conversations fit at once")
        plain = log.max_concurrency is None or round(fit, 2) == log.max_concurrency
        if plain:
            text += (f": that is vLLM's 'Maximum concurrency ... {log.max_concurrency:.2f}x'."
                     if log.max_concurrency is not None else ".")
        else:
            text += (f"; vLLM says {log.max_concurrency:.2f}x: this model's layers are not all full attention "
                     "(sliding windows, or several KV cache groups), and vLLM counts a conversation's blocks per "
                     "group, so how many shorter conversations fit needs the model's layers: give --model (a "
                     "catalogue name or its config.json) for kvlab size's count.")
        out.append(text)
        if plain and fit >= 1 and length >= 4 * block_size:
            short = max(block_size, length // 8)
            out.append(f"Shorter conversations take fewer blocks: at {short:,} tokens ({cdiv(short, block_size):,} "
                       f"blocks) each, {(blocks - 1) // cdiv(short, block_size):,} fit at once (one block is "
                       "vLLM's null block, as kvlab size counts it)" + (
                           f", if every layer is full attention in blocks of {block_size}, which the log does not say "
                           "(a hybrid model's groups count otherwise: give --model for kvlab size's count)."
                           if assumed and not grouped else "."))
    elif length and log.max_concurrency is not None and not log.refused:
        out.append(f"{log.max_concurrency:.2f} conversations at the full length of {length:,} tokens fit at once "
                   "(vLLM's 'Maximum concurrency').")
    out += _refusal_lines(log, block_size, bs_note)
    return out


KIND_WORDS = {"full_attention": "full-attention", "sliding_attention": "sliding-window", "mla": "MLA",
              "mamba": "state (linear attention or Mamba)"}


def _groups_words(sized) -> str:
    """A model's KV cache groups in words: '2 KV cache groups: 1 sliding-window of 18 layers, 1 full-attention of
    18 layers'."""
    kinds: dict[str, list[int]] = {}
    for group in sized.kv_cache_groups:
        kinds.setdefault(group.spec.kind, []).append(len(group.layers))
    parts = [f"{len(sizes)} {KIND_WORDS.get(kind, kind)} of {'up to ' if len(set(sizes)) > 1 else ''}{max(sizes)} "
             f"layers" for kind, sizes in kinds.items()]
    return f"{len(sized.kv_cache_groups)} KV cache groups ({', '.join(parts)})"


def _request_blocks(sized, num_tokens: int) -> tuple[int, str]:
    """Blocks one request of ``num_tokens`` takes (kvlab.sizing.blocks_per_request, `kvlab size`'s count: the sum
    over the groups), and the sum in words."""
    from kvlab.sizing import blocks_per_request

    in_flight, dcp = sized.max_in_flight_tokens, sized.decode_context_parallel_size
    kinds: dict[str, list[int]] = {}
    for group in sized.kv_cache_groups:
        kinds.setdefault(group.spec.kind, []).append(
            group.spec.max_num_blocks_per_request(cdiv(num_tokens, dcp), in_flight))
    words = " + ".join(f"{KIND_WORDS.get(kind, kind)} {len(counts)} x {counts[0]:,}" if len(counts) > 1 else
                       f"{KIND_WORDS.get(kind, kind)} {counts[0]:,}" for kind, counts in kinds.items())
    return blocks_per_request(sized.kv_cache_groups, num_tokens, in_flight, dcp), words


def _blocks_for_tokens(sized, tokens: int, length: int, concurrency: float | None) -> int | None:
    """The block count behind the printed tokens of a model of several KV cache groups: the one whose tokens, as the
    log's vLLM prints them (kvlab.sizing.printed_kv_tokens), are the log's (and its concurrency, where printed)."""
    from kvlab.sizing import printed_kv_tokens

    rules = rules_for(sized.vllm_version)
    groups, dcp = sized.kv_cache_groups, sized.decode_context_parallel_size
    per_request, _ = _request_blocks(sized, length)
    guess = round(tokens * per_request / length)
    if rules.tokens_line == "blocks":
        guess = tokens // (min(g.spec.block_size for g in groups) * dcp) * len(groups)
    fits = [b for b in range(max(1, guess - 2), guess + len(groups) + 2)
            if printed_kv_tokens(rules, b, groups, per_request, length, dcp) == tokens
            and (concurrency is None or round(b / per_request, 2) == concurrency)]
    return fits[0] if fits else None


def _grouped_lines(log: StartupLog, sized, blocks: int, bs_note: str) -> list[str]:
    """The lesson for a model of several KV cache groups (sliding-window beside full attention, a hybrid's state
    groups), with `kvlab size`'s arithmetic: every group takes its own blocks of one pool, so a conversation's blocks
    are the sum over the groups (kvlab.sizing.blocks_per_request), and the tokens vLLM prints count them so."""
    tokens, length, block_size, model = log.kv_cache_tokens, log.max_model_len, sized.block_size, sized.model_id
    groups = len(sized.kv_cache_groups)
    if rules_for(sized.vllm_version).tokens_line == "blocks":
        out = [f"{log.device} KV cache size, {tokens:,} tokens: the cache is {blocks:,} blocks of {block_size:,} "
               f"tokens{bs_note}, shared by {model}'s {_groups_words(sized)}; each group keeps every token in "
               f"blocks of its own, so this vLLM prints {blocks:,} // {groups} groups x {block_size} = "
               f"{blocks // groups * block_size:,} tokens."]
    else:
        out = [f"{log.device} KV cache size, {tokens:,} tokens: vLLM counts conversations at full length x their "
               f"length ({tokens / length:,.2f} x {length:,}); the cache itself is {blocks:,} blocks of {block_size:,} "
               f"tokens{bs_note}, shared by {model}'s {_groups_words(sized)}."]
    per_request, words = _request_blocks(sized, length)
    fit = blocks / per_request
    text = (f"One conversation at the full length, max_model_len {length:,} tokens, takes {per_request:,} blocks "
            f"({words}: each group takes blocks of its own, summed as kvlab size counts them), so {blocks:,} / "
            f"{per_request:,} = {fit:,.2f} such conversations fit at once")
    if log.max_concurrency is None or round(fit, 2) == log.max_concurrency:
        text += (f": that is vLLM's 'Maximum concurrency ... {log.max_concurrency:.2f}x'."
                 if log.max_concurrency is not None else ".")
    else:
        text += (f"; vLLM says {log.max_concurrency:.2f}x: the log's model or settings are not the ones kvlab "
                 "assumed (give --model with its config.json).")
    out.append(text)
    short = max(block_size, length // 8)
    if fit >= 1 and length >= 4 * block_size:
        per_short, words = _request_blocks(sized, short)
        aligned = sized.mamba_cache_mode == "align"
        out.append(f"Shorter conversations take fewer blocks: at {short:,} tokens ({per_short:,} blocks: {words}) "
                   f"each, {(blocks - 1) // per_short:,} fit at once (one block is vLLM's null block), as " + (
                       "kvlab's sizing counts them with the log's prefix caching on (its 'align' mode: one more state "
                       "block a request, two for a Mamba2 mixer from 0.32.0, which `kvlab size` counts with "
                       "--enable-prefix-caching, and by default from vLLM 0.28.0)."
                       if aligned else f"`kvlab size --context-len {short}` counts them."))
    return out


def _tokens_only_line(log: StartupLog, tokens: int, block_size: int, bs_note: str) -> str:
    """The token figure in blocks, in whole numbers, where the log gives no block count: up to 0.20 vLLM printed
    num_blocks // KV cache groups x block_size (kv_cache_utils._report_kv_cache_config), a whole number of blocks;
    from 0.21 int(max concurrency x max_model_len) (get_kv_cache_capacity), which need not be."""
    head = f"{log.device} KV cache size, {tokens:,} tokens: in blocks of {block_size} tokens{bs_note}, "
    if tokens % block_size == 0:
        return head + (f"{tokens:,} / {block_size} = {tokens // block_size:,} blocks (per KV cache group: a model "
                       "with several groups has that many blocks for each).")
    whole, over = divmod(tokens, block_size)
    dividing = [str(bs) for bs in (8, 16, 32, 64, 128, 256) if tokens % bs == 0]
    would = (f"block size {' or '.join(dividing)} would divide it" if dividing
             else "no block size from 8 to 256 divides it")
    since_0_21 = log.vllm_version is not None and version_key(log.vllm_version) >= (0, 21, 0)
    why = ("vLLM from 0.21 prints int(maximum concurrency x max_model_len), which need not be a whole number of "
           "blocks; the concurrency line with its length gives the block count" if since_0_21 else
           "vLLM up to 0.20 prints num_blocks // KV cache groups x block_size, a whole number of blocks, so either "
           f"the block size is not {block_size} ({would}) or the log is from vLLM 0.21 on, which prints "
           "int(maximum concurrency x max_model_len); the concurrency line with its length gives the block count")
    return head + (f"{tokens:,} does not divide by {block_size}: {whole:,} whole blocks and {over} tokens over. "
                   f"{why}.")


def _refusal_lines(log: StartupLog, block_size: int, bs_note: str) -> list[str]:
    if not log.refused:
        return []
    length = log.max_model_len
    if log.no_kv_memory:
        return [("vLLM refused to start: nothing was left for the KV cache after the weights and activations. "
                 "Give it more memory (--gpu-memory-utilization, --tensor-parallel-size) or a smaller model.")]
    need = (f"{length:,} / {block_size} = {cdiv(length, block_size):,} blocks of {block_size} tokens{bs_note}"
            if length else "its blocks")
    if log.needed_kv_cache_gib is not None:
        need += f", {_gib(log.needed_kv_cache_gib)}"
    have = []
    if log.kv_cache_tokens:
        have.append(f"{log.kv_cache_tokens:,} tokens")
    if log.available_kv_cache_gib is not None:
        have.append(_gib(log.available_kv_cache_gib))
    longest = log.estimated_max_model_len or log.kv_cache_tokens
    fix = f"--max-model-len {longest} or less" if longest else "a smaller --max-model-len"
    if not longest and length and log.needed_kv_cache_gib and log.available_kv_cache_gib:
        # The KV cache a request needs grows in proportion to its length (full attention).
        about = int(length * log.available_kv_cache_gib / log.needed_kv_cache_gib) // block_size * block_size
        fix = (f"--max-model-len of about {about:,} or less ({log.available_kv_cache_gib:.2f} / "
               f"{log.needed_kv_cache_gib:.2f} of {length:,}, for full attention)")
    return [(f"vLLM refused to start: one conversation at the full length of {length:,} tokens needs {need} of KV "
             f"cache, and only {' = '.join(have) or 'less'} fit. Fix: {fix}, or more memory for the cache "
             "(--gpu-memory-utilization, --tensor-parallel-size, --kv-cache-dtype fp8).")]


def _failed_lines(log: StartupLog) -> list[str]:
    """The engine's own word that it did not start, where no refusal kvlab reads says why (a refusal explains
    itself: _refusal_lines); trial 55 read a failed start as a served one."""
    if not log.failed_start or log.refused:
        return []
    line = log.lines.get("failed_start", "")
    return [f"vLLM did not start: the log says {line.strip()!r}. The figures here are from the start that failed; the "
            "cause is in the traceback vLLM prints with that line (its last line names the exception). One common "
            "cause is a KV cache too small for one request at max_model_len: `kvlab size` with the same settings "
            "says whether vLLM would refuse."]


def _failed_start_verdict(log: StartupLog, spec, side: dict) -> str:
    """kvlab's arithmetic on a start that failed: whether one request at max_model_len fits the log's KV cache
    memory (the refusal vLLM raises before it says it failed to start), as `kvlab size` says it."""
    length = side["max_model_len"]
    whose = "" if log.max_model_len else " (the model's default: the log does not say)"
    if not side["refused"]:
        return (f"kvlab's own arithmetic for {spec.id}: one request at max_model_len {length:,}{whose} fits the "
                f"log's KV cache memory, so the failure has another cause (the traceback's last line names it).")
    need = side.get("needed_kv_cache_gib")
    longest = side.get("estimated_max_model_len")
    needs = f"needs {need:.2f} GiB of KV cache, more than" if need is not None else "does not fit"
    fix = (f"--max-model-len {longest} or less, the longest that fits as `kvlab size` counts it "
           f"{_rules_words(log, side)};" if longest else "a smaller --max-model-len,")
    return (f"kvlab's own arithmetic for {spec.id}: one request at max_model_len {length:,}{whose} {needs} the "
            f"{_gib(log.available_kv_cache_gib) if log.available_kv_cache_gib is not None else 'memory'} available, "
            f"so vLLM would refuse this start: the likely cause of the failure. Fix: {fix} or more memory for the "
            "cache (--gpu-memory-utilization, --tensor-parallel-size, --kv-cache-dtype fp8).")


def _rules_words(log: StartupLog, side: dict) -> str:
    """'under vLLM 0.11.0's rules (the log's) and max_num_batched_tokens 1,024 (the log's)': what kvlab sized with,
    and where each came from (trial 62, finding 4: the newest rules and 2,048 tokens were assumed unsaid); where the
    log does not give one, the `kvlab size` command that sizes with the server's own."""
    version, batched = side["vllm_version"], side["max_num_batched_tokens"]
    words = (f"under vLLM {version}'s rules ({side['vllm_version_source']}) and max_num_batched_tokens {batched:,} "
             f"({side['max_num_batched_tokens_source']})")
    if side["vllm_version_source"] == side["max_num_batched_tokens_source"] == "the log's":
        return words
    gib = f"{log.available_kv_cache_gib:g}" if log.available_kv_cache_gib is not None else "GIB"
    return (words + f"; with the server's own, `kvlab size {side['model']} --available-kv-gib {gib} --vllm-version V "
            "--max-num-batched-tokens N`")


def _worker_lines(log: StartupLog) -> list[str]:
    if log.refused:
        return []  # a refusal is printed twice (the log line and the exception): nothing to say about workers
    names = {"available_kv_cache_gib": "available KV cache memory", "kv_cache_tokens": "KV cache size",
             "num_gpu_blocks": "blocks", "model_weights_gib": "model weights"}
    same: dict[tuple[int, int], list[str]] = {}  # (times, workers) -> labels
    out = []
    for figure, label in names.items():
        entries = log.per_worker.get(figure, [])
        values = [e["value"] for e in entries]
        workers = {e["worker"] for e in entries if e["worker"]}
        if len(values) < 2:
            continue
        if len(set(values)) == 1:
            same.setdefault((len(values), len(workers)), []).append(label)
        elif len(workers) > 1 and figure == "available_kv_cache_gib" and _stage_budgets_gib(log) is not None:
            out.append(f"The {label} differs between workers ({', '.join(f'{v:,}' for v in values)}): each "
                       "pipeline stage holds its own layers, and vLLM keeps the fewest blocks any worker's memory "
                       "gives for its stage's layers; the first is shown.")
        elif len(workers) > 1:
            out.append(f"The {label} differs between workers ({', '.join(f'{v:,}' for v in values)}): vLLM sizes "
                       "the cache by the smallest; the first is shown.")
    for (times, num_workers), labels in same.items():
        who = f", by {num_workers} workers," if num_workers > 1 else ""
        what = labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} and {labels[-1]}"
        out.insert(0, f"The {what} line{'s' if len(labels) > 1 else ''} appear{'' if len(labels) > 1 else 's'} "
                      f"{times} times{who} with the same figure: vLLM prints {'them' if len(labels) > 1 else 'it'} "
                      "once per worker (or once per worker's KV cache config).")
    return out


# --- kvlab's own calculation beside vLLM's ---------------------------------------------------------------

# How a reader tells kvlab which model a log is about: with --model on the command line, or with the lab page's own
# menu (the page shows the same explanation: ``explain_vllm_log(..., audience="page")``).
HOW_TO_NAME_THE_MODEL = {
    "cli": {"name": "give --model NAME or a config.json",
            "name_or_hf": "give --model NAME, a config.json, or a Hugging Face id",
            "with_config": "give --model with its config.json",
            "or_arguments": "give --model, or the arguments the server ran with"},
    "page": {"name": "pick it under \u201cthe model it served\u201d",
             "name_or_hf": "pick it under \u201cthe model it served\u201d, if the catalogue has it",
             "with_config": "pick the model it served",
             "or_arguments": "pick the model it served, and check the arguments the server ran with"},
}

def resolve_model(log: StartupLog, model: str | None, audience: str = "cli"):
    """(ModelSpec or None, where it came from or why there is none). ``model``: --model, a catalogue name,
    config.json or Hugging Face id; otherwise the model the log names, if it is in the catalogue or a local
    config.json (never fetched: a pasted log must not send kvlab online)."""
    from kvlab.catalog import get_model
    from kvlab.catalog.config import load_config_path, looks_like_path
    from kvlab.catalog.models import find_catalogue_model

    if model is not None:
        return get_model(model), f"--model {model}"
    name = log.model
    if not name:
        return None, f"the log does not name the model ({HOW_TO_NAME_THE_MODEL[audience]['name']})"
    if looks_like_path(name):
        try:
            return load_config_path(name), f"the config.json in {name}, which the log names"
        except KvlabError:
            pass
    parts = name.rstrip("/").split("/")
    for candidate in (name, "/".join(parts[-2:]), parts[-1]):
        spec = find_catalogue_model(candidate)
        if spec is not None:
            how = "" if candidate == spec.id else f" (the catalogue's name for {name})"
            return spec, f"{spec.id}{how}"
    return None, (f"{name!r}, which the log names, is not in kvlab's catalogue "
                  f"({HOW_TO_NAME_THE_MODEL[audience]['name_or_hf']})")


def _another_model_named(log: StartupLog, spec, audience: str) -> str | None:
    """The catalogue's (or config.json's) id of the model the log names, where that is a model other than ``spec``
    (the one asked for); None where they are the same or the log's model is not known to kvlab (no guess)."""
    if not log.model:
        return None
    named, _ = resolve_model(log, None, audience)
    return named.id if named is not None and named.id != spec.id else None


def own_default_length(log: StartupLog) -> StartupLog:
    """``log`` for another model than the one it names: where its user did not type --max-model-len (its 'non-default
    args' line lacks it), the length it ran at was its model's default, and another model runs at its own (None: the
    sizing takes the model's); a length typed, or no arguments line to tell, stays the log's."""
    if log.typed_args is None or "max_model_len" in log.typed_args or log.max_model_len is None:
        return log
    return replace(log, max_model_len=None)


def _log_drafter(log: StartupLog, spec) -> dict:
    """The log's speculative config (its arguments' speculative_config) as kvlab.sizing takes it, for the methods
    kvlab sizes (an MTP drafter's layers take KV cache; a hybrid's state blocks count the draft tokens); its draft
    tokens, where not given, by `kvlab run`'s rule (config.options.draft_tokens_per_step)."""
    from kvlab.config.options import draft_tokens_per_step
    from kvlab.sizing import SPECULATIVE_METHODS

    given = log.settings.get("speculative_config")
    method = given.get("method") if isinstance(given, dict) else None
    if method not in SPECULATIVE_METHODS or spec is None:
        return {}
    tokens = given.get("num_speculative_tokens")
    tokens = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else None
    return {"speculative_method": method, "num_speculative_tokens": draft_tokens_per_step(
        method, tokens, spec.num_nextn_predict_layers, " or ".join(SPECULATIVE_METHODS))}


def _sizing_config(log: StartupLog, available_kv_bytes: int, spec=None):
    from kvlab.sizing import KV_CACHE_DTYPES, MODEL_DTYPES, SizingConfig

    s = log.settings
    dtype = s.get("dtype") if s.get("dtype") in MODEL_DTYPES else "auto"
    kv_dtype = s.get("kv_cache_dtype") if s.get("kv_cache_dtype") in KV_CACHE_DTYPES else "auto"
    prefix = s.get("enable_prefix_caching")
    return SizingConfig(
        available_kv_bytes=max(1, available_kv_bytes), block_size=log.block_size or DEFAULT_BLOCK_SIZE,
        max_model_len=log.max_model_len, dtype=dtype, kv_cache_dtype=kv_dtype,
        tensor_parallel_size=s.get("tensor_parallel_size") or 1, pipeline_parallel_size=s.get("pipeline_parallel_size")
        or 1, max_num_batched_tokens=s.get("max_num_batched_tokens"), max_num_seqs=s.get("max_num_seqs"),
        vllm_version=_known_version(log), enable_prefix_caching=prefix if isinstance(prefix, bool) else None,
        **_log_drafter(log, spec),
    )


def _known_version(log: StartupLog) -> str | None:
    """The log's vLLM release where kvlab knows its rules (how it prints the tokens and counts a sliding window's
    blocks differ by release: trial 53), else None: the newest rules, as before."""
    try:
        rules_for(log.vllm_version)
    except KvlabError:
        return None
    return log.vllm_version


def _rules_applied(log: StartupLog, result) -> dict:
    """The vLLM release whose rules kvlab sized by and the token budget per step it sized with (a sliding window's
    blocks per request depend on both), each with where it came from."""
    from kvlab.vllm_rules import resolve_version

    known = _known_version(log)
    if known is not None:
        version_source = "the log's"
    elif log.vllm_version:
        version_source = f"the newest kvlab knows: the log's {log.vllm_version} is not one it knows"
    else:
        version_source = "the newest kvlab knows: the log does not print its version"
    given = log.settings.get("max_num_batched_tokens")
    return {"vllm_version": resolve_version(known), "vllm_version_source": version_source,
            "max_num_batched_tokens": result.max_num_batched_tokens,
            "max_num_batched_tokens_source": "the log's" if given else
            "vLLM's default below 70 GiB of GPU memory: the log does not print it, and a sliding window's blocks grow "
            "with it"}


def _budget(log: StartupLog, bytes_per_block: int) -> tuple[int, int, int, str] | None:
    """(low, middle, high) KV cache bytes per GPU consistent with the log, and what they come from."""
    override = log.settings.get("num_gpu_blocks_override")
    if isinstance(override, int) and override > 0:
        exact = override * bytes_per_block
        return exact, exact, exact, f"num_gpu_blocks_override={override} x {bytes_per_block:,} B per block"
    exact = log.settings.get("kv_cache_memory_bytes")
    if isinstance(exact, int) and exact > 0:
        return exact, exact, exact, f"kv_cache_memory_bytes={exact:,} in the arguments"
    gib = log.available_kv_cache_gib
    if gib is not None and gib > 0:
        low, high = max(1, round((gib - GIB_ROUNDING) * GIB)), round((gib + GIB_ROUNDING) * GIB) - 1
        return low, round(gib * GIB), high, f"{gib} GiB as printed, rounded to 0.01 GiB"
    if log.num_gpu_blocks and "num_gpu_blocks" not in log.derived:
        exact = log.num_gpu_blocks * bytes_per_block
        return exact, exact, exact, f"the log's {log.num_gpu_blocks:,} blocks x {bytes_per_block:,} B per block"
    return None


def _figures(log: StartupLog, result) -> dict:
    """What vLLM would print for kvlab's block count: V1's formulas, or V0's (blocks x block_size)."""
    refusal = {"estimated_max_model_len": result.estimated_max_model_len,
               # max_memory_usage_bytes: the blocks of one max_model_len request, all layers
               "needed_kv_cache_gib": result.blocks_per_request * result.bytes_per_block / GIB}
    if log.format == "v0":
        tokens = result.num_blocks * result.block_size
        return {"num_gpu_blocks": result.num_blocks, "kv_cache_tokens": tokens,
                "max_concurrency": tokens / result.max_model_len, **refusal}
    return {"num_gpu_blocks": result.num_blocks, "kv_cache_tokens": result.num_tokens,
            "max_concurrency": result.max_concurrency, **refusal}


LABELS = {"num_gpu_blocks": "blocks", "kv_cache_tokens": "KV cache size (tokens)",
          "max_concurrency": "maximum concurrency", "estimated_max_model_len": "longest max_model_len that fits",
          "needed_kv_cache_gib": "KV cache one full-length conversation needs"}
TWO_DECIMALS = {"max_concurrency": "x", "needed_kv_cache_gib": " GiB"}  # as vLLM prints them


def format_figure(figure: str, value) -> str:
    if figure in TWO_DECIMALS:
        return f"{value:,.2f}{TWO_DECIMALS[figure]}"
    return f"{value:,}"


def _compare(figure: str, vllm, mid, low, high) -> tuple[str, str | None]:
    """('equal' | 'within rounding' | 'differs', the difference as a sentence)."""
    if figure in TWO_DECIMALS:
        same = round(mid, 2) == vllm
        inside = round(min(low, high), 2) <= vllm <= round(max(low, high), 2)
    else:
        same, inside = mid == vllm, min(low, high) <= vllm <= max(low, high)
    if same:
        return "equal", None
    if inside:
        return "within rounding", None
    spread = ("" if low == high else
              f" (the printed KV cache memory allows {format_figure(figure, low)}-{format_figure(figure, high)})")
    return "differs", f"{LABELS[figure]}: kvlab {format_figure(figure, mid)}, vLLM {format_figure(figure, vllm)}{spread}"


def _difference_hint(log: StartupLog, spec, side: dict, comparison: list[dict], audience: str = "cli") -> str:
    """Where a difference most likely comes from, for the reader to check."""
    status = {row["figure"]: row["status"] for row in comparison}
    if status.get("num_gpu_blocks") in ("equal", "within rounding") and log.max_concurrency:
        implied = log.num_gpu_blocks / log.max_concurrency
        sliding = (f" (kvlab's {spec.id} keeps a {spec.sliding_window:,}-token window in {spec.num_sliding_layers} "
                   "layers)" if spec.num_sliding_layers else "")
        return (f"the blocks agree, so it is the blocks one conversation needs: kvlab counts "
                f"{side['blocks_per_request']:,} blocks per conversation of {side['max_model_len']:,} tokens{sliding}, "
                f"vLLM's figures imply about {implied:,.0f}; the served checkpoint is probably not the one kvlab "
                f"assumed ({HOW_TO_NAME_THE_MODEL[audience]['with_config']})")
    return (f"check what kvlab assumed: {spec.id}, block_size {side['block_size']}, dtype {side['dtype']}, KV cache "
            f"dtype {side['kv_cache_dtype']}, tensor_parallel_size {side['tensor_parallel_size']} "
            f"({HOW_TO_NAME_THE_MODEL[audience]['or_arguments']})")


def _log_lines(log: StartupLog, result, figures: dict) -> list[str]:
    """The lines vLLM would have printed for kvlab's figures, in the log's own engine's format."""
    if log.format == "v0":
        return [f"# {log.kv_cache_device or 'GPU'} blocks: {figures['num_gpu_blocks']}",
                f"Maximum concurrency for {result.max_model_len} tokens per request: {figures['max_concurrency']:.2f}x"]
    device = log.kv_cache_device or "GPU"
    return [line.replace("GPU KV cache size", f"{device} KV cache size") for line in result.vllm_log_lines]


def _weights_and_room(log: StartupLog, spec) -> tuple[int, float] | None:
    """The asked model's weights per GPU (bytes, at the log's tensor/pipeline parallel sizes and in the log's
    format: an AWQ log's 70B is a quarter of its bf16 size) and the room, in GiB, the log's engine had for weights
    and KV cache together: its own weights plus the KV cache memory it printed. vLLM's budget is requested memory -
    weights - activations - other, so that sum is what the GPU had left once the activations and other memory were
    taken. None without both figures, or for a weight format kvlab does not model."""
    from kvlab.catalog.quant import requested_method
    from kvlab.sizing import size_kv_cache

    if log.model_weights_gib is None or log.available_kv_cache_gib is None:
        return None
    try:
        quantization = requested_method(log.settings.get("quantization"), "the log's quantization")
    except KvlabError:
        return None
    config = replace(_sizing_config(log, GIB, spec), quantization=quantization)
    return size_kv_cache(spec, config).weights_bytes, log.model_weights_gib + log.available_kv_cache_gib


def _weights_over_room(log: StartupLog, weights: int, room_gib: float) -> str:
    from kvlab.sizing import format_gib

    s = log.settings
    split = f"tensor_parallel_size {s.get('tensor_parallel_size') or 1}"
    if (s.get("pipeline_parallel_size") or 1) > 1:
        split += f", pipeline_parallel_size {s['pipeline_parallel_size']}"
    return (f"its weights take {format_gib(weights)} GiB per GPU ({split}), more than the {room_gib:.2f} GiB the "
            f"log's engine had for weights and KV cache together ({log.model_weights_gib} GiB of weights + "
            f"{log.available_kv_cache_gib} GiB of KV cache)")


def _check_weights_fit(log: StartupLog, spec) -> None:
    """Refuse a model asked for whose weights on one GPU exceed the room the log's engine had for weights and KV
    cache together (``_weights_and_room``): such a model loads nothing into the KV cache (or does not load).
    Generous: a larger model's activations are larger too. Without both figures, no check."""
    measured = _weights_and_room(log, spec)
    if measured is not None and measured[0] > (measured[1] + 2 * GIB_ROUNDING) * GIB:
        raise KvlabError(_weights_over_room(log, *measured))


def _no_room_verdict(log: StartupLog, spec) -> str:
    """kvlab's word on a log where vLLM refused because nothing was left for the KV cache (its KV cache memory
    printed negative): the asked model's weights against the room the engine had (trial 53: the model the log
    was started with was refused as if it were another)."""
    from kvlab.sizing import format_gib

    measured = _weights_and_room(log, spec)
    if measured is None:
        return (f"kvlab does not compare {spec.id} with this refusal: the log gives no weights and KV cache memory "
                "to compare with, or weights in a format kvlab does not size.")
    weights, room_gib = measured
    if abs(weights / GIB - log.model_weights_gib) > 0.05 * log.model_weights_gib:  # (first: trial 53b compared a
        # bf16 model's weights with an FP8 log's room and "agreed")
        return (f"kvlab's weights for {spec.id}, {format_gib(weights)} GiB per GPU, are not the "
                f"{log.model_weights_gib} GiB this log loaded: it ran another model, or the same in another format; "
                f"`kvlab size {spec.id}` answers from scratch whether vLLM starts with {spec.id}.")
    if weights > (room_gib + 2 * GIB_ROUNDING) * GIB:
        return f"kvlab agrees that nothing is left for the KV cache with {spec.id}: {_weights_over_room(log, *measured)}."
    return (f"kvlab's arithmetic differs: {spec.id}'s weights take {format_gib(weights)} GiB per GPU, within the "
            f"{room_gib:.2f} GiB the log's engine had for weights and KV cache together, so vLLM's refusal is not "
            "explained by the weights alone (its activation and other memory, which this log's figures include).")


def _check_starts(log: StartupLog, side: dict) -> None:
    """Refuse another model than the one the log names (``side``: kvlab's figures for it) where vLLM started but
    kvlab's arithmetic says the log's KV cache memory holds no request at the log's max_model_len: vLLM would refuse
    to start it. (For the log's own model, or an unnamed one, that is a difference to show, not a refusal.)"""
    if log.refused or not side.get("refused"):
        return
    whose = "the log's max_model_len" if log.max_model_len is not None else "the model's default max_model_len"
    raise KvlabError(f"one {side['max_model_len']:,}-token request ({whose}) needs "
                     f"{side['needed_kv_cache_gib']:.2f} GiB of KV cache, more than the log's "
                     f"{side['available_kv_bytes'] / GIB:.2f} GiB (maximum concurrency {side['max_concurrency']:.2f}x)")


def _without_remedy(message: str) -> str:
    """A sizing refusal's reason without its remedy (a flag to change: '; valid ...', '(use at most N)'): with a
    log, the settings are the log's, and the one remedy is the model it was started with."""
    return re.sub(r"(; valid\b.*|;? vLLM refuses it \(use at most [^)]*\))$", "", message)


def _stage_budgets_gib(log: StartupLog) -> list[float] | None:
    """Each pipeline stage's printed KV cache memory (its workers' smallest), where the workers of a pipeline-
    parallel log printed different ones and name their ranks (rank = stage x TP + TP rank, vLLM's layout): each stage
    holds its own layers, so vLLM's blocks are the fewest any worker's budget gives for its stage's layers (trial 53:
    one stage's memory paired with the other stage's layers was 6.6% off). None otherwise."""
    s = log.settings
    tp, pp = s.get("tensor_parallel_size") or 1, s.get("pipeline_parallel_size") or 1
    entries = log.per_worker.get("available_kv_cache_gib", [])
    if pp < 2 or len({e["value"] for e in entries}) < 2:
        return None
    by_stage: dict[int, float] = {}
    for entry in entries:
        rank = re.search(r"\brank=(\d+)", entry["worker"] or "")
        if rank is None or int(rank[1]) >= tp * pp:
            return None
        stage = int(rank[1]) // tp
        by_stage[stage] = min(by_stage.get(stage, entry["value"]), entry["value"])
    if sorted(by_stage) != list(range(pp)) or min(by_stage.values()) <= 0:
        return None
    return [by_stage[stage] for stage in range(pp)]


def kvlab_calculation(log: StartupLog, spec, source: str, audience: str = "cli") -> dict:
    """kvlab.sizing's figures for this log's budget and settings, beside vLLM's, with the differences."""
    from kvlab.sizing import size_kv_cache

    probe = size_kv_cache(spec, _sizing_config(log, GIB, spec))
    budget = _budget(log, probe.bytes_per_block)
    side = {"model": spec.id, "model_source": source, "block_size": probe.block_size, "dtype": probe.dtype,
            "kv_cache_dtype": probe.kv_cache_dtype, "tensor_parallel_size": probe.tensor_parallel_size,
            "max_model_len": probe.max_model_len, "kv_bytes_per_token_per_gpu": probe.kv_bytes_per_token_per_gpu,
            "page_size_bytes": probe.page_size_bytes, "bytes_per_block": probe.bytes_per_block,
            "blocks_per_request": probe.blocks_per_request, **_rules_applied(log, probe)}
    if budget is None:
        side["note"] = "the log gives no KV cache memory or block count to size from"
        return {"kvlab": side, "comparison": [], "differences": []}
    low_b, mid_b, high_b, how = budget
    stages = _stage_budgets_gib(log) if how.endswith("as printed, rounded to 0.01 GiB") else None
    if stages is None:
        results = [size_kv_cache(spec, _sizing_config(log, b, spec)) for b in (low_b, mid_b, high_b)]
    else:  # (each pipeline stage's own budget, at both ends of its rounding)
        how = (f"{', '.join(f'{g}' for g in stages)} GiB as printed by the {len(stages)} pipeline stages' workers "
               "(the smallest of each stage's), rounded to 0.01 GiB")
        results = [size_kv_cache(spec, replace(_sizing_config(log, GIB, spec), available_kv_bytes_by_stage=tuple(
            max(1, round((g + d) * GIB) - (d > 0)) for g in stages))) for d in (-GIB_ROUNDING, 0, GIB_ROUNDING)]
    low, mid, high = (_figures(log, r) for r in results)
    side.update(available_kv_bytes=mid_b, available_kv_source=how, **mid,
                refused=not results[1].fits_max_model_len, vllm_log_lines=_log_lines(log, results[1], mid))
    if low_b != high_b:
        side["range"] = {k: [low[k], high[k]] for k in mid}
    comparison, differences = [], []
    # The refusal's figures are compared only for a refusal: a started engine printed none of them.
    figures = [k for k in mid if log.refused or k not in ("estimated_max_model_len", "needed_kv_cache_gib")]
    stated = {k: getattr(log, k) for k in figures if getattr(log, k) is not None and k not in log.derived}
    for figure, vllm in stated.items():
        status, difference = _compare(figure, vllm, mid[figure], low[figure], high[figure])
        comparison.append({"figure": figure, "vllm": vllm, "kvlab": mid[figure], "status": status})
        if difference:
            differences.append(difference)
    if log.failed_start and not log.refused:
        pass  # (it did not start: kvlab's refusal would be a cause, not a difference: _failed_start_verdict)
    elif side["refused"] != log.refused:
        differences.append(f"vLLM {'refused' if log.refused else 'started'}, but kvlab's arithmetic says it would "
                           f"{'start' if log.refused else 'refuse'}")
    if differences:
        side["hint"] = _difference_hint(log, spec, side, comparison, audience)
    return {"kvlab": side, "comparison": comparison, "differences": differences}


def _block_size_of_groups(log: StartupLog, spec) -> StartupLog:
    """The log with its block size read for ``spec``'s KV cache groups. A block size the log does not state is taken
    from tokens / blocks (``_implied_block_size``); the releases that print the tokens as num_blocks // groups x
    block_size (vllm_rules' "blocks" line) print block_size / groups for a model of several groups (gpt-oss-120b's
    sliding and full layers with 0.10.1: 2,640,144 tokens from 330,018 blocks of 16, not of 8; trial 53). With the
    model known, the block size is that times its groups, where it gives the printed tokens exactly."""
    from kvlab.sizing import size_kv_cache

    implied, tokens, blocks = log.block_size, log.kv_cache_tokens, log.num_gpu_blocks
    if not str(log.derived.get("block_size", "")).endswith(" blocks") or not (implied and tokens and blocks):
        return log
    try:
        if rules_for(log.vllm_version).tokens_line != "blocks":
            return log
        groups = len(size_kv_cache(spec, _sizing_config(log, GIB, spec)).kv_cache_groups)
    except KvlabError:
        return log
    if groups < 2 or blocks // groups * implied * groups != tokens:
        return log
    how = (f"{tokens:,} tokens / ({blocks:,} blocks // {groups} KV cache groups of {spec.id}): this vLLM prints the "
           "tokens as num_blocks // groups x block_size")
    return replace(log, block_size=implied * groups, derived={**log.derived, "block_size": how})


def as_read(log: StartupLog, explanation: dict) -> StartupLog:
    """The log as ``explain_vllm_log`` read it: a figure it worked out again once the model was known (a hybrid
    model's block size) replaces the parser's."""
    read = explanation.get("read_as")
    if not read:
        return log
    return replace(log, block_size=read["block_size"], derived={**log.derived, **read["derived"]})


def explain_vllm_log(log: StartupLog, model: str | None = None, audience: str = "cli") -> dict:
    """The lesson's explanation of ``log`` ("lines"), and, when the model is known (``model``: a catalogue
    name, config.json or Hugging Face id; else the log's own), kvlab's calculation beside vLLM's ("kvlab",
    "comparison") and the differences beyond the log's rounding ("differences", empty when they agree).
    ``audience``: how the reader names the model, "cli" (--model) or "page" (the lab's menu)."""
    spec, source = resolve_model(log, model, audience)
    read = log if spec is None else _block_size_of_groups(log, spec)
    out: dict = {"model_source": source}
    if read is not log:
        out["read_as"] = {"block_size": read.block_size, "derived": {"block_size": read.derived["block_size"]}}
        log = read
    assumed = log.block_size is None
    block_size = log.block_size or DEFAULT_BLOCK_SIZE
    named = _another_model_named(log, spec, audience) if model is not None and spec is not None else None
    sized = _lesson_sizing(log, spec) if named is None else None  # (another model than the log's: not its figures)
    out["lines"] = _failed_lines(log) + _lesson_lines(log, block_size, assumed, sized) + _worker_lines(log)
    if spec is None:
        out["lines"].append(f"kvlab's own calculation needs the model: {source}.")
        return out
    if named is not None:
        out["lines"].append(f"The log names {log.model} ({named}); kvlab's calculation uses {spec.id}, as asked.")
    if log.no_kv_memory:  # (vLLM refused: nothing was left for the KV cache; there is no cache to size)
        out["lines"].append(_no_room_verdict(log, spec))
        return out
    sized = log if named is None else own_default_length(log)  # (another model: its own default length)
    try:
        if model is not None:
            _check_weights_fit(sized, spec)
        out.update(kvlab_calculation(sized, spec, source, audience))
        if named is not None:
            _check_starts(sized, out["kvlab"])
        if sized is not log:
            out["lines"].append(f"The log's max_model_len, {log.max_model_len:,}, is {named}'s default (not among the "
                                f"arguments typed); {spec.id} runs at its own, {out['kvlab']['max_model_len']:,}.")
    except KvlabError as exc:
        if model is not None:  # (the log's settings, the model asked for: the settings are the log's, not flags given)
            whose = f", which names {log.model}" if log.model else ""
            raise KvlabError(f"{spec.id} (as asked) cannot run with the settings of this log{whose}, as vLLM would "
                             f"refuse it: {_without_remedy(str(exc))}; valid: the model the log was started "
                             f"with") from None
        out["lines"].append(f"kvlab cannot size {spec.id} with this log's settings: {exc}.")
        return out
    side = out["kvlab"]
    if log.failed_start and not log.refused and "refused" in side:
        out["lines"].append(_failed_start_verdict(log, spec, side))
    if out["comparison"]:
        differing = [LABELS[row["figure"]] for row in out["comparison"] if row["status"] == "differs"]
        verdict = ("agrees with vLLM on every figure" if not out["differences"] else
                   f"differs from vLLM on the {', '.join(differing) or 'refusal'}: {side['hint']}")
        out["lines"].append(f"kvlab's own arithmetic for {spec.id} ({side['kv_bytes_per_token_per_gpu']:,} bytes per "
                            f"token per GPU, {side['bytes_per_block']:,} per block of {side['block_size']}) "
                            f"{verdict}.")
        out["lines"] += [line for line in [_unchecked_budget(log, side)] if line]
    elif side.get("note"):  # (trial 52: --model given, and nothing said of it where nothing could be compared)
        out["lines"].append(f"kvlab's own arithmetic for {spec.id} ({side['kv_bytes_per_token_per_gpu']:,} bytes per "
                            f"token per GPU) is not compared: {side['note']} (vLLM prints 'Available KV cache "
                            "memory: N GiB' and 'GPU KV cache size: N tokens' as it starts: paste the log from its "
                            "start).")
    return out


def _lesson_sizing(log: StartupLog, spec):
    """kvlab.sizing's figures for the log's model and settings (its KV cache groups, block size and blocks per
    request do not depend on the budget), for the lesson; None without the model or where kvlab cannot size it."""
    from kvlab.sizing import size_kv_cache

    if spec is None or log.no_kv_memory:
        return None
    try:
        return size_kv_cache(spec, _sizing_config(log, GIB, spec))
    except KvlabError:
        return None


def _unchecked_budget(log: StartupLog, side: dict) -> str | None:
    """The comparison a log without vLLM's KV cache memory cannot give: sized from its own block count, the blocks
    and tokens agree by construction; kvlab's bytes per token are not checked against vLLM's memory."""
    if log.available_kv_cache_gib is not None or not side.get("available_kv_source", "").startswith("the log's"):
        return None
    return (f"Not checked: the log has no 'Available KV cache memory' line, so kvlab sized from the log's own "
            f"{log.num_gpu_blocks:,} blocks, and blocks and KV cache size agree by construction; whether kvlab's "
            f"{side['kv_bytes_per_token_per_gpu']:,} bytes per token per GPU turn vLLM's memory into those blocks "
            "needs that line (vLLM prints 'Available KV cache memory: N GiB' as it starts: paste the log from its "
            "start), or kv_cache_memory_bytes or num_gpu_blocks_override among its arguments.")

"""Read a vLLM startup log as people paste it, and explain its KV cache figures the lesson's way.

``parse_vllm_log(text)`` finds the lines vLLM prints while it sizes its KV cache, in every format it has
printed (the format strings, with the files that print them):

    V1 engine (vllm/v1/...)                                          V0 engine (vllm/worker, vllm/executor)
    Available KV cache memory: 6.51 GiB          gpu_worker.py       Loading model weights took 2.6419 GB
    Explicitly set (0.25/14.46) GiB for KV cache on node 0  (CPU)    Memory profiling results: total_gpu_memory=
    GPU KV cache size: 42,656 tokens             kv_cache_utils.py       7.92GiB ... kv_cache_size=3.54GiB ...
    Maximum concurrency for 32,768 tokens per request: 1.30x             gpu_memory_utilization=0.90
      (one line in 0.32: "GPU KV cache size: N tokens, Maximum      the current vLLM instance can use total_gpu_memory
      concurrency for ...")                                              (..GiB) x gpu_memory_utilization (0.90) = ..GiB
    Model loading took 14.77 GiB and 24.3 seconds                    model weights take ..GiB; ...; the rest of the
    ... num_gpu_blocks is: 6297                  loggers.py              memory reserved for KV Cache is 2.36GiB.
    To serve at least one request with the model's max seq len       # GPU blocks: 1207, # CPU blocks: 1365
      (N), (X GiB KV cache is needed, which is larger than the         (later "# cuda blocks", "# CUDA blocks")
      available KV cache memory (Y GiB). ... estimated maximum       Maximum concurrency for 2048 tokens per request
      model length is M.                         (the refusal)       The model's max seq len (N) is larger than the
    non-default args: {'model': ..., 'block_size': 32, ...}              maximum number of tokens that can be stored
    Initializing a V1 LLM engine (v0.11.0) with config: model=...       in KV cache (M).               (the refusal)

and the memory profile's terms (gpu_worker.py): V1 0.10 on "Free memory on device (78.66/79.19 GiB) on startup.
Desired GPU memory utilization is (0.9, 71.27 GiB). Actual usage is W GiB for weight, A GiB for peak activation, N
GiB for non-torch memory, and C GiB for CUDAGraph memory" (later "X GiB for consumed memory (weights + non-torch)"),
0.9-0.10's DEBUG "Total non KV cache memory: ..; torch peak memory increase: ..; non-torch forward increase memory:
..; weights memory: ..", "Graph capturing finished in N secs, took C GiB", "Estimated CUDA graph memory: C GiB
total", "CUDA graph pool memory: C GiB (actual), E GiB (estimated)", and "GB" for GiB in 0.8 and V0 (vLLM divided
by 2**30 and printed "GB").

Whatever wraps them is removed: vLLM's own ``(EngineCore_DP0 pid=…) INFO MM-DD hh:mm:ss [file.py:NNN]`` prefix (or the
older ``INFO MM-DD hh:mm:ss file.py:NNN]``), Ray's ``(LLMRayActor pid=…, ip=…)`` and ``[repeated 3x across
cluster]``, docker compose's ``name  | ``, ``docker logs -t`` / kubectl timestamps, ANSI colours (also with the
escape character lost in a paste), markdown fences, quotes and back-quotes. A figure printed more than once
(once per worker, or once per KV cache config) is reported as the first one; every occurrence is in
``per_worker``.

No I/O here: the CLI reads the file.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass

# --- cleaning: what people's tools put around vLLM's lines -------------------------------------------------

ANSI = re.compile(r"(?:\x1b|\ufffd)\[[0-9;?]*[A-Za-z]|(?<![\w\]])\[[0-9]{1,3}(?:;[0-9]{1,3})*m")
FENCE = re.compile(r"^\s*(```|~~~)")
WRAPPERS = (
    re.compile(r"^\s*>+\s?"),                                                  # markdown quote
    re.compile(r"^\s*`+"),                                                     # markdown back-quotes
    re.compile(r"^\s*\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+"),  # docker -t, kubectl
    re.compile(r"^\s*\[\d{4}-\d\d-\d\d[T ][^\]]*\]\s*"),                       # [2025-06-26T16:27:15Z] (CI)
    re.compile(r"^\s*\[pod/[^\]]+\]\s*"),                                      # kubectl logs --prefix
    re.compile(r"^\s*[A-Za-z0-9][\w.-]*\s+\|\s?"),                             # docker compose "name  | "
)
TRAILERS = (re.compile(r"`+\s*$"), re.compile(r"\s*\[repeated \d+x across cluster\]\s*$"))
# vLLM's process prefix, and Ray's (with ", ip=..."), possibly nested: (LLMRayActor pid=1) (EngineCore pid=2)
PROCESS = re.compile(r"^\s*\((?P<name>[A-Za-z_][\w.\-]*)(?: rank=(?P<rank>\d+))? pid=(?P<pid>\d+)(?:, ip=[\w.:]+)?\)\s*")
# vLLM's level, time and source: "INFO 10-06 15:57:53 [gpu_worker.py:298] " (older: "... gpu_worker.py:298] ")
LEVEL = re.compile(r"^\s*(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d\s+\d\d:\d\d:\d\d(?:\.\d+)?\s+"
                   r"\[?[\w./<>-]+:\d+\]\s*")


@dataclass(frozen=True)
class LogLine:
    text: str  # as vLLM printed it: wrappers and colours removed, vLLM's own prefix kept
    message: str  # vLLM's message alone
    worker: str | None  # the innermost process prefix, e.g. "Worker_TP3 pid=41702", "VllmWorker rank=2 pid=19833"
    prefixed: bool = False  # the line carries vLLM's own prefix: a process's, or its level, time and source


# What a browser's copy or a chat window puts in a log's spaces: no-break and other Unicode spaces read as a space,
# zero-width characters as nothing, so that every line reads as vLLM wrote it.
SPACES = {**{c: " " for c in (0x00A0, 0x1680, *range(0x2000, 0x200B), 0x202F, 0x205F, 0x3000)},
          **{c: None for c in (0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF)}}


def clean_line(raw: str) -> LogLine | None:
    """The vLLM line inside what a terminal, docker, Ray or markdown put around it; None for a fence."""
    line = ANSI.sub("", raw).replace("\r", "").translate(SPACES).rstrip()
    if FENCE.match(line):
        return None
    changed = True
    while changed and not PROCESS.match(line):  # inside vLLM's own prefix nothing is a wrapper any more
        changed = False
        for pattern in WRAPPERS:
            stripped = pattern.sub("", line, count=1)
            if stripped != line:
                line, changed = stripped, True
                break
    for pattern in TRAILERS:
        line = pattern.sub("", line)
    text = line.strip()
    message, worker = text, None
    while (m := PROCESS.match(message)) is not None:
        rank = f" rank={m['rank']}" if m["rank"] else ""
        worker = f"{m['name']}{rank} pid={m['pid']}"
        message = message[m.end():]
    unlevelled = LEVEL.sub("", message, count=1).strip()
    return LogLine(text, unlevelled, worker, prefixed=worker is not None or unlevelled != message.strip())


# --- the lines vLLM prints -------------------------------------------------------------------------------

def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _float(text: str) -> float:
    return float(text.replace(",", ""))


def _dtype(value) -> str | None:
    """'torch.bfloat16' (the engine config line) or 'bfloat16' (the arguments) -> 'bfloat16'."""
    return None if value is None else str(value).removeprefix("torch.")


ARG_SETTINGS = ("model", "dtype", "kv_cache_dtype", "block_size", "max_model_len", "gpu_memory_utilization",
                "tensor_parallel_size", "pipeline_parallel_size", "max_num_seqs", "max_num_batched_tokens",
                "kv_cache_memory_bytes", "num_gpu_blocks_override", "quantization", "enable_prefix_caching",
                "swap_space", "served_model_name", "speculative_config")
LITERAL_ITEM = re.compile(r"'(?P<key>\w+)':\s*(?P<value>'[^']*'|\"[^\"]*\"|-?\d[\d_.]*(?:e-?\d+)?|True|False|None"
                          r"|\[[^\[\]]*\])")


def parse_args_dict(text: str) -> dict:
    """The dict vLLM logs as 'non-default args', read as a Python literal; item by item when it holds reprs
    that are not literals or was cut off in the paste."""
    try:
        value = ast.literal_eval(text)
        if isinstance(value, dict):
            return value
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    items = {}
    for m in LITERAL_ITEM.finditer(text):
        try:
            items[m["key"]] = ast.literal_eval(m["value"])
        except (ValueError, SyntaxError):
            continue
    return items


# The settings vLLM holds as whole numbers; a log's args may give them as text ('32k' where a config file or a
# wrapper passed them on unparsed), read as vLLM reads the flag (kvlab.validate.vllm_human_readable_int).
WHOLE_ARG_SETTINGS = ("block_size", "max_model_len", "tensor_parallel_size", "pipeline_parallel_size", "max_num_seqs",
                      "max_num_batched_tokens", "kv_cache_memory_bytes", "num_gpu_blocks_override")


def _whole_setting(key: str, value):
    """A whole-number setting of the non-default args as vLLM reads its flag: 32000, '32000', '32k' (32,000) or
    '32K' (32,768) where vLLM takes those; anything else is a KvlabError naming it."""
    from kvlab.errors import KvlabError
    from kvlab.validate import VLLM_HUMAN_READABLE_INT_ARGS, vllm_human_readable_int, whole_number_text

    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            number = vllm_human_readable_int(text) if key in VLLM_HUMAN_READABLE_INT_ARGS else None
        except ValueError as exc:
            raise KvlabError(f"the log's non-default args: {key}={value!r}: {exc}") from None
        if number is None and whole_number_text(text):
            number = int(text)
        if number is not None:
            return number
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    readable = " (or vLLM's 32k: 32,000, 32K: 32,768)" if key in VLLM_HUMAN_READABLE_INT_ARGS else ""
    raise KvlabError(f"the log's non-default args: {key}={value!r} is not a whole number; valid: digits{readable}, as "
                     f"vLLM reads --{key.replace('_', '-')}")


def _read_args(m: re.Match) -> dict:
    args = parse_args_dict(m["args"])
    settings = {k: args[k] for k in ARG_SETTINGS if k in args and args[k] is not None}
    settings |= {k: _whole_setting(k, v) for k, v in settings.items() if k in WHOLE_ARG_SETTINGS}
    if "model" not in settings and isinstance(args.get("model_tag"), str):
        settings["model"] = args["model_tag"]  # `vllm serve MODEL`: the positional argument
    if "dtype" in settings:
        settings["dtype"] = _dtype(settings["dtype"])
    # (the keys typed: what the line does not hold took vLLM's default for the model, max_model_len above all)
    return {f"settings.{k}": v for k, v in settings.items()} | {"typed_args": tuple(sorted(args))}


CONFIG_ITEM = re.compile(r"(?P<key>\w+)=(?P<value>'[^']*'|[^,\s]+)")
CONFIG_SETTINGS = {"model": "model", "dtype": "dtype", "max_seq_len": "max_model_len",
                   "tensor_parallel_size": "tensor_parallel_size", "pipeline_parallel_size": "pipeline_parallel_size",
                   "kv_cache_dtype": "kv_cache_dtype", "quantization": "quantization"}


def _available_kv(gib: float) -> dict:
    """A budget below 0 is a refusal: V1 raises "No available memory for the cache blocks" when it is not positive
    (kv_cache_utils.check_enough_kv_cache_memory), whether or not the excerpt kept that line."""
    return {"available_kv_cache_gib": gib, **({"refused": True, "no_kv_memory": True} if gib < 0 else {})}


def _read_engine_config(m: re.Match) -> dict:
    found: dict = {"vllm_version": m["version"]}
    for item in CONFIG_ITEM.finditer(m["rest"]):
        name = CONFIG_SETTINGS.get(item["key"])
        if name is None or f"config.{name}" in found:
            continue
        value = item["value"].strip("'")
        if value == "None":
            continue
        if name == "dtype":
            value = _dtype(value)
        elif value.isascii() and value.isdigit():  # "²".isdigit() is true, int("²") fails
            value = int(value)
        found[f"config.{name}"] = value
    return found


CONFIG_KEYS = {v: k for k, v in CONFIG_SETTINGS.items()}
PROFILE_ITEM = re.compile(r"(?P<key>\w+)=(?P<value>-?[\d.]+)(?:GiB|Gib|GB)?")


def _read_profiling(m: re.Match) -> dict:
    """V0 0.6.x: 'Memory profiling results: total_gpu_memory=7.92GiB ... kv_cache_size=6.27GiB
    gpu_memory_utilization=0.90' (some builds: 'kv_cache_memory=')."""
    items = {i["key"]: float(i["value"]) for i in PROFILE_ITEM.finditer(m["rest"])}
    found = {}
    for key in ("kv_cache_size", "kv_cache_memory"):
        if key in items:
            found["available_kv_cache_gib"] = items[key]
            break
    if "total_gpu_memory" in items:
        found["total_gpu_memory_gib"] = items["total_gpu_memory"]
    if "gpu_memory_utilization" in items:
        found["gpu_memory_utilization"] = items["gpu_memory_utilization"]
    return found


SPLIT_ITEM = re.compile(r"(?P<key>model weights take|non_torch_memory takes|PyTorch activation peak memory takes|"
                        r"the rest of the memory reserved for KV Cache is) (?P<gib>-?[\d.]+)\s*GiB")
SPLIT_FIGURES = {"model weights take": "model_weights_gib", "non_torch_memory takes": "non_torch_gib",
                 "PyTorch activation peak memory takes": "activation_gib",
                 "the rest of the memory reserved for KV Cache is": "available_kv_cache_gib"}


def _read_memory_split(m: re.Match) -> dict:
    """V0 and V1 up to 0.9 (worker.py, gpu_worker.py): 'model weights take 14.99GiB; non_torch_memory takes 0.17GiB;
    PyTorch activation peak memory takes 4.35GiB; the rest of the memory reserved for KV Cache is 51.68GiB.'"""
    return {SPLIT_FIGURES[i["key"]]: float(i["gib"]) for i in SPLIT_ITEM.finditer(m.group(0))}


USAGE_ITEM = re.compile(r"(?P<gib>-?[\d.]+) GiB for (?P<what>weight|consumed memory \(weights \+ non-torch\)|peak "
                        r"activation|non-torch memory|CUDAGraph memory)")
USAGE_FIGURES = {"weight": "model_weights_gib", "consumed memory (weights + non-torch)": "weights_and_non_torch_gib",
                 "peak activation": "activation_gib", "non-torch memory": "non_torch_gib",
                 "CUDAGraph memory": "cuda_graph_gib"}


def _read_actual_usage(m: re.Match) -> dict:
    """gpu_worker.py's 'Actual usage is ...': 0.10-0.11 'W GiB for weight, A GiB for peak activation, N GiB for
    non-torch memory, and C GiB for CUDAGraph memory'; later 'X GiB for consumed memory (weights + non-torch), A GiB
    for peak activation, and C GiB for CUDAGraph memory'."""
    text = " ".join(m["rest"].split())
    return {USAGE_FIGURES[i["what"]]: float(i["gib"]) for i in USAGE_ITEM.finditer(text)}


@dataclass(frozen=True)
class LinePattern:
    """One kind of line: what it looks like, which engine prints it (None: both), what it gives."""

    name: str
    engine: str | None
    regex: re.Pattern
    read: Callable[[re.Match], dict]


NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)"  # 42,656 or 42656: never the comma after a number


def _pattern(name: str, engine: str | None, regex: str, read: Callable[[re.Match], dict]) -> LinePattern:
    # Any run of spaces in a format string may be a line break or several spaces in a paste.
    return LinePattern(name, engine, re.compile(regex.replace(" ", r"\s+").replace("NUM", NUM)), read)


PATTERNS = (
    _pattern("kv_cache_size", "v1", r"\b(?P<device>[A-Za-z]+(?: \+ host)?) KV cache size: (?P<n>NUM) tokens",
             lambda m: {"kv_cache_tokens": _int(m["n"]), "kv_cache_device": m["device"]}),
    _pattern("max_concurrency", None,
             r"Maximum concurrency for (?P<len>NUM) tokens per request: (?P<x>[\d.,]+)x",
             lambda m: {"max_concurrency_tokens_per_request": _int(m["len"]), "max_concurrency": _float(m["x"])}),
    _pattern("available_kv", "v1", r"Available KV cache memory: (?P<gib>-?[\d.]+) GiB",
             lambda m: _available_kv(float(m["gib"]))),
    _pattern("cpu_kv", "v1", r"(?:Explicitly|Auto) set \((?P<gib>[\d.]+)/(?P<total>[\d.]+)\) GiB for KV cache",
             lambda m: {"available_kv_cache_gib": float(m["gib"]), "total_memory_gib": float(m["total"])}),
    _pattern("num_gpu_blocks", "v1", r"num_gpu_blocks is: (?P<n>NUM)",
             lambda m: {"num_gpu_blocks": _int(m["n"])}),
    _pattern("blocks_override", None, r"with num_gpu_blocks_override=(?P<n>\d+)",
             lambda m: {"num_gpu_blocks": int(m["n"])}),
    # "GB" (0.8 and V0) is GiB too: vLLM divides by GiB_bytes (2**30) and printed the unit as "GB" until 0.9.
    _pattern("weights_v1", None, r"Model loading took (?P<gib>[\d.]+) (?:GiB|GB)\b",
             lambda m: {"model_weights_gib": float(m["gib"])}),
    _pattern("weights_v0", "v0", r"Loading model weights took (?P<gib>[\d.]+) (?:GiB|GB)\b",
             lambda m: {"model_weights_gib": float(m["gib"])}),
    _pattern("blocks_v0", "v0", r"#\s*(?P<device>\w+) blocks: (?P<n>NUM)(?:, #\s*CPU blocks: (?P<cpu>NUM))?",
             lambda m: {"num_gpu_blocks": _int(m["n"]), "kv_cache_device": m["device"],
                        **({"num_cpu_blocks": _int(m["cpu"])} if m["cpu"] else {})}),
    _pattern("profiling_v0", "v0", r"Memory profiling results: (?P<rest>.*)", _read_profiling),
    _pattern("budget", None, r"total_gpu_memory \((?P<total>[\d.]+)\s*GiB\) x gpu_memory_utilization "
             r"\((?P<util>[\d.]+)\)",
             lambda m: {"total_gpu_memory_gib": float(m["total"]), "gpu_memory_utilization": float(m["util"])}),
    _pattern("memory_split", None, r"model weights take (?P<w>[\d.]+)\s*GiB;.*?the rest of the memory reserved for "
             r"KV Cache is (?P<kv>-?[\d.]+)\s*GiB", _read_memory_split),
    # V1 0.9-0.10, at DEBUG: the profile's terms (gpu_worker.determine_available_memory)
    _pattern("profile_debug", "v1", r"Total non KV cache memory: (?P<other>[\d.]+)\s*GiB; torch peak memory increase: "
             r"(?P<act>-?[\d.]+)\s*GiB; non-torch forward increase memory: (?P<nt>-?[\d.]+)\s*GiB; weights memory: "
             r"(?P<w>[\d.]+)\s*GiB",
             lambda m: {"non_kv_cache_gib": float(m["other"]), "activation_gib": float(m["act"]),
                        "non_torch_gib": float(m["nt"]), "model_weights_gib": float(m["w"])}),
    _pattern("requested_debug", "v1", r"Initial free memory: (?P<free>[\d.]+) GiB; Requested memory: (?P<util>[\d.]+) "
             r"\(util\), (?P<req>[\d.]+) GiB",
             lambda m: {"gpu_memory_utilization": float(m["util"]), "requested_memory_gib": float(m["req"])}),
    # V1 0.10 on: "Free memory on device (78.66/79.19 GiB) on startup. Desired GPU memory utilization is (0.9, 71.27
    # GiB). Actual usage is ..." (the terms follow: _read_actual_usage)
    _pattern("free_on_startup", "v1", r"Free memory on device \((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) on startup\. "
             r"Desired GPU memory utilization is \((?P<util>[\d.]+), (?P<req>[\d.]+) GiB\)",
             lambda m: {"total_gpu_memory_gib": float(m["total"]), "gpu_memory_utilization": float(m["util"]),
                        "requested_memory_gib": float(m["req"]), "free_on_startup_gib": float(m["free"])}),
    _pattern("actual_usage", "v1", r"Actual usage is (?P<rest>[\s\S]*?GiB for CUDAGraph memory)", _read_actual_usage),
    # V1, multimodal models: the encoder's profiling run (gpu_model_runner.profile_run)
    _pattern("encoder_profile", "v1", r"Encoder cache will be initialized with a budget of (?P<n>NUM) tokens, and "
             r"profiled with (?P<k>\d+) (?P<mod>\w+) items",
             lambda m: {"encoder_budget_tokens": _int(m["n"]), "encoder_profile_items": int(m["k"]),
                        "encoder_profile_modality": m["mod"]}),
    _pattern("cuda_graph_captured", None, r"Graph capturing finished in [\d.]+ secs?, took (?P<gib>-?[\d.]+) GiB",
             lambda m: {"cuda_graph_gib": float(m["gib"])}),
    _pattern("cuda_graph_estimate", "v1", r"Estimated CUDA graph memory: (?P<gib>-?[\d.]+) GiB total",
             lambda m: {"estimated_cuda_graph_gib": float(m["gib"])}),
    # 0.20 on, where the estimate is profiled: "Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=19
    # (largest=128)", and the estimate as a share of the card: "The current --gpu-memory-utilization=0.9000 is
    # equivalent to --gpu-memory-utilization=0.8908 without CUDA graph memory profiling" (gpu_worker.py: the
    # estimate / total memory, so 0.0092 of the card here)
    _pattern("cuda_graph_profiling", "v1", r"Profiling CUDA graph memory: PIECEWISE=(?P<pw>\d+)(?: \(largest=\d+\))?, "
             r"FULL=(?P<full>\d+)", lambda m: {"cuda_graphs_profiled": int(m["pw"]) + int(m["full"])}),
    _pattern("cuda_graph_equivalent", "v1", r"The current --gpu-memory-utilization=(?P<util>[\d.]+) is equivalent to "
             r"--gpu-memory-utilization=(?P<eq>[\d.]+) without CUDA graph memory profiling",
             lambda m: {"estimated_cuda_graph_share": round(float(m["util"]) - float(m["eq"]), 6)}),
    _pattern("cuda_graph_pool", "v1", r"CUDA graph pool memory: (?P<actual>-?[\d.]+) GiB \(actual\), "
             r"(?P<est>-?[\d.]+) GiB \(estimated\)",
             lambda m: {"cuda_graph_gib": float(m["actual"]), "estimated_cuda_graph_gib": float(m["est"])}),
    _pattern("refusal_v0", "v0", r"The model's max seq len \((?P<len>\d+)\) is larger than the maximum number of "
             r"tokens that can be stored in KV cache \((?P<n>\d+)\)",
             lambda m: {"refused": True, "max_model_len": int(m["len"]), "kv_cache_tokens": int(m["n"])}),
    _pattern("refusal_v1", "v1", r"To serve at least one request with the models?'s max seq len \((?P<len>\d+)\), "
             r"\((?P<need>[\d.]+) GiB KV cache is needed, which is larger than the available KV cache memory "
             r"\((?P<avail>-?[\d.]+) GiB\)",
             lambda m: {"refused": True, "max_model_len": int(m["len"]), "needed_kv_cache_gib": float(m["need"]),
                        "available_kv_cache_gib": float(m["avail"])}),
    _pattern("estimated_len", "v1", r"[Ee]stimated maximum model length is (?P<n>\d+)",
             lambda m: {"estimated_max_model_len": int(m["n"])}),
    # The engine's own word that it did not start (V1's core.py at ERROR), whatever the cause: the log's figures are
    # then from a start that failed, and the cause is in the traceback around it.
    _pattern("failed_start", "v1", r"(?:EngineCore|Engine core) (?:failed to start|initialization failed)",
             lambda m: {"failed_start": True}),
    _pattern("no_memory", None, r"No available memory for the cache blocks",
             lambda m: {"refused": True, "no_kv_memory": True}),
    _pattern("non_default_args", None, r"non-default args: (?P<args>\{.*\}?)", _read_args),
    # The engine's token budget per step as it applies it (SchedulerConfig, from 0.6 or so): a sliding window's blocks
    # per request grow with it (trial 62, finding 4: `vllm log` sized at 2,048 where the log said otherwise).
    _pattern("chunked_prefill", None, r"Chunked prefill is enabled with max_num_batched_tokens=(?P<n>\d+)",
             lambda m: {"config.max_num_batched_tokens": int(m["n"])}),
    _pattern("engine_config", None, r"Initializing an? (?:(?P<engine>V[01]) )?LLM engine \(v?(?P<version>[^)\s]+)\) "
             r"with config: (?P<rest>.*)", _read_engine_config),
    _pattern("using_max_model_len", None, r"Using max model len (?P<n>\d+)",
             lambda m: {"config.max_model_len": int(m["n"])}),
    _pattern("server_version", None, r"vLLM API server version (?P<v>\S+)|█ +version (?P<b>\d[\w.+-]*)",
             lambda m: {"vllm_version": m["v"] or m["b"]}),
)
SEEN_LABELS = {"non_default_args": "the non-default args line", "engine_config": "the engine config line",
               "weights_v1": "the model loading line", "weights_v0": "the model loading line",
               "server_version": "the version line", "using_max_model_len": "the max model len line",
               "budget": "the GPU memory line"}
# Figures about the KV cache itself: a log must have one of these to be explained.
KV_FIGURES = ("kv_cache_tokens", "num_gpu_blocks", "max_concurrency", "available_kv_cache_gib", "refused")
# The lines looked for, in one breath, for the error when none is found (every line read: docs/vllm.md).
LOOKED_FOR_BRIEFLY = ("V1's 'GPU KV cache size: N tokens' and 'Maximum concurrency for N tokens per request: X.XXx', "
                      "V0's '# GPU blocks: N', or one of vLLM's refusals")
V1_MARKERS = re.compile(r"\bEngineCore\b|\bV1 LLM engine\b|\bv1/")


@dataclass(frozen=True)
class Reading:
    """One figure read from one line."""

    figure: str
    value: object
    line: str
    worker: str | None
    engine: str | None  # the engine whose format the line is in, None if both printed it
    pattern: str = ""  # the kind of line
    in_log_line: bool = True  # read from a line vLLM printed, not from a sentence that quotes one (log_line_start)


# What may stand before vLLM's message on a line of a log without vLLM's full prefix: a paste's bullet, comment or
# quote mark, a process name without its pid ('(EngineCore)'), a bare level, time or source ('INFO [gpu_worker.py:563]',
# 'INFO 05-01 12:00:00 gpu_worker.py:1'),
# an exception's name ('ValueError: To serve at least one request ...').
LOG_LINE_LEAD = re.compile(r"(?:[#*\u2022>\-]++\s*|`++\s*|\([A-Za-z_][\w.\-]*(?: rank=\d+)?(?: pid=\d+)?\)\s*|"
                           r"\[[\w./<>-]+:\d+\]\s*|[\w./<>-]+\.py:\d+\]?\s+|\d\d-\d\d\s+\d\d:\d\d:\d\d(?:\.\d+)?\s+|"
                           r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL):?\s+|"
                           r"[A-Z]\w*(?:Error|Exception):\s*)*")


# vLLM's level, time and source just before the message, whatever a tool put before them ('2026-05-01 19:57:53.564 |
# (APIServer pid=1) INFO 05-01 17:57:53 [utils.py:233] ', '# (EngineCore pid=3597) INFO 08-27 20:27:14 [kv...] ').
LEVEL_BEFORE = re.compile(LEVEL.pattern.removeprefix("^") + "$")


def log_line_start(before: str, prefixed: bool = False) -> bool:
    """Whether a message found after ``before`` on its line is a line vLLM printed: the line carries vLLM's prefix, or
    nothing but a paste's marks stands before the message. A sentence that quotes a figure (a README's
    '# → "GPU KV cache size: 42,656 tokens"') is not one (trial 55, finding 7)."""
    return prefixed or LOG_LINE_LEAD.fullmatch(before) is not None or LEVEL_BEFORE.search(before) is not None


MAX_LINE_CHARS = 240


def excerpt(text: str, figure: str) -> str:
    """A long line (the engine config, the arguments) cut to vLLM's prefix and the part that holds ``figure``."""
    if len(text) <= MAX_LINE_CHARS or "." not in figure:
        return text
    kind, name = figure.split(".", 1)
    key = f"'{name}'" if kind == "settings" else f"{CONFIG_KEYS.get(name, name)}="
    at = text.find(key)
    marks = [text.find(m) + len(m) for m in ("non-default args:", "with config:") if m in text]
    head = text[:marks[0]] if marks else text[:60]
    if at < 0:
        return head + " …"
    end = text.find(",", at)
    return f"{head} … {text[at:end if end > 0 else len(text)]} …"


# Words one of which every known line holds (on its first line, when a paste wrapped it): the other lines of a
# long log (requests, routes, progress bars) are skipped without running every pattern on them.
KEYWORDS = ("KV cache", "KV Cache", "concurrency", "blocks", "Model loading", "model weights", "Memory profiling",
            "Free memory on device", "Actual usage", "non KV cache memory", "Initial free memory", "Graph capturing",
            "CUDA graph memory", "CUDA graph pool",
            "total_gpu_memory", "max seq len", "To serve", "maximum model length", "No available memory",
            "non-default args", "LLM engine", "max model len", "version", "failed to start", "initialization failed",
            "Chunked prefill")
WRAPPED_LINES = 3  # a wrapped message's continuation lines looked at after a line with a keyword


def _candidate_lines(text: str) -> list[LogLine]:
    raw = text.translate(SPACES).splitlines()
    keep = set()
    for i, line in enumerate(raw):
        if any(word in line for word in KEYWORDS):
            keep.update(range(i, min(i + WRAPPED_LINES + 1, len(raw))))
    lines = (clean_line(raw[i]) for i in sorted(keep))
    return [line for line in lines if line is not None and line.message]


def read_lines(text: str) -> list[Reading]:
    """Every figure of every known line, in the order of the log."""
    lines = _candidate_lines(text)
    readings: list[Reading] = []
    found = set()
    for line in lines:
        for pattern in PATTERNS:
            m = pattern.regex.search(line.message)
            if m is None:
                continue
            found.add(pattern.name)
            in_log = log_line_start(line.message[:m.start()], line.prefixed)
            for figure, value in pattern.read(m).items():
                readings.append(Reading(figure, value, excerpt(line.text, figure), line.worker, pattern.engine,
                                        pattern.name, in_log))
    # A long message wrapped over several lines in a paste (the refusal, typically): look across lines too.
    joined = "\n".join(line.message for line in lines)
    for pattern in PATTERNS:
        if pattern.name in found or pattern.name in ("non_default_args", "engine_config", "profiling_v0"):
            continue
        m = pattern.regex.search(joined)
        if m is not None:
            snippet = " ".join(m.group(0).split())
            in_log = log_line_start(joined[joined.rfind("\n", 0, m.start()) + 1:m.start()])
            readings += [Reading(f, v, snippet, None, pattern.engine, pattern.name, in_log)
                         for f, v in pattern.read(m).items()]
    return readings

"""Read a vLLM startup log as people paste it, and explain its KV cache figures the lesson's way.

``parse_vllm_log(text)`` finds the lines vLLM prints while it sizes its KV cache, in every format it has
printed (the format strings, with the files that print them):

    V1 engine (vllm/v1/...)                                          V0 engine (vllm/worker, vllm/executor)
    Available KV cache memory: 6.51 GiB          gpu_worker.py       Loading model weights took 2.6419 GB
    Explicitly set (0.25/14.46) GiB for KV cache on node 0  (CPU)    Memory profiling results: total_gpu_memory=
    GPU KV cache size: 42,656 tokens             kv_cache_utils.py       7.92GiB ... kv_cache_size=3.54GiB ...
    Maximum concurrency for 32,768 tokens per request: 1.30x             gpu_memory_utilization=0.90
      (one line since 0.2x: "GPU KV cache size: N tokens, Maximum    the current vLLM instance can use total_gpu_memory
      concurrency for ...")                                              (..GiB) x gpu_memory_utilization (0.90) = ..GiB
    Model loading took 14.77 GiB and 24.3 seconds                    model weights take ..GiB; ...; the rest of the
    ... num_gpu_blocks is: 6297                  loggers.py              memory reserved for KV Cache is 2.36GiB.
    To serve at least one request with the model's max seq len       # GPU blocks: 1207, # CPU blocks: 1365
      (N), (X GiB KV cache is needed, which is larger than the         (later "# cuda blocks", "# CUDA blocks")
      available KV cache memory (Y GiB). ... estimated maximum       Maximum concurrency for 2048 tokens per request
      model length is M.                         (the refusal)       The model's max seq len (N) is larger than the
    non-default args: {'model': ..., 'block_size': 32, ...}              maximum number of tokens that can be stored
    Initializing a V1 LLM engine (v0.11.0) with config: model=...       in KV cache (M).               (the refusal)

whatever wraps them: vLLM's own ``(EngineCore_DP0 pid=…) INFO MM-DD hh:mm:ss [file.py:NNN]`` prefix (or the
older ``INFO MM-DD hh:mm:ss file.py:NNN]``), Ray's ``(LLMRayActor pid=…, ip=…)`` and ``[repeated 3x across
cluster]``, docker compose's ``name  | ``, ``docker logs -t`` / kubectl timestamps, ANSI colours (also with the
escape character lost in a paste), markdown fences, quotes and back-quotes. A figure printed more than once
(once per worker, or once per KV cache config) is reported as the first one; every occurrence is in
``per_worker``.

``explain_vllm_log(log, model)`` says what the figures mean (tokens -> blocks of block_size tokens ->
conversations at the full length), and where the model is known puts kvlab's own sizing (kvlab.sizing, the
arithmetic of ``kvlab size``) beside vLLM's, flagging any difference beyond what the log's rounding allows.
No I/O here: the CLI reads the file.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from kvlab.errors import KvlabError

GIB = 2**30
# vLLM prints GiB rounded to 2 decimals (format_gib: round(x, 2); V0: "%.2f"): the true figure is within this.
GIB_ROUNDING = 0.005
DEFAULT_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE

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
PROCESS = re.compile(r"^\s*\((?P<name>[A-Za-z_][\w.\-]*)(?: rank=\d+)? pid=(?P<pid>\d+)(?:, ip=[\w.:]+)?\)\s*")
# vLLM's level, time and source: "INFO 10-06 15:57:53 [gpu_worker.py:298] " (older: "... gpu_worker.py:298] ")
LEVEL = re.compile(r"^\s*(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d\s+\d\d:\d\d:\d\d(?:\.\d+)?\s+"
                   r"\[?[\w./<>-]+:\d+\]\s*")


@dataclass(frozen=True)
class LogLine:
    text: str  # as vLLM printed it: wrappers and colours removed, vLLM's own prefix kept
    message: str  # vLLM's message alone
    worker: str | None  # the innermost process prefix, e.g. "Worker_TP3 pid=41702"


def clean_line(raw: str) -> LogLine | None:
    """The vLLM line inside what a terminal, docker, Ray or markdown put around it; None for a fence."""
    line = ANSI.sub("", raw).replace("\r", "").rstrip()
    if FENCE.match(line):
        return None
    changed = True
    while changed:
        changed = False
        for pattern in WRAPPERS:
            stripped = pattern.sub("", line, count=1)
            if stripped != line and not PROCESS.match(line):
                line, changed = stripped, True
    for pattern in TRAILERS:
        line = pattern.sub("", line)
    text = line.strip()
    message, worker = text, None
    while (m := PROCESS.match(message)) is not None:
        worker = f"{m['name']} pid={m['pid']}"
        message = message[m.end():]
    message = LEVEL.sub("", message, count=1).strip()
    return LogLine(text, message, worker)


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
                "swap_space", "served_model_name")
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


def _read_args(m: re.Match) -> dict:
    args = parse_args_dict(m["args"])
    settings = {k: args[k] for k in ARG_SETTINGS if k in args and args[k] is not None}
    if "model" not in settings and isinstance(args.get("model_tag"), str):
        settings["model"] = args["model_tag"]  # `vllm serve MODEL`: the positional argument
    if "dtype" in settings:
        settings["dtype"] = _dtype(settings["dtype"])
    return {f"settings.{k}": v for k, v in settings.items()}


CONFIG_ITEM = re.compile(r"(?P<key>\w+)=(?P<value>'[^']*'|[^,\s]+)")
CONFIG_SETTINGS = {"model": "model", "dtype": "dtype", "max_seq_len": "max_model_len",
                   "tensor_parallel_size": "tensor_parallel_size", "pipeline_parallel_size": "pipeline_parallel_size",
                   "kv_cache_dtype": "kv_cache_dtype", "quantization": "quantization"}


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
        elif value.isdigit():
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


@dataclass(frozen=True)
class LinePattern:
    """One kind of line: what it looks like, which engine prints it (None: both), what it gives."""

    name: str
    engine: str | None
    regex: re.Pattern
    read: Callable[[re.Match], dict]


def _pattern(name: str, engine: str | None, regex: str, read: Callable[[re.Match], dict]) -> LinePattern:
    # Any run of spaces in a format string may be a line break or several spaces in a paste.
    return LinePattern(name, engine, re.compile(regex.replace(" ", r"\s+")), read)


PATTERNS = (
    _pattern("kv_cache_size", "v1", r"\b(?P<device>[A-Za-z]+(?: \+ host)?) KV cache size: (?P<n>[\d,]+) tokens",
             lambda m: {"kv_cache_tokens": _int(m["n"]), "kv_cache_device": m["device"]}),
    _pattern("max_concurrency", None,
             r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>[\d.,]+)x",
             lambda m: {"max_concurrency_tokens_per_request": _int(m["len"]), "max_concurrency": _float(m["x"])}),
    _pattern("available_kv", "v1", r"Available KV cache memory: (?P<gib>-?[\d.]+) GiB",
             lambda m: {"available_kv_cache_gib": float(m["gib"])}),
    _pattern("cpu_kv", "v1", r"(?:Explicitly|Auto) set \((?P<gib>[\d.]+)/(?P<total>[\d.]+)\) GiB for KV cache",
             lambda m: {"available_kv_cache_gib": float(m["gib"]), "total_memory_gib": float(m["total"])}),
    _pattern("num_gpu_blocks", "v1", r"num_gpu_blocks is: (?P<n>[\d,]+)",
             lambda m: {"num_gpu_blocks": _int(m["n"])}),
    _pattern("blocks_override", None, r"with num_gpu_blocks_override=(?P<n>\d+)",
             lambda m: {"num_gpu_blocks": int(m["n"])}),
    _pattern("weights_v1", None, r"Model loading took (?P<gib>[\d.]+) GiB",
             lambda m: {"model_weights_gib": float(m["gib"])}),
    _pattern("weights_v0", "v0", r"Loading model weights took (?P<gib>[\d.]+) GB",
             lambda m: {"model_weights_gib": float(m["gib"])}),
    _pattern("blocks_v0", "v0", r"# ?(?P<device>\w+) blocks: (?P<n>[\d,]+)(?:, # CPU blocks: (?P<cpu>[\d,]+))?",
             lambda m: {"num_gpu_blocks": _int(m["n"]), "kv_cache_device": m["device"],
                        **({"num_cpu_blocks": _int(m["cpu"])} if m["cpu"] else {})}),
    _pattern("profiling_v0", "v0", r"Memory profiling results: (?P<rest>.*)", _read_profiling),
    _pattern("budget", None, r"total_gpu_memory \((?P<total>[\d.]+) ?GiB\) x gpu_memory_utilization "
             r"\((?P<util>[\d.]+)\)",
             lambda m: {"total_gpu_memory_gib": float(m["total"]), "gpu_memory_utilization": float(m["util"])}),
    _pattern("memory_split", None, r"model weights take (?P<w>[\d.]+) ?GiB;.*?the rest of the memory reserved for "
             r"KV Cache is (?P<kv>-?[\d.]+) ?GiB",
             lambda m: {"model_weights_gib": float(m["w"]), "available_kv_cache_gib": float(m["kv"])}),
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
    _pattern("no_memory", None, r"No available memory for the cache blocks",
             lambda m: {"refused": True, "no_kv_memory": True}),
    _pattern("non_default_args", None, r"non-default args: (?P<args>\{.*\}?)", _read_args),
    _pattern("engine_config", None, r"Initializing an? (?:(?P<engine>V[01]) )?LLM engine \(v?(?P<version>[^)\s]+)\) "
             r"with config: (?P<rest>.*)", _read_engine_config),
    _pattern("using_max_model_len", None, r"Using max model len (?P<n>\d+)",
             lambda m: {"config.max_model_len": int(m["n"])}),
    _pattern("server_version", None, r"vLLM API server version (?P<v>\S+)|█ +version (?P<b>\d[\w.+-]*)",
             lambda m: {"vllm_version": m["v"] or m["b"]}),
)
# Figures about the KV cache itself: a log must have one of these to be explained.
KV_FIGURES = ("kv_cache_tokens", "num_gpu_blocks", "max_concurrency", "available_kv_cache_gib", "refused")
LOOKED_FOR = ("V1's 'Available KV cache memory: X GiB', 'GPU KV cache size: N tokens' (or 'CPU KV cache size'), "
              "'Maximum concurrency for N tokens per request: X.XXx'; V0's '# GPU blocks: N, # CPU blocks: M', "
              "'Memory profiling results: ... kv_cache_size=X GiB ...', '... the rest of the memory reserved for KV "
              "Cache is X GiB'; and the refusals 'The model's max seq len (N) is larger than the maximum number of "
              "tokens that can be stored in KV cache (M)', 'To serve at least one request with the model's max seq "
              "len (N), ...', 'No available memory for the cache blocks'")
V1_MARKERS = re.compile(r"\bEngineCore\b|\bV1 LLM engine\b|\bv1/")


@dataclass(frozen=True)
class Reading:
    """One figure read from one line."""

    figure: str
    value: object
    line: str
    worker: str | None
    engine: str | None  # the engine whose format the line is in, None if both printed it


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


def read_lines(text: str) -> list[Reading]:
    """Every figure of every known line, in the order of the log."""
    lines = [c for c in map(clean_line, text.splitlines()) if c is not None and c.message]
    readings: list[Reading] = []
    found = set()
    for line in lines:
        for pattern in PATTERNS:
            m = pattern.regex.search(line.message)
            if m is None:
                continue
            found.add(pattern.name)
            for figure, value in pattern.read(m).items():
                readings.append(Reading(figure, value, excerpt(line.text, figure), line.worker, pattern.engine))
    # A long message wrapped over several lines in a paste (the refusal, typically): look across lines too.
    joined = "\n".join(line.message for line in lines)
    for pattern in PATTERNS:
        if pattern.name in found or pattern.name in ("non_default_args", "engine_config", "profiling_v0"):
            continue
        m = pattern.regex.search(joined)
        if m is not None:
            snippet = " ".join(m.group(0).split())
            readings += [Reading(f, v, snippet, None, pattern.engine) for f, v in pattern.read(m).items()]
    return readings


REPORTED = ("kv_cache_tokens", "num_gpu_blocks", "num_cpu_blocks", "block_size", "max_concurrency",
            "max_concurrency_tokens_per_request", "available_kv_cache_gib", "model_weights_gib", "max_model_len",
            "total_gpu_memory_gib", "gpu_memory_utilization", "estimated_max_model_len", "needed_kv_cache_gib",
            "model")


@dataclass(frozen=True)
class StartupLog:
    """What a vLLM startup log says about its KV cache. Sizes are per GPU (per worker), as vLLM prints them.

    ``lines`` maps each figure to the line it was read from; ``derived`` maps a figure that no line states
    (block_size, num_gpu_blocks) to how it was worked out from the others; ``per_worker`` holds every
    occurrence of a figure printed more than once, in order, with the process that printed it.
    """

    format: str  # "v1" or "v0": which engine printed the log
    kv_cache_tokens: int | None = None
    kv_cache_device: str | None = None  # "GPU", "CPU", "cuda", ...
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    block_size: int | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens_per_request: int | None = None
    available_kv_cache_gib: float | None = None
    model_weights_gib: float | None = None
    max_model_len: int | None = None
    total_gpu_memory_gib: float | None = None
    gpu_memory_utilization: float | None = None
    refused: bool = False
    no_kv_memory: bool = False
    needed_kv_cache_gib: float | None = None
    estimated_max_model_len: int | None = None
    model: str | None = None
    vllm_version: str | None = None
    settings: dict = field(default_factory=dict)  # engine settings the log states, in vLLM's names
    lines: dict = field(default_factory=dict)
    derived: dict = field(default_factory=dict)
    per_worker: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "format": self.format, "kv_cache_tokens": self.kv_cache_tokens, "kv_cache_device": self.kv_cache_device,
            "num_gpu_blocks": self.num_gpu_blocks, "num_cpu_blocks": self.num_cpu_blocks,
            "block_size": self.block_size, "max_concurrency": self.max_concurrency,
            "max_concurrency_tokens_per_request": self.max_concurrency_tokens_per_request,
            "available_kv_cache_gib": self.available_kv_cache_gib, "model_weights_gib": self.model_weights_gib,
            "max_model_len": self.max_model_len, "total_gpu_memory_gib": self.total_gpu_memory_gib,
            "gpu_memory_utilization": self.gpu_memory_utilization, "refused": self.refused,
            "needed_kv_cache_gib": self.needed_kv_cache_gib, "estimated_max_model_len": self.estimated_max_model_len,
            "model": self.model, "vllm_version": self.vllm_version, "settings": dict(self.settings),
            "lines": dict(self.lines), "derived": dict(self.derived),
            "per_worker": {k: list(v) for k, v in self.per_worker.items()},
        }

    @property
    def device(self) -> str:
        device = self.kv_cache_device or "GPU"
        return device.upper() if device.lower() in ("cuda", "gpu", "cpu", "xpu", "tpu", "hpu", "npu") else device

    @property
    def available_kv_bytes(self) -> int | None:
        """The KV cache budget in bytes: exact when --kv-cache-memory-bytes was given, else from the printed GiB."""
        exact = self.settings.get("kv_cache_memory_bytes")
        if isinstance(exact, int) and exact > 0:
            return exact
        return None if self.available_kv_cache_gib is None else round(self.available_kv_cache_gib * GIB)


def _engine_format(readings: list[Reading], text: str) -> str:
    engines = {r.engine for r in readings if r.engine is not None and r.figure in KV_FIGURES}
    if "v1" in engines or V1_MARKERS.search(text) or "V1 LLM engine" in text:
        return "v1"
    if "v0" in engines:
        return "v0"
    # Only the concurrency line: V1 prints the length with thousands separators, V0 as a bare number.
    per_request = next((r for r in readings if r.figure == "max_concurrency_tokens_per_request"), None)
    if per_request is not None and per_request.value >= 1000 and "," not in per_request.line:
        return "v0"
    return "v1"


def parse_vllm_log(text: str) -> StartupLog:
    """The KV cache figures of a vLLM startup log (see the module docstring for the lines it reads).

    Raises KvlabError naming the lines it looked for when the text has none of them."""
    if not text.strip():
        raise KvlabError(f"the log is empty; paste vLLM's startup log, which has lines such as {LOOKED_FOR}")
    readings = read_lines(text)
    if not any(r.figure in KV_FIGURES for r in readings):
        seen = sorted({r.figure.split(".")[-1] for r in readings})
        has = f" (it has only {', '.join(seen)})" if seen else ""
        raise KvlabError(f"no vLLM KV cache line found{has}; looked for {LOOKED_FOR}. vLLM prints them once the "
                         "model is loaded and profiled: paste the log up to 'Maximum concurrency' (or the error)")
    first: dict = {}
    lines: dict = {}
    per_worker: dict = {}
    for r in readings:
        if r.figure not in first:
            first[r.figure], lines[r.figure] = r.value, r.line
        per_worker.setdefault(r.figure, []).append({"worker": r.worker, "value": r.value, "line": r.line})
    settings = {k.split(".", 1)[1]: v for k, v in first.items() if k.startswith("config.")}
    settings.update({k.split(".", 1)[1]: v for k, v in first.items() if k.startswith("settings.")
                     and not (k == "settings.dtype" and v == "auto" and "dtype" in settings)})
    # The arguments' line before the engine config's: it is what the user typed.
    setting_lines = {k.split(".", 1)[1]: v for k, v in lines.items() if k.startswith("config.")}
    setting_lines.update({k.split(".", 1)[1]: v for k, v in lines.items() if k.startswith("settings.")})
    return _assemble(_engine_format(readings, text), first, lines, setting_lines, settings, per_worker)


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


def v1_num_tokens(num_blocks: int, block_size: int, max_model_len: int) -> int:
    """V1's token figure for a full-attention model: int(max_concurrency x max_model_len)
    (kv_cache_utils.get_kv_cache_capacity), in the same float operations."""
    return int(num_blocks / cdiv(max_model_len, block_size) * max_model_len)


def _implied_block_size(fmt: str, blocks, tokens, max_model_len, concurrency) -> tuple[int, str] | None:
    if blocks and tokens and tokens % blocks == 0 and (tokens // blocks) & (tokens // blocks - 1) == 0:
        return tokens // blocks, f"{tokens:,} tokens / {blocks:,} blocks"
    if fmt == "v0" and blocks and max_model_len and concurrency is not None:
        # V0: Maximum concurrency = num_gpu_blocks x block_size / max_model_len (executor_base.py)
        fits = [bs for bs in (8, 16, 32, 64, 128, 256) if round(blocks * bs / max_model_len, 2) == concurrency]
        if len(fits) == 1:
            return fits[0], (f"the only block size with {blocks:,} blocks x block_size / {max_model_len:,} = "
                             f"{concurrency:.2f}x")
    return None


def _assemble(fmt: str, first: dict, lines: dict, setting_lines: dict, settings: dict, per_worker: dict) -> StartupLog:
    lines = {k: v for k, v in lines.items() if k in REPORTED}
    derived: dict = {}
    max_model_len = first.get("max_concurrency_tokens_per_request") or first.get("max_model_len") \
        or settings.get("max_model_len")
    if "max_model_len" not in lines and max_model_len is not None:
        lines["max_model_len"] = lines.get("max_concurrency_tokens_per_request") or setting_lines.get("max_model_len")
    for name in ("model", "block_size", "gpu_memory_utilization"):
        if name not in lines and name in setting_lines:
            lines[name] = setting_lines[name]
    blocks, tokens = first.get("num_gpu_blocks"), first.get("kv_cache_tokens")
    block_size = settings.get("block_size")
    if block_size is None:
        implied = _implied_block_size(fmt, blocks, tokens, max_model_len, first.get("max_concurrency"))
        if implied is not None:
            block_size, derived["block_size"] = implied
    if blocks is None and tokens and block_size and max_model_len and fmt == "v1":
        per_request = cdiv(max_model_len, block_size)
        guess = round(tokens * per_request / max_model_len)
        if v1_num_tokens(guess, block_size, max_model_len) == tokens:
            blocks = guess
            derived["num_gpu_blocks"] = (f"{tokens:,} tokens x {per_request:,} blocks per request / {max_model_len:,} "
                                         "tokens per request (a full-attention model)")
    if tokens is None and blocks and block_size and fmt == "v0":
        tokens = blocks * block_size
        derived["kv_cache_tokens"] = f"{blocks:,} blocks x {block_size} tokens"
    repeated = {k: [{"worker": e["worker"], "value": e["value"]} for e in v] for k, v in per_worker.items()
                if k in REPORTED and len(v) > 1}
    return StartupLog(
        format=fmt, kv_cache_tokens=tokens, kv_cache_device=first.get("kv_cache_device"), num_gpu_blocks=blocks,
        num_cpu_blocks=first.get("num_cpu_blocks"), block_size=block_size,
        max_concurrency=first.get("max_concurrency"),
        max_concurrency_tokens_per_request=first.get("max_concurrency_tokens_per_request"),
        available_kv_cache_gib=first.get("available_kv_cache_gib"), model_weights_gib=first.get("model_weights_gib"),
        max_model_len=max_model_len, total_gpu_memory_gib=first.get("total_gpu_memory_gib"),
        gpu_memory_utilization=first.get("gpu_memory_utilization", settings.get("gpu_memory_utilization")),
        refused=bool(first.get("refused", False)), no_kv_memory=bool(first.get("no_kv_memory", False)),
        needed_kv_cache_gib=first.get("needed_kv_cache_gib"), estimated_max_model_len=first.get(
            "estimated_max_model_len"), model=settings.get("model"), vllm_version=first.get("vllm_version"),
        settings=settings, lines=lines, derived=derived, per_worker=repeated,
    )


# --- the explanation --------------------------------------------------------------------------------------

def _gib(x: float) -> str:
    return f"{x:,.2f} GiB"


def _lesson_lines(log: StartupLog, block_size: int, assumed: bool) -> list[str]:
    """Tokens -> blocks of block_size tokens -> conversations at the full length, in the log's own figures."""
    out = []
    tokens, blocks, length, device = log.kv_cache_tokens, log.num_gpu_blocks, log.max_model_len, log.device
    per_gpu = " per GPU" if (log.settings.get("tensor_parallel_size") or 1) > 1 else ""
    if log.available_kv_cache_gib is not None and not log.refused:
        left = (f"after the model weights ({_gib(log.model_weights_gib)})" if log.model_weights_gib is not None
                else "after the model weights")
        text = (f"Available KV cache memory, {_gib(log.available_kv_cache_gib)}{per_gpu}: what vLLM had left for "
                f"the KV cache {left}, the activations of a profiling run and other memory")
        if device == "CPU":
            text = (f"KV cache memory, {_gib(log.available_kv_cache_gib)}: on a CPU the budget is set, not "
                    "measured (--kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE)")
        if tokens:
            bytes_total = log.available_kv_bytes
            per_token = bytes_total / tokens
            text += (f"; at {per_token:,.0f} bytes of keys and values per token" if per_token == int(per_token)
                     else f"; at about {per_token:,.0f} bytes of keys and values per token")
            text += f" it holds {tokens:,} tokens"
        out.append(text + ".")
    bs_note = f" (block_size {block_size} assumed: the log does not say; it is vLLM's default)" if assumed else ""
    if tokens and blocks:
        if log.derived.get("kv_cache_tokens"):
            out.append(f"{device} KV cache: {blocks:,} blocks of {block_size} tokens{bs_note} = {tokens:,} tokens "
                       "(the keys and values of that many tokens fit at once).")
        else:
            out.append(f"{device} KV cache size, {tokens:,} tokens: the keys and values of {tokens:,} tokens fit at "
                       f"once. vLLM hands them out in blocks of {block_size} tokens{bs_note}: {tokens:,} / "
                       f"{block_size} = {blocks:,} blocks.")
    elif tokens:
        out.append(f"{device} KV cache size, {tokens:,} tokens: in blocks of {block_size} tokens{bs_note}, "
                   f"{tokens / block_size:,.1f} blocks.")
    if length and blocks and not log.refused:
        per_request = cdiv(length, block_size)
        fit = blocks / per_request
        text = (f"One conversation at the full length, max_model_len {length:,} tokens, takes {length:,} / "
                f"{block_size} = {per_request:,} blocks{'' if length % block_size == 0 else ' (rounded up)'}, so "
                f"{blocks:,} / {per_request:,} = {fit:,.2f} such conversations fit at once")
        if log.max_concurrency is None or round(fit, 2) == log.max_concurrency:
            text += (f": that is vLLM's 'Maximum concurrency ... {log.max_concurrency:.2f}x'."
                     if log.max_concurrency is not None else ".")
        else:
            text += (f"; vLLM says {log.max_concurrency:.2f}x because some layers keep only a sliding window (or "
                     "are not attention), so a conversation needs fewer blocks than its full length.")
        out.append(text)
        if fit >= 1 and length >= 4 * block_size:
            short = max(block_size, length // 8)
            out.append(f"Shorter conversations take fewer blocks: at {short:,} tokens ({cdiv(short, block_size):,} "
                       f"blocks) each, {blocks // cdiv(short, block_size):,} fit at once.")
    elif length and log.max_concurrency is not None and not log.refused:
        out.append(f"{log.max_concurrency:.2f} conversations at the full length of {length:,} tokens fit at once "
                   "(vLLM's 'Maximum concurrency').")
    out += _refusal_lines(log, block_size)
    return out


def _refusal_lines(log: StartupLog, block_size: int) -> list[str]:
    if not log.refused:
        return []
    length = log.max_model_len
    if log.no_kv_memory:
        return [("vLLM refused to start: nothing was left for the KV cache after the weights and activations. "
                 "Give it more memory (--gpu-memory-utilization, --tensor-parallel-size) or a smaller model.")]
    need = f"{length:,} / {block_size} = {cdiv(length, block_size):,} blocks" if length else "its blocks"
    if log.needed_kv_cache_gib is not None:
        need += f", {_gib(log.needed_kv_cache_gib)}"
    have = []
    if log.kv_cache_tokens:
        have.append(f"{log.kv_cache_tokens:,} tokens")
    if log.available_kv_cache_gib is not None:
        have.append(_gib(log.available_kv_cache_gib))
    longest = log.estimated_max_model_len or log.kv_cache_tokens
    fix = f"--max-model-len {longest} or less" if longest else "a smaller --max-model-len"
    return [(f"vLLM refused to start: one conversation at the full length of {length:,} tokens needs {need} of KV "
             f"cache, and only {' = '.join(have) or 'less'} fit. Fix: {fix}, or more memory for the cache "
             "(--gpu-memory-utilization, --tensor-parallel-size, --kv-cache-dtype fp8).")]


def _worker_lines(log: StartupLog) -> list[str]:
    out = []
    names = {"available_kv_cache_gib": "available KV cache memory", "kv_cache_tokens": "KV cache size",
             "num_gpu_blocks": "blocks", "model_weights_gib": "model weights"}
    for figure, label in names.items():
        entries = log.per_worker.get(figure, [])
        if len(entries) < 2:
            continue
        values = [e["value"] for e in entries]
        workers = sorted({e["worker"] for e in entries if e["worker"]})
        who = f" by {len(workers)} processes" if len(workers) > 1 else ""
        if len(set(values)) == 1:
            out.append(f"The {label} line appears {len(values)} times{who} (once per worker or KV cache config), "
                       "all with the same figure.")
        else:
            out.append(f"The {label} differs between workers ({', '.join(f'{v:,}' for v in values)}): vLLM sizes "
                       "the cache by the smallest; the first is shown.")
    return out


# --- kvlab's own calculation beside vLLM's ---------------------------------------------------------------

def resolve_model(log: StartupLog, model: str | None):
    """(ModelSpec or None, where it came from or why there is none). ``model``: --model, a catalogue name,
    config.json or Hugging Face id; otherwise the model the log names, if it is in the catalogue or a local
    config.json (never fetched: a pasted log must not send kvlab online)."""
    from kvlab.catalog.config import load_config_path, looks_like_path
    from kvlab.catalog.models import find_catalogue_model, get_model

    if model is not None:
        return get_model(model), f"--model {model}"
    name = log.model
    if not name:
        return None, "the log does not name the model (give --model NAME or a config.json)"
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
    return None, (f"{name!r}, which the log names, is not in kvlab's catalogue (give --model NAME, a config.json, or "
                  "a Hugging Face id)")


def _sizing_config(log: StartupLog, available_kv_bytes: int):
    from kvlab.sizing import KV_CACHE_DTYPES, MODEL_DTYPES, SizingConfig

    s = log.settings
    dtype = s.get("dtype") if s.get("dtype") in MODEL_DTYPES else "auto"
    kv_dtype = s.get("kv_cache_dtype") if s.get("kv_cache_dtype") in KV_CACHE_DTYPES else "auto"
    return SizingConfig(
        available_kv_bytes=max(1, available_kv_bytes), block_size=log.block_size or DEFAULT_BLOCK_SIZE,
        max_model_len=log.max_model_len, dtype=dtype, kv_cache_dtype=kv_dtype,
        tensor_parallel_size=s.get("tensor_parallel_size") or 1, pipeline_parallel_size=s.get("pipeline_parallel_size")
        or 1, max_num_batched_tokens=s.get("max_num_batched_tokens"), max_num_seqs=s.get("max_num_seqs"),
    )


def _budget(log: StartupLog, bytes_per_block: int) -> tuple[int, int, int, str] | None:
    """(low, middle, high) KV cache bytes per GPU consistent with the log, and what they come from."""
    override = log.settings.get("num_gpu_blocks_override")
    if isinstance(override, int) and override > 0:
        exact = override * bytes_per_block
        return exact, exact, exact, f"num_gpu_blocks_override={override} x {bytes_per_block:,} B per block"
    exact = log.settings.get("kv_cache_memory_bytes")
    if isinstance(exact, int) and exact > 0:
        return exact, exact, exact, f"kv_cache_memory_bytes={exact:,} (the arguments)"
    gib = log.available_kv_cache_gib
    if gib is not None and gib > 0:
        low, high = max(1, round((gib - GIB_ROUNDING) * GIB)), round((gib + GIB_ROUNDING) * GIB) - 1
        return low, round(gib * GIB), high, f"{gib} GiB as printed (rounded to 0.01 GiB)"
    if log.num_gpu_blocks and "num_gpu_blocks" not in log.derived:
        exact = log.num_gpu_blocks * bytes_per_block
        return exact, exact, exact, f"the log's {log.num_gpu_blocks:,} blocks x {bytes_per_block:,} B per block"
    return None


def _figures(log: StartupLog, result) -> dict:
    """What vLLM would print for kvlab's block count: V1's formulas, or V0's (blocks x block_size)."""
    if log.format == "v0":
        tokens = result.num_blocks * result.block_size
        return {"num_gpu_blocks": result.num_blocks, "kv_cache_tokens": tokens,
                "max_concurrency": tokens / result.max_model_len}
    return {"num_gpu_blocks": result.num_blocks, "kv_cache_tokens": result.num_tokens,
            "max_concurrency": result.max_concurrency}


LABELS = {"num_gpu_blocks": "blocks", "kv_cache_tokens": "KV cache size (tokens)",
          "max_concurrency": "maximum concurrency", "estimated_max_model_len": "longest max_model_len that fits"}


def _compare(figure: str, vllm, mid, low, high) -> tuple[str, str | None]:
    """('equal' | 'within rounding' | 'differs', the difference as a sentence)."""
    if figure == "max_concurrency":
        same = round(mid, 2) == vllm
        inside = round(low, 2) <= vllm <= round(high, 2)
        show = (f"{mid:.2f}x", f"{vllm:.2f}x", f"{low:.2f}x-{high:.2f}x")
    else:
        same, inside = mid == vllm, low <= vllm <= high
        show = (f"{mid:,}", f"{vllm:,}", f"{low:,}-{high:,}")
    if same:
        return "equal", None
    if inside:
        return "within rounding", None
    spread = "" if low == high else f" (the printed KV cache memory allows {show[2]})"
    return "differs", (f"{LABELS[figure]}: kvlab {show[0]}, vLLM {show[1]}{spread}; check the block size, dtype, "
                       "--kv-cache-dtype and parallelism kvlab assumed")


def kvlab_calculation(log: StartupLog, spec, source: str) -> dict:
    """kvlab.sizing's figures for this log's budget and settings, beside vLLM's, with the differences."""
    from dataclasses import replace

    from kvlab.sizing import size_kv_cache

    probe = size_kv_cache(spec, _sizing_config(log, GIB))
    budget = _budget(log, probe.bytes_per_block)
    side = {"model": spec.id, "model_source": source, "block_size": probe.block_size, "dtype": probe.dtype,
            "kv_cache_dtype": probe.kv_cache_dtype, "tensor_parallel_size": probe.tensor_parallel_size,
            "max_model_len": probe.max_model_len, "kv_bytes_per_token_per_gpu": probe.kv_bytes_per_token_per_gpu,
            "page_size_bytes": probe.page_size_bytes, "bytes_per_block": probe.bytes_per_block,
            "blocks_per_request": probe.blocks_per_request}
    if budget is None:
        side["note"] = "the log gives no KV cache memory or block count to size from"
        return {"kvlab": side, "comparison": [], "differences": []}
    low_b, mid_b, high_b, how = budget
    results = [size_kv_cache(spec, replace(_sizing_config(log, b))) for b in (low_b, mid_b, high_b)]
    low, mid, high = (_figures(log, r) for r in results)
    side.update(available_kv_bytes=mid_b, available_kv_source=how, **mid,
                estimated_max_model_len=results[1].estimated_max_model_len,
                refused=not results[1].fits_max_model_len, vllm_log_lines=list(results[1].vllm_log_lines))
    if low_b != high_b:
        side["range"] = {k: [low[k], high[k]] for k in mid}
    comparison, differences = [], []
    stated = {k: getattr(log, k) for k in mid if getattr(log, k) is not None and k not in log.derived}
    if log.refused and log.estimated_max_model_len is not None:
        stated["estimated_max_model_len"] = log.estimated_max_model_len
        mid["estimated_max_model_len"] = results[1].estimated_max_model_len
        low["estimated_max_model_len"] = results[0].estimated_max_model_len
        high["estimated_max_model_len"] = results[2].estimated_max_model_len
    for figure, vllm in stated.items():
        status, difference = _compare(figure, vllm, mid[figure], low[figure], high[figure])
        comparison.append({"figure": figure, "vllm": vllm, "kvlab": mid[figure], "status": status})
        if difference:
            differences.append(difference)
    if side["refused"] != log.refused:
        differences.append(f"vLLM {'refused' if log.refused else 'started'}, but kvlab's arithmetic says it would "
                           f"{'start' if log.refused else 'refuse'}")
    return {"kvlab": side, "comparison": comparison, "differences": differences}


def explain_vllm_log(log: StartupLog, model: str | None = None) -> dict:
    """The lesson's explanation of ``log`` ("lines"), and, when the model is known (``model``: a catalogue
    name, config.json or Hugging Face id; else the log's own), kvlab's calculation beside vLLM's ("kvlab",
    "comparison") and the differences beyond the log's rounding ("differences", empty when they agree)."""
    assumed = log.block_size is None
    block_size = log.block_size or DEFAULT_BLOCK_SIZE
    out: dict = {"lines": _lesson_lines(log, block_size, assumed) + _worker_lines(log)}
    spec, source = resolve_model(log, model)
    out["model_source"] = source
    if spec is None:
        out["lines"].append(f"kvlab's own calculation needs the model: {source}.")
        return out
    try:
        out.update(kvlab_calculation(log, spec, source))
    except KvlabError as exc:
        if model is not None:
            raise
        out["lines"].append(f"kvlab cannot size {spec.id} with this log's settings: {exc}.")
        return out
    side = out["kvlab"]
    if out["comparison"]:
        verdict = ("agrees with vLLM on every figure" if not out["differences"] else
                   f"differs from vLLM: {'; '.join(out['differences'])}")
        out["lines"].append(f"kvlab's own arithmetic for {spec.id} ({side['kv_bytes_per_token_per_gpu']:,} bytes per "
                            f"token per GPU, {side['bytes_per_block']:,} per block of {side['block_size']}) "
                            f"{verdict}.")
    return out

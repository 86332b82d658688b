"""A vLLM startup log's KV cache figures, as one value: ``parse_vllm_log(text) -> StartupLog``.

The first occurrence of each figure is reported (every one is in ``per_worker``); figures no line states are
worked out where vLLM's arithmetic allows it, and said to be (``derived``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvlab.errors import KvlabError
from kvlab.vllm.log.lines import KV_FIGURES, LOOKED_FOR_BRIEFLY, SEEN_LABELS, V1_MARKERS, Reading, read_lines

GIB = 2**30

REPORTED = ("kv_cache_tokens", "num_gpu_blocks", "num_cpu_blocks", "block_size", "max_concurrency",
            "max_concurrency_tokens_per_request", "available_kv_cache_gib", "model_weights_gib", "max_model_len",
            "total_gpu_memory_gib", "gpu_memory_utilization", "estimated_max_model_len", "needed_kv_cache_gib",
            "model", "refused", "activation_gib", "non_torch_gib", "weights_and_non_torch_gib", "cuda_graph_gib",
            "estimated_cuda_graph_gib", "non_kv_cache_gib", "requested_memory_gib", "free_on_startup_gib",
            "cuda_graphs_profiled", "estimated_cuda_graph_share", "failed_start")
# The encoder's profiling run of a multimodal model: its encoder cache budget (tokens), the items and their modality.
ENCODER_PROFILE = ("encoder_budget_tokens", "encoder_profile_items", "encoder_profile_modality")
# vLLM's CUDA-graph estimate where it prints how it was made: the graphs profiled (PIECEWISE + FULL) and the
# estimate as a share of the card's total ('--gpu-memory-utilization=U is equivalent to ... =E': U - E).
CUDA_GRAPH_PROFILE = ("cuda_graphs_profiled", "estimated_cuda_graph_share")
# The memory profile's terms, as vLLM printed them (GiB per GPU); None where the log does not print one.
PROFILE_TERMS = ("activation_gib", "non_torch_gib", "weights_and_non_torch_gib", "cuda_graph_gib",
                 "estimated_cuda_graph_gib", "non_kv_cache_gib", "requested_memory_gib", "free_on_startup_gib")


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
    failed_start: bool = False  # the engine said it failed to start ('EngineCore failed to start'; its line in lines)
    no_kv_memory: bool = False
    needed_kv_cache_gib: float | None = None
    estimated_max_model_len: int | None = None
    model: str | None = None
    vllm_version: str | None = None
    # The memory profile's lines (gpu_worker.py): the torch peak increase of the profiling run, non-torch memory,
    # weights + non-torch where one figure is printed for both, CUDA graphs (captured, or the pool after capture),
    # their estimate deducted before the cache (0.21 on), all non-KV memory, and total x utilization.
    activation_gib: float | None = None
    non_torch_gib: float | None = None
    weights_and_non_torch_gib: float | None = None
    cuda_graph_gib: float | None = None
    estimated_cuda_graph_gib: float | None = None
    non_kv_cache_gib: float | None = None
    requested_memory_gib: float | None = None
    free_on_startup_gib: float | None = None  # 'Free memory on device (F/T GiB) on startup': F
    encoder_budget_tokens: int | None = None
    encoder_profile_items: int | None = None
    encoder_profile_modality: str | None = None  # image, video, audio
    cuda_graphs_profiled: int | None = None
    estimated_cuda_graph_share: float | None = None  # of the total memory
    settings: dict = field(default_factory=dict)  # engine settings the log states, in vLLM's names
    typed_args: tuple[str, ...] | None = None  # the arguments the user gave ('non-default args'); None: no such line
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
            "failed_start": self.failed_start,
            "needed_kv_cache_gib": self.needed_kv_cache_gib, "estimated_max_model_len": self.estimated_max_model_len,
            "model": self.model, "vllm_version": self.vllm_version,
            **{name: getattr(self, name) for name in PROFILE_TERMS},
            **{name: getattr(self, name) for name in ENCODER_PROFILE},
            **{name: getattr(self, name) for name in CUDA_GRAPH_PROFILE}, "settings": dict(self.settings),
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
        raise KvlabError(f"the log is empty; paste vLLM's startup log, which has lines such as {LOOKED_FOR_BRIEFLY}")
    readings = read_lines(text)
    if not any(r.figure in KV_FIGURES for r in readings):
        seen = sorted({SEEN_LABELS.get(r.pattern, r.pattern) for r in readings})
        has = f" (only {' and '.join(seen)})" if seen else ""
        raise KvlabError(f"no vLLM KV cache line found{has}; looked for {LOOKED_FOR_BRIEFLY} (every line read: "
                         "docs/vllm.md). vLLM prints them once the model is loaded and profiled: paste the log up to "
                         "'Maximum concurrency' (or the error)")
    kv_lines = [r for r in readings if r.figure in KV_FIGURES]
    if not any(r.in_log_line for r in kv_lines):  # (trial 55: a README's example comment was read as a log)
        raise KvlabError(f"no vLLM log line found: the KV cache figure in {kv_lines[0].line.strip()[:120]!r} is quoted "
                         "inside other text, not a line vLLM printed. A log's lines start with vLLM's message, "
                         "after its own prefix ('(EngineCore_DP0 pid=N) INFO MM-DD hh:mm:ss [file.py:N] ') or a "
                         "paste's marks; give vLLM's startup log (what `vllm serve` prints while it starts)")
    _refuse_impossible(readings)
    first: dict = {}
    lines: dict = {}
    kind: dict = {}
    per_worker: dict = {}
    for r in readings:
        if r.figure not in first:
            first[r.figure], lines[r.figure], kind[r.figure] = r.value, r.line, r.pattern
        if r.pattern == kind[r.figure]:  # the same line again, not another line with a related figure
            per_worker.setdefault(r.figure, []).append({"worker": r.worker, "value": r.value, "line": r.line})
    settings = {k.split(".", 1)[1]: v for k, v in first.items() if k.startswith("config.")}
    settings.update({k.split(".", 1)[1]: v for k, v in first.items() if k.startswith("settings.")
                     and not (k == "settings.dtype" and v == "auto" and "dtype" in settings)})
    # The arguments' line before the engine config's: it is what the user typed.
    setting_lines = {k.split(".", 1)[1]: v for k, v in lines.items() if k.startswith("config.")}
    setting_lines.update({k.split(".", 1)[1]: v for k, v in lines.items() if k.startswith("settings.")})
    return _assemble(_engine_format(readings, text), first, lines, setting_lines, settings, per_worker)


# The most tokens (or blocks) a log's KV cache figure can give: 2^53. No GPU holds that many tokens' keys and values
# (at one byte a token, 8 PiB), and vLLM from 0.21 prints the tokens as int(maximum concurrency x max_model_len), a
# float's product, exact only below it (trial 58, finding 16: 99999999999999999999999 tokens was explained).
MOST_KV_FIGURE = 2**53


def _refuse_impossible(readings: list[Reading]) -> None:
    """A figure vLLM cannot print (its max_model_len is at least 1 token; a KV cache below MOST_KV_FIGURE) is an
    edited or corrupted log."""
    for r in readings:
        if r.figure == "max_concurrency_tokens_per_request" and r.value < 1:
            raise KvlabError(f"the log's line {r.line.strip()!r} gives a length of {r.value} tokens per request, which "
                             "vLLM never prints (max_model_len is at least 1); paste the line as vLLM printed it")
        if r.figure in ("kv_cache_tokens", "num_gpu_blocks") and r.value >= MOST_KV_FIGURE:
            what = "tokens" if r.figure == "kv_cache_tokens" else "blocks"
            raise KvlabError(f"the log's line {r.line.strip()[:120]!r} gives {r.value:,} {what}, which vLLM never "
                             f"prints: kvlab reads at most {MOST_KV_FIGURE - 1:,} (2^53 - 1), more than any GPU holds "
                             "(at one byte a token, 8 PiB) and the most vLLM's arithmetic gives exactly; paste the "
                             "line as vLLM printed it")


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


def v1_num_tokens(num_blocks: int, block_size: int, max_model_len: int) -> int:
    """V1's token figure for a full-attention model: int(max_concurrency x max_model_len)
    (kv_cache_utils.get_kv_cache_capacity), in the same float operations."""
    return int(num_blocks / cdiv(max_model_len, block_size) * max_model_len)


def blocks_from_tokens(tokens: int, block_size: int, max_model_len: int) -> int | None:
    """The block count behind V1's token figure, for a full-attention model; None if no count gives it."""
    guess = round(tokens * cdiv(max_model_len, block_size) / max_model_len)
    return guess if v1_num_tokens(guess, block_size, max_model_len) == tokens else None


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


# vLLM's multiprocessing executor names each worker by its ranks: Worker[_DP<d>][_PP<p>][_TP<t>][_DCP<c>][_EP<e>]
# (Worker_TP1, Worker_PP0, Worker_PP1_TP0), a rank left out where its size is 1.
WORKER_RANKS = re.compile(r"^Worker(?:_DP\d+)?(?:_PP(?P<pp>\d+))?(?:_TP(?P<tp>\d+))?(?:_|\s|$)")


def _parallel_from_workers(per_worker: dict) -> dict[str, tuple[int, str]]:
    """The tensor and pipeline parallel sizes the workers' names show (the highest rank seen + 1), with how, where a
    log's arguments do not state them (a two-GPU log read as one GPU was refused for weights twice one GPU's; trial
    53b). At least that many: an excerpt may leave a worker's lines out."""
    highest = {"tensor_parallel_size": -1, "pipeline_parallel_size": -1}
    names = sorted({e["worker"].split(" ")[0] for entries in per_worker.values() for e in entries if e["worker"]})
    for name in names:
        m = WORKER_RANKS.match(name)
        if m is None:
            continue
        for size, group in (("tensor_parallel_size", "tp"), ("pipeline_parallel_size", "pp")):
            if m[group] is not None:
                highest[size] = max(highest[size], int(m[group]))
    workers = [n for n in names if WORKER_RANKS.match(n)]
    return {size: (rank + 1, f"the workers' names ({', '.join(workers)}): ranks 0 to {rank}")
            for size, rank in highest.items() if rank >= 1}


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
    for name, (size, how) in _parallel_from_workers(per_worker).items():
        if name not in settings:  # (the arguments, where they say it, come first)
            settings = {**settings, name: size}
            derived[name] = how
    blocks, tokens = first.get("num_gpu_blocks"), first.get("kv_cache_tokens")
    block_size = settings.get("block_size")
    if block_size is None:
        implied = _implied_block_size(fmt, blocks, tokens, max_model_len, first.get("max_concurrency"))
        if implied is not None:
            block_size, derived["block_size"] = implied
    if blocks is None and tokens and block_size and max_model_len and fmt == "v1":
        blocks = blocks_from_tokens(tokens, block_size, max_model_len)
        if blocks is not None:
            derived["num_gpu_blocks"] = (f"{tokens:,} tokens x {cdiv(max_model_len, block_size):,} blocks per "
                                         f"request / {max_model_len:,} tokens per request (a full-attention model)")
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
        refused=bool(first.get("refused", False)), failed_start=bool(first.get("failed_start", False)),
        no_kv_memory=bool(first.get("no_kv_memory", False)),
        needed_kv_cache_gib=first.get("needed_kv_cache_gib"), estimated_max_model_len=first.get(
            "estimated_max_model_len"), model=settings.get("model"), vllm_version=first.get("vllm_version"),
        settings=settings, typed_args=first.get("typed_args"), lines=lines, derived=derived, per_worker=repeated,
        **{name: first.get(name) for name in PROFILE_TERMS}, **{name: first.get(name) for name in ENCODER_PROFILE},
        **{name: first.get(name) for name in CUDA_GRAPH_PROFILE},
    )

"""Every option of a run, declared once: its name (vLLM's), type, range, default and help.

    OPTIONS ──▶ cli/options.py   the command line's flags (``--block-size``, ``-tp``), generated from them
            ├─▶ validate.py      one check per option, one message, whatever face the value came from
            ├─▶ web/params.py    the lab's parameters (the same names, narrower ranges where the page bounds work)
            ├─▶ sweep/grid.py    the options a sweep can vary, their types (the store's columns)
            └─▶ config/resolve   ``resolve(options)``: every default filled in, names made canonical (KvlabConfig)

As vLLM's ``EngineArgs`` (vllm/engine/arg_utils.py) are declared once as dataclass fields and
``EngineArgs.add_cli_args`` turns them into flags, a kvlab option is one ``Option`` here. A default of None means
"resolved": vLLM's default for the model and GPU (``max_num_seqs``), the model's own (``max_model_len``), or what
the sizing gives (``num_gpu_blocks``); the help says which.

The groups are the resolved configuration's parts (vLLM's ModelConfig, ParallelConfig, CacheConfig,
SchedulerConfig; kvlab's CostConfig and WorkloadConfig).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GROUPS = ("model", "device", "parallel", "router", "gateway", "cache", "scheduler", "cost", "workload", "sessions")

# Resolved defaults of the workload: requests per second for a source without arrival times of its own, and how
# many requests a bundled source serves.
DEFAULT_RATE = 4.0
DEFAULT_NUM_REQUESTS = 1000


@dataclass(frozen=True, slots=True)
class Option:
    """One option. ``lo``/``hi`` bound a number (``lo_open``: lo itself is refused); ``choices`` a string;
    ``what`` says what the number counts, for the message ('tokens per block'); ``default_text`` is how the help
    states a resolved default ('vLLM's for the GPU: 256 or 1024')."""

    name: str
    group: str
    kind: type
    default: Any
    help: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    what: str = ""
    choices: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()  # other spellings on the command line: -tp, -n
    default_text: str = ""
    nullable: bool = False  # None is a value of its own (not "resolve it"): --preemption-mode's "the strategy's"

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def flags(self) -> tuple[str, ...]:
        return (self.flag, *self.aliases)

    @property
    def optional(self) -> bool:
        """None is allowed (a resolved default, or a value of its own)."""
        return self.default is None or self.nullable


# Draft tokens per step where --num-speculative-tokens is not given and the method is not mtp: kvlab's own choice.
# vLLM has no such default: its SpeculativeConfig.num_speculative_tokens "will default to the number in the draft
# model config if present, otherwise, it is required" (vllm/config/speculative.py), and that number, n_predict, is
# set for MTP drafts only (hf_config_override: num_nextn_predict_layers, or Qwen3.5/3.6's mtp_num_hidden_layers).
OTHER_DRAFT_TOKENS = 3


# The --speculative-method values a run takes (the simulator's proposers, kvlab.spec); `kvlab size` and `kvlab fit`
# take those whose cache kvlab sizes (kvlab.sizing.SPECULATIVE_METHODS). Each face's help lists its own set, from
# here (fix 55: size's help listed eagle and draft_model, which it refuses).
SPECULATIVE_METHOD_CHOICES = ("ngram", "draft_model", "eagle", "mtp")


def in_words(values, last: str = "or") -> str:
    """'a, b or c'."""
    values = list(values)
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} {last} {values[-1]}"


def speculative_method_help(methods) -> str:
    """--speculative-method's help, naming exactly the ``methods`` a face takes."""
    return f"Speculative decoding's proposer, as vLLM's --speculative-config method: {in_words(methods)}."


def _options(*options: Option) -> dict[str, Option]:
    return {o.name: o for o in options}


OPTIONS: dict[str, Option] = _options(
    # --- model -------------------------------------------------------------------------------------------------
    Option("model", "model", str, "opt-13b", "Model: catalogue name, config.json, folder or HF id."),
    Option("dtype", "model", str, "auto", "Model dtype: auto, float16, bfloat16, float32.",
           choices=("auto", "float16", "half", "bfloat16", "float32", "float")),
    Option("quantization", "model", str, None, "Weight format when config.json names none: fp8, int8, gptq, awq, "
           "auto-round, mxfp4, nvfp4, bitsandbytes (vLLM's --quantization).", default_text="the checkpoint's"),
    Option("vllm_version", "model", str, None, "Whose startup arithmetic sizes the KV cache, e.g. 0.10.1 "
           "(docs/sizing.md lists what changed).", default_text="the newest kvlab knows"),
    # --- device ------------------------------------------------------------------------------------------------
    Option("gpu", "device", str, "a100-40gb", "GPU from the catalogue (its memory sizes the KV cache; its bandwidth "
           "and FLOP/s set the clock)."),
    Option("gpu_memory_gib", "device", float, None, "GPU memory in GiB, as CUDA reports it; replaces the GPU's.",
           lo=0.0, hi=100_000.0, lo_open=True, what="GiB of GPU memory as CUDA reports it", default_text="the GPU's"),
    # --- parallel ----------------------------------------------------------------------------------------------
    Option("tensor_parallel_size", "parallel", int, None, "GPUs that split each layer.", lo=1, hi=1024,
           what="GPUs", aliases=("-tp",), default_text="1; kvlab fit: the fewest that hold the model"),
    Option("pipeline_parallel_size", "parallel", int, 1, "GPUs that split the layers.", lo=1, hi=1024, what="GPUs",
           aliases=("-pp",)),
    Option("replicas", "parallel", int, 1, "Replicas of the engine behind a router, each with its own GPUs and KV "
           "cache, on one clock (vLLM's data-parallel size; a fleet).", lo=1, hi=4096,
           what="replicas of the engine"),
    # A disaggregated fleet (kvlab.disagg, docs/disaggregation.md): prefill and decode replicas, the KV's link.
    Option("prefill_replicas", "parallel", int, None, "Replicas that only compute prompts, in a disaggregated fleet "
           "(xPyD, vLLM's disaggregated prefilling): each request's KV then crosses a link to a decode replica "
           "(--decode-replicas).", lo=1, hi=4096, what="prefill replicas", default_text="off"),
    Option("decode_replicas", "parallel", int, None, "Replicas that generate the answers from the KV the prefill "
           "replicas send, in a disaggregated fleet (with --prefill-replicas).", lo=1, hi=4096,
           what="decode replicas", default_text="off"),
    Option("kv_transfer_bandwidth", "parallel", float, None, "GB/s a direction of the link a disaggregated fleet's "
           "KV crosses.", lo=0.01, hi=1e6, what="GB/s",  # (from 10 MB/s, a slow network's: below it nothing serves)
           default_text="the GPU's link in the catalogue (NVLink, else PCIe)"),
    Option("kv_transfer_latency", "parallel", float, None, "Seconds each KV transfer of a disaggregated fleet takes "
           "before its bytes flow.", lo=0.0, hi=3600.0, what="seconds",
           default_text="0 (the catalogue has no latency figure)"),
    # --- router (a fleet of replicas) ----------------------------------------------------------------------------
    Option("router", "router", str, "round-robin", "How a fleet's router picks a replica for each arrival, from the "
           "replicas' state at that instant: round-robin, random, least-requests (fewest running plus waiting), "
           "least-kv (lowest KV-cache use), prefix (the longest cached prefix of the prompt), weighted "
           "(--router-scorers).", choices=("round-robin", "random", "least-requests", "least-kv", "prefix",
                                            "weighted")),
    Option("router_scorers", "router", str, "prefix:2,least-kv:1,least-requests:1", "The weighted router's "
           "scorers: NAME:WEIGHT,... with NAME prefix, least-kv or least-requests (as llm-d's scheduler weighs "
           "them)."),
    # --- gateway (admission in front of the router, kvlab.fleet.admission: docs/admission.md) -------------------
    Option("rate_limit", "gateway", float, None, "Requests per second a gateway in front of the engine admits: a "
           "token bucket refilled at this rate, one token per request; a request that finds none waits in the "
           "gateway queue (--gateway-queue) or is rejected.", lo=0.0, hi=1e9, lo_open=True,
           what="requests per second", default_text="off"),
    Option("rate_limit_burst", "gateway", int, None, "Requests the gateway admits at once: the token bucket's size.",
           lo=1, hi=2**40, what="requests", default_text="1, with --rate-limit"),
    Option("gateway_queue", "gateway", int, None, "Requests that may wait at the gateway for a token, first come "
           "first served; one more is rejected (0: rejected at once, as a rate limiter's 429).", lo=0, hi=2**40,
           what="requests", default_text="0, with --rate-limit"),
    Option("gateway_queue_policy", "gateway", str, None, "The order the gateway queue releases requests in: fcfs, or "
           "priority (by each request's priority, smaller first, then arrival; --priority-classes).",
           choices=("fcfs", "priority"), default_text="fcfs, with --rate-limit"),
    # --- cache -------------------------------------------------------------------------------------------------
    Option("gpu_memory_utilization", "cache", float, 0.9, "Fraction of GPU memory vLLM may use, in (0, 1].",
           lo=0.0, hi=1.0, lo_open=True, what="the fraction of GPU memory vLLM may use"),
    Option("block_size", "cache", int, 16, "Tokens per KV cache block (vLLM's CUDA attention backends take "
           "multiples of 16; the simulator takes any).", lo=1, hi=2**20, what="tokens per block"),
    Option("kv_cache_dtype", "cache", str, "auto", "auto (the model dtype), fp8, fp8_e4m3, fp8_e5m2, float16, "
           "bfloat16.", choices=("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")),
    Option("available_kv_gib", "cache", float, None, "The 'Available KV cache memory' vLLM printed, in GiB: "
           "replaces kvlab's estimate of the budget.", lo=0.0, hi=100_000.0, lo_open=True,
           what="GiB of KV cache vLLM printed",
           default_text="kvlab's estimate"),
    Option("num_gpu_blocks", "cache", int, None, "Fix the KV cache at this many blocks (vLLM's "
           "num_gpu_blocks_override), vLLM's null block included: 7425 gives 7424 usable.", lo=2, hi=2**40,
           what="blocks, vLLM's null block included", default_text="what the GPU leaves"),
    Option("swap_space", "cache", float, 4.0, "CPU swap space per GPU in GiB, for swap preemption.", lo=0.0,
           hi=100_000.0, what="GiB of CPU memory per GPU"),
    Option("kv_offloading_size", "cache", float, None, "GiB of CPU memory for a KV tier behind the GPU's, through "
           "vLLM's offloading connector (as `vllm serve --kv-offloading-size N --kv-offloading-backend native` "
           "sets it; summed over the tensor-parallel ranks): every block that fills is stored there, a prefix hit "
           "loads it back.", lo=0.0,
           hi=1e6, lo_open=True, what="GiB of CPU memory", default_text="off"),
    Option("cpu_memory_gib", "cache", float, None, "The machine's CPU memory in GiB, which bounds "
           "--kv-offloading-size, and a swapping strategy's --swap-space to 70% of it (vLLM's limit).", lo=0.0,
           hi=1e7, lo_open=True, what="GiB of CPU memory",
           default_text="the GPUs' reference server's"),
    # --- scheduler ---------------------------------------------------------------------------------------------
    Option("max_model_len", "scheduler", int, None, "Longest request in tokens, prompt + answer (32k: 32,000; 32K: "
           "32,768, as vLLM reads them).", lo=1, hi=2**34, what="tokens", default_text="the model's max_position_embeddings"),
    Option("max_num_seqs", "scheduler", int, None, "Requests per engine step.", lo=1, hi=2**20,
           what="requests per step", default_text="vllm serve's for the GPU: 256 or 1024"),
    Option("max_num_batched_tokens", "scheduler", int, None, "Tokens per engine step (32k, 32K as for "
           "--max-model-len).", lo=1, hi=2**34, what="tokens per step",
           default_text="vllm serve's for the GPU: 2048, 8192 or 16384"),
    Option("watermark", "scheduler", float, 0.0, "Fraction of the KV cache's blocks a request joining a running batch "
           "must leave free (vLLM's --watermark; 0, V1's default, is off).", lo=0.0, hi=0.999999,
           what="a fraction of the blocks, below 1"),
    Option("enable_chunked_prefill", "scheduler", bool, True, "Split long prompts over iterations (vLLM V1 always "
           "does)."),
    Option("preemption_mode", "scheduler", str, None, "recompute or swap.", choices=("recompute", "swap"),
           default_text="the strategy's, recompute", nullable=True),
    Option("scheduling_policy", "scheduler", str, "fcfs", "fcfs, or priority: the waiting queue by (priority, "
           "arrival), the lowest priority's latest arrival preempted first (vLLM's --scheduling-policy).",
           choices=("fcfs", "priority")),
    # vLLM's --speculative-config (kvlab.spec, docs/speculative.md): method, num_speculative_tokens, and the
    # acceptance a real engine would measure.
    Option("speculative_method", "scheduler", str, None, speculative_method_help(SPECULATIVE_METHOD_CHOICES),
           choices=SPECULATIVE_METHOD_CHOICES, default_text="off"),
    Option("num_speculative_tokens", "scheduler", int, None, "Draft tokens per request and step (vLLM's "
           "num_speculative_tokens), with --speculative-method.", lo=1, hi=64, what="draft tokens per step",
           default_text=f"with mtp the model's MTP layers, vLLM's documented default; else {OTHER_DRAFT_TOKENS}, "
           "kvlab's own (vLLM requires it)"),
    Option("spec_acceptance", "scheduler", str, None, "With --speculative-method: the chance a draft token is "
           "accepted, one for every position (0.7) or one per position (0.9/0.7/0.5), each given those before it "
           "were.", default_text="required with --speculative-method"),
    Option("speculative_model", "scheduler", str, None, "The draft model (--speculative-method draft_model only: "
           "ngram, eagle and mtp take none): a catalogue name other than the target, normally smaller; its active "
           "parameters over the target's price each draft pass (a larger draft is run, with a warning that drafting "
           "then costs more than it saves).",
           default_text="none"),
    # --- cost --------------------------------------------------------------------------------------------------
    Option("cost", "cost", str, None, "Cost profile that sets the clock: a name (kvlab cost) or a "
           ".toml/.json file (kvlab calibrate).", default_text="vllm-h100 on H100-SXM (fitted on real runs), "
           "roofline elsewhere"),
    # --- workload ----------------------------------------------------------------------------------------------
    Option("workload", "workload", str, "paper-sharegpt", "Named workload (see `kvlab workloads`) or a CSV/JSONL "
           "file with prompt_len, output_len[, arrival_time, max_tokens] (or Vidur's num_prefill_tokens, "
           "num_decode_tokens).", aliases=("-w",)),
    Option("rate", "workload", float, None, "Requests per second. Workloads without arrival times get Poisson "
           "arrivals at this rate; a trace keeps its own arrivals unless --rate is given, which rescales the whole "
           "trace's clock to it (its first N requests then arrive at their own stretch's pace, which may differ: "
           "docs/workloads.md).", lo=0.0, hi=1e9, lo_open=True, what="requests per second",
           default_text="4 for workloads without arrival times; a trace's own"),
    Option("arrival", "workload", str, "auto", "auto (a trace's own times, else Poisson), poisson, gamma, trace, "
           "burst (all at t=0).", choices=("auto", "trace", "poisson", "gamma", "burst")),
    Option("cv", "workload", float, 1.0, "Coefficient of variation of gamma inter-arrival times.", lo=0.0, hi=100.0,
           lo_open=True, what="the coefficient of variation of inter-arrival gaps"),
    Option("num_requests", "workload", int, None, "Serve the first N requests (with --duration: at most N of "
           "those arriving in its time, whichever limit comes first).", lo=1, hi=2**40, what="requests",
           aliases=("-n",), default_text="1000 unless --duration"),
    Option("duration", "workload", float, None, "Serve the requests arriving in the first this many seconds.",
           lo=0.0, hi=1e12, lo_open=True, what="seconds", default_text="none"),
    Option("seed", "workload", int, 0, "Random seed: same seed, same requests.", lo=0, hi=2**63 - 1, what="a seed"),
    Option("long_requests", "workload", str, "reject", "A request whose prompt + output exceeds --max-model-len: "
           "reject (vLLM: a too-long prompt is refused, an answer stops at max_model_len) or clip (Vidur: prompt "
           "and output scaled down to fit).", choices=("reject", "clip")),
    Option("priority_classes", "workload", str, None, "Each request's priority drawn from classes, "
           "PRIORITY:SHARE,... summing to 1 (0:0.2,1:0.8: a fifth at 0, the rest at 1; smaller served first under "
           "--scheduling-policy priority). A file's own priority column otherwise.",
           default_text="a file's priority column, else 0"),
    Option("timeout", "workload", str, None, "Seconds a client waits for its whole answer before giving up (the "
           "engine aborts the request, as vLLM does): SECONDS for every request, or PRIORITY:SECONDS,... per "
           "priority class.", default_text="no deadline"),
    # --- sessions (--workload sessions: multi-turn chat, kvlab/workload/sessions.py) ----------------------------
    Option("session_turns", "sessions", float, 4.0, "Mean turns per session.", lo=1.0, hi=10_000.0,
           what="turns per session"),
    Option("session_turns_dist", "sessions", str, "geometric", "geometric (after each turn the user goes on with "
           "probability 1 - 1/turns) or fixed.", choices=("geometric", "fixed")),
    Option("think_time", "sessions", float, 10.0, "Mean seconds from one turn's arrival to the next's.", lo=0.0,
           hi=1e9, what="seconds between a session's turns"),
    Option("think_time_dist", "sessions", str, "exponential", "exponential or fixed.",
           choices=("exponential", "fixed")),
    Option("session_lengths", "sessions", str, "paper-sharegpt", "The named workload whose rows give each turn's "
           "message and answer lengths."),
    Option("system_prompt_len", "sessions", int, 0, "Tokens of each shared system prompt (0: none).", lo=0,
           hi=2**30, what="tokens"),
    Option("num_system_prompts", "sessions", int, 1, "Distinct system prompts; each session draws one.", lo=1,
           hi=2**20, what="system prompts"),
    Option("system_prompt_share", "sessions", float, 1.0, "The share of sessions that open with a system prompt.",
           lo=0.0, hi=1.0, what="a share"),
    Option("max_context_len", "sessions", int, None, "A session ends before a turn that would exceed this many "
           "tokens.", lo=2, hi=2**34, what="tokens", default_text="--max-model-len"),
)

# What `kvlab size` and `kvlab fit` take: the options that decide the KV cache (an MTP drafter's layers take some).
SIZING_OPTIONS = ("gpu", "gpu_memory_gib", "tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization",
                  "block_size", "dtype", "kv_cache_dtype", "max_model_len", "max_num_batched_tokens", "max_num_seqs",
                  "available_kv_gib", "speculative_method", "num_speculative_tokens")
# Everything a simulation is configured by (`kvlab run`, `race`, a sweep point, the library's resolve()).
RUN_OPTIONS = tuple(OPTIONS)
WORKLOAD_OPTIONS = tuple(name for name, o in OPTIONS.items() if o.group in ("workload", "sessions"))
SESSION_OPTIONS = tuple(name for name, o in OPTIONS.items() if o.group == "sessions")
ENGINE_OPTIONS = tuple(name for name, o in OPTIONS.items() if name not in WORKLOAD_OPTIONS)


def defaults(names=RUN_OPTIONS) -> dict[str, Any]:
    """Each option's declared default (None: resolved when the configuration is)."""
    return {name: OPTIONS[name].default for name in names}


def draft_tokens_per_step(method: str | None, given: int | None, mtp_layers: int, valid: str) -> int | None:
    """The draft tokens per step of vLLM's speculative config, the one rule for every face (`kvlab run`, `size`,
    `fit`, a startup log's arguments). ``given``: --num-speculative-tokens (None: not given); ``mtp_layers``: the
    model's MTP layers (ModelSpec.num_nextn_predict_layers); ``valid``: the methods the face takes, for the refusal.

    Without a method there is no speculative config: a number given anyway is refused (vLLM's SpeculativeConfig
    refuses num_speculative_tokens without a method or draft model), None otherwise. Not given: with mtp, the
    model's MTP layers (vLLM's documented default, the draft config's n_predict; its source does not reach that
    default yet, vllm-project/vllm issue #55323, so a real server needs the number given); else OTHER_DRAFT_TOKENS,
    kvlab's own."""
    from kvlab.errors import KvlabError

    if method is None:
        if given is not None:
            raise KvlabError(f"--num-speculative-tokens {given} needs --speculative-method (without one there is no "
                             f"speculative decoding, and the number would be ignored); valid: --speculative-method "
                             f"{valid} with it, or neither")
        return None
    if given is not None:
        return given
    return mtp_layers if method == "mtp" and mtp_layers > 0 else OTHER_DRAFT_TOKENS

"""Measured runs as published: a workload spec, the engine's settings and the summary metrics a client measured.

The format is the calibration set's (../shared/data/real-vllm/trainval.json, whose README says what the runs are):

    {"experiments": [{"id": "64", "model": "Qwen/Qwen2.5-7B-Instruct", "hardware": "H100", "tp": 1,
                      "precision": "FP16", "total_kv_blocks": 65352, "max_num_seqs": 128,
                      "max_num_batched_tokens": 2048, "max_model_len": 4096,
                      "workload": {inference-perf shared_prefix fields, "stages": [{rate, duration}], ...},
                      "actual": {"summary": {"e2e_mean": 1772.3, ...}, "stage0": {...}, ...}}, ...]}

Metrics are milliseconds (a number, or a string with its unit: "57.8 ms", "0.0578 s"); ``actual`` holds
``summary`` (every request) and ``stage0``, ``stage1``, ... (the requests that arrived in that load stage). Every
mistake is one KvlabError line that names the run and the field.

A run served with a CPU tier behind the KV cache says so in ``cpu_offload`` (``_offload`` below), and
``cpu_kv_blocks`` then gives the tier's size as the benchmark measured it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvlab.errors import KvlabError
from kvlab.validate import NUMBER_TEXT
from kvlab.workload.inference_perf import SharedPrefixSpec, spec_from_dict

METRICS = ("e2e_mean", "e2e_p90", "e2e_p99", "ttft_mean", "ttft_p90", "ttft_p99", "itl_mean")
REQUIRED = ("id", "model", "hardware", "tp", "total_kv_blocks", "max_num_seqs", "max_num_batched_tokens",
            "max_model_len", "workload", "actual")
PRECISIONS = {"fp16": None, "bf16": None, "fp8": "fp8"}  # precision -> the weight format it implies
_UNITS = {"ms": 1e-3, "s": 1.0, "us": 1e-6, "µs": 1e-6}
# (the number as any of a file's numbers is written: kvlab.validate.NUMBER_TEXT; '5_0 ms' is refused, not 50 ms)
_NUMBER_WITH_UNIT = re.compile(rf"^\s*({NUMBER_TEXT.pattern})\s*(ms|s|us|µs)\s*$")
# Prompt tokens each request carries beyond system prompt + question (the calibration set's README: the real
# prompts measured 27-48 tokens longer, the tokenizer's round trip of random ids and BOS; the middle of the range).
PROMPT_OVERHEAD_TOKENS = 37
# cpu_offload as the public sim-to-real benchmark writes it: a boolean in its experiments.json manifest, "True" or
# "False" in its error_records.csv (inference-sim/sim-to-real-accuracy-validation, experiment/data_model.py; null in
# the calibration set: not recorded). Its runs with true served `vllm serve --kv-offloading-size 8
# --kv-offloading-backend native` (vLLM's OffloadingConnector, 8 GiB; docs/plans/2026-03-04-sim-to-real-accuracy-
# validation-design.md); vLLM's names of that backend, or a size in GiB, say the same. LMCache is another connector
# (its own chunking and disk tiers), which kvlab does not replay.
OFFLOAD_VALUES = {"false": False, "true": True, "native": True, "offloadingconnector": True}
BENCHMARK_OFFLOAD_GIB = 8.0
# The workload the calibration set's client sent, where it differs from the one the runs name. Their client was an
# inference-perf older than the names num_unique_system_prompts / num_users_per_system_prompt (aliases since its
# PR #311, 5 February 2026) and than enable_multi_turn_chat (PR #257, November 2025): it ignored those keys and ran
# its own defaults, 10 system prompts x 10 questions, single turn (100 prompts, shuffled once and sent in turn,
# inference_perf/datagen/shared_prefix_datagen.py). The client's own account of its configuration says so for the
# 16 runs of that harness published with it (inference-sim/training, default_args/*/results/config.yaml: num_groups
# 10, num_prompts_per_group 10, no multi-turn, against profiles asking 9x5, 10x5, 11x4 or 23x1 users with
# multi-turn), among them run 20260217-155451 of this set; and the runs' prompts do not grow round by round, as
# every multi-turn client's do (docs/cost.md, "The workload the runs used").
CLIENT_DEFAULTS: dict[str, Any] = {"num_groups": 10, "num_prompts_per_group": 10, "enable_multi_turn_chat": False}


def sent_workload(spec: SharedPrefixSpec) -> SharedPrefixSpec:
    """The workload the calibration set's client sent for a run that names ``spec`` (CLIENT_DEFAULTS): the same
    lengths and load, its default prompts."""
    return replace(spec, **CLIENT_DEFAULTS)


@dataclass(frozen=True)
class MeasuredRun:
    id: str
    model: str  # as the file names it (a Hugging Face id or a catalogue name)
    gpu: str
    tensor_parallel_size: int
    precision: str
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    workload: SharedPrefixSpec
    actual: MappingProxyType  # "summary" / "stage0" / ... -> metric -> seconds
    # vLLM's --kv-offloading-size in GiB: the CPU tier the run was served with (kvlab.offload); None, no tier.
    kv_offloading_size: float | None = None
    # The tier's blocks as vLLM counts them (CPUOffloadingSpec.num_blocks, one block of every layer and GPU), when the
    # run gives cpu_kv_blocks; None: from kv_offloading_size and the model's bytes per block (kvlab.offload.config).
    num_cpu_blocks: int | None = None

    @property
    def label(self) -> str:
        return f"{self.id} {self.model.rsplit('/', 1)[-1]} tp{self.tensor_parallel_size} {self.workload_name}"

    @property
    def workload_name(self) -> str:
        return str(self.actual.get("_workload_name", ""))

    def measured(self, group: str, metric: str) -> float:
        return self.actual[group][metric]

    @property
    def groups(self) -> tuple[str, ...]:
        """The metric groups to fit on: each stage when the run has more than one, else the whole run."""
        stages = tuple(f"stage{k}" for k in range(len(self.workload.stages)))
        if len(stages) > 1 and all(s in self.actual for s in stages):
            return stages
        return ("summary",)


def _seconds(value: Any, where: str) -> float:
    """A metric: a number of milliseconds, or a string with its unit."""
    if isinstance(value, bool):
        raise KvlabError(f"{where} = {value!r} is not a duration; valid: milliseconds, or a string like '57.8 ms'")
    if isinstance(value, int | float):
        seconds = float(value) * 1e-3
    elif isinstance(value, str):
        match = _NUMBER_WITH_UNIT.match(value)
        if match is None and re.fullmatch(r"\s*\S+?\s*(ms|s|us|µs)\s*", value):
            raise KvlabError(f"{where} = {value!r}: the number is not written in digits; valid: a number of "
                             f"milliseconds, or digits with one of {', '.join(_UNITS)} ('57.8 ms')")
        if match is None:
            raise KvlabError(f"{where} = {value!r}: unit not understood; valid: a number of milliseconds, or a "
                             f"number with one of {', '.join(_UNITS)} ('57.8 ms')")
        try:
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
        except ValueError:
            raise KvlabError(f"{where} = {value!r} is not a number") from None
    else:
        raise KvlabError(f"{where} = {value!r} is not a duration; valid: milliseconds, or a string like '57.8 ms'")
    if not math.isfinite(seconds) or seconds <= 0:
        raise KvlabError(f"{where} = {value!r} must be a positive, finite duration")
    return seconds


# Below these no served request's metric falls: a first token over HTTP takes at least a millisecond (the request
# parsed, tokenized, scheduled, one forward pass, the chunk streamed back), a decode step at least a tenth of one
# (one pass over the weights: a 1B model's 2 GB at 8 TB/s is 0.25 ms). A file below them holds seconds as ms.
LEAST_TTFT_S, LEAST_ITL_S = 1e-3, 1e-4


# A request's time is its first token's and one gap per further token: e2e = ttft + (n - 1) x its mean gap, with n
# at most the workload's output_len (max_tokens), so e2e_mean <= ttft_mean + output_len x itl_mean whether the ITL is
# averaged over tokens or over requests. The calibration set's 34 groups (shared/data/real-vllm/trainval.json) reach
# at most 0.998 of that; a client's own overheads (detokenizing, the last chunk) stay well within twice it.
E2E_SLACK = 2.0


def _check_plausible(metrics: Mapping[str, float], where: str, raw: dict, output_len: int) -> None:
    """A group's metrics as a real server's can be: each percentile at most the next, TTFT and one token's gap within
    E2E, E2E within what ``output_len`` tokens at the ITL allow (E2E_SLACK), and not below what any served request
    takes (a file in seconds read as milliseconds is one of these)."""
    for low, high, why in (("ttft_p90", "ttft_p99", "a p90 is at most the p99"),
                           ("e2e_p90", "e2e_p99", "a p90 is at most the p99"),
                           ("ttft_mean", "e2e_mean", "a first token comes before the end"),
                           ("ttft_p99", "e2e_p99", "a first token comes before the end"),
                           ("itl_mean", "e2e_mean", "the gap between two tokens is part of a request's time")):
        if metrics[low] > metrics[high]:
            raise KvlabError(f"{where}: {low} ({raw[low]!r}) is above {high} ({raw[high]!r}); valid: metrics of one "
                             f"set of requests, where {why}")
    for name, least in (("ttft_mean", LEAST_TTFT_S), ("itl_mean", LEAST_ITL_S)):
        if metrics[name] < least:
            value = raw[name]
            given, example = (f"{value!r}", f": {value:g} seconds is '{value:g} s'") if isinstance(value, int | float) \
                else (f"{value!r} ({metrics[name] * 1e3:.3g} ms)", "")
            raise KvlabError(f"{where}: {name} = {given} is below what any served request takes ({least * 1e3:g} ms); "
                             f"valid: milliseconds (a number is read as ms; seconds are written with their "
                             f"unit{example})")
    most = E2E_SLACK * (metrics["ttft_mean"] + output_len * metrics["itl_mean"])
    if metrics["e2e_mean"] > most:
        raise KvlabError(f"{where}: e2e_mean ({raw['e2e_mean']!r}) is more than {E2E_SLACK:g} x (ttft_mean + "
                         f"output_len {output_len:,} x itl_mean) = {most * 1e3:,.1f} ms, longer than any request of "
                         "this workload can take; valid: every metric in the same unit (a number is read as ms)")


def _whole(raw: dict, key: str, where: str, minimum: int = 1) -> int:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not float(value).is_integer() \
            or value < minimum:
        raise KvlabError(f"{where}: {key} = {value!r}; valid: a whole number >= {minimum}")
    return int(value)


def run_from_dict(raw: Any, where: str, prompt_overhead_tokens: int = PROMPT_OVERHEAD_TOKENS) -> MeasuredRun:
    if not isinstance(raw, dict):
        raise KvlabError(f"{where}: a run is an object, got {type(raw).__name__}")
    where = f"{where} (run {raw.get('id', '?')!r})"
    for key in REQUIRED:
        if key not in raw or raw[key] is None:
            raise KvlabError(f"{where}: missing field {key!r}; a measured run has {', '.join(REQUIRED)}")
    kv_offloading_size, num_cpu_blocks = _offload(raw, where)
    precision = str(raw.get("precision") or "FP16")
    if precision.lower() not in PRECISIONS:
        raise KvlabError(f"{where}: precision {precision!r} is not one kvlab prices; valid: "
                         f"{', '.join(p.upper() for p in PRECISIONS)}")
    actual_raw = raw["actual"]
    if not isinstance(actual_raw, dict) or "summary" not in actual_raw:
        raise KvlabError(f"{where}: missing field 'actual.summary' (the metrics over every request)")
    workload = spec_from_dict(raw["workload"], f"{where}: workload", prompt_overhead_tokens=prompt_overhead_tokens)
    if workload.output_len < 2:  # (before its metrics: such a run's itl_mean is 0, which is refused for any other)
        raise KvlabError(f"{where}: workload output_len {workload.output_len}: a prefill-only run (one output token) "
                         "has no inter-token latency, and kvlab's fit cannot use it at all, its E2E and TTFT "
                         "included: the fit prices each run's decode over the output_len - 1 tokens after the first "
                         "(kvlab.cost.fit), none here; valid: runs with output_len 2 or more (leave this one out)")
    actual: dict[str, Any] = {}
    for group, metrics in actual_raw.items():
        if not isinstance(metrics, dict):
            raise KvlabError(f"{where}: actual.{group} must map metrics to values, got {metrics!r}")
        missing = [m for m in METRICS if m not in metrics]
        if missing:
            raise KvlabError(f"{where}: missing field 'actual.{group}.{missing[0]}'; each group has "
                             f"{', '.join(METRICS)}")
        actual[group] = MappingProxyType({m: _seconds(metrics[m], f"{where}: actual.{group}.{m}") for m in METRICS})
        _check_plausible(actual[group], f"{where}: actual.{group}", metrics, workload.output_len)
    actual["_workload_name"] = str(raw["workload"].get("name", "")) if isinstance(raw["workload"], dict) else ""
    return MeasuredRun(
        id=str(raw["id"]), model=str(raw["model"]), gpu=str(raw["hardware"]),
        tensor_parallel_size=_whole(raw, "tp", where), precision=precision,
        num_gpu_blocks=_whole(raw, "total_kv_blocks", where, 2), max_num_seqs=_whole(raw, "max_num_seqs", where),
        max_num_batched_tokens=_whole(raw, "max_num_batched_tokens", where),
        max_model_len=_whole(raw, "max_model_len", where, 2), workload=workload,
        actual=MappingProxyType(actual), kv_offloading_size=kv_offloading_size, num_cpu_blocks=num_cpu_blocks,
    )


def _offload(raw: dict, where: str) -> tuple[float | None, int | None]:
    """(--kv-offloading-size GiB, vLLM's num_cpu_blocks or None) of a run's cpu_offload and cpu_kv_blocks; (None, None)
    without a tier. A run without one keeps its cpu_kv_blocks unread, as before."""
    value = raw.get("cpu_offload")
    if value is None or isinstance(value, bool) or isinstance(value, str) and value.strip().lower() in OFFLOAD_VALUES:
        on = OFFLOAD_VALUES[value.strip().lower()] if isinstance(value, str) else bool(value)
        size_gib = BENCHMARK_OFFLOAD_GIB if on else None
    elif isinstance(value, int | float) and math.isfinite(value) and value >= 0:
        size_gib = float(value) or None  # (0 GiB: no tier, as vLLM's kv_offloading_size unset)
    else:
        raise KvlabError(f"{where}: cpu_offload {value!r}: kvlab replays vLLM's native CPU tier only (the "
                         "OffloadingConnector; not LMCache or disk); valid: null or false (no tier), true, 'native', "
                         "'OffloadingConnector', or its size in GiB")
    if size_gib is None or not raw.get("cpu_kv_blocks"):
        return size_gib, None
    cpu_kv_blocks = _whole(raw, "cpu_kv_blocks", where, 0)
    tp = _whole(raw, "tp", where)
    # The benchmark's cpu_kv_blocks is cpu_bytes_to_use (vllm.log's kv_connector_extra_config: --kv-offloading-size,
    # summed over the ranks) over one GPU's share of a block (its experiment/kv_cache_extractor.py: "Available KV
    # cache memory" / "GPU KV cache size" tokens x 16): 9,362 for Qwen2.5-7B at tp 1 and 8 GiB, 6,553 for
    # Mistral-Nemo-12B at tp 2 (3,276 at tp 1). vLLM sizes the tier over a block of every rank
    # (vllm/v1/kv_offload/cpu.py, CPUOffloadingSpec: page size x layers x world_size), so it holds 1/tp of that.
    if cpu_kv_blocks < tp:
        raise KvlabError(f"{where}: cpu_kv_blocks = {cpu_kv_blocks} at tp {tp} is less than one CPU block of every GPU; "
                         "valid: 0 (the tier sized from its GiB) or at least tp")
    return size_gib, cpu_kv_blocks // tp


def read_runs(path: str | Path, prompt_overhead_tokens: int = PROMPT_OVERHEAD_TOKENS) -> tuple[MeasuredRun, ...]:
    """Every run of a measured-runs file (JSON: {"experiments": [...]} or a list of runs)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KvlabError(f"measured runs {str(path)!r}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KvlabError(f"measured runs {str(path)!r}: cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        raise KvlabError(f"measured runs {str(path)!r} is not valid JSON: {exc}") from None
    runs = data.get("experiments") if isinstance(data, dict) else data
    if not isinstance(runs, list) or not runs:
        raise KvlabError(f"measured runs {str(path)!r}: no runs (an 'experiments' list of runs, or a list)")
    out = tuple(run_from_dict(raw, f"{path.name}, run {i}", prompt_overhead_tokens) for i, raw in enumerate(runs))
    ids = [r.id for r in out]
    duplicate = next((i for i in ids if ids.count(i) > 1), None)
    if duplicate is not None:
        raise KvlabError(f"measured runs {str(path)!r}: run id {duplicate!r} appears twice; valid: one id per run")
    return out


def catalogue_model(run: MeasuredRun):
    """The catalogue's model for a run: its name as given, or the repository's last part; FP8 runs need an FP8
    entry (the weight bytes differ)."""
    from kvlab.catalog import get_model

    try:
        spec = get_model(run.model)
    except KvlabError:
        try:
            spec = get_model(run.model.rsplit("/", 1)[-1])
        except KvlabError:
            raise KvlabError(f"run {run.id!r}: model {run.model!r} is not in kvlab's catalogue (kvlab models); add "
                             "its config.json numbers to src/kvlab/catalog/data/models.json") from None
    wanted = PRECISIONS[run.precision.lower()]
    if (spec.quantization or None) != wanted:
        raise KvlabError(f"run {run.id!r}: precision {run.precision} but the catalogue's {spec.id} stores weights "
                         f"as {spec.quantization or spec.dtype}; valid: a catalogue entry in that precision")
    return spec

"""Every input's physical sense, checked in one place: config.json fields, catalogue entries, workload rows, the
serving options of the CLI and the lab's parameters, and the size of the work they ask for.

The shapes are pydantic models; their errors become kvlab's one-line ``KvlabError`` naming the bad value and what
would be valid, spelled as the caller spells it (``--gpu-memory-gib`` for the CLI, ``rate`` for the lab, the
field name for a config.json). The CLI, the lab and the library (``SizingConfig``, ``spec_from_fields``,
``read_user_file``, ``load_workload``) all call these functions.

Bounded work: what a run or a sizing would cost is estimated before it starts (``check_work``); beyond the limits
below it is refused with the estimate, unless the caller allows it (``allow_large_work``, the CLI's ``--yes``).
"""

from __future__ import annotations

import math
import os
import re
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from kvlab.errors import KvlabError

GIB = 2**30

# Limits of the work one command may start without --yes. A million request-runs take about a minute on the
# benchmark machine (benchmarks/README.md) and ~2 KiB of memory each (records, iteration log, Request objects).
WORK_LIMITS = {
    "max_request_runs": 1_000_000,  # requests x strategies
    "max_memory_bytes": 4 * GIB,
    "max_num_layers": 4096,  # no published model has more than a few hundred; parameters are counted per layer
    "max_num_blocks": 10_000_000,  # a paged pool keeps its free blocks in a list: ~40 B and ~1 us of setup each
}
BYTES_PER_REQUEST = 2048
# Environment overrides, for operators and tests (a small limit shows the gate without a huge run).
LIMIT_ENV = {"max_request_runs": "KVLAB_MAX_REQUEST_RUNS", "max_memory_bytes": "KVLAB_MAX_MEMORY_BYTES",
             "max_num_layers": "KVLAB_MAX_NUM_LAYERS", "max_num_blocks": "KVLAB_MAX_NUM_BLOCKS"}

_large_work_allowed: ContextVar[bool] = ContextVar("large_work_allowed", default=False)


class TooMuchWork(KvlabError):
    """A request beyond the work limits: the message gives the estimate and the flag that allows it."""


# --- value types -----------------------------------------------------------------------------------------

# A number as a file's cell (CSV, or a string in JSON) is written: decimal digits with a point and an exponent at
# most, a minus sign at most, spaces around it. Python's int() and float() also take '5_0' (as 50), '+5', 'inf',
# and YAML 1.1 reads 010 as 8: none of them is how a person or a program writes a request's numbers, so a cell
# written so is refused (naming it), not read as another number. Every reader of a user's file with numbers asks
# this (cell_number): workload rows and their session, priority and timeout columns, the inference-perf YAML.
NUMBER_TEXT = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
# A whole number in a cell: digits, a minus sign at most; 5.0 too (what a spreadsheet writes of a whole column with
# an empty cell), never 1e3.
WHOLE_CELL_TEXT = re.compile(r"-?[0-9]+(?:\.0*)?")


def cell_number(value: Any, *, whole: bool = False) -> float | int:
    """A JSON or CSV number: int, float or a string written in digits (NUMBER_TEXT; WHOLE_CELL_TEXT when
    ``whole``), read exactly (an int where the text has no point); never a bool. Raises ValueError saying why."""
    if value is None:
        raise ValueError("is missing")
    if isinstance(value, bool):
        raise ValueError("is a boolean, not a number")  # noqa: TRY004 (pydantic reports ValueErrors only)
    if isinstance(value, str):
        text = value.strip()
        if not (WHOLE_CELL_TEXT if whole else NUMBER_TEXT).fullmatch(text):
            if text.lower().lstrip("+-") in ("inf", "infinity", "nan"):
                raise ValueError("is not a finite number")
            raise ValueError("is not a whole number written in digits (such as 512)" if whole else
                             "is not a number written in digits (such as 12, 0.5 or 1.5e-3)")
        value = int(text) if WHOLE_NUMBER_TEXT.fullmatch(text) else float(text)
    if not isinstance(value, (int, float)):
        raise ValueError(f"is not a number (a {type(value).__name__})")  # noqa: TRY004
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("is not a finite number")
    return value


# A file of options' number (--config, --grid), the one rule for YAML and TOML (fix 55: YAML refused 1_000, which TOML
# takes): TOML's decimal integer, digits grouped by single underscores (1_000 is 1,000; 1__000, _1 and 1_ are not
# numbers), a sign at most, no leading 0 but 0 itself; a real number the same digits with a point. The TOML reader
# (tomllib) reads them so; decimal_yaml_loader reads YAML's numbers by these.
_DIGIT_GROUPS = r"[0-9](?:_?[0-9])*"
FILE_INT_TEXT = re.compile(r"[-+]?(?:0|[1-9](?:_?[0-9])*)")
FILE_FLOAT_TEXT = re.compile(rf"[-+]?(?:(?:0|[1-9](?:_?[0-9])*)(?:\.(?:{_DIGIT_GROUPS})?)?|\.{_DIGIT_GROUPS})")


def decimal_yaml_loader():
    """YAML's safe loader with numbers read as a TOML file's are (FILE_INT_TEXT, FILE_FLOAT_TEXT: decimal digits,
    grouped by underscores at most), for any reader of a user's YAML (--config, --grid, the inference-perf
    configuration's): YAML 1.1, which PyYAML reads, takes 010 as 8, 0x10 as 16, 1:30 as 90 and 5__0 as 50; here they
    stay strings, which the fields refuse by name."""
    import yaml

    class DecimalLoader(yaml.SafeLoader):
        pass

    number_tags = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    DecimalLoader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in number_tags]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    # (a leading 0 only alone or before the point: YAML 1.1 reads 010 as octal, YAML 1.2 as ten, TOML refuses it;
    # YAML 1.1's int and float constructors drop the underscores, as TOML does)
    DecimalLoader.add_implicit_resolver(number_tags[0], re.compile(f"^{FILE_INT_TEXT.pattern}$"), list("+-0123456789"))
    # (an exponent keeps its text: 1e3 is a count nowhere, as on the command line, and a real number's reader,
    # cell_number, takes the text; YAML 1.1 also reads 1e3 as text, and 1.0e+3 as a number)
    DecimalLoader.add_implicit_resolver(number_tags[1], re.compile(f"^{FILE_FLOAT_TEXT.pattern}$"),
                                        list("+-.0123456789"))
    return DecimalLoader


def inference_perf_number(value: Any, *, whole: bool = False) -> float | int:
    """A number of an inference-perf YAML file (read with decimal_yaml_loader), as inference-perf itself reads it
    (PyYAML's YAML 1.1, then pydantic's lax int or float) where that is unambiguous: '2' and 2.0 are 2, 1_0 is 10,
    1e1 is 10.0 for a rate. A count written 1e1 (inference-perf refuses it), a number with a leading 0 (YAML 1.1
    reads 010 as octal 8, kvlab's --config as 10) or in hex raise ValueError saying why and the valid form."""
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"-?0[0-7_]*[0-7]", text) and int(text) != int(text, 8):
            decimal, octal = int(text), int(text, 8)
            raise ValueError(f"has a leading 0: YAML 1.1, which inference-perf reads with, takes it as octal {octal}, "
                             f"kvlab's --config as {decimal}; valid: {decimal} or {octal}, without the leading 0")
        if re.fullmatch(r"-?[1-9][0-9]*(?:_[0-9]+)+", text):  # (YAML 1.1, pydantic and Python all read 1_0 as 10)
            return int(text)
        if re.fullmatch(r"-?0[xX][0-9a-fA-F]+", text):
            raise ValueError(f"is hexadecimal; valid: {int(text, 16)}, in decimal digits")
        if whole and NUMBER_TEXT.fullmatch(text) and not WHOLE_CELL_TEXT.fullmatch(text):
            number = float(text)
            raise ValueError(f"is not a whole number as inference-perf reads a count (it takes no exponent or "
                             f"fraction there); valid: {int(number) if number.is_integer() else 'a whole number'}")
    number = cell_number(value, whole=whole)
    if whole and isinstance(number, float):
        if not number.is_integer():
            raise ValueError("is not a whole number; valid: a whole number such as 512")
        return int(number)
    return number


def _number(value: Any) -> float | int:
    return cell_number(value)


# A whole number as a person types it, on the command line or in the lab's page and query strings: digits, a minus
# sign at most. Python's int() also takes '5_0', '+5' and ' 5', and a float reading takes '1e3': none of them is
# typed for a count (the CLI refused '1e3' and took '5_0' as 50). The CLI's whole-number options (kvlab.cli) and the
# lab's (kvlab.web.params) both ask this; a file's cell (CSV, JSON) may still be written 5.0 (WHOLE_CELL_TEXT).
WHOLE_NUMBER_TEXT = re.compile(r"-?[0-9]+")


def whole_number_text(text: str) -> bool:
    """Whether ``text`` is a whole number written as a person types one (WHOLE_NUMBER_TEXT), nothing around it."""
    return WHOLE_NUMBER_TEXT.fullmatch(text) is not None


def whole_number_problem(text: str, *, vllm_int: bool = False) -> str | None:
    """Why ``text`` is not a whole number as a person types one (whole_number_text), and what is valid; None where it
    is one. '5_0', '+5' and ' 5', which Python's int() reads, are not written in digits (valid: 50); '4096.0', which
    a float reading takes and vLLM's int() refuses, is not a whole number. ``vllm_int``: an option vLLM reads as a
    human-readable integer, whose valid forms include 32k and 32K."""
    if whole_number_text(text):
        return None
    valid = VLLM_INT_FORMS if vllm_int else "a whole number such as 16"
    try:
        return f"not written in digits; valid: {int(text)}"
    except ValueError:
        return f"not a whole number; valid: {valid}"


# vLLM's human-readable integers (vllm.engine.arg_utils.human_readable_int), which `vllm serve` takes for
# --max-model-len, --max-num-batched-tokens and --kv-cache-memory-bytes: lower-case k, m, g, t are powers of 1000
# (25.6k is 25,600; a fraction is cut, as vLLM's int() cuts it), upper-case K, M, G, T powers of 1024 (of a whole
# number only: vLLM refuses 1.5K). kvlab reads these options' values as vLLM does, from its command line and from a
# startup log's non-default args.
VLLM_HUMAN_READABLE_INT_ARGS = ("max_model_len", "max_num_batched_tokens", "kv_cache_memory_bytes")
# kvlab's own options that are a length in tokens beside --max-model-len (`kvlab size/fit --context-len`): read as
# --max-model-len is, so that 8k means the same on both.
HUMAN_READABLE_INT_OPTIONS = (*VLLM_HUMAN_READABLE_INT_ARGS, "context_len")
_VLLM_HUMAN_READABLE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([kKmMgGtT])")
_VLLM_MULTIPLIERS = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


# The engine's other whole-number options, which vLLM's argparse reads with int() (its type=int), as
# human_readable_int reads a value without a suffix: int() takes '2_048', '+2048' and ' 2048' as 2048, so kvlab takes
# them for these options as `vllm serve` does (vllm_reads_int); kvlab's own options stay digits only.
# (decode_context_parallel_size: vLLM's -dcp; kvlab's --num-gpu-blocks, vLLM's num_gpu_blocks_override by another
# name, stays kvlab's.)
VLLM_INT_ARGS = ("block_size", "tensor_parallel_size", "pipeline_parallel_size", "max_num_seqs",
                 "decode_context_parallel_size")


def vllm_reads_int(text: str, human_readable: bool) -> int | None:
    """``text`` as `vllm serve` reads a whole-number option, the one rule for every engine option: with
    ``human_readable`` (VLLM_HUMAN_READABLE_INT_ARGS) its human_readable_int, 32k (32,000) and 32K (32,768), else
    int(); otherwise int() (argparse's type=int), which also takes '2_048', '+2048' and ' 2048'. None where vLLM
    refuses the text; ValueError for a fraction with a binary suffix (vllm_human_readable_int)."""
    if human_readable:
        number = vllm_human_readable_int(text)
        if number is not None:
            return number
    try:
        return int(text.strip())
    except ValueError:
        return None


# What vLLM's human-readable integers may be written as, for a refusal's "valid:".
VLLM_INT_FORMS = "a whole number in digits (4096), or 32k (32,000) / 32K (32,768) as vLLM reads them"
VLLM_AUTO_MAX_MODEL_LEN = ("vLLM's auto (the longest length the KV cache holds) is not taken here: `kvlab fit` answers "
                           f"it; valid: {VLLM_INT_FORMS}")


def vllm_human_readable_int(text: str) -> int | None:
    """``text`` as vLLM's human_readable_int reads it where it has a suffix (32k: 32,000; 32K: 32,768), None where it
    has none (plain digits are every whole number's: whole_number_text). Raises ValueError, saying what vLLM
    means, for a fraction with a binary suffix (1.5K)."""
    match = _VLLM_HUMAN_READABLE.fullmatch(text.strip())
    if match is None:
        return None
    number, suffix = match.groups()
    multiplier = _VLLM_MULTIPLIERS[suffix]
    if suffix.islower():
        return int(float(number) * multiplier)
    if "." in number:
        raise ValueError(f"vLLM takes a fraction with a decimal suffix only (k, m, g, t: powers of 1000), not with "
                         f"{suffix} (a power of 1024); valid: {number}{suffix.lower()} "
                         f"({int(float(number) * 10 ** (3 * 'KMGT'.index(suffix) + 3)):,}) or a whole number of "
                         f"{suffix}")
    return int(number) * multiplier


def vllm_int(text: str, name: str) -> int:
    """A value of an option vLLM reads with human_readable_int (VLLM_HUMAN_READABLE_INT_ARGS), given as text (a query
    parameter, a sweep's list item), read as `vllm serve` reads it: digits (4096), or 32k (32,000) / 32K (32,768).
    Anything else raises KvlabError naming ``name``, the value and the valid forms; vLLM's -1 / auto for max_model_len
    is pointed at `kvlab fit`, which answers it."""
    given = text.strip()
    if name.lstrip("-").replace("-", "_") == "max_model_len" and given.lower() in ("auto", "-1"):
        raise KvlabError(f"{name} {text!r}: {VLLM_AUTO_MAX_MODEL_LEN}")
    if whole_number_text(given):
        return int(given)
    try:
        number = vllm_reads_int(given, human_readable=True)
    except ValueError as exc:
        raise KvlabError(f"{name} {text!r}: {exc}") from None
    if number is None:
        raise KvlabError(f"{name} {text!r} is not a whole number; valid: {VLLM_INT_FORMS}")
    return number


def _whole(value: Any) -> int:
    number = cell_number(value, whole=True)
    if isinstance(number, float):
        if not number.is_integer():
            raise ValueError("is not a whole number")
        return int(number)
    return number


def _finite(value: Any) -> float:
    try:
        return float(_number(value))
    except OverflowError:  # (an int of more digits than a float holds)
        raise ValueError("is not a finite number") from None


# A bound past any a machine reaches (a count's hi): the message says only the lower bound.
UNBOUNDED = 2**40


def Count(lo: int, hi: int, what: str):  # a type factory, named like a type
    """A whole number in [lo, hi]; ``what`` says what it counts, for the message."""
    text = f"≥ {lo:,}" if hi >= UNBOUNDED else f"from {lo:,} to {hi:,}"
    return Annotated[int, BeforeValidator(_whole), Field(ge=lo, le=hi, description=f"{what}, a whole number {text}")]


def Real(lo: float, hi: float, what: str, *, lo_open: bool = True):
    """A finite number in (lo, hi] (or [lo, hi] with ``lo_open=False``)."""
    bound = Field(gt=lo, le=hi) if lo_open else Field(ge=lo, le=hi)
    low = f"> {lo:g}" if lo_open else f"≥ {lo:g}"
    high = f"{int(hi):,}" if float(hi).is_integer() else f"{hi:g}"
    return Annotated[float, BeforeValidator(_finite), bound, Field(description=f"{what}, a number {low} and "
                                                                               f"≤ {high}")]


def _problem(error: dict) -> str:
    kind = error["type"]
    if kind == "value_error":
        return str(error["ctx"]["error"])
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return "is out of range"
    if kind == "missing":
        return "is missing"
    return error["msg"][0].lower() + error["msg"][1:]


def _parse(model: type[BaseModel], data: dict, name_of, where: str = "") -> BaseModel:
    """``model`` from ``data``, or the first error as a KvlabError: '<where>: <name> <value> <problem>; <valid>'."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        key = str(error["loc"][0]) if error["loc"] else ""
        field = model.model_fields.get(key)
        expected = _description(field.annotation) or field.description if field is not None else ""
        prefix = f"{where}: " if where else ""
        if error["type"] == "missing" or (key in data and data[key] is None):  # (None: an empty CSV cell)
            raise KvlabError(f"{prefix}missing field {name_of(key)!r}" + (f"; valid: {expected}" if expected else "")) from None
        value = f" {_show(data[key] if key in data else error.get('input'))}"
        raise KvlabError(f"{prefix}{name_of(key)}{value} {_problem(error)}"
                         + (f"; valid: {expected}" if expected else "")) from None


def _description(annotation: Any) -> str | None:
    """The description a Count/Real carries, also inside ``X | None`` (pydantic lifts it only from a bare X)."""
    for arg in typing.get_args(annotation):
        if isinstance(arg, FieldInfo) and arg.description:
            return arg.description
        found = _description(arg)
        if found:
            return found
    return None


def _show(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return f"{value:g}"
    return repr(value) if isinstance(value, str) else str(value)


def cli_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# --- config.json and the catalogue --------------------------------------------------------------------------

class ModelFields(BaseModel):
    """The numbers of a config.json (after aliases: n_layer -> num_hidden_layers, ...) that size a model."""

    model_config = ConfigDict(extra="ignore")

    num_hidden_layers: Count(1, 2**31, "layers")
    hidden_size: Count(1, 2**20, "the hidden size")
    num_attention_heads: Count(1, 2**16, "query heads")
    num_key_value_heads: Count(1, 2**16, "KV heads, a divisor of num_attention_heads") | None = None
    head_dim: Count(1, 2**16, "values per head") | None = None
    intermediate_size: Count(1, 2**24, "the MLP width")
    vocab_size: Count(1, 2**24, "tokens in the vocabulary")
    max_position_embeddings: Count(1, 2**34, "the longest sequence in tokens")
    sliding_window: Count(0, 2**34, "tokens in the attention window (0: none)") | None = None
    sliding_window_pattern: Count(1, 2**16, "every how many layers one is full attention") | None = None
    max_window_layers: Count(0, 2**31, "the first layer that slides") | None = None
    kv_lora_rank: Count(0, 2**16, "the MLA latent's width") | None = None
    q_lora_rank: Count(0, 2**16, "the MLA query rank") | None = None
    qk_rope_head_dim: Count(0, 2**16, "the MLA RoPE key width") | None = None
    qk_nope_head_dim: Count(0, 2**16, "the MLA non-RoPE key width") | None = None
    v_head_dim: Count(0, 2**16, "the MLA value width") | None = None
    num_experts: Count(0, 2**16, "routed experts") | None = None
    experts_per_token: Count(1, 2**16, "experts per token, at most num_experts") | None = None
    moe_intermediate_size: Count(1, 2**24, "an expert's MLP width") | None = None
    num_shared_experts: Count(0, 2**10, "shared experts") | None = None
    first_k_dense_replace: Count(0, 2**31, "dense layers before the MoE layers") | None = None


def model_fields(fields: dict, where: str) -> ModelFields:
    """The numbers of a model, checked for physical sense; KvlabError naming the field otherwise."""
    parsed = _parse(ModelFields, fields, lambda key: key, where)
    heads, kv_heads = parsed.num_attention_heads, parsed.num_key_value_heads
    if kv_heads is not None and not parsed.kv_lora_rank and (kv_heads > heads or heads % kv_heads):
        divisors = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
        why = "exceeds" if kv_heads > heads else "does not divide"
        raise KvlabError(f"{where}: num_key_value_heads {kv_heads} {why} num_attention_heads {heads}: each KV head "
                         f"serves an equal group of query heads; valid: a divisor of {heads} ({divisors})")
    if parsed.head_dim is None and parsed.hidden_size % heads:
        raise KvlabError(f"{where}: missing field 'head_dim' and hidden_size {parsed.hidden_size} is not a multiple "
                         f"of num_attention_heads {heads}; valid: give head_dim, or heads that divide hidden_size")
    if parsed.num_experts and parsed.experts_per_token and parsed.experts_per_token > parsed.num_experts:
        raise KvlabError(f"{where}: experts_per_token {parsed.experts_per_token} exceeds num_experts "
                         f"{parsed.num_experts}; valid: 1 to {parsed.num_experts}")
    check_num_layers(parsed.num_hidden_layers, where)
    return parsed


def check_num_layers(num_layers: int, where: str) -> None:
    limit = work_limit("max_num_layers")
    if num_layers > limit and not _large_work_allowed.get():
        seconds = num_layers * 2e-6
        raise TooMuchWork(f"{where}: num_hidden_layers {num_layers:,} is beyond the limit of {limit:,} layers: "
                          f"kvlab counts parameters and lays out the KV cache layer by layer (~{seconds:,.0f} s and "
                          f"~{num_layers * 8 / GIB:,.1f} GiB here); pass --yes to go ahead")


class GpuEntry(BaseModel):
    """One GPU of data/gpus.json."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    aliases: list[str] = []
    memory_bytes: Count(2**20, 2**50, "bytes of GPU memory")
    memory_bytes_source: str
    memory_gb_marketing: Real(0, 2**20, "GB on the box") | None = None
    memory_type: str | None = None
    memory_bandwidth_bytes_per_s: Count(1, 2**60, "bytes per second") | None = None
    peak_flops: Count(1, 2**70, "FLOP/s") | None = None
    peak_flops_kind: str | None = None
    link: str | None = None
    link_bandwidth_bytes_per_s: Count(1, 2**60, "bytes per second, per direction") | None = None
    peak_flops_fp8: Count(1, 2**70, "FLOP/s") | None = None
    notes: list[str] = []
    source: list[str] = []


def gpu_entry(entry: dict) -> GpuEntry:
    where = f"GPU catalogue entry {entry.get('id', '?')}" if isinstance(entry, dict) else "GPU catalogue"
    return _parse(GpuEntry, entry if isinstance(entry, dict) else {}, lambda key: key, where)


# --- workload rows ------------------------------------------------------------------------------------------

MAX_TOKENS_PER_REQUEST = 2**31 - 1


class WorkloadRow(BaseModel):
    """One request of a user's file: arrival time (optional for lengths-only files) and lengths in tokens."""

    model_config = ConfigDict(extra="ignore")

    arrival_time: Real(0, 1e12, "seconds since the first request", lo_open=False) | None = None
    prompt_len: Count(1, MAX_TOKENS_PER_REQUEST, "tokens")
    output_len: Count(1, MAX_TOKENS_PER_REQUEST, "tokens (every request generates at least one)")
    max_tokens: Count(1, MAX_TOKENS_PER_REQUEST, "tokens, or empty for no cap") | None = None


def workload_row(row: dict, where: str, names: dict | None = None) -> WorkloadRow:
    """One row; ``where`` is 'file, line N'. An empty max_tokens (or arrival_time) cell means none. ``names``: the
    file's own name for a column, where it is not kvlab's (a Mooncake-layout file's input_length)."""
    plain = _plain_row(row)
    if plain is not None:
        return plain
    data = {k: (None if v == "" and k in ("max_tokens", "arrival_time") else v) for k, v in row.items()}
    return _parse(WorkloadRow, data, lambda key: (names or {}).get(key, key), where)


def _plain_count(value: Any) -> int | None:
    """A token count written plainly (ASCII digits, or a JSON int) within WorkloadRow's bounds; None where the
    full parse must look (and say what is wrong)."""
    if type(value) is str and len(value) <= 10 and value.isascii() and value.isdigit():
        value = int(value)
    if type(value) is int and 1 <= value <= MAX_TOKENS_PER_REQUEST:
        return value
    return None


def _plain_row(row: dict) -> WorkloadRow | None:
    """The row as WorkloadRow reads it where every cell is plainly valid: counts in digits, an arrival time in
    digits with a point at most, each within its bounds; None otherwise, and the full parse (pydantic) reads it.
    The same values: a file's rows are millions, and the full parse costs ~20 us a row (a 100,000-row file: 2 s)."""
    prompt, output = _plain_count(row.get("prompt_len")), _plain_count(row.get("output_len"))
    cap, time = row.get("max_tokens"), row.get("arrival_time")
    max_tokens = None if cap is None or cap == "" else _plain_count(cap)
    if prompt is None or output is None or (max_tokens is None and cap is not None and cap != ""):
        return None
    if time is None or time == "":
        arrival = None
    elif type(time) is str and len(time) <= 40 and time.isascii() and time.replace(".", "", 1).isdigit():
        arrival = float(time)
    elif type(time) in (int, float) and 0 <= time <= 1e12:  # (nan fails; an int past a float's range too)
        arrival = float(time)
    else:
        return None
    if arrival is not None and not arrival <= 1e12:
        return None
    return WorkloadRow.model_construct(arrival_time=arrival, prompt_len=prompt, output_len=output,
                                       max_tokens=max_tokens)


# --- serving options: the CLI's flags and the lab's parameters ---------------------------------------------

# Options that are not a run's (config/options.py declares those) but are checked the same way: `kvlab size`'s
# workload questions.
EXTRA_OPTIONS = {
    "concurrency": (1, 2**30, "requests"),
    "context_len": (1, 2**34, "tokens"),
}


def _option_type(option) -> Any:
    """The pydantic type of a declared option's value (None where a string's choices are checked instead)."""
    if option.kind is int:
        return Count(int(option.lo), int(option.hi), option.what)
    if option.kind is float:
        return Real(option.lo, option.hi, option.what, lo_open=option.lo_open)
    return None


def _serving_options() -> type[BaseModel]:
    """Every numeric option of every face (size / fit / run / race / sweep / paper / vllm compare / bench / the
    lab), one meaning and one range each: config/options.py's declarations."""
    from pydantic import create_model

    from kvlab.config.options import OPTIONS

    fields: dict[str, Any] = {name: (kind | None, None) for name, option in OPTIONS.items()
                              if (kind := _option_type(option)) is not None}
    fields.update({name: (Count(lo, hi, what) | None, None) for name, (lo, hi, what) in EXTRA_OPTIONS.items()})
    return create_model("ServingOptions", __config__=ConfigDict(extra="ignore"), **fields)


ServingOptions = _serving_options()


def check_options(values: dict, *, spelling: str = "cli", flags: dict[str, str] | None = None) -> BaseModel:
    """The options in ``values`` that are declared (config/options.py; others are left alone), checked: numbers
    against their ranges, strings against their choices. The message spells names as CLI flags (``--rate``) or
    as the lab's parameter names (``rate``), or as ``flags`` says (``{"rate": "--max-rate"}``: a value with the
    meaning and range of a rate under another flag)."""
    from kvlab.config.options import OPTIONS

    spell = cli_flag if spelling == "cli" else (lambda key: key)

    def name_of(key: str) -> str:
        return (flags or {}).get(key) or spell(key)

    auto = values.get("max_model_len")
    if isinstance(auto, (int, str)) and not isinstance(auto, bool) and str(auto).strip().lower() in ("-1", "auto"):
        raise KvlabError(f"{name_of('max_model_len')} {_show(auto)}: {VLLM_AUTO_MAX_MODEL_LEN}")
    for name, value in values.items():
        option = OPTIONS.get(name)
        if option is not None and option.choices and value is not None:
            if not isinstance(value, str) or value not in option.choices:
                raise KvlabError(f"{name_of(name)} {_show(value)} is not one of its values; valid: "
                                 f"{', '.join(option.choices)}{comma_list_hint(value) if spelling == 'cli' else ''}")
    known = {k: v for k, v in values.items() if k in ServingOptions.model_fields and v is not None}
    return _parse(ServingOptions, known, name_of)


def comma_list_hint(value) -> str:
    """What a comma list given to one run's option is for (trial 60, 9f): "" where ``value`` is not one."""
    if not isinstance(value, str) or "," not in value:
        return ""
    return " (a comma list of values is varied by kvlab sweep and kvlab capacity, one point each; a run takes one)"


def option_range(name: str) -> tuple[float, float, bool]:
    """(lo, hi, lo_open) of an option, declared in config/options.py or EXTRA_OPTIONS: the one range each face
    reads, the CLI (check_options) and the lab's calculator alike (fix 55: the lab took gpu_memory_utilization from
    0.05 and at most 100,000 conversations, the CLI above 0 and 2**30)."""
    from kvlab.config.options import OPTIONS

    if name in EXTRA_OPTIONS:
        lo, hi, _ = EXTRA_OPTIONS[name]
        return lo, hi, False
    option = OPTIONS[name]
    if option.lo is None or option.hi is None:
        raise KeyError(f"{name} has no range")
    return option.lo, option.hi, option.lo_open


def bounded_number(value: Any, name: str, lo: float, hi: float, *, whole: bool = False,
                   upper: str | None = None, lo_open: bool = False) -> float | int:
    """One number in [lo, hi] (whole or not; (lo, hi] with ``lo_open``), for the lab's parameters: the same value
    types as the CLI's options, in the lab's wording ('rate -1 is out of range: 0.01 to 100'); ``upper`` says what
    ``hi`` is where it is not known yet (hi is then inf)."""
    kind = "an integer" if whole else "a number"
    bounds = f"{lo} to {upper or hi}" if whole else f"{lo:g} to {upper or format(hi, 'g')}"
    bounds = f"above {bounds}" if lo_open else bounds
    try:
        number = _whole(value) if whole else _number(value)
    except ValueError as exc:
        if not whole and str(exc) == "is not a finite number":
            raise KvlabError(f"{name} {value!r} is out of range: {bounds}") from None
        raise KvlabError(f"{name} must be {kind} from {bounds}, got {value!r}") from None
    if not lo <= number <= hi or (lo_open and number == lo):
        raise KvlabError(f"{name} {number if whole else value!r} is out of range: {bounds}")
    return number if whole else float(number)


# --- bounded work -------------------------------------------------------------------------------------------

def work_limit(name: str) -> int:
    override = os.environ.get(LIMIT_ENV[name])
    return int(override) if override else WORK_LIMITS[name]


@contextmanager
def allow_large_work(allowed: bool = True) -> Iterator[None]:
    """Within this block the work limits do not apply (the CLI's --yes)."""
    token = _large_work_allowed.set(allowed)
    try:
        yield
    finally:
        _large_work_allowed.reset(token)


def large_work_allowed() -> bool:
    return _large_work_allowed.get()


def check_simulation_work(num_requests: float, mean_len: float, num_strategies: int, what: str, *,
                          memory_only: bool = False) -> None:
    """Refuse a simulation beyond WORK_LIMITS before any request is built, with the estimate. ``memory_only``
    (the library's own gate, in load_workload) weighs memory alone: a long run is the caller's choice there."""
    if _large_work_allowed.get():
        return
    runs = num_requests * num_strategies
    memory = num_requests * BYTES_PER_REQUEST
    max_runs, max_memory = work_limit("max_request_runs"), work_limit("max_memory_bytes")
    if (memory_only or runs <= max_runs) and memory <= max_memory:
        return
    minutes = runs / 1e6
    strategies = f" x {num_strategies} strategies" if num_strategies > 1 else ""
    if memory_only:  # (memory alone is weighed: no simulator's time, which is nothing to a real server's bench)
        raise TooMuchWork(
            f"{what} means about {num_requests:,.0f} requests ({num_requests * mean_len:,.0f} tokens at "
            f"{mean_len:,.0f} per request): ~{memory / GIB:,.1f} GiB of memory to hold them, beyond the limit of "
            f"{max_memory / GIB:,.0f} GiB; lower -n/--num-requests or --duration, or pass --yes to go ahead")
    raise TooMuchWork(
        f"{what} means about {num_requests:,.0f} requests{strategies} ({num_requests * mean_len:,.0f} tokens to "
        f"serve at {mean_len:,.0f} per request): ~{_duration(minutes * 60)} and ~{memory / GIB:,.1f} GiB of memory, "
        f"beyond the limit of {max_runs:,} request-runs and {max_memory / GIB:,.0f} GiB; lower -n/--num-requests or "
        "--duration, or pass --yes to go ahead")


def check_pool_work(num_blocks: int, block_size: int) -> None:
    """Refuse a KV cache of more blocks than WORK_LIMITS allows (a huge --gpu-memory-gib or --num-gpu-blocks)."""
    limit = work_limit("max_num_blocks")
    if num_blocks <= limit or _large_work_allowed.get():
        return
    raise TooMuchWork(f"a KV cache of {num_blocks:,} blocks ({num_blocks * block_size:,} token slots) is beyond the "
                      f"limit of {limit:,} blocks: the simulator keeps every block (~{num_blocks * 48 / GIB:,.1f} GiB "
                      f"and ~{_duration(num_blocks * 1e-6)} to set up per strategy); lower --gpu-memory-gib, "
                      "--available-kv-gib or --num-gpu-blocks, or pass --yes to go ahead")


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.0f} {unit}"
    return f"{seconds:,.0f} s"


# --- output paths -------------------------------------------------------------------------------------------

# Pseudo-filesystems: writable by mode bits for root, yet nothing can be created in them.
_PSEUDO_ROOTS = ("/proc", "/sys", "/dev")


def check_input_file(path, label: str, what: str) -> None:
    """Refuse an input file that is missing or is a folder, in one line naming ``label`` (the flag, or what the
    file is) and ``what`` file is wanted."""
    from pathlib import Path

    if Path(path).is_dir():
        raise KvlabError(f"{label} {path} is a folder; valid: {what}")
    if not Path(path).is_file():
        raise KvlabError(f"{label} {path}: no such file; valid: {what}")


# What the first bytes of a file kvlab wrote hold, by kind, so that an output option writes over kvlab's own earlier
# file and nothing else: the race page's generator tag (web/static/export.html), and a fitted cost profile's first
# keys, TOML or JSON, whose source names kvlab calibrate (cost/fit.py, cost/calibrate.py).
KVLAB_HTML_MARK = '<meta name="generator" content="kvlab">'
_OWN_FILE_HEADS = {
    "html": re.compile(re.escape(KVLAB_HTML_MARK.encode())),
    "profile": re.compile(rb'\A\{?\s*"?name"?\s*[=:]\s*"[^"\n]*",?\s*"?kind"?\s*[=:]\s*"[^"\n]*",?\s*'
                          rb'"?source"?\s*[=:]\s*"(Fitted by )?kvlab calibrate'),
}
_HEAD_BYTES = 1024


# An --out folder's list of the files kvlab wrote there, one a line: size, modification time (ns) and path relative to
# the folder, tab-separated: what a later command may write over, while the file is still as kvlab left it (a user's
# file put in its place has another size or time). A folder holds files of many kinds (CSV, PNG, JSON), so kvlab
# marks them here rather than in each file's first bytes, as it marks a single output file (_OWN_FILE_HEADS).
OUT_MANIFEST = ".kvlab-written"


def check_output_path(path, flag: str, *, folder: bool, own: str = "html", writes: tuple[str, ...] = ()) -> None:
    """Refuse, before any work, an output path that cannot be written: a folder (``--out``) that is a file, a file
    (``--html``) that is a folder, a missing or read-only parent, /proc; and an existing file that kvlab did not
    write itself (``own``: which of kvlab's files it may replace, a key of _OWN_FILE_HEADS; for a folder,
    ``writes``: the names, as glob patterns, that the command writes into it, each checked against the folder's
    OUT_MANIFEST), so that no output option overwrites a user's file."""
    if path is None:
        return
    from pathlib import Path

    target = Path(path).expanduser().absolute()
    what = "a folder (new or existing) in a writable place" if folder else "a file in an existing, writable folder"
    if any(target == Path(root) or Path(root) in target.parents for root in _PSEUDO_ROOTS):
        raise KvlabError(f"{flag} {path} is inside {target.parts[0]}{target.parts[1]}, where no file can be "
                         f"created; valid: {what}")
    if folder and target.exists() and not target.is_dir():
        raise KvlabError(f"{flag} {path} exists and is a file, not a folder; valid: {what}")
    if not folder and target.is_dir():
        raise KvlabError(f"{flag} {path} is a folder; valid: {what}, e.g. {path}/race.html")
    if not folder and target.exists() and not _kvlab_wrote(target, own):
        raise KvlabError(f"{flag} {path} already exists and is not a file kvlab wrote, so kvlab will not write over "
                         f"it; give another path, or delete {path} first")
    clash = _foreign_output(target, writes) if folder and target.is_dir() else None
    if clash is not None:
        raise KvlabError(f"{flag} {path}: {clash} already exists there and is not a file kvlab wrote, so kvlab will not "
                         f"write over it; give another folder, or delete {Path(path) / clash} first")
    parent = target if folder else target.parent
    while not parent.exists():
        if not folder:
            raise KvlabError(f"{flag} {path}: folder {target.parent} does not exist; valid: {what}")
        parent = parent.parent
    if not parent.is_dir():
        raise KvlabError(f"{flag} {path}: {parent} is a file, not a folder; valid: {what}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise KvlabError(f"{flag} {path}: {parent} is not writable; valid: {what}")


def _foreign_output(folder, writes: tuple[str, ...]) -> str | None:
    """The first path under ``folder`` (relative) that a name in ``writes`` matches and that is not a file kvlab
    wrote there, as kvlab left it."""
    ours = _written(folder)
    for pattern in writes:
        for found in sorted(folder.glob(pattern)):
            name = found.relative_to(folder).as_posix()
            if ours.get(name) != _stamp(found):
                return name
    return None


def _stamp(path) -> str | None:
    """A file's size and modification time (ns), as OUT_MANIFEST keeps them; None for what is not a regular file."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return f"{stat.st_size}\t{stat.st_mtime_ns}" if path.is_file() else None


def _written(folder) -> dict[str, str]:
    """OUT_MANIFEST's files: path -> stamp."""
    try:
        lines = (folder / OUT_MANIFEST).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    rows = [line.rsplit("\t", 1) for line in lines if line.count("\t") >= 2]
    return {name: stamp for stamp, name in rows}


def note_written(folder, paths) -> None:
    """Add ``paths`` (files kvlab has just written under ``folder``) to the folder's OUT_MANIFEST, so that a later
    command may write over them, as long as they are as kvlab left them (check_output_path's ``writes``)."""
    from pathlib import Path

    folder = Path(folder)
    known = _written(folder)
    for path in paths:
        stamp = _stamp(Path(path))
        if stamp is not None:
            known[Path(path).absolute().relative_to(folder.absolute()).as_posix()] = stamp
    (folder / OUT_MANIFEST).write_text("".join(f"{stamp}\t{name}\n" for name, stamp in known.items()),
                                       encoding="utf-8")


def _kvlab_wrote(target, own: str) -> bool:
    """Whether the existing ``target`` is a regular file whose first bytes are those of kvlab's own ``own`` file
    (a FIFO or a device is never read: reading one could block or consume it)."""
    if not target.is_file():
        return False
    try:
        with target.open("rb") as f:
            head = f.read(_HEAD_BYTES)
    except OSError:
        return False
    return _OWN_FILE_HEADS[own].search(head) is not None

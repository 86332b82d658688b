"""Readers for the published traces (kvlab.workload.published says where each is published and found), one per
file format.

Each reader parses its file once per process (``cache``, keyed by path) into a ``LengthTable`` in arrival order,
with times in seconds from the first request. Rows that are not servable data are dropped and counted. A file that
is not in its publisher's format is a ``KvlabError`` naming the file and what was expected.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np

from kvlab.errors import KvlabError
from kvlab.workload.arrivals import spread_within_bins
from kvlab.workload.table import LengthTable, out_of_order


def _read_text(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise KvlabError(f"{path}: not a text file (byte {error.start} is not UTF-8); valid: the file as published") \
            from None
    except OSError as error:
        raise KvlabError(f"{path}: cannot be read ({error.strerror})") from None
    if not text.strip():
        raise KvlabError(f"{path}: the file is empty; valid: the file as published")
    return text


def _csv_columns(path: Path, columns: dict[str, type]) -> list[np.ndarray]:
    """The named columns of a CSV file (plain comma-separated, one header line), parsed by numpy."""
    text = _read_text(path)
    header = [name.strip() for name in text.split("\n", 1)[0].strip().split(",")]
    missing = [name for name in columns if name not in header]
    if missing:
        raise KvlabError(f"{path}: no column {missing[0]!r} (its header is {','.join(header)[:120]!r}); "
                         f"valid: the published file, whose columns include {', '.join(columns)}")
    try:
        return [
            np.loadtxt(io.StringIO(text), delimiter=",", skiprows=1, usecols=header.index(name), dtype=dtype, ndmin=1)
            for name, dtype in columns.items()
        ]
    except ValueError as error:
        raise KvlabError(f"{path}: a row does not parse ({str(error)[:160]}); valid: the file as published") from None


def _in_arrival_order(
    arrival_time: np.ndarray, prompt_len: np.ndarray, output_len: np.ndarray, **extra
) -> LengthTable:
    # A stable sort keeps the file's order among equal timestamps; times start at zero.
    arrival_time_in_file = arrival_time
    order = np.argsort(arrival_time, kind="stable")
    arrival_time = arrival_time[order] - arrival_time[order[0]]
    if extra.get("prefix_hashes") is not None:
        extra["prefix_hashes"] = tuple(extra["prefix_hashes"][i] for i in order.tolist())
    return LengthTable(prompt_len=prompt_len[order], output_len=output_len[order], arrival_time=arrival_time,
                       num_out_of_order=out_of_order(arrival_time_in_file), **extra)


def _jsonl_rows(path: Path, fields: tuple[str, ...]) -> list[dict]:
    rows = []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise KvlabError(f"{path}, line {number}: not valid JSON; valid: the file as published") from None
        if not isinstance(row, dict):
            raise KvlabError(f"{path}, line {number}: not a JSON object; valid: rows with {', '.join(fields)}")
        missing = [name for name in fields if name not in row]
        if missing:
            raise KvlabError(f"{path}, line {number}: no field {missing[0]!r}; valid: rows with {', '.join(fields)}")
        rows.append(row)
    if not rows:
        raise KvlabError(f"{path}: no rows; valid: the file as published")
    return rows


@cache
def read_azure(path: Path) -> LengthTable:
    """Azure LLM inference trace 2023: TIMESTAMP (wall clock, 100 ns digits), ContextTokens, GeneratedTokens."""
    stamps, prompt, output = _csv_columns(path, {"TIMESTAMP": str, "ContextTokens": int, "GeneratedTokens": int})
    # numpy parses "2023-11-16 18:17:03.9799600" as a naive datetime; nanoseconds keep all 7 digits.
    try:
        clock = stamps.astype("datetime64[ns]")
        if np.isnat(clock).any():  # (an empty cell reads as NaT, not as an error: refused the same way)
            raise ValueError
    except ValueError:
        row, value = next((i, v) for i, v in enumerate(stamps.tolist()) if not _is_datetime(v))
        raise KvlabError(f"{path}, line {row + 2}: TIMESTAMP {value[:40]!r} is not a date and time; valid: one "
                         "such as 2023-11-16 18:17:03.9799600, as the published trace writes them") from None
    seconds = (clock - clock.min()).astype(np.int64) / 1e9
    return _in_arrival_order(seconds, prompt, output)


def _is_datetime(value: str) -> bool:
    try:
        return not np.isnat(np.datetime64(value, "ns"))
    except ValueError:
        return False


@cache
def read_length_stats(path: Path) -> LengthTable:
    """Sarathi-Serve / Vidur processed traces: num_prefill_tokens, num_decode_tokens (no arrival times)."""
    prompt, output = _csv_columns(path, {"num_prefill_tokens": int, "num_decode_tokens": int})
    return LengthTable(prompt_len=prompt, output_len=output)


@cache
def read_burstgpt(path: Path) -> LengthTable:
    """BurstGPT: Timestamp (s), Request tokens, Response tokens. Failed requests are logged with 0 tokens."""
    seconds, prompt_len, output_len = _csv_columns(
        path, {"Timestamp": float, "Request tokens": int, "Response tokens": int}
    )
    servable = (prompt_len > 0) & (output_len > 0)
    num_failed = int((~servable).sum())
    return _in_arrival_order(
        seconds[servable],
        prompt_len[servable],
        output_len[servable],
        num_skipped=num_failed,
        skip_reason="failed requests logged with 0 tokens",
    )


@cache
def read_llmservingsim(path: Path) -> LengthTable:
    """LLMServingSim workload: arrival_time_ns, input_toks, output_toks, as published (JSONL, with token ids) or
    as a CSV of those three columns."""
    fields = ("arrival_time_ns", "input_toks", "output_toks")
    if path.suffix.lower() == ".jsonl":
        rows = _jsonl_rows(path, fields)
        stamps, prompt, output = (np.array([row[name] for row in rows], dtype=np.int64) for name in fields)
    else:
        stamps, prompt, output = _csv_columns(path, dict.fromkeys(fields, int))
    return _in_arrival_order(stamps / 1e9, prompt, output)


@cache
def read_mooncake(path: Path, bin_width: float) -> LengthTable:
    """Mooncake FAST'25 trace (JSONL): timestamp (ms), input_length, output_length, hash_ids.

    ``hash_ids`` name the prompt's 512-token blocks; requests with equal leading ids share that prefix.
    With ``bin_width`` > 0 the binned timestamps are spread within their bins (``spread_within_bins``).
    """
    rows = _jsonl_rows(path, ("timestamp", "input_length", "output_length", "hash_ids"))
    seconds = np.array([row["timestamp"] for row in rows], dtype=float) / 1e3
    table = _in_arrival_order(
        seconds,
        np.array([row["input_length"] for row in rows], dtype=np.int64),
        np.array([row["output_length"] for row in rows], dtype=np.int64),
        prefix_hashes=tuple(tuple(row["hash_ids"]) for row in rows),
    )
    if bin_width <= 0:
        return table
    return LengthTable(
        prompt_len=table.prompt_len,
        output_len=table.output_len,
        arrival_time=spread_within_bins(table.arrival_time, bin_width),
        prefix_hashes=table.prefix_hashes,
    )


# The published formats whose columns tell them (a copy under any name is read in its format): each format's
# columns and reader. (Vidur's and Sarathi-Serve's num_prefill_tokens / num_decode_tokens, and Mooncake's JSONL,
# are read as a user's file is: kvlab.workload.files.)
HEADER_FORMATS: dict[str, tuple[tuple[str, ...], Callable[[Path], LengthTable]]] = {
    "Azure LLM inference trace": (("TIMESTAMP", "ContextTokens", "GeneratedTokens"), read_azure),
    "BurstGPT": (("Timestamp", "Request tokens", "Response tokens"), read_burstgpt),
    "LLMServingSim": (("arrival_time_ns", "input_toks", "output_toks"), read_llmservingsim),
}


def format_of(path: Path) -> str | None:
    """The published format (HEADER_FORMATS) whose columns a CSV's header or a JSONL's first row has; None for
    any other file, or one that cannot be read (its reader says why)."""
    try:
        with path.open(encoding="utf-8") as file:
            first = next((line for line in file if line.strip()), "")
    except (OSError, UnicodeDecodeError):
        return None
    if path.suffix.lower() == ".jsonl":
        try:
            row = json.loads(first)
        except json.JSONDecodeError:
            return None
        names = set(row) if isinstance(row, dict) else set()
    else:
        names = {name.strip() for name in first.split(",")}
    return next((name for name, (columns, _) in HEADER_FORMATS.items() if names.issuperset(columns)), None)

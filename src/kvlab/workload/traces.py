"""Readers for the bundled traces (``data/``, attribution in ``data/ATTRIBUTION.md``), one per file format.

Each reader parses its file once per process (``lru_cache``) into a ``LengthTable`` in arrival order, with
times in seconds from the first request. Rows that are not servable data are dropped and counted.
"""

from __future__ import annotations

import io
import json
from functools import cache
from importlib import resources

import numpy as np

from kvlab.workload.arrivals import spread_within_bins
from kvlab.workload.table import LengthTable


def _read_text(filename: str) -> str:
    return resources.files("kvlab.workload").joinpath("data", filename).read_text(encoding="utf-8")


def _csv_columns(filename: str, columns: dict[str, type]) -> list[np.ndarray]:
    """The named columns of a bundled CSV file (plain comma-separated, one header line), parsed by numpy."""
    text = _read_text(filename)
    header = text.split("\n", 1)[0].strip().split(",")
    return [
        np.loadtxt(io.StringIO(text), delimiter=",", skiprows=1, usecols=header.index(name), dtype=dtype, ndmin=1)
        for name, dtype in columns.items()
    ]


def _in_arrival_order(
    arrival_time: np.ndarray, prompt_len: np.ndarray, output_len: np.ndarray, **extra
) -> LengthTable:
    # A stable sort keeps the file's order among equal timestamps; times start at zero.
    order = np.argsort(arrival_time, kind="stable")
    arrival_time = arrival_time[order] - arrival_time[order[0]]
    if extra.get("prefix_hashes") is not None:
        extra["prefix_hashes"] = tuple(extra["prefix_hashes"][i] for i in order.tolist())
    return LengthTable(prompt_len=prompt_len[order], output_len=output_len[order], arrival_time=arrival_time, **extra)


@cache
def read_azure(filename: str) -> LengthTable:
    """Azure LLM inference trace 2023: TIMESTAMP (wall clock, 100 ns digits), ContextTokens, GeneratedTokens."""
    stamps, prompt, output = _csv_columns(filename, {"TIMESTAMP": str, "ContextTokens": int, "GeneratedTokens": int})
    # numpy parses "2023-11-16 18:17:03.9799600" as a naive datetime; nanoseconds keep all 7 digits.
    clock = stamps.astype("datetime64[ns]")
    seconds = (clock - clock.min()).astype(np.int64) / 1e9
    return _in_arrival_order(seconds, prompt, output)


@cache
def read_length_stats(filename: str) -> LengthTable:
    """Sarathi-Serve / Vidur processed traces: num_prefill_tokens, num_decode_tokens (no arrival times)."""
    prompt, output = _csv_columns(filename, {"num_prefill_tokens": int, "num_decode_tokens": int})
    return LengthTable(prompt_len=prompt, output_len=output)


@cache
def read_burstgpt(filename: str) -> LengthTable:
    """BurstGPT: Timestamp (s), Request tokens, Response tokens. Failed requests are logged with 0 tokens."""
    seconds, prompt_len, output_len = _csv_columns(
        filename, {"Timestamp": float, "Request tokens": int, "Response tokens": int}
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
def read_llmservingsim(filename: str) -> LengthTable:
    """LLMServingSim workload: arrival_time_ns, input_toks, output_toks."""
    stamps, prompt, output = _csv_columns(filename, {"arrival_time_ns": int, "input_toks": int, "output_toks": int})
    return _in_arrival_order(stamps / 1e9, prompt, output)


@cache
def read_mooncake(filename: str, bin_width: float) -> LengthTable:
    """Mooncake FAST'25 trace (JSONL): timestamp (ms), input_length, output_length, hash_ids.

    ``hash_ids`` name the prompt's 512-token blocks; requests with equal leading ids share that prefix.
    With ``bin_width`` > 0 the binned timestamps are spread within their bins (``spread_within_bins``).
    """
    rows = [json.loads(line) for line in _read_text(filename).splitlines() if line.strip()]
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

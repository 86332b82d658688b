"""A user's workload file: CSV or JSONL, one request per row.

Columns: ``arrival_time`` (seconds, ≥ 0), ``prompt_len`` and ``output_len`` (whole tokens, ≥ 1) and
optionally ``max_tokens`` (whole tokens ≥ 1, or empty / null for no cap). Other columns are ignored.
Anything else is a ``KvlabError`` that names the file, the line and the value.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import numpy as np

from kvlab.errors import KvlabError
from kvlab.workload.table import LengthTable

REQUIRED_COLUMNS = ("arrival_time", "prompt_len", "output_len")
OPTIONAL_COLUMNS = ("max_tokens",)
SUFFIXES = (".csv", ".jsonl")

_EXPECTED = "a workload file has columns arrival_time, prompt_len, output_len and optionally max_tokens"


def _bad(path: str, line: int, column: str, value: object, problem: str) -> KvlabError:
    return KvlabError(f"{path}, line {line}: {column} {value!r} {problem}")


def _number(path: str, line: int, column: str, value: object) -> float:
    """The value as a float: a JSON number or a string that reads as one (never a bool)."""
    if value is None or value == "":
        raise _bad(path, line, column, value, f"is missing; {_EXPECTED}")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _bad(path, line, column, value, "is not a number")
    try:
        number = float(value)
    except ValueError:
        raise _bad(path, line, column, value, "is not a number") from None
    if not math.isfinite(number):
        raise _bad(path, line, column, value, "is not a finite number")
    return number


def _arrival_time(path: str, line: int, value: object) -> float:
    seconds = _number(path, line, "arrival_time", value)
    if seconds < 0:
        raise _bad(path, line, "arrival_time", value, "is negative; arrival times are seconds ≥ 0")
    return seconds


def _num_tokens(path: str, line: int, column: str, value: object) -> int:
    number = _number(path, line, column, value)
    if number < 0:
        raise _bad(path, line, column, value, "is negative; token counts are whole numbers ≥ 1")
    if not number.is_integer():
        raise _bad(path, line, column, value, "is not a whole number of tokens")
    if number == 0:
        if column == "output_len":
            raise _bad(path, line, column, value, "is zero; every request generates at least one token")
        raise _bad(path, line, column, value, "is zero; token counts are whole numbers ≥ 1")
    return int(number)


def _rows_csv(path: str, text: str):
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise KvlabError(f"{path}, line 1: the file is empty; {_EXPECTED}")
    header = [name.strip() for name in header]
    missing = [name for name in REQUIRED_COLUMNS if name not in header]
    if missing:
        raise KvlabError(
            f"{path}, line 1: header {','.join(header)!r} lacks column {', '.join(missing)}; {_EXPECTED}"
        )
    index = {name: header.index(name) for name in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if name in header}
    for fields in reader:
        if not fields or all(not field.strip() for field in fields):
            continue  # blank line
        yield reader.line_num, {name: (fields[i].strip() if i < len(fields) else None) for name, i in index.items()}


def _rows_jsonl(path: str, text: str):
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise KvlabError(f"{path}, line {line}: {raw.strip()[:60]!r} is not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise KvlabError(f"{path}, line {line}: {raw.strip()[:60]!r} is not a JSON object; {_EXPECTED}")
        missing = [name for name in REQUIRED_COLUMNS if name not in row]
        if missing:
            raise KvlabError(
                f"{path}, line {line}: {raw.strip()[:60]!r} lacks key {', '.join(missing)}; {_EXPECTED}"
            )
        yield line, row


def read_user_file(path: str) -> LengthTable:
    """Every request of a user's CSV or JSONL file, sorted by arrival time (stable), times as given."""
    file = Path(path)
    if file.suffix.lower() not in SUFFIXES:
        raise KvlabError(f"{path}: a workload file must end in .csv or .jsonl (got {file.suffix or 'no suffix'!r})")
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KvlabError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KvlabError(f"{path}: cannot read it as UTF-8 text ({exc})") from None
    rows = _rows_csv(path, text) if file.suffix.lower() == ".csv" else _rows_jsonl(path, text)

    arrival_time: list[float] = []
    prompt_len: list[int] = []
    output_len: list[int] = []
    max_tokens: list[int | None] = []
    for line, row in rows:
        arrival_time.append(_arrival_time(path, line, row["arrival_time"]))
        prompt_len.append(_num_tokens(path, line, "prompt_len", row["prompt_len"]))
        output_len.append(_num_tokens(path, line, "output_len", row["output_len"]))
        cap = row.get("max_tokens")
        max_tokens.append(None if cap is None or cap == "" else _num_tokens(path, line, "max_tokens", cap))
    if not prompt_len:
        raise KvlabError(f"{path}: no requests in the file; {_EXPECTED}")

    times = np.array(arrival_time, dtype=float)
    order = np.argsort(times, kind="stable")
    return LengthTable(
        prompt_len=np.array(prompt_len, dtype=np.int64)[order],
        output_len=np.array(output_len, dtype=np.int64)[order],
        arrival_time=times[order],
        max_tokens=None if all(cap is None for cap in max_tokens) else tuple(max_tokens[i] for i in order.tolist()),
    )

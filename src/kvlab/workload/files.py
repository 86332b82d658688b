"""A user's workload file: CSV or JSONL, one request per row.

Columns: ``prompt_len`` and ``output_len`` (whole tokens, ≥ 1), optionally ``arrival_time`` (seconds, ≥ 0) and
``max_tokens`` (whole tokens ≥ 1, or empty / null for no cap) and ``priority`` (an integer on every row, smaller
served first under ``--scheduling-policy priority``; kvlab.workload.priority) and ``timeout`` (seconds after the
request's arrival that its client waits for the whole answer before giving up, a number > 0 on every row, or
empty on every row; a file with it refuses ``--timeout``: kvlab.workload.priority). Other columns are ignored. Without
``arrival_time`` the file is lengths only: arrivals come from ``--arrival poisson`` / ``gamma`` at ``--rate``.

Conversations: a ``session_id`` column (a whole number ≥ 0 on every row) makes each row a turn of its session,
turns in arrival order; a turn's ``prompt_len`` is its whole prompt, the conversation so far included. Turns arrive
at their ``arrival_time``, or ``think_time`` seconds (≥ 0) after their session's previous turn (a session's first
turn: after t = 0). A prompt longer than its session's context so far (the previous turn's prompt and answer)
repeats it and adds a message; a shorter one is taken to repeat its first tokens (kvlab.workload.sessions
.conversation_ids). So prefix caching finds each turn's context where the session last ran.
The peers' length traces are read as they are: Vidur's and Sarathi-Serve's ``num_prefill_tokens`` /
``num_decode_tokens`` (and Vidur's ``arrived_at``) are the same columns under other names. A JSONL whose first row
has the Mooncake trace's columns (``timestamp`` in ms, ``input_length``, ``output_length``, ``hash_ids``) is read as
that trace is, whatever its name: timestamps as they are, hash_ids as shared prefixes.
Anything else is a ``KvlabError`` that names the file, the line and the value (kvlab.validate.WorkloadRow).
"""

from __future__ import annotations

import csv
import io
import json
import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from kvlab.errors import KvlabError
from kvlab.workload.priority import parse_deadline, parse_priority
from kvlab.workload.table import LengthTable, out_of_order

REQUIRED_COLUMNS = ("prompt_len", "output_len")
OPTIONAL_COLUMNS = ("arrival_time", "max_tokens", "session_id", "think_time", "priority", "timeout")
# Other tools' names for kvlab's columns (Vidur / Sarathi-Serve traces and request logs).
COLUMN_ALIASES = {"num_prefill_tokens": "prompt_len", "num_decode_tokens": "output_len", "arrived_at": "arrival_time"}
SUFFIXES = (".csv", ".jsonl")
# A JSONL with these keys is in the Mooncake trace's layout and read as that trace (kvlab.workload.traces.read_mooncake):
# timestamp in ms, hash_ids naming the prompt's 512-token blocks.
MOONCAKE_COLUMNS = ("timestamp", "input_length", "output_length", "hash_ids")
_MOONCAKE_NAMES = {"arrival_time": "timestamp", "prompt_len": "input_length", "output_len": "output_length"}

_EXPECTED = ("a workload file has columns prompt_len and output_len (or Vidur's num_prefill_tokens and "
             "num_decode_tokens), optionally arrival_time and max_tokens, and session_id with arrival_time or "
             "think_time for conversations")


def _canonical(names) -> dict[str, str]:
    """Each of kvlab's columns -> the name the file uses for it (kvlab's own name wins over an alias)."""
    found: dict[str, str] = {}
    for name in names:
        target = COLUMN_ALIASES.get(name, name)
        if target in REQUIRED_COLUMNS + OPTIONAL_COLUMNS and (target not in found or name == target):
            found[target] = name
    return found


def _check_names(path: str, where: str, names: list[str]) -> None:
    """A column twice, or one a letter or two away from a column kvlab reads and the file lacks (``arival_time``),
    is refused: taken for an other column, it would be ignored without a word. Other columns are ignored, and so
    are unnamed ones (a spreadsheet's trailing commas)."""
    from difflib import get_close_matches

    known = REQUIRED_COLUMNS + OPTIONAL_COLUMNS + tuple(COLUMN_ALIASES)
    for i, name in enumerate(names):
        if not name:
            continue
        if name in names[:i]:
            raise KvlabError(f"{path}, {where}: column {name!r} appears twice; valid: each column once")
        close = get_close_matches(name, known, n=1, cutoff=0.85) if name not in known else []
        if close and close[0] not in names and COLUMN_ALIASES.get(close[0], close[0]) not in names:
            raise KvlabError(f"{path}, {where}: column {name!r} would be ignored, and it is so close to "
                             f"{close[0]!r} that it looks like a misspelling; did you mean {close[0]!r}? (kvlab reads "
                             f"{', '.join(REQUIRED_COLUMNS + OPTIONAL_COLUMNS)}, or a Mooncake trace's "
                             f"{', '.join(MOONCAKE_COLUMNS)})")


def _rows_csv(path: str, text: str):
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise KvlabError(f"{path}, line 1: the file is empty; {_EXPECTED}")
    header = [name.strip() for name in header]
    _check_names(path, "line 1", header)
    columns = _canonical(header)
    missing = [name for name in REQUIRED_COLUMNS if name not in columns]
    if missing:
        from kvlab.workload.traces import HEADER_FORMATS

        published = "; ".join(f"{','.join(columns)} ({name})" for name, (columns, _) in HEADER_FORMATS.items())
        raise KvlabError(f"{path}, line 1: header {','.join(header)!r} lacks column {', '.join(missing)}; {_EXPECTED}; "
                         f"or a published trace's columns, read whatever the file's name: {published}")
    index = {name: header.index(source) for name, source in columns.items()}
    for fields in reader:
        if not fields or all(not field.strip() for field in fields):
            continue  # blank line
        if len(fields) > len(header) and any(field.strip() for field in fields[len(header):]):
            # ("1,024,128" under prompt_len,output_len is not 1,024 and 128; "10,20," is a trailing comma)
            raise KvlabError(f"{path}, line {reader.line_num}: {len(fields)} fields under a header of {len(header)} "
                             f"({','.join(fields)[:60]!r}); valid: one field per column, numbers without thousands "
                             "separators")
        yield reader.line_num, {name: (fields[i].strip() if i < len(fields) else None) for name, i in index.items()}


def _rows_jsonl(path: str, text: str):
    checked: set[tuple[str, ...]] = set()  # (the key sets already checked: most files have one)
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise KvlabError(f"{path}, line {line}: {raw.strip()[:60]!r} is not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise KvlabError(f"{path}, line {line}: {raw.strip()[:60]!r} is not a JSON object; {_EXPECTED}")
        if tuple(row) not in checked:
            _check_names(path, f"line {line}", list(row))
            checked.add(tuple(row))
        columns = _canonical(row)
        missing = [name for name in REQUIRED_COLUMNS if name not in columns]
        if missing:
            raise KvlabError(
                f"{path}, line {line}: {raw.strip()[:60]!r} lacks key {', '.join(missing)}; {_EXPECTED}"
            )
        yield line, {name: row[source] for name, source in columns.items()}


# Every workload file form `-w` takes (kvlab.workload.load: these tables, and inference-perf's configuration).
WORKLOAD_FILE_FORMS = ("a workload file must end in .csv or .jsonl (one request a row) or .yaml / .yml (an "
                       "inference-perf configuration)")


def _read_text(path: str) -> str:
    file = Path(path)
    if file.suffix.lower() not in SUFFIXES:
        got = "a folder" if file.is_dir() else repr(file.suffix or "no suffix")
        raise KvlabError(f"{path}: {WORKLOAD_FILE_FORMS} (got {got})")
    try:
        return file.read_text(encoding="utf-8-sig")  # (a byte-order mark, as spreadsheets write, is dropped)
    except FileNotFoundError:
        raise KvlabError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KvlabError(f"{path}: cannot read it as UTF-8 text ({exc})") from None


def _session_id(value, where: str) -> int:
    """A row's session: a whole number >= 0 (a JSON integer, or its digits in a CSV cell)."""
    valid = "valid: a session id, a whole number >= 0, on every row"
    if value is None or value == "":
        raise KvlabError(f"{where}: missing field 'session_id'; {valid}")
    from kvlab.validate import cell_number

    try:
        number = cell_number(value, whole=True)
    except ValueError:
        number = math.nan
    if not (isinstance(number, int) or math.isfinite(number) and number.is_integer()) or number < 0:
        raise KvlabError(f"{where}: session_id {value!r} is not a whole number >= 0; {valid}")
    return int(number)


def _think_time(value, where: str) -> float:
    """Seconds after the session's previous turn: a finite number >= 0."""
    valid = "valid: seconds after the session's previous turn, a number >= 0, on every row"
    if value is None or value == "":
        raise KvlabError(f"{where}: missing field 'think_time'; {valid}")
    from kvlab.validate import cell_number

    try:
        number = float(cell_number(value))
    except (ValueError, OverflowError):
        number = math.nan
    if not math.isfinite(number):
        raise KvlabError(f"{where}: think_time {value!r} is not a finite number; {valid}")
    if number < 0:
        raise KvlabError(f"{where}: think_time {value!r} is negative; {valid}")
    return number


def _mooncake_layout(text: str) -> bool:
    """Whether a JSONL's first row has the Mooncake trace's columns (its layout is told by its columns, not its name)."""
    first = next((raw for raw in text.splitlines() if raw.strip()), "")
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(row, dict) and all(name in row for name in MOONCAKE_COLUMNS)


def _check_partial_mooncake(path: str, text: str) -> None:
    """A JSONL whose first row has some of the Mooncake trace's own columns but not all is refused by the ones it
    lacks (taken for a file of kvlab's columns, it would be told its output_length looks like a misspelling)."""
    line, first = next(((n, raw) for n, raw in enumerate(text.splitlines(), start=1) if raw.strip()), (1, ""))
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return
    if not isinstance(row, dict) or "prompt_len" in row or not any(name in row for name in MOONCAKE_COLUMNS[1:]):
        return
    missing = [name for name in MOONCAKE_COLUMNS if name not in row]
    raise KvlabError(f"{path}, line {line}: a Mooncake-layout row (it has "
                     f"{', '.join(n for n in MOONCAKE_COLUMNS if n in row)}) lacks {', '.join(missing)}; valid: a "
                     f"Mooncake trace's {', '.join(MOONCAKE_COLUMNS)} on every row (hash_ids: the ids of the prompt's "
                     "512-token blocks), or kvlab's own columns prompt_len and output_len")


def _read_mooncake_layout(path: str, text: str) -> LengthTable:
    """A user's JSONL in the Mooncake layout, read as the Mooncake trace is (timestamps as they are, in ms), each
    row checked as a user's row is, under the file's own column names."""
    from kvlab.validate import workload_row
    from kvlab.workload.traces import read_mooncake

    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"{path}, line {line}"
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise KvlabError(f"{where}: {raw.strip()[:60]!r} is not JSON ({exc.msg})") from None
        missing = [name for name in MOONCAKE_COLUMNS if not isinstance(row, dict) or name not in row]
        if missing:
            raise KvlabError(f"{where}: no key {missing[0]!r}; valid: a Mooncake-layout file (its first row's) has "
                             f"{', '.join(MOONCAKE_COLUMNS)} on every row")
        workload_row({ours: row[theirs] for ours, theirs in _MOONCAKE_NAMES.items()}, where, _MOONCAKE_NAMES)
        ids = row["hash_ids"]
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise KvlabError(f"{where}: hash_ids {str(ids)[:40]} is not a list of whole numbers; valid: the ids of "
                             "the prompt's 512-token blocks, e.g. [0, 1, 2]")
    return read_mooncake(Path(path), bin_width=0.0)


def read_user_file(path: str) -> LengthTable:
    """Every request of a user's CSV or JSONL file, sorted by arrival time (stable) when it has arrival times; parsed
    once while its text is unchanged, as a run's work gate and its load both ask for it (a table's arrays are
    read-only, so it is shared)."""
    return _user_table(path, _read_text(path))


@lru_cache(maxsize=4)
def _user_table(path: str, text: str) -> LengthTable:
    from kvlab.validate import workload_row

    if Path(path).suffix.lower() == ".jsonl" and _mooncake_layout(text):
        return _read_mooncake_layout(path, text)
    if Path(path).suffix.lower() == ".jsonl":
        _check_partial_mooncake(path, text)
    rows = _rows_csv(path, text) if Path(path).suffix.lower() == ".csv" else _rows_jsonl(path, text)
    arrival_time: list[float | None] = []
    prompt_len: list[int] = []
    output_len: list[int] = []
    max_tokens: list[int | None] = []
    priorities: list[int] = []  # (a row without one: an error when another row has one, below)
    deadlines: list[float] = []  # (the same for the timeout column)
    turns: list[tuple[int, float | None]] = []  # (session, think time) of each row of a conversations file
    first_line_without_time = None
    for line, row in rows:
        where = f"{path}, line {line}"
        parsed = workload_row(row, where)
        if "session_id" in row or "think_time" in row:
            turns.append(_turn(row, parsed.arrival_time, where))
        elif turns:
            _session_id(None, where)
        if parsed.arrival_time is None and first_line_without_time is None:
            first_line_without_time = line
        arrival_time.append(parsed.arrival_time)
        prompt_len.append(parsed.prompt_len)
        output_len.append(parsed.output_len)
        max_tokens.append(parsed.max_tokens)
        if row.get("priority") not in (None, ""):
            priorities.append(parse_priority(row["priority"], where))
        elif priorities:
            raise KvlabError(f"{where}: priority is empty while other rows have one; valid: an integer on every row")
        if row.get("timeout") not in (None, ""):
            deadlines.append(parse_deadline(row["timeout"], where))
        elif deadlines:
            raise KvlabError(f"{where}: timeout is empty while other rows have one; valid: seconds > 0 on every row, "
                             "or on none")
    if not prompt_len:
        raise KvlabError(f"{path}: no requests in the file; {_EXPECTED}")
    caps = None if all(cap is None for cap in max_tokens) else tuple(max_tokens)
    if priorities and len(priorities) != len(prompt_len):
        raise KvlabError(f"{path}: priority is given on some rows only; valid: an integer on every row, or none")
    if deadlines and len(deadlines) != len(prompt_len):
        raise KvlabError(f"{path}: timeout is given on some rows only; valid: seconds > 0 on every row, or on none")
    return _read_rows(path, turns, arrival_time, prompt_len, output_len, caps, tuple(priorities) or None,
                      first_line_without_time, tuple(deadlines) or None)


def _read_rows(path, turns, arrival_time, prompt_len, output_len, caps, priority, first_line_without_time,
               timeout=None) -> LengthTable:
    """The rows as a table, in arrival order (stable) when they have arrival times; ``priority`` and ``timeout``
    reordered with them."""
    if turns:
        if len(turns) != len(prompt_len):
            raise KvlabError(f"{path}: session_id is given on some rows only; valid: a session id on every row")
        return _conversations(turns, arrival_time, prompt_len, output_len, caps, priority, timeout)
    timed = [t is not None for t in arrival_time]
    if any(timed) and not all(timed):
        raise KvlabError(f"{path}, line {first_line_without_time}: arrival_time is empty while other rows have one; "
                         "valid: an arrival time on every row, or on none (lengths only: arrivals at --rate)")
    prompts, outputs = np.array(prompt_len, dtype=np.int64), np.array(output_len, dtype=np.int64)
    if not any(timed):
        return LengthTable(prompt_len=prompts, output_len=outputs, max_tokens=caps, priority=priority,
                           timeout=timeout)
    times = np.array(arrival_time, dtype=float)
    order = np.argsort(times, kind="stable")
    return LengthTable(
        prompt_len=prompts[order],
        output_len=outputs[order],
        arrival_time=times[order],
        max_tokens=None if caps is None else tuple(caps[i] for i in order.tolist()),
        priority=None if priority is None else tuple(priority[i] for i in order.tolist()),
        timeout=None if timeout is None else tuple(timeout[i] for i in order.tolist()),
        num_out_of_order=out_of_order(times),
    )


def _turn(row: dict, arrival_time: float | None, where: str) -> tuple[int, float | None]:
    """A conversation's row: its session and its think time (None when it has an arrival time instead)."""
    if "session_id" not in row:
        raise KvlabError(f"{where}: think_time needs a session_id column (a turn comes that long after its "
                         "session's previous turn); valid: add session_id, or give arrival_time instead")
    session = _session_id(row["session_id"], where)
    think = row.get("think_time")
    if think is not None and think != "" and arrival_time is not None:
        raise KvlabError(f"{where}: both arrival_time and think_time are given; valid: one of them, on every row")
    if arrival_time is not None:
        return session, None
    if "think_time" not in row:
        raise KvlabError(f"{where}: a turn of session {session} has no arrival_time and no think_time; valid: "
                         "arrival_time (seconds) or think_time (seconds after the session's previous turn) on "
                         "every row")
    return session, _think_time(think, where)


def _conversations(turns, arrival_time, prompt_len, output_len, caps, priority=None, timeout=None) -> LengthTable:
    """Turns of conversations in arrival order, each named as the session so far (sessions.conversation_ids)."""
    from kvlab.workload.sessions import CONTENT_CHUNK_LEN, conversation_ids

    if len({think is None for _, think in turns}) > 1:
        raise KvlabError("a conversations file gives every turn an arrival_time, or every turn a think_time, not "
                         "some one and some the other; valid: one of the two on every row")
    clocks: dict[int, float] = {}
    times = []
    for (session, think), t in zip(turns, arrival_time):
        if think is not None:
            t = clocks[session] = clocks.get(session, 0.0) + think
        times.append(t)
    order = sorted(range(len(times)), key=lambda i: times[i])
    hashes, prefix_len = conversation_ids(((turns[i][0], prompt_len[i], output_len[i]) for i in order),
                                          CONTENT_CHUNK_LEN)
    return LengthTable(
        prompt_len=np.array([prompt_len[i] for i in order], dtype=np.int64),
        output_len=np.array([output_len[i] for i in order], dtype=np.int64),
        arrival_time=np.array([times[i] for i in order], dtype=float),
        max_tokens=None if caps is None else tuple(caps[i] for i in order),
        prefix_hashes=hashes, prefix_len=prefix_len, prefix_chunk_len=CONTENT_CHUNK_LEN,
        priority=None if priority is None else tuple(priority[i] for i in order),
        timeout=None if timeout is None else tuple(timeout[i] for i in order),
    )

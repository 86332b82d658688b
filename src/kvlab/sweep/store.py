"""The sweep's results in DuckDB: one row per point, with every option and every summary metric.

    points         key (hash of the options and kvlab's version) · kvlab_version · status (ok | failed) · error
                   · one column per `kvlab run` option · one column per summary metric (ttft_s_p99, ...)
                   · summary (the whole summary as JSON, its measured window included: kvlab.window; with
                     request classes, each class's entry and each window request's class)
                   · window_latencies (the window's requests' latencies: float64 bytes, kvlab.window.latencies'
                     rows; what a capacity search judges) · elapsed_s · cpu_s · worker · finished_at
    computations   one row per simulation whose result reached the store: key · elapsed_s · worker · finished_at

A user reads it with SQL (``duckdb DIR/sweep.duckdb "select strategy, rate, throughput_rps from points"``) or
into pandas/Polars. Only the sweep's main process writes; each result is committed as it arrives, so a killed
sweep loses at most the points that were running. Every call into DuckDB is held (kvlab.sweep.stop): a Ctrl-C
would interrupt the query, and a transaction must end, committed or rolled back, before a sweep stops.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvlab.errors import KvlabError
from kvlab.sweep.stop import held

DB_NAME = "sweep.duckdb"
COLUMN_TYPES = {"bool": "BOOLEAN", "int": "BIGINT", "float": "DOUBLE", "str": "VARCHAR"}
# Summary entries whose keys are data (a reason per rejected request, an entry per request class, the class of each
# of the window's requests: kvlab.sweep.point), kept as JSON rather than columns.
JSON_METRICS = ("reject_reasons", "classes", "window_classes")
BASE_COLUMNS = {"key": "VARCHAR PRIMARY KEY", "kvlab_version": "VARCHAR", "status": "VARCHAR", "error": "VARCHAR"}
TAIL_COLUMNS = {"summary": "VARCHAR", "window_latencies": "BLOB", "elapsed_s": "DOUBLE", "cpu_s": "DOUBLE", "worker": "VARCHAR",
                "finished_at": "TIMESTAMP"}
RUN_COLUMNS = ("elapsed_s", "cpu_s", "worker", "finished_at")  # how a point was computed, not what it is
# What a row an older kvlab stored without a vllm_version (NULL: the column came with 5109bde, before which the
# default was not written) was sized by: the newest rules that kvlab knew, 0.32.0 from --vllm-version's first commit
# (479fdfa; a version stated otherwise was written) until the column (kvlab.vllm_rules.NEWEST_KNOWN then). A row
# from before --vllm-version was sized by kvlab's one arithmetic, "as vLLM 0.32 prints them" (sizing.py's docstring
# at 9a754b4). Not NEWEST_KNOWN itself: when kvlab learns a newer release, these rows still meant 0.32.0.
NULL_VLLM_VERSION = "0.32.0"


def flatten_metrics(summary: dict[str, Any]) -> dict[str, Any]:
    """{"ttft_s": {"p99": x}, "memory_shares": {"token": y}, ...} -> {"ttft_s_p99": x, "memory_shares_token": y};
    a dict or list below that level is stored as its JSON text."""
    flat: dict[str, Any] = {}
    for name, value in summary.items():
        if name == "name":
            continue  # the strategy's name: the strategy option says it
        if name in JSON_METRICS:
            flat[name] = json.dumps(value, sort_keys=True)
        elif isinstance(value, dict):
            # (a dict or list one level down, e.g. the gateway's rejections by reason: one JSON text column)
            flat.update({f"{name}_{key}": json.dumps(inner, sort_keys=True) if isinstance(inner, dict | list)
                         else inner for key, inner in value.items()})
        else:
            flat[name] = value
    return flat


def _column_type(value: Any) -> str:
    """A metric's column: numbers are DOUBLE (a count is exact in a double; a metric that is 0 in one run and
    0.5 in the next must not meet an integer column), text VARCHAR."""
    if isinstance(value, bool):
        return "BOOLEAN"
    if isinstance(value, str):
        return "VARCHAR"
    if isinstance(value, bytes):
        return "BLOB"
    return "DOUBLE"


def _open_error(path: Path | None, reason: str) -> str:
    """Why a sweep's store did not open, in the user's words (the file is left as it is)."""
    if "not a valid DuckDB database" in reason:
        return (f"{path} is not a sweep's store (the file is not a DuckDB database; kvlab left it as it is); valid: "
                "a folder a kvlab sweep wrote, or another --out")
    if "lock" in reason.lower():
        return f"cannot open {path}: another process has it open (another sweep using this folder?): {reason}"
    return f"cannot open {path}: {reason}"


class Store:
    """A sweep's DuckDB file (or an in-memory database for a throwaway search: ``path=None``)."""

    @held()
    def __init__(self, path: Path | None, option_kinds: dict[str, str]):
        import duckdb

        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = duckdb.connect(":memory:" if path is None else str(path))
        except duckdb.IOException as exc:
            raise KvlabError(_open_error(path, str(exc))) from None
        foreign = self._foreign_tables()
        if foreign:
            self.db.close()
            raise KvlabError(f"{path} is a DuckDB database but not a sweep's store (it holds {foreign}; kvlab left it "
                             "as it is); valid: a folder a kvlab sweep wrote, or another --out")
        columns = {**BASE_COLUMNS, **{name: COLUMN_TYPES[kind] for name, kind in option_kinds.items()}}
        self.db.execute(f"CREATE TABLE IF NOT EXISTS points ({', '.join(f'{_q(c)} {t}' for c, t in columns.items())})")
        self.db.execute("CREATE TABLE IF NOT EXISTS computations (key VARCHAR, status VARCHAR, elapsed_s DOUBLE, "
                        "worker VARCHAR, finished_at TIMESTAMP)")
        self.columns = self._columns()
        for name, kind in {**option_kinds, **{c: t for c, t in TAIL_COLUMNS.items()}}.items():
            self._ensure_column(name, COLUMN_TYPES.get(kind, kind))
        self._fill_defaults()

    def _fill_defaults(self) -> None:
        """Rows an older kvlab stored with NULL for a default get its value (their keys are unchanged): the
        scheduling policy fcfs, the preemption mode the strategy's name says (recompute unless +swap), the vLLM
        version whose rules sized the cache (NULL_VLLM_VERSION)."""
        if "vllm_version" in self.columns:
            self.db.execute("UPDATE points SET vllm_version = ? WHERE vllm_version IS NULL", [NULL_VLLM_VERSION])
        if {"scheduling_policy", "preemption_mode", "strategy"} <= self.columns:
            self.db.execute("UPDATE points SET scheduling_policy = 'fcfs' WHERE scheduling_policy IS NULL")
            self.db.execute("UPDATE points SET preemption_mode = CASE WHEN list_contains(string_split(strategy, '+'), "
                            "'swap') THEN 'swap' ELSE 'recompute' END WHERE preemption_mode IS NULL AND strategy "
                            "IS NOT NULL")

    def _foreign_tables(self) -> str:
        """What in the database is not a sweep's (tables other than points and computations, or a points table
        without its key), in words; "" for a sweep's store or an empty database."""
        tables = [row[0] for row in self.db.execute("SELECT table_name FROM information_schema.tables").fetchall()]
        others = [t for t in tables if t not in ("points", "computations")]
        if others:
            return "table" + "s" * (len(others) > 1) + " " + ", ".join(repr(t) for t in others)
        if "points" in tables and "key" not in self._columns():
            return "a table 'points' with no column 'key'"
        return ""

    def _columns(self) -> set[str]:
        return {row[0] for row in self.db.execute("SELECT column_name FROM information_schema.columns "
                                                   "WHERE table_name = 'points'").fetchall()}

    def _ensure_column(self, name: str, sql_type: str) -> None:
        # A metric or an option kvlab gained since this file was written gets its column now.
        if name not in self.columns:
            self.db.execute(f"ALTER TABLE points ADD COLUMN {_q(name)} {sql_type}")
            self.columns.add(name)

    @held()
    def stored_keys(self, *, include_failed: bool = True) -> set[str]:
        where = "" if include_failed else " WHERE status = 'ok'"
        return {row[0] for row in self.db.execute(f"SELECT key FROM points{where}").fetchall()}

    @held()
    def add(self, key: str, point: dict[str, Any], outcome: dict[str, Any], version: str) -> None:
        """Store one computed point (replacing a failed one being retried) and log the computation, in one
        transaction."""
        summary = outcome["summary"]
        row = {"key": key, "kvlab_version": version, "status": "ok" if outcome["error"] is None else "failed",
               "error": outcome["error"], **point, **(flatten_metrics(summary) if summary else {}),
               "summary": None if summary is None else json.dumps(summary), "window_latencies": outcome.get("latencies"),
               "elapsed_s": outcome["elapsed_s"], "cpu_s": outcome.get("cpu_s"), "worker": outcome["worker"]}
        for name, value in row.items():
            self._ensure_column(name, _column_type(value))
        names = ", ".join(_q(n) for n in row)
        marks = ", ".join("?" for _ in row)
        self.db.execute("BEGIN TRANSACTION")
        try:
            self.db.execute("DELETE FROM points WHERE key = ?", [key])
            self.db.execute(f"INSERT INTO points ({names}, finished_at) VALUES ({marks}, now())", list(row.values()))
            self.db.execute("INSERT INTO computations VALUES (?, ?, ?, ?, now())",
                            [key, row["status"], outcome["elapsed_s"], outcome["worker"]])
            self.db.execute("COMMIT")
        except Exception:
            self.db.execute("ROLLBACK")
            raise

    @held()
    def rows(self, keys: list[str] | None = None) -> list[dict[str, Any]]:
        """Stored points as dicts (every column): all of them, or those of ``keys`` in their order."""
        if keys is None:
            cursor = self.db.execute("SELECT * FROM points ORDER BY key")
        else:
            cursor = self.db.execute("SELECT * FROM points WHERE list_contains(?, key)", [list(set(keys))])
        names = [d[0] for d in cursor.description]
        rows = {row[0]: dict(zip(names, row)) for row in cursor.fetchall()}
        return list(rows.values()) if keys is None else [rows[k] for k in keys if k in rows]

    @held()
    def num_computations(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT key, count(*) FROM computations GROUP BY key").fetchall())

    @held()
    def num_stored(self) -> int:
        (count,) = self.db.execute("SELECT count(*) FROM points").fetchone() or (0,)
        return int(count)

    @held()
    def close(self) -> None:
        self.db.close()


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'

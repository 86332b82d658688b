"""Running sweeps: the same stored results on one worker, two workers and a Ray cluster; a sweep killed halfway
(SIGINT, SIGKILL) resumes and ends with every point computed exactly once; a failing point is stored with its
error and does not stop the sweep."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kvlab.sweep.store import RUN_COLUMNS


class InProcessPool:
    """The sweep's worker pool as two threads in this process (a monkeypatched simulator reaches them)."""
    num_workers = 2

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor

        self.executor = ThreadPoolExecutor(2)

    def submit(self, point):
        from kvlab.sweep import point as point_module

        return self.executor.submit(point_module.compute, point)

SWEEP = ["--strategy", "vllm,orca-oracle", "--rate", "1,2", "--seed", "0,1", "--num-requests", "300"]


def stored(path) -> dict[str, dict]:
    """The stored points by key, without how they were computed (time taken, worker, when)."""
    import duckdb

    with duckdb.connect(str(path / "sweep.duckdb"), read_only=True) as db:
        cursor = db.execute("SELECT * FROM points")
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, row)) for row in cursor.fetchall()]
    return {row["key"]: {k: v for k, v in row.items() if k not in RUN_COLUMNS} for row in rows}


def computations(path) -> dict[str, int]:
    import duckdb

    with duckdb.connect(str(path / "sweep.duckdb"), read_only=True) as db:
        return dict(db.execute("SELECT key, count(*) FROM computations GROUP BY key").fetchall())


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    from kvlab.cli import main

    out = tmp_path_factory.mktemp("one")
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", *SWEEP, "--workers", "1", "--out", str(out), "--json"])
    assert exit_info.value.code in (0, None)
    return out


def test_one_and_two_workers_store_identical_results(one_worker, kvlab, tmp_path):
    r = kvlab("sweep", *SWEEP, "--workers", "2", "--out", tmp_path, "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert data["num_computed"] == 8 and len(data["points"]) == 8
    assert stored(tmp_path) == stored(one_worker)
    assert len(stored(tmp_path)) == 8
    # The points carry their options and `kvlab run --json`'s summary
    point = data["points"][0]
    assert {"strategy", "rate", "seed", "num_requests", "block_size", "throughput_rps", "ttft_s",
            "normalized_latency_s_per_token", "status", "key"} <= set(point)
    assert point["status"] == "ok" and point["num_finished"] == 300


def test_a_stored_point_matches_kvlab_run(one_worker, kvlab):
    r = kvlab("run", "orca-oracle", "--rate", "2", "--seed", "1", "-n", "300", "--json")
    expected = r.json()["strategies"][0]
    rows = [row for row in stored(one_worker).values()
            if row["strategy"] == "orca-oracle" and row["rate"] == 2.0 and row["seed"] == 1]
    assert len(rows) == 1
    row = rows[0]
    assert row["throughput_rps"] == expected["throughput_rps"]
    assert row["ttft_s_p99"] == expected["ttft_s"]["p99"]
    assert row["normalized_latency_s_per_token_mean"] == expected["normalized_latency_s_per_token"]["mean"]
    assert row["preemptions"] == expected["preemptions"]


def test_running_again_computes_nothing_and_more_points_only_the_new_ones(one_worker, kvlab, tmp_path):
    import shutil

    shutil.copytree(one_worker, tmp_path / "s")
    r = kvlab("sweep", *SWEEP, "--workers", "2", "--out", tmp_path / "s", "--json")
    assert r.exit_code == 0 and r.json()["num_computed"] == 0
    r = kvlab("sweep", *SWEEP[:-4], "--seed", "0,1,2", "--num-requests", "300", "--workers", "2",
              "--out", tmp_path / "s", "--json")
    assert r.json()["num_computed"] == 4 and len(r.json()["points"]) == 12
    assert set(computations(tmp_path / "s").values()) == {1}


def test_the_table_says_what_was_computed_and_where_it_is(one_worker, kvlab, tmp_path, monkeypatch):
    import shutil

    shutil.copytree(one_worker, tmp_path / "s")
    monkeypatch.setenv("COLUMNS", "80")
    r = kvlab("sweep", *SWEEP, "--out", tmp_path / "s")
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stdout.split())  # (the footnotes as read, whatever their wrapping)
    assert "Sweep: 8 points" in r.stdout and "orca-oracle" in r.stdout and "mean normalized latency" in text
    assert max(len(line) for line in r.stdout.splitlines()) <= 80 and "…" not in r.stdout
    assert "Computed 0 points now" in r.stdout and "sweep.duckdb" in r.stdout
    # (what every point shares, the strategy shown in the table: not repeated)
    assert ("Every point: opt-13b · on A100-40GB · TP 1 · cost roofline · workload paper-sharegpt · 300 requests."
            in text)
    assert (tmp_path / "s" / "latency.png").exists() and (tmp_path / "s" / "sweep.html").exists()


def test_the_store_answers_sql(one_worker):
    import duckdb

    with duckdb.connect(str(one_worker / "sweep.duckdb"), read_only=True) as db:
        rows = db.execute("SELECT strategy, avg(throughput_rps) FROM points WHERE rate = 2 GROUP BY strategy "
                          "ORDER BY strategy").fetchall()
    assert [name for name, _ in rows] == ["orca-oracle", "vllm"]
    assert dict(rows)["vllm"] > dict(rows)["orca-oracle"]  # at 2 req/s Orca (Oracle) cannot keep up


INTERRUPTED = ["--strategy", "vllm,orca-oracle", "--rate", "1.5,2,2.5,3", "--num-requests", "6000",
               "--workers", "1", "--yes"]


def _sweep_process(out):
    return subprocess.Popen([sys.executable, "-m", "kvlab", "sweep", *INTERRUPTED, "--out", str(out), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for_stored(process, num: int) -> None:
    """Read the sweep's progress lines until ``num`` points are stored."""
    deadline = time.monotonic() + 120
    for line in process.stderr:
        if line.startswith("points: ") and int(line.split()[1].split("/")[0]) >= num:
            return
        assert time.monotonic() < deadline, "the sweep did not store points in time"
    pytest.fail(f"the sweep ended before storing {num} points: {process.wait()}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_a_killed_sweep_resumes_and_computes_each_point_once(tmp_path, sig):
    process = _sweep_process(tmp_path)
    try:
        _wait_for_stored(process, 2)
        if sig == signal.SIGINT:
            os.killpg(process.pid, sig)  # Ctrl-C: the terminal signals the whole process group
        else:
            os.kill(process.pid, sig)  # kill -9 of the sweep alone: its workers must notice and leave
        # (the output pipes close when the sweep and its workers are all gone)
        _, err = process.communicate(timeout=60)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the workers of a SIGKILLed sweep, which we started
        except ProcessLookupError:
            pass
    if sig == signal.SIGINT:
        assert process.returncode == 130 and "stopped by SIGINT:" in err and "Traceback" not in err
    else:
        assert process.returncode == -signal.SIGKILL
    num_before = len(stored(tmp_path))
    assert 2 <= num_before < 8
    again = subprocess.run([sys.executable, "-m", "kvlab", "sweep", *INTERRUPTED, "--out", str(tmp_path),
                            "--json"], check=False, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    import json

    data = json.loads(again.stdout)
    assert data["num_computed"] == 8 - num_before
    assert len(data["points"]) == 8 and all(p["status"] == "ok" for p in data["points"])
    counts = computations(tmp_path)
    assert len(counts) == 8 and set(counts.values()) == {1}  # every point computed, each exactly once


def test_a_failing_point_is_stored_with_its_error_and_the_sweep_goes_on(tmp_path, monkeypatch):
    """A point that fails while it runs (here the simulator raising, which no valid input makes it do) is
    stored as failed; the others are computed; a rerun leaves it alone unless asked to retry."""

    import kvlab
    from kvlab.sweep import point as point_module
    from kvlab.sweep.grid import expand, parse_cli_args, run_options
    from kvlab.sweep.runner import Runner
    from kvlab.sweep.store import Store

    real = point_module.simulate_point

    def flaky(point):
        if point["rate"] == 2.0:
            raise RuntimeError("the simulator broke")
        return real(point)

    monkeypatch.setattr(point_module, "simulate_point", flaky)
    points = expand(parse_cli_args(["--rate", "1,2,3", "-n", "100"]))
    store = Store(tmp_path / "sweep.duckdb", {n: s.kind for n, s in run_options().items()})
    runner = Runner(store, InProcessPool(), kvlab.__version__)
    rows = runner.run(points)
    assert [r["status"] for r in rows] == ["ok", "failed", "ok"]
    assert rows[1]["error"] == "RuntimeError: the simulator broke" and rows[1]["throughput_rps"] is None
    assert runner.num_computed == 3 and runner.num_failed == 1
    again = Runner(store, InProcessPool(), kvlab.__version__)
    again.run(points)
    assert again.num_computed == 0
    monkeypatch.setattr(point_module, "simulate_point", real)
    retry = Runner(store, InProcessPool(), kvlab.__version__, retry_failed=True)
    assert [r["status"] for r in retry.run(points)] == ["ok", "ok", "ok"]
    assert retry.num_computed == 1
    store.close()


def test_three_varying_options_leave_room_for_every_number_at_80_columns(kvlab, tmp_path, monkeypatch):
    from kvlab.cli.sweep import _num

    monkeypatch.setenv("COLUMNS", "80")
    r = kvlab("sweep", "--strategy", "continuous+paged+swap,orca-oracle", "--block-size", "16,32",
              "--gpu-memory-utilization", "0.8,0.9", "-n", "40", "--workers", "2", "--out", tmp_path / "s", "--json")
    assert r.exit_code == 0, r.stderr
    points = r.json()["points"]
    text = kvlab("sweep", "--strategy", "continuous+paged+swap,orca-oracle", "--block-size", "16,32",
                 "--gpu-memory-utilization", "0.8,0.9", "-n", "40", "--out", tmp_path / "s").stdout
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text, text
    for point in points:  # each row whole: the three options and req/s, and TPOT's p99 last
        row = f"{point['strategy']} {point['gpu_memory_utilization']} {point['block_size']} " \
              f"{point['throughput_rps']:.3f}"
        assert any(" ".join(line.split()).startswith(row) and line.split()[-1] == _num(point['tpot_s']['p99'], 1e3)
                   for line in text.splitlines()), (row, text)


def test_a_file_that_is_not_a_store_is_one_line_and_left_as_it_is(kvlab, tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "sweep.duckdb").write_bytes(b"my notes, not a database\n")
    r = kvlab("sweep", "--rate", "1,2", "--num-requests", "50", "--out", tmp_path / "s")
    assert r.exit_code == 2
    assert r.stderr.strip() == (f"error: {tmp_path / 's' / 'sweep.duckdb'} is not a sweep's store (the file is not a "
                                "DuckDB database; kvlab left it as it is); valid: a folder a kvlab sweep wrote, or "
                                "another --out")
    assert (tmp_path / "s" / "sweep.duckdb").read_bytes() == b"my notes, not a database\n"


@pytest.mark.parametrize(("table", "what"), [("points (x INTEGER)", "a table 'points' with no column 'key'"),
                                             ("other (x INTEGER)", "table 'other'")])
def test_another_programs_duckdb_file_is_refused_and_left_as_it_is(kvlab, tmp_path, table, what):
    import duckdb

    (tmp_path / "s").mkdir()
    path = tmp_path / "s" / "sweep.duckdb"
    with duckdb.connect(str(path)) as db:
        db.execute(f"CREATE TABLE {table}")
        db.execute(f"INSERT INTO {table.split()[0]} VALUES (7)")
    before = path.read_bytes()
    r = kvlab("sweep", "--rate", "1,2", "--num-requests", "50", "--out", tmp_path / "s")
    assert r.exit_code == 2
    assert r.stderr.strip() == (f"error: {path} is a DuckDB database but not a sweep's store (it holds {what}; kvlab "
                                "left it as it is); valid: a folder a kvlab sweep wrote, or another --out")
    assert path.read_bytes() == before


def test_a_one_point_sweep_says_one_point(kvlab, tmp_path):
    r = kvlab("sweep", "-n", "20", "--workers", "1", "--out", tmp_path / "s")
    assert r.exit_code == 0, r.stderr
    assert "Sweep: 1 point" in r.stdout and "Sweep: 1 points" not in r.stdout


def test_a_default_stated_or_an_alias_is_the_point_already_stored(one_worker, kvlab, tmp_path):
    """trial 46, finding 4: --vllm-version 0.32.0 (the newest), --preemption-mode recompute, --scheduling-policy
    fcfs and vllm+prefix (= vllm) are the points already stored: nothing is computed again, and the stored
    columns hold the values, not NULL."""
    import shutil

    import duckdb

    from kvlab.vllm_rules import NEWEST_KNOWN

    shutil.copytree(one_worker, tmp_path / "s")
    stated = ["--vllm-version", NEWEST_KNOWN, "--preemption-mode", "recompute", "--scheduling-policy", "fcfs"]
    r = kvlab("sweep", "--strategy", "vllm+prefix,orca-oracle+recompute", *SWEEP[2:], *stated, "--workers", "1",
              "--out", tmp_path / "s", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["num_computed"] == 0 and len(r.json()["points"]) == 8
    with duckdb.connect(str(tmp_path / "s" / "sweep.duckdb"), read_only=True) as db:
        counts = db.execute("SELECT count(*) FROM points WHERE scheduling_policy = 'fcfs' AND preemption_mode = "
                            "'recompute' AND vllm_version = ?", [NEWEST_KNOWN]).fetchone()
        strategies = {row[0] for row in db.execute("SELECT strategy FROM points").fetchall()}
    assert counts == (8,) and strategies == {"vllm", "orca-oracle"}


def test_rows_stored_with_null_defaults_get_their_values_when_the_store_opens(one_worker, tmp_path):
    """A store an older kvlab wrote (scheduling_policy, preemption_mode and vllm_version NULL for defaults) is filled
    in: a query by value finds its rows, under the keys they had."""
    import shutil

    import duckdb

    from kvlab.sweep.grid import row_kinds
    from kvlab.sweep.store import Store

    shutil.copytree(one_worker, tmp_path / "s")
    path = tmp_path / "s" / "sweep.duckdb"
    with duckdb.connect(str(path)) as db:
        db.execute("UPDATE points SET scheduling_policy = NULL, preemption_mode = NULL, vllm_version = NULL")
        db.execute("UPDATE points SET strategy = 'vllm+swap' WHERE strategy = 'vllm'")
    Store(path, row_kinds()).close()
    with duckdb.connect(str(path), read_only=True) as db:
        rows = set(db.execute("SELECT strategy, preemption_mode, scheduling_policy, vllm_version FROM points").fetchall())
    assert rows == {("vllm+swap", "swap", "fcfs", "0.32.0"), ("orca-oracle", "recompute", "fcfs", "0.32.0")}
    assert set(stored(tmp_path / "s")) == set(stored(one_worker))


def test_a_store_from_before_the_vllm_version_column_reads_as_the_rules_it_was_sized_by(one_worker, kvlab, tmp_path):
    """trial 46: a store written before rows named their vLLM version has no such column (or NULL in it); opened
    again, its rows say 0.32.0 (what the default was then), and a sweep that adds a version beside them prints
    that, not None."""
    import shutil

    import duckdb

    shutil.copytree(one_worker, tmp_path / "s")
    path = tmp_path / "s" / "sweep.duckdb"
    with duckdb.connect(str(path)) as db:
        db.execute("ALTER TABLE points DROP COLUMN vllm_version")
    r = kvlab("sweep", "--strategy", "vllm", "--rate", "1", "--seed", "0", "--num-requests", "300", "--vllm-version",
              "0.32.0,0.10.1", "--workers", "1", "--out", tmp_path / "s")
    assert r.exit_code == 0, r.stderr
    assert "None" not in r.stdout and "0.32.0" in r.stdout and "0.10.1" in r.stdout, r.stdout
    assert "Computed 1 point now, 1 was stored already" in " ".join(r.stdout.split()), r.stdout
    with duckdb.connect(str(path), read_only=True) as db:
        versions = db.execute("SELECT vllm_version, count(*) FROM points GROUP BY 1 ORDER BY 1").fetchall()
    assert versions == [("0.10.1", 1), ("0.32.0", 8)]


def test_a_searchs_progress_counts_the_points_asked_for_so_far(capsys):
    """trial 46: capacity's progress total was a guess of the search's length, so it jumped (3/8, then 4/12) and
    fell (26/28, then 26/27). A search's total is now the points it has asked for so far: it never falls, it says
    so, and it is reached at the end. A sweep's one grid keeps its exact total."""

    import kvlab
    from kvlab.sweep.capacity import parse_slo, search_capacities
    from kvlab.sweep.grid import expand, parse_cli_args, row_kinds
    from kvlab.sweep.runner import Runner
    from kvlab.sweep.session import LineProgress
    from kvlab.sweep.store import Store

    seen, line = [], LineProgress()

    def progress(*args):
        seen.append(args)
        line(*args)

    store = Store(None, row_kinds())
    runner = Runner(store, InProcessPool(), kvlab.__version__, progress=progress)
    configurations = [{k: v for k, v in p.items() if k != "rate"}
                      for p in expand(parse_cli_args(["-n", "40", "--cost", "roofline"]))]
    search, = search_capacities(configurations, runner, parse_slo("p99_ttft<2s"), start_rates=[1.0], rtol=0.2,
                                max_rate=100.0)
    store.close()
    totals = [total for _, _, _, total, _ in seen]
    assert totals == sorted(totals) and len(set(totals)) > 2  # it grew as the search asked for more, and never fell
    assert not any(final for *_, final in seen) and seen[-1][0] == seen[-1][3] == len(search.probes)
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == f"points: {totals[-1]} stored of {totals[-1]} asked for so far · running 0 · failed 0"
    LineProgress()(3, 2, 0, 8, True)
    assert capsys.readouterr().err == "points: 3/8 stored · running 2 · failed 0\n"

"""The fleet from the command line and the sweep (issue 23): --replicas, --router and the session workload are run
options, declared once, resolved into the configuration's key, and run through the service."""

from __future__ import annotations

import json


def test_one_replica_behind_any_router_is_kvlab_run(kvlab):
    alone = kvlab("run", "vllm", "-n", "80", "--rate", "3", "--json").json()
    fleet = kvlab("run", "vllm", "-n", "80", "--rate", "3", "--replicas", "1", "--json").json()
    assert json.dumps(alone["strategies"], sort_keys=True) == json.dumps(fleet["strategies"], sort_keys=True)


def test_a_fleet_reports_its_replicas_router_and_decisions(kvlab):
    r = kvlab("run", "vllm+prefix", "--replicas", "3", "--router", "prefix", "-w", "sessions", "--rate", "4",
              "-n", "240", "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert (data["setup"]["replicas"], data["setup"]["router"], data["setup"]["num_gpus"]) == (3, "prefix", 3)
    fleet = data["strategies"][0]["fleet"]
    assert fleet["num_replicas"] == 3 and len(fleet["replicas"]) == 3
    assert sum(fleet["decisions"]["per_replica"]) == 240 == data["strategies"][0]["num_finished"]
    assert fleet["prefix_hit_rate"] > 0.2  # turns find their conversation cached where it last ran
    text = " ".join(kvlab("run", "vllm+prefix", "--replicas", "3", "--router", "prefix", "-w", "sessions",
                          "--rate", "4", "-n", "240").stdout.split())
    assert "3 replicas behind the prefix router, each opt-13b" in text and "load imbalance" in text


def test_the_sweep_varies_replicas_and_routers_and_keys_them(kvlab, tmp_path):
    out = tmp_path / "sweep"
    r = kvlab("sweep", "--replicas", "1,2", "--rate", "4", "-n", "120", "--workers", "1", "--out", out, "--json")
    assert r.exit_code == 0, r.stderr
    points = r.json()["points"]
    assert sorted(p["replicas"] for p in points) == [1, 2]
    two = next(p for p in points if p["replicas"] == 2)
    one = next(p for p in points if p["replicas"] == 1)
    assert two["num_gpus"] == 2 and two["ttft_s"]["p99"] < one["ttft_s"]["p99"]  # half the load per replica


def test_fleet_and_session_options_refused_where_they_mean_nothing(kvlab):
    for args, message in [
        (("--router", "least-kv"), "--router least-kv needs a fleet: give --replicas 2 or more"),
        (("--replicas", "2", "--router-scorers", "prefix:1"), "--router-scorers applies only to --router weighted"),
        (("--replicas", "2", "--router", "nearest"), "--router 'nearest' is not one of its values"),
        (("--replicas", "2", "--router", "weighted", "--router-scorers", "prefix:inf"), "not a finite number"),
        (("--replicas", "-1"), "--replicas -1 is out of range"),
        (("--think-time", "5"), "--think-time applies only to --workload sessions"),
        (("-w", "sessions", "--think-time", "-2"), "--think-time -2 is out of range"),
    ]:
        r = kvlab("run", "vllm", "-n", "10", *args)
        assert r.exit_code == 2 and message in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_a_sweep_stores_a_fleets_figures_as_kvlab_run_prints_them(kvlab, tmp_path):
    """Trial 50: a router sweep stored no `fleet` block (load imbalance, prefix hit rate), the figures routers are
    compared on, though docs/sweep.md says the store holds what `kvlab run --json` prints."""
    import duckdb

    args = ("--strategy", "vllm", "--rate", "4", "-n", "60", "--replicas", "2", "--router", "least-requests")
    assert kvlab("sweep", *args, "--out", tmp_path).exit_code == 0
    run = kvlab("run", "vllm", *args[2:], "--json").json()["strategies"][0]
    with duckdb.connect(str(tmp_path / "sweep.duckdb"), read_only=True) as db:
        summary, imbalance = db.sql("select summary, fleet_load_imbalance from points").fetchone()
    stored = json.loads(summary)
    assert stored["fleet"] == run["fleet"] and imbalance == run["fleet"]["load_imbalance"]
    assert "typical_iteration" not in stored  # (the run's explanation, not the run's)

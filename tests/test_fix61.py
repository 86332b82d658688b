"""fix61: trial 60's leftover findings: --max-time without a unit, --workers beyond the cores, `kvlab size`'s
proposals for a model too large, calibrate's estimate and argument order, progress off a terminal, capacity's
rounds, fig12's table."""

from __future__ import annotations

import pytest

BARE = "error: --max-time '5' has no unit; valid: a number with s, m or h, such as 90s, 20m or 2h"


@pytest.mark.parametrize("command", [("sweep", "--rate", "1,2"), ("capacity",),
                                     ("capacity", "--replicas", "auto", "--rate", "2")])
def test_a_max_time_without_its_unit_is_refused_naming_the_valid_spellings(kvlab, tmp_path, command):
    # (a bare 5 was taken as 5 seconds though the error text and the help name 90s, 20m or 2h; capacity's fleet
    # search took any --max-time unread)
    out = tmp_path / "s"
    r = kvlab(*command, "--max-time", "5", "-n", "20", "--workers", "1", "--out", out)
    assert r.exit_code == 2, r.stdout + r.stderr
    assert r.stderr.strip() == BARE
    assert not out.exists()


def test_a_max_time_with_its_unit_still_counts(kvlab, tmp_path):
    r = kvlab("sweep", "--rate", "1,2", "-n", "20000", "--workers", "1", "--max-time", "0.5s", "--out", tmp_path / "s")
    assert r.exit_code == 2 and "more than --max-time 0.5s; add --yes" in r.stderr


def test_workers_beyond_the_cores_are_capped_at_them_saying_so(kvlab, tmp_path, monkeypatch):
    from kvlab.sweep import session

    monkeypatch.setattr(session, "default_workers", lambda: 2)
    r = kvlab("sweep", "--rate", "1", "-n", "20", "--workers", "1000", "--out", tmp_path / "s", "--json")
    assert r.exit_code == 0, r.stderr
    assert ("note: --workers 1000 is more than the 2 cores this machine gives kvlab; using 2; more run on a Ray "
            "cluster (--ray-address)") in r.stderr
    r = kvlab("sweep", "--rate", "1", "-n", "20", "--workers", "2", "--out", tmp_path / "s", "--json")
    assert r.exit_code == 0 and "note: --workers" not in r.stderr


def test_a_session_and_calibrate_use_at_most_the_cores(monkeypatch, capsys):
    # (sweep, capacity and paper share the Session; calibrate --runs asks capped_workers itself)
    from kvlab.sweep import session

    monkeypatch.setattr(session, "default_workers", lambda: 3)
    assert session.capped_workers(64) == 3
    assert "note: --workers 64 is more than the 3 cores this machine gives kvlab; using 3" in capsys.readouterr().err
    assert session.capped_workers(3) == 3 and capsys.readouterr().err == ""
    assert session.Session(None, 1000, False, None, True).workers == 3
    assert session.Session(None, 1000, False, "10.0.0.1:6379", True).workers == 1000  # (a cluster's CPUs)


def test_size_proposes_the_fewest_gpus_first_and_no_tensor_parallelism_beyond_a_node(kvlab):
    # (trial 60, 9g: TP 128 on 128 T4s came before the 72-GPU TP 8 x PP 9, and GB10, one GPU a machine, at TP 8)
    r = kvlab("size", "llama-3.1-405b", "--gpu", "t4", "-tp", "8")
    text = " ".join(r.stderr.split())
    assert r.exit_code == 2, text
    assert "--tensor-parallel-size 128" not in text and "GB10" not in text
    assert ("Would fit: a larger GPU at the same parallelism: H200, B200, MI300X; with pipeline stages too (`kvlab "
            "fit`'s fewest GPUs): --tensor-parallel-size 8 --pipeline-parallel-size 9 (72 x this GPU)") in text


def test_size_names_a_nodes_gpus_where_no_tensor_parallel_size_within_it_holds_the_weights(kvlab):
    text = " ".join(kvlab("size", "deepseek-v3", "--gpu", "t4").stderr.split())
    assert "nor at any tensor-parallel size up to 8 on this GPU (a node's 8 GPUs)" in text
    assert "--pipeline-parallel-size 31 (62 x this GPU)" in text
    # GB10 comes one to a machine: no tensor parallelism on it, pipeline stages across machines
    text = " ".join(kvlab("size", "llama-3.1-405b", "--gpu", "gb10").stderr.split())
    assert "up to 1 on this GPU (a node's 1 GPU)" in text
    assert "--tensor-parallel-size 1 --pipeline-parallel-size 8 (8 x this GPU)" in text


def _tiny_runs(tmp_path, count=3):
    import copy
    import json

    from test_cost_fit import RUN

    runs = [{**copy.deepcopy(RUN), "id": f"r{i}"} for i in range(count)]
    for i, run in enumerate(runs):
        run["workload"]["stages"] = [{"rate": 10.0 * 2**i, "duration": 1}, {"rate": 20.0 * 2**i, "duration": 1}]
    file = tmp_path / "runs.json"
    file.write_text(json.dumps({"experiments": runs}))
    return file


def test_calibrate_runs_says_what_it_will_do_and_about_how_long_before_the_fit(kvlab, tmp_path):
    # (trial 60, finding 8: minutes of replays without a word of how long; sweep and capacity say it first)
    r = kvlab("calibrate", "--runs", _tiny_runs(tmp_path), "--fit", "bandwidth_efficiency,request_latency_s",
              "--iterations", "2", "--out", tmp_path / "p.toml")
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stderr.split())
    plan = ("calibrate: 3 runs, each replayed with 4 arrival draws (", " requests an iteration), up to 2 iterations of "
            "replay and fit (--iterations), then 3 leave-one-out replays: up to 9 replays, about ")
    assert text.startswith(plan[0]) and plan[1] in text, text
    assert " on 1 worker (run r2 replayed in " in text  # (the run with the most requests, timed)
    assert text.index(plan[1]) < text.index("iteration 1: rms relative residual")


def test_the_timed_first_replay_is_the_one_the_fit_keeps(tmp_path):
    # (the plan's replay is round 1's own: the fit is the same as one made without a plan)
    from kvlab.cost import fit as F
    from kvlab.cost.measured import read_runs

    runs = read_runs(_tiny_runs(tmp_path))
    fitted = ("bandwidth_efficiency", "request_latency_s")
    lines, counts = [], []
    said = F.calibrate_runs(runs, fitted, max_iterations=2, progress=lines.append,
                            replayed=lambda what, n, total: counts.append((what, n, total)))
    quiet = F.calibrate_runs(runs, fitted, max_iterations=2)
    assert said.fit.constants == quiet.fit.constants and said.history == quiet.history
    assert lines[0].startswith("calibrate: 3 runs")
    # (round 1's first count includes the timed replay; each later round counts all three)
    assert counts[:2] == [("iteration 1", 2, 3), ("iteration 1", 3, 3)]
    assert counts[2:] == [("iteration 2", n, 3) for n in (1, 2, 3)]


def test_replay_progress_says_a_line_at_most_every_interval_and_none_at_an_iterations_end():
    import io

    from rich.console import Console

    from kvlab.cli.cost import ReplayProgress

    buffer = io.StringIO()
    progress = ReplayProgress(Console(file=buffer, width=200))
    progress("iteration 1", 1, 13)  # (not yet EVERY_S seconds)
    progress.last -= ReplayProgress.EVERY_S
    progress("iteration 1", 13, 13)  # (an iteration's end: its own line follows)
    progress("iteration 1", 12, 13)
    assert buffer.getvalue().splitlines() == ["iteration 1: 12 of 13 runs replayed, 0 s in all so far"]


def test_off_a_terminal_progress_is_a_line_a_tenth_or_five_seconds_and_the_last(capsys, monkeypatch):
    # (trial 60, finding 9a: a line per stored point, about 100 for `kvlab paper fig12`)
    from kvlab.sweep.session import LineProgress

    clock = [0.0]
    monkeypatch.setattr("time.monotonic", lambda: clock[0])
    line = LineProgress()
    for done in range(101):
        line(done, 2, 0, 100)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"points: {n}/100 stored · running 2 · failed 0" for n in range(0, 101, 10)]
    line = LineProgress()
    for done in range(5):
        clock[0] += 2.6  # (a point every 2.6 s of 1,000: a line every 5 s)
        line(done, 1, 0, 1000)
    assert capsys.readouterr().err.splitlines() == [f"points: {n}/1000 stored · running 1 · failed 0" for n in (0, 2, 4)]
    line(5, 1, 0, 1000)
    line.stop()  # (the end: the last, held back, is said)
    assert capsys.readouterr().err == "points: 5/1000 stored · running 1 · failed 0\n"
    line.stop()
    assert capsys.readouterr().err == ""


def test_a_sweep_in_a_log_says_the_last_count(kvlab, tmp_path):
    r = kvlab("sweep", "--rate", "1,2,3", "-n", "20", "--workers", "1", "--out", tmp_path / "s", "--json")
    assert r.exit_code == 0, r.stderr
    assert [x for x in r.stderr.splitlines() if x.startswith("points:")][-1] == \
        "points: 3/3 stored · running 0 · failed 0"


def test_capacitys_round_line_gives_no_total_that_grows(kvlab, tmp_path):
    # (trial 60, 9b: "round 4 of ~10 ... round 8 of ~14": the rounds so far plus those left rose as brackets were found)
    r = kvlab("capacity", "-n", "100", "--cost", "roofline", "--workers", "1", "--out", tmp_path)
    assert r.exit_code == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("capacity search: round ")]
    assert lines and all(" of ~" not in line for line in lines), lines
    assert lines[0].startswith("capacity search: round 1 done in ")


@pytest.mark.parametrize("args, said", [
    ((), "error: kvlab calibrate needs bench folders (kvlab bench --out DIR) or --runs FILE"),
    (("--runs", "{runs}", "--iterations", "0"), "error: --iterations 0: valid: 1 to 20 replay-and-fit rounds"),
    (("--runs", "{missing}"), "nope.json"),
])
def test_without_scipy_calibrate_checks_its_arguments_first(kvlab, tmp_path, monkeypatch, args, said):
    # (trial 60, 9i: with no arguments and no SciPy, calibrate asked for SciPy before it asked for folders or --runs)
    import sys

    runs = _tiny_runs(tmp_path)
    monkeypatch.setitem(sys.modules, "scipy", None)  # (import scipy now raises ImportError, as where it is absent)
    args = [a.format(runs=runs, missing=tmp_path / "nope.json") for a in args]
    r = kvlab("calibrate", *args, "--out", tmp_path / "p.toml")
    assert r.exit_code == 2 and said in r.stderr and "SciPy" not in r.stderr, r.stderr
    r = kvlab("calibrate", "--runs", runs, "--out", tmp_path / "p.toml")  # (arguments right: SciPy is asked for)
    assert r.exit_code == 2 and "kvlab calibrate needs SciPy" in r.stderr


def test_fig12_draws_the_projects_table_and_logs_a_few_progress_lines(kvlab, tmp_path):
    # (trial 60: 9h, a heavy-box table unlike every other command's; 9a, about 100 progress lines in a log)
    r = kvlab("paper", "fig12", "--duration", "20", "--workers", "1", "--out", tmp_path)
    assert r.exit_code == 0, r.stderr
    assert not set("┏┃━┡│┗") & set(r.stdout), r.stdout
    assert " system " in r.stdout and "─" * 20 in r.stdout  # (box.SIMPLE_HEAD: one rule under the header)
    progress = [line for line in r.stderr.splitlines() if line.startswith("points: ")]
    assert progress[-1].startswith("points: 112 stored of 112 asked for so far")
    assert len(progress) <= 20, progress


def test_a_sweep_refuses_two_names_of_one_behaviour_and_keeps_vllm_beside_continuous_paged(kvlab, tmp_path):
    # (vllm-paper, vllm+noprefix and continuous+paged batch, page, preempt and cache alike: the sweep ran each, with
    # equal results; vllm caches prefixes, so vllm,continuous+paged are two simulations and both run)
    r = kvlab("sweep", "--strategy", "vllm+noprefix,continuous+paged", "-n", "20", "--workers", "1",
              "--out", tmp_path / "a")
    assert r.exit_code == 2 and not (tmp_path / "a").exists()
    assert r.stderr.strip() == ("error: --strategy vllm+noprefix,continuous+paged: 'continuous+paged' simulates what "
                                "'vllm+noprefix' does (same batching, memory, preemption and prefix caching: equal "
                                "results by construction), given twice; valid: each strategy once")
    r = kvlab("sweep", "--strategy", "vllm-paper,orca-max,continuous+paged", "-n", "20", "--workers", "1",
              "--out", tmp_path / "b")
    assert r.exit_code == 2 and "'continuous+paged' simulates what 'vllm-paper' does" in r.stderr
    r = kvlab("sweep", "--strategy", "vllm,continuous+paged", "-n", "100", "--workers", "1", "--out", tmp_path / "c",
              "--json")
    assert r.exit_code == 0, r.stderr
    by = {p["strategy"]: p["throughput_rps"] for p in r.json()["points"]}
    assert set(by) == {"vllm", "continuous+paged"} and by["vllm"] != by["continuous+paged"]  # (prefix caching)

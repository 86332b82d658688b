"""Fix 57: trial 56c's findings on the faces (hybrid models), each through the CLI."""

from __future__ import annotations

import warnings

HYBRID = "tests/data/sizing_configs/qwen3.6-27b.json"
ON_HYBRID = ("--model", HYBRID, "--gpu", "h100-sxm")


def _flat(text: str) -> str:
    return " ".join(text.split())


def _fixed(tmp_path, n: int = 20, prompt: int = 960, output: int = 64):
    """``n`` requests of ``prompt`` + ``output`` tokens, all at once (the trial's fixed_200_1024.csv, shorter)."""
    path = tmp_path / f"fixed_{n}_{prompt + output}.csv"
    path.write_text("arrival_time,prompt_len,output_len\n" + f"0,{prompt},{output}\n" * n)
    return path


def _cache_note(**options) -> str:
    """The note `kvlab run` prints of this hybrid's KV cache (kvlab.config.resolve's, on the configuration)."""
    from kvlab.config.resolve import quietly

    notes = quietly({"model": HYBRID, "gpu": "h100-sxm", **options}).cache.notes
    assert len(notes) == 1 and "keeps 4 KV cache groups" in notes[0]
    return notes[0]


def test_a_run_that_serves_no_request_exits_1_after_its_report(kvlab, tmp_path):
    """Trial 56c, finding 6: with 5 blocks of 784 every 1,024-token request of qwen3.6-27b is rejected, and `run`
    exited 0. It prints its report (and --json its JSON), then one line, and exits 1; with a pool that serves, 0."""
    workload = _fixed(tmp_path)
    args = ("run", "vllm", *ON_HYBRID, "--workload", workload, "--num-gpu-blocks", "5")
    r = kvlab(*args)
    assert r.exit_code == 1, r.stderr
    assert "Run: vllm" in r.stdout and "Rejected: vllm 20" in _flat(r.stdout)  # (the report, as before)
    last = _flat(r.stderr).split("error: ")
    assert len(last) == 2, r.stderr  # (one error line, the last thing said)
    assert last[1].startswith("no request was served (vllm rejected 20 as "), r.stderr
    assert last[1].endswith("the figures above measure nothing; valid: a KV cache in which the workload's requests fit "
                            "(`kvlab size --context-len N` gives how many fit) and prompts within max_model_len")
    data = kvlab(*args, "--json")
    assert data.exit_code == 1 and "error: no request was served" in data.stderr
    assert data.json()["strategies"][0]["num_rejected"] == 20
    served = kvlab("run", "vllm", *ON_HYBRID, "--workload", workload, "--num-gpu-blocks", "100")
    assert served.exit_code == 0 and "error" not in served.stderr, served.stderr


def test_a_run_whose_every_request_is_abandoned_advises_its_timeout_not_the_cache(kvlab):
    """Review 57 L1: every request abandoned at a 10 ms deadline; the advice was the KV cache's."""
    r = kvlab("run", "vllm", "--num-requests", "20", "--timeout", "0.01", "--no-plots")
    assert r.exit_code == 1, r.stderr
    line = _flat(r.stderr).split("error: ")[-1]
    assert line == ("no request was served (vllm abandoned 20): the figures above measure nothing; valid: a --timeout "
                    "long enough for a request to finish"), line


def test_a_race_exits_1_only_where_no_strategy_served(kvlab, tmp_path):
    """The same for `race`: every strategy is named with what it rejected; one strategy that serves is enough."""
    workload = _fixed(tmp_path)
    r = kvlab("race", "static+max", "vllm", *ON_HYBRID, "--workload", workload, "--num-gpu-blocks", "5")
    assert r.exit_code == 1, r.stderr
    line = _flat(r.stderr).split("error: ")[1]
    assert line.startswith("no request was served (static+max rejected 20 as "), line
    assert "; vllm rejected 20 as " in line
    # (at 100 blocks the max slab still cannot fit, vllm serves: a race with a winner is no bad input)
    r = kvlab("race", "static+max", "vllm", *ON_HYBRID, "--workload", workload, "--num-gpu-blocks", "100")
    assert r.exit_code == 0 and "error" not in r.stderr, r.stderr
    assert "Rejected: static+max 20" in _flat(r.stdout)


def test_plots_of_a_strategy_that_served_nothing_warn_of_no_legend(kvlab, tmp_path):
    """Trial 56c, finding 6: matplotlib's "No artists with labels found to put in legend" reached stderr whenever a
    strategy served nothing (the memory plot's legend came from the first strategy's panel alone, the latency plot's
    from lines of finished requests). No legend is asked for without labelled artists; the memory plot's legend comes
    from the first strategy that drew, so a race whose first strategy served nothing keeps it."""
    from PIL import Image

    workload = _fixed(tmp_path)
    cases = (("run", "vllm", "--num-gpu-blocks", "5"), ("race", "static+max", "vllm", "--num-gpu-blocks", "100"))
    for i, case in enumerate(cases):
        out = tmp_path / f"out{i}"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = kvlab(*case, *ON_HYBRID, "--workload", workload, "--out", out)
        assert r.exit_code in (0, 1), r.stderr
        said = [str(w.message) for w in caught if "legend" in str(w.message)]
        assert not said, said
        for name in ("memory_shares.png", "batch_size.png", "latency.png"):
            with Image.open(out / name) as png:
                assert png.size[0] > 100


def test_sweep_and_capacity_print_runs_hybrid_note_and_qualify_prefix_caching(kvlab, tmp_path):
    """Trial 56c, finding 5: `sweep` and `capacity` on a hybrid printed no note of its KV cache groups and an
    unqualified "prefix caching on". Each prints the note `kvlab run` prints (the same text: the configuration's),
    once, and says prefix caching is not simulated."""
    workload = _fixed(tmp_path)
    note = _flat(_cache_note())
    ran = kvlab("run", "vllm", *ON_HYBRID, "--workload", workload)
    assert f"note: {note}" in _flat(ran.stderr)
    r = kvlab("sweep", *ON_HYBRID, "--strategy", "vllm,orca-pow2", "--workload", workload, "--workers", "1",
              "--out", tmp_path / "sw")
    assert r.exit_code == 0, r.stderr
    assert _flat(r.stderr).count(f"note: {note}") == 1, r.stderr
    assert ("prefix caching on for vllm (for this hybrid model only a preempted request's own blocks still cached hit, "
            "as in vLLM's 'align' mode; every other lookup misses), off for orca-pow2" in _flat(r.stdout)), r.stdout
    c = kvlab("capacity", *ON_HYBRID, "--workload", "paper-alpaca", "-n", "20", "--cost", "roofline", "--strategy",
              "vllm", "--workers", "1", "--out", tmp_path / "cap")
    assert c.exit_code == 0, c.stderr
    assert _flat(c.stderr).count(f"note: {note}") == 1, c.stderr
    assert ("prefix caching on (for this hybrid model only a preempted request's own blocks still cached hit, as in "
            "vLLM's 'align' mode; every other lookup misses)") in _flat(c.stdout)


def test_a_sweep_on_a_non_hybrid_model_prints_no_cache_note(kvlab, tmp_path):
    r = kvlab("sweep", "--strategy", "vllm", "-n", "20", "--workers", "1", "--out", tmp_path / "sw")
    assert r.exit_code == 0, r.stderr
    assert "note:" not in r.stderr and "not simulated" not in r.stdout


def test_a_sweep_point_that_serves_nothing_is_stored_and_the_sweep_goes_on(kvlab, tmp_path):
    """A point whose pool serves no request is a result of the grid (a capacity search's too: served 0), not an
    error: it is stored with its rejections, beside the point that serves, and the sweep exits 0."""
    workload = _fixed(tmp_path)
    r = kvlab("sweep", *ON_HYBRID, "--strategy", "vllm", "--num-gpu-blocks", "5,100", "--workload", workload,
              "--workers", "1", "--out", tmp_path / "sw", "--json")
    assert r.exit_code == 0, r.stderr
    points = {p["num_gpu_blocks"]: p for p in r.json()["points"]}
    assert points[5]["status"] == "ok" and points[5]["num_finished"] == 0 and points[5]["num_rejected"] == 20
    assert points[100]["status"] == "ok" and points[100]["num_finished"] == 20
    assert len({_flat(n) for n in (_cache_note(num_gpu_blocks=5), _cache_note(num_gpu_blocks=100))}) == 2
    assert _flat(r.stderr).count("note: qwen3.6-27b keeps 4 KV cache groups") == 2  # (one for each pool)


def test_a_sweep_of_many_pools_prints_at_most_three_cache_notes(kvlab, tmp_path):
    """One note per distinct KV cache, at most MAX_CACHE_NOTES of them, then one line for the rest."""
    from kvlab.sweep.session import MAX_CACHE_NOTES

    r = kvlab("sweep", *ON_HYBRID, "--strategy", "vllm", "--num-gpu-blocks", "20,30,40,50,60", "--workload",
              _fixed(tmp_path, n=2), "--workers", "1", "--out", tmp_path / "sw")
    assert r.exit_code == 0, r.stderr
    text = _flat(r.stderr)
    assert MAX_CACHE_NOTES == 3 and text.count("note: qwen3.6-27b keeps 4 KV cache groups") == 3
    assert ("note: 2 more notes like these, one for each other KV cache of the points (`kvlab run` with a point's "
            "options prints its own)") in text


def test_run_and_race_help_say_their_exit_status(kvlab):
    assert "Exit status 1, after the report, where it served no request" in _flat(kvlab("run", "--help").stdout)
    assert "Exit status 1, after the report, where no strategy served any request" in _flat(kvlab("race", "--help").stdout)


GRANITE = ("--model", "tests/data/sizing_configs/granite-4.0-h-1b.json", "--gpu", "h100-sxm", "--max-model-len", "8192")


def test_requests_abandoned_before_their_first_token_are_reported_not_a_traceback(kvlab, tmp_path):
    """Trial 57 finding 1: under the fitted clock (vllm-h100: an admission lag on each request), a request abandoned
    at its --timeout before its first iteration has an end but no first token, and the lag's arithmetic raised a
    TypeError: every request abandoned (exit 1, one line) and some of them (exit 0, the rest served)."""
    none = kvlab("run", "vllm", *GRANITE, "-w", _fixed(tmp_path, 10, 4000, 4000), "--arrival", "burst", "-n", "5",
                 "--timeout", "0.001", "--no-plots")
    assert none.exit_code == 1 and "Traceback" not in none.stderr, none.stderr
    assert _flat(none.stderr).split("error: ")[-1].startswith("no request was served (vllm abandoned 5)")
    some = kvlab("run", "vllm", *GRANITE, "-w", _fixed(tmp_path, 30, 4000, 400), "--num-gpu-blocks", "100",
                 "--timeout", "3", "--no-plots", "--json")
    assert some.exit_code == 0, some.stderr
    served = some.json()["strategies"][0]
    assert served["num_finished"] > 0 and served["num_aborted"] > 0

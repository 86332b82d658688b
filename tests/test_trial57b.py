"""Fix 57b: trial 57's findings 2, 3 and 7 (a run, sweep or race that served nothing), each through the CLI."""

from __future__ import annotations

GRANITE = "tests/data/sizing_configs/granite-4.0-h-1b.json"
QWEN_HYBRID = ("--model", "tests/data/sizing_configs/qwen3.6-27b.json", "--gpu", "h100-sxm")


def _flat(text: str) -> str:
    return " ".join(text.split())


def _fixed(tmp_path, n: int, prompt: int, output: int):
    path = tmp_path / f"fixed_{n}_{prompt}_{output}.csv"
    path.write_text("arrival_time,prompt_len,output_len\n" + f"0,{prompt},{output}\n" * n)
    return path


def _abandoned_run(tmp_path) -> tuple[str, ...]:
    """Trial 57's finding 2: five 4,000 + 4,000-token requests at once whose clients give up after 2 s, so every one
    is abandoned mid-answer, having sampled tokens."""
    return ("--model", GRANITE, "--gpu", "h100-sxm", "--max-model-len", "8192", "--workload",
            str(_fixed(tmp_path, 5, 4000, 4000)), "--timeout", "2")


def test_a_run_that_finished_nothing_has_no_output_throughput(kvlab, tmp_path):
    """Finding 2: `out tok/s` read 798,896 with 0 requests finished, while the legend says it counts finished
    requests' output tokens. The abandoned requests' tokens are the wasted tokens, not throughput."""
    r = kvlab("run", "vllm", *_abandoned_run(tmp_path), "--json")
    assert r.exit_code == 1, r.stderr
    (summary,) = r.json()["strategies"]
    assert summary["num_finished"] == 0 and summary["num_aborted"] == 5 and summary["wasted_tokens"] > 0
    assert summary["throughput_tps"] == 0.0
    table = kvlab("run", "vllm", *_abandoned_run(tmp_path))
    row = next(line for line in table.stdout.splitlines() if line.startswith("vllm "))
    assert row.split()[3:5] == ["0", "0"], row  # (req/s, out tok/s)


def test_throughput_counts_finished_tokens_where_some_are_abandoned(kvlab, tmp_path):
    """Where some requests finish and others are abandoned, out tok/s is the finished ones' output tokens over the
    makespan, as the legend says."""
    path = tmp_path / "mixed.csv"
    path.write_text("arrival_time,prompt_len,output_len\n" + "0,100,20\n" * 3 + "0,100,4000\n" * 2)
    r = kvlab("run", "vllm", "--model", "opt-13b", "--workload", path, "--timeout", "2", "--json")
    (summary,) = r.json()["strategies"]
    assert summary["num_finished"] == 3 and summary["num_aborted"] == 2, summary
    assert abs(summary["throughput_tps"] - 3 * 20 / summary["makespan_s"]) < 1e-9


def test_a_sweep_says_which_points_served_nothing_and_why(kvlab, tmp_path):
    """Finding 3: a sweep whose points served nothing exited 0 without a word. It still exits 0 (the points are
    results of the grid), and after the table one line says how many served nothing and why, in `kvlab run`'s
    words."""
    workload = _fixed(tmp_path, 20, 960, 64)
    r = kvlab("sweep", *QWEN_HYBRID, "--strategy", "vllm,vllm+noprefix", "--num-gpu-blocks", "5,100",
              "--workload", workload, "--workers", "1", "--out", tmp_path / "sw")
    assert r.exit_code == 0, r.stderr
    text = _flat(r.stdout)
    assert "2 of 4 points served no request (vllm rejected 20 as larger than the whole KV cache" in text
    assert "; vllm+noprefix rejected 20 as larger than the whole KV cache" in text
    assert "their rows measure nothing; valid: a KV cache in which the workload's requests fit" in text
    ran = kvlab("run", "vllm", *QWEN_HYBRID, "--workload", workload, "--num-gpu-blocks", "5")
    reason = _flat(ran.stderr).split("(vllm rejected 20 as ")[1].split("): the figures above")[0]
    assert f"vllm rejected 20 as {reason}" in text  # (the same words as `kvlab run`'s line)


def test_a_sweep_where_every_point_served_says_nothing_of_it(kvlab, tmp_path):
    r = kvlab("sweep", *QWEN_HYBRID, "--strategy", "vllm", "--num-gpu-blocks", "100", "--workload",
              _fixed(tmp_path, 20, 960, 64), "--workers", "1", "--out", tmp_path / "sw")
    assert r.exit_code == 0, r.stderr
    assert "served no request" not in r.stdout and "measure nothing" not in r.stdout


def test_a_race_where_nothing_was_served_gives_no_star_and_no_tie(kvlab, tmp_path):
    """Finding 7: with every strategy at 0 finished, the legend said "★ most req/s (none here: ... tie)"."""
    r = kvlab("race", "vllm", "vllm+noprefix", "continuous+max", *_abandoned_run(tmp_path))
    assert r.exit_code == 1, r.stderr
    assert "★" not in r.stdout and "tie" not in r.stdout
    assert "None of the 3 strategies finished a request, so none served the most" in _flat(r.stdout)
    assert "no request was served" in _flat(r.stderr)

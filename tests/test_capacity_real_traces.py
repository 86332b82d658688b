"""Capacity answers that hold on a real trace (issue 31): on azure-conv, whose later answers are longer than its
earlier ones, `--replicas auto` answers a count whose whole-trace run meets the target and whose count minus one
does not; the single-engine H100 answer is checked on the whole trace and holds on both its halves; `vllm` is `vllm serve`
(prefix caching on) and says so."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np

# The progress lines on stderr (a round's line wrapped at the width, its further lines indented: fix 58b)
PROGRESS = ("points: ", "capacity search: round ", "  ")


def _cli(*args: str, timeout: int = 900) -> dict:
    r = subprocess.run([sys.executable, "-m", "kvlab", "capacity", *args, "--json"], check=False,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _p99_ttft(records) -> float:
    """p99 TTFT over every request of the run: the whole trace, warm-up and end included."""
    values = [np.inf if r.ttft is None else r.ttft for r in records]
    return float(np.quantile(values, 0.99))


def test_the_fewest_replicas_meet_the_target_on_the_whole_trace_and_one_fewer_does_not(tmp_path):
    from kvlab import service
    from kvlab.config import resolve
    from kvlab.fleet import run_fleet

    data = _cli("--replicas", "auto", "--rate", "20", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--workload",
                "azure-conv", "--slo", "p99_ttft<2s", "--cost", "vidur-a100", "--router", "round-robin",
                "--out", str(tmp_path))
    (entry,) = data["fewest_replicas"]
    n = entry["replicas"]
    assert n is not None and n > 1  # (the "no count held" is gone)
    assert "overloaded" not in " ".join(r["reason"] for r in entry["runs"] if r["replicas"] >= n)
    for length in entry["samples"]["lengths"]:
        config = resolve(model="llama-3.1-8b", gpu="a100-80gb", workload="azure-conv", rate=20, cost="vidur-a100",
                         num_requests=length, router="round-robin", replicas=2)
        workload = service.load(config)
        if length == entry["samples"]["lengths"][0]:  # the shape: the later half's answers are longer
            outputs = [r.num_output_tokens for r in workload.requests]
            half = len(outputs) // 2
            assert np.mean(outputs[half:]) > 1.05 * np.mean(outputs[:half])
        strategy = service.strategies(["vllm"], config)[0]
        spec = config.router.spec(config.workload.seed)
        at = run_fleet(strategy, config.engine, workload, spec, n).as_result().records
        fewer = run_fleet(strategy, config.engine, workload, spec, n - 1).as_result().records
        assert _p99_ttft(at) < 2.0, (length, n)
        if length == max(entry["samples"]["lengths"]) or entry["samples"]["agree"]:
            assert _p99_ttft(fewer) >= 2.0, (length, n - 1)


def test_the_h100_answer_is_checked_on_the_whole_trace_and_holds_on_both_of_its_halves(tmp_path):
    # The trace's second half is heavier than its beginning: the second sample is the whole trace, so an answer read
    # on the first 1,300 requests alone (where a fitted clock can find 20+ req/s) is not the one given.
    from kvlab import service
    from kvlab.config import resolve

    data = _cli("--strategy", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", "azure-conv",
                "--slo", "p99_ttft<2s", "--cost", "vllm-h100", "-n", "1300", "--workers", "2", "--out", str(tmp_path))
    (c,) = data["capacities"]
    samples = c["samples"]
    assert samples["lengths"] == [1300, 19_366] and len(samples["capacities"]) == 2
    assert samples["answer_rps"] == min(samples["capacities"]) == c["capacity_rps"] > 0
    config = resolve(model="llama-3.1-8b", gpu="h100-sxm", workload="azure-conv", cost="vllm-h100",
                     rate=samples["answer_rps"], num_requests=19_366)
    records = sorted(service.run(config, ["vllm"]).results[0].records, key=lambda r: r.arrival_time)
    half = len(records) // 2
    assert _p99_ttft(records[:half]) < 2.0 and _p99_ttft(records[half:]) < 2.0


def test_a_target_the_idle_engine_misses_is_one_line(kvlab, tmp_path):
    # Under the fitted H100 clock azure-conv's longest prompts take 125 ms (p99 TTFT) on an idle engine: p99 TTFT
    # under 100 ms is met at no rate. (With vllm-h100's per-prefill-token term, held at 0 since 4 December, they
    # took over 1 s, and the target here was 1 s.)
    r = kvlab("capacity", "--strategy", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload",
              "azure-conv", "--slo", "p99_ttft<0.1s", "--cost", "vllm-h100", "-n", "1300", "--workers", "2",
              "--out", tmp_path)
    errors = [line for line in r.stderr.splitlines() if not line.startswith(PROGRESS)]  # (the progress lines)
    assert r.exit_code == 2 and len(errors) == 1, r.stderr
    assert re.search(r"--slo 'p99_ttft<0.1s' cannot be met at any rate: missed p99_ttft<0.1s \(1\d\d ms\)",
                     errors[0]), errors[0]


def test_vllm_is_vllm_serve_with_prefix_caching_and_says_so(kvlab, tmp_path):
    common = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", "sessions", "--cost", "roofline",
              "--slo", "p99_ttft<1s", "-n", "400", "--workers", "2", "--out", tmp_path]
    r = kvlab("capacity", "--strategy", "vllm,vllm+prefix,vllm+noprefix", *common, "--json")
    assert r.exit_code == 0, r.stderr
    by_name = {c["strategy"]: c for c in r.json()["capacities"]}
    # The rate each held: the answer, or (a run of 400 too short to load the engine: the table's 'none (X ?)') the
    # uncertified rate the JSON keeps beside a null capacity_rps.
    held = {name: c["capacity_rps"] if c["capacity_rps"] is not None else c["uncertified_rps"]
            for name, c in by_name.items()}
    assert held["vllm"] == held["vllm+prefix"] and by_name["vllm"]["capacity_rps"] == by_name["vllm+prefix"]["capacity_rps"]
    assert by_name["vllm"]["probes"] == by_name["vllm+prefix"]["probes"]
    assert held["vllm"] > held["vllm+noprefix"]  # (sessions share prefixes)
    assert r.json()["setup"]["prefix_caching"] == {"vllm": True, "vllm+prefix": True, "vllm+noprefix": False}
    r = kvlab("capacity", "--strategy", "vllm", *common)
    assert r.exit_code == 0, r.stderr
    assert "prefix caching on" in " ".join(r.stdout.split())

"""kvlab capacity --replicas auto: the fewest replicas that sustain an offered rate, per router, resting on runs it
prints: the answer held, one replica fewer failed; the setup, the cost profile and a plot of p99 TTFT against the
replica count."""

from __future__ import annotations

ARGS = ["capacity", "--replicas", "auto", "--rate", "8", "--strategy", "vllm", "--slo", "p99_ttft<2s"]


def test_the_fewest_replicas_hold_and_one_fewer_does_not(kvlab, tmp_path):
    r = kvlab(*ARGS, "--out", tmp_path, "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert {e["router"] for e in data["fewest_replicas"]} == {"round-robin", "least-requests"}
    for entry in data["fewest_replicas"]:
        n = entry["replicas"]
        runs = {run["replicas"]: run for run in entry["runs"]}
        assert n is not None and runs[n]["held"] and runs[n]["state"] == "stable"
        assert n == 1 or not runs[n - 1]["held"]
        assert entry["gpus"] == n * data["setup"]["tensor_parallel_size"] * data["setup"]["pipeline_parallel_size"]
        assert runs[n]["ttft_p99_s"] < 2
    assert data["setup"]["model"] == "opt-13b" and data["setup"]["workload"]["rate"] == 8
    assert data["cost_profile"].startswith("roofline")
    assert (tmp_path / "replicas.png").stat().st_size > 1000
    r = kvlab(*ARGS, "--out", tmp_path)
    text = " ".join(r.stdout.split())
    assert "The fewest replicas that sustain 8 req/s with p99_ttft<2s" in text and "poisson arrivals at 8 req/s" in text


def test_replicas_auto_needs_one_offered_rate(kvlab, tmp_path):
    r = kvlab("capacity", "--replicas", "auto", "--rate", "4,8", "--out", tmp_path / "c")
    assert r.exit_code == 2 and "give --rate R" in r.stderr

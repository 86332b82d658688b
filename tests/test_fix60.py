"""fix60: one strategy spelt twice in a sweep, a router given twice to kvlab capacity, and --arrivals SEED|even on
`kvlab run` / `kvlab race` for an inference-perf workload."""

from __future__ import annotations

import pytest


def test_a_sweep_refuses_one_strategy_spelt_twice_naming_both_spellings(kvlab, tmp_path):
    # (vllm+prefix is vllm: one simulation, and the sweep made one point of the two asked for without a word)
    out = tmp_path / "sweep"
    r = kvlab("sweep", "--strategy", "vllm,vllm+prefix", "-n", "20", "--workers", "1", "--out", out)
    assert r.exit_code == 2, r.stdout + r.stderr
    assert r.stderr.strip() == ("error: --strategy vllm,vllm+prefix: 'vllm+prefix' is the same strategy as 'vllm' "
                                "(both run vllm: one simulation, one point), given twice; valid: each strategy once")
    assert not out.exists()


def test_a_sweep_refuses_a_spelling_of_the_preemption_mode_a_strategy_already_has(kvlab, tmp_path):
    r = kvlab("sweep", "--strategy", "orca-oracle,vllm,vllm+recompute", "-n", "20", "--workers", "1",
              "--out", tmp_path / "sweep")
    assert r.exit_code == 2 and "'vllm+recompute' is the same strategy as 'vllm' (both run vllm" in r.stderr


def test_a_sweep_keeps_the_rule_for_one_value_given_twice_and_distinct_strategies_run(kvlab, tmp_path):
    r = kvlab("sweep", "--strategy", "vllm,vllm", "-n", "20", "--workers", "1", "--out", tmp_path / "a")
    assert "error: --strategy vllm,vllm: 'vllm' is the same value as 'vllm', given twice; valid: each value once" \
        in r.stderr
    r = kvlab("sweep", "--strategy", "vllm,vllm+noprefix", "-n", "20", "--workers", "1", "--out", tmp_path / "b",
              "--json")
    assert r.exit_code == 0, r.stderr
    assert [p["strategy"] for p in r.json()["points"]] == ["vllm", "vllm+noprefix"]


def test_capacity_still_answers_each_spelling_of_one_strategy(kvlab, tmp_path):
    # (the refusal is the sweep's: capacity answers vllm and vllm+prefix each, as tests/test_capacity_real_traces.py)
    r = kvlab("capacity", "--strategy", "vllm,vllm+prefix", "--cost", "roofline", "-n", "200", "--workers", "1",
              "--out", tmp_path / "c", "--json")
    assert r.exit_code == 0, r.stderr
    by_name = {c["strategy"]: c for c in r.json()["capacities"]}
    assert set(by_name) == {"vllm", "vllm+prefix"}
    assert by_name["vllm"]["capacity_rps"] == by_name["vllm+prefix"]["capacity_rps"]


@pytest.mark.parametrize("args", [
    ["--replicas", "auto", "--rate", "2", "--router", "round-robin,round-robin"],
    ["--replicas", "auto", "--rate", "2", "--router", "least-requests,round-robin,least-requests"],
    ["--replicas", "auto", "--prefill-replicas", "auto", "--rate", "2", "--router", "round-robin,round-robin"],
    ["--rate", "2", "--router", "round-robin,round-robin"],
])
def test_capacity_refuses_a_router_given_twice_as_any_value_given_twice(kvlab, tmp_path, args):
    out = tmp_path / "cap"
    r = kvlab("capacity", *args, "-n", "50", "--max-time", "1s", "--out", out)
    router = args[args.index("--router") + 1]
    twice = router.split(",")[0]
    assert r.exit_code == 2, r.stdout + r.stderr
    assert r.stderr.strip() == (f"error: --router {router}: {twice!r} is the same value as {twice!r}, given twice; "
                                "valid: each value once")
    assert not out.exists()

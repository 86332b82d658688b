"""The lab's rate section and `kvlab capacity` give the same breaking point on one setup: both ask
kvlab.service.capacity.capacities (two samples) and take the lower sample's answer (answering). Trial 54, finding 4:
the lab searched the first sample alone, and gave vllm-paper "none (3.25 ?)" on 100 requests where the command
answered 2.5 req/s on its second sample (trial 53, finding 2)."""

from __future__ import annotations

from kvlab.web.rates import RateLab, RateSetup

SETUP = RateSetup(model="opt-13b", gpu="a100-40gb", workload="paper-sharegpt", num_requests=100, seed=0,
                  block_size=16, cost="roofline")


def test_the_lab_and_the_command_give_the_same_rate_on_one_setup(kvlab, tmp_path):
    lab = RateLab()
    try:
        found = lab.breaking_points(SETUP, ("vllm-paper",))
    finally:
        if lab.runner is not None:
            lab.runner.pool.close()
    (line,) = found["systems"]
    s = SETUP
    r = kvlab("capacity", "--strategy", "vllm-paper", "--model", s.model, "--gpu", s.gpu, "--workload", s.workload,
              "-n", s.num_requests, "--seed", s.seed, "--block-size", s.block_size, "--cost", s.cost, "--workers", "1",
              "--out", tmp_path, "--json")
    assert r.exit_code == 0, r.stderr
    (cli,) = r.json()["capacities"]
    assert cli["samples"]["lengths"] == [100, 200]  # (two samples, which the lab now searches too)
    for key in ("capacity_rps", "capacity_text", "uncertified_rps", "uncertified_reason", "limited_by"):
        assert line[key] == cli[key], key
    assert [p["rate"] for p in line["points"]] == sorted(p["rate"] for p in cli["probes"])
    assert found["slo"] == r.json()["slo"]

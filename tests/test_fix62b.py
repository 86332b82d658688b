"""Trial 62's findings 3, 4, 7, 9b and 9c (/work/report-trial62.md), each with a test that failed before its fix."""

from __future__ import annotations

import re

import pytest

from kvlab import service
from kvlab.config import resolve

# -- finding 3: a disaggregated run's TTFT parts add up under a profile with a request latency ------------------

DISAGG = dict(model="llama-3.1-8b", gpu="h100-sxm", workload="azure-conv", rate=8.0, num_requests=100,
              prefill_replicas=1, decode_replicas=3)


def test_the_ttft_parts_add_up_to_the_mean_ttft_under_a_profile_with_request_latency():
    config = resolve(**DISAGG)
    assert config.cost.name == "vllm-h100" and config.cost.model.request_latency_s > 0
    [summary] = [r.summary() for r in service.run(config, ["vllm"]).disaggregated]
    parts = summary["disaggregation"]["ttft_parts_s"]
    assert parts["outside_engine"] >= config.cost.model.request_latency_s  # (the latency, and the lag on a busy engine)
    assert sum(parts.values()) == pytest.approx(summary["ttft_s"]["mean"], rel=1e-12)
    roofline = resolve(**DISAGG, cost="roofline")
    [summary] = [r.summary() for r in service.run(roofline, ["vllm"]).disaggregated]
    parts = summary["disaggregation"]["ttft_parts_s"]
    assert parts["outside_engine"] == 0.0
    assert sum(parts.values()) == pytest.approx(summary["ttft_s"]["mean"], rel=1e-12)


def test_kvlab_run_prints_the_fourth_part_and_the_sum_it_adds_up_to(kvlab):
    args = ("run", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", "azure-conv", "--rate", "8",
            "-n", "100", "--prefill-replicas", "1", "--decode-replicas", "3")
    out = " ".join(kvlab(*args).stdout.split())
    mean = kvlab(*args, "--json").json()["strategies"][0]["ttft_s"]["mean"]
    line = re.search(r"Mean TTFT = prefill ([\d.]+) ms \+ transfer ([\d.]+) ms \+ decode side ([\d.]+) ms \+ the cost "
                     r"profile's request latency and admission lag ([\d.]+) ms = ([\d.]+) ms\.", out)
    assert line is not None, out
    *parts, total = (float(x) for x in line.groups())
    assert total == pytest.approx(1e3 * mean, rel=5e-3)
    assert sum(parts) == pytest.approx(total, abs=0.25)  # (each part printed to three significant figures)
    roofline = " ".join(kvlab(*args, "--cost", "roofline").stdout.split())
    assert re.search(r"decode side [\d.]+ ms = [\d.]+ ms\.", roofline)

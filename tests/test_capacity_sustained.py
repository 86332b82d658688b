"""kvlab capacity answers a rate its run sustains: on three model/GPU pairs the stored run at the answer served
at least 95% of what was offered over its measured window (its waiting queue grew neither in count nor in oldest
wait) and the next rate up failed (or the answer says it is a
lower bound); a workload too short to load the engine gives a lower bound, never a certified rate; every answer
states its setup, in the text, the JSON, the PNG and the HTML."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

PAIRS = [  # (model, GPU, target): the H100 command and two others
    ("llama-3.1-8b", "h100-sxm", "p99_ttft<2s"),
    ("opt-13b", "a100-40gb", "mean_normalized_latency<0.1s"),
    ("llama-2-7b", "a100-80gb", "p99_ttft<1s,p99_tpot<100ms"),
]


def _capacity(out, *args) -> dict:
    r = subprocess.run([sys.executable, "-m", "kvlab", "capacity", "--strategy", "vllm,orca-oracle", *args,
                        "--workers", "2", "--out", str(out), "--json"],
                       check=False, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module", params=PAIRS, ids=[f"{m}-{g}" for m, g, _ in PAIRS])
def answered(request, tmp_path_factory):
    model, gpu, slo = request.param
    out = tmp_path_factory.mktemp("capacity")
    return request.param, out, _capacity(out, "--model", model, "--gpu", gpu, "--slo", slo)


def test_the_answer_is_a_rate_its_run_sustains_and_the_next_rate_up_fails(answered):
    from kvlab import service, window
    from kvlab.config import resolve

    (model, gpu, _), _, data = answered
    assert {c["cost"] for c in data["capacities"]} == {p for p in ("roofline", "paper-2023", "vidur-a100",
                                                                   "vidur-h100", "vllm-h100")
                                                       if p in data["cost_profiles"]}
    for c in data["capacities"]:
        rate, failed = c["bracket"]
        assert c["capacity_rps"] == rate > 0
        at = next(p for p in c["probes"] if p["rate"] == rate)
        assert at["held"] and at["state"] == "stable" and at["served_share"] >= 0.95
        if not c["certified"]:
            assert c["uncertified_reason"] and (c["lower_bound"] or c["too_short"])
        else:
            assert failed is not None and not next(p for p in c["probes"] if p["rate"] == failed)["held"]
            assert at["loaded"]
        # The same run on its own, through the run service: served ≥ 95% of offered over its window.
        workload = c["setup"]["workload"]
        config = resolve(model=model, gpu=gpu, cost=c["cost"], rate=rate, num_requests=workload["num_requests"],
                         workload=workload["workload"], seed=workload["seed"])
        run = service.run(config, [c["strategy"]])
        measured = window.measure(run.results[0].records, workload["num_seats"])
        assert measured.served_share >= 0.95 and measured.state == "stable"


def test_the_clocks_spread_is_shown_with_what_each_profile_is_fitted_to(answered):
    _, _, data = answered
    assert len(data["cost_profiles"]) >= 2  # the roofline and the GPU's own
    for spread in data["spread"]:
        assert set(spread["capacities"]) == set(data["cost_profiles"])
        assert spread["low"] <= spread["high"]
    assert "roofline (stated, not fitted; any GPU)" in data["cost_profiles"]["roofline"]


def test_every_answer_states_its_setup(answered, kvlab):
    from PIL import Image

    (model, gpu, slo), out, data = answered
    setup = data["setup"]
    for field in ("model", "gpu", "num_gpus", "num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
                  "max_model_len"):
        assert field in setup
    assert setup["workload"]["arrival"] == "poisson" and setup["workload"]["arrival_rate"] == "searched"
    assert setup["workload"]["scaled_to_seats"] is True
    for c in data["capacities"]:
        assert c["setup"]["cost"] == c["cost"] and c["setup"]["cost_source"]
    r = kvlab("capacity", "--strategy", "vllm,orca-oracle", "--model", model, "--gpu", gpu, "--slo", slo,
              "--workers", "2", "--out", out)
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stdout.split())
    blocks = f"{setup['num_gpu_blocks']:,} blocks of {setup['block_size']} tokens"
    for words in (f"on 1× {setup['gpu']}", blocks, f"max_num_seqs {setup['max_num_seqs']:,}", "poisson arrivals",
                  "num_requests: scaled so that twice the engine's seats arrive in the measured window",
                  "cost profile"):
        assert words in text, words
    for c in data["capacities"]:  # (each configuration's own request count, in the table)
        assert f"{c['setup']['workload']['num_requests']:,}" in text
    for name in ("capacity.png", "capacity_latency.png"):
        described = Image.open(out / name).text["Description"]
        assert blocks in described and setup["gpu"] in described and "poisson arrivals" in described
    page = (out / "capacity.html").read_text()
    assert blocks in page and "poisson arrivals" in page
    # One panel of bars, a group per cost profile, though each strategy's request count was scaled on its own
    assert len({c["setup"]["workload"]["num_requests"] for c in data["capacities"]}) > 1 or model != "llama-3.1-8b"
    # (the bars, then a panel per term of the target)
    assert page.count('<rect class="bar"') == len(data["capacities"]) and page.count("<svg") == 1 + len(slo.split(","))
    assert page.count('class="group"') == len(data["cost_profiles"])
    assert all(f">{name}</text>" in page for name in data["cost_profiles"])


def test_a_workload_too_short_to_load_the_engine_is_never_certified(kvlab, tmp_path):
    # (nor called a lower bound: its queue had no time to build, so a longer run may fail at a lower rate)
    r = kvlab("capacity", "--strategy", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--cost", "roofline",
              "--slo", "p99_ttft<2s", "-n", "300", "--workers", "2", "--out", tmp_path / "c", "--json")
    assert r.exit_code == 0, r.stderr
    (c,) = r.json()["capacities"]
    assert not c["certified"] and c["too_short"] and not c["lower_bound"]
    # (no answer, as the table says "none (X ?)": the rate the short run held is kept under its own name, unpriced)
    assert c["capacity_rps"] is None and c["uncertified_rps"] == c["bracket"][0] > 0 and c["serving_cost"] is None
    assert c["capacity_text"] == f"none ({c['uncertified_rps']:g} ?)"
    assert "too short to load the engine" in c["uncertified_reason"] and "may fail at a lower rate" in c["uncertified_reason"]
    r = kvlab("capacity", "--strategy", "vllm", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--cost", "roofline",
              "--slo", "p99_ttft<2s", "-n", "300", "--workers", "2", "--out", tmp_path / "c")
    text = " ".join(r.stdout.split())
    assert "?: vllm under roofline: not certified: " in text and "raise -n or --duration" in text
    assert (m := re.search(r"vllm\s+none \(([\d.]+) \?\)", text)) and f"≥ {m.group(1)}" not in text
    assert "vllm: no answer: the run at " in text


@pytest.mark.parametrize("args, message", [
    (["--slo", "p99_ttft<2s,p99_ttft<3s"], "bound the same statistic twice"),
    (["--slo", "p99_foo<2s"], "'foo' is not a latency kvlab reports"),
    (["--slo", "ttft<2s", "--goodput", "1.2"], "--goodput 1.2: the share of requests that must meet every term is in"),
    (["--slo", ""], "an empty term"),
    (["-n", "5"], "--num-requests 5: the measured window"),
    (["--duration", "2"], "--duration 2: at the first rate (1 req/s) the measured window"),
])
def test_bad_targets_and_workloads_too_short_to_measure_are_one_line(kvlab, tmp_path, args, message):
    r = kvlab("capacity", *args, "--out", tmp_path / "c")
    assert r.exit_code == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists()

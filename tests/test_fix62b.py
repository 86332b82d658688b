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


# -- finding 4: `vllm log`'s fix is `kvlab size`'s longest, under the rules and settings it names ---------------

FAILED_LOG = "tests/data/startup_logs/gpt-oss-120b-h100-0.11.0-util0.95.log"


def _size_longest(kvlab, version: str, batched: int) -> int:
    """`kvlab size`'s "the longest that fits" for the log's budget on its H100, at one max_model_len request."""
    out = kvlab("size", "gpt-oss-120b", "--gpu", "h100-sxm", "--available-kv-gib", "1.71", "--vllm-version", version,
                "--max-num-batched-tokens", str(batched)).stdout
    return int(re.search(r"the longest that fits is ([\d,]+) tokens", " ".join(out.split()))[1].replace(",", ""))


def _verdict(kvlab, path) -> tuple[str, dict]:
    import json

    explanation = json.loads(kvlab("vllm", "log", path, "--model", "gpt-oss-120b", "--json").stdout)["explanation"]
    return " ".join(explanation["lines"][-1].split()), explanation["kvlab"]


def test_vllm_logs_fix_says_the_rules_and_settings_it_assumed_where_the_log_prints_none(kvlab):
    verdict, side = _verdict(kvlab, FAILED_LOG)
    from kvlab.vllm_rules import NEWEST_KNOWN

    assert (side["vllm_version"], side["max_num_batched_tokens"]) == (NEWEST_KNOWN, 2048)
    longest = _size_longest(kvlab, NEWEST_KNOWN, 2048)
    assert f"Fix: --max-model-len {longest} or less, the longest that fits as `kvlab size` counts it under vLLM " \
           f"{NEWEST_KNOWN}'s rules (the newest kvlab knows: the log does not print its version) and " \
           "max_num_batched_tokens 2,048 (vLLM's default below 70 GiB of GPU memory: the log does not print it" in verdict
    assert "`kvlab size gpt-oss-120b --available-kv-gib 1.71 --vllm-version V --max-num-batched-tokens N`" in verdict


def test_vllm_logs_fix_uses_the_version_and_the_token_budget_the_log_prints(kvlab, tmp_path):
    # The stored failed start with the two lines a whole 0.11.0 log prints before it (its server's settings, from
    # the issue the log comes from: tests/data/startup_logs/index.json): the version, and the budget per step.
    prefix = "(APIServer pid=6700) INFO 10-31 15:06:01 [api_server.py:1839] vLLM API server version 0.11.0\n" \
             "(APIServer pid=6700) INFO 10-31 15:06:02 [scheduler.py:205] Chunked prefill is enabled with " \
             "max_num_batched_tokens=1024.\n"
    log = tmp_path / "gpt-oss-120b-0.11.0.log"
    log.write_text(prefix + open(FAILED_LOG).read())
    verdict, side = _verdict(kvlab, log)
    assert (side["vllm_version"], side["max_num_batched_tokens"]) == ("0.11.0", 1024)
    longest = _size_longest(kvlab, "0.11.0", 1024)
    assert longest == side["estimated_max_model_len"] == 48608  # (45,536 before: the newest rules and 2,048)
    assert (f"Fix: --max-model-len {longest} or less, the longest that fits as `kvlab size` counts it under vLLM "
            "0.11.0's rules (the log's) and max_num_batched_tokens 1,024 (the log's); or more memory") in verdict


# -- finding 7: the lab runs a model and GPU under the profile `kvlab race` picks --------------------------------

def _lab_session(**spec) -> dict:
    from starlette.testclient import TestClient

    from kvlab.web.server import create_app

    with TestClient(create_app(allowed_hosts=["testserver"])) as client:
        r = client.post("/api/sessions", json={"kind": "race", "num_requests": 12, **spec})
        assert r.status_code == 200, r.text
        return r.json()


@pytest.mark.parametrize(("spec", "profile"), [
    ({"model": "llama-3.1-8b", "gpu": "h100-sxm"}, "vllm-h100"),  # (the lab ran it under roofline)
    ({"model": "llama-3.1-8b", "gpu": "h100-sxm", "cost": "roofline"}, "roofline"),  # (the user's choice kept)
    ({}, "roofline"),  # (the page's default setup, opt-13b on an A100-40GB: no profile fitted on that GPU)
])
def test_the_lab_runs_under_the_profile_kvlab_race_picks(spec, profile):
    session = _lab_session(**spec)
    cli = resolve(num_requests=12, **spec)  # (`kvlab race` with the same options: the same key, profile included)
    assert session["setup"]["cost"] == cli.cost.name == profile
    assert session["setup_key"] == cli.key


# -- finding 9c: the lab echoes a refused number as it was sent -------------------------------------------------

@pytest.mark.parametrize(("body", "error"), [
    (b'{"kind": "race", "rate": 1e400}', "rate 1e400 is out of range: 0.01 to 100"),  # (it said "rate inf")
    (b'{"kind": "race", "rate": -1e400}', "rate -1e400 is out of range: 0.01 to 100"),
    (b'{"kind": "race", "rate": 1e5}', "rate 1e5 is out of range: 0.01 to 100"),  # (it said 100000.0)
    (b'{"kind": "race", "rate": NaN}', "rate NaN is out of range: 0.01 to 100"),
    (b'{"kind": "race", "num_requests": 1e400}', "num_requests 1e400 is not a whole number; valid: an integer from 1 "
                                                 "to 2000"),
])
def test_the_lab_echoes_a_refused_number_as_it_was_sent(body, error):
    from starlette.testclient import TestClient

    from kvlab.web.server import create_app

    with TestClient(create_app(allowed_hosts=["testserver"])) as client:
        r = client.post("/api/sessions", content=body, headers={"Content-Type": "application/json"})
    assert (r.status_code, r.json()) == (400, {"error": error})


def test_a_number_sent_with_a_fraction_is_still_the_number():
    from kvlab.web.params import json_body, parse_run_spec

    data = json_body(b'{"kind": "race", "rate": 2.50, "num_requests": 12}')
    spec = parse_run_spec(data)
    assert spec.rate == 2.5 and type(spec.rate) is float and repr(data["rate"]) == "2.50"


# -- finding 9b: every speculative method's draft tokens count in the target runner's tensors -------------------

def test_eagle_and_ngram_with_the_same_draft_tokens_leave_the_same_pool():
    """vLLM 0.32.0 sizes Model Runner V2's grammar bitmask (max_num_seqs x (1 + k) rows) by
    VllmConfig.num_speculative_tokens, whatever the method: eagle's pool was 24 blocks larger than ngram's."""
    def blocks(**spec) -> int:
        return resolve(model="llama-3.1-8b", gpu="h100-sxm", **spec).cache.num_gpu_blocks

    off = blocks()
    ngram = blocks(speculative_method="ngram", num_speculative_tokens=3, spec_acceptance="0.7")
    eagle = blocks(speculative_method="eagle", num_speculative_tokens=3, spec_acceptance="0.7")
    assert ngram == eagle < off
    assert blocks(speculative_method="eagle", num_speculative_tokens=5, spec_acceptance="0.7") < eagle  # (more rows)
    drafted = resolve(model="llama-3.1-8b", gpu="h100-sxm", speculative_method="draft_model",
                      speculative_model="llama-3.2-1b", num_speculative_tokens=3, spec_acceptance="0.7")
    assert drafted.sizing.num_speculative_tokens == 3  # (its target's bitmask counted too, before the draft's share)

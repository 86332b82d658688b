"""Trial 54's findings that landed on the sizing faces: a hybrid log's lesson, a JSON file given as a log, and the MTP
drafter named where it changes `kvlab size`'s figures."""

from __future__ import annotations

import json
from pathlib import Path

LOGS = Path(__file__).parent / "data" / "startup_logs"


def test_hybrid_log_without_its_model_gives_no_plain_short_count(kvlab):
    """Finding 1: Qwen3-Next's log (several KV cache groups) said '29 fit at once' at 32,768 tokens by the one-group
    arithmetic it had just shown does not hold (vLLM's 14.77x against 3.71); it now asks for the model instead."""
    r = kvlab("vllm", "log", str(LOGS / "qwen3-next-80b-a3b-2xh200-0.10.2.log"))
    assert r.exit_code == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "vLLM says 14.77x" in out and "give --model" in out
    assert "29 fit at once" not in out and "Shorter conversations take fewer blocks" not in out
    # (a one-group log keeps its short count: vLLM's figure and the plain arithmetic agree there)
    one = " ".join(kvlab("vllm", "log", str(LOGS / "qwen3-14b-l40s-0.28.0.log")).stdout.split())
    assert "Shorter conversations take fewer blocks" in one


def test_json_document_is_not_read_as_a_log(kvlab, tmp_path):
    """Finding 5: the corpus index (figures quoted from many logs) was explained as one log, exit 0."""
    r = kvlab("vllm", "log", str(LOGS / "index.json"))
    assert r.exit_code == 2 and "is a JSON document, not a vLLM log" in r.stderr, r.stderr
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"GPU KV cache size": "42,656 tokens"}))
    assert kvlab("vllm", "log", str(bad)).exit_code == 2
    # (a text log whose first line happens to start with a brace is still read)
    text = tmp_path / "log.txt"
    text.write_text("{not json\nINFO 05-01 10:00:00 [kv_cache_utils.py:1] GPU KV cache size: 42,656 tokens\n")
    assert kvlab("vllm", "log", str(text)).exit_code == 0


def test_mtp_drafter_named_in_the_block_and_weights_rows(kvlab):
    """Finding 2: with --speculative-method mtp the blocks, weights and concurrency moved and no row said why."""
    args = ("size", "deepseek-v3", "--gpu", "h200", "-tp", "8")
    out = " ".join(kvlab(*args, "--speculative-method", "mtp").stdout.split())
    assert "62 layers (with the MTP drafter's 1: --speculative-method mtp, 1 draft token a step)" in out
    assert "+ 1.38 GiB MTP drafter (1 layer like layer 60" in out
    plain = " ".join(kvlab(*args).stdout.split())
    assert "drafter" not in plain and "61 layers x 18,432 B" in plain
    sized = kvlab(*args, "--speculative-method", "mtp", "--json").json()
    assert sized["drafter_layers"] == 1 and sized["drafter_weights"].startswith("1.38 GiB MTP drafter")


def test_empty_config_and_misspelled_trace_say_so(kvlab, tmp_path):
    """Finding 11: an empty config.json said 'Expecting value: line 1 column 1'; a misspelled trace had no hint."""
    empty = tmp_path / "config.json"
    empty.write_text("\n")
    r = kvlab("size", str(empty), "--gpu", "h100-sxm")
    assert r.exit_code == 2 and "is empty: give a model's config.json" in r.stderr, r.stderr
    r = kvlab("workloads", "fetch", "azur-conv")
    assert r.exit_code == 2 and "unknown trace 'azur-conv' (did you mean 'azure-conv'?)" in r.stderr, r.stderr


def test_beyond_reach_rule_on_exact_verdicts():
    """Trial 54b finding 2's rule: two sustained misses a halving of the load apart; out of reach exactly where the
    gap still needed exceeds the last halving's gain (convex latency: later halvings gain at most as much in all)."""
    from kvlab.sweep.capacity import beyond_reach
    from kvlab.sweep.slo import Verdict, parse_slo

    slo = parse_slo("mean_normalized_latency<0.1s")
    term = slo.terms[0].text

    def missed(value):
        return Verdict(False, {term: value}, None, f"missed {term} ({value * 1e3:.0f} ms)")

    stable = {"state": "stable"}
    why = beyond_reach([missed(0.367), missed(0.322)], [stable, stable], slo)
    assert why is not None and "gained 45 ms" in why and "222 ms still needed" in why
    assert beyond_reach([missed(0.367), missed(0.2)], [stable, stable], slo) is None  # (gain 167 >= need 100)
    assert beyond_reach([missed(0.367), missed(0.322)], [stable, {"state": "overloaded"}], slo) is None
    assert beyond_reach([missed(0.367), missed(0.322)], [stable, stable], parse_slo("ttft<1s", goodput=0.9)) is None


def test_replicas_auto_stops_where_no_count_can_hold(kvlab, tmp_path):
    """Trial 54b findings 1-2: llama-3.1-70b on L4 at 0.1 s normalized latency doubled to 4,096 replicas (40,960 L4s
    for 2 req/s) and printed 'no count held; None.'; it now stops at the second count and says why."""
    r = kvlab("capacity", "--model", "llama-3.1-70b", "--gpu", "l4", "--replicas", "auto", "--rate", "2", "-n", "60",
              "-tp", "2", "-pp", "5", "--out", tmp_path)
    assert r.exit_code == 2, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert "the target cannot be met with any number of replicas: with 2 replicas" in err and "looser --slo" in err
    assert "None" not in r.stdout + r.stderr


def test_lab_rates_refuse_the_sample_kvlab_capacity_refuses(kvlab):
    """Trial 54b finding 5: /api/rates?num_requests=5 answered 'none (41 ?)' where `kvlab capacity -n 5` refuses."""
    import pytest

    from kvlab.errors import KvlabError
    from kvlab.service.capacity import min_sample_requests
    from kvlab.web.params import parse_rate_setup

    least = min_sample_requests()
    assert least == 13
    with pytest.raises(KvlabError, match=f"num_requests 12: .*valid: {least} to 2000"):
        parse_rate_setup({"num_requests": "12"})
    assert parse_rate_setup({"num_requests": str(least)}).num_requests == least
    r = kvlab("capacity", "--strategy", "vllm", "-n", "12")
    assert r.exit_code == 2 and f"-n {least} or more" in r.stderr, r.stderr


def test_mtp_log_lessons_say_what_their_short_count_rests_on(kvlab):
    """Trial 54b findings 3 and 6: without --model, the Qwen3.6 MTP log's short count (16-token blocks, one group)
    is said to be an assumption; with it, the count is the log's prefix-caching ('align') sizing with its MTP draft
    tokens, so the lesson does not cite `kvlab size --context-len` for it (`kvlab size` counts 'align' with
    --enable-prefix-caching, and by default from vLLM 0.28.0)."""
    log = str(LOGS / "qwen3.6-27b-int4-2xrtx3090-x4x4-p2p-on-mtp.log")
    out = " ".join(kvlab("vllm", "log", log).stdout.split())
    assert "18 fit at once" in out and "if every layer is full attention in blocks of 16, which the log does not say" in out
    config = str(LOGS.parent / "sizing_configs" / "qwen3.6-27b.json")
    out = " ".join(kvlab("vllm", "log", log, "--model", config).stdout.split())
    assert "11 fit at once" in out and "with the log's prefix caching on" in out and "--context-len" not in out

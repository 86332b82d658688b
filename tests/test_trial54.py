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

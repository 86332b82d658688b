"""Findings of user trial 51 (fix51b): each test failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlab.errors import KvlabError
from kvlab.vllm.log import explain_vllm_log, parse_vllm_log

A100_LOG = Path("tests/data/startup_logs/llama-3.1-8b-a100-40gb-eager-0.15.1.log")  # TP 1, 14.99 GiB of weights


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_a_model_whose_weights_exceed_the_logs_gpu_is_refused_like_one_whose_context_is_too_short(kvlab):
    """`vllm log <8B on one A100-40GB> --model llama-3.1-70b` tabulated 0.48x 'differs' (exit 0): the 70B's weights
    alone exceed what that GPU had for weights and KV cache."""
    r = kvlab("vllm", "log", A100_LOG, "--model", "llama-3.1-70b")
    assert r.exit_code == 2
    assert ("llama-3.1-70b (as asked) cannot run with the settings of this log, which names "
            "/home/admin_iloh_altostrat_com/models/Meta-Llama-3.1-8B-Instruct, as vLLM would refuse it: its weights "
            "take 131.45 GiB per GPU (tensor_parallel_size 1), more than the 34.27 GiB the log's engine had for weights "
            "and KV cache together (14.99 GiB of weights + 19.28 GiB of KV cache); valid: the model the log was "
            "started with") in one_line(r.stderr)


def test_a_too_short_context_refusal_gives_one_remedy(kvlab):
    """The opt-13b refusal ended '(use at most 2,048); valid: the model the log was started with': two remedies,
    the first a flag the log's reader cannot give."""
    message = one_line(kvlab("vllm", "log", A100_LOG, "--model", "opt-13b").stderr)
    assert message.endswith("is greater than opt-13b's max_position_embeddings (2,048); valid: the model the log was "
                            "started with"), message
    assert "use at most" not in message


def test_another_model_the_logs_kv_cache_cannot_start_is_refused():
    """A catalogue model other than the log's, with weights that fit but no request at its max_model_len: vLLM would
    not start it with that KV cache memory; the log's own model (1.20x) still gets its comparison."""
    named = A100_LOG.read_text().replace("/home/admin_iloh_altostrat_com/models/Meta-Llama-3.1-8B-Instruct",
                                         "meta-llama/Llama-3.1-8B-Instruct")
    log = parse_vllm_log(named)
    # (the log's user typed no --max-model-len: NeMo runs at its own default, its 1,024,000 positions)
    with pytest.raises(KvlabError, match=r"one 1,024,000-token request \(the model's default max_model_len\) needs "
                                         r"156.25 GiB of KV cache, more than the log's 19.28 GiB \(maximum "
                                         r"concurrency 0.12x\)"):
        explain_vllm_log(log, "mistral-nemo-12b")
    assert explain_vllm_log(log, "llama-3.1-8b")["differences"] == []


def test_the_weights_check_sizes_the_asked_model_in_the_logs_quantization():
    """Trial 51b: an AWQ 70B log (2 x L40S, 18.55 GiB of weights a GPU) with --model llama-3.1-70b, the catalogue's
    nearest, was refused at the 70B's bf16 size (65.74 GiB a GPU); in the log's format it fits, as it did."""
    log = parse_vllm_log(Path("tests/data/startup_logs/llama-3-70b-awq-2xl40s-tp2-0.16.0.log").read_text())
    assert log.settings.get("quantization") == "awq_marlin"
    assert explain_vllm_log(log, "llama-3.1-70b")["comparison"]  # (a comparison, not a refusal)


@pytest.mark.parametrize(("args", "says"), [
    (("cost", "ROOFLINE"), "error: unknown cost profile 'ROOFLINE' (did you mean 'roofline'?)"),
    (("capacity", "--replicas", "AUTO"), "--replicas 'AUTO': auto is written in lower case; valid: --replicas auto"),
])
def test_a_name_in_capitals_is_offered_in_lower_case(kvlab, args, says):
    r = kvlab(*args)
    assert r.exit_code == 2 and says in one_line(r.stderr), r.stderr


@pytest.mark.parametrize("flag", ["--enable-prefix-caching", "--no-enable-prefix-caching"])
def test_a_sweep_given_the_prefix_caching_flag_names_the_strategy_suffix(flag):
    from kvlab.strategies import parse_strategy
    from kvlab.sweep.grid import option_name

    with pytest.raises(KvlabError, match=r"prefix caching is part of the strategy's name: --strategy vllm has it on "
                                         r"\(as vllm serve\), --strategy vllm\+noprefix off; the options they vary"):
        option_name(flag)
    assert not parse_strategy("vllm+noprefix").enable_prefix_caching  # (the name the hint gives is a strategy)


def test_another_model_runs_at_its_own_default_length_where_the_log_did_not_type_one():
    """Trial 51b: on a Qwen3-8B log whose user typed no --max-model-len (40,960 is Qwen3-8B's default), --model
    opt-13b was refused as if --max-model-len 40,960 had been given; vLLM would run opt-13b at its own 2,048. A
    length the log's user typed stays the log's (gpt-oss-120b's log, --max-model-len 16,384: llama-2-70b refused)."""
    qwen = parse_vllm_log(Path("tests/data/startup_logs/qwen3-8b-a100-40gb-0.9.2.log").read_text())
    assert qwen.typed_args is not None and "max_model_len" not in qwen.typed_args
    out = explain_vllm_log(qwen, "opt-13b")
    assert out["kvlab"]["max_model_len"] == 2048
    assert any("opt-13b runs at its own, 2,048" in line for line in out["lines"])
    assert explain_vllm_log(qwen, "qwen3-8b")["kvlab"]["max_model_len"] == 40960  # (the log's own model: its length)
    gpt = parse_vllm_log(Path("tests/data/startup_logs/gpt-oss-120b-4xa100-80gb-ray-0.10.1.1.log").read_text())
    assert "max_model_len" in gpt.typed_args
    with pytest.raises(KvlabError, match=r"--max-model-len 16,384 is greater than llama-2-70b's"):
        explain_vllm_log(gpt, "llama-2-70b")

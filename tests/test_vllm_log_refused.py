"""`kvlab vllm log --model M` on a log where vLLM refused to start because nothing was left for the KV cache (its
'Available KV cache memory' printed negative): kvlab says whether the model's weights explain the refusal, and a
model that is the log's own is never refused as another (trial 53, finding 9)."""

from __future__ import annotations

from pathlib import Path

LOGS = Path(__file__).parent / "data" / "startup_logs"
NEGATIVE = str(LOGS / "gpt-oss-120b-h100-0.10.1-negative-kv.log")


def test_the_logs_own_model_on_a_refused_log_gets_the_explanation_and_kvlabs_agreement(kvlab):
    result = kvlab("vllm", "log", NEGATIVE, "--model", "gpt-oss-120b")
    assert result.exit_code == 0, result.stdout
    assert "vLLM refused to start: nothing was left for the KV cache" in " ".join(result.stdout.split())
    assert ("kvlab agrees that nothing is left for the KV cache with gpt-oss-120b: its weights take 64.33 GiB per GPU "
            "(tensor_parallel_size 1), more than the 63.83 GiB the log's engine had for weights and KV cache "
            "together (65.9651 GiB of weights + -2.14 GiB of KV cache).") in " ".join(result.stdout.split())
    assert "cannot run with the settings of this log" not in " ".join(result.stdout.split())


def test_a_model_whose_weights_are_not_the_logs_is_told_so_not_compared(kvlab):
    result = kvlab("vllm", "log", NEGATIVE, "--model", "llama-3.1-8b")
    assert result.exit_code == 0, result.stdout
    assert ("kvlab's weights for llama-3.1-8b, 14.99 GiB per GPU, are not the 65.9651 GiB this log loaded: it ran "
            "another model, or the same in another format") in " ".join(result.stdout.split())
    assert "kvlab agrees" not in " ".join(result.stdout.split())


def test_the_json_answer_carries_the_same_line(kvlab):
    result = kvlab("vllm", "log", NEGATIVE, "--model", "gpt-oss-120b", "--json")
    assert result.exit_code == 0, result.stdout
    assert "kvlab agrees that nothing is left for the KV cache with gpt-oss-120b" in " ".join(result.stdout.split())

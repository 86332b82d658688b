"""`kvlab vllm log` on the logs trial 53 found it misread.

A log where vLLM refused to start because nothing was left for the KV cache (its 'Available KV cache memory' printed
negative): kvlab says whether the model's weights explain the refusal, and a model that is the log's own is never
refused as another (finding 9). A hybrid model's log from a release that prints num_blocks // groups x block_size:
the block size read from tokens / blocks is multiplied by the model's groups, and kvlab's side is sized under the
log's own release (finding 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_a_hybrid_models_block_size_counts_its_kv_cache_groups_under_the_logs_release(kvlab):
    log = str(LOGS / "gpt-oss-120b-4xa100-80gb-ray-0.10.1.1.log")
    result = kvlab("vllm", "log", log, "--json")
    assert result.exit_code == 0, result.stderr
    answer = result.json()
    assert answer["block_size"] == 16
    assert "2 KV cache groups of gpt-oss-120b" in answer["derived"]["block_size"]
    explanation = answer["explanation"]
    side = explanation["kvlab"]
    assert side["block_size"] == 16 and side["bytes_per_block"] == 147_456
    assert {row["figure"]: row["status"] for row in explanation["comparison"]} == {
        "num_gpu_blocks": "within rounding", "kv_cache_tokens": "within rounding", "max_concurrency": "equal"}
    assert explanation["differences"] == []


def test_a_pipeline_parallel_logs_stages_are_sized_each_on_its_own_workers_memory(kvlab):
    """DeepSeek-V2-Lite, TP 2 x PP 2: ranks 0-1 (stage 0, 14 of 27 layers) printed 12.13 GiB, ranks 2-3 (stage 1,
    13 layers) 11.33 GiB; vLLM keeps the fewest blocks of any worker: 12.13 GiB / (16 x 14 x 1,152 B) = 50,487
    blocks, 807,792 tokens (trial 53, finding 5: 11.33 GiB with stage 0's layers gave 754,304, -6.6%)."""
    log = str(LOGS / "deepseek-v2-lite-4xl4-tp2-pp2-eager-0.9.2dev.log")
    result = kvlab("vllm", "log", log, "--json")
    assert result.exit_code == 0, result.stderr
    explanation = result.json()["explanation"]
    assert {row["figure"]: row["status"] for row in explanation["comparison"]} == {
        "kv_cache_tokens": "within rounding", "max_concurrency": "within rounding"}
    assert explanation["kvlab"]["available_kv_source"].startswith("12.13, 11.33 GiB as printed by the 2 pipeline")
    assert any("vLLM keeps the fewest blocks any worker's memory gives for its stage's layers" in line
               for line in explanation["lines"])


def test_a_workers_rank_is_kept_in_its_label():
    from kvlab.vllm.log import clean_line

    line = clean_line("(VllmWorker rank=3 pid=19834) INFO 07-09 09:47:45 [gpu_worker.py:233] Available KV cache "
                      "memory: 11.33 GiB")
    assert line.worker == "VllmWorker rank=3 pid=19834"
    assert line.message == "Available KV cache memory: 11.33 GiB"


@pytest.mark.parametrize("log, size", [("qwen3-32b-2xrtxpro6000-tp2-util0.426-0.27.1.log", "tensor_parallel_size"),
                                       ("qwen3-32b-2xrtxpro6000-pp2-util0.426-0.27.1.log", "pipeline_parallel_size")])
def test_the_parallel_sizes_come_from_the_workers_names_where_the_arguments_say_none(kvlab, log, size):
    """Trial 53b: two-GPU logs whose arguments name no parallelism (their lines are Worker_TP0/TP1, Worker_PP0/PP1)
    were read as one GPU, and the log's own model was refused for weights twice one GPU's."""
    result = kvlab("vllm", "log", str(LOGS / log), "--model", "qwen3-32b", "--json")
    assert result.exit_code == 0, result.stderr
    answer = result.json()
    assert answer["settings"][size] == 2 and "the workers' names" in answer["derived"][size]
    assert answer["explanation"]["differences"] == []


def test_a_model_in_another_format_than_the_refused_logs_is_told_so_before_any_agreement(kvlab):
    """Trial 53b: on an FP8 checkpoint's negative-KV log, --model qwen2.5-14b-instruct (bf16, 27.52 GiB) 'agreed'
    with the refusal, comparing its weights with the FP8 log's room (15.22 GiB loaded)."""
    log = str(LOGS / "qwen2.5-14b-fp8-dynamic-gb10-util0.15-negative-kv-0.13.0nv.log")
    result = kvlab("vllm", "log", log, "--model", "qwen2.5-14b-instruct")
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "kvlab's weights for qwen2.5-14b-instruct, 27.52 GiB per GPU, are not the 15.2227 GiB this log loaded" in text
    assert "kvlab agrees" not in text

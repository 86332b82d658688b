"""`kvlab vllm log`: vLLM startup logs of every format, as people paste them (tests/fixtures/vllm_logs/README.md
says where each fixture comes from), and the real CPU engine's own log."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvlab.errors import KvlabError
from kvlab.vllm.log import clean_line, explain_vllm_log, parse_args_dict, parse_vllm_log

FIXTURES = Path(__file__).parent / "fixtures" / "vllm_logs"
TINY_LLAMA = Path(__file__).resolve().parents[1] / "src" / "kvlab" / "vllm" / "tiny_llama.json"
CONTRACT_KEYS = ("kv_cache_tokens", "num_gpu_blocks", "block_size", "max_concurrency",
                 "max_concurrency_tokens_per_request", "available_kv_cache_gib", "model_weights_gib", "max_model_len",
                 "refused", "format", "lines", "per_worker")


def parse(name: str):
    return parse_vllm_log((FIXTURES / name).read_text(encoding="utf-8"))


def figures(**expected):
    return expected


# Every figure each fixture states, exactly (None: the log does not say it and it cannot be worked out).
EXPECTED = {
    "v1_0.32_cpu_api_server.log": figures(
        format="v1", kv_cache_tokens=262_144, kv_cache_device="CPU", num_gpu_blocks=8192, block_size=32,
        max_concurrency=128.0, max_concurrency_tokens_per_request=2048, available_kv_cache_gib=0.25,
        model_weights_gib=None, max_model_len=2048, refused=False, model="/tmp/vllm-log-try/model",
        vllm_version="0.32.0"),
    "v1_0.11_mistral_dgx_spark.log": figures(
        format="v1", kv_cache_tokens=840_160, num_gpu_blocks=52_510, block_size=16, max_concurrency=25.64,
        max_concurrency_tokens_per_request=32_768, available_kv_cache_gib=102.56, model_weights_gib=3.8844,
        max_model_len=32_768, refused=False, model="/models/mistral-7b", vllm_version="0.11.0+582e4e37.nv25.11"),
    "v1_0.11_tp4_per_worker.log": figures(
        format="v1", kv_cache_tokens=100_752, num_gpu_blocks=6297, block_size=16, max_concurrency=1.54,
        max_concurrency_tokens_per_request=65_536, available_kv_cache_gib=2.31, model_weights_gib=14.7708,
        max_model_len=65_536, refused=False, model="/home/zp/work/models/Qwen/Qwen3-VL-30B-A3B-Instruct",
        vllm_version="0.11.0"),
    "v0_0.6.4_phi_gpu_blocks.log": figures(
        format="v0", kv_cache_tokens=19_312, num_gpu_blocks=1207, num_cpu_blocks=1365, block_size=16,
        max_concurrency=9.43, max_concurrency_tokens_per_request=2048, available_kv_cache_gib=3.54,
        model_weights_gib=2.6419, max_model_len=2048, total_gpu_memory_gib=7.92, gpu_memory_utilization=0.9,
        refused=False, model=None),
    "v0_0.7.2_qwen2.5_1.5b_colab.log": figures(
        format="v0", kv_cache_tokens=88_272, num_gpu_blocks=5517, num_cpu_blocks=9362, block_size=16,
        max_concurrency=2.69, max_concurrency_tokens_per_request=32_768, available_kv_cache_gib=2.36,
        model_weights_gib=2.8884, max_model_len=32_768, total_gpu_memory_gib=14.56, gpu_memory_utilization=0.5,
        refused=False, model="Qwen/Qwen2.5-1.5B-Instruct", vllm_version="0.7.2"),
    "v0_refusal.log": figures(
        format="v0", refused=True, max_model_len=131_072, kv_cache_tokens=93_760, num_gpu_blocks=5860,
        block_size=16, max_concurrency=0.72),
    "v1_refusal_engine_core.log": figures(
        format="v1", refused=True, max_model_len=262_144, needed_kv_cache_gib=24.0, available_kv_cache_gib=8.68,
        estimated_max_model_len=94_784, kv_cache_tokens=None, max_concurrency=None),
    "v1_refusal_wrapped.md": figures(
        format="v1", refused=True, max_model_len=32_768, needed_kv_cache_gib=5.0, available_kv_cache_gib=0.53,
        estimated_max_model_len=None),
    "v1_docker_compose_ansi.log": figures(
        format="v1", kv_cache_tokens=840_160, max_concurrency=25.64, max_concurrency_tokens_per_request=32_768,
        available_kv_cache_gib=102.56, model_weights_gib=14.9889, max_model_len=32_768, refused=False,
        model="meta-llama/Llama-3.1-8B-Instruct", block_size=None, num_gpu_blocks=None, vllm_version="0.11.0"),
    "v1_ray_llmrayactor.log": figures(
        format="v1", kv_cache_tokens=42_656, max_concurrency=1.30, max_concurrency_tokens_per_request=32_768,
        available_kv_cache_gib=6.51, max_model_len=32_768, refused=False, model="Qwen/Qwen3-14B"),
    "v1_github_issue_paste.md": figures(
        format="v1", kv_cache_tokens=42_656, max_concurrency=1.30, max_concurrency_tokens_per_request=32_768,
        available_kv_cache_gib=6.51, max_model_len=32_768, refused=False, model=None),
}


def test_every_fixture_has_its_expectations():
    assert sorted(p.name for p in FIXTURES.iterdir() if p.name != "README.md") == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_figures(name):
    log = parse(name)
    for key, value in EXPECTED[name].items():
        assert getattr(log, key) == value, f"{name}: {key}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_stated_figure_names_the_line_it_was_read_from(name):
    log = parse(name)
    data = log.to_json()
    assert set(CONTRACT_KEYS) <= set(data)
    for figure, line in data["lines"].items():
        assert figure not in data["derived"]
        value = data[figure]
        shown = {int: lambda v: (f"{v:,}", str(v)), float: lambda v: (f"{v:.2f}", f"{v}", f"{v:.1f}"),
                 bool: lambda v: ("max seq len", "No available memory", "failed to start"), str: lambda v: (v,)}[type(value)](value)
        assert any(s in line for s in shown), f"{figure}={value!r} not in {line!r}"
    for figure in data["derived"]:
        assert figure not in data["lines"]


def test_v1_per_worker_repetition_keeps_the_first_and_every_occurrence():
    log = parse("v1_0.11_tp4_per_worker.log")
    available = log.per_worker["available_kv_cache_gib"]
    assert [e["worker"] for e in available] == ["Worker_TP3 pid=41702", "Worker_TP2 pid=41701",
                                                "Worker_TP0 pid=41699", "Worker_TP1 pid=41700"]
    assert [e["value"] for e in available] == [2.31] * 4
    assert [(e["worker"], e["value"]) for e in log.per_worker["kv_cache_tokens"]] == \
        [("EngineCore_DP0 pid=41565", 100_752)] * 4
    assert [e["value"] for e in log.per_worker["model_weights_gib"]] == [14.7708] * 4
    assert log.settings["tensor_parallel_size"] == 4
    lines = explain_vllm_log(log)["lines"]
    assert "The available KV cache memory and model weights lines appear 4 times, by 4 workers," in " ".join(lines)
    assert "The KV cache size line appears 4 times with the same figure" in " ".join(lines)


def test_workers_that_differ_report_the_first_and_say_so():
    text = "\n".join(f"(Worker_PP{i} pid={100 + i}) INFO 10-06 15:57:53 [gpu_worker.py:298] Available KV cache "
                     f"memory: {gib} GiB" for i, gib in enumerate((2.31, 1.97)))
    text += "\n(EngineCore_DP0 pid=99) INFO 10-06 15:57:53 [kv_cache_utils.py:1087] GPU KV cache size: 16,144 tokens"
    log = parse_vllm_log(text)
    assert log.available_kv_cache_gib == 2.31
    assert [e["value"] for e in log.per_worker["available_kv_cache_gib"]] == [2.31, 1.97]
    assert any("differs between workers (2.31, 1.97)" in line for line in explain_vllm_log(log)["lines"])


def test_thousands_separators_and_plain_numbers():
    log = parse_vllm_log("GPU KV cache size: 1,234,560 tokens\nMaximum concurrency for 131,072 tokens per request: "
                         "9.42x")
    assert (log.kv_cache_tokens, log.max_model_len, log.max_concurrency) == (1_234_560, 131_072, 9.42)
    old = parse_vllm_log("INFO 12-22 10:55:35 gpu_executor.py:80] Maximum concurrency for 2048 tokens per request: "
                         "5.59x")
    assert (old.format, old.max_model_len, old.max_concurrency) == ("v0", 2048, 5.59)


def test_one_line_v1_format_of_0_32():
    log = parse_vllm_log("(EngineCore pid=7) INFO 12-01 08:35:31 [kv_cache_utils.py:2327] GPU KV cache size: "
                         "42,656 tokens, Maximum concurrency for 32,768 tokens per request: 1.30x")
    assert (log.kv_cache_tokens, log.max_concurrency_tokens_per_request, log.max_concurrency) == (42_656, 32_768, 1.3)


def test_v0_cuda_blocks_and_three_line_memory_message():
    log = parse("v0_0.7.2_qwen2.5_1.5b_colab.log")
    assert log.kv_cache_device == "CUDA" and log.device == "CUDA"
    assert log.settings["dtype"] == "float16"
    assert "the rest of the memory reserved for KV Cache is 2.36GiB" in log.lines["available_kv_cache_gib"]
    assert log.derived["block_size"].startswith("the only block size")


CORPUS = Path(__file__).parent / "data" / "startup_logs"


def corpus_log(name: str):
    return parse_vllm_log((CORPUS / name).read_text(encoding="utf-8", errors="replace"))


def test_v0_memory_split_gives_every_term():
    log = parse("v0_0.7.2_qwen2.5_1.5b_colab.log")
    # the weights as 'Loading model weights took 2.8884 GB' printed them first, the split's 2.89GiB after
    assert (log.model_weights_gib, log.non_torch_gib, log.activation_gib, log.available_kv_cache_gib) == (
        2.8884, 0.01, 2.02, 2.36)
    assert "PyTorch activation peak memory takes 2.02GiB" in log.lines["activation_gib"]


def test_free_memory_on_startup_and_actual_usage_of_0_10():
    # llava-v1.6 on an 80 GB card, vLLM 0.10.2 (tests/data/startup_logs/index.json has the source)
    log = corpus_log("llava-v1.6-mistral-7b-80gb-0.10.2.log")
    assert (log.total_gpu_memory_gib, log.gpu_memory_utilization, log.requested_memory_gib) == (79.19, 0.9, 71.27)
    assert (log.activation_gib, log.non_torch_gib, log.cuda_graph_gib) == (1.97, 0.07, 0.67)
    assert "1.97 GiB for peak activation" in log.lines["activation_gib"]


def test_the_explanation_states_vllms_memory_profile():
    lines = explain_vllm_log(corpus_log("llava-v1.6-mistral-7b-80gb-0.10.2.log"))["lines"]
    assert ("vLLM's memory profile of the 71.27 GiB it requested (0.9 x 79.19 GiB): weights 14.08 GiB, the peak "
            "activation of its profiling run 1.97 GiB, non-torch memory 0.07 GiB, CUDA graphs 0.67 GiB") in " ".join(lines)
    plain = explain_vllm_log(parse("v1_0.32_cpu_api_server.log"))["lines"]
    assert not any("memory profile" in line for line in plain)  # a log without the breakdown says nothing of it


def test_the_encoder_profiling_line_of_a_multimodal_model():
    llava = corpus_log("llava-v1.6-mistral-7b-80gb-0.10.2.log")
    assert (llava.encoder_budget_tokens, llava.encoder_profile_items, llava.encoder_profile_modality) == (
        16384, 5, "image")
    qwen3_vl = corpus_log("qwen3-vl-30b-a3b-4xrtx3090-0.11.0.log")  # printed once per TP worker
    assert (qwen3_vl.encoder_budget_tokens, qwen3_vl.encoder_profile_items, qwen3_vl.encoder_profile_modality) == (
        153600, 1, "video")
    text = " ".join(" ".join(explain_vllm_log(qwen3_vl)["lines"]).split())
    assert ("vLLM ran the multimodal encoder over 1 video item of the largest size, with an encoder cache budget of "
            "153,600 tokens") in text
    assert corpus_log("qwen3-8b-a100-40gb-0.9.2.log").encoder_profile_items is None  # a text model: no such line


def test_actual_usage_of_0_28_wrapped_over_four_lines():
    log = corpus_log("qwen3-14b-awq-rtx5090-util0.7-0.28.0.log")
    assert (log.total_gpu_memory_gib, log.requested_memory_gib) == (31.36, 21.95)
    assert (log.weights_and_non_torch_gib, log.activation_gib, log.cuda_graph_gib) == (11.22, 1.46, 0.52)
    assert log.model_weights_gib is None and log.non_torch_gib is None  # printed as one figure
    assert log.free_on_startup_gib == 30.86
    # 0.28's 'consumed memory' is total - free after loading: it counts what was in use at the startup snapshot.
    text = " ".join(explain_vllm_log(log)["lines"])
    assert ("0.50 GiB was in use on the device at its startup snapshot (31.36 GiB total - 30.86 GiB free: its own "
            "CUDA context and any other process's memory), which its 'consumed memory'") in " ".join(text.split())
    assert "assumes none" in text


def test_debug_profile_line_of_0_10():
    log = corpus_log("qwen3-8b-fp8-24gb-util0.8-debug-0.10.2.log")
    assert (log.non_kv_cache_gib, log.activation_gib, log.non_torch_gib, log.model_weights_gib) == (
        10.22, 1.4, 0.02, 8.8)
    assert (log.total_gpu_memory_gib, log.requested_memory_gib) == (23.53, 18.82)


def test_gb_units_of_0_8_are_gib():
    log = corpus_log("gemma-3-1b-it-0.8.2.log")
    assert (log.model_weights_gib, log.cuda_graph_gib) == (1.9134, 0.44)
    assert corpus_log("llama-3.1-8b-lora-a100-0.8.2.log").model_weights_gib == 15.1749
    v0 = parse_vllm_log("INFO 05-30 06:40:51 model_runner.py:1115] Loading model weights took 2.8876 GB\n"
                        "INFO 05-30 06:40:55 executor_base.py:110] # CUDA blocks: 5,512, # CPU blocks: 9,362")
    assert v0.model_weights_gib == 2.8876


def test_cuda_graph_estimate_and_pool_of_0_19():
    log = corpus_log("qwen2.5-7b-awq-windows-util0.7-0.19.0.log")
    assert (log.estimated_cuda_graph_gib, log.cuda_graph_gib) == (0.05, 0.03)
    assert "Estimated CUDA graph memory: 0.05 GiB total" in log.lines["estimated_cuda_graph_gib"]
    assert log.to_json()["estimated_cuda_graph_gib"] == 0.05


def test_refusals():
    v0 = parse("v0_refusal.log")
    assert "The model's max seq len (131072)" in v0.lines["refused"]
    text = " ".join(explain_vllm_log(v0)["lines"])
    assert "vLLM refused to start" in text and "--max-model-len 93760 or less" in text
    v1 = parse("v1_refusal_engine_core.log")
    text = " ".join(explain_vllm_log(v1)["lines"])
    assert "262,144 tokens needs 262,144 / 16 = 16,384 blocks of 16 tokens (block_size 16 assumed" in text
    assert "24.00 GiB of KV cache, and only 8.68 GiB fit. Fix: --max-model-len 94784 or less" in text
    wrapped = " ".join(explain_vllm_log(parse("v1_refusal_wrapped.md"))["lines"])
    assert "--max-model-len of about 3,472 or less (0.53 / 5.00 of 32,768, for full attention)" in wrapped
    nothing = parse_vllm_log("ERROR 06-26 09:27:15 [core.py:519] ValueError: No available memory for the cache "
                             "blocks. Try increasing `gpu_memory_utilization` when initializing the engine.")
    assert nothing.refused and nothing.no_kv_memory


WRAPPERS = {
    "compose": lambda line: f"vllm-server-1  | {line}",
    "compose colours": lambda line: f"\x1b[36mvllm-1  |\x1b[0m {line}",
    "docker -t": lambda line: f"2026-12-01T08:35:31.123456789Z {line}",
    "kubectl --prefix": lambda line: f"[pod/vllm-7d9f/vllm] {line}",
    "ray": lambda line: f"(LLMRayActor pid=32499, ip=10.65.0.3) {line}",
    "ray colours, dedup": lambda line: f"\x1b[36m(LLMRayActor pid=1)\x1b[0m {line} [repeated 2x across cluster]",
    "markdown quote": lambda line: f"> {line}",
    "back-quotes": lambda line: f"`{line}`",
    "indented": lambda line: f"    {line}",
    "CRLF": lambda line: f"{line}\r",
    "lost escapes": lambda line: f"[0;36m{line}[0;0m",
}


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_wrapped_logs_give_the_same_figures(wrapper):
    text = (FIXTURES / "v1_0.32_cpu_api_server.log").read_text(encoding="utf-8")
    wrapped = "```text\n" + "\n".join(map(WRAPPERS[wrapper], text.splitlines())) + "\n```\n"
    plain, log = parse_vllm_log(text).to_json(), parse_vllm_log(wrapped).to_json()
    for data in (plain, log):
        del data["lines"], data["per_worker"]
    assert log == plain


def test_the_same_figures_in_the_three_wrapped_fixtures():
    compose, ray, issue = (parse(n) for n in ("v1_docker_compose_ansi.log", "v1_ray_llmrayactor.log",
                                               "v1_github_issue_paste.md"))
    assert "\x1b" not in "".join(compose.lines.values()) and "[0;36m" not in "".join(issue.lines.values())
    assert compose.lines["kv_cache_tokens"].startswith("(EngineCore_DP0 pid=164) INFO 01-23 15:50:06")
    assert (ray.kv_cache_tokens, issue.kv_cache_tokens) == (42_656, 42_656)
    assert [e["worker"] for e in ray.per_worker["kv_cache_tokens"]] == ["EngineCore_DP0 pid=9811",
                                                                        "EngineCore_DP0 pid=9812"]


def test_clean_line_keeps_vllms_prefix_and_finds_the_innermost_process():
    line = clean_line("\x1b[36mtrainer-1  |\x1b[0m (LLMRayActor pid=9085, ip=10.0.0.2) (EngineCore_DP0 pid=9811) "
                      "INFO 03-21 14:01:57 [gpu_worker.py:298] Available KV cache memory: 6.51 GiB")
    assert line.worker == "EngineCore_DP0 pid=9811"
    assert line.message == "Available KV cache memory: 6.51 GiB"
    assert line.text.startswith("(LLMRayActor pid=9085, ip=10.0.0.2) (EngineCore_DP0")
    assert clean_line("```text") is None


def test_non_default_args_are_read_safely():
    assert parse_args_dict("{'model': 'Qwen/Qwen3-8B', 'block_size': 32, 'enforce_eager': True}") == \
        {"model": "Qwen/Qwen3-8B", "block_size": 32, "enforce_eager": True}
    # Not a literal (a repr of an object), or cut off in the paste: read item by item, never evaluated.
    odd = parse_args_dict("{'model': '/m', 'compilation_config': CompilationConfig(level=3), 'max_model_len': 8192, "
                          "'gpu_memory_utilization': 0.85, 'served_model_name': ['a', 'b'], 'block_size': 1")
    assert odd == {"model": "/m", "max_model_len": 8192, "gpu_memory_utilization": 0.85,
                   "served_model_name": ["a", "b"], "block_size": 1}
    assert parse_args_dict("{'model': __import__('os').system('true')}") == {}
    log = parse_vllm_log("(APIServer pid=1) INFO 10-06 15:56:26 [utils.py:233] non-default args: {'model_tag': "
                         "'Qwen/Qwen3-8B', 'block_size': 32, 'max_model_len': 8192, 'gpu_memory_utilization': 0.85}\n"
                         "(EngineCore_DP0 pid=2) INFO 10-06 15:57:53 [kv_cache_utils.py:1087] GPU KV cache size: "
                         "65,536 tokens")
    assert (log.model, log.block_size, log.max_model_len, log.gpu_memory_utilization) == \
        ("Qwen/Qwen3-8B", 32, 8192, 0.85)
    assert log.num_gpu_blocks == 2048 and "full-attention" in log.derived["num_gpu_blocks"]


# --- the explanation, and kvlab's calculation beside vLLM's ---

def test_explanation_tokens_blocks_conversations():
    lines = explain_vllm_log(parse("v1_ray_llmrayactor.log"))["lines"]
    text = " ".join(lines)
    assert "42,656 / 16 = 2,666 blocks" in text
    assert "takes 32,768 / 16 = 2,048 blocks, so 2,666 / 2,048 = 1.30 such conversations fit at once" in text
    assert "block_size 16 assumed" in text
    v0 = " ".join(explain_vllm_log(parse("v0_0.6.4_phi_gpu_blocks.log"))["lines"])
    assert "1,207 blocks of 16 tokens = 19,312 tokens" in v0 and "1,207 / 128 = 9.43" in v0
    # A sliding-window model: vLLM's concurrency is not blocks / blocks of a full-length conversation.
    sliding = parse_vllm_log("INFO 01-23 15:50:06 [kv_cache_utils.py:1091] Maximum concurrency for 32,768 tokens "
                             "per request: 102.36x\nINFO 01-23 15:50:32 [loggers.py:147] Engine 000: vllm "
                             "cache_config_info with initialization after num_gpu_blocks is: 52510")
    text = " ".join(explain_vllm_log(sliding)["lines"])
    assert "52,510 / 2,048 = 25.64 such conversations fit at once; vLLM says 102.36x: this model's layers are not " \
           "all full attention" in text


def test_kvlab_equals_vllm_where_the_model_is_known():
    for name, model in (("v1_ray_llmrayactor.log", "qwen3-14b"), ("v1_docker_compose_ansi.log", "llama-3.1-8b")):
        result = explain_vllm_log(parse(name))
        assert result["kvlab"]["model"] == model
        assert {row["figure"]: row["status"] for row in result["comparison"]} == \
            {"kv_cache_tokens": "equal", "max_concurrency": "equal"}
        assert result["differences"] == []
    issue = explain_vllm_log(parse("v1_github_issue_paste.md"), "qwen3-14b")
    assert issue["kvlab"]["kv_cache_tokens"] == 42_656 and issue["differences"] == []
    assert "kvlab" not in explain_vllm_log(parse("v1_github_issue_paste.md"))


def test_printed_gib_rounding_is_allowed_for_and_said():
    result = explain_vllm_log(parse("v0_0.7.2_qwen2.5_1.5b_colab.log"))
    side = result["kvlab"]
    assert side["num_gpu_blocks"] == 5523 and side["range"]["num_gpu_blocks"] == [5512, 5535]
    assert {row["figure"]: row["status"] for row in result["comparison"]} == \
        {"num_gpu_blocks": "within rounding", "max_concurrency": "within rounding"}
    assert result["differences"] == []


def test_a_difference_is_flagged_with_where_it_comes_from():
    # The log's /models/mistral-7b is the catalogue's Mistral-7B-v0.1 (4,096-token sliding window); vLLM's
    # 25.64x = 52,510 / 2,048 says the served checkpoint has full attention: the blocks agree, concurrency not.
    # (0.11.0 prints the tokens as blocks x 16 (the log's release's rules, trial 53), so they agree too.)
    result = explain_vllm_log(parse("v1_0.11_mistral_dgx_spark.log"))
    status = {row["figure"]: row["status"] for row in result["comparison"]}
    assert status == {"num_gpu_blocks": "equal", "kv_cache_tokens": "equal", "max_concurrency": "differs"}
    assert result["differences"][0].startswith("maximum concurrency: kvlab 136.39x, vLLM 25.64x")
    assert "4,096-token window" in result["kvlab"]["hint"] and "about 2,048" in result["kvlab"]["hint"]


def test_a_wrong_setting_is_a_difference():
    text = (FIXTURES / "v1_ray_llmrayactor.log").read_text()
    assert explain_vllm_log(parse_vllm_log(text))["differences"] == []
    # The same figures with an fp8 KV cache claimed: kvlab would fit twice the tokens.
    wrong = explain_vllm_log(parse_vllm_log("non-default args: {'kv_cache_dtype': 'fp8'}\n" + text))
    assert wrong["differences"][0].startswith("KV cache size (tokens): kvlab 85,312, vLLM 42,656 (the printed KV "
                                              "cache memory allows 85,248-85,392)")
    assert "KV cache dtype fp8" in wrong["kvlab"]["hint"]
    assert "differs from vLLM on the KV cache size (tokens), maximum concurrency" in wrong["lines"][-1]


def test_model_from_the_logs_own_config_json(tmp_path):
    model_dir = tmp_path / "tiny"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(TINY_LLAMA.read_text())
    text = (FIXTURES / "v1_0.32_cpu_api_server.log").read_text().replace("/tmp/vllm-log-try/model", str(model_dir))
    result = explain_vllm_log(parse_vllm_log(text))
    assert result["kvlab"]["kv_bytes_per_token_per_gpu"] == 1024  # 2 layers x K,V x 2 heads x 32 x float32
    assert result["kvlab"]["available_kv_source"].startswith("kv_cache_memory_bytes=268,435,456")
    assert [row["status"] for row in result["comparison"]] == ["equal", "equal"]


# --- the command ---

@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cli_explains_every_fixture(kvlab, name):
    result = kvlab("vllm", "log", FIXTURES / name)
    assert result.exit_code == 0, result.stderr
    assert "What it means" in result.stdout and "Traceback" not in result.stdout + result.stderr
    log = parse(name)
    if log.kv_cache_tokens:
        assert f"{log.kv_cache_tokens:,} tokens" in result.stdout
    if log.refused:
        assert "refused to start" in result.stdout


def test_cli_json_has_the_contract_keys(kvlab):
    result = kvlab("vllm", "log", FIXTURES / "v1_0.11_tp4_per_worker.log", "--json")
    assert result.exit_code == 0, result.stderr
    data = result.json()
    assert set(CONTRACT_KEYS) <= set(data)
    assert (data["kv_cache_tokens"], data["num_gpu_blocks"], data["block_size"]) == (100_752, 6297, 16)
    assert len(data["per_worker"]["available_kv_cache_gib"]) == 4
    assert data["explanation"]["lines"]


def test_cli_reads_stdin(kvlab, monkeypatch):
    data = (FIXTURES / "v1_ray_llmrayactor.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    result = kvlab("vllm", "log", "-")
    assert result.exit_code == 0, result.stderr
    assert "42,656 tokens" in result.stdout and "kvlab's calculation for qwen3-14b" in result.stdout
    assert "equal" in result.stdout


def test_cli_model_option(kvlab):
    result = kvlab("vllm", "log", FIXTURES / "v1_github_issue_paste.md", "--model", "qwen3-14b", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["explanation"]["kvlab"]["kv_cache_tokens"] == 42_656
    tiny = kvlab("vllm", "log", FIXTURES / "v1_0.32_cpu_api_server.log", "--model", TINY_LLAMA, "--json")
    assert [row["status"] for row in tiny.json()["explanation"]["comparison"]] == ["equal", "equal"]


def test_cli_model_option_that_contradicts_the_log_says_so(kvlab):
    """Trial 47 #9: --model llama-3.1-8b on a Qwen3-8B log compared without a word about the two models."""
    log = Path(__file__).parent / "data" / "startup_logs" / "qwen3-8b-a100-40gb-0.9.2.log"
    other = kvlab("vllm", "log", log, "--model", "llama-3.1-8b")
    assert other.exit_code == 0, other.stderr
    assert ("The log names Qwen/Qwen3-8B (qwen3-8b); kvlab's calculation uses llama-3.1-8b, as asked."
            in " ".join(other.stdout.split()))
    same = kvlab("vllm", "log", log, "--model", "qwen3-8b")
    assert same.exit_code == 0 and "as asked" not in same.stdout


def bad(kvlab, *args) -> str:
    result = kvlab("vllm", "log", *args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    return result.stderr


def test_bad_input(kvlab, tmp_path, monkeypatch):
    assert "no such file 'nope.log'" in bad(kvlab, "nope.log")
    assert "is a folder" in bad(kvlab, tmp_path)
    (tmp_path / "empty.log").write_text("\n  \n")
    assert "is empty" in bad(kvlab, tmp_path / "empty.log")
    (tmp_path / "model.bin").write_bytes(b"\x00\x01\x02" * 100)
    assert "not a text file" in bad(kvlab, tmp_path / "model.bin")
    (tmp_path / "other.log").write_text("INFO:     Started server process [1]\nINFO:     Application startup complete.\n")
    message = bad(kvlab, tmp_path / "other.log")
    # The lines to paste, briefly (one line of a terminal or two), and where the whole list is.
    for looked_for in ("GPU KV cache size: N tokens", "Maximum concurrency for N tokens per request: X.XXx",
                       "# GPU blocks: N", "refusals", "docs/vllm.md"):
        assert looked_for in message
    assert len(message) < 400
    only_args = tmp_path / "args.log"
    only_args.write_text("(APIServer pid=1) INFO 10-06 15:56:26 [utils.py:233] non-default args: {'model': 'x'}\n")
    assert "args.log': no vLLM KV cache line found (only the non-default args line)" in bad(kvlab, only_args)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8"))
    assert "stdin is empty" in bad(kvlab, "-")
    assert "unknown model 'no-such-model'" in bad(kvlab, FIXTURES / "v1_ray_llmrayactor.log", "--model",
                                                    "no-such-model")
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked.log"
        locked.write_text("GPU KV cache size: 1 tokens")
        locked.chmod(0)
        assert "cannot read" in bad(kvlab, locked)


def test_parse_errors_are_kvlab_errors():
    with pytest.raises(KvlabError, match="looked for"):
        parse_vllm_log("hello\nworld\n")
    with pytest.raises(KvlabError, match="empty"):
        parse_vllm_log("")


# --- the real CPU engine's own startup log ---

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_and_capture(env, model_dir: Path, log_path: Path, args: list[str], timeout: float = 300) -> str:
    """Start vLLM's OpenAI server (CPU build) on loopback, wait until it serves, read /metrics, stop it."""
    port = _free_port()
    child_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    child_env.update(VLLM_HOST_IP="127.0.0.1", VLLM_NO_USAGE_STATS="1", VLLM_DO_NOT_TRACK="1")
    command = [str(env.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--skip-tokenizer-init", "--load-format", "dummy", "--dtype", "float32", "--enforce-eager",
               "--host", "127.0.0.1", "--port", str(port), *args]
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=child_env, cwd=model_dir)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    pytest.fail(f"vLLM's server exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                        return response.read().decode()
                except OSError:
                    time.sleep(1)
            pytest.fail(f"vLLM's server did not start within {timeout:.0f} s:\n{log_path.read_text()[-3000:]}")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.vllm
def test_the_cpu_engines_own_log_equals_kvlabs_calculation_to_the_token(tmp_path):
    from kvlab.vllm.install import install

    env = install()
    model_dir = tmp_path / "tiny-llama"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(TINY_LLAMA.read_text())
    # A budget that is no round number of GiB and a max_model_len that is no multiple of the block size: vLLM
    # counts 3,051 blocks of 32 and int(3,051 / 32 x 1,000) = 95,343 tokens, not 3,051 x 32.
    log_path = tmp_path / "vllm.log"
    metrics = _serve_and_capture(env, model_dir, log_path, [
        "--block-size", "32", "--max-model-len", "1000", "--kv-cache-memory-bytes", "100000000",
        "--max-num-seqs", "8", "--max-num-batched-tokens", "1024"])
    log = parse_vllm_log(log_path.read_text(errors="replace"))
    num_blocks = int(re.search(r'vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', metrics)[1])

    result = explain_vllm_log(log)
    side = result["kvlab"]
    assert log.format == "v1" and log.device == "CPU" and log.block_size == 32 and log.max_model_len == 1000
    assert (num_blocks, log.kv_cache_tokens, log.max_concurrency) == (3051, 95_343, 95.34)
    assert (side["num_gpu_blocks"], side["kv_cache_tokens"]) == (num_blocks, log.kv_cache_tokens)
    assert f"{side['max_concurrency']:.2f}" == f"{log.max_concurrency:.2f}"
    assert log.num_gpu_blocks == num_blocks  # worked out from the token count, as the explanation does
    assert {row["figure"]: row["status"] for row in result["comparison"]} == \
        {"kv_cache_tokens": "equal", "max_concurrency": "equal"}
    assert result["differences"] == []
    assert f"{num_blocks:,} blocks of 32 tokens" in " ".join(result["lines"])


# --- on any input ---

FRAGMENTS = st.sampled_from([
    "GPU KV cache size: ", "Maximum concurrency for ", " tokens per request: ", "Available KV cache memory: ",
    "# GPU blocks: ", ", # CPU blocks: ", "non-default args: {", "'model': ", "'block_size': ", "}", "(", ")",
    "(EngineCore_DP0 pid=1) ", "INFO 10-06 15:57:53 [x.py:1] ", "The model's max seq len (",
    "To serve at least one request with the model's max seq len (", "GiB", "x", ",", "\n", "`", "```", "\x1b[32m", "1", "2,048", "-3",
    "0.5", "Initializing a V1 LLM engine (v0.1) with config: model='", "estimated maximum model length is ",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(FRAGMENTS, st.text(max_size=8)), max_size=40))
@example(["Initializing a V1 LLM engine (v0.1) with config: model='", "²"])  # a digit str.isdigit knows and int() does not
def test_any_text_gives_a_log_or_a_kvlab_error(parts):
    try:
        log = parse_vllm_log("".join(parts))
    except KvlabError:
        return
    log.to_json()
    explain_vllm_log(log)


@settings(max_examples=200, deadline=None)
@given(num_blocks=st.integers(1, 3_000_000), block_size=st.sampled_from([16, 32, 64, 128]),
       max_model_len=st.integers(1, 262_144), gib=st.floats(0.01, 500), wrapper=st.sampled_from(sorted(WRAPPERS)),
       two_lines=st.booleans())
def test_v1_lines_as_vllm_formats_them_read_back(num_blocks, block_size, max_model_len, gib, wrapper, two_lines):
    from kvlab.vllm.log.startup import v1_num_tokens

    tokens = v1_num_tokens(num_blocks, block_size, max_model_len)
    concurrency = num_blocks / -(-max_model_len // block_size)
    size = f"GPU KV cache size: {tokens:,} tokens"
    conc = f"Maximum concurrency for {max_model_len:,} tokens per request: {concurrency:.2f}x"
    lines = [f"Available KV cache memory: {round(gib, 2)} GiB"] + ([size, conc] if two_lines else [f"{size}, {conc}"])
    prefix = "(EngineCore_DP0 pid=7) INFO 12-01 08:35:31 [kv_cache_utils.py:2327] "
    log = parse_vllm_log("\n".join(WRAPPERS[wrapper](prefix + line) for line in lines))
    assert (log.format, log.kv_cache_tokens, log.max_model_len) == ("v1", tokens, max_model_len)
    assert log.max_concurrency == float(f"{concurrency:.2f}")
    assert log.available_kv_cache_gib == round(gib, 2)


@settings(max_examples=200, deadline=None)
@given(num_blocks=st.integers(1, 3_000_000), num_cpu_blocks=st.integers(0, 100_000),
       block_size=st.sampled_from([8, 16, 32]), max_model_len=st.integers(1, 131_072))
def test_v0_lines_as_vllm_formatted_them_read_back(num_blocks, num_cpu_blocks, block_size, max_model_len):
    concurrency = num_blocks * block_size / max_model_len
    log = parse_vllm_log(f"INFO 12-06 11:39:36 gpu_executor.py:113] # GPU blocks: {num_blocks}, # CPU blocks: "
                         f"{num_cpu_blocks}\nINFO 12-06 11:39:36 gpu_executor.py:117] Maximum concurrency for "
                         f"{max_model_len} tokens per request: {concurrency:.2f}x")
    assert (log.num_gpu_blocks, log.num_cpu_blocks, log.max_model_len) == (num_blocks, num_cpu_blocks, max_model_len)
    assert log.max_concurrency == float(f"{concurrency:.2f}")
    if log.block_size is not None:  # worked out only where exactly one block size gives the printed figure
        assert log.block_size == block_size
        assert log.kv_cache_tokens == num_blocks * block_size


def test_a_refusal_beside_kvlabs_arithmetic(kvlab, monkeypatch):
    # Qwen3-14B at max_model_len 40,960 with 5.98 GiB: one conversation needs 2,560 blocks of 2.5 MiB = 6.25 GiB;
    # 5.98 GiB holds 2,449 blocks, so about 39,184 tokens (vLLM 0.32 keeps one back for the null block: 39,168).
    text = ("(APIServer pid=1) INFO 10-06 15:56:26 [utils.py:233] non-default args: {'model': 'Qwen/Qwen3-14B', "
            "'max_model_len': 40960}\n(EngineCore_DP0 pid=2) ERROR 10-06 15:57:53 [core.py:708] ValueError: To serve "
            "at least one request with the model's max seq len (40960), (6.25 GiB KV cache is needed, which is larger "
            "than the available KV cache memory (5.98 GiB). Based on the available memory, the estimated maximum "
            "model length is 39184. Try increasing `gpu_memory_utilization` or decreasing `max_model_len`")
    result = explain_vllm_log(parse_vllm_log(text))
    assert result["kvlab"]["refused"] is True
    assert {row["figure"]: (row["kvlab"], row["status"]) for row in result["comparison"]} == {
        "estimated_max_model_len": (39_168, "within rounding"), "needed_kv_cache_gib": (6.25, "equal")}
    assert result["differences"] == []
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8"))
    shown = kvlab("vllm", "log", "-")
    assert shown.exit_code == 0, shown.stderr
    assert "longest max_model_len that fits" in shown.stdout and "6.25 GiB" in shown.stdout


def test_a_budget_below_zero_is_a_refusal_though_the_excerpt_ends_before_the_error():
    """gpt-oss-120b on one H100 under 0.10.1: 'Available KV cache memory: -2.14 GiB', then 'EngineCore failed to
    start.' without the ValueError's text; V1 refuses any budget that is not positive."""
    log = parse_vllm_log((CORPUS / "gpt-oss-120b-h100-0.10.1-negative-kv.log").read_text())
    assert log.refused and log.no_kv_memory and log.available_kv_cache_gib == -2.14
    one = parse_vllm_log("INFO 08-20 18:04:22 [gpu_worker.py:276] Available KV cache memory: 1.50 GiB")
    assert not one.refused and one.available_kv_cache_gib == 1.5


def test_a_log_copied_with_no_break_or_zero_width_spaces_reads_as_vllm_wrote_it():
    """A browser's copy can turn every space into U+00A0; a chat window can slip in U+200B: each line still reads."""
    text = (CORPUS / "qwen3-8b-a100-40gb-0.9.2.log").read_text()
    plain = parse_vllm_log(text)
    for odd in (text.replace(" ", "\u00a0"), text.replace("GPU KV", "GPU\u200b KV").replace("Available", "Avail\u200bable")):
        log = parse_vllm_log(odd)
        assert (log.kv_cache_tokens, log.available_kv_cache_gib, log.model_weights_gib, log.max_concurrency) == (
            plain.kv_cache_tokens, plain.available_kv_cache_gib, plain.model_weights_gib, plain.max_concurrency)
    assert plain.kv_cache_tokens and plain.available_kv_cache_gib


def test_a_utf16_log_as_powershell_writes_it_reads_as_text(kvlab, tmp_path):
    text = (CORPUS / "qwen3-8b-a100-40gb-0.9.2.log").read_text()
    (tmp_path / "ps.log").write_bytes(text.encode("utf-16"))
    r = kvlab("vllm", "log", tmp_path / "ps.log", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["kv_cache_tokens"] == 136080


def test_a_token_count_not_a_whole_number_of_blocks_is_said_in_integers():
    text = " ".join(explain_vllm_log(parse_vllm_log("GPU KV cache size: 1,000 tokens"))["lines"])
    assert "1,000 does not divide by 16: 62 whole blocks and 8 tokens over" in text
    assert "block size 8 would divide it" in text and "62.5" not in text
    huge = " ".join(explain_vllm_log(parse_vllm_log("GPU KV cache size: 8999999999999999 tokens"))["lines"])
    assert "562,499,999,999,999 whole blocks and 15 tokens over" in huge and ".0 blocks" not in huge
    from_0_21 = parse_vllm_log("Initializing a V1 LLM engine (v0.21.0) with config: model='x'\n"
                               "GPU KV cache size: 1,000 tokens")
    assert "from 0.21 prints int(maximum concurrency x max_model_len)" in " ".join(
        explain_vllm_log(from_0_21)["lines"])


def test_a_zero_token_concurrency_line_is_refused(kvlab, tmp_path):
    log = tmp_path / "zero.log"
    log.write_text("GPU KV cache size: 1,000 tokens\nMaximum concurrency for 0 tokens per request: 1.00x\n")
    message = bad(kvlab, log)
    assert "gives a length of 0 tokens per request, which vLLM never prints" in message
    with pytest.raises(KvlabError, match="never prints"):
        parse_vllm_log(log.read_text())


def test_a_model_the_logs_settings_do_not_fit_names_the_log_not_a_flag(kvlab):
    """Trial 50: `vllm log <a Llama-3.1-8B log> --model opt-13b` said "--max-model-len 131,072 is greater than
    opt-13b's ...", a flag the user never gave: the settings are the log's, and the message says so."""
    r = kvlab("vllm", "log", Path("tests/data/startup_logs/llama-3.1-8b-a100-40gb-eager-0.15.1.log"), "--model", "opt-13b")
    assert r.exit_code == 2
    assert ("error: opt-13b (as asked) cannot run with the settings of this log, which names "
            "/home/admin_iloh_altostrat_com/models/Meta-Llama-3.1-8B-Instruct, as vLLM would refuse it: "
            "--max-model-len 131,072 is greater than opt-13b's max_position_embeddings") in " ".join(r.stderr.split())

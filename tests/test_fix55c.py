"""Trial 55's findings on the log, run and workload faces (fix55c), each through the CLI.

3: `vllm log` says a failed start at the top; 7: a file with no vLLM log line is refused, every stored log still
read; 10: a race of one strategy; 13: 'did you mean' for a workload name; 14: the missing-trace message names the
folder searched; 15: capacity's help keeps a paragraph whole; 17: one request has no rate; 16: vllm log's bullets
indent their continuation lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "tests" / "data" / "startup_logs"
FAILED = LOGS / "gpt-oss-120b-h100-0.11.0-util0.95.log"
# The one stored log with no KV cache line: a truncated excerpt that stops before vLLM sized its cache.
NO_KV_LINE = {"gpt-oss-120b-h100-0.14.1-oom.log"}


# --- finding 3: a failed start -------------------------------------------------------------------------------

def test_a_log_whose_engine_failed_to_start_says_so_at_the_top(kvlab):
    result = kvlab("vllm", "log", FAILED)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["figure"])  # (the table's header row)
    title = " ".join(" ".join(lines[:head]).split())  # (the table's title, above it)
    assert title.endswith("V1 engine did not start")
    means = result.stdout.split("What it means", 1)[1]
    first = " ".join(means.split("•")[1].split())
    assert first.startswith("vLLM did not start: the log says")
    assert "EngineCore failed to start." in first and "[core.py:708]" in first  # the log's own error line
    data = json.loads(kvlab("vllm", "log", FAILED, "--json").stdout)
    assert data["failed_start"] is True and "EngineCore failed to start" in data["lines"]["failed_start"]
    assert data["explanation"]["lines"][0].startswith("vLLM did not start")


def test_a_refusal_is_said_as_a_refusal_and_a_served_log_has_no_failure(kvlab):
    refused = kvlab("vllm", "log", LOGS / "gpt-oss-120b-h100-0.10.1-negative-kv.log")
    assert refused.exit_code == 0 and "refused to start" in refused.stdout
    assert "did not start" not in refused.stdout  # (the refusal says why; no second word on it)
    served = kvlab("vllm", "log", LOGS / "qwen3-14b-l40s-0.28.0.log", "--json")
    assert json.loads(served.stdout)["failed_start"] is False


# --- finding 7: what makes a log ------------------------------------------------------------------------------

def test_the_readme_is_not_read_as_a_log(kvlab):
    result = kvlab("vllm", "log", ROOT / "README.md")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: 'README.md'") or "README.md" in result.stderr
    assert "no vLLM log line found" in result.stderr and "42,656" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_quoted_figure_is_refused_and_a_bare_line_is_read(kvlab, tmp_path):
    quoted = tmp_path / "notes.txt"
    quoted.write_text('Our server printed "GPU KV cache size: 42,656 tokens" yesterday.\n')
    refused = kvlab("vllm", "log", quoted)
    assert refused.exit_code == 2 and "no vLLM log line found" in refused.stderr
    bare = tmp_path / "bare.log"
    bare.write_text("- `GPU KV cache size: 42,656 tokens`\n")  # a bulleted paste of vLLM's own line
    assert kvlab("vllm", "log", bare).exit_code == 0


@pytest.mark.parametrize("path", sorted(LOGS.glob("*.log")), ids=lambda p: p.name)
def test_every_stored_log_is_read_as_a_log(kvlab, path):
    result = kvlab("vllm", "log", path, "--json")
    if path.name in NO_KV_LINE:
        assert result.exit_code == 2 and "no vLLM KV cache line found" in result.stderr
        return
    assert result.exit_code == 0, result.stderr
    assert "no vLLM log line" not in result.stderr


# --- finding 10: a race of one ---------------------------------------------------------------------------------

def test_a_race_of_one_strategy_says_strategy_and_gives_no_star(kvlab):
    result = kvlab("race", "vllm", "-n", "40")
    assert result.exit_code == 0, result.stderr
    assert "Race: 1 strategy, same workload" in result.stdout
    assert "1 strategies" not in result.stdout and "★" not in result.stdout
    two = kvlab("race", "vllm", "orca-max", "-n", "40")
    assert "Race: 2 strategies, same workload" in two.stdout


# --- finding 13: did you mean, for workloads -------------------------------------------------------------------

@pytest.mark.parametrize("spelling, meant", [("azure-conversation", "azure-conv"), ("paper-sharegtp", "paper-sharegpt"),
                                             ("Paper-Alpaca", "paper-alpaca")])
def test_a_mistyped_workload_name_gets_did_you_mean(kvlab, spelling, meant):
    result = kvlab("run", "vllm", "--workload", spelling, "-n", "10")
    assert result.exit_code == 2
    assert f"unknown workload {spelling!r} (did you mean {meant!r}" in result.stderr


def test_a_name_close_to_none_gets_no_suggestion(kvlab):
    result = kvlab("run", "vllm", "--workload", "zzzzzz", "-n", "10")
    assert result.exit_code == 2 and "did you mean" not in result.stderr and "named: azure-conv" in result.stderr


# --- finding 14: the missing-trace message ---------------------------------------------------------------------

def test_the_missing_trace_message_names_the_folder_and_advises_the_variable_only_when_unset(kvlab, monkeypatch,
                                                                                               tmp_path):
    empty = tmp_path / "traces"
    empty.mkdir()
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KVLAB_TRACES_DIR", str(empty))
    result = kvlab("run", "vllm", "--workload", "azure-conv", "-n", "10")
    assert result.exit_code == 2
    message = " ".join(result.stderr.split())
    assert f"KVLAB_TRACES_DIR='{empty}'" in message and str(tmp_path / "cache" / "traces") in message
    assert "AzureLLMInferenceTrace_conv.csv or azure2023_conv.csv" in message  # every file name accepted
    assert "set KVLAB_TRACES_DIR" not in message and f"put the file in {empty}" in message
    monkeypatch.delenv("KVLAB_TRACES_DIR")
    unset = " ".join(kvlab("run", "vllm", "--workload", "azure-conv", "-n", "10").stderr.split())
    assert "set KVLAB_TRACES_DIR to a folder holding it" in unset and "KVLAB_TRACES_DIR=" not in unset


# --- finding 15: capacity's help -------------------------------------------------------------------------------

def test_capacity_help_breaks_no_sentence_mid_paragraph(kvlab, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # wide: every paragraph on one line, unless the text breaks it
    result = kvlab("capacity", "--help")
    description = result.stdout.split("Usage:", 1)[1].split("╭", 1)[0]
    paragraphs = [line.strip() for line in description.splitlines()[1:] if line.strip()]
    assert paragraphs and all(p.endswith((".", ")")) for p in paragraphs), paragraphs
    assert any("oldest wait" in p for p in paragraphs)


# --- finding 17: one request ----------------------------------------------------------------------------------

def test_one_request_has_no_rate(kvlab, tmp_path):
    one = tmp_path / "one.csv"
    one.write_text("prompt_len,output_len\n100,50\n")
    result = kvlab("run", "vllm", "--workload", one)
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "1 request, arriving at" in text and "(one arrival, no rate)" in text and "req/s on average" not in text
    data = json.loads(kvlab("run", "vllm", "--workload", one, "--json").stdout)
    assert data["workload"]["rate"] is None
    two = tmp_path / "two.csv"
    two.write_text("prompt_len,output_len,arrival_time\n100,50,0\n100,50,0.5\n")
    assert "2 requests, arriving at 4 req/s on average" in " ".join(kvlab("run", "vllm", "--workload", two).stdout.split())


# --- finding 16: vllm log's bullets ----------------------------------------------------------------------------

def test_vllm_log_bullets_indent_their_continuation_lines(kvlab, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    result = kvlab("vllm", "log", FAILED)
    means = result.stdout.split("What it means", 1)[1].splitlines()[1:]
    body = [line for line in means if line.strip()]
    assert len(body) > 3 and body[0].startswith("  • ")
    assert any(line.startswith("    ") and line.strip() for line in body)  # a bullet wraps here
    assert all(line.startswith(("  • ", "    ")) for line in body), body


def test_a_failed_start_with_the_model_gets_kvlabs_arithmetic_not_a_false_difference(kvlab):
    data = json.loads(kvlab("vllm", "log", FAILED, "--model", "gpt-oss-120b", "--json").stdout)
    explanation = data["explanation"]
    assert explanation["kvlab"]["refused"] is True and explanation["differences"] == []  # (not "vLLM started")
    verdict = explanation["lines"][-1]
    assert verdict.startswith("kvlab's own arithmetic for gpt-oss-120b: one request at max_model_len 131,072")
    assert "more than the 1.71 GiB available, so vLLM would refuse this start" in verdict
    assert f"--max-model-len {explanation['kvlab']['estimated_max_model_len']} or less" in verdict


def test_what_may_stand_before_a_log_line_is_read_without_backtracking():
    import time

    from kvlab.vllm.log.lines import log_line_start

    assert log_line_start("INFO 05-01 12:00:00 gpu_worker.py:1 ") and log_line_start("# (EngineCore) ")
    assert not log_line_start('# → "') and not log_line_start('Our server printed "')
    start = time.perf_counter()
    assert not log_line_start("-" * 5000 + "x") and not log_line_start("# " * 3000 + "x")
    assert time.perf_counter() - start < 1.0  # (nested repetition over the marks would take exponential time)

"""Findings of user trial 52 (fix52): each test failed before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

QWEN_LOG = Path("tests/data/startup_logs/qwen3-8b-a100-40gb-0.9.2.log")  # non-default args without max_model_len


def one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("text, number", [("32k", 32_000), ("32K", 32_768), ("25.6k", 25_600), ("1m", 1_000_000),
                                          ("2G", 2 * 2**30), ("1t", 10**12), ("32000", None)])
def test_vllms_human_readable_integers_read_as_vllm_reads_them(text, number):
    from kvlab.validate import vllm_human_readable_int

    assert vllm_human_readable_int(text) == number


@pytest.mark.parametrize("given, length", [("32k", 32_000), ("32K", 32_768), ("--max-model-len=8k", 8_000)])
def test_size_takes_max_model_len_as_vllm_serve_does(kvlab, given, length):
    """`kvlab size --max-model-len 32k`: 'not a whole number', where `vllm serve` takes 32k as 32,000."""
    args = [given] if given.startswith("--") else ["--max-model-len", given]
    r = kvlab("size", "llama-3.1-8b", "--gpu", "h100-sxm", *args, "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["max_model_len"] == length


@pytest.mark.parametrize("given, message", [
    ("1.5K", "--max-model-len '1.5K': vLLM takes a fraction with a decimal suffix only (k, m, g, t: powers of 1000), "
             "not with K (a power of 1024); valid: 1.5k (1,500) or a whole number of K"),
    ("auto", "--max-model-len 'auto': vLLM's auto (the longest length the KV cache holds) is not taken here: `kvlab "
             "fit` answers it"),
])
def test_a_max_model_len_vllm_means_otherwise_is_refused_saying_vllms_meaning(kvlab, given, message):
    r = kvlab("fit", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len", given)
    assert r.exit_code == 2 and message in one_line(r.stderr) and "Traceback" not in r.stderr


def _log_with_args(tmp_path, item: str) -> Path:
    text = QWEN_LOG.read_text().replace("'model': 'Qwen/Qwen3-8B',", f"'model': 'Qwen/Qwen3-8B', {item},", 1)
    path = tmp_path / "vllm.log"
    path.write_text("".join(line for line in text.splitlines(keepends=True) if "Maximum concurrency" not in line))
    return path


def test_a_logs_max_model_len_written_32k_is_read_as_vllm_reads_it(kvlab, tmp_path):
    """A log whose non-default args hold max_model_len='32k' ended in a TypeError traceback."""
    r = kvlab("vllm", "log", _log_with_args(tmp_path, "'max_model_len': '32k'"), "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["max_model_len"] == 32_000


@pytest.mark.parametrize("item, message", [
    ("'max_model_len': 'abc'", "the log's non-default args: max_model_len='abc' is not a whole number; valid: digits "
                               "(or vLLM's 32k: 32,000, 32K: 32,768), as vLLM reads --max-model-len"),
    ("'block_size': '3_2'", "the log's non-default args: block_size='3_2' is not a whole number"),
])
def test_a_logs_setting_that_is_no_whole_number_is_one_line(kvlab, tmp_path, item, message):
    r = kvlab("vllm", "log", _log_with_args(tmp_path, item))
    assert r.exit_code == 2 and message in one_line(r.stderr) and "Traceback" not in r.stderr


@pytest.mark.parametrize("args", [("run", "vllm", "--replicas", "AUTO"), ("run", "vllm", "--replicas", "auto"),
                                  ("sweep", "--replicas", "AUTO"), ("sweep", "--replicas", "auto"),
                                  ("race", "vllm", "orca-max", "--prefill-replicas", "Auto"),
                                  ("run", "vllm", "--decode-replicas", "auto", "--prefill-replicas", "1")])
def test_auto_is_not_offered_where_it_is_not_taken_and_says_where_it_lives(kvlab, args):
    """`run --replicas AUTO` said 'did you mean auto? it is lower case', where run takes no auto."""
    message = one_line(kvlab(*args).stderr)
    side = next((f"{a} auto " for a in args if a.endswith("-replicas") and a != "--replicas"  # trial 59, finding 6
                 and args[args.index(a) + 1].lower() == "auto"), "")
    assert f"is kvlab capacity's alone, as the whole value: kvlab capacity --replicas auto {side}--rate R" in message
    assert "did you mean auto" not in message and "; or auto" not in message


@pytest.mark.parametrize("value, says", [
    ("AUTO", "--replicas 'AUTO': auto is written in lower case; valid: --replicas auto (the fewest that sustain "
             "--rate R), or a comma list of whole numbers, e.g. 16,32"),
    ("2,auto", "--replicas 2,auto: auto stands alone (it finds the count); valid: --replicas auto"),
])
def test_capacity_says_its_own_auto(kvlab, value, says):
    r = kvlab("capacity", "--replicas", value, "--rate", "1")
    assert r.exit_code == 2 and says in one_line(r.stderr), r.stderr


def test_a_log_without_the_kv_cache_memory_line_says_what_it_could_not_compare(kvlab, tmp_path):
    """`vllm log --model M` on a log without 'Available KV cache memory' compared blocks with the log's own blocks
    ('equal', by construction) and said nothing of the check it could not make."""
    path = tmp_path / "vllm.log"
    path.write_text("".join(line for line in QWEN_LOG.read_text().splitlines(keepends=True)
                            if "Available KV cache memory" not in line))
    r = kvlab("vllm", "log", "--model", "Qwen/Qwen3-8B", path)
    assert r.exit_code == 0, r.stderr
    said = one_line(r.stdout)
    assert ("Not checked: the log has no 'Available KV cache memory' line, so kvlab sized from the log's own 8,505 "
            "blocks, and blocks and KV cache size agree by construction; whether kvlab's 147,456 bytes per token per "
            "GPU turn vLLM's memory into those blocks needs that line") in said
    assert "Not checked" not in one_line(kvlab("vllm", "log", "--model", "Qwen/Qwen3-8B", QWEN_LOG).stdout)


def test_a_sweeps_max_model_len_list_takes_vllms_lengths_too(kvlab, tmp_path):
    r = kvlab("sweep", "--max-model-len", "1k,2K", "-n", "5", "--out", tmp_path / "sw", "--json")
    assert r.exit_code == 0, r.stderr
    assert sorted(p["max_model_len"] for p in json.loads(r.stdout)["points"]) == [1000, 2048]


def test_a_config_files_numbers_are_decimal_and_its_lengths_read_as_vllm_reads_them(kvlab, tmp_path):
    """A `--config` YAML read 5__0 as 50 and 010 as 8 (YAML 1.1), and refused vLLM's max-model-len: 1k, which
    `vllm serve --config` reads as 1,000. (5_0, TOML's digit groups, is 50 in both: tests/test_fix55.py.)"""
    config = tmp_path / "c.yaml"
    config.write_text("max-model-len: 1k\nmax-num-seqs: 5__0\n")
    r = kvlab("run", "vllm", "-n", "5", "--config", config)
    assert r.exit_code == 2 and "max_num_seqs '5__0' is not a whole number written in digits" in r.stderr
    config.write_text("max-model-len: 1k\nmax-num-seqs: 010\n")
    r = kvlab("run", "vllm", "-n", "5", "--config", config, "--json")
    assert r.exit_code == 0, r.stderr
    setup = json.loads(r.stdout)["setup"]
    assert (setup["max_model_len"], setup["max_num_seqs"]) == (1000, 10)


@pytest.mark.parametrize("command, option", [("capacity", "--slo-classes"), ("capacity", "--wide"),
                                             ("sweep", "--plots")])
def test_a_run_option_no_sweep_point_takes_says_which_commands_take_it(kvlab, command, option):
    """Trial 51b: `kvlab capacity --slo-classes ...` said "did you mean --priority-classes?" (and --wide "did you mean
    --model?"), where `kvlab run` takes the option: the line other misplaced options get."""
    r = kvlab(command, "-n", "4", option, "x")
    assert r.exit_code == 2
    assert f"no such option: {option}: it is an option of " in r.stderr and "kvlab run" in r.stderr
    assert f"not of kvlab {command}" in r.stderr and "did you mean" not in r.stderr


def test_an_option_whose_value_is_forgotten_is_named(kvlab):
    """Trial 51b: `kvlab run --model -n 5` said "unknown model '-n'" (Click takes the next word as the value)."""
    r = kvlab("run", "--model", "-n", "5")
    assert r.exit_code == 2 and r.stdout == ""
    assert "--model needs a value: the word after it, -n, is an option of kvlab run" in r.stderr
    assert kvlab("run", "vllm", "-n", "3", "--model", "llama-3.2-1b").exit_code == 0


@pytest.mark.parametrize("args", [("sweep", "--model", "-n", "5"), ("capacity", "--model", "-n", "20"),
                                  ("sweep", "--max-num-seqs", "--model", "llama-3.1-8b", "-n", "5")])
def test_a_sweeps_option_whose_value_is_forgotten_is_named(kvlab, args):
    """Trial 52: sweep and capacity said "unexpected argument '5'" where run says --model needs a value."""
    r = kvlab(*args)
    assert r.exit_code == 2 and f"{args[1]} needs a value: the word after it, {args[2]}, is an option" in r.stderr


def test_vllm_log_says_why_a_given_model_is_not_compared(kvlab):
    """Trial 52: a log with neither the KV cache memory nor a block count, with --model, said nothing of the model."""
    log = Path(__file__).parent / "data" / "startup_logs" / "gemma-3-1b-it-0.8.2.log"
    r = kvlab("vllm", "log", log, "--model", "gemma-3-1b-it")
    assert r.exit_code == 0, r.stderr
    assert ("kvlab's own arithmetic for gemma-3-1b-it (26,624 bytes per token per GPU) is not compared: the log gives "
            "no KV cache memory or block count to size from") in one_line(r.stdout)


def test_a_config_files_version_written_as_a_number_is_read_as_written(kvlab, tmp_path):
    """Trial 52: `vllm-version: 0.10` in a --config YAML was read as 0.1 ("vLLM version '0.1' is not one kvlab
    knows"); the text option takes the text written. TOML keeps no text for a number: it says to quote it."""
    config = tmp_path / "c.yaml"
    config.write_text("model: llama-3.2-1b\nvllm-version: 0.10\n")
    r = kvlab("run", "vllm", "-n", "5", "--config", config)
    assert r.exit_code == 0, r.stderr
    toml = tmp_path / "c.toml"
    toml.write_text('model = "llama-3.2-1b"\nvllm-version = 0.10\n')
    r = kvlab("run", "vllm", "-n", "5", "--config", toml)
    assert r.exit_code == 2 and 'vllm-version is a number (0.1) where a text is wanted: write it in quotes' in r.stderr

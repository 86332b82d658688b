"""Findings of user trial 52 left for fix53: each test failed before its fix."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("written", ["max-num-seqs: 1e3", "max-model-len: 1e3", "max-num-seqs: 2.56e2"])
def test_a_count_in_a_config_yaml_written_with_an_exponent_is_refused_as_on_the_command_line(kvlab, tmp_path, written):
    """Trial 52 #6: `max-num-seqs: 1e3` in --config ran with 1000, where `--max-num-seqs 1e3` is refused."""
    config = tmp_path / "c.yaml"
    config.write_text(f"model: llama-3.2-1b\n{written}\n")
    r = kvlab("run", "vllm", "-n", "5", "--config", config)
    key, value = written.replace("-", "_").split(": ")
    assert r.exit_code == 2 and f"{key} '{value}' is not a whole number written in digits (such as 512)" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_real_number_in_a_config_yaml_may_have_an_exponent(kvlab, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model: llama-3.2-1b\ngpu-memory-utilization: 8e-1\nrate: 1e1\n")
    r = kvlab("run", "vllm", "-n", "5", "--config", config, "--json")
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize("args, says", [
    (("run", "vllm", "-n", "5", "--max-model-len", "4096.0"),  # (Typer's float reading took it as 4096)
     "--max-model-len '4096.0': not a whole number; valid: a whole number in digits (4096), or 32k (32,000) / 32K "
     "(32,768) as vLLM reads them"),
    (("run", "vllm", "-n", "5", "--max-num-seqs", "256.0"), "--max-num-seqs '256.0': not a whole number; valid: a "
                                                            "whole number such as 16"),
    (("run", "vllm", "-n", "5", "--max-model-len", "20 48"), "--max-model-len '20 48': not a whole number; valid: "
                                                             "a whole number in digits"),
    (("run", "vllm", "-n", "5", "--max-model-len", "abc"), "--max-model-len 'abc': not a whole number; valid: a whole "
                                                           "number in digits (4096), or 32k (32,000)"),
])
def test_a_whole_number_option_says_why_and_what_is_valid(kvlab, args, says):
    """Trial 52 #13: --max-model-len 4096.0 ran as 4096 (vLLM's int() refuses it); the valid forms left out 32k / 32K.
    ('2_048', which vLLM's int() reads, is taken since fix54a: tests/test_fix54a.py.)"""
    r = kvlab(*args)
    assert r.exit_code == 2 and says in " ".join(r.stderr.split()), r.stderr


def test_max_model_len_minus_one_in_a_config_or_a_sweep_list_says_what_auto_is(kvlab, tmp_path):
    """Trial 52 #13: -1 on the command line got "vLLM's auto ... `kvlab fit` answers it"; in --config or a sweep
    list only "-1 is out of range"."""
    config = tmp_path / "c.yaml"
    config.write_text("model: llama-3.2-1b\nmax-model-len: -1\n")
    r = kvlab("run", "vllm", "-n", "5", "--config", config)
    assert r.exit_code == 2 and "max_model_len -1: vLLM's auto (the longest length the KV cache holds) is not " \
        "taken here: `kvlab fit` answers it" in " ".join(r.stderr.split()), r.stderr
    r = kvlab("sweep", "--max-model-len", "-1,2k", "-n", "5", "--out", tmp_path / "s")
    assert r.exit_code == 2 and "--max-model-len -1: vLLM's auto" in " ".join(r.stderr.split()), r.stderr


@pytest.mark.parametrize("value", [" auto,2", "auto ,2"])
def test_capacity_takes_auto_with_spaces_around_it_as_auto(kvlab, value):
    """Trial 52 #8: `kvlab capacity --replicas ' auto'` said auto 'is kvlab capacity's alone' while running kvlab
    capacity; the spaces are dropped, as around a number, so its own rules answer (here: auto stands alone)."""
    r = kvlab("capacity", "--replicas", value, "--rate", "1")
    said = " ".join(r.stderr.split())
    assert r.exit_code == 2 and "--replicas auto,2: auto stands alone (it finds the count)" in said, r.stderr
    assert "is kvlab capacity's alone" not in said


@pytest.mark.parametrize("args, says", [
    (("run", "--model", "--help"), "--model needs a value: the word after it, --help, is an option of kvlab run"),
    (("size", "--gpu", "-n", "5"), "--gpu needs a value: the word after it, -n, is an option of kvlab race, kvlab run"),
])
def test_an_option_whose_value_is_forgotten_before_help_or_another_commands_option_is_named(kvlab, args, says):
    """Trial 52 #9: `run --model --help` said "unknown model '--help'"; `size --gpu -n 5` (-n is run's, not size's)
    said "unknown model '5'"."""
    r = kvlab(*args)
    said = " ".join(r.stderr.split())
    assert r.exit_code == 2 and says in said and "unknown model" not in said, r.stderr


def test_a_forgotten_value_that_is_also_a_file_says_how_to_give_the_file(kvlab, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-n").write_text("prompt_len,output_len\n5,5\n")
    r = kvlab("run", "--workload", "-n")
    assert r.exit_code == 2 and "or --workload=./-n for the file ./-n" in " ".join(r.stderr.split()), r.stderr


@pytest.mark.parametrize("command, flag, says", [
    ("capacity", "--no-plots", "kvlab capacity always writes its plots (capacity.png, capacity_latency.png, "
                               "capacity.html, replicas.png) into --out"),
    ("sweep", "--plots", "kvlab sweep always writes its plots (latency.png, sweep.html) into --out"),
    ("capacity", "--wide", "it sets how wide their tables are, and kvlab capacity has no such setting"),
    ("sweep", "--config=c.yaml", "kvlab sweep reads a file of options with --grid"),
])
def test_a_run_option_sweep_and_capacity_do_not_take_says_what_they_do_instead(kvlab, command, flag, says):
    """Trial 52 #10: capacity --wide / --plots / --no-plots ended 'kvlab capacity varies any `kvlab run` option that
    sets a point', which says nothing of tables or plots."""
    r = kvlab(command, flag)
    said = " ".join(r.stderr.split())
    assert r.exit_code == 2 and says in said and "sets a point" not in said, r.stderr

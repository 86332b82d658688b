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

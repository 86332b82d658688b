"""Trial 54 (fresh-clone user trial), finding 6: numbers in config files read as the flags and inference-perf read
them. A TOML --config's 1e3 for a whole-number option was taken as 1,000 where the flag and a YAML --config refuse it;
an inference-perf file's quoted '010' and unquoted 1.5e+3 were refused where inference-perf (PyYAML's safe_load, then
pydantic's lax int and float) reads them as 10 and 1,500."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("suffix, line", [(".toml", "max-num-seqs = 1e3"), (".yaml", "max-num-seqs: 1e3"),
                                          (".toml", "max-num-seqs = 1.5E+3")])
def test_a_config_files_exponent_for_a_whole_number_is_refused_as_the_flag_refuses_it(kvlab, tmp_path, suffix, line):
    path = tmp_path / f"serve{suffix}"
    path.write_text(line + "\n")
    r = kvlab("run", "vllm", "--config", path, "-n", "20")
    assert r.exit_code != 0 and "Traceback" not in r.stderr + r.stdout
    assert f"--config {path}: max_num_seqs " in r.stderr and "is not a whole number written in digits" in r.stderr
    assert kvlab("run", "vllm", "--max-num-seqs", "1e3", "-n", "20").exit_code != 0  # (the flag, refusing it too)


def test_a_toml_configs_exponent_for_a_real_number_and_a_plain_float_are_still_read(kvlab, tmp_path):
    path = tmp_path / "serve.toml"
    path.write_text("rate = 2e0\nmax-num-seqs = 64.0\nnum_requests = 20\n")
    data = kvlab("run", "vllm", "--config", path, "--json").json()
    assert data["setup"]["max_num_seqs"] == 64 and data["setup"]["workload"]["rate"] == 2.0

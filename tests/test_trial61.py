"""A user trial's findings (trial 61), each with the check that failed before its fix."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from kvlab.report.tables import verdict
from kvlab.service.replicas import _with_second

REPO = Path(__file__).parents[1]


def _summary(name: str, rps: float, preemptions: int) -> dict:
    return {"name": name, "throughput_rps": rps, "num_finished": 300, "num_rejected": 0, "preemptions": preemptions,
            "mean_batch_size": 4.0, "memory_shares": {"token": 80.8}}


def test_a_tie_under_preemptions_does_not_say_the_requests_do_not_compete_for_memory():
    # (finding 2: vllm and vllm+swap, 70 preemptions each, tied at 2.16 req/s)
    text = verdict([_summary("vllm", 2.16, 70), _summary("vllm+swap", 2.1601, 70)])
    assert text.startswith("A tie: all 2 strategies served 2.16 req/s.")
    assert "do not compete for memory" not in text
    assert "did compete for memory (70 and 70 preemptions)" in text


def test_a_tie_without_preemptions_still_says_memory_is_not_contended():
    text = verdict([_summary("static+paged", 1.0, 0), _summary("continuous+paged", 1.0, 0)])
    assert "the requests do not compete for memory" in text


def test_replicas_auto_prices_the_tokens_of_the_sample_that_answered():
    # (finding 1: 2 replicas answered on the whole trace, mean answer 211.1 tokens; the first 300 requests' 256.2
    # priced it at $0.351 per million output tokens where the answer's own tokens give $0.426)
    def entry(num_requests: int, replicas: int, mean_output: float) -> dict:
        return {"num_requests": num_requests, "replicas": replicas, "gpus": replicas, "gpus_each": 1, "gpu": "H100-SXM",
                "mean_output_tokens": mean_output, "runs": [], "no_second": None, "length_note": None}

    priced = _with_second(entry(300, 1, 256.2), entry(19_366, 2, 211.13), None, 20.0)
    assert priced["replicas"] == 2 and priced["samples"]["answered_by"] == 19_366
    cost = priced["serving_cost"]
    assert cost["usd_per_hour"] == 2 * cost["usd_per_gpu_hour"] == 6.48
    assert f"{cost['usd_per_million_output_tokens']:.3f}" == "0.426"  # 6.48 / (20 x 211.13 x 3,600) x 10^6


def test_the_real_runs_benchmark_without_scipy_is_one_line(monkeypatch, capsys):
    # (finding 5: the README's tour lists it; without the calibrate extra it ended in a traceback)
    spec = importlib.util.spec_from_file_location("real_vllm", REPO / "benchmarks/real_vllm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "scipy", None)  # (import scipy raises ImportError)
    with pytest.raises(SystemExit) as exit_:
        module.main([])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs SciPy" in err and "pip install '.[calibrate]'" in err


def test_the_docs_grid_file_runs_as_written(kvlab, tmp_path):
    # (finding 6: its second point named opt-66b, which the catalogue does not have, so the sweep was refused)
    text = (REPO / "docs/sweep.md").read_text()
    grid = tmp_path / "grid.yaml"
    grid.write_text(re.search(r"```yaml\n(# grid.yaml: .*?)```", text, re.S).group(1))
    result = kvlab("sweep", "--grid", grid, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert "Computed 32 points now" in " ".join(result.stdout.split())


def test_the_run_header_writes_max_num_seqs_with_its_thousands_separator(kvlab):
    # (finding 10a: "max_num_seqs 1024" beside "max_num_batched_tokens 8,192"; capacity wrote "1,024")
    result = kvlab("run", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "-n", "20")
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "max_num_seqs 1,024, max_num_batched_tokens 8,192" in text


def test_a_comma_list_given_to_one_run_says_what_varies_it(kvlab):
    # (trial 60, 9f: `run --router round-robin,least-kv` did not say comma lists are sweep's and capacity's)
    for args in (("--router", "round-robin,least-kv", "--replicas", "2"), ("--rate", "1,2")):
        result = kvlab("run", *args, "-n", "10")
        assert result.exit_code == 2
        assert result.stderr.count("\n") == 1
        assert "a comma list of values is varied by kvlab sweep and kvlab capacity" in result.stderr
    assert "comma list" not in kvlab("run", "--router", "nearest", "--replicas", "2", "-n", "10").stderr


def test_fit_offers_pipeline_stages_only_at_the_same_length(kvlab):
    # (finding 7: "with pipeline parallelism too: 1 x L4 (--tensor-parallel-size 1) ... one 31,328-token request"
    # under "tensor parallelism alone: 2 x L4 ... one 131,072-token request": no stages, and another length)
    result = kvlab("fit", "llama-3.1-8b", "--gpu", "l4", "--json")
    assert result.exit_code == 0, result.stderr
    answers = json.loads(result.stdout)
    assert answers["fewest_gpus"]["num_gpus"] == 2 and answers["fewest_gpus"]["max_model_len"] == 131_072
    assert answers["fewest_gpus_pipelined"] is None
    result = kvlab("fit", "llama-3.1-70b", "--gpu", "l4", "--json")
    piped = json.loads(result.stdout)["fewest_gpus_pipelined"]
    assert piped["max_model_len"] == 131_072 and piped["pipeline_parallel_size"] > 1
    assert piped["num_gpus"] < json.loads(result.stdout)["fewest_gpus"]["num_gpus"]


def test_a_sweep_names_the_points_whose_engine_fell_behind(kvlab, tmp_path):
    # (finding 4: every point of a sweep was overloaded and the table said nothing; finding 3: the footnote called
    # window_served_rps, an estimate from the oldest wait's growth, "the served rate")
    result = kvlab("sweep", "--strategy", "vllm,orca-pow2", "--rate", "0.5,10", "-n", "200", "--workers", "1",
                   "--out", tmp_path / "s")
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert ("Falling behind (the waiting queue grew across the measured window): strategy vllm, rate 10.0; strategy "
            "orca-pow2, rate 10.0.") in text
    assert "an estimate, not a count of finished requests" in text
    calm = kvlab("sweep", "--strategy", "vllm", "--rate", "0.5", "-n", "200", "--workers", "1", "--out", tmp_path / "t")
    assert "Falling behind" not in calm.stdout


def test_fit_says_that_its_utilization_is_not_the_versions_default(kvlab):
    # (finding 8: only `kvlab size` said that kvlab takes 0.9 where vLLM 0.32 starts at 0.92)
    note = "at gpu_memory_utilization 0.9, kvlab's default, where vLLM 0.32.0 defaults to 0.92"
    assert note in " ".join(kvlab("fit", "llama-3.1-8b", "--gpu", "h100-sxm").stdout.split())
    for args in (("--gpu-memory-utilization", "0.9"), ("--vllm-version", "0.15.1")):
        assert "kvlab's default, where" not in kvlab("fit", "llama-3.1-8b", "--gpu", "h100-sxm", *args).stdout

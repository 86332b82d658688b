"""Trial 53's findings 3, 11 and 14 (size, fit, workload and cost-profile inputs) and fix53's sizing leftover."""

from __future__ import annotations


def test_fit_fewest_gpus_counts_pipeline_stages(kvlab):
    """Finding 3: 3 x H100-SXM start llama-3.1-70b at TP 1 x PP 3; TP alone needs 4. fit says both, and which is which."""
    r = kvlab("fit", "llama-3.1-70b", "--gpu", "h100-sxm")
    assert r.exit_code == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "Fewest GPUs with tensor parallelism alone: 4 x H100-SXM (--tensor-parallel-size 4)" in out
    assert ("Fewest GPUs with pipeline parallelism too: 3 x H100-SXM (--tensor-parallel-size 1 "
            "--pipeline-parallel-size 3)") in out and "tensor parallelism within 8 GPUs" in out
    piped = kvlab("fit", "llama-3.1-70b", "--gpu", "h100-sxm", "--json").json()["fewest_gpus_pipelined"]
    assert (piped["tensor_parallel_size"], piped["pipeline_parallel_size"], piped["num_gpus"]) == (1, 3, 3)
    sized = kvlab("size", "llama-3.1-70b", "--gpu", "h100-sxm", "-pp", "3", "--json").json()
    assert piped["num_tokens"] == sized["num_tokens"]  # (the same sizing `kvlab size` gives that layout)
    two = kvlab("size", "llama-3.1-70b", "--gpu", "h100-sxm", "-pp", "2", "--json").json()
    assert two["num_tokens"] < two["max_model_len"]  # (2 stages do not hold one request: 3 is the fewest)


def test_fit_fewest_gpus_plain_where_pipeline_stages_do_not_help(kvlab):
    out = " ".join(kvlab("fit", "llama-3.1-70b", "--gpu", "h200").stdout.split())
    assert "Fewest GPUs: 2 x H200 (--tensor-parallel-size 2)" in out and "pipeline parallelism too" not in out
    out = " ".join(kvlab("fit", "llama-3.1-70b", "--gpu", "h100-sxm", "-pp", "3").stdout.split())
    assert "Fewest GPUs at --pipeline-parallel-size 3: 3 x H100-SXM" in out and "pipeline parallelism too" not in out


def test_larger_gpu_advice_uses_the_start_rule(kvlab):
    """fix53's leftover: on an H200 llama-3.1-70b was told 'a larger GPU at the same parallelism: B200, MI300X', where
    vLLM refuses to start at the model's 131,072 tokens. Each is now named with the max_model_len it starts at."""
    r = kvlab("size", "llama-3.1-70b", "--gpu", "h200")
    assert r.exit_code == 2
    assert ("a larger GPU at the same parallelism: B200 at a max_model_len of 78,304 or less, MI300X at a "
            "max_model_len of 119,936 or less") in r.stderr, r.stderr
    assert kvlab("size", "llama-3.1-70b", "--gpu", "b200").exit_code == 1  # (vLLM would refuse to start)
    assert kvlab("size", "llama-3.1-70b", "--gpu", "b200", "--max-model-len", "78304").exit_code == 0
    assert kvlab("size", "llama-3.1-70b", "--gpu", "b200", "--max-model-len", "78320").exit_code == 1
    # (where a larger GPU starts at the length asked, it is named plainly)
    r = kvlab("size", "llama-3.1-70b", "--gpu", "h200", "--max-model-len", "32k")
    assert "a larger GPU at the same parallelism: B200, MI300X" in r.stderr, r.stderr


def _bench():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "startup_logs.py"
    spec = importlib.util.spec_from_file_location("startup_logs_bench_53c", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def test_stored_estimate_accuracy_is_what_the_benchmark_computes_now():
    """Finding 11: the figure size and fit print beside an estimated budget is benchmarks/startup_logs.py's, stored by
    its --write; after a change to the sizing or the corpus this fails until it is regenerated."""
    import json
    import sys

    from kvlab.catalog.accuracy import kv_token_accuracy

    bench = _bench()
    try:
        entries = json.loads((bench.CORPUS / "index.json").read_text(encoding="utf-8"))
        rows = []
        for entry in entries:
            entry["_folder"] = bench.CORPUS
            rows.append(bench.predict(entry))
        computed = bench.kv_token_accuracy(rows)
    finally:
        del sys.modules["startup_logs_bench_53c"]
    assert computed == kv_token_accuracy(), "run: python benchmarks/startup_logs.py --write"
    assert computed["num_sized"] >= 30 and 0 < computed["num_within"] <= computed["num_sized"]


def test_size_and_fit_say_how_far_the_estimate_was_off(kvlab):
    from kvlab.catalog.accuracy import kv_token_accuracy

    acc = kv_token_accuracy()
    said = (f"its KV cache tokens were within 2% of vLLM's on {acc['held_out_num_within']} of "
            f"{acc['held_out_num_sized']} held-out startup logs ({acc['num_within']} of {acc['num_sized']} with the "
            f"{acc['fit_num_sized']} it was fitted on; of the {acc['num_above'] + acc['num_below']} beyond 2%, "
            f"{acc['num_above']} above vLLM's (up to {acc['largest_above']:+.1%}); benchmarks/startup_logs.py)")
    size = " ".join(kvlab("size", "qwen3-14b", "--gpu", "l40s", "--max-model-len", "40960",
                          "--vllm-version", "0.28.0").stdout.split())
    assert f"(the budget is kvlab's estimate: {said}; pass --available-kv-gib" in size
    fit = " ".join(kvlab("fit", "qwen3-14b", "--gpu", "l40s").stdout.split())
    assert f"budget kvlab's estimate: {said})" in fit
    assert kvlab("size", "qwen3-14b", "--gpu", "l40s", "--json").json()["estimate_accuracy"] == acc
    assert kvlab("fit", "qwen3-14b", "--gpu", "l40s", "--json").json()["estimate_accuracy"] == acc
    assert "estimate_accuracy" not in kvlab("fit", "qwen3-14b", "--available-kv-gib", "10", "--json").json()
    given = kvlab("size", "qwen3-14b", "--available-kv-gib", "10")
    assert "startup logs" not in given.stdout and "kvlab's estimate" not in given.stdout
    assert "startup logs" not in kvlab("fit", "qwen3-14b", "--available-kv-gib", "10").stdout


def test_context_len_reads_8k_as_max_model_len_does(kvlab):
    """Finding 14: `--context-len 8k` was 'not a whole number' while --max-model-len 8k was taken."""
    out = " ".join(kvlab("size", "qwen3-8b", "--gpu", "l4", "--context-len", "8k", "--max-model-len", "16k").stdout.split())
    assert "Workload: 1 request x 8,000 tokens" in out
    data = kvlab("fit", "qwen3-8b", "--gpu", "l4", "--context-len=8K", "--json").json()
    assert data["max_num_requests"]["context_len"] == 8192
    r = kvlab("fit", "qwen3-8b", "--gpu", "l4", "--context-len", "8x")
    assert r.exit_code == 2 and "--context-len '8x': not a whole number; valid: a whole number in digits (4096), or 32k" in r.stderr


def test_a_workload_that_is_not_a_file_form_names_every_form_run_takes(kvlab, tmp_path):
    """Finding 14: `-w README.md` / `-w emptydir` listed .csv and .jsonl only; run also takes inference-perf's .yaml."""
    (tmp_path / "README.md").write_text("# notes\n")
    (tmp_path / "emptydir").mkdir()
    for name, got in (("README.md", "(got '.md')"), ("emptydir", "(got a folder)")):
        r = kvlab("run", "vllm", "-w", str(tmp_path / name), "-n", "5")
        assert r.exit_code == 2 and ("a workload file must end in .csv or .jsonl (one request a row) or .yaml / .yml "
                                     f"(an inference-perf configuration) {got}") in r.stderr, r.stderr


def test_a_cost_profile_in_another_format_is_named_by_its_suffix(kvlab, tmp_path):
    """Finding 14: `--cost ip.yaml` said "is not valid JSON"; a .yaml is not a profile format at all."""
    (tmp_path / "ip.yaml").write_text("data:\n  type: shared_prefix\n")
    r = kvlab("run", "vllm", "--cost", str(tmp_path / "ip.yaml"), "-n", "5")
    assert r.exit_code == 2 and ".yaml is not a profile format; valid: .toml or .json" in r.stderr, r.stderr
    (tmp_path / "bad.json").write_text("x = 1\n")
    assert "is not valid JSON" in kvlab("run", "vllm", "--cost", str(tmp_path / "bad.json"), "-n", "5").stderr


def test_an_inference_perf_file_given_as_options_is_pointed_at_w(kvlab, tmp_path):
    """Finding 14: `run --config ip.yaml` said "'data' has a dict", `sweep --grid ip.yaml` "'data' is not an option";
    neither said that this is a workload file."""
    ip = tmp_path / "ip.yaml"
    ip.write_text("data:\n  type: shared_prefix\n  shared_prefix: {num_groups: 2, num_prompts_per_group: 3, "
                  "system_prompt_len: 40, question_len: 20, output_len: 5}\nload:\n  stages: [{rate: 2.0, duration: 3}]\n")
    for command in (("run", "vllm", "--config", str(ip), "-n", "5"), ("sweep", "--grid", str(ip))):
        r = kvlab(*command)
        assert r.exit_code == 2 and "this is an inference-perf workload file (data:, load:)" in r.stderr, r.stderr
        assert f"run it as a workload: -w {ip}" in " ".join(r.stderr.split())
    assert kvlab("run", "vllm", "-w", str(ip)).exit_code == 0


def test_size_prints_the_budget_as_vllm_does_with_two_decimals(kvlab):
    """Finding 14: vLLM's gpu_worker.py logs "Available KV cache memory: %.2f GiB" (8.60 in the corpus's 0.10.2 log);
    size printed 8.6."""
    out = kvlab("size", "qwen3-8b", "--available-kv-gib", "8.6", "--vllm-version", "0.10.2").stdout
    assert "Available KV cache memory: 8.60 GiB" in out
    lines = kvlab("size", "qwen3-8b", "--available-kv-gib", "12", "--json").json()["vllm_log_lines"]
    assert lines[0] == "Available KV cache memory: 12.00 GiB"

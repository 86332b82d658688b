"""The catalogue of bad inputs (issue 12): every one gets exit code 2 and one line that names the bad value and
what would be valid, with no traceback and no output file left behind.

Each case is (args, [substrings the message must hold]): the first names the bad value, the others what would
be valid. ``{tmp}`` in an argument is the test's temporary folder; ``{cfg:NAME}`` a config.json written there
from CONFIGS[NAME]. Commands that can write (run, race, paper fig2) also get ``--out {tmp}/out``, which must not
exist afterwards.
"""

from __future__ import annotations

import json
import math

import pytest

LLAMA = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
         "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
CONFIGS = {
    "heads0": {"num_attention_heads": 0},
    "layers_text": {"num_hidden_layers": "thirty-two"},
    "layers_nan": {"num_hidden_layers": math.nan},
    "layers_huge": {"num_hidden_layers": 100_000_000},
    "kv_more": {"num_key_value_heads": 64},
    "kv_indivisible": {"num_key_value_heads": 12},
    "head_dim_frac": {"head_dim": 127.5},
    "head_dim_zero": {"head_dim": 0},
    "window_negative": {"sliding_window": -4096},
    "maxpos0": {"max_position_embeddings": 0},
    "hidden_negative": {"hidden_size": -1},
    "vocab_text": {"vocab_size": "many"},
    "inter_bool": {"intermediate_size": True},
    "kv0": {"num_key_value_heads": 0},
    "experts": {"num_local_experts": 8, "num_experts_per_tok": 9},
    "dtype": {"torch_dtype": "int3"},
    "hidden_indivisible": {"hidden_size": 4097, "num_key_value_heads": 32},
    "layer_types": {"layer_types": ["full_attention"] * 3},
    "layers_inf": {"num_hidden_layers": math.inf},
}

GPU = ("--gpu", "a100-40gb")
CASES = [
    # --- config.json: physical sense -----------------------------------------------------------------------
    (("size", "{cfg:heads0}", *GPU), ["num_attention_heads 0", "1 to 65,536"]),
    (("size", "{cfg:layers_text}", *GPU), ["num_hidden_layers 'thirty-two'", "whole number"]),
    (("size", "{cfg:layers_nan}", *GPU), ["num_hidden_layers nan", "whole number"]),
    (("size", "{cfg:layers_inf}", *GPU), ["num_hidden_layers inf", "whole number"]),
    (("size", "{cfg:layers_huge}", *GPU), ["num_hidden_layers 100,000,000", "--yes"]),
    (("size", "{cfg:kv_more}", *GPU), ["num_key_value_heads 64", "divisor of 32"]),
    (("size", "{cfg:kv_indivisible}", *GPU), ["num_key_value_heads 12", "divisor of 32 (1, 2, 4, 8, 16, 32)"]),
    (("size", "{cfg:head_dim_frac}", *GPU), ["head_dim 127.5", "whole number"]),
    (("size", "{cfg:head_dim_zero}", *GPU), ["head_dim 0", "1 to"]),
    (("size", "{cfg:window_negative}", *GPU), ["sliding_window -4096", "0 to"]),
    (("size", "{cfg:maxpos0}", *GPU), ["max_position_embeddings 0", "1 to"]),
    (("size", "{cfg:hidden_negative}", *GPU), ["hidden_size -1", "1 to"]),
    (("size", "{cfg:vocab_text}", *GPU), ["vocab_size 'many'", "whole number"]),
    (("size", "{cfg:inter_bool}", *GPU), ["intermediate_size True", "whole number"]),
    (("size", "{cfg:kv0}", *GPU), ["num_key_value_heads 0", "1 to"]),
    (("size", "{cfg:experts}", *GPU), ["experts_per_token 9", "1 to 8"]),
    (("size", "{cfg:dtype}", *GPU), ["dtype 'int3'", "not one of"]),
    (("size", "{cfg:hidden_indivisible}", *GPU), ["hidden_size 4097", "give head_dim"]),
    (("size", "{cfg:layer_types}", *GPU), ["layer_types has 3 entries", "num_hidden_layers is 32"]),
    (("run", "vllm", "--model", "{cfg:heads0}"), ["num_attention_heads 0", "1 to 65,536"]),
    (("run", "vllm", "--model", "{cfg:layers_huge}"), ["num_hidden_layers 100,000,000", "--yes"]),
    (("size", "{tmp}/nowhere/config.json"), ["nowhere", "catalogue"]),
    (("size", "opt-13b", *GPU, "--vllm-version", "0.9.0", "--model-runner", "v2"),
     ["--model-runner v2 needs vLLM 0.12.0 or newer", "--vllm-version 0.9.0", "--model-runner v1"]),
    (("fit", "opt-13b", *GPU, "--vllm-version", "0.11.2", "--model-runner", "v2"), ["needs vLLM 0.12.0", "v1"]),
    # --- size / fit options ----------------------------------------------------------------------------------
    (("size", "opt-13b", "--gpu-memory-gib", "inf"), ["--gpu-memory-gib inf", "a number > 0"]),
    (("size", "opt-13b", "--gpu-memory-gib", "1e400"), ["--gpu-memory-gib inf", "a number > 0"]),
    (("size", "opt-13b", "--available-kv-gib", "inf"), ["--available-kv-gib inf", "a number > 0"]),
    (("size", "opt-13b", "--available-kv-gib", "nan"), ["--available-kv-gib nan", "a number > 0"]),
    (("size", "opt-13b", "--gpu-memory-gib", "-40"), ["--gpu-memory-gib -40", "a number > 0"]),
    (("size", "opt-13b", *GPU, "--gpu-memory-utilization", "0"), ["--gpu-memory-utilization 0", "≤ 1"]),
    (("size", "opt-13b", *GPU, "--gpu-memory-utilization", "1.5"), ["--gpu-memory-utilization 1.5", "≤ 1"]),
    (("size", "opt-13b", *GPU, "--gpu-memory-utilization", "inf"), ["--gpu-memory-utilization inf", "≤ 1"]),
    (("size", "opt-13b", *GPU, "--available-kv-gib", "1000"), ["--available-kv-gib 1000", "at most 15.55"]),
    (("size", "opt-13b", *GPU, "--max-num-batched-tokens", "1"), ["--max-num-batched-tokens (1)",
                                                                   "at least --max-num-seqs (256)"]),
    (("size", "opt-13b", *GPU, "--block-size", "4096"), ["--block-size 4096", "at most 2,048"]),
    (("size", "opt-13b", *GPU, "--gpu-memory-gib", "20"), ["does not fit on A100-40GB with --gpu-memory-gib 20",
                                                           "A100-40GB with its whole 39.49 GiB"]),
    (("size", "opt-13b", *GPU, "--block-size", "0"), ["--block-size 0", "tokens per block", "1 to 1,048,576"]),
    (("run", "vllm", "--block-size", "0"), ["--block-size 0", "tokens per block", "1 to 1,048,576"]),
    (("sweep", "--block-size", "0", "-n", "10", "--out", "{tmp}/sweep"), ["--block-size 0", "1 to 1,048,576"]),
    (("size", "opt-13b", *GPU, "--block-size", "abc"), ["--block-size 'abc'", "not a whole number"]),
    (("size", "opt-13b", *GPU, "--tensor-parallel-size", "0"), ["--tensor-parallel-size 0", "1 to 1,024"]),
    (("size", "opt-13b", *GPU, "--tensor-parallel-size", "3"), ["tensor parallel size (3)", "valid --tensor-parallel-size: 1, 2"]),
    (("size", "opt-13b", *GPU, "--pipeline-parallel-size", "100"), ["--pipeline-parallel-size 100", "valid: 1 to 40"]),
    (("size", "opt-13b", *GPU, "--max-model-len", "0"), ["--max-model-len 0", "1 to"]),
    (("size", "opt-13b", *GPU, "--max-model-len", "4096"), ["--max-model-len 4,096", "use at most 2,048"]),
    (("size", "opt-13b", *GPU, "--max-num-seqs", "0"), ["--max-num-seqs 0", "1 to"]),
    (("size", "opt-13b", *GPU, "--concurrency", "0"), ["--concurrency 0", "1 to"]),
    (("size", "opt-13b", *GPU, "--context-len", "0"), ["--context-len 0", "1 to"]),
    (("size", "opt-13b", *GPU, "--context-len", "4096"), ["context length 4,096", "no --max-model-len reaches it",
                                                           "valid: a context length of at most 2,048"]),
    (("size", "opt-13b", *GPU, "--max-model-len", "1024", "--context-len", "2048"),
     ["context length 2,048", "raise --max-model-len, up to 2,048"]),
    (("size", "opt-13b", *GPU, "--kv-cache-dtype", "int4"), ["--kv-cache-dtype 'int4'", "valid: auto, float16"]),
    (("size", "opt-13b", *GPU, "--dtype", "int8"), ["--dtype 'int8'", "valid: auto, float16"]),
    (("size", "opt-13b", "--gpu", "a100-4gb"), ["'a100-4gb'", "Did you mean: A100-40GB"]),
    (("size", "opt-31b", *GPU), ["'opt-31b'", "Did you mean: opt-13b"]),
    (("size", "llama-3.1-70b", "--gpu", "t4"), ["llama-3.1-70b does not fit on T4", "Would fit"]),
    (("fit", "opt-13b"), ["give --gpu NAME", "memory budget"]),
    (("fit", "opt-13b", *GPU, "--concurrency", "0"), ["--concurrency 0", "1 to"]),
    (("fit", "opt-13b", "--gpu-memory-gib", "inf"), ["--gpu-memory-gib inf", "a number > 0"]),
    # --- run / race: options -----------------------------------------------------------------------------------
    (("run", "vllm", "--gpu-memory-gib", "inf"), ["--gpu-memory-gib inf", "a number > 0"]),
    (("race", "--gpu-memory-gib", "inf"), ["--gpu-memory-gib inf", "a number > 0"]),
    (("run", "vllm", "--gpu-memory-gib", "0"), ["--gpu-memory-gib 0", "a number > 0"]),
    (("run", "vllm", "--swap-space", "inf", "--preemption-mode", "swap"), ["--swap-space inf", "≥ 0"]),
    (("run", "vllm", "--swap-space", "-1"), ["--swap-space -1", "≥ 0"]),
    (("run", "vllm", "--preemption-mode", "swap", "--swap-space", "0"), ["swap space", "--swap-space GiB > 0"]),
    (("run", "vllm", "--available-kv-gib", "1000"), ["--available-kv-gib 1000", "at most"]),
    (("run", "vllm", "--block-size", "4096"), ["--block-size 4096", "at most 2,048"]),
    (("run", "vllm", "--max-model-len", "1"), ["--max-model-len 1", "at most 1"]),
    (("run", "vllm", "--num-gpu-blocks", "1"), ["--num-gpu-blocks 1", "a whole number ≥ 2"]),
    (("run", "vllm", "--max-num-batched-tokens", "8", "--max-num-seqs", "16"), ["(8)", "at least --max-num-seqs"]),
    (("run", "vllm", "--model", "llama-3.1-70b"), ["llama-3.1-70b does not fit", "Would fit"]),
    (("run", "vllm", "--gpu", "a100-40"), ["'a100-40'", "Did you mean"]),
    (("run", "vllm", "--tensor-parallel-size", "0"), ["--tensor-parallel-size 0", "1 to"]),
    (("run", "vllm", "--gpu-memory-utilization", "2"), ["--gpu-memory-utilization 2", "≤ 1"]),
    # --- strategies: a name says what it does -----------------------------------------------------------------
    (("run", "continuous+paged+swap", "--preemption-mode", "recompute"),
     ["'continuous+paged+swap'", "continuous+paged+recompute"]),
    (("run", "vllm+recompute", "--preemption-mode", "swap"), ["'vllm+recompute'", "vllm+swap"]),
    (("run", "continuous+paged+swap+swap"), ["+swap twice", "continuous+paged+swap"]),
    (("run", "vllm+swap+recompute"), ["two preemption modes", "one of +recompute or +swap"]),
    (("race", "vllm", "vllm"), ["'vllm' is given 2 times", "each name once"]),
    (("run", "vllm", "--preemption-mode", "fast"), ["'fast'", "recompute, swap"]),
    (("run", "vlm"), ["'vlm'", "Did you mean vllm"]),
    (("run", "continuous+max+prefix"), ["'continuous+max+prefix'", "paged memory"]),
    (("run", "continuous+lru"), ["'continuous+lru'", "ALLOCATOR in"]),
    (("run", "vllm+turbo"), ["'turbo'", "valid options"]),
    # --- output paths, checked before any work -----------------------------------------------------------------
    (("race", "-n", "20", "--out", "/proc/x"), ["--out /proc/x", "valid: a folder"]),
    (("race", "-n", "20", "--out", "{tmp}/a-file.txt"), ["exists and is a file", "valid: a folder"]),
    (("race", "-n", "20", "--html", "/nonexistent/dir/x.html"), ["/nonexistent/dir", "existing, writable folder"]),
    (("race", "-n", "20", "--html", "{tmp}"), ["is a folder", "race.html"]),
    (("run", "vllm", "-n", "20", "--out", "/proc/nope"), ["--out /proc/nope", "valid: a folder"]),
    (("paper", "fig2", "-n", "20", "--out", "/proc/nope"), ["--out /proc/nope", "valid: a folder"]),
    (("sweep", "--strategy", "vllm", "-n", "20", "--out", "{tmp}/a-file.txt"), ["exists and is a file",
                                                                               "valid: a folder"]),
    (("sweep", "--strategy", "vllm", "-n", "20", "--out", "/proc/x"), ["--out /proc/x", "valid: a folder"]),
    (("capacity", "--strategy", "vllm", "-n", "20", "--out", "{tmp}/a-file.txt"), ["exists and is a file"]),
    # (an existing file kvlab did not write is never written over: trial 47 overwrote /etc/passwd with race --html)
    (("race", "-n", "5", "--html", "{tmp}/a-file.txt"), ["--html {tmp}/a-file.txt already exists",
                                                         "not a file kvlab wrote", "give another path, or delete"]),
    (("race", "-n", "5", "--html", "{tmp}/mine.toml"), ["--html {tmp}/mine.toml already exists", "delete"]),
    (("calibrate", "{tmp}", "--out", "{tmp}/mine.toml"), ["--out {tmp}/mine.toml already exists", "another path"]),
    (("vllm", "calibrate", "--out", "{tmp}/mine.toml"), ["--out {tmp}/mine.toml already exists", "another path"]),
    (("bench", "--url", "http://127.0.0.1:9", "--out", "{tmp}/a-file.txt"), ["exists and is a file",
                                                                            "valid: a folder"]),
    # (nor is a file of the user's in an --out folder that the command would write under the same name)
    *((args, [f"--out {{tmp}}: {name} already exists there and is not a file kvlab wrote",
              f"give another folder, or delete {{tmp}}/{name} first"]) for args, name in (
        (("run", "vllm", "-n", "5", "--out", "{tmp}"), "latency.png"),
        (("race", "-n", "5", "--out", "{tmp}"), "latency.png"),
        (("paper", "fig2", "-n", "20", "--out", "{tmp}"), "fig2.json"),
        (("sweep", "--strategy", "vllm", "-n", "20", "--out", "{tmp}"), "latency.png"),
        (("capacity", "--strategy", "vllm", "-n", "20", "--out", "{tmp}"), "capacity.png"),
        (("bench", "--url", "http://127.0.0.1:9", "--out", "{tmp}"), "compare_latency.png"))),
    # --- bounded work ------------------------------------------------------------------------------------------
    (("run", "vllm", "-n", "100000000"), ["100,000,000 requests", "--yes"]),
    (("run", "vllm", "--rate", "4", "--duration", "1e9"), ["4,000,000,000 requests", "--yes"]),
    (("race", "-n", "1000000"), ["1,000,000 requests x 4 strategies", "--yes"]),
    (("paper", "fig2", "-n", "100000000"), ["100,000,000 requests", "--yes"]),
    # (more blocks than the GPU holds: refused outright, as --available-kv-gib is; --yes would not make them fit)
    (("run", "vllm", "--num-gpu-blocks", "1000000000000"), ["1,000,000,000,000 blocks", "more than A100-40GB can hold",
                                                            "at most 1,274 blocks"]),
    (("run", "vllm", "--model", "qwen2.5-0.5b-instruct", "--gpu-memory-gib", "100000"),
     ["blocks", "lower --gpu-memory-gib"]),
    # --- paper fig2 ----------------------------------------------------------------------------------------------
    (("paper", "fig2", "--rate", "0"), ["--rate 0", "a number > 0"]),
    (("paper", "fig2", "--num-requests", "0"), ["--num-requests 0", "a whole number ≥ 1"]),
    (("paper", "fig2", "--rate", "inf"), ["--rate inf", "a number > 0"]),
    # --- workloads and arrivals ----------------------------------------------------------------------------------
    (("run", "vllm", "--rate", "0"), ["--rate 0", "a number > 0"]),
    (("run", "vllm", "--rate", "1e-15", "-n", "3"), ["arrive over 1.55e+15 s", "raise --rate"]),
    (("sweep", "--strategy", "vllm", "-n", "20", "--workers", "0"), ["--workers 0 is out of range", "from 1 to 1,024"]),
    (("run", "vllm", "--rate", "inf"), ["--rate inf", "a number > 0"]),
    (("run", "vllm", "--rate", "nan"), ["--rate nan", "a number > 0"]),
    (("run", "vllm", "--duration", "0"), ["--duration 0", "a number > 0"]),
    (("run", "vllm", "--duration", "-5"), ["--duration -5", "a number > 0"]),
    (("run", "vllm", "--cv", "2"), ["--cv 2", "--arrival gamma"]),
    (("run", "vllm", "--arrival", "gamma", "--cv", "0"), ["--cv 0", "a number > 0"]),
    (("run", "vllm", "--arrival", "uniform"), ["'uniform'", "auto, trace, poisson, gamma, burst"]),
    (("run", "vllm", "-w", "azure-conv", "--arrival", "trace", "--rate", "2"), ["--rate 2", "drop --rate"]),
    (("run", "vllm", "--arrival", "burst", "--rate", "2"), ["--rate 2 contradicts --arrival burst", "drop --rate"]),
    (("run", "vllm", "-w", "sessions", "--arrival", "burst"), ["sessions cannot arrive as a burst", "poisson or gamma"]),
    (("run", "vllm", "-w", "sessions", "--arrival", "burst", "--rate", "2"), ["cannot arrive as a burst", "--rate"]),
    (("run", "vllm", "-w", "sessions", "--arrival", "trace", "--rate", "2"), ["sessions cannot arrive on a trace",
                                                                             "poisson or gamma"]),
    (("run", "vllm", "-w", "sessions", "--rate", "2", "--max-context-len", "100000"),
     ["--max-context-len 100,000 exceeds max_model_len 2,048", "at most 2,048", "--max-model-len"]),
    (("run", "vllm", "-w", "arxiv", "--arrival", "trace"), ["arxiv has no arrival times", "--arrival poisson"]),
    (("run", "vllm", "-w", "nope"), ["'nope'", "named: "]),
    (("run", "vllm", "-w", "azure-conv", "-n", "20000"), ["not 20,000", "ask for fewer"]),
    (("run", "vllm", "--seed", "-1"), ["--seed -1", "whole number"]),
    (("run", "vllm", "--num-requests", "0"), ["--num-requests 0", "a whole number ≥ 1"]),
    (("run", "vllm", "--long-requests", "trim"), ["'trim'", "reject, clip"]),
    (("run", "vllm", "-w", "{tmp}/ten.csv"), ["line 3: prompt_len 'ten'", "whole number"]),
    (("run", "vllm", "-w", "{tmp}/zero.csv"), ["line 2: output_len '0'", "at least one"]),
    (("run", "vllm", "-w", "{tmp}/some-times.csv"), ["line 3: arrival_time is empty", "on every row, or on none"]),
    (("run", "vllm", "-w", "{tmp}/negative.csv"), ["arrival_time '-1'", "≥ 0"]),
    (("run", "vllm", "-w", "{tmp}/requests.txt"), ["'.txt'", ".csv or .jsonl"]),
    (("run", "vllm", "-w", "{tmp}/empty.csv"), ["the file is empty", "prompt_len and output_len"]),
    (("run", "vllm", "-w", "{tmp}/vidur-bad.csv"), ["num_decode_tokens", "prompt_len and output_len"]),
    (("run", "vllm", "-w", "{tmp}/bad.jsonl"), ["line 1", "is not JSON"]),
    # --- option and grid files (trial 46, finding 3) -----------------------------------------------------------
    (("run", "vllm", "--config", "{tmp}/binary.yaml"), ["--config", "binary.yaml: cannot read it as UTF-8", ".toml"]),
    (("run", "vllm", "--config", "{tmp}/binary.toml"), ["binary.toml: cannot read it as UTF-8", ".yaml"]),
    (("sweep", "--grid", "{tmp}/binary.yaml", "--out", "{tmp}/sweep"), ["--grid", "cannot read it as UTF-8"]),
    (("capacity", "--grid", "{tmp}/binary.yaml", "--out", "{tmp}/cap"), ["--grid", "cannot read it as UTF-8"]),
    (("sweep", "--grid", "{tmp}/unclosed.yaml", "--out", "{tmp}/sweep"), ["not valid YAML", "at line 2, column 2"]),
    # (trial 47 #19: an inference-perf file's errors name the file, and an empty one says so, not 'NoneType')
    (("run", "vllm", "-w", "{tmp}/ip_zero.yaml"), ["{tmp}/ip_zero.yaml: shared_prefix: num_groups = 0",
                                                   "whole number >= 1"]),
    (("run", "vllm", "-w", "{tmp}/empty.yaml"), ["{tmp}/empty.yaml: the file is empty", "is a mapping"]),
    # --- vllm compare: refused before the engine is needed -------------------------------------------------------
    (("vllm", "compare", "--rate", "0"), ["--rate 0", "a number > 0"]),
    (("vllm", "compare", "--arrival", "burst", "--rate", "5"), ["--rate 5 contradicts --arrival burst", "drop"]),
]

FILES = {
    "ten.csv": "arrival_time,prompt_len,output_len\n0,10,5\n1,ten,5\n",
    "zero.csv": "arrival_time,prompt_len,output_len\n0,10,0\n",
    "some-times.csv": "arrival_time,prompt_len,output_len\n0,10,5\n,10,5\n",
    "negative.csv": "arrival_time,prompt_len,output_len\n-1,10,5\n",
    "requests.txt": "arrival_time,prompt_len,output_len\n0,10,5\n",
    "empty.csv": "",
    "vidur-bad.csv": "num_prefill_tokens,pd_ratio\n10,0.5\n",
    "bad.jsonl": '{"prompt_len": 10,\n',
    "a-file.txt": "not a folder\n",
    "latency.png": "my own plot\n",  # (names kvlab writes into an --out folder: the user's, not to be written over)
    "fig2.json": "{}\n",
    "capacity.png": "my own plot\n",
    "compare_latency.png": "my own plot\n",
    "mine.toml": '# my own settings\nname = "mine"\nkind = "absolute"\n',
    "binary.yaml": b"\x00\x01\xff",
    "binary.toml": b"\x00\x01\xff",
    "unclosed.yaml": "a: [1, 2\nb: 3\n",
    "empty.yaml": "",
    "ip_zero.yaml": ("data: {type: shared_prefix, shared_prefix: {num_groups: 0, num_prompts_per_group: 2, "
                     "system_prompt_len: 10, question_len: 5, output_len: 3}}\nload: {stages: [{rate: 1, duration: 5}]}\n"),
}

WRITERS = ("run", "race", "paper")


def _materialise(args, tmp_path) -> list[str]:
    out = []
    for arg in args:
        if arg.startswith("{cfg:"):
            name = arg[5:-1]
            path = tmp_path / f"{name}.json"
            path.write_text(json.dumps({**LLAMA, **CONFIGS[name]}))
            out.append(str(path))
        else:
            out.append(arg.replace("{tmp}", str(tmp_path)))
    if out[0] in WRITERS and "--out" not in out and "--html" not in out:
        out += ["--out", str(tmp_path / "out")]
    return out


def test_the_catalogue_has_at_least_80_cases():
    assert len(CASES) >= 80


@pytest.mark.parametrize("args, needles", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_is_one_clear_line(kvlab, tmp_path, args, needles):
    for name, text in FILES.items():
        if isinstance(text, bytes):
            (tmp_path / name).write_bytes(text)
        else:
            (tmp_path / name).write_text(text)
    argv = _materialise(args, tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    r = kvlab(*argv)
    message = " ".join(r.stderr.split())
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for needle in needles:
        needle = needle.replace("{tmp}", str(tmp_path))
        assert needle in message, (needle, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "a partial output was left behind"


# --- the work gate lets --yes through ----------------------------------------------------------------------------

def test_yes_passes_the_request_gate(kvlab, monkeypatch):
    monkeypatch.setenv("KVLAB_MAX_REQUEST_RUNS", "10")
    refused = kvlab("run", "vllm", "-n", "20")
    assert refused.exit_code == 2 and "20 requests" in refused.stderr and "--yes" in refused.stderr
    allowed = kvlab("run", "vllm", "-n", "20", "--yes", "--json")
    assert allowed.exit_code == 0, allowed.stderr
    assert allowed.json()["workload"]["num_requests"] == 20


def test_yes_passes_the_layer_gate(kvlab, monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_MAX_NUM_LAYERS", "16")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    refused = kvlab("size", str(path), *GPU)
    assert refused.exit_code == 2 and "num_hidden_layers 32" in refused.stderr and "--yes" in refused.stderr
    allowed = kvlab("size", str(path), *GPU, "--yes", "--json")
    assert allowed.exit_code == 0, allowed.stderr
    assert allowed.json()["kv_bytes_per_token"] == 131_072


def test_the_library_is_gated_too():
    from kvlab.validate import TooMuchWork, allow_large_work
    from kvlab.workload import load_workload

    with pytest.raises(TooMuchWork, match="--yes"):
        load_workload("paper-sharegpt", rate=4.0, duration=1e9)
    with allow_large_work():
        assert load_workload("paper-sharegpt", rate=4.0, num_requests=5).num_requests == 5


# --- one meaning per option ---------------------------------------------------------------------------------------

def test_gpu_memory_gib_names_the_gpu_with_its_memory_in_run_and_size(kvlab):
    run = kvlab("run", "vllm", "-n", "20", "--gpu-memory-gib", "80", "--json")
    assert run.exit_code == 0, run.stderr
    assert run.json()["gpu"] == "A100-40GB with 80 GiB"
    size = kvlab("size", "opt-13b", *GPU, "--gpu-memory-gib", "80", "--json")
    assert size.exit_code == 0, size.stderr
    assert size.json()["gpu_memory_bytes"] == 80 * 2**30 and size.json()["gpu_name"] == "A100-40GB with 80 GiB"


def test_preemption_mode_joins_a_name_that_states_none(kvlab):
    r = kvlab("run", "continuous+paged", "--preemption-mode", "swap", "-n", "20", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["strategies"][0]["name"] == "continuous+paged+swap"


def test_vllm_compare_rate_default_does_not_contradict_burst_or_trace():
    from kvlab import service
    from kvlab.config.resolve import workload_config

    # What `kvlab vllm compare --arrival burst` builds once the engine is there (the refusal came before).
    assert service.load(workload_config(workload="paper-alpaca", arrival="burst", num_requests=8)).num_requests == 8


# --- the engine's side (the lead's branch fixes them) -----------------------------------------------------------

def _engine(workload):
    from kvlab.config import resolve
    from kvlab.sim import Simulation
    from kvlab.strategies import parse_strategy

    return Simulation(parse_strategy("vllm"), resolve().engine, workload).run()


def test_a_workload_of_only_too_long_prompts_is_rejected_and_counted():
    from kvlab.workload import Request, Workload

    requests = tuple(Request(i, i * 0.01, 3000, 10) for i in range(2000))
    summary = _engine(Workload("too-long", requests, "", "")).summary()
    assert summary["num_rejected"] == 2000 and summary["num_finished"] == 0
    assert sum(summary["reject_reasons"].values()) == 2000


def test_first_scheduled_time_is_when_the_request_starts_being_computed():
    from kvlab.workload import Request, Workload

    record = _engine(Workload("one", (Request(0, 0.0, 100, 10),), "", "")).records[0]
    # Alone at t = 0, it is scheduled at once: its queueing delay is zero, its first token comes one iteration later.
    assert record.first_scheduled_time == 0.0 < record.first_token_time


@pytest.mark.vllm
@pytest.mark.parametrize("arrival", ["burst", "trace"])
def test_vllm_compare_runs_with_burst_and_trace_arrivals(kvlab, tmp_path, arrival):
    """--rate's default no longer contradicts --arrival: both run through the real engine, step for step."""
    from kvlab.vllm.install import VllmEnv, default_env_dir

    if not VllmEnv(default_env_dir()).is_installed:
        pytest.skip("needs `kvlab vllm install`")
    args = ["vllm", "compare", "--arrival", arrival, "-n", "12", "--json"]
    if arrival == "trace":
        trace = tmp_path / "trace.csv"
        trace.write_text("arrival_time,prompt_len,output_len\n" + "".join(
            f"{0.02 * i:.2f},{20 + 7 * i},{10 + 3 * i}\n" for i in range(12)))
        args += ["--workload", str(trace)]
    r = kvlab(*args)
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert data["identical"] is True and data["output_mismatches"] == {}
    assert data["num_steps"]["vllm"] == data["num_steps"]["kvlab"] > 0


@pytest.mark.parametrize(("args", "named"), [
    (["capacity", "--replicas", "0", "-n", "50"], ""),  # (one configuration: the message says it all)
    (["sweep", "--model", "opt-13b,opt-66b", "--gpu", "T4", "-n", "50"], " (in the point model='opt-13b')"),
    (["sweep", "--rate", "1,2", "--block-size", "0,16", "-n", "50"], " (in the point block_size=0, rate=1.0)"),
])
def test_a_bad_point_is_named_by_what_tells_it_from_the_others(kvlab, tmp_path, args, named):
    r = kvlab(*args, "--out", tmp_path / "out")
    assert r.exit_code == 2 and not (tmp_path / "out").exists()
    message = " ".join(r.stderr.split())
    assert message.endswith(named) and message.count("(in the point") == (1 if named else 0), message


@pytest.mark.parametrize("command", ["run", "race"])
def test_strategy_as_an_option_where_strategies_are_arguments_says_how(kvlab, command):
    r = kvlab(command, "--strategy", "vllm")
    assert r.exit_code == 2
    takes = {"run": "its strategy as an argument", "race": "its strategies as arguments"}[command]  # (run: one)
    assert f"kvlab {command} takes {takes}, not --strategy: e.g. kvlab {command} vllm" in " ".join(r.stderr.split())

"""benchmarks/startup_logs.py on a tiny corpus written here: one log, its index entry, the figures it prints."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "startup_logs.py"
SIZING_CONFIG = Path(__file__).resolve().parent / "data" / "sizing_configs" / "qwen3.6-35b-a3b-nvfp4.json"

# Lines as vLLM 0.10.1.1 prints them for Qwen2-7B on one A100 80GB (the corpus log
# qwen2-7b-a100-80gb-util0.5-0.10.1.1 prints these figures); the settings are its index entry's.
LOG = """\
(EngineCore_0 pid=2881) INFO 09-04 01:29:01 [topk_topp_sampler.py:50] Using FlashInfer for top-p & top-k sampling.
(EngineCore_0 pid=2881) INFO 09-04 01:29:20 [gpu_model_runner.py:1892] Model loading took 14.2474 GiB and 5.1 seconds
(EngineCore_0 pid=2881) INFO 09-04 01:29:40 [gpu_worker.py:276] Available KV cache memory: 24.83 GiB
(EngineCore_0 pid=2881) INFO 09-04 01:29:41 [kv_cache_utils.py:849] GPU KV cache size: 464,848 tokens
(EngineCore_0 pid=2881) INFO 09-04 01:29:41 [kv_cache_utils.py:853] Maximum concurrency for 16,384 tokens per request: 28.37x
"""
ENTRY = {
    "id": "qwen2-7b-a100-80gb-util0.5", "file": "qwen2-7b.log", "vllm_version": "0.10.1.1", "gpu": "A100 80GB",
    "gpu_kvlab": "A100-80GB", "num_gpus": 1, "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
    "model": "Qwen/Qwen2-7B-Instruct", "dtype": "bfloat16", "quantization": None, "kv_cache_dtype": "auto",
    "gpu_memory_utilization": 0.5, "max_model_len": 16384, "max_num_seqs": None, "max_num_batched_tokens": 2048,
    "enforce_eager": False, "other_flags": "", "layout": ["dense", "gqa"],
    "printed": {"model_loading_gib": 14.2474, "available_kv_gib": 24.83, "kv_cache_tokens": 464848,
                "max_concurrency": 28.37, "max_concurrency_len": 16384, "activation_gib": None, "non_torch_gib": None,
                "cuda_graph_gib": None, "total_gib": None},
}


@pytest.fixture
def bench():
    spec = importlib.util.spec_from_file_location("startup_logs_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def corpus(tmp_path: Path, entry: dict) -> Path:
    folder = tmp_path / "startup_logs"
    folder.mkdir()
    (folder / "qwen2-7b.log").write_text(LOG)
    (folder / "index.json").write_text(json.dumps([entry]))
    return folder / "index.json"


def test_each_term_is_predicted_against_the_printed_one(bench, tmp_path, capsys):
    assert bench.main(["--corpus", str(corpus(tmp_path, ENTRY))]) == 0
    out = capsys.readouterr().out
    assert "rules of 0.9.0 on" in out and "log reader disagrees" not in out
    weights = next(line for line in out.splitlines() if line.strip().startswith("weights GiB"))
    assert "printed    14.25" in weights  # the Qwen2-7B config in tests/data/sizing_configs, 7.6 B parameters
    assert "KV tokens within 2%: 1 of 1 sized logs" in " ".join(out.split())
    assert "weights (text-only): 1 of 1 within 0.1 GiB" in out


def test_the_log_reader_is_checked_against_the_index(bench, tmp_path, capsys):
    entry = dict(ENTRY, printed=dict(ENTRY["printed"], kv_cache_tokens=464_000))
    bench.main(["--corpus", str(corpus(tmp_path, entry))])
    assert "log reader disagrees with index.json: kv_cache_tokens reader 464848 vs index 464000" in capsys.readouterr().out


def test_what_cannot_be_sized_is_said_not_guessed(bench, tmp_path, capsys):
    for change, reason in ((dict(gpu_kvlab=None, gpu="a card nobody names"), "is not in kvlab's catalogue"),
                           (dict(model="nobody/unknown-7b"), "no config.json for 'nobody/unknown-7b'"),
                           (dict(vllm_version=None), "states no vLLM version"),
                           (dict(model_config="mixed-without-map"),
                            "model_configs/mixed-without-map.json: modelopt MIXED_PRECISION without its "
                            "quantized_layers map cannot be sized"),
                           (dict(not_sizable="a drafter shares the pool"), "a drafter shares the pool"),
                           (dict(other_flags="--decode-context-parallel-size 3"),
                            "-dcp 3 must divide --tensor-parallel-size")):
        folder = tmp_path / str(len(reason))
        (folder / "model_configs").mkdir(parents=True)
        # a MIXED_PRECISION checkpoint's config.json without its per-layer map (vLLM refuses it too)
        (folder / "model_configs" / "mixed-without-map.json").write_text(json.dumps(dict(
            json.loads(SIZING_CONFIG.read_text()), quantization_config={"quant_method": "modelopt",
                                                                        "quant_algo": "MIXED_PRECISION"})))
        bench.main(["--corpus", str(corpus(folder, dict(ENTRY, **change)))])
        out = capsys.readouterr().out
        assert "not sized: " in out and reason in out and "KV tokens" not in out.split("== summary")[0]


def test_the_decode_context_parallel_size_is_read_from_the_flags(bench):
    assert bench.dcp_of({"other_flags": "--decode-context-parallel-size 8 --trust-remote-code"}) == 8
    assert bench.dcp_of({"other_flags": "--decode-context-parallel-size=2"}) == 2
    assert bench.dcp_of({"other_flags": None}) == bench.dcp_of({}) == 1
    assert bench.expert_parallel_of({"other_flags": "--enable-expert-parallel --swap-space 0"})
    assert bench.expert_parallel_of({"other_flags": "--trust-remote-code -ep"})
    assert not bench.expert_parallel_of({"other_flags": "--expert-placement-strategy linear"})
    assert not bench.expert_parallel_of({})


def test_the_sampler_is_read_from_the_log(bench, tmp_path):
    entry = dict(ENTRY, _folder=corpus(tmp_path, ENTRY).parent)
    assert bench.sampler_of(entry) == "flashinfer"
    (entry["_folder"] / "qwen2-7b.log").write_text(LOG.replace("Using FlashInfer for top-p & top-k sampling",
                                                               "Falling back to the PyTorch-native implementation "
                                                               "of top-p & top-k sampling"))
    assert bench.sampler_of(entry) == "pytorch"


def test_a_version_range_inside_one_epoch_is_sized_with_that_epochs_rules(bench, tmp_path, capsys):
    entry = dict(ENTRY, vllm_version="0.1.dev7548+gbaba038 (a source build between 0.9.2 and 0.10.0)",
                 vllm_rules_version="0.9.2",
                 settings_from={"vllm_rules_version": "a build between 0.9.2 and 0.10.0: one epoch of rules"})
    bench.main(["--corpus", str(corpus(tmp_path, entry))])
    out = capsys.readouterr().out
    assert "(rules of 0.9.2: a build between 0.9.2 and 0.10.0" in out and "rules of 0.9.0 on" in out
    assert "KV tokens within 2%: 1 of 1 sized logs" in " ".join(out.split())
    bare = tmp_path / "bare"
    bare.mkdir()
    bench.main(["--corpus", str(corpus(bare, dict(ENTRY, vllm_version=entry["vllm_version"])))])
    # without it the dev build's number (0.1) is taken as it stands, and refused
    assert "is not one kvlab knows the startup arithmetic of" in capsys.readouterr().out


def test_a_concurrency_that_disagrees_alone_is_named(bench, tmp_path, capsys):
    entry = dict(ENTRY, printed=dict(ENTRY["printed"], max_concurrency=14.0))
    log = LOG.replace("28.37x", "14.00x")
    folder = tmp_path / "startup_logs"
    folder.mkdir()
    (folder / "qwen2-7b.log").write_text(log)
    (folder / "index.json").write_text(json.dumps([entry]))
    bench.main(["--corpus", str(folder / "index.json")])
    out = capsys.readouterr().out
    assert "outlier qwen2-7b-a100-80gb-util0.5: max concurrency +103.2% with tokens +0.3%" in out


def test_an_outlier_names_the_cause_its_entry_says_kvlab_cannot_model(bench, tmp_path, capsys):
    entry = dict(ENTRY, printed=dict(ENTRY["printed"], kv_cache_tokens=400000),
                 unmodelled="other processes on the GPU (a test)")
    folder = tmp_path / "startup_logs"
    folder.mkdir()
    (folder / "qwen2-7b.log").write_text(LOG.replace("464,848 tokens", "400,000 tokens"))
    (folder / "index.json").write_text(json.dumps([entry]))
    bench.main(["--corpus", str(folder / "index.json")])
    line = next(x for x in capsys.readouterr().out.splitlines() if "outlier qwen2-7b-a100-80gb-util0.5" in x)
    assert line.endswith("; not modelled: other processes on the GPU (a test)")


def test_model_config_may_name_a_catalogue_entry_and_gpu_memory_gib_the_machines_total(bench, tmp_path, capsys):
    # The same log under a checkpoint name nothing matches: model_config names the catalogue's Qwen2.5-7B shape
    # (28 layers, 4 KV heads x 128 like Qwen2-7B), and gpu_memory_gib replaces the A100's 79.25 GiB with 40 GiB.
    entry = dict(ENTRY, model="someone/renamed-7b", model_config="qwen2.5-7b-instruct", gpu_memory_gib=40.0,
                 settings_from={"gpu_memory_gib": "a test: the machine's own total"})
    bench.main(["--corpus", str(corpus(tmp_path, entry))])
    out = capsys.readouterr().out
    assert "not sized" not in out.split("== summary")[0]
    assert "requested 20.00 GiB" in out  # 0.5 x 40 GiB, not 0.5 x the catalogue's A100-80GB


def test_from_0_21_the_printed_activation_holds_the_graph_estimate(bench):
    """vLLM 0.21+ deducts its CUDA-graph estimate and reports it inside 'peak activation' (gpu_worker: transient peak +
    the estimate applied); its 'CUDAGraph memory' is the capture's own, after the cache: kvlab's activation and graph
    estimates are compared with the printed activation together, and the graphs are not a term of the gap."""
    p = {"activation_gib": 1.17, "cuda_graph_gib": 0.59, "weights_gib": 9.29, "non_torch_gib": 0.07}
    assert bench.as_printed(p, "activation_gib") == pytest.approx(1.76)
    assert bench.as_printed({**p, "cuda_graph_gib": 0.0}, "activation_gib") == 1.17
    assert "inside the printed activation" in bench.graphs_note(p)
    assert "not deducted" in bench.graphs_note({**p, "cuda_graph_gib": 0.0})
    row = bench.Row({"id": "x"}, printed={"activation_gib": 1.46, "available_kv_gib": 9.27, "cuda_graph_gib": 0.52})
    row.predicted = {**p, "available_kv_gib": 10.83}
    row.reader = {"weights_and_non_torch_gib": 11.22}
    # the 0.28 log of Qwen3-14B-AWQ on an RTX 5090: 'consumed memory' 11.22 GiB against 9.29 + 0.07
    assert bench.cause(row) == "weights+non-torch off by -1.86 GiB (printed by the log)"


def test_the_encoder_dummy_is_checked_against_the_log_line(bench):
    """vLLM prints the encoder budget and the items it profiles ('Encoder cache will be initialized with a budget of
    153600 tokens, and profiled with 1 video items'); the benchmark says whether kvlab's dummy is that one."""
    from kvlab.catalog import get_gpu, get_model
    from kvlab.sizing import SizingConfig

    data = Path(__file__).resolve().parent / "data" / "sizing_configs"
    model = get_model(str(data / "qwen3-vl-30b-a3b-instruct.json"))
    # corpus log qwen3-vl-30b-a3b-4xrtx3090-0.11.0's settings
    config = SizingConfig.for_gpu(get_gpu("rtx-3090"), tensor_parallel_size=4, max_model_len=65536,
                                  vllm_version="0.11.0")
    mine = bench.encoder_dummy_of(model, config)
    assert mine == ("video", 1, 153600)
    logged = {"encoder_profile_modality": "video", "encoder_profile_items": 1, "encoder_budget_tokens": 153600}
    assert bench.encoder_agreement(mine, logged) == " (the same dummy)"
    assert "NOT" in bench.encoder_agreement(("image", 1, 16384), logged)
    assert bench.encoder_agreement(mine, {}) == ""
    # before 0.11 kvlab does not derive the video it says vLLM profiles: nothing to compare
    assert bench.encoder_dummy_of(model, SizingConfig.for_gpu(get_gpu("rtx-3090"), tensor_parallel_size=4,
                                                              max_model_len=65536, vllm_version="0.10.2")) is None


def test_vllms_cuda_graph_estimate_is_read_and_set_per_graph(bench, tmp_path, capsys):
    """The lines of 0.20 on that say how vLLM made its CUDA-graph estimate: the graphs it profiled, and the estimate as
    a share of the card (the corpus logs nemotron-cascade-2-30b-a3b-nvfp4-wsl-0.20.1rc1 and
    gemma-4-e2b-it-bf16-t4-0.29.0 print these); --fit sets the estimate over the graphs."""
    from kvlab.vllm.log import parse_vllm_log

    lines = (
        "(EngineCore pid=176) INFO 05-01 17:59:03 [gpu_model_runner.py:5967] Profiling CUDA graph memory: "
        "PIECEWISE=51 (largest=512), FULL=19 (largest=128)\n"
        "(EngineCore pid=176) INFO 05-01 17:59:06 [gpu_model_runner.py:6046] Estimated CUDA graph memory: 0.48 GiB total\n"
        "(EngineCore pid=176) INFO 05-01 17:59:06 [gpu_worker.py:448] CUDA graph memory profiling is enabled (default "
        "since v0.21.0). The current --gpu-memory-utilization=0.8500 is equivalent to --gpu-memory-utilization=0.8348 "
        "without CUDA graph memory profiling.\n")
    log = parse_vllm_log(lines + LOG.splitlines(keepends=True)[-1])
    assert (log.cuda_graphs_profiled, log.estimated_cuda_graph_gib, log.estimated_cuda_graph_share) == (70, 0.48, 0.0152)
    assert "PIECEWISE=51" in log.lines["cuda_graphs_profiled"]
    # an estimate given only as a share: times the card's total (A100-80GB, kvlab's catalogue), over kvlab's count of
    # the graphs at max_num_seqs 8 (piecewise 1, 2, 4, 8, 16 and full 1, 2, 4, 8)
    share_only = LOG + lines.splitlines(keepends=True)[2]
    folder = tmp_path / "share"
    folder.mkdir()
    (folder / "qwen2-7b.log").write_text(share_only)
    (folder / "index.json").write_text(json.dumps([dict(ENTRY, max_num_seqs=8)]))
    bench.main(["--corpus", str(folder / "index.json"), "--fit"])
    out = capsys.readouterr().out
    from kvlab.catalog import get_gpu

    total = get_gpu("a100-80gb").memory_gib
    assert f"{0.0152 * total:.3f} GiB (0.0152 of {total:.2f} GiB (the utilization line)) / 9 graphs (kvlab's count at " \
           f"max_num_seqs 8) = {0.0152 * total * 1024 / 9:.2f} MiB per graph" in out


def test_an_entrys_speculative_config_and_auto_round_reach_the_sizing(bench):
    """index.json's speculative_config (vLLM's --speculative-config) and an AutoRound quantization are passed on."""
    entry = {**ENTRY, "quantization": "auto_round (INT4)",
             "speculative_config": {"method": "mtp", "num_speculative_tokens": 3}}
    assert bench.speculative_of(entry) == {"speculative_method": "mtp", "num_speculative_tokens": 3}
    assert bench.speculative_of(ENTRY) == {}
    assert bench.quantization_of(entry) == "auto-round"
    row = bench.predict({**entry, "_folder": BENCH.parent})  # Qwen2-7B has no MTP layers: refused in one line
    assert row.error.startswith("--speculative-method mtp needs a model with MTP layers")

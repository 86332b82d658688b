"""--quantization and --vllm-version through every face: `kvlab size`, the lab's calculator, `kvlab run`'s resolved
configuration and the options a sweep or a capacity search can vary (config/options.py declares them once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.config import OPTIONS, resolve
from kvlab.errors import KvlabError

FIGURES = ("num_tokens", "num_blocks", "max_concurrency", "available_kv_bytes", "weights_bytes", "kv_bytes_per_token",
           "vllm_version", "vllm_rules_since")

CASES = [
    ("llama-3.1-8b", "A100-80GB", None, None),
    ("llama-3.1-8b", "A100-80GB", "awq", "0.10.1"),
    ("llama-3.1-8b", "L40S", "fp8", "0.14.1"),
    ("qwen3-14b", "H100-SXM", None, "0.9.2"),
]


@pytest.mark.parametrize(("model", "gpu", "quantization", "version"), CASES)
def test_the_labs_calculator_gives_kvlab_sizes_numbers(kvlab, model, gpu, quantization, version):
    from kvlab.web.calculator import answer

    args = ["size", model, "--gpu", gpu, "--json"]
    args += ["--quantization", quantization] if quantization else []
    args += ["--vllm-version", version] if version else []
    result = kvlab(*args)
    assert result.exit_code == 0, result.stdout
    cli = json.loads(result.stdout)
    page = answer(model=model, gpu=gpu, concurrency=1, context_len=1024, gpu_memory_utilization=0.9,
                  quantization=quantization, vllm_version=version)
    for figure in FIGURES:
        assert page[figure] == cli[figure], figure
    assert page["quantization"] == quantization


def test_quantization_and_version_change_the_answer():
    from kvlab.web.calculator import answer

    def tokens(**kw):
        return answer(model="llama-3.1-8b", gpu="A100-80GB", concurrency=1, context_len=1024,
                      gpu_memory_utilization=0.9, **kw)["num_tokens"]

    assert tokens(quantization="awq") > tokens()  # 4-bit weights leave more for the cache
    # 0.10's profiling run samples with PyTorch's top-k/top-p (35.3 B a logit), 0.24's with FlashInfer's (7.1) but
    # deducts the CUDA graphs' estimate: on Llama-3.1-8B the sampler weighs more
    assert tokens(vllm_version="0.10.1") < tokens(vllm_version="0.24.0")


def test_declared_once_and_run_sizes_with_them():
    from kvlab.catalog import get_gpu, get_model
    from kvlab.sizing import SizingConfig, size_kv_cache
    from kvlab.sweep.grid import run_options

    assert OPTIONS["quantization"].default is None and OPTIONS["vllm_version"].default is None
    assert {"quantization", "vllm_version"} <= set(run_options())  # a sweep's and capacity's grid options
    config = resolve(model="llama-3.1-8b", gpu="A100-80GB", quantization="awq", vllm_version="v0.10.1")
    expected = size_kv_cache(get_model("llama-3.1-8b"), SizingConfig.for_gpu(
        get_gpu("A100-80GB"), quantization="awq", vllm_version="0.10.1"))
    assert config.cache.num_slots == expected.num_pool_slots
    assert (config.sizing.quantization, config.sizing.vllm_version) == ("awq", "0.10.1")
    # stated only when given, canonical: the keys of configurations stored before the options existed stay
    assert "vllm_version" not in resolve(model="llama-3.1-8b").options()
    assert config.options()["vllm_version"] == "0.10.1"
    assert resolve(config.options()) == config and resolve(config.options()).key == config.key
    assert config.key != resolve(model="llama-3.1-8b", gpu="A100-80GB").key


@pytest.mark.parametrize(("option", "value", "message"), [
    ("vllm_version", "0.5", "vLLM version '0.5' is not one kvlab knows"),
    ("quantization", "q4", "--quantization: weight quantization 'q4' is not modelled"),
])
def test_a_bad_value_is_one_line(kvlab, option, value, message):
    with pytest.raises(KvlabError, match=message):
        resolve(**{option: value})
    result = kvlab("run", OPTIONS[option].flag, value, "-n", "5")
    assert result.exit_code != 0
    assert message in result.stdout + result.stderr and "Traceback" not in result.stdout + result.stderr


def test_the_labs_size_route_passes_them():
    from kvlab.web.server import size_answer

    plain = size_answer({"model": "llama-3.1-8b", "gpu": "A100-80GB"})
    awq = size_answer({"model": "llama-3.1-8b", "gpu": "A100-80GB", "quantization": "awq", "vllm_version": "0.10.1"})
    assert (awq["quantization"], awq["vllm_version"]) == ("awq", "0.10.1")
    assert awq["weights_bytes"] < plain["weights_bytes"] and plain["quantization"] is None


def test_a_quantization_that_contradicts_the_checkpoints_own_is_refused_as_vllm_refuses_it(kvlab):
    """qwen3-8b-fp8's config.json names fp8: --quantization awq would size it as 4-bit; vLLM will not start so."""
    config = Path(__file__).parent / "data" / "sizing_configs" / "qwen3-8b-fp8.json"
    r = kvlab("size", config, "--gpu", "h100-sxm", "--quantization", "awq")
    assert r.exit_code == 2 and r.stderr.strip() == (
        "error: --quantization 'awq': qwen3-8b-fp8's config.json names its own weight format, 'fp8', and vLLM refuses "
        "a --quantization that does not match it; valid: fp8 or no --quantization")
    assert kvlab("size", config, "--gpu", "h100-sxm", "--quantization", "fp8").exit_code == 0

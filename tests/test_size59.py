"""Issue 30, size59: the final-logit soft cap in vLLM's profiling run, config.json's integer fields, and the first vLLM
release that registered each architecture kvlab sizes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvlab.catalog import get_gpu, get_model
from kvlab.catalog.config import load_config_path
from kvlab.errors import KvlabError
from kvlab.memory_profile import ProfileInputs, soft_cap_bytes, v2_sampler_run_bytes, with_sampler
from kvlab.sizing import SizingConfig, size_kv_cache

DATA = Path(__file__).parent / "data" / "sizing_configs"

# Gemma 4 E2B's text shape at 1,024 rows (the MI300X log's max_num_seqs), Model Runner V2, TP 1.
GEMMA4 = ProfileInputs(hidden_size=1536, mlp_width_per_gpu=12_288, qkv_width_per_gpu=2560, vocab_size=262_144,
                       num_layers=35, act_dtype_bytes=2, max_num_batched_tokens=16_384, max_num_seqs=1024,
                       tensor_parallel_size=1, last_stage=True, model_runner="v2")


# --- 1. the final-logit soft cap ---------------------------------------------------------------------------------

def test_soft_cap_is_read_from_config_json_and_the_catalogue():
    assert load_config_path(str(DATA / "gemma-4-e2b-it.json")).final_logit_softcapping == 30.0
    assert get_model("gemma-2-9b").final_logit_softcapping == 30.0
    assert get_model("gemma-3-1b-it").final_logit_softcapping is None  # Gemma 3's config writes null
    assert get_model("llama-3.1-8b").final_logit_softcapping is None


def test_soft_cap_holds_the_padded_logits_and_an_unpadded_copy():
    """LogitsProcessor.forward: logits / cap reads the slice of the padded LM-head output (a view), so both are alive;
    tanh and the product each hold two unpadded copies. 1,024 x (262,144 + 262,144) x 2 B; a vocabulary of 32,001
    pads to 32,064."""
    capped = replace(GEMMA4, logit_soft_cap=True)
    assert soft_cap_bytes(GEMMA4, 1024) == 0
    assert soft_cap_bytes(capped, 1024) == 1024 * (262_144 + 262_144) * 2 == 1_073_741_824
    assert soft_cap_bytes(replace(capped, vocab_size=32_001), 8) == 8 * (32_064 + 32_001) * 2


def test_v2_sampler_run_with_a_soft_cap_counts_its_moment():
    """Without a cap the sampler's peak is the logits and the Gumbel-max partials; with one, the padded logits and the
    unpadded copy while it is applied, which is larger (256 blocks x 12 B + 16 B a row is under one copy)."""
    held = (16_384 + 1024) * 1536 * 2
    plain, _ = v2_sampler_run_bytes(GEMMA4, 1024)
    assert plain == held + 1024 * 262_144 * 2 + 1024 * (256 * 12 + 16)
    capped, words = v2_sampler_run_bytes(replace(GEMMA4, logit_soft_cap=True), 1024)
    assert capped == held + 1024 * 262_144 * 2 * 2 == 1_127_219_200
    assert "while the final logits are soft-capped" in words
    # up to 0.25 the float32 copy is taken from the capped (unpadded) logits and outweighs the cap's moment
    old, words = v2_sampler_run_bytes(replace(GEMMA4, logit_soft_cap=True, v2_float32_copy=True), 1024)
    assert old == held + 1024 * 262_144 * (2 + 4) + 1024 * (256 * 12 + 16) and "float32 copy" in words


def test_v1_sampler_keeps_its_fitted_bytes_unless_the_soft_cap_is_larger():
    """The V1 runner's fitted 7.1 B a logit (FlashInfer) holds the logits themselves; the cap's moment is 2 x 2 B a
    logit in bf16, below it, and 2 x 4 B in float32, above it."""
    v1 = replace(GEMMA4, model_runner="v1", sampler="flashinfer", max_num_seqs=256)
    plain, _ = with_sampler(v1, 0.0, "estimate: x")
    size, words = with_sampler(replace(v1, logit_soft_cap=True), 0.0, "estimate: x")
    assert size == plain == int(256 * 262_144 * 7.1)
    assert words.endswith("7.1 B (above the final-logit soft cap's moment (256 x (262,144 padded + 262,144) x 2 B: "
                          "LogitsProcessor.forward divides, takes tanh and multiplies out of place))")
    fp32 = replace(v1, logit_soft_cap=True, act_dtype_bytes=4)
    size, words = with_sampler(fp32, 0.0, "estimate: x")
    assert size == 256 * (262_144 + 262_144) * 4 and "soft cap" in words


def test_gemma4_t4_start_counts_the_soft_cap_and_does_not_move():
    """gemma-4-e2b-it-bf16-t4-0.29.0 runs 8 sequences: the cap's moment is 8 x 524,288 x 2 B = 8 MiB, inside the text
    run's 0.16 GiB forward; the budget, and so the tokens (355,013 against 315,974 printed), do not move."""
    r = size_kv_cache(load_config_path(str(DATA / "gemma-4-e2b-it.json")),
                      SizingConfig.for_gpu(get_gpu("t4"), vllm_version="0.29.0", max_num_seqs=8, max_model_len=16_384,
                                           dtype="float16"))
    activation = {t.name: t for t in r.profile_terms}["peak activation"]
    assert "soft-capped" in activation.source
    assert r.num_tokens == 355_013


def test_a_soft_cap_that_is_not_a_number_is_refused(tmp_path):
    config = json.loads((DATA / "gemma-4-e2b-it.json").read_text())
    config["text_config"]["final_logit_softcapping"] = "30"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(KvlabError, match=r"final_logit_softcapping '30' is not a soft cap; valid: a number above 0"):
        load_config_path(str(path))


# --- 2. config.json's integer fields ----------------------------------------------------------------------------

LLAMA = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
         "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


def write(tmp_path, config: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("value, shown, kind, example", [
    ("32", "'32'", "a string", " such as 32"),
    (True, "True", "a bool", ""),
    (32.0, "32.0", "a decimal number", " such as 32"),
    (32.5, "32.5", "a decimal number", ""),
])
def test_a_layer_count_that_is_not_a_json_integer_is_refused(tmp_path, value, shown, kind, example):
    """trial58 #9: "num_hidden_layers": "32" was read as 32 without a word."""
    with pytest.raises(KvlabError) as exc:
        load_config_path(write(tmp_path, {**LLAMA, "num_hidden_layers": value}))
    assert str(exc.value) == (f"{tmp_path}/config.json: num_hidden_layers {shown} is {kind}, not a whole number written "
                              f"as a JSON integer; valid: a JSON integer{example}, without quotes or a decimal point "
                              "(true and false are not integers)")


def test_nested_integer_fields_are_named_with_their_path(tmp_path):
    config = json.loads((DATA / "gemma-4-e2b-it.json").read_text())
    config["vision_config"]["patch_size"] = "16"
    with pytest.raises(KvlabError, match=r"vision_config\.patch_size '16' is a string"):
        load_config_path(write(tmp_path, config))
    config = json.loads((DATA / "gemma-4-e2b-it.json").read_text())
    config["text_config"]["num_kv_shared_layers"] = 20.0
    with pytest.raises(KvlabError, match=r"text_config\.num_kv_shared_layers 20\.0 is a decimal number"):
        load_config_path(write(tmp_path, config))
    config = {**LLAMA, "quantization_config": {"quant_method": "awq", "bits": "4", "group_size": 128}}
    with pytest.raises(KvlabError, match=r"quantization_config\.bits '4' is a string"):
        load_config_path(write(tmp_path, config))


def test_the_mtp_layer_count_is_refused_not_dropped(tmp_path):
    """Before, a string here was taken as no MTP layers (0) without a word."""
    with pytest.raises(KvlabError, match=r"num_nextn_predict_layers '1' is a string"):
        load_config_path(write(tmp_path, {**LLAMA, "num_nextn_predict_layers": "1"}))


def test_null_and_non_integer_fields_pass(tmp_path):
    """null is a missing field (the readers' defaults), and fields that are not sizes (rope_theta, factor) may be
    fractions."""
    spec = load_config_path(write(tmp_path, {**LLAMA, "head_dim": None, "sliding_window": None, "rope_theta": 500000.0,
                                             "rope_scaling": {"factor": 8.0, "original_max_position_embeddings": 8192}}))
    assert spec.num_hidden_layers == 32 and spec.head_dim == 128


def test_every_shipped_config_holds_json_integers():
    """The catalogue and every config.json in tests/data pass the check (no false refusal)."""
    from kvlab.catalog.models import catalogue_entries, check_integer_fields

    for entry in catalogue_entries():
        check_integer_fields(entry, entry["id"])
    for path in sorted((Path(__file__).parent / "data").rglob("*.json")):
        config = json.loads(path.read_text())
        if isinstance(config, dict) and ("num_hidden_layers" in config or "text_config" in config):
            check_integer_fields(config, str(path))


def test_cli_refuses_a_string_layer_count_with_exit_2(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "kvlab", "size", write(tmp_path, {**LLAMA, "num_hidden_layers": "32"}),
                           "--gpu", "h100-sxm"], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "num_hidden_layers '32' is a string, not a whole number written as a JSON integer" in done.stderr


# --- 3. the first vLLM release that registered each architecture ------------------------------------------------

def test_first_release_by_architecture_and_by_model_type():
    from kvlab.vllm_rules import ARCHITECTURE_FIRST_RELEASE, ARCHITECTURES_IN_0_9_0, first_release

    assert first_release("Qwen3_5ForConditionalGeneration") == ("Qwen3_5ForConditionalGeneration", "0.17.0")
    assert first_release("", "gemma4_text") == ("Gemma4ForCausalLM", "0.19.0")  # a config.json without architectures
    assert first_release("GptOssForCausalLM") == ("GptOssForCausalLM", "0.10.1")
    assert first_release("LlamaForCausalLM") is None and first_release("", "llama") is None
    # one home: no architecture is in both tables, and every catalogue model's architecture is in one
    assert not {a for a, _, _ in ARCHITECTURE_FIRST_RELEASE} & set(ARCHITECTURES_IN_0_9_0)
    from kvlab.catalog.models import list_models

    known = {a for a, _, _ in ARCHITECTURE_FIRST_RELEASE} | set(ARCHITECTURES_IN_0_9_0)
    assert {m.architecture.split()[0] for m in list_models()} <= known


@pytest.mark.parametrize("config, older, since, arch", [
    ("gemma-4-26b-a4b.json", "0.9.0", "0.19.0", "Gemma4ForCausalLM"),
    ("qwen3.6-27b.json", "0.9.0", "0.17.0", "Qwen3_5ForConditionalGeneration"),
    ("gpt-oss-20b.json", "0.10.0", "0.10.1", "GptOssForCausalLM"),
    ("qwen3-next-80b-a3b-instruct.json", "0.10.1.1", "0.10.2", "Qwen3NextForCausalLM"),
])
def test_an_older_version_than_the_architecture_gets_a_note_not_a_refusal(config, older, since, arch):
    from kvlab.sizing import fit_sizing, gpu_notes

    spec = load_config_path(str(DATA / config))
    gpu = get_gpu("h100-sxm")
    before = SizingConfig.for_gpu(gpu, vllm_version=older, tensor_parallel_size=4)
    note = (f"vLLM {older} does not run {arch}: its model registry (vllm/model_executor/models/registry.py) names it "
            f"from {since} on")
    assert gpu_notes(spec, before)[0].startswith(note)
    assert any(n.startswith(note) for n in fit_sizing(spec, before, gpu, True).notes)
    assert size_kv_cache(spec, before).num_blocks > 0  # still sized
    at = SizingConfig.for_gpu(gpu, vllm_version=since, tensor_parallel_size=4)
    assert not any("does not run" in n for n in gpu_notes(spec, at) + list(fit_sizing(spec, at, gpu, True).notes))


def test_a_catalogue_model_older_than_0_9_0_gets_no_note():
    from kvlab.sizing import gpu_notes

    config = SizingConfig.for_gpu(get_gpu("h100-sxm"), vllm_version="0.9.0")
    assert not any("does not run" in n for n in gpu_notes(get_model("llama-3.1-8b"), config))


def test_cli_size_and_fit_print_the_note(tmp_path):
    import subprocess
    import sys

    for command in ("size", "fit"):
        done = subprocess.run([sys.executable, "-m", "kvlab", command, str(DATA / "qwen3.6-27b.json"), "--gpu",
                               "h100-sxm", "--vllm-version", "0.9.0", "--max-model-len", "32768"], capture_output=True, text=True,
                              env={**__import__("os").environ, "COLUMNS": "400"})
        assert done.returncode == 0, done.stderr
        assert "vLLM 0.9.0 does not run Qwen3_5ForConditionalGeneration" in done.stdout

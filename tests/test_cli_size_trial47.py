"""`kvlab size`: the findings of trial 47 (a new user's run), each with the exact line it now prints."""

from __future__ import annotations

from pathlib import Path

import pytest


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_tensor_parallel_sizes_follow_vllms_kv_head_and_mlp_rules(kvlab):
    from kvlab.catalog import get_model
    from kvlab.sizing import tensor_parallel_refusal, valid_tensor_parallel_sizes

    qwen = get_model("qwen2.5-0.5b-instruct")  # 14 heads, 2 KV heads, intermediate_size 4864
    assert valid_tensor_parallel_sizes(qwen) == [1, 2]
    assert "2 KV heads" in tensor_parallel_refusal(qwen, 7)
    assert "intermediate_size 4864" in tensor_parallel_refusal(qwen, 14)  # 14 replicates the 2 KV heads, 4864/14 no
    assert valid_tensor_parallel_sizes(get_model("opt-13b")) == [1, 2, 4, 5, 8, 10, 20, 40]
    r = kvlab("size", "qwen2.5-0.5b-instruct", "--gpu", "t4", "-tp", "7")
    assert r.exit_code == 2
    assert _one_line(r.stderr) == (
        "error: the 2 KV heads of qwen2.5-0.5b-instruct can be neither split nor replicated evenly over tensor "
        "parallel size (7): vLLM needs 7 to divide 2 or be a multiple of it; valid --tensor-parallel-size: 1, 2")
    assert kvlab("size", "qwen2.5-0.5b-instruct", "--gpu", "t4", "-tp", "2").exit_code == 0


def test_moe_expert_width_must_divide_by_tensor_parallel_size(kvlab):
    from kvlab.catalog import get_model
    from kvlab.sizing import tensor_parallel_refusal, valid_tensor_parallel_sizes

    scout = get_model("llama-4-scout-17b-fp8")  # 40 heads, 8 KV heads, expert intermediate_size 8192
    assert valid_tensor_parallel_sizes(scout) == [1, 2, 4, 8]
    assert tensor_parallel_refusal(scout, 8) is None
    r = kvlab("size", "llama-4-scout-17b-fp8", "--gpu", "h100-sxm", "-tp", "40")
    assert r.exit_code == 2 and _one_line(r.stderr) == (
        "error: the expert width (8192) of llama-4-scout-17b-fp8 must be divisible by tensor parallel size (40): "
        "vLLM's FusedMoE splits each expert's intermediate_size over the TP ranks; valid --tensor-parallel-size: "
        "1, 2, 4, 8")


def test_quantization_none_and_auto_mean_no_quantization(kvlab):
    plain = kvlab("size", "llama-3.1-8b", "--gpu", "l4", "--json").json()
    assert plain["num_blocks"] == 1959 and plain["quantization"] is None
    for spelling in ("none", "None", "auto"):
        r = kvlab("size", "llama-3.1-8b", "--gpu", "l4", "-q", spelling, "--json")
        assert r.exit_code == 1, r.stderr  # (1,959 blocks hold no 131,072-token request: vLLM would refuse to start)
        assert r.json()["num_blocks"] == 1959 and r.json()["quantization"] is None
    bad = kvlab("size", "llama-3.1-8b", "--gpu", "l4", "-q", "foo")
    assert bad.exit_code == 2 and "or none (no --quantization: the checkpoint's own format" in _one_line(bad.stderr)


def test_an_explicit_bfloat16_below_compute_capability_8_is_refused_as_vllm_refuses_it(kvlab):
    # vLLM's worker (_check_if_gpu_supports_dtype): "Bfloat16 is only supported on GPUs with compute capability of at
    # least 8.0"; --dtype auto falls back instead (the next test), an A100 (8.0) takes bfloat16.
    for args in (("size", "qwen2.5-1.5b", "--gpu", "t4"), ("run", "vllm", "-n", "5", "--model", "qwen2.5-1.5b",
                                                           "--gpu", "t4")):
        refused = kvlab(*args, "--dtype", "bfloat16")
        assert refused.exit_code == 2 and refused.stdout == ""
        assert _one_line(refused.stderr) == ("error: --dtype bfloat16: T4 has compute capability 7.5 and vLLM runs "
                                             "bfloat16 only from 8.0; valid: float16 or float32 (or auto: float16 "
                                             "here)")
    gemma = kvlab("size", "gemma-2-9b", "--gpu", "t4", "--dtype", "bfloat16")
    assert gemma.exit_code == 2 and "valid: float32 (or auto: float32 here)" in _one_line(gemma.stderr)
    a100 = kvlab("size", "qwen2.5-1.5b", "--gpu", "a100-40gb", "--dtype", "bfloat16", "--json")
    assert a100.exit_code == 0 and a100.json()["dtype"] == "bfloat16"


def test_bfloat16_on_a_t4_is_served_in_float16_with_a_note(kvlab):
    t4 = kvlab("size", "qwen2.5-1.5b", "--gpu", "t4", "--json").json()
    assert (t4["dtype"], t4["kv_cache_dtype"], t4["num_blocks"]) == ("float16", "float16", 22_148)
    assert t4["gpu_notes"] == ["T4 (compute capability 7.5) has no bfloat16: vLLM serves the bfloat16 checkpoint in "
                               "float16 (2 bytes a value as well, so no number here changes)"]
    text = _one_line(kvlab("size", "qwen2.5-1.5b", "--gpu", "t4").stdout)
    assert "· float16 · KV float16 ·" in text and "note: T4 (compute capability 7.5) has no bfloat16" in text
    l4 = kvlab("size", "gemma-3-1b-it", "--gpu", "l4", "--json").json()
    assert l4["dtype"] == "bfloat16" and l4["gpu_notes"] == []


def test_gemma_on_a_t4_is_served_in_float32_as_vllm_refuses_float16_for_it(kvlab):
    t4 = kvlab("size", "gemma-3-1b-it", "--gpu", "t4", "--json").json()
    explicit = kvlab("size", "gemma-3-1b-it", "--gpu", "t4", "--dtype", "float32", "--json").json()
    assert (t4["dtype"], t4["kv_cache_dtype"], t4["kv_bytes_per_token"]) == ("float32", "float32", 53_248)
    assert t4["num_blocks"] == explicit["num_blocks"]
    assert t4["gpu_notes"] == ["T4 (compute capability 7.5) has no bfloat16: vLLM serves the bfloat16 checkpoint in "
                               "float32, as vLLM runs model type 'gemma3_text' in neither float16 nor bfloat16 here "
                               "(4 bytes a value: weights and KV cache double)"]
    for dtype in ("float16", "half"):
        bad = kvlab("size", "gemma-3-1b-it", "--gpu", "a100-40gb", "--dtype", dtype)
        assert bad.exit_code == 2 and _one_line(bad.stderr) == (
            f"error: --dtype {dtype}: vLLM refuses float16 for model type 'gemma3_text' (gemma-3-1b-it; numerical "
            "instability); valid: auto, bfloat16, float32, float")
    assert kvlab("size", "gemma-2-9b", "--gpu", "a100-40gb", "--dtype", "float16").exit_code == 2


def test_fp8_weights_below_compute_capability_8_are_noted(kvlab):
    notes = kvlab("size", "gemma-3-1b-it", "--gpu", "t4", "-q", "fp8", "--json").json()["gpu_notes"]
    assert notes[1] == ("fp8 weights need compute capability 8.0 in older vLLM releases (Fp8Config.get_min_capability: "
                        "start-up refuses T4, 7.5) and 7.5 in recent ones (weight-only FP8 through Marlin): check yours")
    assert kvlab("size", "gemma-3-1b-it", "--gpu", "a100-40gb", "-q", "fp8", "--json").json()["gpu_notes"] == []


def test_mxfp4_on_a_dense_model_says_it_changes_nothing(kvlab):
    plain = kvlab("size", "llama-3.1-8b", "--gpu", "l4", "--json").json()
    mx = kvlab("size", "llama-3.1-8b", "--gpu", "l4", "-q", "mxfp4")
    assert mx.exit_code == 1, mx.stderr  # (as without -q: no 131,072-token request fits, vLLM would refuse to start)
    text = _one_line(mx.stdout)
    assert ("llama-3.1-8b has no routed experts, so --quantization mxfp4 changes nothing: vLLM quantizes only MoE "
            "expert layers with it and keeps every weight here in the model dtype") in text
    assert "routed experts: 4 bits" not in text
    assert kvlab("size", "llama-3.1-8b", "--gpu", "l4", "-q", "mxfp4", "--json").json()["weights_bytes"] == \
        plain["weights_bytes"]


def test_the_utilization_hint_is_the_smallest_that_starts(kvlab):
    r = kvlab("size", "opt-13b", "--gpu", "a100-40gb", "--gpu-memory-utilization", "0.01")
    assert r.exit_code == 2
    assert _one_line(r.stderr).endswith("Would fit: --gpu-memory-utilization 0.68 or more (the default 0.9 fits)")
    args = ("size", "opt-13b", "--gpu", "a100-40gb", "--json", "--gpu-memory-utilization")
    assert kvlab(*args, "0.68").json()["fits_max_model_len"]  # the advice taken: vLLM starts
    assert not kvlab(*args, "0.67").json()["fits_max_model_len"]  # and a hundredth less would not


@pytest.mark.parametrize("command", [("size", "opt-13b"), ("run", "vllm", "-n", "10")])
def test_errors_name_the_gpu_memory_override(kvlab, command):
    r = kvlab(*command, "--gpu", "a100-80gb", "--gpu-memory-gib", "20")
    assert r.exit_code == 2
    assert _one_line(r.stderr).startswith("error: opt-13b does not fit on A100-80GB with --gpu-memory-gib 20: its "
                                          "weights (float16) need 23.94 GiB per GPU but 20.0 GiB x 0.9 = 18.0 GiB is requested")


def test_a_path_that_is_neither_file_nor_folder_is_named_so(kvlab):
    r = kvlab("size", "/dev/null")
    assert r.exit_code == 2
    assert _one_line(r.stderr) == ("error: '/dev/null' is not a regular file or folder (a device, pipe or socket); use "
                                   "a model from the catalogue (`kvlab models`), or give a local config.json or a "
                                   "folder holding one")
    assert "no such file '/no/such/config.json'" in _one_line(kvlab("size", "/no/such/config.json").stderr)


def test_workload_lines_agree_in_number_and_wrap_indented(kvlab):
    r = kvlab("size", "opt-13b", "--gpu", "a100-40gb", "--context-len", "3")
    assert r.exit_code == 0, r.stderr
    workload = r.stdout[r.stdout.index("Workload:"):].splitlines()
    assert all(line.startswith("  ") and line == line.rstrip() for line in workload[1:])  # continuation lines too
    text = _one_line("\n".join(workload))
    assert "needs 1 block (1 x 1) = 0.01 GiB per GPU; the cache holds 863 usable blocks" in text
    assert "at 3 tokens at most 863 requests fit; 1 request fits up to 2,048 tokens each" in text
    many = _one_line(kvlab("size", "opt-13b", "--gpu", "a100-40gb", "--context-len", "3", "--concurrency", "2000").stdout)
    assert "does not fit: 1,137 blocks (13.88 GiB) short" in many
    assert "at most 863 requests fit; 2,000 requests do not fit at any length" in many


def test_a10g_takes_its_cuda_reported_total(kvlab):
    from kvlab.catalog import get_gpu

    a10g = get_gpu("a10g")
    assert (a10g.memory_bytes, a10g.memory_bytes_source) == (round(22.49 * 2**30), "cuda_reported_observed")
    assert "AUTOMATIC1111/stable-diffusion-webui#1259" in a10g.source[0]
    assert kvlab("size", "llama-3.1-8b", "--gpu", "a10g", "--json").json()["gpu_notes"] == []


def test_a_marketing_total_is_warned_with_how_far_it_may_overstate():
    """No catalogue card is on its label now (H100-PCIe and MI300X took their CUDA-reported totals); the rule stays
    for a card added on its label, checked here on MI300X as it was catalogued before."""
    from dataclasses import replace

    from kvlab.catalog import get_gpu
    from kvlab.catalog.gpus import marketing_label_warning

    mi300x = get_gpu("mi300x")
    assert marketing_label_warning(mi300x) is None
    labelled = replace(mi300x, memory_bytes=192 * 2**30, memory_bytes_source="marketing_label")
    assert marketing_label_warning(labelled) == (
        "MI300X's 192 GiB is its marketing label read as GiB (no CUDA-reported total known); CUDA reports 0.8% to "
        "1.3% less than the label on the catalogue's other HBM cards, so the total may be up to 2.4 GiB too high, and "
        "the KV cache budget with it")


def test_h100_pcie_and_mi300x_take_their_cuda_reported_totals(kvlab):
    """Trial 48 left H100-PCIe at its 80 GB label; torch reports 81,008 MiB on one, as on the SXM card."""
    from kvlab.catalog import get_gpu

    pcie, sxm = get_gpu("h100-pcie"), get_gpu("h100-sxm")
    assert (pcie.memory_bytes, pcie.memory_bytes_source) == (81008 * 2**20, "cuda_reported_observed")
    assert round(pcie.memory_bytes / 2**30, 2) == round(sxm.memory_bytes / 2**30, 2) == 79.11
    assert kvlab("size", "llama-3.1-8b", "--gpu", "h100-pcie", "--json").json()["gpu_notes"] == []
    mi300x = get_gpu("mi300x")
    assert (mi300x.memory_bytes, mi300x.memory_bytes_source) == (196592 * 2**20, "cuda_reported_observed")


def test_a_model_too_big_says_the_dtype_its_weights_are_held_in(kvlab):
    """Trial 49: gemma-2-9b on a T4 'needs 34.44 GiB' (17.22 on an L4) without a word that it is float32 there."""
    text = _one_line(kvlab("size", "gemma-2-9b", "--gpu", "t4").stderr)
    assert text.startswith("error: gemma-2-9b does not fit on T4: its weights (float32) need 34.44 GiB per GPU")
    assert "vLLM serves the bfloat16 checkpoint in float32" in text
    assert "its weights (bfloat16) need" in _one_line(kvlab("size", "gemma-2-9b", "--gpu", "l4",
                                                            "--gpu-memory-gib", "10").stderr)


def test_quantization_none_on_a_quantized_checkpoint_is_said_as_vllm_reads_its_config(kvlab):
    # vLLM's ModelConfig._verify_quantization reads config.json's quantization_config whatever --quantization says
    # (no method given: the checkpoint's), so none neither refuses nor unquantizes: a note, and the fp8 sizing.
    path = Path(__file__).parent / "data" / "sizing_configs" / "qwen3-8b-fp8.json"
    note = ("--quantization none: qwen3-8b-fp8 is a quantized checkpoint (fp8, its config.json's quantization_config), "
            "and vLLM reads that whatever --quantization says, so it is served and sized in fp8, not unquantized")
    plain = kvlab("size", path, "--gpu", "l4", "--max-model-len", "8192", "--json")
    assert plain.exit_code == 0 and plain.json()["quantization_note"] is None
    text = kvlab("size", path, "--gpu", "l4", "--max-model-len", "8192", "-q", "none")
    assert text.exit_code == 0 and f"note: {note}" in _one_line(text.stderr)
    data = kvlab("size", path, "--gpu", "l4", "--max-model-len", "8192", "-q", "none", "--json").json()
    assert data["quantization_note"] == note and data["weights_bytes"] == plain.json()["weights_bytes"]
    fit = kvlab("fit", path, "--gpu", "l4", "-q", "none", "--json").json()
    assert fit["quantization_note"] == note
    run = kvlab("run", "vllm", "-n", "5", "--model", path, "--gpu", "l4", "--max-model-len", "8192",
                "--quantization", "none")
    assert run.exit_code == 0 and f"note: {note}" in _one_line(run.stdout + run.stderr)
    unquantized = kvlab("size", "llama-3.1-8b", "--gpu", "l4", "--max-model-len", "8192", "-q", "none", "--json")
    assert unquantized.json()["quantization_note"] is None


def test_the_title_names_the_weights_format_as_vllms_config_line_does(kvlab):
    """Trial 50: `size ... --quantization fp8` said "bfloat16 · KV bfloat16" in its title, fp8 only in the Weights
    row; a checkpoint's own format (DeepSeek-V3's FP8 blocks) is named the same way, an unquantized one not at all."""
    asked = _one_line(kvlab("size", "llama-3.1-70b", "--gpu", "h100-sxm", "--quantization", "fp8", "-tp", "2").stdout)
    assert "· bfloat16 · quantization fp8 · KV bfloat16 ·" in asked
    own = _one_line(kvlab("size", "deepseek-v3", "--gpu", "h200", "-tp", "8").stdout)
    assert "· bfloat16 · quantization fp8 · KV bfloat16 ·" in own
    plain = _one_line(kvlab("size", "opt-13b", "--gpu", "a100-40gb").stdout)
    assert "· float16 · KV float16 ·" in plain and "quantization" not in plain.split("\n")[0][:200]

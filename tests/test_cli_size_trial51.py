"""`kvlab fit` and `kvlab size`: the findings of trial 51 (a user's run of the sizing calculator), each with the
line it now prints."""

from __future__ import annotations

import pytest


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_fit_gives_the_refusal_no_gpu_count_changes(kvlab):
    """A --block-size larger than --max-model-len is refused at every TP: fit said 'does not fit on up to 32 x L4
    ... lower --max-model-len', size gave the real reason; now both give it, in the same line."""
    args = ("llama-3.1-8b", "--gpu", "l4", "--max-model-len", "8")
    size, fit = kvlab("size", *args), kvlab("fit", *args)
    assert fit.exit_code == size.exit_code == 2 and fit.stdout == ""
    assert fit.stderr == size.stderr and "--block-size 16 is larger than --max-model-len 8" in fit.stderr
    assert "does not fit" not in fit.stderr and "valid: --max-model-len 16 or more, or a --block-size of at most 8" in fit.stderr


@pytest.mark.parametrize("dcp, why", [
    ("8", "and even its largest tensor-parallel size, 32, takes at most 4"),
    ("32", "and even its largest tensor-parallel size, 32, takes at most 4"),
    ("3", "no tensor-parallel size vLLM accepts for llama-3.1-8b (1, 2, 4, 8, 16, 32) is a multiple of 3"),
])
def test_fit_names_the_dcp_sizes_the_model_can_use(kvlab, dcp, why):
    """Llama-3.1-8B fits one H100; its 8 KV heads limit DCP to TP // 8, so 4 at TP 32: fit said 'does not fit on up
    to 32 x H100-SXM' (DCP 8, 32) or named a --tensor-parallel-size 32 never given (DCP 3)."""
    r = kvlab("fit", "llama-3.1-8b", "--gpu", "h100-sxm", "-dcp", dcp)
    line = _one_line(r.stderr)
    assert r.exit_code == 2 and line.startswith(f"error: -dcp {dcp}: ") and why in line
    assert line.endswith("valid -dcp for llama-3.1-8b: 1, 2, 4")
    assert "does not fit" not in line and "--tensor-parallel-size 32" not in line


def test_fit_refuses_dcp_0_by_its_own_name(kvlab):
    size = kvlab("size", "llama-3.1-8b", "--gpu", "h100-sxm", "-dcp", "0")
    fit = kvlab("fit", "llama-3.1-8b", "--gpu", "h100-sxm", "-dcp", "0")
    assert fit.exit_code == 2 and fit.stderr == size.stderr
    assert "decode_context_parallel_size must be at least 1, got 0 (-dcp" in fit.stderr


def test_valid_dcp_sizes_follow_the_kv_heads_or_mla():
    from kvlab.catalog import get_model
    from kvlab.sizing import valid_decode_context_parallel_sizes

    assert valid_decode_context_parallel_sizes(get_model("llama-3.1-8b")) == [1, 2, 4]  # 8 KV heads, TP up to 32
    # MLA keeps one latent on every rank: any divisor of a TP size it takes
    mla = get_model("deepseek-v2-lite")
    assert valid_decode_context_parallel_sizes(mla)[-1] == mla.num_attention_heads


def test_fit_caps_the_longest_context_at_the_given_max_model_len(kvlab):
    """--max-model-len 4096 on an H100: fit answered 131,072 tokens (the model's limit), which vLLM would reject."""
    r = kvlab("fit", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len", "4096")
    assert r.exit_code == 0, r.stderr
    assert ("Longest context for 1 concurrent request: 4,096 tokens (the --max-model-len given: vLLM rejects a "
            "longer request; the model takes up to 131,072)") in _one_line(r.stdout)
    data = kvlab("fit", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len", "4096", "--json").json()
    assert data["max_context_len"]["context_len"] == 4096 and data["max_context_len"]["capped_by"] == "max_model_len"


def test_a_context_beyond_the_model_names_the_models_limit(kvlab):
    """--context-len 200000 said 'raise --max-model-len, up to 131,072': no --max-model-len reaches 200,000."""
    r = kvlab("fit", "llama-3.1-8b", "--gpu", "h100-sxm", "--context-len", "200000")
    line = _one_line(r.stderr)
    assert r.exit_code == 2 and "raise --max-model-len" not in line
    assert line == ("error: context length 200,000 exceeds max_model_len 131,072 of llama-3.1-8b: vLLM rejects such "
                    "requests (no --max-model-len reaches it: 131,072, the model's max_position_embeddings, is the "
                    "most vLLM takes; valid: a context length of at most 131,072)")
    r = kvlab("fit", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len", "4096", "--context-len", "8192")
    assert r.exit_code == 2 and "(raise --max-model-len, up to 131,072)" in _one_line(r.stderr)


def test_an_fp8_e5m2_kv_cache_on_a_t4_is_refused_in_its_own_words(kvlab):
    """vLLM's Triton guard refuses every fp8* KV cache below compute capability 8.9 (kv_cache_dtype.startswith("fp8"))
    in words that name e4m3's type (fp8e4nv): the refusal of fp8_e5m2 says it is included."""
    r = kvlab("size", "llama-3.2-1b", "--gpu", "t4", "--kv-cache-dtype", "fp8_e5m2", "--vllm-version", "0.32.0")
    line = _one_line(r.stderr)
    assert r.exit_code == 2 and ("only from compute capability 8.9 (fp8_e5m2 included: its check refuses every fp8 "
                                 "dtype, though its message, \"native FP8 (fp8e4nv) requires SM89+\", names e4m3's "
                                 "Triton type)") in line
    e4m3 = _one_line(kvlab("size", "llama-3.2-1b", "--gpu", "t4", "--kv-cache-dtype", "fp8_e4m3").stderr)
    assert "(\"native FP8 (fp8e4nv) requires SM89+\")" in e4m3 and "fp8_e5m2 included" not in e4m3


def test_a_bfloat16_kv_cache_on_a_t4_before_0_24_is_taken(kvlab):
    """Checked in vLLM's source (sizing.py's TRITON_ONLY note): before 0.24.0 nothing refuses a bfloat16 KV cache on
    compute capability 7.5 (only Triton's backends guard it, and FlashInfer ran there); from 0.24.0 Triton's does."""
    assert kvlab("size", "llama-3.2-1b", "--gpu", "t4", "--kv-cache-dtype", "bfloat16",
                 "--vllm-version", "0.23.0").exit_code == 0
    assert kvlab("size", "llama-3.2-1b", "--gpu", "t4", "--kv-cache-dtype", "bfloat16",
                 "--vllm-version", "0.24.0").exit_code == 2



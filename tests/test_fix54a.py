"""Trial 54 (a fresh clone's user trial), fix54a: the log reader's lesson on hybrid models counts their KV cache groups
and block size as `kvlab size` does; the speculative options are one declaration for size, fit and run, a number of
draft tokens without a method is refused, the default follows vLLM's rule; vLLM's int() forms ('2_048') are taken
for the engine's whole numbers; `kvlab run` counts an MTP drafter's layers in the pool as `kvlab size` does."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlab.errors import KvlabError
from kvlab.vllm.log import explain_vllm_log, parse_vllm_log

LOGS = Path(__file__).parent / "data" / "startup_logs"
CONFIGS = Path(__file__).parent / "data" / "sizing_configs"


def _lesson(log: str, model: str | None = None) -> str:
    return " ".join(explain_vllm_log(parse_vllm_log((LOGS / log).read_text()), model)["lines"])


# --- 1. gpt-oss-120b's log: two KV cache groups ------------------------------------------------------------------

def test_the_gpt_oss_lesson_counts_both_groups_as_kvlab_size_does(kvlab):
    """The lesson said '2,578 fit at once' at 2,048 tokens (one group's 128 blocks) where `kvlab size` says 1,284
    (257 blocks: 129 sliding-window + 128 full-attention), and '5,280,288 tokens' for what are token slots of two
    groups: 330,018 blocks of 16 tokens hold 2,640,144 tokens in each group."""
    text = _lesson("gpt-oss-120b-4xa100-80gb-ray-0.10.1.1.log")
    size = kvlab("size", "gpt-oss-120b", "--gpu", "A100-80GB", "-tp", "4", "--max-model-len", "16384",
                 "--vllm-version", "0.10.1", "--available-kv-gib", "45.32", "--context-len", "2048", "--json")
    assert size.exit_code == 0, size.stderr
    most = size.json()["workload"]["max_num_requests"]
    assert most == 1284
    assert f"at 2,048 tokens (257 blocks: sliding-window 129 + full-attention 128) each, {most:,} fit at once" in text
    assert "5,280,288" not in text and "2,578" not in text
    assert "at about 18.0 KiB of keys and values per token it holds 2,640,144 tokens" in text
    assert "330,018 // 2 groups x 16 = 2,640,144 tokens" in text
    assert "takes 1,161 blocks (sliding-window 137 + full-attention 1,024" in text
    assert "330,018 / 1,161 = 284.25 such conversations fit at once: that is vLLM's" in text


# --- 2. the Qwen3.6 MTP log: a hybrid's blocks of 1,600 tokens ---------------------------------------------------

def test_the_qwen3_6_mtp_lesson_uses_the_hybrids_block_of_1600_tokens():
    """With the model known, the lesson's blocks are the hybrid's (1,600 tokens: vLLM grows the attention block until
    its page holds a Gated DeltaNet state), its conversations 179 blocks (164 full-attention + 3 state groups x 5:
    the log's MTP drafter with 3 draft tokens and prefix caching), as index.json's note works them out: 424 blocks."""
    text = _lesson("qwen3.6-27b-int4-2xrtx3090-x4x4-p2p-on-mtp.log", str(CONFIGS / "qwen3.6-27b.json"))
    assert "blocks of 16 tokens" not in text and "block_size 16 assumed" not in text
    assert "the cache itself is 424 blocks of 1,600 tokens" in text
    assert "takes 179 blocks (state (linear attention or Mamba) 3 x 5 + full-attention 164" in text
    assert "424 / 179 = 2.37 such conversations fit at once: that is vLLM's" in text
    # Without the model the block size stays vLLM's default, said to be assumed.
    assert "block_size 16 assumed" in _lesson("qwen3.6-27b-int4-2xrtx3090-x4x4-p2p-on-mtp.log")


def test_the_log_reader_sizes_the_logs_speculative_config():
    """The log's arguments' speculative_config (mtp, 3 tokens) reaches kvlab's sizing: the MTP layer's blocks."""
    out = explain_vllm_log(parse_vllm_log((LOGS / "qwen3.6-27b-int4-2xrtx3090-x4x4-p2p-on-mtp.log").read_text()),
                           str(CONFIGS / "qwen3.6-27b.json"))
    assert (out["kvlab"]["block_size"], out["kvlab"]["blocks_per_request"]) == (1600, 179)


# --- 3, 4, 5. the speculative options ------------------------------------------------------------------------------

def test_fit_takes_the_speculative_options_as_size_does(kvlab):
    args = ("fit", "deepseek-v3", "--gpu", "H200", "-tp", "8", "--json")
    plain, mtp = kvlab(*args).json(), kvlab(*args, "--speculative-method", "mtp", "--num-speculative-tokens", "1").json()
    assert mtp["sizing"]["kv_bytes_per_token"] == plain["sizing"]["kv_bytes_per_token"]
    assert mtp["sizing"]["num_tokens"] < plain["sizing"]["num_tokens"]  # (the MTP layer's cache and weights)
    refused = kvlab("fit", "deepseek-v3", "--gpu", "H200", "--speculative-method", "eagle")
    assert refused.exit_code == 2 and "valid: ngram, mtp" in refused.stderr


@pytest.mark.parametrize("args, valid", [
    (("size", "llama-3.1-8b", "--gpu", "H100-SXM"), "ngram or mtp"),
    (("fit", "llama-3.1-8b", "--gpu", "H100-SXM"), "ngram or mtp"),
    (("run", "vllm", "-n", "5"), "ngram, draft_model, eagle or mtp"),
])
@pytest.mark.parametrize("tokens", ["3", "2"])
def test_draft_tokens_without_a_method_are_refused(kvlab, args, valid, tokens):
    """--num-speculative-tokens without --speculative-method was ignored (size, fit; run too when it equalled the
    old default, 3)."""
    r = kvlab(*args, "--num-speculative-tokens", tokens)
    assert r.exit_code == 2 and "Traceback" not in r.stderr, r.stderr
    said = " ".join(r.stderr.split())
    assert f"--num-speculative-tokens {tokens} needs --speculative-method" in said
    assert f"valid: --speculative-method {valid} with it, or neither" in said


def test_the_draft_tokens_default_is_the_models_mtp_layers_with_mtp():
    """vLLM's SpeculativeConfig.num_speculative_tokens 'will default to the number in the draft model config if
    present' (n_predict: num_nextn_predict_layers, or mtp_num_hidden_layers); no method has a default of 3."""
    from kvlab.config.options import OPTIONS, OTHER_DRAFT_TOKENS, draft_tokens_per_step

    assert OPTIONS["num_speculative_tokens"].default is None
    assert draft_tokens_per_step("mtp", None, 1, "mtp") == 1
    assert draft_tokens_per_step("mtp", 4, 1, "mtp") == 4
    assert draft_tokens_per_step("ngram", None, 0, "ngram") == OTHER_DRAFT_TOKENS
    assert draft_tokens_per_step(None, None, 1, "mtp") is None
    with pytest.raises(KvlabError, match="needs --speculative-method"):
        draft_tokens_per_step(None, 3, 1, "mtp")
    assert "vLLM's documented default" in OPTIONS["num_speculative_tokens"].default_text


# --- 6. vLLM's int() forms -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag, given, key, number", [
    ("--max-model-len", "2_048", "max_model_len", 2048),
    ("--max-model-len", "+2048", "max_model_len", 2048),
    ("--max-model-len", "2K", "max_model_len", 2048),
    ("--max-num-seqs", "1_6", "max_num_seqs", 16),
    ("--max-num-batched-tokens", "4_096", "max_num_batched_tokens", 4096),
])
def test_the_engines_whole_numbers_take_what_vllm_reads(kvlab, flag, given, key, number):
    """`vllm serve --max-model-len 2_048` runs (human_readable_int ends in int(), which reads '2_048'); kvlab refused
    it. Its own options stay digits only (--num-requests 5_0 is refused: tests/test_cli_errors.py)."""
    r = kvlab("size", "llama-3.1-8b", "--gpu", "H100-SXM", flag, given, "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()[key] == number


def test_run_takes_2_048_and_refuses_what_vllm_refuses(kvlab):
    assert kvlab("run", "vllm", "-n", "5", "--max-model-len", "2_048", "--json").exit_code == 0
    r = kvlab("run", "vllm", "-n", "5", "--max-model-len", "2_048.0")
    assert r.exit_code == 2 and "not a whole number" in r.stderr


# --- 7. kvlab run's pool with an MTP drafter -----------------------------------------------------------------------

def test_run_counts_the_mtp_layers_in_the_pool_as_size_does():
    """`kvlab run` with Qwen3.6 and MTP sized its pool without the MTP layer; now the same sizing as `kvlab size`
    (kvlab.sizing.speculative_layers, via the config's speculative options)."""
    from kvlab.catalog import get_gpu, get_model
    from kvlab.config import resolve
    from kvlab.sizing import SizingConfig, size_kv_cache

    model = str(CONFIGS / "qwen3.6-27b.json")
    settings = dict(model=model, gpu="h100-sxm", max_model_len=32768, vllm_version="0.24.0")
    plain = resolve(**settings)
    mtp = resolve(**settings, speculative_method="mtp", num_speculative_tokens=3, spec_acceptance="0.7")
    expected = size_kv_cache(get_model(model), SizingConfig.for_gpu(
        get_gpu("h100-sxm"), max_model_len=32768, vllm_version="0.24.0", speculative_method="mtp",
        num_speculative_tokens=3))
    assert (mtp.sizing.num_blocks, mtp.sizing.blocks_per_request) == (expected.num_blocks, expected.blocks_per_request)
    assert mtp.sizing.num_blocks < plain.sizing.num_blocks  # (the MTP layer's blocks)
    assert mtp.speculative.num_speculative_tokens == 3


def test_runs_mtp_refusal_names_qwen3_5s_field(kvlab):
    r = kvlab("run", "vllm", "-n", "5", "--speculative-method", "mtp", "--spec-acceptance", "0.7")
    assert r.exit_code == 2
    assert "neither num_nextn_predict_layers nor mtp_num_hidden_layers" in " ".join(r.stderr.split())

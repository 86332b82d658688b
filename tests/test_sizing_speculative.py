"""A speculative config in the sizing (vLLM's --speculative-config): an MTP drafter's layers in the KV cache and its
weights, and a hybrid's state blocks per request, at exact bytes and blocks on real config.json files
(tests/data/sizing_configs/, README.md there gives their sources). The rules were read in vLLM's source archives:
layers/mamba/abstract.py get_kv_cache_spec, v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes,
models/config.py MambaModelConfig, models/qwen3_5_mtp.py and v1/spec_decode/llm_base_proposer.py (0.16.0 to 0.24.0).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlab.catalog import get_gpu, get_model
from kvlab.errors import KvlabError
from kvlab.sizing import SizingConfig, cdiv, size_kv_cache

GIB = 2**30
DATA = Path(__file__).parent / "data" / "sizing_configs"
MTP3 = dict(speculative_method="mtp", num_speculative_tokens=3)
# The club-3090 dual-3090 settings of the corpus logs qwen3.6-27b-int4-2xrtx3090-* (their non-default args)
DUAL_3090 = dict(tensor_parallel_size=2, dtype="float16", kv_cache_dtype="fp8_e5m2", max_model_len=262144,
                 max_num_seqs=2, max_num_batched_tokens=8192, quantization="auto-round", enable_prefix_caching=True)


def given(gpu: str, available_bytes: int, **settings) -> SizingConfig:
    return SizingConfig.for_gpu(get_gpu(gpu), available_kv_bytes=available_bytes, **settings)


def test_mtp_drafter_and_speculative_state_blocks_on_qwen3_6_27b():
    """The MTP layer is a 17th full-attention layer; the Gated DeltaNet conv state keeps 3 more rows; each state
    group holds 2 + 3 blocks a request ('align' mode, which prefix caching selects for Qwen3.5)."""
    model = get_model(str(DATA / "qwen3.6-27b.json"))
    assert model.num_nextn_predict_layers == 1  # config.json's mtp_num_hidden_layers
    conv = (2 * 16 * 128 + 48 * 128) // 2  # conv channels per GPU at TP 2
    assert model.state.state_bytes(2, 2, 3) == conv * (3 + 3) * 2 + 24 * 128 * 128 * 4 == 1_634_304
    per_token = 2 * 2 * 256 * 1  # K and V x 4 KV heads / TP 2 x head_dim 256 x fp8
    block = 16 * cdiv(1_634_304, 16 * per_token)
    assert block == 1600
    page, bpb = block * per_token, 17 * block * per_token  # groups of 17 layers: 16 target + 1 MTP full attention
    # Corpus log qwen3.6-27b-int4-2xrtx3090-x4x4-p2p-on-mtp (vLLM 0.22.0 by its source lines): 620,944 tokens, 2.37x
    # is int(424 / 179 x 262,144): 424 blocks
    r = size_kv_cache(model, given("rtx-3090", 424 * bpb, vllm_version="0.22.0", **DUAL_3090, **MTP3))
    assert r.block_size == block and r.page_size_bytes == page and r.bytes_per_block == bpb
    assert sorted(len(g.layers) for g in r.kv_cache_groups) == [16, 16, 16, 17]  # 48 linear layers padded to 3 x 17
    assert r.blocks_per_request == cdiv(262144, 1600) + 3 * (2 + 3) == 179
    assert (r.num_blocks, r.num_tokens, f"{r.max_concurrency:.2f}") == (424, 620_944, "2.37")
    # ... and its P2P-off twin: 622,408 tokens is 425 blocks
    assert size_kv_cache(model, given("rtx-3090", 425 * bpb, vllm_version="0.22.0", **DUAL_3090, **MTP3)
                         ).num_tokens == 622_408
    # Corpus log qwen3.6-27b-int4-2xrtx3090-0.24 (0.24.0): 'Available KV cache memory: 11.05 GiB', 623,873 tokens =
    # int(426 / 179 x 262,144); 11.05 GiB as printed holds 425 blocks, 426 need 11.0504 (the print's rounding)
    at_print = size_kv_cache(model, given("rtx-3090", round(11.05 * GIB), vllm_version="0.24.0", **DUAL_3090, **MTP3))
    assert at_print.num_blocks == 425 and 426 * bpb / GIB < 11.055
    # without the drafter: 16-layer groups, blocks of 1,568 tokens, one state block a request
    plain = size_kv_cache(model, given("rtx-3090", round(11.05 * GIB), vllm_version="0.24.0",
                                       **{**DUAL_3090, "enable_prefix_caching": None}))
    assert plain.block_size == 1568 and plain.blocks_per_request == cdiv(262144, 1568) + 3


def test_prefix_caching_puts_a_gated_deltanet_hybrid_in_align_mode():
    """Corpus log qwen3.6-35b-a3b-nvfp4-rtx5090-0.24.0 (enable_prefix_caching in its non-default args): at its printed
    5.98 GiB vLLM printed 567,978 tokens and 4.33x; with two state blocks a request ('align') kvlab gives exactly
    that, with one (prefix caching off) 593,795."""
    model = get_model(str(DATA / "qwen3.6-35b-a3b-nvfp4.json"))
    settings = dict(kv_cache_dtype="fp8", dtype="bfloat16", max_model_len=131072, max_num_seqs=1,
                    max_num_batched_tokens=8192, vllm_version="0.24.0")
    align = size_kv_cache(model, given("rtx-5090", round(5.98 * GIB), enable_prefix_caching=True, **settings))
    off = size_kv_cache(model, given("rtx-5090", round(5.98 * GIB), **settings))
    assert align.blocks_per_request == off.blocks_per_request + 3 == cdiv(131072, align.block_size) + 3 * 2
    assert (align.num_tokens, f"{align.max_concurrency:.2f}") == (567_978, "4.33")
    assert off.num_tokens == 593_795


# vLLM's prefix-caching default for a hybrid (kvlab.vllm_rules.HYBRID_PREFIX_CACHING_DEFAULT_SINCE): off up to 0.27
# (arg_utils.py: 'is_prefix_caching_supported and not model_config.is_hybrid' in 0.27.1's source), on from 0.28.0, in
# 'align' mode for every hybrid; from 0.32.0 a Mamba2 mixer's 'align' keeps a prefill-checkpoint block more.
@pytest.mark.parametrize("version, prefix, mode, qwen, granite", [
    ("0.27.1", None, "none", 1, 1),  # the default before 0.28.0: off
    ("0.28.0", None, "align", 2, 2),  # on by default: the running state + the last block boundary's
    ("0.31.0", None, "align", 2, 2),
    ("0.32.0", None, "align", 2, 3),  # + Mamba2's prefill checkpoint (mamba_mixer2.py num_prefill_checkpoint_blocks=1)
    (None, None, "align", 2, 3),  # the newest kvlab knows: 0.32.0
    (None, False, "none", 1, 1),  # --no-enable-prefix-caching, kept as given
    ("0.27.1", True, "align", 2, None),  # given on before 0.28.0: 'align' for Gated DeltaNet, 'all' (refused) for Mamba2
])
def test_prefix_caching_default_for_hybrids_turns_on_at_0_28(version, prefix, mode, qwen, granite):
    """Exact blocks a 1,024-token request on the real configs: qwen3.6-27b (Gated DeltaNet, 3 state groups, blocks
    of 784 tokens at TP 1: 2 full attention blocks) and granite-4.0-h-1b (Mamba2, 9 state groups, blocks of 400: 3)."""
    settings = dict(max_model_len=1024, vllm_version=version, enable_prefix_caching=prefix)
    r = size_kv_cache(get_model(str(DATA / "qwen3.6-27b.json")), given("h100-sxm", 348 * 51_380_224, **settings))
    assert (r.block_size, r.num_blocks, r.mamba_cache_mode) == (784, 348, mode)
    assert r.blocks_per_request == 2 + 3 * qwen
    assert [g.spec.state_blocks for g in r.kv_cache_groups if g.spec.kind == "mamba"] == [qwen] * 3
    if granite is None:
        return
    g = size_kv_cache(get_model(str(DATA / "granite-4.0-h-1b.json")), given("h100-sxm", 20 * GIB, **settings))
    assert (g.block_size, g.mamba_cache_mode, g.blocks_per_request) == (400, mode, 3 + 9 * granite)


def test_the_qwen3_6_27b_h100_concurrency_falls_with_the_default():
    """The issue's figure: qwen3.6-27b on an H100 at 1,024 tokens, 348 blocks: 69.60x without prefix caching, 43.50x
    with vLLM 0.32.0's default (8 blocks a request, not 5), and the rule said in words."""
    model = get_model(str(DATA / "qwen3.6-27b.json"))
    on = size_kv_cache(model, given("h100-sxm", 348 * 51_380_224, max_model_len=1024))
    off = size_kv_cache(model, given("h100-sxm", 348 * 51_380_224, max_model_len=1024, enable_prefix_caching=False))
    assert (f"{on.max_concurrency:.2f}", f"{off.max_concurrency:.2f}") == ("43.50", "69.60")
    assert on.mamba_cache_mode_why == ("prefix caching on, vLLM 0.32.0's default for a hybrid model (on from 0.28.0, "
                                       "vllm-project/vllm#50991)")
    assert off.mamba_cache_mode_why == "prefix caching off, as given"
    dense = size_kv_cache(get_model("llama-3.1-8b"), given("h100-sxm", 20 * GIB, max_model_len=8192))
    assert (dense.mamba_cache_mode, dense.mamba_cache_mode_why) == ("", "")


def test_kvlab_size_says_the_prefix_caching_rule_and_takes_the_flag(kvlab):
    args = ("size", DATA / "granite-4.0-h-1b.json", "--gpu", "h100-sxm", "--max-model-len", "1024",
            "--available-kv-gib", "20")
    text = " ".join(kvlab(*args).stdout.split())
    assert ("State blocks 3 in each state group: 1 running state + 1 for the last block boundary's state + 1 prefill "
            "checkpoint (Mamba2, from vLLM 0.32.0); mamba_cache_mode 'align': prefix caching on, vLLM 0.32.0's default "
            "for a hybrid model (on from 0.28.0, vllm-project/vllm#50991) (--no-enable-prefix-caching: 2 blocks fewer "
            "a group") in text, text
    off = kvlab(*args, "--no-enable-prefix-caching", "--json").json()
    assert (off["mamba_cache_mode"], off["blocks_per_request"], off["enable_prefix_caching"]) == ("none", 12, False)
    assert kvlab(*args, "--json").json()["blocks_per_request"] == 30
    old = kvlab(*args, "--vllm-version", "0.27.1", "--enable-prefix-caching")
    assert old.exit_code != 0 and "mamba_cache_mode 'all'" in old.stderr and "Traceback" not in old.stderr
    fit = kvlab("fit", DATA / "qwen3.6-27b.json", "--gpu", "h100-sxm", "--concurrency", "50", "--context-len", "1024",
                "--available-kv-gib", str(348 * 51_380_224 / GIB), "--json")
    fit_off = kvlab("fit", DATA / "qwen3.6-27b.json", "--gpu", "h100-sxm", "--concurrency", "50", "--context-len",
                    "1024", "--available-kv-gib", str(348 * 51_380_224 / GIB), "--no-enable-prefix-caching", "--json")
    assert fit.json()["max_num_requests"]["num_requests"] == 347 // 8
    assert fit_off.json()["max_num_requests"]["num_requests"] == 347 // 5


def test_mtp_drafter_weights_are_one_layer_its_fc_and_norms():
    """vLLM loads the MTP layer, its fc (2 x hidden -> hidden, split over TP) and three norms; the embedding and
    lm_head are the target's (llm_base_proposer: 'Detected MTP model. Sharing ...')."""
    model = get_model(str(DATA / "qwen3.6-27b.json"))
    settings = dict(tensor_parallel_size=2, max_model_len=32768, vllm_version="0.24.0")
    with_mtp = size_kv_cache(model, given("h100-sxm", 10 * GIB, **settings, **MTP3))
    without = size_kv_cache(model, given("h100-sxm", 10 * GIB, **settings))
    h = model.hidden_size
    layer = model.weights_bytes_for(range(63, 64), dtype_bytes=2, tensor_parallel_size=2, first_stage=False,
                                    last_stage=False)  # layer 63: the last full-attention layer
    assert with_mtp.weights_bytes - without.weights_bytes == layer + 2 * h * h // 2 * 2 + 3 * h * 2


def test_mtp_layers_of_an_mla_model_join_its_one_group():
    model = get_model("deepseek-v3")
    assert model.num_nextn_predict_layers == 1
    r = size_kv_cache(model, given("h200", 40 * GIB, tensor_parallel_size=8, max_model_len=32768, **MTP3))
    assert len(r.kv_cache_groups) == 1 and len(r.kv_cache_groups[0].layers) == 61 + 1
    assert r.bytes_per_block == 62 * r.page_size_bytes


def test_ngram_adds_no_layer_but_a_hybrids_state_blocks():
    dense = get_model("llama-3.1-8b")
    a = size_kv_cache(dense, given("h100-sxm", 20 * GIB, max_model_len=8192))
    b = size_kv_cache(dense, given("h100-sxm", 20 * GIB, max_model_len=8192, speculative_method="ngram"))
    assert (a.num_blocks, a.blocks_per_request) == (b.num_blocks, b.blocks_per_request)
    hybrid = get_model(str(DATA / "qwen3.6-27b.json"))
    r = size_kv_cache(hybrid, given("h100-sxm", 20 * GIB, tensor_parallel_size=2, max_model_len=32768,
                                    vllm_version="0.24.0", speculative_method="ngram", num_speculative_tokens=5))
    assert r.blocks_per_request == cdiv(32768, r.block_size) + 3 * (1 + 5)


@pytest.mark.parametrize("model, settings, message", [
    ("llama-3.1-8b", dict(speculative_method="eagle"), r"^--speculative-method eagle is not sized: .* valid: ngram, mtp$"),
    ("llama-3.1-8b", dict(speculative_method="mtp"), r"needs a model with MTP layers .*llama-3.1-8b has none; valid: ngram$"),
    ("llama-3.1-8b", dict(speculative_method="medusa"), r"^--speculative-method 'medusa' is not one kvlab sizes"),
    ("granite-4.0-h-1b.json", dict(enable_prefix_caching=True, vllm_version="0.27.1"),
     r"^vLLM 0.27.1 puts a mamba2 model's state in mamba_cache_mode 'all' .* which kvlab does not model; valid: prefix "
     r"caching off \(--no-enable-prefix-caching\), or a --vllm-version from 0.28.0 \(mode 'align'\)$"),
    ("qwen3.6-27b.json", dict(vllm_version="0.14.0", speculative_method="mtp"),
     r"^vLLM 0.14.0's state blocks per request .* valid: a --vllm-version from 0.16.0, or neither$"),
])
def test_what_kvlab_cannot_size_is_refused_in_one_line(model, settings, message):
    spec = get_model(str(DATA / model)) if model.endswith(".json") else get_model(model)
    with pytest.raises(KvlabError, match=message) as refused:
        size_kv_cache(spec, given("h100-sxm", 20 * GIB, max_model_len=8192, **settings))
    assert "\n" not in str(refused.value)


def test_kvlab_size_takes_the_speculative_config_in_runs_words(kvlab):
    """`kvlab size --speculative-method mtp --num-speculative-tokens 3`: the 0.24 club-3090 log's settings at its
    printed budget (425 blocks: test_mtp_drafter_and_speculative_state_blocks_on_qwen3_6_27b)."""
    args = ("size", DATA / "qwen3.6-27b.json", "--gpu", "rtx-3090", "-tp", "2", "--dtype", "float16",
            "--kv-cache-dtype", "fp8_e5m2", "--max-model-len", "262144", "--max-num-seqs", "2",
            "--max-num-batched-tokens", "8192", "-q", "auto-round", "--vllm-version", "0.24.0",
            "--available-kv-gib", "11.05")
    r = kvlab(*args, "--speculative-method", "mtp", "--num-speculative-tokens", "3", "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert (data["num_blocks"], data["blocks_per_request"], data["block_size"]) == (425, 164 + 3 * 4, 1600)
    assert (data["speculative_method"], data["num_speculative_tokens"]) == ("mtp", 3)
    assert "MTP drafter (1 layer like layer 63" in next(t["source"] for t in data["profile_terms"] if t["name"] == "weights")
    plain = kvlab(*args, "--json").json()
    assert (plain["block_size"], plain["blocks_per_request"]) == (1568, 168 + 3)
    text = kvlab(*args, "--speculative-method", "mtp", "--num-speculative-tokens", "3").stdout
    assert "3 groups x (state: 4 blocks)" in text
    # Not given, the draft tokens are the model's MTP layers (vLLM's documented default, the draft config's n_predict:
    # mtp_num_hidden_layers, 1 for Qwen3.6-27B), not 3.
    default = kvlab(*args, "--speculative-method", "mtp", "--json").json()
    assert (default["num_speculative_tokens"], default["block_size"], default["blocks_per_request"]) == \
        (1, 1584, 166 + 3 * 2)  # (ceil(262,144 / 1,584) full-attention blocks; 1 + 1 draft token's state blocks)
    refused = kvlab(*args, "--speculative-method", "eagle")
    assert refused.exit_code != 0 and "valid: ngram, mtp" in refused.stderr and "Traceback" not in refused.stderr


def test_sliding_windows_count_the_in_flight_batches_from_0_26():
    """SlidingWindowSpec.max_memory_usage_bytes reads max_num_batched_tokens up to 0.25.0 and VllmConfig's
    max_in_flight_tokens, (PP + 1) batches, from 0.26.0 (both source archives read). gpt-oss-20b: window 128."""
    model = get_model(str(DATA / "gpt-oss-20b.json"))
    assert model.sliding_window == 128
    settings = dict(max_model_len=8192, max_num_batched_tokens=2048)

    def sliding_blocks(version: str) -> int:
        r = size_kv_cache(model, given("h100-sxm", 20 * GIB, vllm_version=version, **settings))
        return next(g.spec.max_num_blocks_per_request(8192, r.max_in_flight_tokens) for g in r.kv_cache_groups
                    if g.spec.kind == "sliding_attention")

    assert sliding_blocks("0.25.0") == cdiv(128 - 1 + 2048, 16) + 1 == 137
    assert sliding_blocks("0.26.0") == cdiv(128 - 1 + 2 * 2048, 16) + 1 == 265

"""The catalogue (models and GPUs with sources), the parameter count, and every route to a model."""

from __future__ import annotations

import json
import re

import pytest

from kvlab.catalog import config as config_route
from kvlab.catalog import get_gpu, get_model, list_gpus, list_models
from kvlab.catalog.models import FULL_ATTENTION, SLIDING_ATTENTION
from kvlab.errors import KvlabError

GIB = 2**30


def test_every_entry_has_its_source():
    # the 27 of shared/reference/models.json + Qwen3-14B + the calibration set's Mistral-NeMo, Yi-34B, Llama-4-Scout
    assert len(list_models()) == 31
    # the 12 of shared/reference/gpus.json + RTX 3090, RTX 5090, GB10, RTX PRO 6000 Server, RTX A4000 and RTX 3050 6GB (issue 30)
    assert len(list_gpus()) == 18
    for entry in (*list_models(), *list_gpus()):
        assert entry.source and all(s.strip() for s in entry.source), entry.id


@pytest.mark.parametrize("name, kv_bytes", [
    # shared/reference/vllm.md, "Bytes of KV cache per token (bf16), from each model's config.json"
    ("opt-13b", 819_200), ("llama-2-7b", 524_288), ("llama-3.1-8b", 131_072), ("llama-3.1-70b", 327_680),
    ("qwen2.5-0.5b", 12_288), ("qwen2.5-7b-instruct", 57_344), ("qwen3-32b", 262_144), ("mistral-7b", 131_072),
    ("deepseek-v2-lite", 31_104), ("deepseek-v3", 70_272), ("qwen3-14b", 163_840),
])
def test_kv_bytes_per_token_from_config(name, kv_bytes):
    assert get_model(name).kv_bytes_per_token(2) == kv_bytes


def test_the_calibration_sets_models_resolve_by_their_repo_names_with_their_published_sizes():
    scout = get_model("llama-4-scout-17b-16e-instruct-fp8-dynamic")
    assert scout.is_moe and scout.quantization == "fp8"
    assert round(scout.num_active_params / 1e9) == 17  # "17B" active, the model's name
    assert round(scout.num_params / 1e9) == 108  # 109B on the card includes the 0.9B vision tower
    assert get_model("mistral-nemo-instruct-2407").kv_bytes_per_token(2) == 40 * 2 * 8 * 128 * 2
    assert get_model("yi-34b").kv_bytes_per_token(2) == 60 * 2 * 8 * 128 * 2


def test_explicit_head_dim_wins_and_mla_is_not_ordinary_attention():
    qwen = get_model("qwen3-32b")
    assert qwen.head_dim == 128 and qwen.hidden_size // qwen.num_attention_heads == 80
    deepseek = get_model("deepseek-v3")
    assert deepseek.attention == "MLA" and deepseek.kv_head_size == 512 + 64 and deepseek.kv_factor == 1
    assert deepseek.kv_bytes_per_token_per_layer(2) == 1_152  # vllm.md: 576 values x 2 bytes
    assert deepseek.kv_bytes_per_token(1) == 61 * 576  # fp8: one byte per value


def _card_tolerance(card: str, value: float) -> float:
    """Half a unit of the card's last digit ('7B' -> 0.5B, '7.61B' -> 0.005B) plus 1%."""
    number = re.match(r"\s*([0-9.]+)", card).group(1)
    decimals = len(number.split(".")[1]) if "." in number else 0
    return 0.5 * 10 ** -decimals * 1e9 + 0.01 * value


@pytest.mark.parametrize("model", [m for m in list_models() if m.num_params_card], ids=lambda m: m.id)
def test_parameter_count_matches_the_model_card(model):
    # Counted from the architecture: embeddings, attention (GQA or MLA), MLP or every expert, norms, lm_head.
    assert abs(model.num_params - model.num_params_card) <= _card_tolerance(model.params_total_card,
                                                                              model.num_params_card)


@pytest.mark.parametrize("name", ["deepseek-v2-lite", "deepseek-v3", "gpt-oss-120b"])
def test_active_parameters_of_moe_models(name):
    model = get_model(name)
    # Cards count active parameters without the input embedding (a lookup, not a matmul).
    active = model.num_active_params - model.vocab_size * model.hidden_size
    assert active == pytest.approx(model.num_active_params_card, rel=0.03)
    assert model.num_active_params < model.num_params


def test_weights_in_bytes_follow_the_checkpoint_format():
    assert get_model("opt-13b").weights_bytes() == pytest.approx(2 * 12.85e9, rel=0.002)
    # gpt-oss ships its experts in MXFP4 (4.25 bits): about 61 GiB, not 2 x 117 GB.
    assert get_model("gpt-oss-120b").weights_bytes() / GIB == pytest.approx(60.7, abs=0.5)
    # DeepSeek-V3 ships fp8 linear layers: about one byte per parameter.
    deepseek = get_model("deepseek-v3")
    assert deepseek.weights_bytes() / deepseek.num_params == pytest.approx(1.0, abs=0.01)


def test_layer_types_of_sliding_and_hybrid_models():
    gemma3 = get_model("gemma-3-1b-it")
    assert [i for i, t in enumerate(gemma3.layer_types) if t == FULL_ATTENTION] == [5, 11, 17, 23]
    gemma2 = get_model("gemma-2-9b")
    assert gemma2.layer_types[:2] == (SLIDING_ATTENTION, FULL_ATTENTION) and gemma2.num_sliding_layers == 21
    gpt_oss = get_model("gpt-oss-120b")
    assert all((t == SLIDING_ATTENTION) == (i % 2 == 0) for i, t in enumerate(gpt_oss.layer_types))
    assert get_model("mistral-7b-v0.1").num_sliding_layers == 32
    # Qwen2.5 configs carry a sliding_window that use_sliding_window false switches off.
    assert get_model("qwen2.5-72b-instruct").num_sliding_layers == 0


@pytest.mark.parametrize("name", ["opt-13b", "OPT-13B", "opt_13b", " Opt-13B ", "facebook/opt-13b"])
def test_model_names_are_forgiving(name):
    assert get_model(name).id == "opt-13b"


def test_aliases_reach_their_entry():
    assert get_model("Qwen2.5-0.5B").id == "qwen2.5-0.5b-instruct"
    assert get_model("Llama-3.1-8B").id == "llama-3.1-8b"
    assert get_model("meta-llama/Llama-3.1-8B").id == "llama-3.1-8b"
    assert get_model("DeepSeek-V2-Lite").id == "deepseek-v2-lite"


def test_unknown_model_suggests_close_names_and_the_config_route():
    with pytest.raises(KvlabError) as err:
        get_model("opt-31b")
    assert "opt-13b" in str(err.value) and "config.json" in str(err.value) and "kvlab models" in str(err.value)


@pytest.mark.parametrize("name", ["a100-40gb", "A100-40GB", "A100_40GB", "nvidia a100 40gb", "a100-40g"])
def test_gpu_names_are_forgiving(name):
    assert get_gpu(name).id == "A100-40GB"


@pytest.mark.parametrize(("name", "cards"), [("h100", ("H100-SXM", "H100-PCIe")), ("NVIDIA H100", ("H100-SXM", "H100-PCIe")),
                                             ("h100_80gb", ("H100-SXM", "H100-PCIe")), ("a100", ("A100-40GB", "A100-80GB"))])
def test_a_gpu_name_that_fits_two_cards_is_refused_naming_both(name, cards):
    with pytest.raises(KvlabError) as err:
        get_gpu(name)
    assert all(card in str(err.value) for card in cards) and "\n" not in str(err.value)


def test_no_alias_names_two_cards_and_every_alias_is_listed(kvlab):
    from kvlab.catalog.gpus import ambiguous_aliases
    from kvlab.catalog.models import name_key

    names = [name_key(n) for g in list_gpus() for n in (g.id, *g.aliases)]
    assert len(names) == len(set(names))
    assert not set(names) & {name_key(a) for a in ambiguous_aliases()}
    listing = kvlab("gpus").stdout.replace("\n", " ")
    assert all(alias in listing for g in list_gpus() for alias in g.aliases) and "h100: H100-SXM or H100-PCIe" in listing


def test_unknown_gpu_suggests_close_names():
    with pytest.raises(KvlabError) as err:
        get_gpu("h10")
    assert "H100-SXM" in str(err.value) and "--gpu-memory-gib" in str(err.value)


def test_gpu_memory_prefers_what_cuda_reports():
    a100 = get_gpu("a100-40gb")
    assert a100.memory_bytes == 42_405_855_232 and a100.memory_bytes_source == "cuda_device_query"
    assert get_gpu("h100-sxm").memory_bytes_source == "cuda_reported_observed"
    assert get_gpu("h100-sxm").memory_gib == pytest.approx(79.11, abs=0.005)
    h200 = get_gpu("h200")  # CUDA reports 139.81 GiB, not the 141 GB label (issue 30)
    assert h200.memory_bytes_source == "cuda_reported_observed" and h200.memory_gib == pytest.approx(139.81, abs=5e-3)
    assert get_gpu("a100-80gb").memory_bandwidth_bytes_per_s == 2_039_000_000_000  # SXM of the per-form-factor pair
    assert get_gpu("t4").peak_flops_kind.startswith("fp16")  # Turing has no bf16 tensor cores
    assert get_gpu("rtx-4090").peak_flops is None  # no source found: None, not a guess


# --- config.json routes --------------------------------------------------------------------------------

LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 14336, "max_position_embeddings": 131072, "num_attention_heads": 32,
            "num_hidden_layers": 32, "num_key_value_heads": 8, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "vocab_size": 128256}


def test_config_json_file_gives_the_catalogue_numbers(tmp_path):
    path = tmp_path / "my-llama" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA_8B))
    model = get_model(str(path))
    catalogue = get_model("llama-3.1-8b")
    assert model.origin == "config.json" and model.id == "my-llama"
    assert model.kv_bytes_per_token(2) == catalogue.kv_bytes_per_token(2) == 131_072
    assert model.num_params == catalogue.num_params


def test_folder_holding_a_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    assert get_model(str(tmp_path)).num_key_value_heads == 8


def test_nested_text_config(tmp_path):
    # A multimodal checkpoint (Gemma 3 style): the language model's numbers live under text_config.
    text = {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_attention_heads": 8,
            "num_hidden_layers": 6, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208,
            "max_position_embeddings": 131072, "sliding_window": 1024,
            "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Gemma3ForConditionalGeneration"],
                                                      "model_type": "gemma3", "torch_dtype": "bfloat16",
                                                      "text_config": text, "vision_config": {"hidden_size": 1152}}))
    model = get_model(str(tmp_path))
    assert (model.hidden_size, model.head_dim, model.dtype) == (2560, 256, "bfloat16")  # dtype from the top level
    assert model.layer_types[-1] == FULL_ATTENTION and model.num_sliding_layers == 5
    assert model.kv_bytes_per_token(2) == 6 * 2 * 4 * 256 * 2


def test_mla_config(tmp_path):
    cfg = {"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944, "num_attention_heads": 16,
           "num_hidden_layers": 27, "num_key_value_heads": 16, "vocab_size": 102400,
           "max_position_embeddings": 163840, "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
           "qk_nope_head_dim": 128, "v_head_dim": 128, "n_routed_experts": 64, "num_experts_per_tok": 6,
           "moe_intermediate_size": 1408, "n_shared_experts": 2, "first_k_dense_replace": 1,
           "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = get_model(str(tmp_path))
    assert model.kv_bytes_per_token(2) == 31_104
    assert model.num_params == get_model("deepseek-v2-lite").num_params


def test_qwen2_window_switched_off_is_full_attention(tmp_path):
    cfg = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
           "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
           "sliding_window": 32768, "use_sliding_window": False, "max_window_layers": 21, "torch_dtype": "bfloat16",
           "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = get_model(str(tmp_path))
    assert model.num_sliding_layers == 0 and model.sliding_window is None
    assert model.kv_bytes_per_token(2) == 12_288


@pytest.mark.parametrize("field", ["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size",
                                   "intermediate_size", "max_position_embeddings"])
def test_missing_field_is_named(tmp_path, field):
    cfg = dict(LLAMA_8B)
    del cfg[field]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(KvlabError, match=f"missing field '{field}'"):
        get_model(str(tmp_path))


def test_mla_field_missing_is_named(tmp_path):
    cfg = dict(LLAMA_8B, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(KvlabError, match="missing field 'v_head_dim'"):
        get_model(str(tmp_path))


def test_linear_attention_layers_without_state_sizes_are_refused(tmp_path):
    cfg = dict(LLAMA_8B, num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(KvlabError, match="no state sizes kvlab knows"):
        get_model(str(tmp_path))


def test_an_unknown_layer_type_is_refused_naming_the_known_ones(tmp_path):
    cfg = dict(LLAMA_8B, num_hidden_layers=2, layer_types=["chunked_attention", "full_attention"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(KvlabError, match="'chunked_attention' is not modelled; kvlab sizes full_attention"):
        get_model(str(tmp_path))


def test_bad_files(tmp_path):
    with pytest.raises(KvlabError, match="holds no config.json"):
        get_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(KvlabError, match="cannot read"):
        get_model(str(tmp_path))
    with pytest.raises(KvlabError, match="no such file"):
        get_model(str(tmp_path / "other.json"))


def test_hugging_face_id_offline_names_the_other_routes(monkeypatch, tmp_path):
    monkeypatch.setattr(config_route, "hub_reachable", lambda timeout=3.0: False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache
    config_route.load_hf_model.cache_clear()
    with pytest.raises(KvlabError) as err:
        get_model("some-org/some-model-not-in-the-catalogue")
    message = str(err.value)
    assert "offline" in message and "catalogue" in message and "config.json" in message


def test_hugging_face_id_is_fetched_once(monkeypatch, tmp_path):
    import huggingface_hub

    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_8B))
    calls = []

    def fake_download(repo_id, filename, local_files_only=False):
        calls.append((repo_id, filename, local_files_only))
        return str(path)

    monkeypatch.setattr(config_route, "hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    config_route.load_hf_model.cache_clear()
    first = get_model("acme/Llama-Clone-8B")
    second = get_model("acme/Llama-Clone-8B")
    config_route.load_hf_model.cache_clear()
    assert first is second and calls == [("acme/Llama-Clone-8B", "config.json", False)]
    assert first.origin == "huggingface" and first.hf_repo == "acme/Llama-Clone-8B"
    assert first.kv_bytes_per_token(2) == 131_072

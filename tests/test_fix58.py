"""Fix 58: review 57's L2 and M2 and trial 57's findings on hybrids (prefix caching's rules by strategy and version),
`kvlab vllm compare --model`, and capacity's answer naming why requests were rejected."""

from __future__ import annotations

import pytest

from kvlab import service
from kvlab.config.resolve import quietly
from kvlab.errors import KvlabError

D = "tests/data/sizing_configs"
QWEN = f"{D}/qwen3.6-27b.json"  # (Gated DeltaNet: 'align' with prefix caching at every version from 0.16.0)
GRANITE = f"{D}/granite-4.0-h-1b.json"  # (Mamba2: 'all' with prefix caching before 0.28.0, not modelled)
NO_CHUNKS = {"enable_chunked_prefill": False, "max_model_len": 4096, "max_num_batched_tokens": 4096}


def _flat(text: str) -> str:
    return " ".join(text.split())


# --- 1. review 57 L2: 'align' needs chunked prefill -------------------------------------------------------------


@pytest.mark.parametrize("version", [None, "0.28.0", "0.27.1"])
def test_prefix_caching_on_a_hybrid_without_chunked_prefill_is_refused(version):
    """vLLM's MambaModelConfig refuses 'align' without chunked prefill: the 0.28+ default for every hybrid, and a
    Gated DeltaNet model's mode with prefix caching turned on before (the vllm strategy). kvlab resolved and simulated
    it; the strategy is refused, naming both flags and what is valid."""
    config = quietly(model=QWEN, gpu="h100-sxm", vllm_version=version, **NO_CHUNKS)
    with pytest.raises(KvlabError) as refused:
        service.strategies(["vllm"], config)
    text = str(refused.value)
    for words in ("prefix caching on", "chunked prefill off", "--no-enable-chunked-prefill", "valid:",
                  "--enable-chunked-prefill", "vllm+noprefix", "--no-enable-prefix-caching"):
        assert words in text, text
    assert service.strategies(["vllm+noprefix", "continuous+max"], config)  # (no prefix caching: vLLM starts)
    assert service.strategies(["vllm"], quietly(model=QWEN, gpu="h100-sxm", vllm_version=version))


def test_a_mode_vllm_does_not_check_is_not_refused():
    """Granite (Mamba2) at 0.27.1 with prefix caching is in mode 'all', which vLLM does not check for chunked prefill
    (and kvlab runs with the state blocks of prefix caching off); from 0.28.0 it is 'align' and refused."""
    assert service.strategies(["vllm"], quietly(model=GRANITE, gpu="h100-sxm", vllm_version="0.27.1", **NO_CHUNKS))
    with pytest.raises(KvlabError, match="--enable-chunked-prefill"):
        service.strategies(["vllm"], quietly(model=GRANITE, gpu="h100-sxm", vllm_version="0.28.0", **NO_CHUNKS))
    # a model without state layers: prefix caching without chunked prefill is fine
    assert service.strategies(["vllm"], quietly(model="qwen3-8b", gpu="h100-sxm", **NO_CHUNKS))


@pytest.mark.parametrize("command", ["run", "race", "capacity"])
def test_the_commands_refuse_it_in_one_line(kvlab, command):
    """run, race and capacity: exit 2, one error line, before anything runs. (`kvlab size` and `kvlab fit` take no
    chunked prefill flag: they size vLLM's default, chunked prefill on.)"""
    strategies = {"run": ("vllm",), "race": ("vllm", "vllm+noprefix"), "capacity": ()}[command]
    r = kvlab(command, *strategies, "--model", QWEN, "--gpu", "h100-sxm", "--no-enable-chunked-prefill",
              "--max-model-len", "4096", "--max-num-batched-tokens", "4096", "-n", "5")
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "chunked prefill off" in lines[0] and "Traceback" not in r.stderr, r.stderr


# --- 2. review 57 M2: the pooled path's pool by each strategy's prefix caching ----------------------------------


def _size_tokens(kvlab, *flags: str) -> int:
    r = kvlab("size", QWEN, "--gpu", "h100-sxm", "--max-model-len", "8192", "--speculative-method", "mtp", *flags,
              "--json")
    assert r.exit_code == 0, r.stderr
    return r.json()["num_tokens"]


@pytest.mark.parametrize("version", [None, "0.27.1"])
def test_a_pooled_hybrid_gives_each_strategy_vllms_pool_with_its_prefix_caching(kvlab, version):
    """With speculative decoding a hybrid's groups are pooled as vLLM's printed token figure. That figure was the
    version's default's for every strategy: vllm+noprefix at 0.32 ran in the smaller pool of 'align' (2 + 1 draft
    state blocks), and vllm at 0.27.1 (prefix caching on) in the larger one of prefix caching off. Each now takes
    `kvlab size`'s with its own setting; a strategy without prefix caching, vllm+noprefix's."""
    version_flags = ("--vllm-version", version) if version else ()
    on, off = _size_tokens(kvlab, "--enable-prefix-caching", *version_flags), \
        _size_tokens(kvlab, "--no-enable-prefix-caching", *version_flags)
    assert off > on  # (1 + 1 draft state blocks a Mamba group against 2 + 1)
    config = quietly(model=QWEN, gpu="h100-sxm", speculative_method="mtp", spec_acceptance="0.8",
                     max_model_len=8192, vllm_version=version)
    assert config.cache.prefix_caching_slots == (off, on)
    pools = {s.name: config.for_strategy(s).cache.num_slots
             for s in service.strategies(["vllm", "vllm+noprefix", "continuous+max"], config)}
    assert pools == {"vllm": on, "vllm+noprefix": off, "continuous+max": off}
    run = service.run(config, ["vllm", "vllm+noprefix"], workload=service.load(config))
    assert [r.config.cache.num_slots for r in run.results] == [on, off]
    assert any(f"{on:,} token slots with prefix caching (vllm), {off:,} without" in n for n in config.cache.notes)


def test_the_pools_differ_only_where_vllm_sizes_them_differently():
    """No speculative decoding (groups simulated, one pool of vLLM's blocks), a model without state layers, or
    Granite at 0.27.1 (prefix caching's mode 'all' is not modelled: both pools are prefix caching off's): one pool,
    and the configuration's key is as it was."""
    assert quietly(model=QWEN, gpu="h100-sxm", max_model_len=8192).cache.prefix_caching_slots == ()
    assert quietly(model="qwen3-8b", gpu="h100-sxm", speculative_method="ngram",
                   spec_acceptance="0.8").cache.prefix_caching_slots == ()
    granite = quietly(model=GRANITE, gpu="h100-sxm", vllm_version="0.27.1", speculative_method="ngram",
                      spec_acceptance="0.8", max_model_len=8192)
    assert granite.cache.prefix_caching_slots == () and granite.cache.kv_cache_groups == ()
    assert quietly(model=GRANITE, gpu="h100-sxm", speculative_method="ngram", spec_acceptance="0.8",
                   max_model_len=8192).cache.prefix_caching_slots != ()


# --- 3. trial 57 finding 4: at 0.27.1 the vllm strategy is not `vllm serve`'s default ---------------------------


@pytest.mark.parametrize("model", [GRANITE, QWEN])
def test_before_0_28_a_run_says_vllm_has_prefix_caching_on_where_vllm_serve_defaults_to_off(kvlab, model):
    """`kvlab size --vllm-version 0.27.1` says prefix caching is off by default for a hybrid, while `kvlab run vllm`
    said "prefix caching on" with no word of that default. The run now says both, and names vllm+noprefix."""
    size = kvlab("size", model, "--gpu", "h100-sxm", "--vllm-version", "0.27.1", "--max-model-len", "8192")
    assert "prefix caching off, vLLM 0.27.1's default for a hybrid model" in _flat(size.stdout)
    run = kvlab("run", "vllm", "--model", model, "--gpu", "h100-sxm", "--vllm-version", "0.27.1", "--max-model-len",
                "8192", "-n", "5")
    assert run.exit_code == 0, run.stderr
    said = _flat(run.stderr + run.stdout)
    assert ("the vllm strategy runs with prefix caching on (`vllm serve --enable-prefix-caching`), but `vllm serve` "
            "0.27.1 defaults to prefix caching off for a hybrid model (on only from 0.28.0): vllm+noprefix is what "
            "`vllm serve` 0.27.1 runs by default") in said
    newer = kvlab("run", "vllm", "--model", model, "--gpu", "h100-sxm", "--max-model-len", "8192", "-n", "5")
    assert "defaults to prefix caching off" not in _flat(newer.stderr + newer.stdout)


# --- 4. `kvlab vllm compare --model`: the tiny models the CPU engine runs -------------------------------------------


def test_compare_takes_a_tiny_model_and_refuses_others(kvlab):
    """`kvlab vllm compare` compared the tiny Llama only, though its library runs the tiny hybrids too. --model
    names one (or a small config.json); anything else is refused naming them, before the engine starts."""
    from kvlab.cli.vllm import tiny_model

    assert tiny_model("tiny-llama")[1] == "float32" and tiny_model("tiny-qwen3-next")[1] == "bfloat16"
    for bad in ("qwen3-8b", "/no/such/config.json"):
        r = kvlab("vllm", "compare", "--model", bad, "-n", "5")
        assert r.exit_code == 2 and "valid: tiny-llama, tiny-llama-sliding, tiny-qwen3-next, or a small config.json" \
            in _flat(r.stderr), r.stderr


def test_compare_refuses_a_hybrid_vllm_would_not_start_or_kvlab_does_not_simulate(kvlab):
    """The sliding-window Llama at the compare's default 24 blocks of 32 (max_model_len 512): one request needs 16
    full-attention blocks and 11 sliding ones (its 48-token window and a 256-token batch in flight), more than the 23
    usable, and the CPU engine refuses to start (it estimated 384 tokens; 28 blocks run, `vllm compare --model
    tiny-llama-sliding --num-gpu-blocks 28 -n 30`: 501 of 501 steps identical). Prefix caching on a hybrid: kvlab does
    not simulate its hits."""
    r = kvlab("vllm", "compare", "--model", "tiny-llama-sliding", "-n", "5")
    assert r.exit_code == 2 and "valid: --num-gpu-blocks 28 or more, or a smaller --max-model-len" in _flat(r.stderr)
    r = kvlab("vllm", "compare", "--model", "tiny-llama-sliding", "--num-gpu-blocks", "28", "--enable-prefix-caching")
    assert r.exit_code == 2 and "valid: --no-enable-prefix-caching, or --model tiny-llama" in _flat(r.stderr)


@pytest.mark.vllm
@pytest.mark.parametrize("model", ["tiny-llama-sliding", "tiny-qwen3-next"])
def test_compare_runs_a_tiny_hybrid_step_by_step(kvlab, model):
    """Both tiny hybrids through the real engine from the command line: every step and every block id the same."""
    r = kvlab("vllm", "compare", "--model", model, "--num-gpu-blocks", "28", "-n", "24", "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert data["model"] == model and data["identical"] and len(data["sizing"]["kvlab"]["kv_cache_groups"]) == 2


# --- 5. capacity names why nothing was served, in run's words ---------------------------------------------------


def test_capacity_says_why_nothing_was_served_as_run_does(kvlab, tmp_path):
    """A pool of 5 blocks holds none of qwen3.6-27b's requests (3 Mamba state blocks and 2 full-attention blocks of
    784 each against 4 usable): `kvlab run` says they were rejected and why; `kvlab capacity` answered 0 req/s and
    "even the lowest rate tried failed" with no reason. It now gives run's line (one function: its reason text)."""
    workload = tmp_path / "w.csv"
    workload.write_text("arrival_time,prompt_len,output_len\n" + "0,960,64\n" * 20)
    setup = ("--model", QWEN, "--gpu", "h100-sxm", "--num-gpu-blocks", "5", "--workload", workload, "-n", "20")
    run = kvlab("run", "vllm", *setup)
    assert run.exit_code == 1
    reason = _flat(run.stderr).split("no request was served (", 1)[1].split("): ", 1)[0]
    assert reason.startswith("vllm rejected 20 as larger than the whole KV cache"), reason
    cap = kvlab("capacity", *setup, "--arrival", "poisson", "--cost", "vllm-h100", "--workers", "1",
                "--out", tmp_path / "cap")
    assert cap.exit_code == 0, cap.stderr
    text = _flat(cap.stdout)
    assert f"even at the lowest rate tried no request was served ({reason}): their answers of 0 req/s measure " \
           "nothing; valid: a KV cache in which the workload's requests fit" in text, text
    data = kvlab("capacity", *setup, "--arrival", "poisson", "--cost", "vllm-h100", "--workers", "1",
                 "--out", tmp_path / "cap", "--json").json()
    assert reason in data["served_nothing"]
